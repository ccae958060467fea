"""Benchmark: the ITP trace through real ``airflow-quota scheduler`` processes under chaos
(issue 39, "a real trace through the real service", item 2).

    python benchmarks/trace_chaos.py --jobs 10000 --speed 4000     # what BENCHMARKS.md reports
    python benchmarks/trace_chaos.py                                # the whole trace (69,351 jobs)

A PostgreSQL server of its own, a leader and a standby with the fake backend, the trace's first
``--jobs`` jobs submitted at their trace times on a scaled clock (``--speed`` trace seconds a
wall second; why scaled, not manual: ``tests/service/trace_chaos.py``), and, at seeded moments
(fractions of the jobs ended), the leader SIGKILLed five times with a standby taking over and a
replacement started, the server restarted once (2 s down), while every fake backend call
(start, stop, poll) fails 2 % of the time. At the end: every job ended exactly once, none lost,
duplicated or stuck (``chaos.check_books``), the invariant after every committed step replayed
from the decision log, no capacity held. Progress every ``--every`` seconds (jobs done,
simulated day, decisions a second); the figures as JSON in ``--out``; exit status 1 when a
check failed. The machinery lives in ``tests/service/`` (as the chaos tests share it), which
this imports.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import tests.conftest  # noqa: E402, F401  (enables the fake backend, as in the tests)
from tests.service.trace_chaos import ChaosSettings, run_chaos  # noqa: E402


def show(progress: dict[str, Any]) -> None:
    print(
        f"{progress['wall']:7.0f} s  day {progress['day']:6.2f}  submitted {progress['submitted']:,}"
        f"  ended {max(progress['ended'], 0):,}/{progress['jobs']:,}"
        f"  {progress['decisions_per_second']:6.1f} decisions/s  faults {progress['faults']}",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=None, help="the first N jobs of the trace (default: all)")
    parser.add_argument("--speed", type=float, default=4000.0, help="trace seconds per wall second")
    parser.add_argument("--seed", type=int, default=39)
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--restarts", type=int, default=1)
    parser.add_argument("--fault-rate", type=float, default=0.02)
    parser.add_argument("--duration-scale", type=float, default=1.0, help="the jobs' durations times this")
    parser.add_argument("--timeout", type=float, default=7200.0, help="wall seconds to end after the last submission")
    parser.add_argument("--submitters", type=int, default=4, help="submitter threads side by side")
    parser.add_argument("--every", type=float, default=15.0, help="seconds between progress lines")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "trace_chaos.json")
    args = parser.parse_args(argv)
    rules = [
        ("--jobs", args.jobs is None or args.jobs >= 1, "must be at least 1"),
        ("--speed", args.speed > 0, "must be above 0"),
        ("--kills", args.kills >= 0, "must be 0 or more"),
        ("--restarts", args.restarts >= 0, "must be 0 or more"),
        ("--fault-rate", 0 <= args.fault_rate < 1, "must be from 0 to below 1"),
        ("--duration-scale", args.duration_scale > 0, "must be above 0"),
        ("--timeout", args.timeout > 0, "must be above 0"),
        ("--submitters", args.submitters >= 1, "must be 1 or more"),
    ]
    broken = [f"error: {name}: {rule}" for name, holds, rule in rules if not holds]
    if broken:
        print("\n".join(broken), file=sys.stderr)
        return 2
    settings = ChaosSettings(
        jobs=args.jobs,
        speed=args.speed,
        seed=args.seed,
        kills=args.kills,
        restarts=args.restarts,
        fault_rate=args.fault_rate,
        duration_scale=args.duration_scale,
        timeout=args.timeout,
        submitters=args.submitters,
    )
    root = Path(tempfile.mkdtemp(prefix="trace-chaos-"))
    print(f"logs and state in {root}", flush=True)
    result = run_chaos(settings, root, progress=show, every=args.every)
    summary = result.summary()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    print("PASSED" if not result.problems else f"FAILED: {len(result.problems)} problems", flush=True)
    return 0 if not result.problems else 1


if __name__ == "__main__":
    sys.exit(main())
