"""``QuotaHook``: the one way the Airflow layer (operators, sensors, triggers) touches quota state.

The quota state lives in its own database, not Airflow's (task code and triggers may not touch
Airflow's metadata database in Airflow 3). The hook finds that database through an Airflow
connection (``quota_default`` unless told otherwise) and talks to it through the store's
``QuotaStore``: writes go to the quota scheduler's inbox, reads see the jobs as the scheduler
last wrote them.

Every method has a blocking form for workers and, where a trigger needs it, an ``a``-prefixed
coroutine that runs the blocking call in a thread (``asyncio.to_thread``): SQLAlchemy blocks, and
a blocked event loop would stall every trigger of the triggerer.

One ``QuotaStore`` (one engine and connection pool) is kept per database URL for the whole
process, so a triggerer following a thousand jobs holds one pool, not a thousand.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException
from sqlalchemy import select
from sqlalchemy.engine import URL

from airflow_quota.core.access import Actor, local_user
from airflow_quota.core.human_time import clock_time, duration_words
from airflow_quota.core.model import HOLDING_STATES, JobRequest, JobState, PreferenceEntry
from airflow_quota.core.submission import job_fields
from airflow_quota.exceptions import ChangeRefused
from airflow_quota.notifications.base import alert_message
from airflow_quota.store.dashboard import current_borrowing
from airflow_quota.store.engine import make_engine, reachable
from airflow_quota.store.models import AlertRow, Attempt, JobRow, Request
from airflow_quota.store.repository import QuotaStore
from airflow_quota.store.settings import ENV_URL, configured_url, normalize, redacted
from airflow_quota.store.views import share_placeable

"""Job states after which nothing more happens (docs/model.md rule 3.1)."""

_STORES: dict[str, QuotaStore] = {}
_STORES_LOCK = threading.Lock()


def store_for(url: str) -> QuotaStore:
    """The process-wide ``QuotaStore`` of a database URL (created on first use)."""
    with _STORES_LOCK:
        store = _STORES.get(url)
        if store is None:
            store = _STORES[url] = QuotaStore(make_engine(url))
        return store


def open_stores() -> list[QuotaStore]:
    """The process-wide stores created so far (``store_for``), one per database URL."""
    with _STORES_LOCK:
        return list(_STORES.values())


def connection_url(conn: Any) -> str:
    """The SQLAlchemy URL an Airflow connection names.

    In order: an explicit ``sql_alchemy_conn`` (or ``url``) in the connection's extra; a
    ``sqlite`` connection's path (Airflow keeps it in ``host``, or in ``schema`` when the
    connection came from a ``sqlite:////abs/path`` URI); a ``postgres`` connection's fields (for
    psycopg 3), and so a ``quota`` connection's (the type this provider registers); else the
    connection's URI as Airflow renders it.
    """
    extra = conn.extra_dejson or {}
    for key in ("sql_alchemy_conn", "url"):
        if extra.get(key):
            return normalize(str(extra[key]))
    conn_type = (conn.conn_type or "").lower()
    if conn_type == "sqlite":
        path = conn.host or conn.schema
        if path:
            return f"sqlite:///{path}"
    if conn_type in ("postgres", "postgresql", QuotaHook.conn_type):
        url = URL.create(
            "postgresql+psycopg",
            username=conn.login or None,
            password=conn.password or None,
            host=conn.host or None,
            port=conn.port or None,
            database=conn.schema or None,
        )
        return url.render_as_string(hide_password=False)
    return normalize(str(conn.get_uri()))


def task_actor(context: Mapping[str, Any]) -> Actor:
    """Who a task asks as (``core.access``): its DAG's id, tags and bundle, and the user who
    triggered its run (a manual trigger's or a backfill's creator; none for scheduled runs)."""
    ti = context["ti"]
    dag = context.get("dag")
    bundle = getattr(getattr(ti, "bundle_instance", None), "name", None)
    user = getattr(context.get("dag_run"), "triggering_user_name", None)
    return Actor.of_dag(ti.dag_id, getattr(dag, "tags", None) or (), bundle, user)


def current_actor() -> Actor:
    """The running task's actor (``task_actor``) inside a task, else ``local_user()``."""
    from airflow.sdk import get_current_context

    try:
        context = get_current_context()
    except RuntimeError:  # not inside a task
        return local_user()
    return task_actor(context)


@dataclass(frozen=True, slots=True)
class CapacityCheck:
    """Whether a share could place a preference list now, and which entry or why not."""

    placeable: bool
    entry: str | None
    """The first entry that could be placed (``"2x ml.g5.xlarge"``), when one could."""
    reason: str


def state_key(job: JobRow) -> tuple[Any, ...]:
    """What a follower of the job reports when it changes: state, why it waits and where it
    stands, where it runs. Two reads with the same key tell nothing new."""
    return (
        job.state,
        job.pending_reason,
        job.position_in_share,
        job.position_in_queue,
        job.instance_type,
        job.count,
        job.borrowed,
        job.attempts,
        job.preemptions,
    )


def describe_job(job: JobRow, borrowed_now: int | None = None) -> str:
    """One line for the task log: the job's state and what goes with it.

    :param borrowed_now: of the instances the job holds, how many are above its share's limit
        now (``QuotaHook.borrowed_now``, the Quotas page's figure): said as "borrowing N now".
        Without it, the line can only say what the job borrowed when it was placed
        (``job.borrowed``), and says so: jobs of the share placed before it may have left since.
    """
    who = f"quota job {job.id} ({job.name}) in share {job.share}"
    if job.state == JobState.SUBMITTED.value:
        return f"{who} is SUBMITTED: waiting for the quota scheduler to take it in"
    if job.state == JobState.RUNNABLE.value:
        line = f"{who} is RUNNABLE: {job.pending_reason or 'waiting'}"
        if job.waiting_for:
            line += f" for {job.waiting_for}"
        if job.position_in_share is not None:
            line += f", position {job.position_in_share} in its share"
            if job.position_in_queue is not None:
                line += f" ({job.position_in_queue} in the whole queue)"
        if job.preemptions:
            line += f"; preempted {job.preemptions} time(s) so far, resumes from its checkpoint"
        return line
    if job.state in HOLDING_STATES:
        line = f"{who} is {job.state}"
        if job.instance_type:
            line += f" on {job.count}x {job.instance_type}"
            if job.training_plan:
                line += f" (plan {job.training_plan})"
            if borrowed_now is not None:
                if borrowed_now:
                    line += f" (borrowing {borrowed_now} now)"
            elif job.borrowed:
                line += f" (borrowed {job.borrowed} when placed)"
        return line + f", attempt {job.attempts}"
    if job.state == JobState.FAILED.value:
        return f"{who} FAILED: {job.reason}: {job.detail}"
    return f"{who} {job.state} after {job.attempts} attempt(s), {job.preemptions} preemption(s)"


def pending_deadline_line(job_id: int, max_pending_seconds: float, deadline: float, now: float) -> str:
    """One line for the task log when a job starts waiting under a ``max_pending_time``: when it
    falls due, on a UTC clock and from ``now``, in words (``core.human_time``), so whoever reads
    the log knows how long the task may still wait before it fails. ``deadline`` is the one the
    quota scheduler stores (``JobRow.pending_deadline``): for a list of plan entries only, the
    wait counts from the plans' window, which the line says when it makes the deadline later."""
    left = deadline - now
    line = (
        f"quota job {job_id}: max_pending_time {duration_words(max_pending_seconds)}: it fails with PENDING_TIMEOUT"
        f" at {clock_time(deadline, now)} ({'now' if left <= 0 else 'in ' + duration_words(left)})"
        " if it is still waiting then"
    )
    if left > max_pending_seconds + 1:  # the core starts the clock at the plans' window
        line += " (the wait counts from its training plans' window)"
    return line


def describe_pending_deadline(job: JobRow, now: float) -> str | None:
    """``pending_deadline_line`` for a RUNNABLE job the scheduler gave a deadline; None otherwise."""
    limit = job.request.get("max_pending_seconds")
    if job.state != JobState.RUNNABLE.value or job.pending_deadline is None or limit is None:
        return None
    return pending_deadline_line(job.id, float(limit), job.pending_deadline, now)


def describe_alert(alert: AlertRow) -> str:
    """One line for the task log: an alert the quota scheduler raised about the job, the same
    line its notifiers were sent."""
    return alert_message(alert.kind, alert.job_id, alert.job, alert.share, alert.reason, alert.position)


class QuotaHook(BaseHook):
    """Reach the quota database through an Airflow connection.

    :param quota_conn_id: the Airflow connection naming the quota database: its URI
        (``AIRFLOW_CONN_QUOTA_DEFAULT='postgresql://…'``), a ``postgres`` or ``sqlite``
        connection, or any connection with ``{"sql_alchemy_conn": "…"}`` in its extra. When the
        default connection ``quota_default`` does not exist, an explicit URL setting applies
        (``AIRFLOW__QUOTA__SQL_ALCHEMY_CONN``, then ``[quota] sql_alchemy_conn``); otherwise,
        and for any other missing connection, ``AirflowNotFoundException`` names it: a mistyped
        connection id never silently reaches another database.
    """

    conn_name_attr = "quota_conn_id"
    default_conn_name = "quota_default"
    conn_type = "quota"
    """The connection type registered by the provider (``get_provider_info``): a PostgreSQL
    database by its fields, or any database by ``sql_alchemy_conn`` in its extra."""
    hook_name = "Airflow Quota"

    def __init__(self, quota_conn_id: str = default_conn_name) -> None:
        super().__init__()
        self.quota_conn_id = quota_conn_id
        self._url: str | None = None

    # -- the database ----------------------------------------------------------------------

    def get_url(self) -> str:
        """The quota database's URL (resolved once); an unknown connection raises
        ``AirflowNotFoundException`` unless an explicit setting names the database."""
        if self._url is None:
            try:
                self._url = connection_url(self.get_connection(self.quota_conn_id))
            except AirflowNotFoundException:
                self._url = self._explicit_url()
        return self._url

    async def aget_url(self) -> str:
        """``get_url`` for the triggerer: the connection is looked up without blocking."""
        if self._url is None:
            try:
                self._url = connection_url(await self.aget_connection(self.quota_conn_id))
            except AirflowNotFoundException:
                self._url = await asyncio.to_thread(self._explicit_url)
        return self._url

    def _explicit_url(self) -> str:
        """Without the connection: the URL setting, for the default connection only. A missing
        or mistyped ``quota_conn_id`` fails loudly rather than reach another database (a task
        would otherwise wait for a scheduler that never reads it)."""
        default = self.quota_conn_id == self.default_conn_name
        configured = configured_url() if default else None
        if configured is None:
            variable = f"AIRFLOW_CONN_{self.quota_conn_id.upper()}"
            or_setting = f" or set {ENV_URL} / [quota] sql_alchemy_conn" if default else ""
            raise AirflowNotFoundException(
                f"quota_conn_id: the connection {self.quota_conn_id!r} is not defined; create it "
                f"(airflow connections add, or {variable}=postgresql://...){or_setting}"
            )
        return configured

    @cached_property
    def store(self) -> QuotaStore:
        return store_for(self.get_url())

    def get_conn(self) -> QuotaStore:
        """The ``QuotaStore`` (BaseHook's name for "the client")."""
        return self.store

    async def _astore(self) -> QuotaStore:
        return store_for(await self.aget_url())

    def test_connection(self) -> tuple[bool, str]:
        """Airflow's "Test connection": can the quota database be read?"""
        try:
            latest = self.store.latest_config()
        except Exception as exc:
            return False, str(exc)
        version = f"configuration version {latest[0]}" if latest else "no configuration applied yet"
        return True, f"quota database {redacted(self.get_url())} answers: {version}"

    # -- jobs ------------------------------------------------------------------------------

    def submit(
        self,
        request: JobRequest,
        backend: str,
        training: dict[str, Any] | None = None,
        client_token: str | None = None,
        dag_id: str | None = None,
        task_id: str | None = None,
        run_id: str | None = None,
        aws_conn_id: str | None = None,
        *,
        actor: Actor | None = None,
        priority_overridden: bool = False,
        map_index: int | None = None,
        expected_runtime_seconds: float | None = None,
    ) -> JobRow:
        """Store a submission for the quota scheduler (``QuotaStore.submit``): raises
        ``InvalidInput`` for a field beyond its limit (``core.submission.job_fields``, as the
        CLI), ``SubmissionRejected`` when the current configuration could never accept it
        (``SubmissionDenied`` when the share's ``access.submit`` rule leaves ``actor`` out); with
        a ``client_token`` already used, returns that job instead of submitting again.

        :param actor: who submits (``task_actor(context)`` in an operator); default: the
            running task's DAG, or the operating-system user outside a task (``current_actor``).
        :param priority_overridden: the request's priority is a run's ``quota_priority``
            override: the share's ``access.set_priority`` rule must allow ``actor`` too.
        :param map_index: the mapped task instance's index (None or -1: not a mapped task).
        :param expected_runtime_seconds: how long the author expects the training to run (more
            than 0 seconds): the forecast's best runtime estimate; None: not given.
        """
        fields = job_fields(
            {
                "backend": backend,
                "training": training,
                "client_token": client_token,
                "dag_id": dag_id,
                "task_id": task_id,
                "run_id": run_id,
                "aws_conn_id": aws_conn_id,
                "map_index": None if map_index is None or map_index < 0 else map_index,
                "expected_runtime_seconds": expected_runtime_seconds,
            }
        )
        return self.store.submit(
            request,
            fields.backend,
            fields.training,
            fields.client_token,
            fields.dag_id,
            fields.task_id,
            fields.run_id,
            aws_conn_id=fields.aws_conn_id,
            actor=current_actor() if actor is None else actor,
            priority_overridden=priority_overridden,
            map_index=fields.map_index,
            expected_runtime_seconds=fields.expected_runtime_seconds,
        )

    def get_job(self, job_id: int) -> JobRow | None:
        return self.store.job(job_id)

    async def aget_job(self, job_id: int) -> JobRow | None:
        store = await self._astore()
        return await asyncio.to_thread(store.job, job_id)

    def borrowed_now(self, job: JobRow) -> int:
        """Of the instances ``job`` holds, how many are above its share's limit now: the read
        model's count (``dashboard.current_borrowing``, as the Quotas page and ``airflow-quota
        jobs show`` say it), which falls when jobs of the share placed before it leave. 0 for a
        job that holds nothing."""
        return current_borrowing(self.store, [job]).get(job.id, 0)

    def describe(self, job: JobRow) -> str:
        """``describe_job`` with the job's borrowing as it is now (one more read while it holds
        instances)."""
        return describe_job(job, self.borrowed_now(job) if job.state in HOLDING_STATES else None)

    def get_job_by_token(self, client_token: str) -> JobRow | None:
        return self.store.job_by_token(client_token)

    def get_attempts(self, job_id: int) -> list[Attempt]:
        return self.store.attempts(job_id)

    def get_alerts(self, job_id: int) -> list[AlertRow]:
        """The alerts raised about the job (STARVING, PREEMPTED_REPEATEDLY, GUARANTEE_VIOLATED), in order."""
        return self.store.alerts(job_id)

    async def aget_alerts(self, job_id: int) -> list[AlertRow]:
        store = await self._astore()
        return await asyncio.to_thread(store.alerts, job_id)

    def job_story(self, job_id: int) -> list[str]:
        """The job's lines of the decision log, in order: submitted, placed (where, which
        attempt, why), preempted (by whom, kind, lost work), requeued, finished or failed."""
        return [event.line for event in self.store.events(job_id=job_id)]

    def submission_refusal(self, job_id: int) -> str | None:
        """Why the quota scheduler refused the submission of ``job_id``, if it did.

        A submission accepted by the store can still be refused when the scheduler takes it in
        (the configuration changed in between); the scheduler then deletes the job's row and
        keeps the reason on the inbox request.
        """
        store = self.store
        with reachable(str(store.engine.url)), store.sessions() as session:
            query = select(Request.error).where(
                Request.job_id == job_id, Request.kind == "submit", Request.outcome == "refused"
            )
            return session.scalars(query).first()

    async def asubmission_refusal(self, job_id: int) -> str | None:
        await self._astore()
        return await asyncio.to_thread(self.submission_refusal, job_id)

    def cancel_requested(self, job_id: int) -> bool:
        """Whether someone asked to cancel the job (the request may not be taken in yet)."""
        store = self.store
        with reachable(str(store.engine.url)), store.sessions() as session:
            query = select(Request.id).where(
                Request.job_id == job_id, Request.kind == "cancel", Request.outcome.is_distinct_from("refused")
            )
            return session.scalars(query.limit(1)).first() is not None

    def cancel(self, job_id: int) -> bool:
        """Ask the quota scheduler to cancel the job; False when it is already final or gone
        (nothing to cancel), True when the request is in the inbox."""
        try:
            self.store.cancel(job_id)
        except ChangeRefused:
            return False
        return True

    async def acancel(self, job_id: int) -> bool:
        await self._astore()
        return await asyncio.to_thread(self.cancel, job_id)

    def set_priority(self, job_id: int, priority: int, actor: Actor | None = None) -> None:
        """Ask for a new priority; ``ChangeRefused`` above the share's max_priority,
        ``PriorityChangeDenied`` when the share's ``access.set_priority`` rule leaves ``actor``
        out (default: the running task's DAG, or the operating-system user outside a task)."""
        self.store.set_priority(job_id, priority, current_actor() if actor is None else actor)

    # -- capacity --------------------------------------------------------------------------

    def can_place_now(self, share: str, preferences: Sequence[dict[str, Any] | PreferenceEntry]) -> CapacityCheck:
        """Whether ``share`` could place a job with these preferences now, without preemption:
        the first entry whose count is at most what the leading quota scheduler's core found a
        new job of the share could be placed on, on that type and source, at its last commit
        (``core.visibility.most_placeable``, kept in the read model by ``store/views.py``).

        That is the core's own placement check, within quota or, for a LEND_AND_BORROW share,
        by borrowing, with everything the core sees: starving jobs' reservations, lenders
        protecting their own demand, victims still draining, plan windows, back-offs, provider
        capacity. It is as of the scheduler's last commit (a submission it has not taken in yet
        does not count), and "could place a job", not "your next job starts": queued jobs of the
        same share that would be placed first are not subtracted.
        """
        probe = JobRequest(name="capacity-check", share=share, preferences=list(preferences))
        store = self.store
        with reachable(str(store.engine.url)), store.sessions() as session:
            found = share_placeable(session, share)
        if found is None:
            latest = store.latest_config()
            if latest is None:
                return CapacityCheck(False, None, "no quota configuration is applied yet")
            if latest[1].share(share) is not None:
                return CapacityCheck(False, None, f"the quota scheduler has not taken share {share!r} in yet")
            return CapacityCheck(False, None, f"no share named {share!r}")
        view, placeable = found
        if view.state == "DISABLED":
            return CapacityCheck(False, None, f"share {share!r} is DISABLED")
        most = {(p.instance_type, p.training_plan): p for p in placeable}
        types = {p.instance_type for p in placeable}
        how = "within quota or by borrowing" if view.strategy == "LEND_AND_BORROW" else "within the share's limit"
        reasons = []
        for entry in probe.entries():
            source = most.get((entry.instance_type, entry.training_plan))
            if source is None:
                missing = "not in the pool" if entry.instance_type not in types else "no such training plan"
                reasons.append(f"{entry}: {missing}")
            elif entry.count <= source.most:
                return CapacityCheck(True, str(entry), f"{entry} fits now, {how}")
            else:
                reasons.append(f"{entry}: {source.blocked_by}; at most {source.most} now")
        return CapacityCheck(False, None, "; ".join(reasons))

    async def acan_place_now(
        self, share: str, preferences: Sequence[dict[str, Any] | PreferenceEntry]
    ) -> CapacityCheck:
        await self._astore()
        return await asyncio.to_thread(self.can_place_now, share, preferences)
