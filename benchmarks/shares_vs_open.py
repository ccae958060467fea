"""The ITP replay's cost, shares policy against the open pool (issue 15's speed target): each
policy replayed with ``compare.run_policy`` (mapping, simulation, report) on the whole trace
under ``examples/itp-quota.yaml``, in turn, ``--repeat`` times; the best CPU and wall time of each.

    python benchmarks/shares_vs_open.py              # whole trace, five rounds of shares then open
    python benchmarks/shares_vs_open.py --repeat 2   # quicker
    python benchmarks/shares_vs_open.py --jobs 20000 --repeat 1

CPU time (``time.process_time``) is printed beside wall time: on a machine shared with other
work, wall time measures the other work too, and the ratio of two wall times taken minutes
apart means little. The trace is read once, before the clocks start. CPU time itself moves by
up to 20% between runs on this machine (the same code's open-pool replay: 20.4 and 24.9 s in
one session), so each round's two runs, back to back, also give a ratio, and their median is
printed: a steadier figure than the ratio of the two bests, taken from different rounds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from airflow_quota.core.config import load_config  # noqa: E402
from airflow_quota.sim.compare import resolve_policies, run_policy  # noqa: E402
from benchmarks.itp_replay import first_jobs  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, help="the first N jobs of the trace (default: all)")
    parser.add_argument("--repeat", type=int, default=5, help="rounds (each: shares, then open)")
    args = parser.parse_args()
    config = load_config(ROOT / "examples" / "itp-quota.yaml")
    policies = resolve_policies(["shares", "open"], config)
    trace = first_jobs(args.jobs)
    best: dict[str, tuple[float, float]] = {}
    ratios: list[float] = []
    for round_ in range(args.repeat):
        cpus: dict[str, float] = {}
        for policy in policies:
            wall, cpu = time.perf_counter(), time.process_time()
            run = run_policy(policy, trace)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            print(
                f"  round {round_ + 1} {policy.name:>6}: CPU {cpu:6.2f} s, wall {wall:6.2f} s, "
                f"mean wait {run.pool['wait_mean']:,.0f} s",
                flush=True,
            )
            old = best.get(policy.name, (float("inf"), float("inf")))
            best[policy.name] = (min(old[0], cpu), min(old[1], wall))
            cpus[policy.name] = cpu
        ratios.append(cpus["shares"] / cpus["open"])
    (shares_cpu, shares_wall), (open_cpu, open_wall) = best["shares"], best["open"]
    print(
        f"best: shares CPU {shares_cpu:.2f} s / open {open_cpu:.2f} s = {shares_cpu / open_cpu:.2f}x; "
        f"wall {shares_wall:.2f} s / {open_wall:.2f} s = {shares_wall / open_wall:.2f}x"
    )
    print(f"each round's CPU ratio: {', '.join(f'{r:.2f}' for r in ratios)}; median {statistics.median(ratios):.2f}x")


if __name__ == "__main__":
    main()
