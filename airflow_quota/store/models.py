"""The tables of the quota database.

The quota scheduler's state is *event-sourced*: ``inputs`` is the ordered log of everything fed
to the core (submissions, changes, backend reports, cycles), and replaying it through a fresh
``QuotaScheduler`` rebuilds the exact in-memory state (the core is deterministic). The other
tables are what people and backends need to read: jobs as they stand, attempts with their
pending backend actions, preemptions, alerts, the decision log, configuration versions, and the
inbox of requests the scheduler has yet to take in.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    false,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}  # noqa: RUF012 - SQLAlchemy's API


Id = BigInteger().with_variant(Integer, "sqlite")
"""The type of every id and every column that refers to one: ``BIGINT`` on PostgreSQL (its
sequence counting as ``BIGINT`` too), so that any id the API and the command line accept (1 to
2^63-1) can be stored and looked up (migration 0013); on SQLite ``INTEGER``, which is 64-bit
already and is the only type whose primary key SQLite numbers by itself (the rowid).

Every table with such an id is ``sqlite_autoincrement`` (migration 0016): an id is never given
again once its row is deleted (a refused submission's job row, a pruned job). SQLite's rowid
alone takes the largest id in the table plus one, so the next job got a refused one's id, and
with it that refusal's decision in its history. PostgreSQL's sequences never go back."""


class ConfigVersion(Base):
    """A quota configuration as applied with ``airflow-quota apply`` (one row per version)."""

    __tablename__ = "quota_config_versions"
    __table_args__ = {"sqlite_autoincrement": True}  # noqa: RUF012 - SQLAlchemy's API

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    created_at: Mapped[float] = mapped_column(Float)
    document: Mapped[dict[str, Any]]
    source: Mapped[str | None] = mapped_column(String(500))


class Request(Base):
    """The inbox: what clients asked for, taken in by the leader in id order."""

    __tablename__ = "quota_requests"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    created_at: Mapped[float] = mapped_column(Float)
    kind: Mapped[str] = mapped_column(String(20))
    """submit | set_priority | cancel | config"""
    job_id: Mapped[int | None] = mapped_column(Id)
    payload: Mapped[dict[str, Any]]
    handled: Mapped[bool] = mapped_column(Boolean, default=False)
    outcome: Mapped[str | None] = mapped_column(String(20))
    error: Mapped[str | None] = mapped_column(Text)

    __table_args__ = (Index("ix_quota_requests_pending", "handled", "id"), {"sqlite_autoincrement": True})


class JobRow(Base):
    """A job as it stands (written by the leader after each cycle; submitted by clients)."""

    __tablename__ = "quota_jobs"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(128))
    share: Mapped[str] = mapped_column(String(128))
    priority: Mapped[int] = mapped_column(Integer)
    backend: Mapped[str] = mapped_column(String(32))
    request: Mapped[dict[str, Any]]
    training: Mapped[dict[str, Any]]
    client_token: Mapped[str | None] = mapped_column(String(256), unique=True)
    dag_id: Mapped[str | None] = mapped_column(String(250))
    task_id: Mapped[str | None] = mapped_column(String(250))
    run_id: Mapped[str | None] = mapped_column(String(250))
    map_index: Mapped[int | None] = mapped_column(Integer)
    """The mapped task instance's index (``JobFields.map_index``); None: not a mapped task."""
    aws_conn_id: Mapped[str | None] = mapped_column(String(250))
    """The Airflow AWS connection the job's SageMaker calls use (``JobFields.aws_conn_id``)."""
    expected_runtime_seconds: Mapped[float | None] = mapped_column(Float)
    """How long the author expects the job to run (``JobFields.expected_runtime_seconds``): read
    by the forecast only (``service/forecasts.py``); None: not given."""
    submitted_at: Mapped[float] = mapped_column(Float)
    state: Mapped[str] = mapped_column(String(20), default="SUBMITTED")
    reason: Mapped[str | None] = mapped_column(String(40))
    detail: Mapped[str | None] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    preemptions: Mapped[int] = mapped_column(Integer, default=0)
    wait_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    instance_type: Mapped[str | None] = mapped_column(String(64))
    count: Mapped[int | None] = mapped_column(Integer)
    training_plan: Mapped[str | None] = mapped_column(String(128))
    borrowed: Mapped[int] = mapped_column(Integer, default=0)
    gpu_hours: Mapped[float] = mapped_column(Float, default=0.0)
    lost_gpu_hours: Mapped[float] = mapped_column(Float, default=0.0)
    cost: Mapped[float] = mapped_column(Float, default=0.0)
    pending_reason: Mapped[str | None] = mapped_column(String(40))
    waiting_for: Mapped[str | None] = mapped_column(String(200))
    position_in_share: Mapped[int | None] = mapped_column(Integer)
    position_in_queue: Mapped[int | None] = mapped_column(Integer)
    runnable_since: Mapped[float | None] = mapped_column(Float)
    """When a RUNNABLE job last became RUNNABLE (the core's instant: its wait and starvation
    count from it); None in any other state."""
    pending_deadline: Mapped[float | None] = mapped_column(Float)
    """When a RUNNABLE job with a ``max_pending_seconds`` fails with ``PENDING_TIMEOUT`` if it is
    still waiting (the core's deadline: from ``runnable_since``, or from its plans' window for a
    list of plan entries only, kept across a capacity error); None without one or when not
    RUNNABLE. Written by the scheduler, read by the task log so it can say when the wait ends."""
    updated_at: Mapped[float] = mapped_column(Float, default=0.0)
    service_job_id: Mapped[str | None] = mapped_column(String(64))
    """The AWS Batch service job that runs it, when a delegating scheduler placed it on AWS Batch
    (``service/delegation.py``); None otherwise."""

    __table_args__ = (
        Index(
            "ux_quota_jobs_live_name",
            "name",
            unique=True,
            postgresql_where=text("state IN ('SUBMITTED','RUNNABLE','SCHEDULED','STARTING','RUNNING')"),
            sqlite_where=text("state IN ('SUBMITTED','RUNNABLE','SCHEDULED','STARTING','RUNNING')"),
        ),
        Index("ix_quota_jobs_share_state", "share", "state"),
        Index("ix_quota_jobs_dag", "dag_id"),
        Index("ix_quota_jobs_service_job_id", "service_job_id", unique=True),
        {"sqlite_autoincrement": True},
    )


class AttemptState(str, Enum):
    """Where an attempt stands, as stored in ``quota_attempts.status``: the scheduler's own
    steps (placed, not started, start failed, stopping), then what its backend reported."""

    PLACED = "PLACED"
    """Decided; the backend has not been told to start it yet."""
    NOT_STARTED = "NOT_STARTED"
    """Stopped before the backend was told to start it (a victim preempted in its own step)."""
    START_FAILED = "START_FAILED"
    """The backend refused to start it; the next poll reports it as a failed attempt."""
    STARTING = "STARTING"
    """Its start is asked of the backend (off the leader's step) and not yet done: it may run
    already, so a preemption or cancel now stops it rather than calling it never started."""
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    STOPPING = "STOPPING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"
    CAPACITY_ERROR = "CAPACITY_ERROR"


class Attempt(Base):
    """One placement of a job, with the backend action still to do (crash safety)."""

    __tablename__ = "quota_attempts"

    job_id: Mapped[int] = mapped_column(Id, ForeignKey("quota_jobs.id"), primary_key=True)
    number: Mapped[int] = mapped_column(Integer, primary_key=True)
    backend: Mapped[str] = mapped_column(String(32))
    instance_type: Mapped[str] = mapped_column(String(64))
    count: Mapped[int] = mapped_column(Integer)
    training_plan: Mapped[str | None] = mapped_column(String(128))
    borrowed: Mapped[int] = mapped_column(Integer, default=0)
    placed_at: Mapped[float] = mapped_column(Float)
    action: Mapped[str | None] = mapped_column(String(10))
    """START or STOP while the backend has not been told yet; None once it has."""
    stop_grace: Mapped[float] = mapped_column(Float, default=0.0)
    status: Mapped[str] = mapped_column(String(20), default=AttemptState.PLACED.value)
    """An ``AttemptState`` value."""
    running_since: Mapped[float | None] = mapped_column(Float)
    ended_at: Mapped[float | None] = mapped_column(Float)
    reason: Mapped[str | None] = mapped_column(Text)
    external_name: Mapped[str | None] = mapped_column(String(256))
    """Where the backend runs it, once started: the SageMaker training job's name."""
    external_arn: Mapped[str | None] = mapped_column(String(2048))
    """The SageMaker training job's ARN."""

    __table_args__ = (Index("ix_quota_attempts_open", "ended_at"),)


class TaskReport(Base):
    """What ``QuotaExecutor`` reports of the Airflow try that runs an attempt of a job of the
    ``airflow`` backend: the executor writes it, the backend's ``poll`` reads it. One row per
    attempt; ``status`` is an ``AttemptStatus`` value (PENDING until the executor reports, then
    RUNNING, SUCCEEDED, FAILED, STOPPED). The backend writes only the stop request."""

    __tablename__ = "quota_task_reports"

    job_id: Mapped[int] = mapped_column(Id, ForeignKey("quota_jobs.id"), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    status: Mapped[str] = mapped_column(String(20))
    reason: Mapped[str | None] = mapped_column(Text)
    running_since: Mapped[float | None] = mapped_column(Float)
    ended_at: Mapped[float | None] = mapped_column(Float)
    try_number: Mapped[int | None] = mapped_column(Integer)
    """The Airflow try that ran the attempt."""
    stop_requested_at: Mapped[float | None] = mapped_column(Float)
    """When the quota scheduler asked the backend to stop the attempt (``ExecutorBackend.stop``)."""
    stop_grace: Mapped[float | None] = mapped_column(Float)
    """The seconds it gives the try to checkpoint before it is stopped."""
    updated_at: Mapped[float] = mapped_column(Float)


class Preemption(Base):
    __tablename__ = "quota_preemptions"
    __table_args__ = {"sqlite_autoincrement": True}  # noqa: RUF012 - SQLAlchemy's API

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(Id, ForeignKey("quota_jobs.id"), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    at: Mapped[float] = mapped_column(Float)
    kind: Mapped[str] = mapped_column(String(20))
    by_job: Mapped[str] = mapped_column(String(128))
    lost_seconds: Mapped[float] = mapped_column(Float)


class AlertRow(Base):
    """An alert the core raised (once per job and kind), and its delivery to the notifiers.

    Delivery (``service/alerts.py``) claims an alert for a notifier before sending it and
    records the outcome after, so no notifier gets an alert twice, even across a crash.
    """

    __tablename__ = "quota_alerts"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    at: Mapped[float] = mapped_column(Float)
    job_id: Mapped[int] = mapped_column(Id, ForeignKey("quota_jobs.id"), index=True)
    job: Mapped[str] = mapped_column(String(128))
    share: Mapped[str] = mapped_column(String(128))
    kind: Mapped[str] = mapped_column(String(40))
    reason: Mapped[str] = mapped_column(Text)
    position: Mapped[int | None] = mapped_column(Integer)
    age_seconds: Mapped[float | None] = mapped_column(Float)
    """How long the job had been RUNNABLE (STARVING alerts)."""
    notified: Mapped[bool] = mapped_column(Boolean, default=False)
    """Every notifier it was meant for got it."""
    notified_at: Mapped[float | None] = mapped_column(Float)
    """When delivery ended (sent everywhere, or given up somewhere); None while it goes on."""
    deliveries: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    """Per notifier name: ``{"state": SENDING | SENT | FAILED | GAVE_UP | UNKNOWN, "attempts",
    "next_at", "error", "at"}``."""

    __table_args__ = (Index("ix_quota_alerts_undelivered", "notified_at"), {"sqlite_autoincrement": True})


class EventRow(Base):
    """The decision log, one row per decision, in the order they were made."""

    __tablename__ = "quota_events"
    __table_args__ = {"sqlite_autoincrement": True}  # noqa: RUF012 - SQLAlchemy's API

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    at: Mapped[float] = mapped_column(Float)
    type: Mapped[str] = mapped_column(String(30))
    job: Mapped[str] = mapped_column(String(128), index=True)
    job_id: Mapped[int | None] = mapped_column(Id, index=True)
    """The job's id (names are reused once a job is final); the refused submission's for REJECTED."""
    share: Mapped[str] = mapped_column(String(128))
    record: Mapped[dict[str, Any]]
    line: Mapped[str] = mapped_column(Text)
    leader_epoch: Mapped[int | None] = mapped_column(Integer, nullable=True)
    """The lease epoch of the leader that committed it (``store/lock.py``): an audit that no
    stale leader committed decisions; None when recorded without the lease (``step`` alone)."""
    input_id: Mapped[int | None] = mapped_column(Id, nullable=True)
    """The input (``quota_inputs``) that caused the decision: a submission, a report, a change,
    a cycle. None for a refusal (a refused input is not logged) and for decisions recorded
    before migration 0018. The input itself may since have been pruned (retention)."""


class Input(Base):
    """Everything fed to the core, in order: replaying it rebuilds the scheduler's state."""

    __tablename__ = "quota_inputs"
    __table_args__ = {"sqlite_autoincrement": True}  # noqa: RUF012 - SQLAlchemy's API

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    at: Mapped[float] = mapped_column(Float)
    kind: Mapped[str] = mapped_column(String(20))
    payload: Mapped[dict[str, Any]]


class Snapshot(Base):
    """The core's state after the input of id ``last_input_id``, written by the leader
    (``service/snapshots.py``): recovery loads the newest one that loads and replays only the
    inputs after it. ``format`` is the encoding's version (``core/snapshot.py``); ``checksum``
    the SHA-256 of ``payload``, so a damaged row is told apart from an older format."""

    __tablename__ = "quota_snapshots"
    __table_args__ = {"sqlite_autoincrement": True}  # noqa: RUF012 - SQLAlchemy's API

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    last_input_id: Mapped[int] = mapped_column(Id, index=True)
    taken_at: Mapped[float] = mapped_column(Float)
    format: Mapped[int] = mapped_column(Integer)
    checksum: Mapped[str] = mapped_column(String(64))
    size: Mapped[int] = mapped_column(Integer)
    """The payload's length in bytes (compressed)."""
    jobs: Mapped[int] = mapped_column(Integer)
    """The jobs the state holds (the live ones: finished jobs live on in ``quota_jobs`` only)."""
    payload: Mapped[bytes] = mapped_column(LargeBinary)
    leader_epoch: Mapped[int | None] = mapped_column(Integer, nullable=True)


class ForecastRow(Base):
    """A live job's forecast (``sim/forecast.py``): for a waiting job, when it is expected to
    start and how; for a job holding capacity, when it is expected to end. Rewritten whole by
    the quota scheduler's forecast refresh (``service/forecasts.py``) after changes, off the
    scheduling path; advisory, so no foreign key holds a job's row back from retention.
    Instants are the core's seconds, as ``quota_jobs.submitted_at``."""

    __tablename__ = "quota_forecasts"

    job_id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=False)
    made_at: Mapped[float] = mapped_column(Float)
    start: Mapped[float | None] = mapped_column(Float)
    """The median expected start; None when none can be given (``reason`` says why)."""
    low: Mapped[float | None] = mapped_column(Float)
    high: Mapped[float | None] = mapped_column(Float)
    """The 10-90% range of the start; ``high`` None: beyond the forecast's horizon."""
    end: Mapped[float | None] = mapped_column(Float)
    """For a job holding capacity: its expected end (``low`` and ``high`` its range)."""
    instance_type: Mapped[str | None] = mapped_column(String(64))
    count: Mapped[int | None] = mapped_column(Integer)
    borrowed: Mapped[int] = mapped_column(Integer, default=0)
    preempts: Mapped[bool] = mapped_column(Boolean, default=False)
    must_borrow: Mapped[int] = mapped_column(Integer, default=0)
    """Instances its expected entry asks above its share's limit, all lent at once."""
    source: Mapped[str] = mapped_column(String(32))
    """Where the job's own runtime estimate came from (``EstimateSource``)."""
    reason: Mapped[str | None] = mapped_column(Text)


class ShareViewRow(Base):
    """The read model of one share (``core.visibility.share_view``), written by the leader in
    the transaction of each commit that changed it (``store/views.py``)."""

    __tablename__ = "quota_share_views"

    share: Mapped[str] = mapped_column(String(128), primary_key=True)
    position: Mapped[int] = mapped_column(Integer)
    """Its place in the configuration's list of shares."""
    strategy: Mapped[str] = mapped_column(String(20))
    state: Mapped[str] = mapped_column(String(20))
    borrow_limit: Mapped[int | None] = mapped_column(Integer)
    in_share_preemption: Mapped[bool] = mapped_column(Boolean)
    in_share_preemption_after_seconds: Mapped[float | None] = mapped_column(Float)
    max_priority: Mapped[int] = mapped_column(Integer)
    running: Mapped[int] = mapped_column(Integer)
    runnable: Mapped[int] = mapped_column(Integer)
    oldest_runnable_since: Mapped[float | None] = mapped_column(Float)
    """When its longest-waiting RUNNABLE job became RUNNABLE; None when none waits."""
    starvation_threshold_seconds: Mapped[float | None] = mapped_column(Float)
    """Its starvation threshold now (docs/model.md rule 8.2); None in a row a quota scheduler
    wrote before migration 0021 (the leader writes every row afresh when it starts)."""
    normal_wait_seconds: Mapped[float | None] = mapped_column(Float)
    """Its normal wait the threshold is drawn from; None when fixed or not known yet."""
    starvation_fixed: Mapped[bool] = mapped_column(Boolean, server_default=false())
    """Whether the threshold is its ``starvation_after_seconds``."""
    starvation_multiple: Mapped[float | None] = mapped_column(Float)
    """Its ``starvation_multiple``; None when the threshold is fixed."""
    computed_at: Mapped[float] = mapped_column(Float)
    """The commit that computed the view (it has not changed since: the leader rewrites it at
    every commit that changes it)."""


class ShareTypeViewRow(Base):
    """The read model of one share's use of one instance type (``core.visibility.share_view``)."""

    __tablename__ = "quota_share_type_views"

    share: Mapped[str] = mapped_column(String(128), primary_key=True)
    instance_type: Mapped[str] = mapped_column(String(64), primary_key=True)
    gpus_per_instance: Mapped[int] = mapped_column(Integer)
    capacity: Mapped[int] = mapped_column(Integer)
    limit: Mapped[int] = mapped_column(Integer)
    used: Mapped[int] = mapped_column(Integer)
    borrowed: Mapped[int] = mapped_column(Integer)
    lent: Mapped[float] = mapped_column(Float)
    idle: Mapped[int] = mapped_column(Integer)
    runnable: Mapped[int] = mapped_column(Integer)
    oldest_runnable_since: Mapped[float | None] = mapped_column(Float)


class PlaceableViewRow(Base):
    """The read model of what a new job of a share could be placed on now, per instance type
    and source (``core.visibility.most_placeable``): what ``QuotaHook.can_place_now`` reads."""

    __tablename__ = "quota_placeable_views"

    share: Mapped[str] = mapped_column(String(128), primary_key=True)
    instance_type: Mapped[str] = mapped_column(String(64), primary_key=True)
    training_plan: Mapped[str] = mapped_column(String(128), primary_key=True)
    """The plan's name; empty for on-demand capacity."""
    most: Mapped[int] = mapped_column(Integer)
    """The most instances a new job of the share could be placed on now without preemption."""
    blocked_by: Mapped[str | None] = mapped_column(String(80))
    """Why one more could not (a ``core.quota.Block`` value)."""


class Leader(Base):
    """The leader lease (``store/lock.py``): who leads, until when, and the fencing epoch.

    ``expires_at`` is in the database's clock (epoch seconds). ``epoch`` grows by one at every
    takeover; the leader's decision transactions update this row ``WHERE epoch = <its epoch>``,
    so a leader that lost the lease (frozen, then resumed) commits nothing. ``holder_pid`` is the
    PostgreSQL backend pid of the leader's lease connection: when it is gone from
    ``pg_stat_activity`` (the leader died), a standby takes over without waiting for the lease.
    """

    __tablename__ = "quota_leader"

    name: Mapped[str] = mapped_column(String(40), primary_key=True)
    holder: Mapped[str] = mapped_column(String(200))
    expires_at: Mapped[float] = mapped_column(Float)
    epoch: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    holder_pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    heartbeat_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    """When the leader last renewed the lease (the database's clock): its heartbeat."""
    heartbeat_seconds: Mapped[float | None] = mapped_column(Float, nullable=True)
    """How often the leader beats (a quarter of its lease); silent for 3x this: no scheduler runs."""
    backends: Mapped[str | None] = mapped_column(String(200), nullable=True)
    """The backends the holder runs, comma-separated (written when it takes the lease); None: a
    scheduler from before this column. ``airflow-quota doctor`` checks the live jobs' backends."""


class ShareHour(Base):
    """One hour of one share's history, kept for ever while the rows it sums are pruned
    (``store/retention.py``): what the Quotas page's chart and the share totals read for the
    past that retention has compacted.

    Two kinds of figure, filled at two moments. The *usage* integrals (GPU-seconds held,
    borrowed, and guaranteed by the limit) are written when the hour is compacted, from every
    attempt that overlapped it, before any of them may be pruned: an hour below
    ``RetentionState.compacted_until`` is read from here only. The *job* totals (jobs ended,
    their GPU-hours, lost GPU-hours, cost, preemptions and waits) are added in the transaction
    that deletes those jobs, in the hour each job ended, so a job counts exactly once: in
    ``quota_jobs`` until its prune, here after it."""

    __tablename__ = "quota_share_hours"

    hour: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    """The hour's first second (epoch seconds, a multiple of 3600); first in the key, so that
    retention's reads of a range of hours go by the key."""
    share: Mapped[str] = mapped_column(String(128), primary_key=True)
    used_gpu_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    borrowed_gpu_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    limit_gpu_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    jobs_pruned: Mapped[int] = mapped_column(Integer, default=0)
    """Jobs that ended in this hour and were pruned since (SUCCEEDED and FAILED)."""
    jobs_succeeded: Mapped[int] = mapped_column(Integer, default=0)
    gpu_hours: Mapped[float] = mapped_column(Float, default=0.0)
    lost_gpu_hours: Mapped[float] = mapped_column(Float, default=0.0)
    cost: Mapped[float] = mapped_column(Float, default=0.0)
    preemptions: Mapped[int] = mapped_column(Integer, default=0)
    wait_seconds: Mapped[float] = mapped_column(Float, default=0.0)


RETENTION_ROW = "retention"
"""The ``name`` of ``quota_retention``'s one row."""


class RetentionState(Base):
    """Where retention stands: one row (``name`` "retention"). Every prune batch, the leader's
    or ``airflow-quota db prune``'s, first updates it, so two pruners take turns (a row lock on
    PostgreSQL, the write lock on SQLite) and never count a job into ``quota_share_hours`` twice."""

    __tablename__ = "quota_retention"

    name: Mapped[str] = mapped_column(String(20), primary_key=True)
    compacted_until: Mapped[float | None] = mapped_column(Float, nullable=True)
    """Every hour before this instant is in ``quota_share_hours``; None: none yet."""
    first_placed_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    """The first placement ever, kept once its attempt may be pruned (the chart's default start)."""
    pruned_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    """When the last batch ran."""
    inputs_pruned_through: Mapped[int | None] = mapped_column(Id, nullable=True)
    """The newest input pruned; None: the input log is whole (it alone rebuilds the state)."""


Index(
    "ix_quota_jobs_finished",
    JobRow.updated_at,
    postgresql_where=text("state IN ('SUCCEEDED','FAILED')"),
    sqlite_where=text("state IN ('SUCCEEDED','FAILED')"),
)
"""The finished jobs by when they ended (their last write): what retention looks for."""
Index("ix_quota_attempts_placed", Attempt.placed_at)
"""Attempts by placement: the hours retention compacts read the attempts placed before their end."""
Index("ix_quota_requests_job", Request.job_id)
"""A job's requests: retention keeps a job with one not taken in, and prunes the others with it."""
UNATTACHED_EVENTS = "job_id IS NULL OR type = 'REJECTED'"
"""The decisions that may outlive their job: refusals (a refused submission's job row goes at
the refusal) and decisions about no job. Every other decision goes with its job's prune."""
REFUSED_REQUESTS = "handled AND kind <> 'config' AND (job_id IS NULL OR outcome = 'refused')"
"""The requests taken in that may outlive their job (a configuration's stays with its version)."""
Index(
    "ix_quota_events_unattached",
    EventRow.at,
    postgresql_where=text(UNATTACHED_EVENTS),
    sqlite_where=text(UNATTACHED_EVENTS),
)
"""Retention's search for decisions of no job before its cutoff reads only these, by instant:
never the entries of the decisions pruned with their jobs (an index on every decision's instant
made the first search after a backlog walk them all)."""
Index(
    "ix_quota_requests_refused",
    Request.created_at,
    postgresql_where=text(REFUSED_REQUESTS),
    sqlite_where=text(REFUSED_REQUESTS),
)
"""The same for requests of no job."""
