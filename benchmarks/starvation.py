"""How many STARVING alerts a starvation threshold raises, fixed or adaptive (issue 41;
docs/model.md rule 8.2), on the ITP trace, on the ITP trace with its pool halved (waits many
times longer), and on the synthetic congested workloads.

    python benchmarks/starvation.py            # about 3 minutes on 2 cores: markdown tables
    python benchmarks/starvation.py --quick    # the congested workloads only (seconds)

Each run is ``airflow-quota simulate --json``, the same command a user runs; placements do not
depend on the threshold (without reservations), only the alerts do.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import congested  # noqa: E402
from benchmarks.itp_replay import CAPACITY, TRACE, itp_quota  # noqa: E402

FIXED_48H = {"starvation_after_seconds": 172800}
THRESHOLDS: dict[str, dict[str, Any]] = {"fixed 48 h (model v4's default)": FIXED_48H, "adaptive (v5's default)": {}}
CONGESTED_JOBS = 3000
CONGESTED_SEEDS = (1, 2, 3)


def simulate(args: list[str]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "airflow_quota.cli", "simulate", "--json", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    if done.returncode:
        raise SystemExit(f"simulate {' '.join(args)} failed:\n{done.stderr}")
    return json.loads(done.stdout)


def measures(report: dict[str, Any]) -> dict[str, Any]:
    jobs = report["jobs"].values()
    waits = sorted(job["wait_seconds"] for job in jobs)
    starving = sum(1 for alert in report["alerts"] if alert["kind"] == "STARVING")
    return {
        "jobs": len(waits),
        "starving": starving,
        "share": starving / len(waits),
        "mean_wait_h": sum(waits) / len(waits) / 3600,
        "p90_wait_h": waits[int(0.9 * len(waits))] / 3600,
    }


def itp_run(capacity: int, threshold: dict[str, Any], folder: Path) -> dict[str, Any]:
    quota = itp_quota(TRACE, capacity)
    for share in quota["shares"]:
        share.update(threshold)
    path = folder / f"itp-{capacity}-{len(threshold)}.yaml"
    path.write_text(yaml.safe_dump(quota))
    return measures(simulate(["--trace", f"itp:{TRACE}", "--quota", str(path)]))


def congested_run(seed: int, threshold: str | None, folder: Path) -> dict[str, Any]:
    """The congested workload as ``benchmarks/congested.py`` writes it (a fixed 1,800 s), or
    with its threshold replaced (``""``: adaptive)."""
    text = congested.scenario(CONGESTED_JOBS, seed)
    if threshold is not None:
        text = text.replace("starvation_after_seconds: 1800", threshold).replace(", , ", ", ")
    path = folder / f"congested-{seed}-{threshold!r}.yaml"
    path.write_text(text)
    return measures(simulate([str(path)]))


def row(label: str, got: dict[str, Any]) -> str:
    return (
        f"| {label} | {got['starving']:,} of {got['jobs']:,} | **{got['share']:.2%}** | "
        f"{got['mean_wait_h']:.1f} h | {got['p90_wait_h']:.1f} h |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the congested workloads only")
    options = parser.parse_args()
    header = "| run | STARVING alerts | of jobs | mean wait | p90 wait |\n|---|---|---|---|---|"
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(2) as pool:
        folder = Path(tmp)
        if not options.quick:
            runs = {
                (capacity, label): pool.submit(itp_run, capacity, threshold, folder)
                for capacity in (CAPACITY, CAPACITY // 2)
                for label, threshold in THRESHOLDS.items()
            }
            print(f"ITP trace ({TRACE.relative_to(ROOT)}), every share LEND_AND_BORROW:\n\n{header}")
            for (capacity, label), future in runs.items():
                print(row(f"{capacity:,} GPUs, {label}", future.result()), flush=True)
            print()
        kinds = {"fixed 1,800 s (as generated)": None, "fixed 48 h": "starvation_after_seconds: 172800", "adaptive": ""}
        congested_runs = {
            (seed, label): pool.submit(congested_run, seed, threshold, folder)
            for seed in CONGESTED_SEEDS
            for label, threshold in kinds.items()
        }
        print(f"Congested workloads ({CONGESTED_JOBS:,} jobs, benchmarks/congested.py):\n\n{header}")
        for (seed, label), future in congested_runs.items():
            print(row(f"seed {seed}, {label}", future.result()), flush=True)


if __name__ == "__main__":
    main()
