"""The forecast's cost (issue 41): one forecast of every waiting and running job, 20 shares x 5
types (the full load's quota), 1,000 running jobs and 1k / 10k waiting, the scheduler's forward
runs (``sim.forecast.RUNS``), in CPU seconds of one core; and, for scale, what encoding the
core's state costs the leader (it does not: the worker follows the input log).

    python benchmarks/forecast.py            # 1k and 10k waiting
    python benchmarks/forecast.py --quick    # 1k only
    python benchmarks/forecast.py --parts    # and where each forecast's CPU goes, part by part

``--parts`` plays one more forecast's runs with a timer around each part: the copies, taking a
copy over (every runtime drawn), the core (every input a forward run hands it: its cycles, the
finishes and starts) and the forward simulator's own work (the rest of the runs).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from airflow_quota.core import snapshot
from airflow_quota.core.config import parse_config
from airflow_quota.core.cycle import QuotaScheduler
from airflow_quota.core.estimates import EstimateSource, RuntimeEstimate
from airflow_quota.core.inputs import Input
from airflow_quota.core.lifecycle import queued
from airflow_quota.core.model import Decision, JobState
from airflow_quota.sim.forecast import HORIZON_SECONDS, RUNS, _Copies, _Forward, _Slices, forecast
from airflow_quota.sim.gc_tuning import fewer_collections
from benchmarks import workload
from benchmarks.core_cycle import _request


def state(running: int, waiting: int) -> QuotaScheduler:
    """A scheduler with about ``running`` jobs placed and running, and ``waiting`` queued behind."""
    raw = workload.quota(capacity_per_type=running // 2)
    rng = random.Random(3)
    scheduler = QuotaScheduler(parse_config(raw))
    i = 0
    while True:
        i += 1
        scheduler.submit(_request(rng, raw, i), 0.0, ref=i)
        scheduler.run_cycle(0.0)
        if queued(scheduler.state.jobs[i]):
            break
    for job in list(scheduler.state.jobs.values()):
        if job.state is JobState.SCHEDULED:
            scheduler.job_running(job, 0.0)
    queue = 1
    while queue < waiting:
        i += 1
        scheduler.submit(_request(rng, raw, i), 1.0, ref=i)
        scheduler.run_cycle(1.0)
        queue += queued(scheduler.state.jobs[i])
    for job in list(scheduler.state.jobs.values()):
        if job.state is JobState.SCHEDULED:
            scheduler.job_running(job, 1.0)
    return scheduler


def measure(running: int, waiting: int, show_parts: bool = False) -> None:
    scheduler = state(running, waiting)
    runtimes = tuple(float(s) for s in range(600, 7_200, 220))
    estimates = {seq: RuntimeEstimate(EstimateSource.TASK, runtimes) for seq in scheduler.state.jobs}
    holding = sum(1 for j in scheduler.state.jobs.values() if j.state.holds_capacity)
    queue = sum(1 for j in scheduler.state.jobs.values() if queued(j))
    started = time.process_time()
    encoded = snapshot.encode(scheduler)
    encode = time.process_time() - started
    started = time.process_time()
    result = forecast(scheduler, 1.0, estimates, runs=RUNS)
    seconds = time.process_time() - started
    given = sum(1 for s in result.starts.values() if s.start is not None)
    print(
        f"{holding:,} running, {queue:,} waiting: forecast {seconds:.2f} s CPU ({RUNS} runs), "
        f"{given:,} starts given; a snapshot of it {encode * 1000:.0f} ms ({len(encoded) / 1e6:.1f} MB)"
    )
    if show_parts:
        print(f"  where it goes: {parts(scheduler, estimates)}")


class _Timed(_Forward):
    """A forward run that times what it hands the core once ``watch`` starts."""

    core = 0.0
    timing = False

    def _handle(self, item: Input, now: float) -> list[Decision]:
        if not self.timing:
            return super()._handle(item, now)
        started = time.process_time()
        try:
            return super()._handle(item, now)
        finally:
            self.core += time.process_time() - started


def parts(scheduler: QuotaScheduler, estimates: dict[int, RuntimeEstimate]) -> str:
    """The steps of ``forecast`` (but the medians: under 1% of it), a timer around each part."""
    spent = dict.fromkeys(("the core", "the forward simulator's own work", "the copies", "taking over, drawing"), 0.0)
    targets = sorted(seq for seq, job in scheduler.state.jobs.items() if queued(job))
    cycles = 0
    with fewer_collections():
        started = time.process_time()
        copies = _Copies(scheduler)
        slices = _Slices(scheduler.state.jobs, RUNS, 0)
        spent["the copies"] += time.process_time() - started
        for run in range(RUNS):
            started = time.process_time()
            copy = copies.copy()
            copy.forget_finished()
            spent["the copies"] += time.process_time() - started
            started = time.process_time()
            played = _Timed(copy, 1.0, estimates, random.Random(f"0:{run}"), 1.0 + HORIZON_SECONDS, slices.of_run(run))
            spent["taking over, drawing"] += time.process_time() - started
            before = copy.cycles
            played.timing = True
            started = time.process_time()
            played.watch(targets)
            spent["the forward simulator's own work"] += time.process_time() - started - played.core
            spent["the core"] += played.core
            cycles += copy.cycles - before
    total = sum(spent.values())
    shown = ", ".join(f"{name} {seconds:.2f} s ({seconds / total:.0%})" for name, seconds in spent.items())
    return f"{shown}; {cycles:,} cycles in the {RUNS} runs"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--parts", action="store_true", help="and where each forecast's CPU goes")
    args = parser.parse_args()
    for waiting in (1_000,) if args.quick else (1_000, 10_000):
        measure(1_000, waiting, args.parts)


if __name__ == "__main__":
    main()
