"""The cost per job of ``airflow-quota simulate --json`` on ``benchmarks/workload.py``'s full
load (issue 15: flat from 1k to 100k jobs), each size in its own process as a user runs it.

    python benchmarks/per_job.py                     # 1k, 10k, 100k
    python benchmarks/per_job.py --sizes 1000,10000
    python benchmarks/per_job.py --sizes 1000,10000,100000,300000 --repeat 1
    python benchmarks/per_job.py --load 0.8          # a lighter load (its backlog still grows: see below)
    python benchmarks/per_job.py --instructions      # instructions instead of CPU time (valgrind)
    python benchmarks/per_job.py --windows 100000    # one run: the CPU of each tenth of its jobs
    python benchmarks/per_job.py --phases            # each size: CPU a job and peak memory by phase
    python benchmarks/per_job.py --cycles            # each size: cycles a job, by what started them
    python benchmarks/per_job.py --one-heap          # each size's simulation in one process, one heap

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
them grows with the run; and the CPU a cycle of the simulation.

With ``--cycles`` each size runs once in this process and reports the cycles a job, by what
started each cycle (an arrival, a finish on the simulated backend, or only a timer: a job's wait
reaching its share's ``in_share_preemption_after_seconds`` or ``starvation_after_seconds``), with
how long the jobs waited. The full load's backlog grows
with the run, so its jobs wait longer and more of them reach those thresholds: the workload
asks for more cycles a job the longer it is. The cost *a cycle* is what the scheduler controls.
Instructions (``--instructions``) are also given a cycle, the cycles counted by such a run.

With ``--one-heap`` the simulations of every size run in this process, after the largest has
run once and is kept: each then runs ``--repeat`` times over the same heap (the least CPU kept),
so that the sizes differ only by their work, not by how large a heap the process has. In a
process of its own a run of 10k jobs has a heap of 90 MB and one of 100k a heap of 570 MB.
"""

from __future__ import annotations

import argparse
import itertools
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from airflow_quota.core.cycle import QuotaScheduler

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
    parser.add_argument("--cycles", action="store_true", help="cycles a job, by what started them")
    parser.add_argument("--one-heap", action="store_true", help="every size's simulation in one process")
    parser.add_argument("--phases-of", type=Path, help=argparse.SUPPRESS)  # one run, in the child process
    args = parser.parse_args()
    if args.phases_of:
        _phases_of(args.phases_of)
        return
    if args.windows:
        _windows(args.windows, args.load)
        return
    if args.one_heap:
        _one_heap(sorted(map(int, args.sizes.split(","))), args.load, args.repeat)
        return
    if args.cycles:
        for jobs in map(int, args.sizes.split(",")):
            _show_cycles(jobs, args.load)
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
        cycles = _count_cycles(path).total
        marginal = _each_added(previous, jobs, total, lambda added: f"{added / 1e6:.3f} M")
        print(
            f"{jobs:>7,} jobs: {total / 1e9:8.3f} G instructions; per job without the fixed cost "
            f"{(total - fixed) / jobs / 1e6:.3f} M{marginal}; {cycles / jobs:.3f} cycles a job, "
            f"{(total - fixed) / cycles / 1e6:.3f} M a cycle",
            flush=True,
        )
        previous = (jobs, total)


def _one_heap(sizes: list[int], load: float, repeat: int) -> None:
    from airflow_quota.sim.gc_tuning import fewer_collections
    from airflow_quota.sim.scenario import parse_scenario
    from airflow_quota.sim.simulator import Simulator

    scenarios = {jobs: parse_scenario(workload.scenario(jobs, load), ROOT) for jobs in sizes}
    with fewer_collections():
        kept = Simulator(scenarios[sizes[-1]]).run()  # the heap every measured run shares
        for jobs in sizes:
            runs = []
            for _ in range(repeat):
                start = time.process_time()
                result = Simulator(scenarios[jobs]).run()
                runs.append((time.process_time() - start, result.cycles))
            cpu, cycles = min(runs)
            print(
                f"{jobs:>7,} jobs, least of {repeat}, one heap: the simulation's CPU {cpu / jobs * 1e6:5.1f} us a job, "
                f"{cycles / jobs:.3f} cycles a job, {cpu / cycles * 1e6:5.1f} us a cycle",
                flush=True,
            )
    del kept  # held until every size has run


def _windows(jobs: int, load: float) -> None:
    from airflow_quota.sim.gc_tuning import fewer_collections
    from airflow_quota.sim.scenario import parse_scenario
    from airflow_quota.sim.simulator import Simulator

    simulator = Simulator(parse_scenario(workload.scenario(jobs, load), ROOT))
    tenth = jobs // 10
    marks: list[float] = []

    def look(scheduler: QuotaScheduler, now: float) -> None:
        state = scheduler.state
        finished = len(state.jobs) - len(state.live_names)
        while finished >= (len(marks) + 1) * tenth:
            marks.append(time.process_time())

    simulator.after_each_cycle(look)
    with fewer_collections():
        start = time.process_time()
        simulator.run()
    for i, (before, after) in enumerate(itertools.pairwise([start, *marks])):
        first, last = i * tenth + 1, (i + 1) * tenth
        print(f"jobs {first:>7,} to {last:>7,} finished: CPU {(after - before) / tenth * 1e6:5.0f} us a job")


@dataclass
class CycleCount:
    """One run's cycles, by what started each, and its jobs' waits."""

    jobs: int = 0
    arrival: int = 0
    backend: int = 0
    """Cycles at a finish on the simulated backend (and no arrival)."""
    timers: int = 0
    """Cycles started only by a timer: a wait reaching a threshold (in-share preemption, starvation)."""
    waits: list[float] = field(default_factory=list)

    @property
    def total(self) -> int:
        return self.arrival + self.backend + self.timers


def _count_cycles(path: Path) -> CycleCount:
    """Run the scenario in this process, counting its cycles by what started them.

    Through the simulator's public hooks: a cycle at the time of a scenario event is an
    arrival's; else one that a job's finish (a ``Succeeded`` decision) came just before is the
    backend's; else a timer's. That holds for ``workload.py``'s jobs, which have no start-up
    time, no grace and no failures, so a finish is the only thing the backend does on its own."""
    from airflow_quota.core.model import Decision, Succeeded
    from airflow_quota.sim.gc_tuning import fewer_collections
    from airflow_quota.sim.scenario import load_scenario
    from airflow_quota.sim.simulator import Simulator

    count = CycleCount()
    scenario = load_scenario(path)
    arrivals = {event.at for event in scenario.events}
    finished = [False]

    def note(decision: Decision) -> None:
        if isinstance(decision, Succeeded):
            finished[0] = True

    def look(_scheduler: QuotaScheduler, now: float) -> None:
        if now in arrivals:
            count.arrival += 1
        elif finished[0]:
            count.backend += 1
        else:
            count.timers += 1
        finished[0] = False

    simulator = Simulator(scenario)
    simulator.on_decision = note
    simulator.after_each_cycle(look)
    with fewer_collections():
        result = simulator.run()
    jobs = result.scheduler.state.jobs.values()
    count.jobs = len(jobs)
    count.waits = [job.wait_seconds for job in jobs]
    assert count.total == result.cycles, (count.total, result.cycles)
    return count


def _show_cycles(jobs: int, load: float) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / f"full-load-{jobs}.json"
        path.write_text(json.dumps(workload.scenario(jobs, load)))
        count = _count_cycles(path)
    n = count.jobs
    waits = count.waits
    past = ", ".join(
        f"past {label} {sum(w >= seconds for w in waits) / n:.1%}"
        for label, seconds in (("600 s", 600), ("6 h", 6 * 3600))
    )
    print(
        f"{n:>7,} jobs: {count.total / n:.3f} cycles a job: at an arrival {count.arrival / n:.3f}, at a finish "
        f"{count.backend / n:.3f}, timers only {count.timers / n:.3f}; "
        f"mean wait {statistics.fmean(waits) / 60:.1f} min, waited {past}",
        flush=True,
    )


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
    print(
        json.dumps(
            {"jobs": len(result.scheduler.state.jobs), "cycles": result.cycles, "marks": marks, "bytes": len(text)}
        )
    )


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
        simulation = marks[2][1] - marks[1][1]
        print(
            f"{jobs:>7,} jobs, least of {repeat}: CPU a job (peak memory after it): {phases}; all {total:5.1f} us; "
            f"{best['cycles'] / jobs:.3f} cycles a job, "
            f"the simulation {simulation / best['cycles'] * 1e6:5.1f} us a cycle",
            flush=True,
        )


if __name__ == "__main__":
    main()
