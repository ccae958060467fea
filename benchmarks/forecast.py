"""The forecast's cost (issue 41): one forecast of every waiting and running job, 20 shares x 5
types (the full load's quota), 1,000 running jobs and 1k / 10k waiting, 8 forward runs, in CPU
seconds of one core; and what a refresh adds to the leader's step (encoding the core's copy).

    python benchmarks/forecast.py            # 1k and 10k waiting
    python benchmarks/forecast.py --quick    # 1k only
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
from airflow_quota.core.lifecycle import queued
from airflow_quota.core.model import JobState
from airflow_quota.sim.forecast import RUNS, forecast
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


def measure(running: int, waiting: int) -> None:
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
        f"{given:,} starts given; the leader's copy {encode * 1000:.0f} ms ({len(encoded) / 1e6:.1f} MB)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    for waiting in (1_000,) if args.quick else (1_000, 10_000):
        measure(1_000, waiting)


if __name__ == "__main__":
    main()
