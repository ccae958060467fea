"""What the delegating quota scheduler (``scheduler --aws-batch-job-queue``) costs as the jobs
grow: 1k / 10k (/ 100k with ``--large``) live jobs over 20 shares (the full load's quota), against
an endpoint speaking Batch's rest-json in this process (``tests/fake_batch.py``: every job
RUNNING, listed 100 a page, newest first, each answer after ``--latency`` seconds as AWS's over
the network), through the scheduler's real botocore client and a SQLite quota database.

    python benchmarks/aws_batch_mirror.py                       # 1k and 10k
    python benchmarks/aws_batch_mirror.py --large               # and 100k
    python benchmarks/aws_batch_mirror.py --submit-workers 1    # one submission after another

For each size: the submissions (``SubmitServiceJob`` each, taken in a step at a time), the first
whole sweep (every job mirrored as placed), and a steady round (nothing changed): the leader
thread's CPU (``time.thread_time``: the endpoint's threads not counted), and the AWS calls a
round makes.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from airflow_quota.aws_batch.calls import BatchCalls
from airflow_quota.aws_batch.service_jobs import LIVE_STATUSES
from airflow_quota.core.model import JobRequest
from airflow_quota.service.clock import ManualClock
from airflow_quota.service.delegation import AwsBatchDelegation
from airflow_quota.store.engine import make_engine, migrate
from airflow_quota.store.repository import QuotaStore
from benchmarks import workload
from tests.aws_batch.aws import TRAINING
from tests.fake_batch import REGION, fake_batch


def measure(count: int, latency: float, workers: int) -> None:
    raw = workload.quota(capacity_per_type=count)
    shares = [share["name"] for share in raw["shares"]]
    with tempfile.TemporaryDirectory() as folder, fake_batch(0.0, 1e9, latency) as batch:
        os.environ.update(
            AWS_ENDPOINT_URL_BATCH=batch.url,
            AWS_ACCESS_KEY_ID="x",
            AWS_SECRET_ACCESS_KEY="y",
            AWS_DEFAULT_REGION=REGION,
        )
        import boto3
        from botocore.config import Config

        engine = make_engine(f"sqlite:///{folder}/quota.db")
        migrate(engine)
        clock = ManualClock(time.time())
        store = QuotaStore(engine, clock=clock.now)
        store.apply_config(raw)
        for i in range(count):
            share = shares[i % len(shares)]
            limits = next(s for s in raw["shares"] if s["name"] == share)["capacity_limits"]
            preference = [{"instance_type": next(iter(limits)), "count": 1}]
            store.submit(JobRequest(name=f"job-{i}", share=share, preferences=preference), "sagemaker", TRAINING)
        calls = BatchCalls(boto3.client("batch", config=Config(max_pool_connections=max(10, workers))))
        service = AwsBatchDelegation(engine, calls, "quota-queue", clock=clock, submit_workers=workers)
        service.recover()
        service.mirror_seconds = 1e12  # the submissions first, the rounds after
        started, wall = time.thread_time(), time.perf_counter()
        while store.pending_requests():
            service.step()
        submit_cpu, submit_wall = time.thread_time() - started, time.perf_counter() - wall
        rounds, calls_before, started = 0, len(batch.calls), time.thread_time()
        mirrored = 0
        while mirrored < count:
            service._next_mirror = float("-inf")
            service.step()
            rounds += 1
            mirrored = len(store.jobs(states=["RUNNING"]))
        sweep_cpu, sweep_calls = time.thread_time() - started, len(batch.calls) - calls_before
        steady, steady_wall, calls_before = [], [], len(batch.calls)
        for _ in range(len(LIVE_STATUSES)):
            service._next_mirror = float("-inf")
            started, wall = time.thread_time(), time.perf_counter()
            service.step()
            steady.append(time.thread_time() - started)
            steady_wall.append(time.perf_counter() - wall)
        steady_calls = (len(batch.calls) - calls_before) / len(LIVE_STATUSES)
        steady_ms = sum(steady) / len(steady) * 1000
        steady_wall_ms = sum(steady_wall) / len(steady_wall) * 1000
        print(
            f"{count:>7,} jobs, {len(shares)} shares: submitted in {submit_cpu:.1f} s CPU ({submit_wall:.1f} s wall,"
            f" {count / submit_wall:,.0f} /s); first sweep {rounds} rounds, {sweep_calls:,} calls,"
            f" {sweep_cpu:.1f} s CPU ({sweep_cpu / rounds * 1000:.0f} ms a round); a steady round {steady_ms:.0f} ms"
            f" CPU ({steady_wall_ms:.0f} ms wall), {steady_calls:.0f} calls",
            flush=True,
        )
        engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--large", action="store_true", help="also 100k jobs")
    parser.add_argument("--latency", type=float, default=0.05, help="seconds each AWS answer takes (default 0.05)")
    parser.add_argument("--submit-workers", type=int, default=8, help="SubmitServiceJob calls at once (default 8)")
    args = parser.parse_args()
    print(f"AWS answering in {args.latency * 1000:g} ms, {args.submit_workers} submissions at once", flush=True)
    for count in (1_000, 10_000, 100_000) if args.large else (1_000, 10_000):
        measure(count, args.latency, args.submit_workers)


if __name__ == "__main__":
    main()
