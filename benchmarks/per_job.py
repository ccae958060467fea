"""The cost per job of ``airflow-quota simulate --json`` on ``benchmarks/workload.py``'s full
load (issue 15: flat from 1k to 100k jobs), each size in its own process as a user runs it.

    python benchmarks/per_job.py                     # 1k, 10k, 100k
    python benchmarks/per_job.py --sizes 1000,10000
    python benchmarks/per_job.py --sizes 1000,10000,100000,300000 --repeat 1
    python benchmarks/per_job.py --load 0.8          # a lighter load (its backlog still grows: see below)
    python benchmarks/per_job.py --instructions      # instructions instead of CPU time (valgrind)
    python benchmarks/per_job.py --windows 100000    # one run: the CPU of each tenth of its jobs
    python benchmarks/per_job.py --phases            # each size: CPU a job and peak memory by phase

Each size after the first also gets the cost of each job it adds to the size before it
(marginal cost): that leaves out the fixed cost and the first jobs, which meet an empty pool.

The CPU time of the child process (user + system) is printed beside wall time, and also per job
after taking off the fixed cost of a 10-job run (start-up: imports, reading the file). Sizes under
100k and the fixed cost run ``--repeat`` times and keep the least CPU time: the start-up alone
varies by 0.2 s between runs, which is 200 us a job at 1k.

With ``--instructions`` each run is counted by cachegrind instead of timed: a count that does
not move with the machine's load (on a shared 2-core machine the same run's CPU time moves by
up to 30%), at about 20 times the run's time (some 25 minutes for 100k jobs). It counts work,
not cache misses nor stalls, so it tells whether the cycle does more per job as the run grows,
not whether the machine runs it more slowly.

With ``--windows N`` one run of N jobs (the simulation alone, in this process, the collector
tuned as ``simulate`` tunes it) reports the CPU time spent while each tenth of its jobs
finished: whether jobs late in a long run cost more than early ones in the same process.

With ``--phases`` each size runs ``--repeat`` times, each in its own process as ``simulate
--json`` runs it, and the run of least CPU reports the CPU per job and the peak resident memory
after each of its phases: reading the scenario, the simulation, the report, its JSON. Which of
them grows with the run.
"""

from __future__ import annotations

import argparse
import itertools
import json
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import workload  # noqa: E402
from benchmarks.instructions import instructions_of, need_valgrind  # noqa: E402

SIMULATE = [sys.executable, "-m", "airflow_quota.cli", "simulate"]


def run(path: Path) -> tuple[float, float]:
    """(wall, CPU) seconds of ``simulate PATH --json`` in a child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.perf_counter()
    subprocess.run([*SIMULATE, str(path), "--json"], cwd=ROOT, stdout=subprocess.DEVNULL, check=True)
    wall = time.perf_counter() - wall
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def counted(path: Path) -> int:
    """Instructions of ``simulate PATH --json`` in a child process."""
    return instructions_of([*SIMULATE, str(path), "--json"], path.name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs of each size under 100k (and of the fixed cost): the least CPU"
    )
    parser.add_argument(
        "--load", type=float, default=1.0, help="demand over capacity (workload.py's load; 1.0: the full load)"
    )
    parser.add_argument("--instructions", action="store_true", help="count instructions (valgrind), not CPU time")
    parser.add_argument("--windows", type=int, metavar="N", help="one run of N jobs: the CPU of each tenth")
    parser.add_argument("--phases", action="store_true", help="CPU a job and peak memory by phase")
    parser.add_argument("--phases-of", type=Path, help=argparse.SUPPRESS)  # one run, in the child process
    args = parser.parse_args()
    if args.phases_of:
        _phases_of(args.phases_of)
        return
    if args.windows:
        _windows(args.windows, args.load)
        return
    if args.instructions:
        need_valgrind()
    with tempfile.TemporaryDirectory() as scratch:
        paths = {}
        for jobs in [10, *map(int, args.sizes.split(","))]:
            paths[jobs] = Path(scratch) / f"full-load-{jobs}.json"
            paths[jobs].write_text(json.dumps(workload.scenario(jobs, args.load)))
        fixed_path = paths.pop(10)
        if args.phases:
            _phases(paths, args.repeat)
        elif args.instructions:
            _per_job_instructions(fixed_path, paths)
        else:
            _per_job_time(fixed_path, paths, args.repeat)


def _each_added(previous: tuple[int, float] | None, jobs: int, cost: float, shown: Callable[[float], str]) -> str:
    """The cost of each job this size adds to the size before it (``previous``: its jobs and cost)."""
    if previous is None:
        return ""
    return f"; each job after the first {previous[0]:,}: {shown((cost - previous[1]) / (jobs - previous[0]))}"


def _per_job_time(fixed_path: Path, paths: dict[int, Path], repeat: int) -> None:
    fixed = min(run(fixed_path)[1] for _ in range(repeat))
    print(f"fixed cost (10 jobs, least of {repeat}): CPU {fixed:.2f} s")
    previous: tuple[int, float] | None = None
    for jobs, path in paths.items():
        wall, cpu = min((run(path) for _ in range(repeat if jobs < 100_000 else 1)), key=lambda r: r[1])
        marginal = _each_added(previous, jobs, cpu, lambda added: f"{added * 1e6:5.0f} us")
        print(
            f"{jobs:>7,} jobs: wall {wall:7.2f} s, CPU {cpu:7.2f} s; per job CPU {cpu / jobs * 1e6:5.0f} us, "
            f"without the fixed cost {(cpu - fixed) / jobs * 1e6:5.0f} us{marginal}",
            flush=True,
        )
        previous = (jobs, cpu)


def _per_job_instructions(fixed_path: Path, paths: dict[int, Path]) -> None:
    fixed = counted(fixed_path)
    print(f"fixed cost (10 jobs): {fixed / 1e9:.3f} G instructions", flush=True)
    previous: tuple[int, float] | None = None
    for jobs, path in paths.items():
        total = counted(path)
        marginal = _each_added(previous, jobs, total, lambda added: f"{added / 1e6:.3f} M")
        print(
            f"{jobs:>7,} jobs: {total / 1e9:8.3f} G instructions; per job without the fixed cost "
            f"{(total - fixed) / jobs / 1e6:.3f} M{marginal}",
            flush=True,
        )
        previous = (jobs, total)


def _windows(jobs: int, load: float) -> None:
    from airflow_quota.sim.gc_tuning import fewer_collections
    from airflow_quota.sim.scenario import parse_scenario
    from airflow_quota.sim.simulator import Simulator

    simulator = Simulator(parse_scenario(workload.scenario(jobs, load), ROOT))
    tenth = jobs // 10
    marks: list[float] = []

    def look(now: float, cycles: int, finished: int) -> None:
        while finished >= (len(marks) + 1) * tenth:
            marks.append(time.process_time())

    simulator._progress = look
    with fewer_collections():
        start = time.process_time()
        simulator.run()
    for i, (before, after) in enumerate(itertools.pairwise([start, *marks])):
        first, last = i * tenth + 1, (i + 1) * tenth
        print(f"jobs {first:>7,} to {last:>7,} finished: CPU {(after - before) / tenth * 1e6:5.0f} us a job")


def _phases_of(path: Path) -> None:
    """One ``simulate --json`` run of the scenario, phase by phase, in this process."""
    from airflow_quota.sim.gc_tuning import fewer_collections
    from airflow_quota.sim.report import build_report, to_json
    from airflow_quota.sim.scenario import load_scenario
    from airflow_quota.sim.simulator import Simulator

    def peak_mb() -> int:
        # VmHWM starts again at exec; ru_maxrss keeps the parent's peak from before it
        status = Path("/proc/self/status").read_text()
        return int(status.split("VmHWM:")[1].split()[0]) // 1024

    marks = [("start", time.process_time(), peak_mb())]
    with fewer_collections():
        scenario = load_scenario(path)
        marks.append(("read", time.process_time(), peak_mb()))
        result = Simulator(scenario).run()
        marks.append(("simulate", time.process_time(), peak_mb()))
        report = build_report(result)
        marks.append(("report", time.process_time(), peak_mb()))
        text = to_json(report)
        marks.append(("json", time.process_time(), peak_mb()))
    print(json.dumps({"jobs": len(result.scheduler.state.jobs), "marks": marks, "bytes": len(text)}))


def _phases(paths: dict[int, Path], repeat: int) -> None:
    """Each size's ``--phases-of`` runs, each in its own process; the one of least CPU shown."""
    for path in paths.values():
        runs = []
        for _ in range(repeat):
            child = subprocess.run(
                [sys.executable, __file__, "--phases-of", str(path)], check=True, capture_output=True, text=True
            )
            runs.append(json.loads(child.stdout))
        best = min(runs, key=lambda run: run["marks"][-1][1] - run["marks"][0][1])
        jobs, marks = best["jobs"], best["marks"]
        phases = ", ".join(
            f"{name} {(after - before) / jobs * 1e6:5.1f} us ({peak:,} MB)"
            for (_, before, _), (name, after, peak) in itertools.pairwise(marks)
        )
        total = (marks[-1][1] - marks[0][1]) / jobs * 1e6
        print(
            f"{jobs:>7,} jobs, least of {repeat}: CPU a job (peak memory after it): {phases}; all {total:5.1f} us",
            flush=True,
        )


if __name__ == "__main__":
    main()
