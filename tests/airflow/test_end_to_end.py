"""End to end in a real Airflow 3.3: scheduler, dag-processor, triggerer and api-server processes,
LocalExecutor with two worker slots, a PostgreSQL metadata database, and ``airflow-quota
scheduler`` with the local backend on a second PostgreSQL database.

1. The example walkthrough (``dags/quota_walkthrough.py``, each step gated on the quota state)
   runs to success: the decision log holds a CROSS_SHARE and an
   IN_SHARE preemption, the preempted trainings resume from their checkpoints, the training tasks
   waited ``deferred`` (no worker slot) whenever their quota jobs waited, and the task logs tell
   the quota story.
2. ``airflow backfill create … --dag-run-conf '{"quota_priority": 9000}'`` on the example
   ``quota_daily_training``: the backfill's quota jobs carry priority 9000 and its runs succeed.

The PostgreSQL server is the one of ``QUOTA_TEST_POSTGRES_URL`` (an admin URL), else
127.0.0.1:5432. Each module run makes two fresh databases and drops them at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from cryptography.fernet import Fernet
from sqlalchemy import Engine, create_engine, text

from airflow_quota.service.backends import local_runner
from airflow_quota.store.engine import make_engine
from airflow_quota.store.repository import QuotaStore
from airflow_quota.store.settings import normalize

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
ADMIN_URL = os.environ.get("QUOTA_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")

WALKTHROUGH = "quota_walkthrough"
DAILY = "quota_daily_training"
TRAININGS = ("qs1_high", "qs1_med", "qs1_low", "qs2_job", "qs3_job")
LIVE = ("SUBMITTED", "RUNNABLE", "SCHEDULED", "STARTING", "RUNNING")
SLOT_STATES = ("queued", "running")
"""Task instance states that hold (or are about to take) a worker slot."""

START_TIMEOUT = 180.0
WALKTHROUGH_TIMEOUT = 360.0
BACKFILL_TIMEOUT = 180.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"({exc})"


@dataclass
class Airflow:
    """A running Airflow 3.3 with the quota scheduler, and ways to look inside it."""

    home: Path
    env: dict[str, str]
    logs: Path
    state_dir: Path
    api_url: str
    quota_url: str
    metadata: Engine
    store: QuotaStore
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def cli(self, *args: str, timeout: float = 120.0) -> str:
        """Run ``airflow ARGS`` against this Airflow; its output, or a failure with it."""
        done = subprocess.run(
            [str(BIN / "airflow"), *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )
        output = done.stdout + done.stderr
        assert done.returncode == 0, f"airflow {' '.join(args)} exited {done.returncode}:\n{output[-4000:]}"
        return output

    def dead(self) -> dict[str, int]:
        return {name: p.returncode for name, p in self.processes.items() if p.poll() is not None}

    def tails(self, lines: int = 25) -> str:
        return "\n".join(f"--- {name}.log\n{_tail(self.logs / f'{name}.log', lines)}" for name in self.processes)

    def query(self, sql: str, **params: Any) -> list[Any]:
        with self.metadata.connect() as conn:
            return list(conn.execute(text(sql), params))

    def run_state(self, dag_id: str, run_id: str) -> str | None:
        rows = self.query("SELECT state FROM dag_run WHERE dag_id = :d AND run_id = :r", d=dag_id, r=run_id)
        return rows[0][0] if rows else None

    def ti_states(self, dag_id: str, run_id: str) -> dict[str, str | None]:
        sql = "SELECT task_id, state FROM task_instance WHERE dag_id = :d AND run_id = :r"
        rows = self.query(sql, d=dag_id, r=run_id)
        return {task_id: state for task_id, state in rows}

    def task_log(self, dag_id: str, run_id: str, task_id: str) -> str:
        """Everything Airflow logged for the task: every try, the worker's and the triggerer's."""
        folder = self.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}"
        return "\n".join(p.read_text(errors="replace") for p in sorted(folder.rglob("*")) if p.is_file())

    def training_log(self, job_id: int, attempt: int) -> str:
        path = self.state_dir / "local" / f"{job_id}-{attempt}" / local_runner.TRAINING_LOG
        return path.read_text() if path.exists() else ""


def _start(af: Airflow, name: str, *command: str) -> None:
    out = (af.logs / f"{name}.log").open("wb")
    af.processes[name] = subprocess.Popen(
        list(command), env=af.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=af.home
    )
    out.close()


def _stop(af: Airflow) -> None:
    """SIGTERM every process group we started, then SIGKILL what is left; then the trainings the
    local backend's detached runners may still be running (a test that failed half-way)."""
    for p in af.processes.values():
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + 20
    for p in af.processes.values():
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
    for p in af.processes.values():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGKILL)  # the group: also workers a parent left behind
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=10)
    for attempt in (af.state_dir / "local").glob("*-*"):
        for record, group in ((local_runner.COMMAND, True), (local_runner.RUNNER, False)):
            try:
                info = json.loads((attempt / record).read_text())
            except (OSError, ValueError):
                continue
            ticks = info.get("start_ticks")
            if local_runner.process_alive(int(info["pid"]), None if ticks is None else int(ticks)):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    (os.killpg if group else os.kill)(int(info["pid"]), signal.SIGKILL)


def _wait_ready(af: Airflow) -> None:
    """Until the api-server answers, the scheduler, triggerer and dag-processor heartbeat, and both
    DAGs are parsed. Airflow not starting skips the module; a DAG that fails to import fails it."""
    deadline = time.monotonic() + START_TIMEOUT
    missing: list[str] = []
    while time.monotonic() < deadline:
        if af.dead():
            pytest.skip(f"Airflow could not start: {af.dead()} exited\n{af.tails()}")
        missing = []
        try:
            with urllib.request.urlopen(f"{af.api_url}/api/v2/version", timeout=3) as response:
                if response.status != 200:
                    missing.append("api-server")
        except OSError:
            missing.append("api-server")
        running = {
            row[0]
            for row in af.query(
                "SELECT job_type FROM job WHERE state = 'running' AND latest_heartbeat > now() - interval '30 seconds'"
            )
        }
        missing += [j for j in ("SchedulerJob", "TriggererJob", "DagProcessorJob") if j not in running]
        dags = {row[0] for row in af.query("SELECT dag_id FROM dag WHERE is_stale IS NOT TRUE")}
        errors = af.query("SELECT filename, stacktrace FROM import_error")
        assert not errors, f"DAG import errors: {errors}"
        missing += [d for d in (WALKTHROUGH, DAILY) if d not in dags]
        if not missing:
            return
        time.sleep(1)
    pytest.skip(f"Airflow did not get ready in {START_TIMEOUT:.0f} s (missing: {missing})\n{af.tails()}")


@pytest.fixture(scope="module")
def airflow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Airflow]:
    try:
        with psycopg.connect(ADMIN_URL, connect_timeout=3):
            pass
    except psycopg.Error as exc:
        pytest.skip(f"no PostgreSQL server for the metadata database at {ADMIN_URL}: {exc}")
    suffix = uuid.uuid4().hex[:10]
    names = {"metadata": f"airflow_e2e_{suffix}", "quota": f"quota_e2e_{suffix}"}
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        for name in names.values():
            admin.execute(f'CREATE DATABASE "{name}"')
    base = ADMIN_URL.rsplit("/", 1)[0]
    metadata_url = normalize(f"{base}/{names['metadata']}")  # postgresql+psycopg: psycopg 3 is installed
    quota_url = f"{base}/{names['quota']}"

    root = tmp_path_factory.mktemp("airflow-e2e")
    home, logs, state_dir, dags = root / "home", root / "logs", root / "quota-state", root / "dags"
    for d in (home, logs, state_dir, dags):
        d.mkdir()
    # the example walkthrough and daily DAGs and their training script, as they are
    for name in ("quota_walkthrough.py", "quota_daily_training.py", "train_script.py"):
        (dags / name).symlink_to(REPO / "dags" / name)

    api_port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(
        {
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": metadata_url,
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": metadata_url,  # else Airflow wants asyncpg
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "2",
            "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__FERNET_KEY": Fernet.generate_key().decode(),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{api_port}/execution/",
            "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{api_port}",
            "AIRFLOW__API__SECRET_KEY": uuid.uuid4().hex,
            "AIRFLOW__API_AUTH__JWT_SECRET": uuid.uuid4().hex + uuid.uuid4().hex,
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(_free_port()),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(_free_port()),
            "AIRFLOW_CONN_QUOTA_DEFAULT": quota_url,
            "AIRFLOW_QUOTA_EXAMPLE_CHECKPOINTS": str(root / "checkpoints"),
        }
    )
    metadata = create_engine(metadata_url)
    quota_engine = make_engine(normalize(quota_url))
    af = Airflow(
        home=home,
        env=env,
        logs=logs,
        state_dir=state_dir,
        api_url=f"http://127.0.0.1:{api_port}",
        quota_url=quota_url,
        metadata=metadata,
        store=QuotaStore(quota_engine),
    )
    started = time.monotonic()
    try:
        migrated = subprocess.run(
            [str(BIN / "airflow"), "db", "migrate"], env=env, capture_output=True, text=True, timeout=300
        )
        if migrated.returncode != 0:
            pytest.skip(f"airflow db migrate failed:\n{(migrated.stdout + migrated.stderr)[-3000:]}")
        quota_cli = str(BIN / "airflow-quota")
        for command in (["db", "migrate"], ["apply", str(REPO / "examples" / "quota.yaml")]):
            subprocess.run([quota_cli, *command, "--db", quota_url], env=env, check=True, capture_output=True)
        _start(af, "scheduler", str(BIN / "airflow"), "scheduler")
        _start(af, "dag-processor", str(BIN / "airflow"), "dag-processor")
        _start(af, "triggerer", str(BIN / "airflow"), "triggerer")
        _start(af, "api-server", str(BIN / "airflow"), "api-server", "--port", str(api_port))
        _start(af, "quota-scheduler", quota_cli, "scheduler", "--db", quota_url, "--state-dir", str(state_dir))
        _wait_ready(af)
        print(f"\nAirflow 3.3 ready in {time.monotonic() - started:.0f} s (AIRFLOW_HOME {home})")
        yield af
    finally:
        _stop(af)
        metadata.dispose()
        quota_engine.dispose()
        with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
            for name in names.values():
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@dataclass
class Sample:
    at: float
    tis: dict[str, str | None]
    jobs: dict[str, str]
    """task id -> its quota job's state"""


class Sampler(threading.Thread):
    """Reads the training tasks' states in Airflow and their quota jobs' states, twice a second."""

    def __init__(self, af: Airflow, dag_id: str, run_id: str) -> None:
        super().__init__(daemon=True)
        self.af, self.dag_id, self.run_id = af, dag_id, run_id
        self.samples: list[Sample] = []
        self.errors: list[str] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                tis = self.af.ti_states(self.dag_id, self.run_id)
                jobs = {
                    j.task_id: j.state
                    for j in self.af.store.jobs(dag_id=self.dag_id)
                    if j.run_id == self.run_id and j.task_id
                }
                self.samples.append(Sample(time.monotonic(), tis, jobs))
            except Exception as exc:  # keep sampling; report at the end
                self.errors.append(repr(exc))
            self.stopping.wait(0.5)

    def stop(self) -> list[Sample]:
        self.stopping.set()
        self.join(timeout=10)
        return self.samples


def _wait_for_runs(af: Airflow, dag_id: str, run_ids: list[str], timeout: float) -> dict[str, str | None]:
    deadline = time.monotonic() + timeout
    states: dict[str, str | None] = {}
    while time.monotonic() < deadline:
        states = {r: af.run_state(dag_id, r) for r in run_ids}
        if all(s in ("success", "failed") for s in states.values()):
            return states
        assert not af.dead(), f"Airflow processes died: {af.dead()}\n{af.tails()}"
        time.sleep(2)
    return states


def _diagnosis(af: Airflow, dag_id: str, run_ids: list[str]) -> str:
    lines = []
    for run_id in run_ids:
        lines.append(f"{run_id}: {af.run_state(dag_id, run_id)} {af.ti_states(dag_id, run_id)}")
    for job in af.store.jobs(dag_id=dag_id):
        lines.append(f"quota job {job.id} {job.task_id} {job.state} {job.reason or ''} {job.detail or ''}")
    return "\n".join(lines) + "\n" + af.tails(15)


def test_walkthrough_runs_with_preemptions_resumes_and_no_slot_held_while_waiting(airflow: Airflow) -> None:
    af = airflow
    started = time.monotonic()
    run_id = f"e2e__{uuid.uuid4().hex[:8]}"
    af.cli("dags", "unpause", WALKTHROUGH)
    sampler = Sampler(af, WALKTHROUGH, run_id)
    sampler.start()
    af.cli("dags", "trigger", WALKTHROUGH, "--run-id", run_id)
    try:
        states = _wait_for_runs(af, WALKTHROUGH, [run_id], WALKTHROUGH_TIMEOUT)
    finally:
        samples = sampler.stop()
    assert states[run_id] == "success", f"the run is {states[run_id]}\n{_diagnosis(af, WALKTHROUGH, [run_id])}"
    print(f"\nwalkthrough run {run_id} succeeded in {time.monotonic() - started:.0f} s, {len(samples)} samples")

    # -- the quota store: every job succeeded, and the two preemptions of the walkthrough ----------
    jobs = {j.task_id: j for j in af.store.jobs(dag_id=WALKTHROUGH) if j.run_id == run_id}
    assert set(jobs) == set(TRAININGS)
    assert {t: j.state for t, j in jobs.items()} == dict.fromkeys(TRAININGS, "SUCCEEDED")
    names = {j.name: t for t, j in jobs.items()}
    ids = {j.id for j in jobs.values()}
    events = [e for e in af.store.events() if e.job_id in ids]
    preemptions = [(names[e.job], e.record["kind"], names.get(e.record["by"])) for e in events if e.type == "PREEMPTED"]
    print("decision log:\n  " + "\n  ".join(e.line for e in events))
    assert ("qs1_med", "CROSS_SHARE", "qs2_job") in preemptions, preemptions
    assert ("qs1_high", "IN_SHARE", "qs1_low") in preemptions, preemptions
    assert len(preemptions) == 2, preemptions
    placed_med = [e.record for e in events if e.type == "PLACED" and names[e.job] == "qs1_med"]
    assert placed_med[0]["borrowed"] == 1, placed_med  # qs1_med first borrowed qs2's idle instance
    assert [e.record["type"] for e in events if names[e.job] == "qs1_low"][:2] == ["SUBMITTED", "PRIORITY_CHANGED"]

    # -- the preempted trainings resumed from their checkpoints --------------------------------------
    for task_id in ("qs1_med", "qs1_high"):
        victim = jobs[task_id]
        assert (victim.attempts, victim.preemptions) == (2, 1), (task_id, victim.attempts, victim.preemptions)
        second = af.training_log(victim.id, 2)
        resumed = re.search(r"resumed from step (\d+)", second)
        assert resumed and int(resumed.group(1)) > 0, f"{task_id}'s second attempt:\n{second[:2000]}"
        assert "done at step" in second
        print(f"{task_id}: {resumed.group(0)} on its second attempt")
    for task_id in ("qs1_low", "qs2_job", "qs3_job"):
        assert (jobs[task_id].attempts, jobs[task_id].preemptions) == (1, 0)

    # -- no training task held a worker slot while its job waited ------------------------------------
    assert not sampler.errors, sampler.errors[:5]
    held: list[tuple[float, str, str | None, str]] = []
    deferred_while: dict[str, dict[str, int]] = {t: {"RUNNABLE": 0, "RUNNING": 0} for t in TRAININGS}
    first_deferred: dict[str, float] = {}
    for s in samples:
        for task_id in TRAININGS:
            ti, job = s.tis.get(task_id), s.jobs.get(task_id)
            if ti == "deferred":
                first_deferred.setdefault(task_id, s.at)
                if job in deferred_while[task_id]:
                    deferred_while[task_id][job] += 1
            # after its first deferral (before it, the task is submitting) a task may take a worker
            # slot again only to finish, once its job is final; and it is deferred while the job waits
            elif task_id in first_deferred and ((ti in SLOT_STATES and job in LIVE) or job == "RUNNABLE"):
                held.append((round(s.at - started, 1), task_id, ti, job))
    runnable_deferred = sum(c["RUNNABLE"] for c in deferred_while.values())
    running_deferred = sum(c["RUNNING"] for c in deferred_while.values())
    print(
        f"samples with a quota job RUNNABLE and its task deferred: {runnable_deferred} "
        f"(per task { ({t: c['RUNNABLE'] for t, c in deferred_while.items()}) }); "
        f"training RUNNING and its task deferred: {running_deferred}"
    )
    assert held == [], f"training tasks not deferred while their quota job was live: {held[:10]}"
    assert set(first_deferred) == set(TRAININGS)
    assert deferred_while["qs1_low"]["RUNNABLE"] > 0  # queued behind qs1_high and qs1_med
    assert deferred_while["qs1_med"]["RUNNABLE"] > 0  # preempted, back in the queue
    assert all(c["RUNNING"] > 0 for c in deferred_while.values())  # the training ran, the task deferred

    # -- the task logs tell the quota story ----------------------------------------------------------
    logs = {t: af.task_log(WALKTHROUGH, run_id, t) for t in TRAININGS}
    expected = {
        "qs1_high": [
            f"submitted as quota job {jobs['qs1_high'].id} to share qs1",
            "is RUNNING on 1x ml.g5.xlarge",
            "IN_SHARE by " + jobs["qs1_low"].name,
            "preempted 1 time(s) so far, resumes from its checkpoint",
            "SUCCEEDED after 2 attempt(s), 1 preemption(s)",
        ],
        "qs1_med": [
            "(borrowing 1)",
            "CROSS_SHARE by " + jobs["qs2_job"].name,
            "preempted 1 time(s) so far, resumes from its checkpoint",
            "SUCCEEDED after 2 attempt(s), 1 preemption(s)",
        ],
        "qs1_low": [
            "position 1 in its share",
            "PRIORITY_CHANGED",
            "after preempting " + jobs["qs1_high"].name,
            "SUCCEEDED after 1 attempt(s), 0 preemption(s)",
        ],
        "qs2_job": ["after preempting " + jobs["qs1_med"].name, "SUCCEEDED"],
        "qs3_job": ["within its share's limit", "SUCCEEDED"],
    }
    for task_id, phrases in expected.items():
        missing = [p for p in phrases if p not in logs[task_id]]
        assert not missing, f"{task_id}'s task log lacks {missing}:\n{logs[task_id][-3000:]}"
    print("qs1_med's task log (worker and triggerer), its quota lines:")
    for line in logs["qs1_med"].splitlines():
        with contextlib.suppress(ValueError, TypeError, KeyError):
            entry = json.loads(line)
            if "quota job" in entry["event"]:
                print(f"  {entry['timestamp'][11:19]} {entry['event']}")


def test_backfill_with_priority_override(airflow: Airflow) -> None:
    af = airflow
    started = time.monotonic()
    days = ["2026-11-01", "2026-11-02", "2026-11-03"]
    run_ids = [f"backfill__{day}T00:00:00+00:00" for day in days]
    af.cli(
        "backfill",
        "create",
        "--dag-id",
        DAILY,
        "--from-date",
        days[0],
        "--to-date",
        days[-1],
        "--dag-run-conf",
        json.dumps({"quota_priority": 9000}),
    )
    created = af.query("SELECT run_id, conf FROM dag_run WHERE dag_id = :d AND run_type = 'backfill'", d=DAILY)
    assert sorted(r[0] for r in created) == run_ids, created
    # in 3.3.2 the backfill's runs stay queued while the DAG is paused
    af.cli("dags", "unpause", DAILY)
    states = _wait_for_runs(af, DAILY, run_ids, BACKFILL_TIMEOUT)
    jobs = [j for j in af.store.jobs(dag_id=DAILY) if j.run_id in run_ids]
    print(f"\nbackfill runs {states} in {time.monotonic() - started:.0f} s")
    for j in af.store.jobs(dag_id=DAILY):
        print(f"  quota job {j.id} {j.run_id} {j.task_id}: priority {j.priority}, {j.state}")
    assert sorted((j.run_id, j.task_id) for j in jobs) == sorted(
        (r, t) for r in run_ids for t in ("train_encoder", "train_ranker")
    ), _diagnosis(af, DAILY, run_ids)
    assert {j.priority for j in jobs} == {9000}
    assert {j.request["priority"] for j in jobs} == {9000}  # submitted with it, not changed later
    assert not [e.line for j in jobs for e in af.store.events(job_id=j.id) if e.type == "PRIORITY_CHANGED"]
    log = af.task_log(DAILY, run_ids[0], "train_encoder")
    assert "priority 9000 (run conf override)" in log, log[-3000:]
    assert states == dict.fromkeys(run_ids, "success"), _diagnosis(af, DAILY, run_ids)
    assert {j.state for j in jobs} == {"SUCCEEDED"}
    # the DAG's own run (catchup=False makes one for the latest day when it is unpaused) keeps the
    # tasks' own priorities
    others = [j for j in af.store.jobs(dag_id=DAILY) if j.run_id not in run_ids]
    assert all(j.priority == {"train_encoder": 2, "train_ranker": 1}[j.task_id or ""] for j in others), others
