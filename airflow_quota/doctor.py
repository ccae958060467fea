"""``airflow-quota doctor``: check every wire of an installation, one line per check.

Run where an Airflow component runs (its environment: ``AIRFLOW_HOME``, ``AIRFLOW__…``
variables, connections), it answers "is everything plugged in?" without reading logs:

1. ``quota database``: the database the other commands use (``store/settings.py``) answers and
   is migrated to this airflow-quota's alembic head;
2. ``configuration``: a quota configuration is applied (which version, taken in or not);
3. ``quota scheduler``: one leads (its lease has not run out, its heartbeat is recent) and it
   runs the backends the live jobs name (written with its lease, ``store/lock.py``);
4. ``executor``: every executor name the DAGs' tasks use (``executor="quota"``) is one that
   ``[core] executor`` configures, QuotaExecutor under its alias;
5. ``connection``: the ``quota_default`` connection resolves here (Airflow's lookup) and names
   the database of 1 (tasks, triggers and the Quotas page use the connection);
6. ``plugin``: the api-server serves the Quotas page;
7. ``triggerer``: a TriggererJob heartbeats (as ``airflow jobs check`` tells);
8. ``execution API``: the API that workers call answers its health endpoint.

Each check is a small function returning a :class:`Check`; the pure parts (what a reading
means) are apart from the reading, so they are tested without a running Airflow. Each check runs
under a timeout (``--timeout``), so a dead server makes its line fail, not doctor hang.
"""

from __future__ import annotations

import json
import os
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from airflow_quota.exceptions import QuotaError
from airflow_quota.store.settings import ENV_CONN, ENV_URL, configured_url, database_url, redacted

if TYPE_CHECKING:  # SQLAlchemy, the store and Airflow load when the checks run, not for every command
    from sqlalchemy import Engine

    from airflow_quota.store.lock import SchedulerHealth

QUOTA_EXECUTOR_PATHS = ("airflow_quota.executors.QuotaExecutor", "airflow_quota.executors.quota_executor.QuotaExecutor")
EXECUTOR_SETTING = "LocalExecutor,quota:airflow_quota.executors.QuotaExecutor"
"""The ``[core] executor`` the fixes suggest: the default executor first, QuotaExecutor as ``quota``."""
START_SCHEDULER = 'start one: "airflow-quota scheduler" (same database settings as here)'
QUOTA_NOT_READY = "not checked: the quota database is not ready (see its line)"
GIVEN_UP = 1e6
"""A lease that ran out more than this many seconds ago was given up: a clean stop sets it to 0."""


@dataclass(frozen=True, slots=True)
class Check:
    """One wire: whether it holds, what was seen, and what to do when it does not."""

    name: str
    ok: bool
    detail: str
    fix: str | None = None

    def line(self) -> str:
        """``ok   NAME  detail`` or ``FAIL NAME  detail: fix``."""
        text = f"{'ok' if self.ok else 'FAIL':<4} {self.name:<15}  {self.detail}"
        return f"{text}: {self.fix}" if self.fix and not self.ok else text


def passed(name: str, detail: str) -> Check:
    return Check(name, True, detail)


def failed(name: str, detail: str, fix: str | None) -> Check:
    return Check(name, False, detail, fix)


# -- what a reading means (pure) -----------------------------------------------------------


def revision_check(url: str, source: str, current: str | None, head: str | None, known: bool) -> Check:
    """The quota database (named by the setting ``source``) at ``current`` against this
    airflow-quota's ``head`` (``known``: whether ``current`` is one of this version's revisions)."""
    where = redacted(url)
    migrate = f'run "airflow-quota db migrate" here (it migrates {where})'
    if current is None:
        return failed("quota database", f"{where} (from {source}) answers but has no quota tables", migrate)
    if current == head:
        return passed("quota database", f"{where} at revision {current} (head)")
    if not known:
        return failed(
            "quota database",
            f"{where} is at revision {current}, which this airflow-quota does not know (head {head})",
            "install the airflow-quota version the quota scheduler runs",
        )
    return failed("quota database", f"{where} is at revision {current}, not the head {head}", migrate)


def scheduler_check(health: SchedulerHealth, needed: Mapping[str, int]) -> Check:
    """Whether a quota scheduler leads (its lease not run out, its heartbeat within
    ``MISSED_BEATS`` beats) and runs every backend that live jobs name (``needed``: backend to
    number of live jobs)."""
    from airflow_quota.store.lock import MISSED_BEATS

    name = "quota scheduler"
    if health.leader is None or health.silent_seconds is None:
        return failed(name, "no quota scheduler has ever led on this database", START_SCHEDULER)
    limit = MISSED_BEATS * health.heartbeat_seconds if health.heartbeat_seconds else None
    beat = f"heartbeat {health.silent_seconds:.0f} s ago" + (f" (limit {limit:g} s)" if limit else "")
    left = health.lease_left_seconds
    if (left is not None and left <= 0) or health.down:
        if left is not None and left < -GIVEN_UP:
            why = "stopped and gave up its lease"
        elif left is not None and left <= 0:
            why = f"let its lease run out {-left:.0f} s ago"
        else:
            why = "holds its lease but stopped beating"
        return failed(name, f"none leads: the last leader, {health.leader}, {why}; {beat}", START_SCHEDULER)
    jobs = sum(needed.values())
    if health.backends is None:
        return passed(name, f"{health.leader} leads, {beat}; its backends are not recorded (an older scheduler)")
    missing = sorted(set(needed) - set(health.backends))
    if missing:
        count = sum(needed[b] for b in missing)
        return failed(
            name,
            f"{health.leader} leads but runs only {', '.join(health.backends)}; {count} live jobs name "
            f"{', '.join(missing)}",
            "run the quota scheduler where those backends are installed (sagemaker needs boto3)",
        )
    return passed(name, f"{health.leader} leads, {beat}, runs {', '.join(health.backends)} ({jobs} live jobs)")


@dataclass(frozen=True, slots=True)
class ConfiguredExecutor:
    """One entry of ``[core] executor``: its alias (if any) and its class's import path."""

    alias: str | None
    module_path: str

    def serves(self, name: str) -> bool:
        """Whether a task's ``executor=name`` picks this entry (its alias, path or class name)."""
        return name in (self.alias, self.module_path, self.module_path.rsplit(".", 1)[-1])


def executor_check(setting: str, configured: Sequence[ConfiguredExecutor], used: Mapping[str, Sequence[str]]) -> Check:
    """Every executor name the DAGs' tasks use (``used``: name to DAG ids) is served by an entry
    of ``[core] executor`` (``setting``, parsed as ``configured``); QuotaExecutor's alias is said."""
    name = "executor"
    quota = [e for e in configured if e.module_path in QUOTA_EXECUTOR_PATHS]
    given = f"QuotaExecutor as {quota[0].alias!r}" if quota and quota[0].alias else "QuotaExecutor"
    unserved = {n: dags for n, dags in used.items() if not any(e.serves(n) for e in configured)}
    if unserved:
        listed = "; ".join(f'executor="{n}" in {", ".join(sorted(dags)[:5])}' for n, dags in sorted(unserved.items()))
        return failed(
            name,
            f"tasks use {listed}, which [core] executor = {setting!r} does not configure",
            f"set [core] executor (AIRFLOW__CORE__EXECUTOR) to {EXECUTOR_SETTING!r}, where the scheduler runs too, "
            "and restart the scheduler",
        )
    users = {n: dags for n, dags in used.items() if any(e.serves(n) for e in quota)}
    if not users:
        has = f"[core] executor has {given}" if quota else "[core] executor has no QuotaExecutor"
        return passed(name, f'no DAG has a task with executor="quota"; {has}')
    dags = sorted({d for names in users.values() for d in names})
    return passed(name, f"[core] executor has {given}, used by {len(dags)} DAGs ({', '.join(dags[:5])})")


def same_database(left: str, right: str) -> bool:
    """Whether two SQLAlchemy URLs name the same database (drivers spelled differently alike)."""
    from sqlalchemy.engine import make_url

    from airflow_quota.store.settings import normalize

    a, b = make_url(normalize(left)), make_url(normalize(right))
    key = ("host", "port", "database", "username")
    return a.get_backend_name() == b.get_backend_name() and all(getattr(a, k) == getattr(b, k) for k in key)


def plugin_answer(status: int, content_type: str) -> bool:
    """Whether the api-server's answer for the Quotas page's API is the plugin's: its JSON (a
    401 without a login), not the Airflow UI's HTML that any unknown path gets."""
    return status in (200, 401, 403) and content_type.startswith("application/json")


# -- reading the installation (I/O) --------------------------------------------------------


@dataclass
class QuotaDatabase:
    """What check 1 found, for the checks that read the quota database after it."""

    url: str | None = None
    engine: Engine | None = None
    ready: bool = False


def check_database(found: QuotaDatabase, timeout: float) -> Check:
    """1. The quota database answers and is at the head revision."""
    from airflow_quota.store.engine import current_revision, head_revision, known_revision, make_engine

    try:
        found.url = database_url()
    except QuotaError as exc:
        return failed("quota database", f"its URL setting cannot be read: {exc}", "correct that setting")
    connect = {"connect_timeout": max(1, int(timeout))} if found.url.startswith("postgresql") else {}
    found.engine = make_engine(found.url, connect_args=connect) if connect else make_engine(found.url)
    source = url_source()
    try:
        current = current_revision(found.engine)
    except QuotaError as exc:  # DatabaseUnavailable: "quota database URL is unreachable: reason"
        unreachable = (
            str(exc).removeprefix("quota database ").replace(" is unreachable", f" (from {source}) is unreachable", 1)
        )
        return failed("quota database", unreachable, f"start that database, or correct {source}")
    head = head_revision(found.engine)
    known = current is not None and known_revision(found.engine, current)
    check = revision_check(found.url, source, current, head, known)
    found.ready = check.ok
    return check


def url_source() -> str:
    """Which setting named the quota database here (``store/settings.py``'s order)."""
    if configured_url() is not None:
        return f"{ENV_URL} or [quota] sql_alchemy_conn"
    if os.environ.get(ENV_CONN):
        return ENV_CONN
    return "the quota_default connection, else the default SQLite file"


def check_configuration(found: QuotaDatabase) -> Check:
    """2. A quota configuration is applied, and whether a quota scheduler has taken it in."""
    from airflow_quota.store.repository import QuotaStore

    if not found.ready or found.engine is None:
        return failed("configuration", QUOTA_NOT_READY, None)
    store = QuotaStore(found.engine)
    latest = store.latest_config()
    if latest is None:
        return failed("configuration", "none applied", 'run "airflow-quota apply quota.yaml"')
    version, config = latest
    taken_in = store.shown_view()[1].taken_in
    state = "taken in by the quota scheduler" if taken_in else "not taken in yet (no quota scheduler has run since)"
    return passed("configuration", f"version {version} ({len(config.shares)} shares), {state}")


def check_scheduler(found: QuotaDatabase) -> Check:
    """3. A quota scheduler leads and runs the backends the live jobs name."""
    from sqlalchemy import func, select

    from airflow_quota.core.model import LIVE_STATES
    from airflow_quota.store.models import JobRow
    from airflow_quota.store.repository import QuotaStore

    if not found.ready or found.engine is None:
        return failed("quota scheduler", QUOTA_NOT_READY, None)
    store = QuotaStore(found.engine)
    health = store.scheduler_health()
    with store.sessions() as session:
        rows = session.execute(
            select(JobRow.backend, func.count()).where(JobRow.state.in_(LIVE_STATES)).group_by(JobRow.backend)
        ).all()
    return scheduler_check(health, {str(backend): int(count) for backend, count in rows})


def check_executor() -> Check:
    """4. ``[core] executor`` serves the executor names the DAGs' tasks use (their latest
    serialized versions in Airflow's metadata database: DAGs not run yet count too)."""
    from airflow.configuration import conf
    from airflow.executors.executor_loader import ExecutorLoader
    from airflow.models.dag import DagModel
    from airflow.models.serialized_dag import SerializedDagModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    setting = str(conf.get("core", "executor"))
    configured = [ConfiguredExecutor(n.alias, str(n.module_path)) for n in ExecutorLoader.get_executor_names()]
    used: dict[str, list[str]] = {}
    with create_session() as session:
        dag_ids = list(session.scalars(select(DagModel.dag_id).where(DagModel.is_stale.is_(False))))
        for row in SerializedDagModel.get_latest_serialized_dags(dag_ids=dag_ids, session=session):
            for name in task_executors(row.data or {}):
                used.setdefault(name, []).append(row.dag_id)
    return executor_check(setting, configured, {n: sorted(set(d)) for n, d in used.items()})


def task_executors(serialized: Mapping[str, Any]) -> set[str]:
    """The executor names a serialized DAG's tasks ask for (tasks without one use the default)."""
    tasks: Iterable[Mapping[str, Any]] = serialized.get("dag", {}).get("tasks", [])
    return {str(t["__var"]["executor"]) for t in tasks if t.get("__var", {}).get("executor")}


def check_connection(found: QuotaDatabase) -> Check:
    """5. ``quota_default`` resolves through Airflow's connection lookup (environment variable,
    secrets backend, metadata database) and names the database of check 1."""
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    from airflow_quota.hooks.quota import connection_url

    name = "connection"
    try:
        url = connection_url(BaseHook.get_connection("quota_default"))
    except AirflowNotFoundException:
        if configured_url() is not None:
            return passed(name, f"quota_default is not defined: tasks and the Quotas page use {ENV_URL}, as here")
        return failed(
            name,
            "quota_default is not defined",
            f"define it where every Airflow component runs ({ENV_CONN}=postgresql://… or airflow connections add)",
        )
    origin = ENV_CONN if os.environ.get(ENV_CONN) else "Airflow's secrets backend or metadata database"
    if found.url is not None and not same_database(url, found.url):
        return failed(
            name,
            f"quota_default ({origin}) names {redacted(url)}, but the quota database here is {redacted(found.url)} "
            f"(from {url_source()}): tasks and the Quotas page would use another database",
            "make the connection and the setting name the same database",
        )
    return passed(name, f"quota_default ({origin}) names {redacted(url)}, the quota database")


def api_base_url() -> str:
    """Where the api-server answers: ``[api] base_url`` when it is a full URL, else this
    machine on ``[api] port`` (Airflow's own default for its workers is ``localhost:8080``)."""
    from airflow.configuration import conf

    base = str(conf.get("api", "base_url", fallback="") or "")
    if base.startswith(("http://", "https://")):
        return base.rstrip("/")
    return f"http://localhost:{conf.get('api', 'port', fallback='8080')}{base.rstrip('/')}"


def get(url: str, timeout: float) -> tuple[int, str, bytes]:
    """An unauthenticated GET: status, content type and body (HTTP errors are answers too);
    OSError when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return int(response.status), str(response.headers.get("Content-Type", "")), response.read(2000)
    except urllib.error.HTTPError as exc:
        return int(exc.code), str(exc.headers.get("Content-Type", "")), exc.read(2000)


def check_plugin(timeout: float) -> Check:
    """6. The api-server serves the Quotas page. Asked of the api-server itself (a GET of the
    page's ``openapi.json`` without a login: the plugin answers 401 in JSON, where without the
    plugin Airflow's UI answers any path with its HTML), because that is the process that must
    have loaded it: loading the plugin here would only show that this environment could."""
    from airflow_quota.plugins import URL_PREFIX

    base = api_base_url()
    url = f"{base}{URL_PREFIX}/openapi.json"
    try:
        status, content_type, _ = get(url, timeout)
    except OSError as exc:
        reason = getattr(exc, "reason", exc)
        return failed("plugin", f"the api-server does not answer at {base} ({reason})", 'start "airflow api-server"')
    if plugin_answer(status, content_type):
        return passed("plugin", f"the api-server at {base} serves the Quotas page ({URL_PREFIX}/)")
    return failed(
        "plugin",
        f"the api-server at {base} does not serve the Quotas page (GET {URL_PREFIX}/openapi.json: HTTP {status} "
        f"{content_type or 'no content type'})",
        "install airflow-quota in the api-server's environment and restart it (airflow plugins lists airflow_quota)",
    )


def check_triggerer() -> Check:
    """7. A TriggererJob heartbeats, judged as ``airflow jobs check`` judges it (Airflow's
    ``Job.is_alive``: running, with a heartbeat within ``triggerer_health_check_threshold``)."""
    from airflow.jobs.job import health_check_threshold, most_recent_job
    from airflow.sdk import timezone
    from airflow.utils.session import create_session

    start = 'start "airflow triggerer" (QuotaTrainingOperator and the quota sensors wait in it)'
    with create_session() as session:
        job = most_recent_job("TriggererJob", session=session)
        if job is None:
            return failed("triggerer", "no TriggererJob has ever run", start)
        limit = health_check_threshold(job.job_type, job.heartrate)
        age = (timezone.utcnow() - job.latest_heartbeat).total_seconds() if job.latest_heartbeat else None
        beat = f"heartbeat {age:.0f} s ago" if age is not None else "no heartbeat"
        if job.is_alive():
            return passed("triggerer", f"TriggererJob on {job.hostname}, {beat} (limit {limit:g} s)")
        return failed("triggerer", f"no live TriggererJob: the last, on {job.hostname}, is {job.state}, {beat}", start)


def check_execution_api(timeout: float) -> Check:
    """8. The execution API the workers call (``[core] execution_api_server_url``, else Airflow's
    default from ``[api] base_url``) answers its health endpoint."""
    from airflow.executors.base_executor import get_execution_api_server_url

    url = f"{get_execution_api_server_url().rstrip('/')}/health"
    fix = 'start "airflow api-server", or set [core] execution_api_server_url to where it answers'
    try:
        status, _, body = get(url, timeout)
    except OSError as exc:
        return failed("execution API", f"nothing answers at {url} ({getattr(exc, 'reason', exc)})", fix)
    if status == 200:
        return passed("execution API", f"{url} answers {body.decode(errors='replace').strip()[:60]}")
    return failed("execution API", f"{url} answers HTTP {status}", fix)


# -- running them --------------------------------------------------------------------------


def bounded(name: str, check: Callable[[], Check], timeout: float) -> Check:
    """Run ``check`` in a thread for at most ``timeout`` seconds: a server that never answers
    fails the line (the thread is a daemon: it cannot keep doctor from exiting). An error the
    check did not expect fails the line with its message, never a traceback."""
    outcome: list[Check] = []

    def run() -> None:
        try:
            outcome.append(check())
        except ImportError as exc:
            outcome.append(failed(name, f"cannot be checked here: {exc}", "run doctor where Airflow runs"))
        except Exception as exc:
            outcome.append(failed(name, f"could not be checked: {type(exc).__name__}: {_first_line(exc)}", None))

    worker = threading.Thread(target=run, name=f"doctor {name}", daemon=True)
    worker.start()
    worker.join(timeout)
    if not outcome:
        return failed(name, f"no answer in {timeout:g} s", "see whether the server it reads is up")
    return outcome[0]


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0]


def run_checks(timeout: float) -> list[Check]:
    """Every check, in order; each within ``timeout`` seconds."""
    found = QuotaDatabase()
    steps: list[tuple[str, Callable[[], Check]]] = [
        ("quota database", lambda: check_database(found, timeout)),
        ("configuration", lambda: check_configuration(found)),
        ("quota scheduler", lambda: check_scheduler(found)),
        ("executor", check_executor),
        ("connection", lambda: check_connection(found)),
        ("plugin", lambda: check_plugin(timeout)),
        ("triggerer", check_triggerer),
        ("execution API", lambda: check_execution_api(timeout)),
    ]
    return [bounded(name, step, timeout) for name, step in steps]


def report(checks: Sequence[Check], as_json: bool) -> str:
    """The lines, or one JSON document: ``{"ok": …, "checks": [{name, ok, detail, fix}]}``."""
    if as_json:
        return json.dumps({"ok": all(c.ok for c in checks), "checks": [asdict(c) for c in checks]}, ensure_ascii=False)
    return "\n".join(c.line() for c in checks)
