"""Benchmark of 1,000 tasks held by QuotaExecutor in a real Airflow 3.3 (issue 17).

    python benchmarks/held_tasks.py                 # baseline, then 1,000 held tasks (about 15-20 minutes)
    python benchmarks/held_tasks.py --held 100      # a quick look

The question: does a thousand tasks held QUEUED by ``QuotaExecutor`` (waiting for a full quota
share) slow Airflow's scheduler loop, and do the LocalExecutor tasks of other DAGs keep their
rate? Two runs of the same stack (``airflow_quota.devtools.stack``: scheduler, dag-processor,
api-server, ``airflow-quota scheduler``, the hybrid executor
``LocalExecutor,quota:airflow_quota.executors.QuotaExecutor``, fresh PostgreSQL databases),
alternated ``--rounds`` times:

- **baseline**: a blocker task on QuotaExecutor takes the ``bench`` share's only
  ``ml.g5.xlarge`` for the whole run; a LocalExecutor DAG (``held_bench_workers``) keeps
  running short tasks: runs of ``--tasks-per-run`` mapped ``@task`` sleeping ``--task-seconds``,
  at most ``--workers`` at once, new runs triggered as old ones finish;
- **held**: the same, plus one run of a DAG mapping ``--held`` QuotaExecutor tasks in the
  ``bench`` share: the share is full, so every one stays QUEUED in Airflow with its quota job
  RUNNABLE for the whole measurement (both are checked every ``--sample`` seconds). The held DAG
  has its own pool and ``max_active_tasks`` large enough for all of them (a held task counts
  in both, ``docs/executor.md``).

Each run measures, over a ``--window`` of seconds once everything is in place:

1. Airflow's scheduler loop time, from its StatsD timer ``scheduler.scheduler_loop_duration``
   (a UDP listener in this script, ``[metrics] statsd_on``): p50, p95, max, and loops a minute;
   also each executor's heartbeat (``scheduler.executor_heartbeat_duration`` tagged with the
   executor, whose QuotaExecutor part is its ``sync``: reading the held tasks' quota jobs);
2. the LocalExecutor tasks of ``held_bench_workers`` finished per minute (their ``end_date``),
   and their wait from QUEUED to start;
3. the scheduler process group's CPU (a share of one core).

The stuck-in-queued check is set to 60 s (every 30 s), so the held run's window includes
Airflow's check over the held tasks (skipped for QuotaExecutor, but the tasks are still read).
The held run also reports the scheduler loop while the held tasks were being queued and
submitted (before the window). The PostgreSQL server is ``QUOTA_TEST_POSTGRES_URL`` (an admin
URL; default ``postgresql://postgres@127.0.0.1:5432/test``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import func, select

from airflow_quota.devtools.stack import AirflowStack, StackSettings, stop_on_sigterm
from airflow_quota.store.models import JobRow
from benchmarks.airflow_waiting import bench_quota, fresh_databases, group_usage, percentile

WORKERS_DAG = "held_bench_workers"
HELD_DAG = "held_bench_held"
BLOCKER_DAG = "held_bench_blocker"
HELD_POOL = "held_bench_pool"
LOOP_METRIC = "airflow.scheduler.scheduler_loop_duration"
HEARTBEAT_METRIC = "airflow.scheduler.executor_heartbeat_duration"
QUEUED_TIMEOUT = 60

DAG_FILE = '''
"""The held-tasks benchmark's DAGs: ordinary LocalExecutor work, a blocker that fills the
quota share, and {held} tasks held by QuotaExecutor while the share is full."""
import time
from datetime import datetime

from airflow.sdk import DAG, task

from airflow_quota.executors import quota_config

START = datetime(2026, 1, 1)
G5 = [{{"instance_type": "ml.g5.xlarge", "count": 1}}]

with DAG("{workers_dag}", schedule=None, start_date=START, catchup=False, max_active_runs=2,
         max_active_tasks={workers}):

    @task
    def tick(i: int) -> int:
        time.sleep({task_seconds})
        return i

    tick.expand(i=list(range({tasks_per_run})))

with DAG("{blocker_dag}", schedule=None, start_date=START, catchup=False):

    @task(executor="quota", executor_config=quota_config(share="bench", instance_preferences=G5))
    def block() -> None:
        time.sleep(7200)

    block()

with DAG("{held_dag}", schedule=None, start_date=START, catchup=False, max_active_tasks={held} + 10):

    @task(executor="quota", pool="{pool}", max_active_tis_per_dag={held} + 10,
          executor_config=quota_config(share="bench", instance_preferences=G5))
    def wait(i: int) -> int:
        time.sleep(1)
        return i

    wait.expand(i=list(range({held})))
'''


class StatsdListener(threading.Thread):
    """A UDP StatsD server on 127.0.0.1 that keeps every timer line (``name:value|ms``) with
    the time it arrived: what Airflow's scheduler reports about its own loop."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.5)
        self.port = int(self.sock.getsockname()[1])
        self.timers: list[tuple[float, str, float]] = []
        self.lines = 0
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            try:
                data = self.sock.recv(65535)
            except TimeoutError:
                continue
            except OSError:
                return
            now = time.time()
            for line in data.decode(errors="replace").splitlines():
                self.lines += 1
                name, _, rest = line.partition(":")
                value, _, kind = rest.partition("|")
                if kind.split("|")[0] == "ms":
                    try:
                        self.timers.append((now, name, float(value)))
                    except ValueError:
                        continue

    def durations(self, name: str, start: float, end: float) -> list[float]:
        """The values (ms) of timer ``name`` that arrived between ``start`` and ``end``."""
        return [value for at, metric, value in list(self.timers) if metric == name and start <= at <= end]

    def names(self) -> set[str]:
        return {metric for _, metric, _ in list(self.timers)}

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=2)
        self.sock.close()


@dataclass
class HeldSample:
    """How many of the held DAG's tasks are QUEUED in Airflow, and their quota jobs RUNNABLE."""

    at: float
    queued: int
    runnable: int
    ran: int
    """Held tasks that started at all (running or finished): must stay 0."""


class Feeder(threading.Thread):
    """Keeps ``held_bench_workers`` busy: a new run whenever fewer than ``in_flight`` are
    queued or running, so its tasks never run out during a measurement."""

    def __init__(self, stack: AirflowStack, in_flight: int = 3) -> None:
        super().__init__(daemon=True)
        self.stack, self.in_flight = stack, in_flight
        self.triggered: list[str] = []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            try:
                rows = self.stack.query(
                    "SELECT count(*) FROM dag_run WHERE dag_id = :d AND state IN ('queued', 'running')", d=WORKERS_DAG
                )
                for _ in range(self.in_flight - int(rows[0][0])):
                    self.triggered.append(self.stack.trigger(WORKERS_DAG, run_id=f"w-{uuid.uuid4().hex[:8]}"))
            except Exception as exc:  # the api-server may be slow under load: try again shortly
                print(f"  (feeder: {exc.__class__.__name__}: {str(exc)[:200]})", flush=True)
            self.halt.wait(3)


def held_sample(stack: AirflowStack) -> HeldSample:
    rows = stack.query("SELECT state, count(*) FROM task_instance WHERE dag_id = :d GROUP BY state", d=HELD_DAG)
    states = {state: int(count) for state, count in rows}
    with stack.store.engine.connect() as conn:
        runnable = conn.execute(
            select(func.count()).select_from(JobRow).where(JobRow.dag_id == HELD_DAG, JobRow.state == "RUNNABLE")
        ).scalar_one()
    ran = sum(states.get(s, 0) for s in ("running", "success", "failed", "up_for_retry"))
    return HeldSample(time.time(), states.get("queued", 0), int(runnable), ran)


def all_held(sample: HeldSample, held: int) -> bool:
    return sample.queued >= held and sample.runnable >= held


def wait_for(what: str, condition: Any, stack: AirflowStack, timeout: float, report: Any = None) -> None:
    """Poll ``condition`` every 2 s until it holds; a ``RuntimeError`` with the logs at the deadline."""
    deadline = time.monotonic() + timeout
    last_report = 0.0
    while time.monotonic() < deadline:
        if condition():
            return
        if stack.dead():
            raise RuntimeError(f"Airflow processes died while waiting for {what}: {stack.dead()}\n{stack.tails()}")
        if report is not None and time.monotonic() - last_report >= 15:
            last_report = time.monotonic()
            print(f"  waiting for {what}: {report()}", flush=True)
        time.sleep(2)
    raise RuntimeError(f"{what}: not within {timeout:.0f} s\n{stack.tails(40)}")


def start_profiler(folder: Path | None, kind: str, pid: int, seconds: float) -> subprocess.Popen[bytes] | None:
    """With ``--profile``: py-spy samples the scheduler's main process through the window, as
    collapsed stacks in ``FOLDER/scheduler-KIND.txt`` (the evidence for where its loop goes)."""
    if folder is None:
        return None
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        raise RuntimeError("--profile needs py-spy (pip install py-spy)")
    folder.mkdir(parents=True, exist_ok=True)
    output = folder / f"scheduler-{kind}.txt"
    command = [spy, "record", "-p", str(pid), "-d", str(int(seconds)), "-r", "50", "-f", "raw", "-o", str(output)]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def summary(values: list[float]) -> dict[str, float | int | None]:
    """Count, p50, p95 and max of timer values in ms."""
    if not values:
        return {"count": 0, "p50": None, "p95": None, "max": None, "mean": None}
    return {
        "count": len(values),
        "p50": round(percentile(values, 0.5), 1),
        "p95": round(percentile(values, 0.95), 1),
        "max": round(max(values), 1),
        "mean": round(sum(values) / len(values), 1),
    }


def worker_throughput(stack: AirflowStack, start: float, end: float) -> dict[str, Any]:
    """``held_bench_workers`` tasks that finished in the window: per minute, and their wait
    from QUEUED to start."""
    rows = stack.query(
        "SELECT EXTRACT(EPOCH FROM end_date), EXTRACT(EPOCH FROM start_date - queued_dttm) FROM task_instance "
        "WHERE dag_id = :d AND state = 'success' AND end_date >= to_timestamp(:s) AND end_date <= to_timestamp(:e)",
        d=WORKERS_DAG,
        s=start,
        e=end,
    )
    waits = [float(wait) for _, wait in rows if wait is not None]
    return {
        "finished": len(rows),
        "per_minute": round(len(rows) / ((end - start) / 60), 1),
        "queued_to_start_p50_s": round(percentile(waits, 0.5), 2) if waits else None,
        "queued_to_start_p95_s": round(percentile(waits, 0.95), 2) if waits else None,
    }


def measure(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    """One run of the stack: ``baseline`` (no held tasks) or ``held`` (``args.held`` of them)."""
    held = args.held if kind == "held" else 0
    listener = StatsdListener()
    listener.start()
    with fresh_databases() as (metadata_url, quota_url), tempfile.TemporaryDirectory(prefix="aq-held-") as tmp:
        root = Path(tmp)
        (root / "bench_dags").mkdir()
        dag = root / "bench_dags" / "held_bench.py"
        dag.write_text(
            DAG_FILE.format(
                held=args.held,  # the same DAG files in both runs; only the held run triggers it
                workers=args.workers,
                tasks_per_run=args.tasks_per_run,
                task_seconds=args.task_seconds,
                workers_dag=WORKERS_DAG,
                blocker_dag=BLOCKER_DAG,
                held_dag=HELD_DAG,
                pool=HELD_POOL,
            )
        )
        quota = bench_quota(root, 1)
        settings = StackSettings(
            root=root,
            dags=[dag],
            quota_config=quota,
            metadata_url=metadata_url,
            quota_url=quota_url,
            parallelism=args.parallelism,
            components=("scheduler", "dag-processor", "api-server", "quota-scheduler"),
            wait_for_dags=[WORKERS_DAG, BLOCKER_DAG, HELD_DAG],
            start_timeout=400,
            extra_env={
                "AIRFLOW__METRICS__STATSD_ON": "True",
                "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
                "AIRFLOW__METRICS__STATSD_PORT": str(listener.port),
                # executor_heartbeat_duration carries the executor as a tag: keep it in the name
                "AIRFLOW__METRICS__STATSD_INFLUXDB_ENABLED": "True",
                "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": str(QUEUED_TIMEOUT),
                "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT_CHECK_INTERVAL": str(QUEUED_TIMEOUT // 2),
            },
        )
        print(f"[{kind}] starting Airflow ({held} held tasks)", flush=True)
        with AirflowStack(settings) as stack:
            stack.cli("pools", "set", HELD_POOL, str(args.held + 10), "the held-tasks benchmark's QuotaExecutor tasks")
            blocker = stack.trigger(BLOCKER_DAG)
            wait_for(
                "the blocker running",
                lambda: stack.ti_states(BLOCKER_DAG, blocker).get("block") == "running",
                stack,
                300,
            )
            feeder = Feeder(stack, in_flight=args.in_flight)
            feeder.start()
            wait_for(
                "the first worker tasks done",
                lambda: (
                    stack.query(
                        "SELECT count(*) FROM task_instance WHERE dag_id = :d AND state = 'success'", d=WORKERS_DAG
                    )[0][0]
                    > 0
                ),
                stack,
                300,
            )
            queueing: dict[str, Any] = {}
            if held:
                started = time.time()
                run_id = stack.trigger(HELD_DAG)
                wait_for(
                    f"{held} tasks held",
                    lambda: all_held(held_sample(stack), held),
                    stack,
                    args.limit,
                    report=lambda: "{0.queued} queued, {0.runnable} RUNNABLE".format(held_sample(stack)),
                )
                ended = time.time()
                queueing = {
                    "seconds": round(ended - started, 1),
                    "loop_ms": summary(listener.durations(LOOP_METRIC, started, ended)),
                    "quota_executor_heartbeat_ms": summary(
                        listener.durations(f"{HEARTBEAT_METRIC},executor=QuotaExecutor", started, ended)
                    ),
                }
                print(f"  {held} tasks held (run {run_id}) after {queueing['seconds']} s", flush=True)
            time.sleep(args.settle)
            start = time.time()
            pgid = stack.processes["scheduler"].pid
            cpu_start, _, _ = group_usage(pgid)
            profiler = start_profiler(args.profile, kind, pgid, args.window)
            samples: list[HeldSample] = []
            while time.time() < start + args.window:
                if stack.dead():
                    raise RuntimeError(f"Airflow processes died: {stack.dead()}\n{stack.tails()}")
                samples.append(held_sample(stack))
                last = samples[-1]
                done = worker_throughput(stack, start, time.time())["finished"] if time.time() > start + 1 else 0
                print(
                    f"  t={time.time() - start:5.0f}s held: {last.queued} queued, {last.runnable} RUNNABLE, "
                    f"{last.ran} ran; worker tasks done {done}",
                    flush=True,
                )
                time.sleep(min(args.sample, max(0.0, start + args.window - time.time())))
            end = time.time()
            cpu_end, _, _ = group_usage(pgid)
            feeder.halt.set()
            samples.append(held_sample(stack))
            throughput = worker_throughput(stack, start, end)
            feeder.join(timeout=10)
            if profiler is not None:
                profiler.wait(timeout=120)
    listener.stop()
    loop = listener.durations(LOOP_METRIC, start, end)
    quota_heartbeat = listener.durations(f"{HEARTBEAT_METRIC},executor=QuotaExecutor", start, end)
    local_heartbeat = listener.durations(f"{HEARTBEAT_METRIC},executor=LocalExecutor", start, end)
    if not loop:
        raise RuntimeError(
            f"no {LOOP_METRIC} timers arrived ({listener.lines} StatsD lines: {sorted(listener.names())[:20]})"
        )
    return {
        "run": kind,
        "held": held,
        "window_seconds": round(end - start, 1),
        "held_queued_min": min((s.queued for s in samples), default=0) if held else 0,
        "held_runnable_min": min((s.runnable for s in samples), default=0) if held else 0,
        "held_started": max((s.ran for s in samples), default=0),
        "loop_ms": summary(loop),
        "loops_per_minute": round(len(loop) / ((end - start) / 60), 1),
        "quota_executor_heartbeat_ms": summary(quota_heartbeat),
        "local_executor_heartbeat_ms": summary(local_heartbeat),
        "quota_executor_share_of_loop_time": round(sum(quota_heartbeat) / sum(loop), 3),
        "scheduler_cpu_share": round((cpu_end - cpu_start) / (end - start), 3),
        "workers": throughput,
        "worker_runs_triggered": len(feeder.triggered),
        "queueing": queueing,
        "statsd_lines": listener.lines,
    }


def table(results: list[dict[str, Any]]) -> str:
    """The Markdown table of BENCHMARKS.md."""
    lines = [
        "| run | held tasks (QUEUED / RUNNABLE, least seen) | loop p50 / p95 / max (ms) | loops a minute "
        "| QuotaExecutor heartbeat p50 / p95 / max (ms), share of loop time | scheduler CPU "
        "| LocalExecutor tasks finished a minute | their QUEUED → start p50 / p95 (s) |",
        "|---|---|---|---:|---|---:|---:|---|",
    ]
    for r in results:
        loop, quota, workers = r["loop_ms"], r["quota_executor_heartbeat_ms"], r["workers"]
        held = f"{r['held_queued_min']} / {r['held_runnable_min']}" if r["held"] else "0"
        lines.append(
            f"| {r['run']} | {held} | {loop['p50']} / {loop['p95']} / {loop['max']} | {r['loops_per_minute']} "
            f"| {quota['p50']} / {quota['p95']} / {quota['max']}, {r['quota_executor_share_of_loop_time']:.1%} "
            f"| {r['scheduler_cpu_share']:.0%} | {workers['per_minute']} "
            f"| {workers['queued_to_start_p50_s']} / {workers['queued_to_start_p95_s']} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--held", type=int, default=1000, help="QuotaExecutor tasks held in the held run")
    parser.add_argument("--rounds", type=int, default=1, help="baseline and held runs, alternated, each this often")
    parser.add_argument("--window", type=float, default=240.0, help="seconds measured in each run")
    parser.add_argument("--settle", type=float, default=30.0, help="seconds between setting up and measuring")
    parser.add_argument("--sample", type=float, default=10.0, help="seconds between two checks of the held tasks")
    parser.add_argument("--workers", type=int, default=4, help="LocalExecutor tasks of the worker DAG at once")
    parser.add_argument("--tasks-per-run", type=int, default=20, help="mapped tasks in each worker DAG run")
    parser.add_argument("--task-seconds", type=float, default=1.0, help="how long each worker task sleeps")
    parser.add_argument("--in-flight", type=int, default=3, help="worker DAG runs kept queued or running")
    parser.add_argument("--parallelism", type=int, default=64, help="[core] parallelism")
    parser.add_argument("--limit", type=float, default=900.0, help="seconds allowed to hold all the tasks")
    parser.add_argument("--only", choices=("baseline", "held"), help="one kind of run only")
    parser.add_argument("--profile", type=Path, help="py-spy the scheduler in each window; stacks in this folder")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON only")
    args = parser.parse_args()
    stop_on_sigterm()
    results = []
    for _ in range(args.rounds):
        for kind in (args.only,) if args.only else ("baseline", "held"):
            results.append(measure(kind, args))
            if not args.json:
                print(json.dumps(results[-1]), flush=True)
    if args.json:
        print(json.dumps(results))
        return
    print()
    print(table(results))
    print()
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
