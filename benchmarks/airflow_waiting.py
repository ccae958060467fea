"""Benchmark of training tasks waiting for capacity in a real Airflow 3.3 (issue 4).

    python benchmarks/airflow_waiting.py                    # 1,000 tasks (about 15 minutes)
    python benchmarks/airflow_waiting.py --tasks 100        # a quick look

A real Airflow (scheduler, dag-processor, triggerer, api-server, LocalExecutor with **2 worker
slots**, PostgreSQL metadata) and ``airflow-quota scheduler`` with the local backend, started by
``airflow_quota.devtools.stack``. One DAG run maps ``QuotaTrainingOperator`` over ``--tasks``
trainings (``sleep --seconds`` each, one ``ml.g5.xlarge``) in a pool of ``--capacity`` instances,
so nearly all of them wait for capacity at once. Measured:

1. Worker slots used while waiting: sampled every ``--sample`` seconds, the task instances in
   ``queued`` or ``running`` whose quota job was waiting (SUBMITTED or RUNNABLE) at that moment.
   Target: 0 (a waiting training is deferred, in the triggerer).
2. The triggerer's CPU (its whole process group, as a share of one core) and resident memory
   while the tasks wait, and the most triggers it held.
3. The delay from a placement to the task noticing it: the quota scheduler's PLACED event, to
   the first line of the task's log (written by its trigger in the triggerer) saying the job
   holds capacity. It is bounded by the operator's ``poll_interval`` (``--poll``); all the
   triggers of a triggerer share one reader of the quota database (``triggers/watch.py``).

Also the submission rate (task instances through the 2 worker slots to a submitted quota job).
The PostgreSQL server is ``QUOTA_TEST_POSTGRES_URL`` (an admin URL; default
``postgresql://postgres@127.0.0.1:5432/test``); two fresh databases are made and dropped.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg
import yaml
from sqlalchemy import select

from airflow_quota.devtools.stack import AirflowStack, StackSettings, stop_on_sigterm
from airflow_quota.operators.training import derived_job_name
from airflow_quota.store.models import EventRow, JobRow

ADMIN = os.environ.get("QUOTA_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
DAG_ID = "quota_waiting_bench"
WAITING = ("SUBMITTED", "RUNNABLE")
HOLDING = ("SCHEDULED", "STARTING", "RUNNING")
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")

DAG_FILE = '''
"""{tasks} trainings of {seconds} s on one ml.g5.xlarge each, mapped in one task."""
from datetime import datetime
from airflow.sdk import DAG
from airflow_quota.operators import QuotaTrainingOperator

with DAG("{dag_id}", schedule=None, start_date=datetime(2026, 1, 1), catchup=False, max_active_tasks={tasks}):
    QuotaTrainingOperator.partial(
        task_id="train",
        share="bench",
        instance_preferences=[{{"instance_type": "ml.g5.xlarge", "count": 1}}],
        poll_interval={poll},
        max_active_tis_per_dag={tasks},
    ).expand(command=[["sleep", "{seconds}"]] * {tasks})
'''


def bench_quota(root: Path, capacity: int) -> Path:
    """``root/quota.yaml``: one RESERVE share, ``bench``, owning a pool of ``capacity`` ml.g5.xlarge."""
    quota = root / "quota.yaml"
    quota.write_text(
        yaml.safe_dump(
            {
                "pool": {"capacity": {"ml.g5.xlarge": capacity}},
                "shares": [{"name": "bench", "capacity_limits": {"ml.g5.xlarge": capacity}, "strategy": "RESERVE"}],
            }
        )
    )
    return quota


@contextmanager
def fresh_databases() -> Iterator[tuple[str, str]]:
    """A metadata and a quota database on the PostgreSQL server, dropped afterwards."""
    suffix = uuid.uuid4().hex[:10]
    names = [f"airflow_bench_{suffix}", f"quota_bench_{suffix}"]
    with psycopg.connect(ADMIN, autocommit=True) as admin:
        for name in names:
            admin.execute(f'CREATE DATABASE "{name}"')
    base = ADMIN.rsplit("/", 1)[0]
    try:
        yield f"{base}/{names[0]}", f"{base}/{names[1]}"
    finally:
        with psycopg.connect(ADMIN, autocommit=True) as admin:
            for name in names:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def group_usage(pgid: int) -> tuple[float, int, int]:
    """CPU seconds, resident bytes and process count of a process group, from /proc."""
    cpu, rss, count = 0.0, 0, 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[2]) != pgid:  # field 5 of stat: the process group
                continue
            cpu += (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime
            rss += int((entry / "statm").read_text().split()[1]) * PAGE
            count += 1
        except (OSError, ValueError, IndexError):
            continue
    return cpu, rss, count


@dataclass
class Sample:
    at: float
    slots_while_waiting: frozenset[int]
    """Map indexes of task instances queued or running while their quota job waited."""
    running: int
    deferred: int
    waiting_jobs: int
    triggerer_cpu: float
    triggerer_rss: int


class Sampler(threading.Thread):
    """Every ``interval`` seconds: task states, quota job states, the triggerer's usage."""

    def __init__(self, stack: AirflowStack, run_id: str, tasks: int, interval: float) -> None:
        super().__init__(daemon=True)
        self.stack, self.run_id, self.interval = stack, run_id, interval
        self.names = {derived_job_name(DAG_ID, "train", run_id, i): i for i in range(tasks)}
        self.samples: list[Sample] = []
        self.halt = threading.Event()

    def run(self) -> None:
        pgid = self.stack.processes["triggerer"].pid
        while not self.halt.is_set():
            rows = self.stack.query(
                "SELECT map_index, state FROM task_instance WHERE dag_id = :d AND run_id = :r", d=DAG_ID, r=self.run_id
            )
            with self.stack.store.engine.connect() as conn:
                jobs = conn.execute(select(JobRow.name, JobRow.state).where(JobRow.name.in_(self.names))).all()
            state_of = {self.names[name]: state for name, state in jobs}
            in_slot = [i for i, state in rows if state in ("queued", "running")]
            cpu, rss, _ = group_usage(pgid)
            self.samples.append(
                Sample(
                    at=time.time(),
                    slots_while_waiting=frozenset(i for i in in_slot if state_of.get(i) in WAITING),
                    running=sum(1 for _, state in rows if state == "running"),
                    deferred=sum(1 for _, state in rows if state == "deferred"),
                    waiting_jobs=sum(1 for state in state_of.values() if state in WAITING),
                    triggerer_cpu=cpu,
                    triggerer_rss=rss,
                )
            )
            self.halt.wait(self.interval)


TIMESTAMP = re.compile(r'"timestamp":\s*"([^"]+)"')
HOLDS = re.compile(r"quota job (\d+) \(.*\) in share \S+ is (?:SCHEDULED|STARTING|RUNNING)")


def notice_times(stack: AirflowStack, run_id: str) -> dict[int, float]:
    """For each quota job, when its task's log first said the job holds capacity."""
    folder = stack.home / "logs" / f"dag_id={DAG_ID}" / f"run_id={run_id}" / "task_id=train"
    noticed: dict[int, float] = {}
    for path in folder.rglob("*"):
        if not path.is_file():
            continue
        for line in path.read_text(errors="replace").splitlines():
            held = HOLDS.search(line)
            stamp = TIMESTAMP.search(line)
            if held and stamp:
                job_id = int(held.group(1))
                at = datetime.fromisoformat(stamp.group(1).replace("Z", "+00:00")).timestamp()
                noticed[job_id] = min(at, noticed.get(job_id, at))
    return noticed


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


def measure(
    tasks: int, capacity: int, seconds: float, poll: float, sample: float, window: float, limit: float
) -> dict[str, Any]:
    with fresh_databases() as (metadata_url, quota_url), tempfile.TemporaryDirectory(prefix="aq-wait-") as tmp:
        root = Path(tmp)
        (root / "bench_dags").mkdir()
        dag = root / "bench_dags" / f"{DAG_ID}.py"
        dag.write_text(DAG_FILE.format(dag_id=DAG_ID, tasks=tasks, seconds=int(seconds), poll=poll))
        quota = bench_quota(root, capacity)
        settings = StackSettings(
            root=root,
            dags=[dag],
            quota_config=quota,
            metadata_url=metadata_url,
            quota_url=quota_url,
            parallelism=2,
            wait_for_dags=[DAG_ID],
            extra_env={"AIRFLOW__TRIGGERER__CAPACITY": str(max(1000, tasks))},
        )
        print(f"starting Airflow with {tasks} tasks, pool {capacity}, {seconds:.0f} s each, poll {poll} s", flush=True)
        with AirflowStack(settings) as stack:
            run_id = stack.trigger(DAG_ID, run_id=f"bench-{uuid.uuid4().hex[:6]}")
            triggered = time.time()
            sampler = Sampler(stack, run_id, tasks, sample)
            sampler.start()
            all_submitted: float | None = None
            deadline = time.monotonic() + limit
            stop_at = float("inf")
            state: str | None = None
            while time.monotonic() < deadline:
                time.sleep(5)
                rows = stack.query("SELECT state FROM dag_run WHERE dag_id = :d AND run_id = :r", d=DAG_ID, r=run_id)
                state = rows[0][0] if rows else None
                last = sampler.samples[-1] if sampler.samples else None
                with stack.store.engine.connect() as conn:
                    submitted = conn.execute(select(JobRow.id).where(JobRow.name.in_(sampler.names))).all()
                if all_submitted is None and len(submitted) >= tasks:
                    all_submitted = time.time()
                    stop_at = time.monotonic() + window
                if time.monotonic() >= stop_at:
                    break
                if last:
                    print(
                        f"  t={time.time() - triggered:6.0f}s submitted {len(submitted)}/{tasks}, "
                        f"deferred {last.deferred}, quota jobs waiting {last.waiting_jobs}, "
                        f"running tasks {last.running}, "
                        f"in a slot while waiting {len(last.slots_while_waiting)}",
                        flush=True,
                    )
                if state in ("success", "failed"):
                    break
            sampler.halt.set()
            sampler.join()
            finished = time.time()
            with stack.store.engine.connect() as conn:
                placed = {
                    job_id: at
                    for job_id, at in conn.execute(
                        select(EventRow.job_id, EventRow.at).where(EventRow.type == "PLACED").order_by(EventRow.id)
                    )
                    if job_id is not None
                }
                done = Counter(state for (state,) in conn.execute(select(JobRow.state)))
            noticed = notice_times(stack, run_id)
            delays = [noticed[j] - at for j, at in placed.items() if j in noticed]

    samples = sampler.samples
    waiting = [s for s in samples if s.waiting_jobs > 0]
    measured = [s for s in waiting if all_submitted is not None and s.at >= all_submitted] or waiting
    cpu = (measured[-1].triggerer_cpu - measured[0].triggerer_cpu) / max(1e-9, measured[-1].at - measured[0].at)
    mib = 1024 * 1024
    return {
        "tasks": tasks,
        "capacity": capacity,
        "training_seconds": seconds,
        "poll_interval": poll,
        "run_state": state,
        "quota_states": dict(done),
        "wall_seconds": round(finished - triggered, 1),
        "submission_seconds": None if all_submitted is None else round(all_submitted - triggered, 1),
        "submissions_per_second": None if all_submitted is None else round(tasks / (all_submitted - triggered), 2),
        "samples": len(samples),
        "max_waiting_jobs": max((s.waiting_jobs for s in samples), default=0),
        "max_deferred": max((s.deferred for s in samples), default=0),
        "max_slots_used_while_waiting": max((len(s.slots_while_waiting) for s in samples), default=0),
        "max_slots_held_while_waiting": max(
            (len(a.slots_while_waiting & b.slots_while_waiting) for a, b in itertools.pairwise(samples)), default=0
        ),
        "triggerer_cpu_share_while_waiting": round(cpu, 3),
        "triggerer_rss_mib_max": round(max((s.triggerer_rss for s in samples), default=0) / mib, 1),
        "triggerer_rss_mib_idle": round(samples[0].triggerer_rss / mib, 1) if samples else None,
        "placements_measured": len(delays),
        "notice_delay_p50": round(percentile(delays, 0.5), 2),
        "notice_delay_p95": round(percentile(delays, 0.95), 2),
        "notice_delay_max": round(max(delays, default=float("nan")), 2),
        "notice_delay_mean": round(statistics.fmean(delays), 2) if delays else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--capacity", type=int, default=20, help="ml.g5.xlarge instances in the pool")
    parser.add_argument("--seconds", type=float, default=300.0, help="how long each training runs")
    parser.add_argument("--poll", type=float, default=5.0, help="the operator's poll_interval (its default: 5)")
    parser.add_argument("--sample", type=float, default=1.0, help="seconds between two samples")
    parser.add_argument("--window", type=float, default=300.0, help="seconds measured after the last submission")
    parser.add_argument("--limit", type=float, default=7200.0, help="give up after this many seconds")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON only")
    args = parser.parse_args()
    stop_on_sigterm()
    result = measure(args.tasks, args.capacity, args.seconds, args.poll, args.sample, args.window, args.limit)
    if args.json:
        print(json.dumps(result))
        return
    print()
    for key, value in result.items():
        print(f"{key:40} {value}")


if __name__ == "__main__":
    main()
