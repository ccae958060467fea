"""``docs/install.md`` followed, end to end, as a platform engineer would on their own Airflow.

The package is installed as a user installs it: a wheel of this checkout (``pip wheel
--no-deps``), ``pip install "<wheel>[airflow]"`` into a fresh virtualenv (the machine's pip
index is local; the page's ``--constraint`` URL is unreachable here, so the test drops that
option: the only change to the page's install command besides the package's name). Nothing of
the repository's own virtualenv or of ``devtools/stack.py`` serves Airflow here.

Every shell block of the page marked ``<!-- install-step: NAME [background|wait] -->`` runs, in
the page's order, after the page's ``values`` block (replaced by this test's values: fresh
PostgreSQL databases, a free port, generated secrets) and its ``settings`` block (verbatim):
``background`` blocks start one process per line (stopped at the end), a ``wait`` block runs
until it ends while those processes must stay alive, the others run to exit status 0. The one
other substitution is the api-server's port. "Your Airflow" here is a fresh Airflow home with
its own settings, which the page leaves to the deployment: its metadata database (PostgreSQL),
no example DAGs, its log servers' ports and a longer execution API timeout for this 2-core
machine.

Then the page's three DAGs must succeed: the TaskFlow DAG feeding ``QuotaTrainingOperator``,
the ``executor="quota"`` task, and the backfill whose runs carry ``quota_priority`` 900, each
checked in Airflow's metadata and as quota jobs (``airflow-quota jobs list --json``). Last, the
page's ``airflow-quota doctor`` step, when the installed package has that command.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from airflow_quota.service.backends import local_runner
from airflow_quota.store.backend_names import TEST_BACKENDS_VARIABLE
from tests.airflow.stacks import ADMIN_URL
from tests.conftest import ROOT, missing
from tests.waiting import wait_for

# the install (about 1.5 minutes here), two migrations, the start and three DAGs: well under this
pytestmark = pytest.mark.timeout(900)

PAGE = ROOT / "docs" / "install.md"
STEP = re.compile(
    r"<!-- install-step: (?P<name>[\w-]+)(?: (?P<kind>background|wait))? -->\n```bash\n(?P<body>.*?)```", re.S
)
STEPS_IN_ORDER = (
    "install",
    "values",
    "settings",
    "migrate",
    "start-first",
    "wait-for-api",
    "start-rest",
    "dags",
    "run",
    "jobs",
    "doctor",
)
"""The page's marked blocks: a renamed, dropped or moved block fails the test rather than go unrun."""
VALUE_NAMES = ("QUOTA_DB_URL", "API_SERVER_URL", "JWT_SECRET", "API_SECRET_KEY", "FERNET_KEY")
PAGE_PORT = "8080"
START_TIMEOUT = 180.0
RUNS_TIMEOUT = 300.0
BACKFILL_PRIORITY = 900


@dataclass(frozen=True)
class Step:
    """One marked shell block of the page."""

    name: str
    kind: str  # "run", "background" or "wait"
    body: str


def page_steps() -> list[Step]:
    return [Step(m["name"], m["kind"] or "run", m["body"]) for m in STEP.finditer(PAGE.read_text())]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_page_marks_every_step_the_test_runs() -> None:
    """Fast, without Airflow: the marked blocks, their order, the values the test replaces, and
    the package version the page installs."""
    steps = page_steps()
    assert tuple(s.name for s in steps) == STEPS_IN_ORDER
    values = next(s for s in steps if s.name == "values")
    assigned = re.findall(r"^([A-Z_]+)=", values.body, re.M)
    assert tuple(assigned) == VALUE_NAMES
    version = re.search(r'^version = "(.+)"$', (ROOT / "pyproject.toml").read_text(), re.M)
    assert version is not None
    install = next(s for s in steps if s.name == "install")
    assert f'"airflow-quota[airflow]=={version[1]}"' in install.body
    assert "--constraint https://raw.githubusercontent.com/apache/airflow/constraints-3.3." in install.body


# -- the user's side: a wheel, a fresh virtualenv, fresh databases --------------------------


def build_and_install(root: Path) -> Path:
    """Build this checkout's wheel from a copy (as the Dockerfile copies it: the build leaves
    nothing in the checkout), make a fresh virtualenv; its ``bin`` directory."""
    source = root / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "airflow_quota", source / "airflow_quota", ignore=shutil.ignore_patterns("__pycache__"))
    wheels = root / "wheels"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    base_python = getattr(sys, "_base_executable", sys.executable)
    venv = root / "venv"
    done = subprocess.run([base_python, "-m", "venv", str(venv)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return venv / "bin"


@contextlib.contextmanager
def fresh_databases() -> Iterator[tuple[str, str]]:
    """Airflow's metadata database and the quota database, new on the test server, dropped after."""
    try:
        with psycopg.connect(ADMIN_URL, connect_timeout=3):
            pass
    except psycopg.Error as exc:
        missing(f"no PostgreSQL server for the install page's databases at {ADMIN_URL}: {exc}")
    suffix = uuid.uuid4().hex[:10]
    names = (f"airflow_install_{suffix}", f"quota_install_{suffix}")
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        for name in names:
            admin.execute(f'CREATE DATABASE "{name}"')
    base = ADMIN_URL.rsplit("/", 1)[0]
    try:
        yield f"{base}/{names[0]}", f"{base}/{names[1]}"
    finally:
        with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
            for name in names:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# -- following the page ---------------------------------------------------------------------


class PageRun:
    """The page's steps run in a shell with the venv first on PATH, from the checkout (the page's
    commands name ``examples/install/``), each background process in its own process group."""

    def __init__(self, root: Path, bin_dir: Path, metadata_url: str, quota_url: str) -> None:
        self.root = root
        self.logs = root / "logs"
        self.logs.mkdir()
        self.home = root / "airflow-home"
        self.home.mkdir()
        self.port = free_port()
        steps = {s.name: s for s in page_steps()}
        self.steps = steps
        values = {
            "QUOTA_DB_URL": quota_url,
            "API_SERVER_URL": f"http://127.0.0.1:{self.port}",
            "JWT_SECRET": secrets.token_hex(32),
            "API_SECRET_KEY": secrets.token_hex(16),
            "FERNET_KEY": base64.urlsafe_b64encode(os.urandom(32)).decode(),
        }
        self.prelude = "set -euo pipefail\n"
        self.prelude += "".join(f"{name}={_quoted(value)}\n" for name, value in values.items())
        self.prelude += steps["settings"].body
        metadata = metadata_url.replace("postgresql://", "postgresql+psycopg://", 1)
        inherited = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "VIRTUAL_ENV"))}
        inherited.pop(TEST_BACKENDS_VARIABLE, None)  # the tests' fake backend: not a user's
        self.env = inherited | {
            "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
            # your Airflow's own settings, which the page leaves as they are
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": metadata,
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": metadata,  # psycopg 3, not asyncpg
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "60",  # the page's optional setting, for 2 busy cores
        }
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def script(self, body: str) -> str:
        return self.prelude + body.replace(f"--port {PAGE_PORT}", f"--port {self.port}")

    def shell(self, body: str, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-c", self.script(body)], env=self.env, cwd=ROOT, capture_output=True, text=True, timeout=timeout
        )

    def run(self, name: str, timeout: float = 300.0) -> str:
        """Run the page's step ``name`` to exit status 0; its output."""
        started = time.monotonic()
        done = self.shell(self.steps[name].body, timeout)
        print(f"[install page] {name}: exit {done.returncode} in {time.monotonic() - started:.0f} s")
        assert done.returncode == 0, (
            f"step {name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}\n{self.tails()}"
        )
        return done.stdout

    def commands(self, name: str) -> list[str]:
        """The lines of a background step, each one process (the trailing ``&`` dropped)."""
        lines = [line.strip() for line in self.steps[name].body.splitlines()]
        return [line.removesuffix("&").strip() for line in lines if line and not line.startswith("#")]

    def start(self, name: str) -> None:
        for command in self.commands(name):
            label = command.split()[0] + "-" + command.split()[1]
            with (self.logs / f"{label}.log").open("ab") as out:
                self.processes[label] = subprocess.Popen(
                    ["bash", "-c", self.script(f"exec {command}")],
                    env=self.env,
                    cwd=ROOT,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            print(f"[install page] {name}: started {command}")

    def alive(self) -> None:
        dead = {name: p.returncode for name, p in self.processes.items() if p.poll() is not None}
        if dead:
            pytest.fail(f"processes the page started have exited: {dead}\n{self.tails()}")

    def wait(self, name: str) -> None:
        """A ``wait`` step: the page's own loop, which must end while everything started lives."""
        waiting = subprocess.Popen(
            ["bash", "-c", self.script(self.steps[name].body)],
            env=self.env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            wait_for(
                lambda: waiting.poll() is not None, START_TIMEOUT, f"the page's {name} step", 0.5, check=self.alive
            )
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(waiting.pid, signal.SIGKILL)
        assert waiting.wait() == 0

    def tails(self, lines: int = 30) -> str:
        parts = []
        for log in sorted(self.logs.glob("*.log")):
            text = log.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {log.name}\n" + "\n".join(text))
        return "\n".join(parts)

    def stop(self) -> None:
        """SIGTERM every process group the page started, SIGKILL what is left, and the local
        backend's trainings (their detached runners outlive the quota scheduler, by design)."""
        for p in self.processes.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for p in self.processes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
        for p in self.processes.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10)
        for attempt in (self.home / "quota" / "local").glob("*-*"):
            for record, group in ((local_runner.COMMAND, True), (local_runner.RUNNER, False)):
                with contextlib.suppress(OSError, ValueError, KeyError):
                    info = json.loads((attempt / record).read_text())
                    ticks = info.get("start_ticks")
                    if local_runner.process_alive(int(info["pid"]), None if ticks is None else int(ticks)):
                        (os.killpg if group else os.kill)(int(info["pid"]), signal.SIGKILL)


def _quoted(value: str) -> str:
    return "'" + value.replace("'", "'\\''") + "'"


def dag_runs(metadata_url: str) -> list[dict[str, Any]]:
    with psycopg.connect(metadata_url) as db:
        rows = db.execute("SELECT dag_id, run_id, run_type, state FROM dag_run ORDER BY id").fetchall()
    return [{"dag_id": r[0], "run_id": r[1], "run_type": r[2], "state": r[3]} for r in rows]


def failed_tasks(metadata_url: str, home: Path, lines: int = 40) -> str:
    """The failed task instances, each with the end of its task log (Airflow's own files)."""
    with psycopg.connect(metadata_url) as db:
        rows = db.execute(
            "SELECT dag_id, run_id, task_id, state, try_number FROM task_instance "
            "WHERE state IN ('failed', 'upstream_failed') ORDER BY dag_id, task_id"
        ).fetchall()
    parts = []
    for dag_id, run_id, task_id, state, try_number in rows:
        parts.append(f"=== {dag_id} {run_id} {task_id}: {state} (try {try_number})")
        for log in sorted((home / "logs").glob(f"dag_id={dag_id}/run_id={run_id}/task_id={task_id}/*.log")):
            parts.append("\n".join(log.read_text(errors="replace").splitlines()[-lines:]))
    return "\n".join(parts)


def test_the_install_page_followed_end_to_end(tmp_path: Path) -> None:
    started = time.monotonic()
    bin_dir = build_and_install(tmp_path)
    with fresh_databases() as (metadata_url, quota_url):
        page = PageRun(tmp_path, bin_dir, metadata_url, quota_url)
        try:
            install = page.steps["install"].body
            assert "--constraint" in install
            # the constraints URL is unreachable here: its line goes, and the wheel stands for the release
            install = re.sub(r"\s*\\\n\s*--constraint \S+", "", install)
            install = re.sub(
                r'"airflow-quota\[airflow\]==[^"]+"', f'"{next((tmp_path / "wheels").glob("*.whl"))}[airflow]"', install
            )
            page.steps["install"] = Step("install", "run", install)
            page.run("install", timeout=600)
            assert (bin_dir / "airflow-quota").exists() and not str(bin_dir).startswith(str(ROOT))

            page.run("migrate")
            page.start("start-first")
            page.wait("wait-for-api")
            page.start("start-rest")
            page.run("dags")
            page.run("run")
            print(f"[install page] every piece started and the DAGs triggered after {time.monotonic() - started:.0f} s")

            def finished() -> bool:
                runs = [r for r in dag_runs(metadata_url) if r["run_type"] in ("manual", "backfill")]
                failed = [r for r in runs if r["state"] == "failed"]
                if failed:
                    pytest.fail(f"runs failed: {failed}\n{failed_tasks(metadata_url, page.home)}\n{page.tails()}")
                return len(runs) >= 3 and all(r["state"] == "success" for r in runs)

            wait_for(
                finished,
                RUNS_TIMEOUT,
                lambda: f"the DAG runs: {dag_runs(metadata_url)}\n{page.tails()}",
                2.0,
                check=page.alive,
            )
            runs = dag_runs(metadata_url)
            assert {(r["dag_id"], r["run_type"]) for r in runs if r["run_type"] in ("manual", "backfill")} == {
                ("install_taskflow", "manual"),
                ("install_executor", "manual"),
                ("install_daily", "backfill"),
            }, runs
            backfill_runs = {r["run_id"] for r in runs if r["run_type"] == "backfill"}

            listed = page.shell("airflow-quota jobs list --json")
            assert listed.returncode == 0, listed.stderr
            jobs = json.loads(listed.stdout)["jobs"]
            by_dag: dict[str, list[dict[str, Any]]] = {}
            for job in jobs:
                by_dag.setdefault(job["dag_id"], []).append(job)
            taskflow, executor = by_dag["install_taskflow"], by_dag["install_executor"]
            assert [(j["share"], j["priority"], j["state"]) for j in taskflow] == [("team-a", 5, "SUCCEEDED")], jobs
            assert [(j["share"], j["priority"], j["state"]) for j in executor] == [("team-b", 3, "SUCCEEDED")], jobs
            backfilled = [j for j in by_dag["install_daily"] if j["run_id"] in backfill_runs]
            assert len(backfilled) == len(backfill_runs) >= 1, jobs
            assert all(j["priority"] == BACKFILL_PRIORITY and j["state"] == "SUCCEEDED" for j in backfilled), jobs
            # the run the unpause scheduled, if submitted by now, keeps the task's own priority
            assert all(j["priority"] == 1 for j in by_dag["install_daily"] if j not in backfilled), jobs

            shown = page.run("jobs")
            assert "install_taskflow" in shown and "team-a" in shown

            if page.shell("airflow-quota doctor --help").returncode == 0:
                print(page.run("doctor"))
            else:
                print("[install page] doctor: this version has no `airflow-quota doctor` yet; its step is not run")
            print(f"[install page] followed end to end in {time.monotonic() - started:.0f} s")
        finally:
            page.stop()
