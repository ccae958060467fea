"""What clients do with the quota database: apply a configuration, submit jobs, change or cancel
them, and read the state. Writes go to the inbox (``quota_requests``); the leading quota
scheduler takes them in at its next cycle. Every write is one transaction: on any error nothing
is stored.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import Engine, func, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from airflow_quota.core.access import Actor, check_priority_access, check_submit_access
from airflow_quota.core.config import QuotaConfig, parse_config, stored_config
from airflow_quota.core.model import LIVE_STATES, JobRequest
from airflow_quota.core.state import QuotaState
from airflow_quota.core.submission import check_submission
from airflow_quota.exceptions import ChangeRefused, InvalidInput, Problem, SubmissionRejected
from airflow_quota.store.backend_names import enabled_backends, not_enabled
from airflow_quota.store.bulk import insert_returning_id, insert_rows, pipelined, with_defaults
from airflow_quota.store.engine import reachable, session_factory
from airflow_quota.store.lock import SchedulerHealth, scheduler_health
from airflow_quota.store.models import (
    AlertRow,
    Attempt,
    ConfigVersion,
    EventRow,
    ForecastRow,
    JobRow,
    Preemption,
    Request,
)
from airflow_quota.store.views import LatestConfiguration, QuotaView, read_shown_view, read_view

NOTIFY_CHANNEL = "airflow_quota"
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
IN_CHUNK = 500
"""Ids per ``IN (...)`` list of the batch reads: well under SQLite's and PostgreSQL's limits
on bound parameters."""


class QuotaStore:
    """The quota database as clients see it."""

    def __init__(self, engine: Engine, clock: Callable[[], float] = time.time) -> None:
        self.engine = engine
        self.sessions = session_factory(engine)
        self.clock = clock
        self._checked: tuple[int, QuotaState] | None = None
        self._checked_at = float("-inf")

    # -- configuration -------------------------------------------------------------------

    def apply_config(self, raw: Any, source: str | None = None) -> int:
        """Validate and store a configuration as a new version; raises InvalidInput (nothing
        stored), also for a notifier of ``alerts.notifiers`` that cannot be imported or built
        here. It takes effect at the scheduler's next cycle."""
        config = parse_config(raw)
        if config.alerts.notifiers:  # import and instantiate what can be here (loader.check_notifiers)
            from airflow_quota.notifications.loader import check_notifiers

            check_notifiers(config)
        names = {share.name for share in config.shares}
        orphans = sorted({job.share for job in self.jobs(states=LIVE_STATES)} - names)
        if orphans:
            raise InvalidInput(
                Problem("shares", f"share {name!r} has live jobs: set its state to DISABLED and let them finish first")
                for name in orphans
            )
        document = config.model_dump(mode="json", exclude_defaults=True)
        with self._session() as session, session.begin():
            version = ConfigVersion(created_at=self.clock(), document=document, source=source)
            session.add(version)
            session.flush()
            session.add(Request(created_at=self.clock(), kind="config", payload={"version": version.id}))
            self._notify(session)
        self._checked = None  # submissions through this store see the new version at once
        return version.id

    def latest_config(self) -> tuple[int, QuotaConfig] | None:
        with self._session() as session:
            row = session.scalars(select(ConfigVersion).order_by(ConfigVersion.id.desc()).limit(1)).first()
            return None if row is None else (row.id, stored_config(row.document))

    # -- jobs ----------------------------------------------------------------------------

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
        actor: Actor = Actor(),  # noqa: B008 (frozen: one shared instance is what is meant)
        priority_overridden: bool = False,
        map_index: int | None = None,
        expected_runtime_seconds: float | None = None,
    ) -> JobRow:
        """Store a submission for the scheduler to take in; raises SubmissionRejected when the
        current configuration could never accept it (nothing stored), SubmissionDenied when
        the share's ``access.submit`` rule leaves ``actor`` out, and PriorityChangeDenied when
        ``priority_overridden`` (the priority is a run's override, not the task's own) and its
        ``access.set_priority`` rule does. ``Actor()``, nobody known, passes only shares
        without rules. With ``client_token``, submitting again returns the job already stored
        (a retried task finds its job). One transaction on one connection; on PostgreSQL the
        submission's writes and its COMMIT take two round trips."""
        if backend not in enabled_backends():
            raise SubmissionRejected(not_enabled(backend))
        now = self.clock()
        job = {
            "name": request.name,
            "share": request.share,
            "priority": request.priority,
            "backend": backend,
            "request": request.model_dump(mode="json", exclude_defaults=True),
            "training": training or {},
            "client_token": client_token,
            "dag_id": dag_id,
            "task_id": task_id,
            "run_id": run_id,
            "aws_conn_id": aws_conn_id,
            "map_index": map_index,
            "expected_runtime_seconds": expected_runtime_seconds,
            "submitted_at": now,
            "state": "SUBMITTED",
            "updated_at": now,
        }
        with self._session() as session:
            try:
                if client_token is not None:
                    existing = session.scalars(select(JobRow).where(JobRow.client_token == client_token)).first()
                    if existing is not None:
                        return existing
                state = self._state_of_latest(session)
                check_submission(state, request)
                share = state.shares[request.share]  # check_submission refused unknown shares
                check_submit_access(share.name, share.access, actor)
                if priority_overridden:
                    check_priority_access(share.name, share.access, actor)
                job_id = insert_returning_id(session, JobRow, job)
                with pipelined(session, commit=True):  # the rest and the COMMIT in one round trip
                    insert_rows(
                        session, Request, [{"created_at": now, "kind": "submit", "job_id": job_id, "payload": {}}]
                    )
                    self._notify(session)
            except IntegrityError:
                session.rollback()
                if client_token is not None and (again := self.job_by_token(client_token)) is not None:
                    return again
                raise SubmissionRejected(f"name: a live job is already named {request.name!r}") from None
        return JobRow(id=job_id, **with_defaults(JobRow, job))

    def _state_of_latest(self, session: Session) -> QuotaState:
        """The latest configuration as a quota state to check submissions against; the version is
        looked up at most once a second (the scheduler checks every submission again when it
        takes it in, against the configuration then in force)."""
        now = time.monotonic()
        if self._checked is not None and now - self._checked_at < 1.0:
            return self._checked[1]
        self._checked_at = now
        version = session.scalar(select(func.max(ConfigVersion.id)))
        if version is None:
            raise SubmissionRejected("no quota configuration is applied yet (airflow-quota apply quota.yaml)")
        if self._checked is None or self._checked[0] != version:
            row = session.get(ConfigVersion, version)
            assert row is not None
            self._checked = (version, QuotaState(stored_config(row.document), _EPOCH))
        return self._checked[1]

    def set_priority(
        self,
        job_id: int,
        priority: int,
        actor: Actor = Actor(),  # noqa: B008 (frozen: one shared instance is what is meant)
    ) -> None:
        """Ask for a new priority (AWS UpdateServiceJob); refused (ChangeRefused) above the
        share's max_priority, and (PriorityChangeDenied) when the share's
        ``access.set_priority`` rule leaves ``actor`` out."""
        job = self._live_job(job_id)
        latest = self.latest_config()
        share = latest[1].share(job.share) if latest else None
        if share is not None:
            check_priority_access(share.name, share.access, actor)
        if not 0 <= priority <= 9999:
            raise ChangeRefused(f"priority: {priority} is outside 0-9999")
        if share is not None and priority > share.max_priority:
            raise ChangeRefused(
                f"priority: {priority} is above share {share.name!r}'s max_priority {share.max_priority}"
            )
        self._request("set_priority", job_id, {"priority": priority})

    def cancel(self, job_id: int) -> None:
        self._live_job(job_id)
        self._request("cancel", job_id, {})

    def set_provider_available(self, instance_type: str, available: int | None) -> None:
        """Tell the scheduler how many on-demand instances of a pool type the provider can give
        now (None: as many as the pool has); it takes effect at the next cycle."""
        latest = self.latest_config()
        if latest is None:
            raise ChangeRefused("no quota configuration is applied yet (airflow-quota apply quota.yaml)")
        pool = latest[1].pool.capacity
        if instance_type not in pool:
            raise ChangeRefused(f"instance_type: {instance_type!r} is not in the pool ({', '.join(sorted(pool))})")
        if available is not None and available < 0:
            raise ChangeRefused(f"available: {available} is negative; give 0 or more, or unlimited")
        with self._session() as session, session.begin():
            payload = {"instance_type": instance_type, "available": available}
            session.add(Request(created_at=self.clock(), kind="provider", payload=payload))
            self._notify(session)

    def _live_job(self, job_id: int) -> JobRow:
        job = self.job(job_id)
        if job is None:
            raise ChangeRefused(f"job: no job with id {job_id}")
        if job.state not in LIVE_STATES:
            raise ChangeRefused(f"job {job.name!r} is already {job.state}")
        return job

    def _request(self, kind: str, job_id: int, payload: dict[str, Any]) -> None:
        with self._session() as session, session.begin():
            session.add(Request(created_at=self.clock(), kind=kind, job_id=job_id, payload=payload))
            self._notify(session)

    # -- reading -------------------------------------------------------------------------

    def job(self, job_id: int) -> JobRow | None:
        with self._session() as session:
            return session.get(JobRow, job_id)

    def job_by_name(self, name: str) -> JobRow | None:
        """The live job of that name, else the latest one."""
        with self._session() as session:
            query = select(JobRow).where(JobRow.name == name).order_by(JobRow.id.desc())
            rows = session.scalars(query).all()
            live = [r for r in rows if r.state in LIVE_STATES]
            ordered = live or list(rows)
            return ordered[0] if ordered else None

    def job_by_token(self, token: str) -> JobRow | None:
        with self._session() as session:
            return session.scalars(select(JobRow).where(JobRow.client_token == token)).first()

    def jobs(
        self, share: str | None = None, states: Sequence[str] | None = None, dag_id: str | None = None
    ) -> list[JobRow]:
        with self._session() as session:
            query = select(JobRow).order_by(JobRow.id)
            if share:
                query = query.where(JobRow.share == share)
            if states:
                query = query.where(JobRow.state.in_(list(states)))
            if dag_id:
                query = query.where(JobRow.dag_id == dag_id)
            return list(session.scalars(query))

    def forecasts(self, ids: Collection[int]) -> dict[int, ForecastRow]:
        """The latest forecast of each of these jobs that has one (``service/forecasts.py``)."""
        wanted = sorted(set(ids))
        with self._session() as session:
            return {
                row.job_id: row
                for start in range(0, len(wanted), IN_CHUNK)
                for row in session.scalars(
                    select(ForecastRow).where(ForecastRow.job_id.in_(wanted[start : start + IN_CHUNK]))
                )
            }

    def jobs_by_ids(self, ids: Collection[int]) -> list[JobRow]:
        """The jobs with these ids that exist, in id order: one query per ``IN_CHUNK`` ids, so a
        triggerer following many jobs reads them all at once (``triggers/watch.py``)."""
        wanted = sorted(set(ids))
        with self._session() as session:
            return [
                row
                for start in range(0, len(wanted), IN_CHUNK)
                for row in session.scalars(
                    select(JobRow).where(JobRow.id.in_(wanted[start : start + IN_CHUNK])).order_by(JobRow.id)
                )
            ]

    def alerts_for(self, job_ids: Collection[int], after_id: int = 0) -> list[AlertRow]:
        """The alerts about these jobs with an id above ``after_id``, in id order: one query per
        ``IN_CHUNK`` jobs. A follower that remembers the last id it saw reads only new alerts."""
        wanted = sorted(set(job_ids))
        with self._session() as session:
            found = [
                row
                for start in range(0, len(wanted), IN_CHUNK)
                for row in session.scalars(
                    select(AlertRow).where(
                        AlertRow.job_id.in_(wanted[start : start + IN_CHUNK]), AlertRow.id > after_id
                    )
                )
            ]
        return sorted(found, key=lambda alert: alert.id)

    def attempts(self, job_id: int) -> list[Attempt]:
        with self._session() as session:
            query = select(Attempt).where(Attempt.job_id == job_id).order_by(Attempt.number)
            return list(session.scalars(query))

    def preemptions(self, job_id: int) -> list[Preemption]:
        with self._session() as session:
            return list(session.scalars(select(Preemption).where(Preemption.job_id == job_id).order_by(Preemption.id)))

    def alerts(self, job_id: int | None = None) -> list[AlertRow]:
        with self._session() as session:
            query = select(AlertRow).order_by(AlertRow.id)
            if job_id is not None:
                query = query.where(AlertRow.job_id == job_id)
            return list(session.scalars(query))

    def events(self, job_id: int | None = None, after: int = 0) -> list[EventRow]:
        """The decision log (of one job), in order."""
        with self._session() as session:
            query = select(EventRow).where(EventRow.id > after).order_by(EventRow.id)
            if job_id is not None:
                query = query.where(EventRow.job_id == job_id)
            return list(session.scalars(query))

    def request_outcome(self, request_id: int) -> Request | None:
        with self._session() as session:
            return session.get(Request, request_id)

    def pending_requests(self) -> int:
        with self._session() as session:
            return int(session.scalar(select(func.count()).where(Request.handled.is_(False))) or 0)

    def view(self) -> QuotaView:
        """The shares' view as the leading quota scheduler last committed it (``store/views.py``):
        per share and instance type, limit, used, borrowed, lent, idle, RUNNABLE count and when
        the oldest waiting job became RUNNABLE. Empty before the leader's first commit."""
        with self._session() as session:
            return read_view(session)

    def shown_view(self) -> tuple[QuotaView, LatestConfiguration]:
        """What readers show of the shares (``store/views.py``, ``read_shown_view``): the leader's
        view, or before a quota scheduler has taken in any configuration, the latest stored
        one's limits with nothing used; and whether a scheduler has taken in the latest version."""
        with self._session() as session:
            return read_shown_view(session)

    def scheduler_health(self) -> SchedulerHealth:
        """Whether a quota scheduler leads (its heartbeat, in the database's clock)."""
        with reachable(str(self.engine.url)):
            return scheduler_health(self.engine)

    # -- plumbing ------------------------------------------------------------------------

    @contextmanager
    def _session(self) -> Iterator[Session]:
        """A session; a database that cannot be reached becomes DatabaseUnavailable."""
        with reachable(str(self.engine.url)), self.sessions() as session:
            yield session

    def _notify(self, session: Session) -> None:
        """Wake the scheduler at once (PostgreSQL LISTEN/NOTIFY; SQLite schedulers poll)."""
        if self.engine.dialect.name == "postgresql":
            session.execute(text(f"NOTIFY {NOTIFY_CHANNEL}"))
