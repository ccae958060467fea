"""A real Airflow 3.3 with the quota scheduler beside it, started on this machine.

One way to run the whole product locally, shared by ``make demo``, the end-to-end and browser
tests and the Airflow benchmarks: an Airflow home under one directory, the metadata database
(SQLite by default, or PostgreSQL), the quota database, SimpleAuthManager users with known
passwords, and the chosen processes (scheduler, dag-processor, triggerer, api-server,
``airflow-quota scheduler``), each logging to its own file. ``with AirflowStack(settings) as
stack`` starts them and waits until they are ready; leaving the block stops them all, and the
trainings the local backend left running.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from sqlalchemy import Engine, create_engine, text

from airflow_quota.exceptions import QuotaError
from airflow_quota.service.backends import local_runner
from airflow_quota.store.engine import make_engine
from airflow_quota.store.repository import QuotaStore
from airflow_quota.store.settings import normalize

STACK_READY = True
"""Helpers poll for this marker: the module is complete."""

BIN = Path(sys.executable).parent
COMPONENTS = ("scheduler", "dag-processor", "triggerer", "api-server", "quota-scheduler")
AIRFLOW_JOBS = {"scheduler": "SchedulerJob", "dag-processor": "DagProcessorJob", "triggerer": "TriggererJob"}
"""The ``job`` table's job type of each Airflow component that heartbeats."""
NEEDS_THE_API = ("scheduler", "triggerer")
"""Components whose workers and triggers call the api-server's execution API: started only once
it answers, else their first tasks die with ``httpx.ConnectError: Connection refused``."""
EXECUTION_API_TIMEOUT = 60.0
"""Seconds a worker waits for the execution API (Airflow's default, 5 s, is too short for an
api-server sharing two busy cores: tasks died with ``httpx.ReadTimeout``)."""


class StackError(QuotaError):
    """The local Airflow could not be set up or did not get ready; the message holds the log tails."""


def stop_on_sigterm() -> None:
    """Make SIGTERM end the program as Ctrl-C does, so ``with AirflowStack(...)`` blocks and
    ``finally`` clauses stop what they started (for command-line tools: the demo, benchmarks)."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def connect_host(listen_host: str) -> str:
    """Where to reach a server listening on ``listen_host``: this machine for a wildcard
    address (``0.0.0.0``, ``::``), the address itself otherwise (IPv6 in brackets)."""
    if listen_host in ("", "0.0.0.0", "::"):
        return "127.0.0.1"
    return f"[{listen_host}]" if ":" in listen_host else listen_host


RUNNING_JOBS = "SELECT job_type FROM job WHERE state = 'running'"


def answers(url: str) -> bool:
    """Whether a GET of ``url`` answers 200 within a few seconds."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def tail(path: Path, lines: int = 25) -> str:
    """The last lines of a log file, or why it cannot be read."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"({exc})"


@dataclass
class StackSettings:
    """What to start, and where.

    :param root: the directory holding the Airflow home, logs, the DAGs folder and quota state.
    :param dags: files linked into the DAGs folder.
    :param quota_config: a quota configuration applied to the quota database before starting.
    :param metadata_url: Airflow's metadata database; ``None`` for SQLite under ``root``.
    :param quota_url: the quota database; ``None`` for SQLite under ``root``.
    :param parallelism: Airflow's worker slots (``[core] parallelism``).
    :param users: SimpleAuthManager users, username to role (viewer, user, op, admin).
    :param components: the processes to start, out of ``COMPONENTS``.
    :param wait_for_dags: DAG ids that must be parsed before the stack counts as ready.
    :param api_port: the api-server's port; a free one when ``None``.
    :param api_host: the address the api-server listens on: ``127.0.0.1`` (this machine only)
        unless told otherwise (``0.0.0.0`` for every interface: anyone who can reach the
        machine reaches the UI and its logins).
    :param extra_env: more environment for every process (e.g. ``AIRFLOW__METRICS__…``).
    """

    root: Path
    dags: Sequence[Path] = ()
    quota_config: Path | None = None
    metadata_url: str | None = None
    quota_url: str | None = None
    parallelism: int = 2
    users: dict[str, str] = field(default_factory=lambda: {"admin": "admin"})
    components: Sequence[str] = COMPONENTS
    wait_for_dags: Sequence[str] = ()
    api_port: int | None = None
    api_host: str = "127.0.0.1"
    extra_env: dict[str, str] = field(default_factory=dict)
    start_timeout: float = 240.0


class AirflowStack:
    """A running local Airflow with the quota scheduler, and ways to look inside it."""

    def __init__(self, settings: StackSettings) -> None:
        unknown = sorted(set(settings.components) - set(COMPONENTS))
        if unknown:
            raise StackError(f"components: unknown {unknown}; choose from {', '.join(COMPONENTS)}")
        self.settings = settings
        root = settings.root.resolve()
        self.home = root / "home"
        self.logs = root / "logs"
        self.dags_folder = root / "dags"
        self.state_dir = root / "quota-state"
        for folder in (self.home, self.logs, self.dags_folder, self.state_dir):
            folder.mkdir(parents=True, exist_ok=True)
        self.api_port = settings.api_port or free_port()
        self.api_url = f"http://{connect_host(settings.api_host)}:{self.api_port}"
        self.execution_api_url = f"{self.api_url}/execution/"
        self.metadata_url = normalize(settings.metadata_url or f"sqlite:///{self.home / 'airflow.db'}")
        self.quota_url = settings.quota_url or f"sqlite:///{root / 'quota.db'}"
        self.own_env = self._own_environment(root)
        """What the stack sets for its processes (the rest of ``env`` is this process's own)."""
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")} | self.own_env
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self._metadata: Engine | None = None
        self._quota: Engine | None = None
        self._store: QuotaStore | None = None

    # ------------------------------------------------------------------ setting up

    def _secret(self, name: str, make: Any) -> str:
        """A secret kept in the home, so a second start (``make demo`` again) reuses it."""
        path = self.home / f".{name}"
        if not path.exists():
            path.write_text(make())
        return path.read_text().strip()

    def _own_environment(self, root: Path) -> dict[str, str]:
        env: dict[str, str] = {}
        env.update(
            {
                "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
                "AIRFLOW_HOME": str(self.home),
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.metadata_url,
                # LocalExecutor for every task, QuotaExecutor for the tasks that ask for it
                "AIRFLOW__CORE__EXECUTOR": "LocalExecutor,quota:airflow_quota.executors.QuotaExecutor",
                "AIRFLOW__CORE__PARALLELISM": str(self.settings.parallelism),
                "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "AIRFLOW__CORE__FERNET_KEY": self._secret(
                    "fernet_key", lambda: base64.urlsafe_b64encode(os.urandom(32)).decode()
                ),
                "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": self.execution_api_url,
                "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": str(EXECUTION_API_TIMEOUT),
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(
                    f"{user}:{role}" for user, role in self.settings.users.items()
                ),
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(self.home / "passwords.json"),
                "AIRFLOW__API__BASE_URL": self.api_url,
                "AIRFLOW__API__PORT": str(self.api_port),
                "AIRFLOW__API__HOST": self.settings.api_host,
                "AIRFLOW__API__SECRET_KEY": self._secret("api_secret", lambda: secrets.token_hex(16)),
                "AIRFLOW__API_AUTH__JWT_SECRET": self._secret("jwt_secret", lambda: secrets.token_hex(32)),
                "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
                "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
                "AIRFLOW_CONN_QUOTA_DEFAULT": self.quota_url,
                "AIRFLOW_QUOTA_EXAMPLE_CHECKPOINTS": str(root / "checkpoints"),
            }
        )
        if self.metadata_url.startswith("postgresql+psycopg:"):
            env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC"] = self.metadata_url  # else Airflow wants asyncpg
        env.update(self.settings.extra_env)
        return env

    def write_env_script(self, path: Path) -> Path:
        """Write a shell script exporting every setting the stack gives its processes, so that
        ``source``-ing it points ``airflow`` and ``airflow-quota`` at this Airflow and its quota
        database. It holds the secrets (fernet key, JWT secret): readable by the owner only."""
        lines = [
            "# Written by airflow_quota.devtools.stack: the settings of the Airflow under",
            f"# {self.settings.root.resolve()}. `source` it to run airflow and airflow-quota against it.",
            "# It holds that Airflow's secrets: keep it to yourself.",
            "unset $(env | sed -n 's/^\\(AIRFLOW[A-Za-z0-9_]*\\)=.*/\\1/p')  # another Airflow's settings",
            f'export PATH={shlex.quote(str(BIN))}:"$PATH"',
        ]
        lines += [
            f"export {name}={shlex.quote(value)}" for name, value in sorted(self.own_env.items()) if name != "PATH"
        ]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.chmod(0o600)
        path.write_text("\n".join(lines) + "\n")
        return path

    def _write_passwords(self) -> None:
        """Keep the passwords of users already known; make one for each new user."""
        path = self.home / "passwords.json"
        known: dict[str, str] = json.loads(path.read_text()) if path.exists() else {}
        passwords = {user: known.get(user) or secrets.token_urlsafe(9) for user in self.settings.users}
        path.write_text(json.dumps(passwords, indent=2))

    def _link_dags(self) -> None:
        for dag in self.settings.dags:
            link = self.dags_folder / dag.name
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(dag.resolve())

    def _run(self, command: Sequence[str], what: str, timeout: float = 300.0) -> None:
        done = subprocess.run(list(command), env=self.env, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise StackError(f"{what} failed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")

    def prepare(self) -> None:
        """Migrate both databases, apply the quota configuration, link the DAGs, write the users."""
        self._write_passwords()
        self._link_dags()
        self._run([str(BIN / "airflow"), "db", "migrate"], "airflow db migrate")
        quota_cli = str(BIN / "airflow-quota")
        self._run([quota_cli, "db", "migrate", "--db", self.quota_url], "airflow-quota db migrate")
        if self.settings.quota_config is not None:
            self._run(
                [quota_cli, "apply", str(self.settings.quota_config), "--db", self.quota_url], "airflow-quota apply"
            )

    # ------------------------------------------------------------------ running

    def _command(self, component: str) -> list[str]:
        if component == "quota-scheduler":
            return [str(BIN / "airflow-quota"), "scheduler", "--db", self.quota_url, "--state-dir", str(self.state_dir)]
        if component == "api-server":
            return [str(BIN / "airflow"), "api-server", "--host", self.settings.api_host, "--port", str(self.api_port)]
        return [str(BIN / "airflow"), component]

    def start_process(self, name: str, command: Sequence[str]) -> subprocess.Popen[bytes]:
        """Start one more process in its own process group, logging to ``logs/NAME.log``."""
        with (self.logs / f"{name}.log").open("ab") as out:
            process = subprocess.Popen(
                list(command), env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=self.home
            )
        self.processes[name] = process
        return process

    def start(self) -> None:
        """Prepare, start every component, and wait until all are ready. The scheduler and the
        triggerer start only once the api-server answers (when it is one of the components)."""
        self.prepare()
        first = [
            c
            for c in self.settings.components
            if c not in NEEDS_THE_API or "api-server" not in self.settings.components
        ]
        for component in first:
            self.start_process(component, self._command(component))
        if len(first) < len(self.settings.components):
            self.wait_ready(api_server_only=True)
            for component in self.settings.components:
                if component not in first:
                    self.start_process(component, self._command(component))
        self.wait_ready()

    def api_answers(self) -> bool:
        """Whether the api-server answers its REST API."""
        return answers(f"{self.api_url}/api/v2/version")

    def not_answering(self) -> list[str]:
        """The pieces of this Airflow that do not answer now, each with where it was asked: the
        api-server, the execution API the workers call, the components that stopped
        heartbeating, and the processes that exited."""
        found = [f"{name} exited with code {code}" for name, code in sorted(self.dead().items())]
        if "api-server" in self.settings.components and not self.api_answers():
            found.append(f"the api-server does not answer at {self.api_url}")
        execution_api = self.env.get("AIRFLOW__CORE__EXECUTION_API_SERVER_URL", self.execution_api_url)
        if "api-server" in self.settings.components and not answers(f"{execution_api.rstrip('/')}/health"):
            found.append(f"the execution API the workers call does not answer at {execution_api}")
        try:
            jobs = {row[0] for row in self.query(RUNNING_JOBS)}
        except Exception as exc:  # the metadata database itself
            return [*found, f"the metadata database cannot be read ({exc.__class__.__name__}: {exc})"]
        found += [
            f"the {c} has no running job in Airflow's job table (it is not heartbeating)"
            for c in self.settings.components
            if c in AIRFLOW_JOBS and AIRFLOW_JOBS[c] not in jobs and c not in self.dead()
        ]
        return found

    def import_errors(self) -> dict[str, str]:
        """DAG files that failed to import, each with the last line of its stack trace."""
        return {
            str(filename): (str(trace).strip().splitlines() or [""])[-1]
            for filename, trace in self.query("SELECT filename, stacktrace FROM import_error")
        }

    def missing(self) -> list[str]:
        """What is not ready yet: components not answering or heartbeating, DAGs not parsed."""
        missing: list[str] = []
        if "api-server" in self.settings.components and not self.api_answers():
            missing.append("api-server")
        jobs = {row[0] for row in self.query(RUNNING_JOBS)}
        missing += [c for c in self.settings.components if c in AIRFLOW_JOBS and AIRFLOW_JOBS[c] not in jobs]
        if self.settings.wait_for_dags:
            # only the stack's own DAG files stop it: a file someone dropped in the folder does not
            ours = {dag.name for dag in self.settings.dags}
            errors = self.query("SELECT filename, stacktrace FROM import_error")
            if [e for e in errors if Path(str(e[0])).name in ours]:
                raise StackError(f"DAG import errors: {errors}")
            parsed = {row[0] for row in self.query("SELECT dag_id FROM dag WHERE is_stale IS NOT TRUE")}
            missing += [d for d in self.settings.wait_for_dags if d not in parsed]
        return missing

    def wait_ready(self, api_server_only: bool = False) -> None:
        """Wait until nothing is missing (or until the api-server answers); a ``StackError`` with
        the log tails when a process exits or the start timeout passes."""
        deadline = time.monotonic() + self.settings.start_timeout
        missing: list[str] = ["everything"]
        while time.monotonic() < deadline:
            if self.dead():
                raise StackError(f"Airflow could not start: {self.dead()} exited\n{self.tails()}")
            try:
                missing = ([] if self.api_answers() else ["api-server"]) if api_server_only else self.missing()
            except StackError:
                raise
            except Exception as exc:  # the metadata database may not have its tables yet
                missing = [f"metadata database ({exc.__class__.__name__})"]
            if not missing:
                return
            time.sleep(1)
        raise StackError(f"Airflow did not get ready in {self.settings.start_timeout:.0f} s: {missing}\n{self.tails()}")

    def dead(self) -> dict[str, int]:
        """The processes that have exited, with their exit codes."""
        return {name: p.returncode for name, p in self.processes.items() if p.poll() is not None}

    def tails(self, lines: int = 25) -> str:
        return "\n".join(f"--- {name}.log\n{tail(self.logs / f'{name}.log', lines)}" for name in self.processes)

    def stop(self, names: Iterable[str] | None = None) -> None:
        """SIGTERM the process groups, then SIGKILL what is left; with every process, also the
        trainings the local backend's detached runners may still be running."""
        chosen = {n: p for n, p in self.processes.items() if names is None or n in names}
        for p in chosen.values():
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for p in chosen.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
        for p in chosen.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)  # the group: also workers a parent left behind
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10)
        for name in chosen:
            del self.processes[name]
        if names is None:
            self._stop_trainings()
            for engine in (self._metadata, self._quota):
                if engine is not None:
                    engine.dispose()

    def _stop_trainings(self) -> None:
        for attempt in (self.state_dir / "local").glob("*-*"):
            for record, group in ((local_runner.COMMAND, True), (local_runner.RUNNER, False)):
                try:
                    info = json.loads((attempt / record).read_text())
                except (OSError, ValueError):
                    continue
                ticks = info.get("start_ticks")
                if local_runner.process_alive(int(info["pid"]), None if ticks is None else int(ticks)):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        (os.killpg if group else os.kill)(int(info["pid"]), signal.SIGKILL)

    def __enter__(self) -> AirflowStack:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()

    # ------------------------------------------------------------------ looking inside

    @property
    def metadata(self) -> Engine:
        """Airflow's metadata database, for tests and benchmarks that watch task states."""
        if self._metadata is None:
            self._metadata = create_engine(self.metadata_url)
        return self._metadata

    @property
    def store(self) -> QuotaStore:
        """The quota database, as the quota scheduler and the plugin see it."""
        if self._store is None:
            self._quota = make_engine(normalize(self.quota_url))
            self._store = QuotaStore(self._quota)
        return self._store

    def query(self, sql: str, **params: Any) -> list[Any]:
        """Rows of a query on Airflow's metadata database."""
        with self.metadata.connect() as conn:
            return list(conn.execute(text(sql), params))

    def cli(self, *args: str, timeout: float = 120.0) -> str:
        """Run ``airflow ARGS`` against this Airflow; its output, or a ``StackError`` with it."""
        done = subprocess.run(
            [str(BIN / "airflow"), *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )
        output = done.stdout + done.stderr
        if done.returncode != 0:
            raise StackError(f"airflow {' '.join(args)} exited {done.returncode}:\n{output[-4000:]}")
        return output

    def run_state(self, dag_id: str, run_id: str) -> str | None:
        rows = self.query("SELECT state FROM dag_run WHERE dag_id = :d AND run_id = :r", d=dag_id, r=run_id)
        return rows[0][0] if rows else None

    def ti_states(self, dag_id: str, run_id: str) -> dict[str, str | None]:
        """Task id to state, for the unmapped task instances of a run."""
        sql = "SELECT task_id, state FROM task_instance WHERE dag_id = :d AND run_id = :r AND map_index < 0"
        return {task_id: state for task_id, state in self.query(sql, d=dag_id, r=run_id)}

    def wait_for_runs(self, dag_id: str, run_ids: Sequence[str], timeout: float) -> dict[str, str | None]:
        """The runs' states once all are final, or as they are at the timeout; a ``StackError``
        if an Airflow process dies meanwhile."""
        deadline = time.monotonic() + timeout
        states: dict[str, str | None] = {}
        while time.monotonic() < deadline:
            states = {r: self.run_state(dag_id, r) for r in run_ids}
            if all(s in ("success", "failed") for s in states.values()):
                return states
            if self.dead():
                raise StackError(f"Airflow processes died: {self.dead()}\n{self.tails()}")
            time.sleep(2)
        return states

    def task_log(self, dag_id: str, run_id: str, task_id: str) -> str:
        """Everything Airflow logged for a task: every try, the worker's and the triggerer's lines."""
        folder = self.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}"
        return "\n".join(p.read_text(errors="replace") for p in sorted(folder.rglob("*")) if p.is_file())

    def training_log(self, job_id: int, attempt: int) -> str:
        """What a training run by the local backend printed, for one attempt of a quota job."""
        path = self.state_dir / "local" / f"{job_id}-{attempt}" / local_runner.TRAINING_LOG
        return path.read_text() if path.exists() else ""

    def password(self, user: str) -> str:
        passwords: dict[str, str] = json.loads((self.home / "passwords.json").read_text())
        return passwords[user]

    def token(self, user: str) -> str:
        """A JWT for ``user`` from the api-server's ``POST /auth/token``."""
        body = json.dumps({"username": user, "password": self.password(user)}).encode()
        request = urllib.request.Request(
            f"{self.api_url}/auth/token", data=body, headers={"Content-Type": "application/json"}, method="POST"
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return str(json.loads(response.read())["access_token"])

    def api(self, method: str, path: str, user: str = "admin", body: Any = None) -> Any:
        """Call Airflow's REST API (``/api/v2/…``) as ``user``; the decoded JSON answer."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"{self.api_url}{path}",
            data=data,
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.token(user)}"},
            method=method,
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                payload = response.read()
        except urllib.error.HTTPError as exc:
            raise StackError(f"{method} {path}: HTTP {exc.code}: {exc.read()[:2000]!r}") from exc
        return json.loads(payload) if payload else None

    def trigger(self, dag_id: str, conf: dict[str, Any] | None = None, run_id: str | None = None) -> str:
        """Unpause ``dag_id`` and start a run of it now; the run's id."""
        self.api("PATCH", f"/api/v2/dags/{dag_id}", body={"is_paused": False})
        body: dict[str, Any] = {"logical_date": None, "conf": conf or {}}
        if run_id:
            body["dag_run_id"] = run_id
        return str(self.api("POST", f"/api/v2/dags/{dag_id}/dagRuns", body=body)["dag_run_id"])
