"""Polling within budget (issue 15): 1,000 SageMaker jobs, started, polled and stopped through botocore.

    python benchmarks/polling.py            # 1,000 jobs running, the default 30 s interval (about two minutes)
    python benchmarks/polling.py --quick    # 200 jobs, a 10 s interval (under a minute)
    python benchmarks/polling.py --burst    # 1,000 jobs placed at once, then all cancelled (about three minutes)

A real botocore SageMaker client (fake credentials, never on the network) answers every call from
a ``before-call.sagemaker.*`` event handler that keeps one fake training job per TrainingJobName,
with its LastModifiedTime (created, completed, stopped), and answers ListTrainingJobs from them
(LastModifiedTimeAfter, NameContains, MaxResults up to 100 and NextToken, as SageMaker does).
botocore's request validation and serialisation run before that event, as in production; the
answer takes ``--aws-latency`` seconds (a sleep in the fake AWS, per call). botocore's Stubber
does not fit here: it answers queued responses in order, and the poller asks about 1,000
different jobs concurrently, in no fixed order.

1. Setup (not measured): a fresh PostgreSQL database (``QUOTA_TEST_POSTGRES_URL``, as
   ``benchmarks/service.py``), one share of ``jobs`` ml.g5.xlarge, ``jobs`` + ``changes`` jobs
   submitted to the ``sagemaker`` backend; a first scheduler, stepped inline with an instant fake
   AWS, places and starts ``jobs`` of them and takes every one in as RUNNING (the steady state a
   new leader takes over).
2. Measured: a second scheduler (a new leader) takes over with ``QuotaService.run`` on the wall
   clock, recovers from the log and leads for ``--seconds``. ``changes`` of the running training
   jobs complete at random moments of the first half (seeded); the queued jobs take their place.

With ``--burst`` instead: ``jobs`` jobs wait before the measured leader starts; it places them
all in its first cycle (``jobs`` starts, two calls each), and once every one is started they are
all cancelled at once (``jobs`` stops). The leader runs until every attempt has ended.

Reported: AWS calls per second (mean over the run, the busiest second, the seconds over 40),
which thread made them and for what (the leader's step versus the poller's threads; list, poll,
start, stop), every change's lateness (the leader's input ``finished`` minus the moment the job
completed in the fake AWS), and the leader's step times.

Targets (issue 15): ≤ 40 AWS calls per second in total, every change noticed within one interval,
and a leader step that never waits on AWS.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import boto3
from botocore.awsrequest import AWSResponse
from sqlalchemy import func, select

from airflow_quota.core.model import JobRequest, PreferenceEntry
from airflow_quota.service.backends.base import AttemptReport, AttemptSpec, ChangePage, StartedAttempt
from airflow_quota.service.backends.sagemaker import (
    DEFAULT_LIST_INTERVAL_SECONDS,
    DEFAULT_POLL_CALLS_PER_SECOND,
    SageMakerBackend,
)
from airflow_quota.service.clock import WallClock
from airflow_quota.service.metrics import QuotaMetrics
from airflow_quota.service.scheduler import QuotaService
from airflow_quota.store.engine import make_engine, migrate
from airflow_quota.store.models import Attempt, Input
from airflow_quota.store.repository import QuotaStore
from benchmarks.service import ADMIN, fresh_database

REGION = "us-east-1"
TYPE = "ml.g5.xlarge"
TRAINING: dict[str, Any] = {
    "AlgorithmSpecification": {
        "TrainingImage": f"123456789012.dkr.ecr.{REGION}.amazonaws.com/llm-train:1.4",
        "TrainingInputMode": "File",
    },
    "RoleArn": "arn:aws:iam::123456789012:role/SageMakerTraining",
    "OutputDataConfig": {"S3OutputPath": "s3://team-a-models/output"},
    "ResourceConfig": {"VolumeSizeInGB": 200},
    "StoppingCondition": {"MaxRuntimeInSeconds": 86400},
}
"""A valid CreateTrainingJob request without the placement (botocore validates every create)."""
LEADER_THREAD = "leader"


class FakeSageMaker:
    """Training jobs by name, answered from botocore's ``before-call`` event; every call is
    recorded with its moment, operation and calling thread."""

    def __init__(self, latency: float) -> None:
        self.latency = latency
        self.jobs: dict[str, dict[str, Any]] = {}
        self.completes_at: dict[str, float] = {}
        """Training jobs that complete by themselves, and when (epoch seconds)."""
        self.calls: list[tuple[float, str, str, str]] = []
        """(moment, operation, calling thread, what the backend was doing: poll, start or stop)"""
        self.asked_after: dict[str, float] = {}
        """Training jobs that completed: when they were first described as Completed (the call's moment)."""
        self.doing = threading.local()
        self._lock = threading.Lock()

    def attach(self, client: Any) -> None:
        client.meta.events.register("before-call.sagemaker.*", self.answer)

    def answer(self, model: Any, params: dict[str, Any], **_: Any) -> tuple[AWSResponse, dict[str, Any]]:
        now = time.time()
        with self._lock:
            doing = getattr(self.doing, "what", "?")
            self.calls.append((now, model.name, threading.current_thread().name, doing))
        if self.latency:
            time.sleep(self.latency)  # the fake service's response time, not synchronisation
        body = json.loads(params["body"] or b"{}")
        name = body.get("TrainingJobName", "")
        with self._lock:
            if model.name == "ListTrainingJobs":
                return ok(self._list(body, now))
            if model.name == "CreateTrainingJob":
                at = datetime.fromtimestamp(now, timezone.utc)
                self.jobs[name] = {
                    "TrainingJobName": name,
                    "TrainingJobStatus": "InProgress",
                    "SecondaryStatus": "Training",
                    "TrainingStartTime": at,
                    "LastModifiedTime": at,
                }
                return ok({"TrainingJobArn": f"arn:aws:sagemaker:{REGION}:123456789012:training-job/{name}"})
            job = self.jobs.get(name)
            if job is None:
                return error("ValidationException", "Requested resource not found.")
            if model.name == "StopTrainingJob":
                job.update(
                    TrainingJobStatus="Stopped",
                    SecondaryStatus="Stopped",
                    LastModifiedTime=datetime.fromtimestamp(now, timezone.utc),
                )
                return ok({})
            ends = self.completes_at.get(name)
            if ends is not None and now >= ends:
                self.asked_after.setdefault(name, now)
            self._settle(name, job, now)
            return ok(dict(job))

    def _settle(self, name: str, job: dict[str, Any], now: float) -> None:
        """A job whose completion time has come is Completed, modified at that time. Lock held."""
        ends = self.completes_at.get(name)
        if ends is not None and now >= ends and job["TrainingJobStatus"] == "InProgress":
            at = datetime.fromtimestamp(ends, timezone.utc)
            job.update(TrainingJobStatus="Completed", SecondaryStatus="Completed", TrainingEndTime=at)
            job["LastModifiedTime"] = at

    def _list(self, body: dict[str, Any], now: float) -> dict[str, Any]:
        """ListTrainingJobs as SageMaker answers it: the jobs whose name contains NameContains,
        modified after LastModifiedTimeAfter, in name order, MaxResults (at most 100) a page,
        NextToken the offset of the next page. Lock held."""
        after = body.get("LastModifiedTimeAfter")
        since = float("-inf") if after is None else float(after)
        contains = body.get("NameContains", "")
        matching = []
        for name in sorted(self.jobs):
            job = self.jobs[name]
            self._settle(name, job, now)
            if contains in name and job["LastModifiedTime"].timestamp() > since:
                matching.append(job)
        size = min(int(body.get("MaxResults", 100)), 100)
        offset = int(body.get("NextToken") or 0)
        summaries = [
            {
                "TrainingJobName": job["TrainingJobName"],
                "TrainingJobArn": f"arn:aws:sagemaker:{REGION}:123456789012:training-job/{job['TrainingJobName']}",
                "CreationTime": job["TrainingStartTime"],
                "LastModifiedTime": job["LastModifiedTime"],
                "TrainingJobStatus": job["TrainingJobStatus"],
                "SecondaryStatus": job["SecondaryStatus"],
            }
            for job in matching[offset : offset + size]
        ]
        more = offset + size < len(matching)
        return {"TrainingJobSummaries": summaries, **({"NextToken": str(offset + size)} if more else {})}


def ok(parsed: dict[str, Any]) -> tuple[AWSResponse, dict[str, Any]]:
    return AWSResponse(None, 200, {}, None), {**parsed, "ResponseMetadata": {"HTTPStatusCode": 200}}


def error(code: str, message: str) -> tuple[AWSResponse, dict[str, Any]]:
    parsed = {"Error": {"Code": code, "Message": message}, "ResponseMetadata": {"HTTPStatusCode": 400}}
    return AWSResponse(None, 400, {}, None), parsed


class RecordedSageMaker(SageMakerBackend):
    """The real backend, telling the fake AWS whether a call comes from a poll, a start or a stop.
    ``rate`` None: no cap on the calls (the unmeasured setup)."""

    def __init__(
        self, fake: FakeSageMaker, interval: float, rate: float | None = DEFAULT_POLL_CALLS_PER_SECOND
    ) -> None:
        client = boto3.client(
            "sagemaker", region_name=REGION, aws_access_key_id="testing", aws_secret_access_key="testing"
        )
        fake.attach(client)
        super().__init__(client=client, name_prefix="bench", poll_interval_seconds=interval, poll_calls_per_second=rate)
        self.fake = fake

    def poll(self, attempt: AttemptSpec) -> AttemptReport:
        self.fake.doing.what = "poll"
        return super().poll(attempt)

    def changed_since(self, attempts: Sequence[AttemptSpec], since: float, page: object | None) -> ChangePage:
        self.fake.doing.what = "list"
        return super().changed_since(attempts, since, page)

    def start(self, attempt: AttemptSpec) -> StartedAttempt:
        self.fake.doing.what = "start"
        return super().start(attempt)

    def stop(self, attempt: AttemptSpec, grace_seconds: float) -> None:
        self.fake.doing.what = "stop"
        super().stop(attempt, grace_seconds)


def timed(step: Callable[[], bool], durations: list[float]) -> Callable[[], bool]:
    def step_and_time() -> bool:
        started = time.perf_counter()
        try:
            return step()
        finally:
            durations.append(time.perf_counter() - started)

    return step_and_time


def run(jobs: int, changes: int, interval: float, seconds: float, latency: float, workers: int) -> dict[str, Any]:
    fake = FakeSageMaker(latency=0.0)
    with fresh_database() as url:
        engine = make_engine(url)
        migrate(engine)
        store = QuotaStore(engine)
        store.apply_config(
            {
                "pool": {"capacity": {TYPE: jobs}},
                "shares": [{"name": "a", "capacity_limits": {TYPE: jobs}, "strategy": "LEND_AND_BORROW"}],
            }
        )
        for i in range(jobs + changes):
            request = JobRequest(
                name=f"train-{i}", share="a", preferences=[PreferenceEntry(instance_type=TYPE, count=1)]
            )
            store.submit(request, "sagemaker", TRAINING)
        setup = QuotaService(  # described at every step: the steady state before the takeover
            engine, {"sagemaker": RecordedSageMaker(fake, 0.0, rate=None)}, clock=WallClock(), holder="setup"
        )

        def running() -> int:
            with engine.connect() as c:
                where = Attempt.status == "RUNNING"
                return int(c.scalar(select(func.count()).select_from(Attempt).where(where)) or 0)

        while len(fake.jobs) < jobs or running() < jobs:
            setup.step()
        setup.poller.stop()

        rng = random.Random(15)
        start = time.time()
        changing = rng.sample(sorted(fake.jobs), changes)
        fake.completes_at = {name: start + rng.uniform(1.0, seconds / 2) for name in changing}
        fake.latency = latency
        fake.calls.clear()
        service = QuotaService(
            engine,
            {"sagemaker": RecordedSageMaker(fake, interval)},
            clock=WallClock(),
            holder="measured",
            poll_workers=workers,
            metrics=QuotaMetrics.off(),
        )
        durations: list[float] = []
        service.step = timed(service.step, durations)  # type: ignore[method-assign]
        stop = threading.Event()
        leader = threading.Thread(target=service.run, args=(stop, False), name=LEADER_THREAD)
        leader.start()
        stop.wait(seconds)  # the measured run: the leader and its poller work meanwhile
        stop.set()
        leader.join()
        end = time.time()

        with engine.connect() as c:
            finished = c.execute(select(Input.payload, Input.at).where(Input.kind == "finished")).all()
            running = c.scalar(select(func.count()).select_from(Attempt).where(Attempt.status == "RUNNING"))
        engine.dispose()

    seen = {int(payload["job_id"]): at for payload, at in finished}
    job_ids = {name: int(name.split("-")[-2]) for name in changing}
    lateness = [seen[job_ids[name]] - ends for name, ends in fake.completes_at.items() if job_ids[name] in seen]
    asked = [fake.asked_after[name] - ends for name, ends in fake.completes_at.items() if name in fake.asked_after]
    return {
        **call_figures(fake, start, end, durations),
        "changes": changes,
        "noticed": len(lateness),
        "late_max": max(lateness),
        "asked_max": max(asked),
        "asked_p50": statistics.median(asked),
        "late_p50": statistics.median(lateness),
        "running_at_end": running,
    }


def call_figures(fake: FakeSageMaker, start: float, end: float, durations: list[float]) -> dict[str, Any]:
    """The AWS calls per second and by thread and purpose, and the leader's step times."""
    per_second = Counter(int(at - start) for at, _, _, _ in fake.calls if start <= at < end)
    whole = int(end - start)
    by_thread = Counter(
        ("leader step" if thread == LEADER_THREAD else "poller threads", doing) for _, _, thread, doing in fake.calls
    )
    return {
        "calls": len(fake.calls),
        "mean_per_second": len(fake.calls) / (end - start),
        "busiest_second": max(per_second[s] for s in range(whole)),
        "busiest_five": max(sum(per_second[s + k] for k in range(5)) / 5 for s in range(whole - 4)),
        "seconds_over_40": sum(1 for s in range(whole) if per_second[s] > 40),
        "seconds": whole,
        "by_thread": dict(by_thread),
        "steps": len(durations),
        "step_p50": statistics.median(durations),
        "step_p99": sorted(durations)[int(0.99 * (len(durations) - 1))],
        "step_max": max(durations),
    }


def run_burst(jobs: int, interval: float, latency: float, workers: int, limit: float) -> dict[str, Any]:
    """``jobs`` jobs placed at once by a leader on the wall clock, then all cancelled once every one
    is started; measured from the leader's start until every attempt has ended (or ``limit`` s)."""
    fake = FakeSageMaker(latency=latency)
    with fresh_database() as url:
        engine = make_engine(url)
        migrate(engine)
        store = QuotaStore(engine)
        store.apply_config(
            {
                "pool": {"capacity": {TYPE: jobs}},
                "shares": [{"name": "a", "capacity_limits": {TYPE: jobs}, "strategy": "LEND_AND_BORROW"}],
            }
        )
        ids = [
            store.submit(
                JobRequest(name=f"burst-{i}", share="a", preferences=[PreferenceEntry(instance_type=TYPE, count=1)]),
                "sagemaker",
                TRAINING,
            ).id
            for i in range(jobs)
        ]
        service = QuotaService(
            engine,
            {"sagemaker": RecordedSageMaker(fake, interval)},
            clock=WallClock(),
            holder="measured",
            poll_workers=workers,
            metrics=QuotaMetrics.off(),
        )
        durations: list[float] = []
        service.step = timed(service.step, durations)  # type: ignore[method-assign]
        stop = threading.Event()
        leader = threading.Thread(target=service.run, args=(stop, False), name=LEADER_THREAD)
        start = time.time()
        leader.start()

        def count(*where: Any) -> int:
            with engine.connect() as c:
                return int(c.scalar(select(func.count()).select_from(Attempt).where(*where)) or 0)

        # sampled twice a second: when every start is marked done, then every attempt ended
        while time.time() < start + limit and count(Attempt.action.is_(None), Attempt.status != "PLACED") < jobs:
            stop.wait(0.5)
        started_all = time.time()
        for job_id in ids:
            store.cancel(job_id)
        while time.time() < start + limit and count(Attempt.ended_at.is_not(None)) < jobs:
            stop.wait(0.5)
        ended_all = time.time()
        stop.set()
        leader.join()
        end = time.time()
        ended = count(Attempt.ended_at.is_not(None))
        engine.dispose()
    created = [at for at, operation, _, _ in fake.calls if operation == "CreateTrainingJob"]
    stops = [at for at, operation, _, _ in fake.calls if operation == "StopTrainingJob"]
    return {
        **call_figures(fake, start, end, durations),
        "created": len(created),
        "last_created": max(created) - start,
        "started_all": started_all - start,
        "stopped": len(stops),
        "last_stopped": max(stops) - started_all,
        "ended": ended,
        "ended_all": ended_all - started_all,
    }


Row = tuple[str, str, str]


def steady_rows(args: argparse.Namespace, r: dict[str, Any]) -> list[Row]:
    return [
        ("running SageMaker jobs", f"{args.jobs:,} ({r['running_at_end']:,} RUNNING at the end)", ""),
        (
            "interval, listing every, workers, AWS latency",
            f"{args.interval:g} s, {DEFAULT_LIST_INTERVAL_SECONDS:g} s, {args.workers},"
            f" {args.aws_latency * 1000:.0f} ms",
            "",
        ),
        (
            "completions asked about (first DescribeTrainingJob after it)",
            f"p50 {r['asked_p50']:.1f} s, max {r['asked_max']:.2f} s after the change",
            f"≤ {args.interval:g} s",
        ),
        (
            "completions taken in by the leader (its input `finished`)",
            f"{r['noticed']} of {r['changes']}, p50 {r['late_p50']:.1f} s, max {r['late_max']:.2f} s after the change",
            f"all, ≤ {args.interval:g} s",
        ),
    ]


def burst_rows(args: argparse.Namespace, r: dict[str, Any]) -> list[Row]:
    return [
        (
            "jobs placed at once, then cancelled",
            f"{args.jobs:,}; interval {args.interval:g} s, {args.workers} workers, AWS latency"
            f" {args.aws_latency * 1000:.0f} ms",
            "",
        ),
        (
            "training jobs created",
            f"{r['created']:,}, the last {r['last_created']:.1f} s after the leader began;"
            f" all marked started at {r['started_all']:.1f} s",
            "",
        ),
        (
            "training jobs asked to stop (after the cancels)",
            f"{r['stopped']:,}, the last {r['last_stopped']:.1f} s after the cancels;"
            f" {r['ended']:,} attempts ended, the last taken in {r['ended_all']:.1f} s after the cancels",
            "",
        ),
    ]


def common_rows(r: dict[str, Any]) -> list[Row]:
    in_step = sum(n for (thread, _), n in r["by_thread"].items() if thread == "leader step")
    return [
        (
            "AWS calls per second",
            f"mean {r['mean_per_second']:.1f}, busiest 5 s {r['busiest_five']:.1f}/s,"
            f" busiest second {r['busiest_second']}; seconds over 40: {r['seconds_over_40']} of {r['seconds']}",
            "≤ 40 in every second",
        ),
        (
            "AWS calls by thread and purpose",
            ", ".join(f"{thread}: {doing} {n}" for (thread, doing), n in sorted(r["by_thread"].items())),
            "",
        ),
        ("AWS calls made in the leader's step", f"{in_step}", "0"),
        (
            "leader step time",
            f"p50 {r['step_p50'] * 1000:.0f} ms, p99 {r['step_p99'] * 1000:.0f} ms, max {r['step_max'] * 1000:.0f} ms"
            f" ({r['steps']} steps)",
            "",
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="200 jobs, a 10 s interval, 30 s")
    parser.add_argument("--burst", action="store_true", help="--jobs placed at once, then all cancelled")
    parser.add_argument("--jobs", type=int, default=1000, help="training jobs running (default %(default)d)")
    parser.add_argument("--changes", type=int, default=100, help="of them, completing during the run")
    parser.add_argument("--interval", type=float, default=30.0, help="--sagemaker-poll-seconds (default %(default)g)")
    parser.add_argument("--seconds", type=float, default=100.0, help="how long the measured leader runs")
    parser.add_argument("--aws-latency", type=float, default=0.05, help="seconds per fake AWS answer")
    parser.add_argument("--workers", type=int, default=8, help="--poll-workers (default %(default)d)")
    args = parser.parse_args()
    if args.quick:
        args.jobs, args.changes, args.interval, args.seconds = 200, 20, 10.0, 30.0
    command = "python benchmarks/polling.py" + (" --quick" if args.quick else "") + (" --burst" if args.burst else "")
    print(f"$ {command}  (PostgreSQL at {ADMIN.split('@')[-1]})")
    if args.burst:
        r = run_burst(args.jobs, args.interval, args.aws_latency, args.workers, limit=max(args.seconds, 600.0))
        rows = burst_rows(args, r)
    else:
        r = run(args.jobs, args.changes, args.interval, args.seconds, args.aws_latency, args.workers)
        rows = steady_rows(args, r)
    rows += common_rows(r)
    width = [max(len(row[i]) for row in rows) for i in range(3)]
    print(f"| {'measure':<{width[0]}} | {'result':<{width[1]}} | target |")
    print(f"|{'-' * (width[0] + 2)}|{'-' * (width[1] + 2)}|--------|")
    for row in rows:
        print(f"| {row[0]:<{width[0]}} | {row[1]:<{width[1]}} | {row[2]} |")


if __name__ == "__main__":
    main()
