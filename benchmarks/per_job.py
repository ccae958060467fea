"""The cost per job of ``airflow-quota simulate --json`` on ``benchmarks/workload.py``'s full
load (issue 15: flat from 1k to 100k jobs), each size in its own process as a user runs it.

    python benchmarks/per_job.py                     # 1k, 10k, 100k
    python benchmarks/per_job.py --sizes 1000,10000
    python benchmarks/per_job.py --sizes 1000,10000,100000,300000 --repeat 1
    python benchmarks/per_job.py --load 0.8          # a load the pool carries: the backlog stays bounded

Each size after the first also gets the cost of each job it adds to the size before it
(marginal cost): that leaves out the fixed cost and the first jobs, which meet an empty pool.

The CPU time of the child process (user + system) is printed beside wall time, and also per job
after taking off the fixed cost of a 10-job run (start-up: imports, reading the file). Sizes under
100k and the fixed cost run ``--repeat`` times and keep the least CPU time: the start-up alone
varies by 0.2 s between runs, which is 200 us a job at 1k.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import workload  # noqa: E402


def run(path: Path) -> tuple[float, float]:
    """(wall, CPU) seconds of ``simulate PATH --json`` in a child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.perf_counter()
    command = [sys.executable, "-m", "airflow_quota.cli", "simulate", str(path), "--json"]
    subprocess.run(command, cwd=ROOT, stdout=subprocess.DEVNULL, check=True)
    wall = time.perf_counter() - wall
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs of each size under 100k (and of the fixed cost): the least CPU"
    )
    parser.add_argument(
        "--load", type=float, default=1.0, help="demand over capacity (workload.py's load; 1.0: the full load)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        paths = {}
        for jobs in [10, *map(int, args.sizes.split(","))]:
            paths[jobs] = Path(scratch) / f"full-load-{jobs}.json"
            paths[jobs].write_text(json.dumps(workload.scenario(jobs, args.load)))
        fixed_path = paths.pop(10)
        fixed = min(run(fixed_path)[1] for _ in range(args.repeat))
        print(f"fixed cost (10 jobs, least of {args.repeat}): CPU {fixed:.2f} s")
        previous: tuple[int, float] | None = None
        for jobs, path in paths.items():
            wall, cpu = min((run(path) for _ in range(args.repeat if jobs < 100_000 else 1)), key=lambda r: r[1])
            marginal = ""
            if previous is not None:
                added = (cpu - previous[1]) / (jobs - previous[0])
                marginal = f"; each job after the first {previous[0]:,}: {added * 1e6:5.0f} us"
            print(
                f"{jobs:>7,} jobs: wall {wall:7.2f} s, CPU {cpu:7.2f} s; per job CPU {cpu / jobs * 1e6:5.0f} us, "
                f"without the fixed cost {(cpu - fixed) / jobs * 1e6:5.0f} us{marginal}",
                flush=True,
            )
            previous = (jobs, cpu)


if __name__ == "__main__":
    main()
