"""Retention: what the quota database forgets, and when (issue 39).

Finished jobs (SUCCEEDED, FAILED) that ended more than ``retention_days`` ago are pruned with
their attempts, task reports, preemptions, decisions (``quota_events``), delivered alerts and
the inbox requests taken in that refer to them; so are the inputs (``quota_inputs``) older than
the cutoff that a snapshot covers (those up to the older of the two newest snapshots'
``last_input_id``: recovery needs only the newest snapshot that loads and the inputs after it),
and the snapshots older than those two. Never pruned: a live job's rows, an alert not yet
delivered, a job with a backend action pending or an attempt not ended, a job with a request
not yet taken in, configuration versions, inputs without two snapshots after them.

The history the Quotas page and the share totals show survives as per-hour, per-share
aggregates (``quota_share_hours``, never pruned): an hour is *compacted* (its GPU-seconds used,
borrowed and guaranteed, from every attempt that overlapped it) before any attempt that held
capacity in it may go, and a pruned job's totals (GPU-hours, lost GPU-hours, cost, preemptions,
wait) are added to the hour it ended in, in the transaction that deletes it.

The work goes in *batches*, each one short transaction of one kind (compact at most
``BatchLimits.hours`` hours, or prune at most ``BatchLimits.jobs`` jobs, or at most
``BatchLimits.inputs`` inputs, or at most ``BatchLimits.orphans`` decisions and requests of no
job), so a batch holds the leader's step for milliseconds (``benchmarks/prune.py``). The limits
are a ceiling: whoever runs the batches tells ``Retention.held`` how long each one's transaction
held, and the next batch takes a share of the limits sized to stay within
``BATCH_BUDGET_SECONDS`` (``BatchSize``), since the same limits cost more on a larger or busier
database. Every batch first updates ``quota_retention``'s row, so two pruners (the leader,
``airflow-quota db prune``) take turns. ``plan`` counts what the batches would remove, writing
nothing.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from sqlalchemy import ColumnElement, Select, TextClause, delete, exists, func, insert, or_, select, text, update
from sqlalchemy.orm import Session

from airflow_quota.core.config import QuotaConfig
from airflow_quota.core.human_time import clock_time
from airflow_quota.core.model import FINAL_STATES
from airflow_quota.store.dashboard import (
    HOUR,
    Held,
    configuration_history,
    held_between,
    hourly_integrals,
    usage_points,
)
from airflow_quota.store.models import (
    REFUSED_REQUESTS,
    RETENTION_ROW,
    UNATTACHED_EVENTS,
    AlertRow,
    Attempt,
    ConfigVersion,
    EventRow,
    Input,
    JobRow,
    Preemption,
    Request,
    RetentionState,
    ShareHour,
    Snapshot,
    TaskReport,
)

DAY = 86400.0
FINISHED = sorted(FINAL_STATES)


@dataclass(frozen=True, slots=True)
class BatchLimits:
    """The most one batch does (``BatchSize`` takes a share of it when batches run slow): each
    kind of batch stays well under 50 ms on PostgreSQL with hundreds of thousands of rows
    (``benchmarks/prune.py`` measures the longest)."""

    jobs: int = 100
    """Finished jobs per batch (with their attempts, decisions, ...: about 10 rows each)."""
    inputs: int = 2000
    """Inputs per batch (one indexed range of small rows)."""
    hours: int = 48
    """Hours compacted per batch at most (every attempt overlapping them is read)."""
    attempts: int = 1000
    """Placements a compaction batch reads at most (it ends at an earlier hour when there are
    more; an hour with more than this is compacted whole)."""
    orphans: int = 500
    """Decisions and requests of no job (refused submissions) per batch."""
    snapshots: int = 5
    """Snapshots older than the two newest per batch (each a large payload)."""


BATCH_BUDGET_SECONDS = 0.025
"""How long one batch's transaction may hold the leader's step: a batch that held longer halves
the next one's limits. Half the target of 50 ms (issue 39), so that a batch sized after a fast
one stays under the target when it meets a slower stretch of the tables."""
SMALLEST_SHARE = 1 / 32
"""The floor: batches never shrink below this share of their limits (at the defaults 4 jobs, 63
inputs, 2 hours or 32 placements, 16 orphans), so a backlog still goes when every batch is slow."""
GROWTH = 1.25
"""How much the share grows after a batch that held less than half the budget (slowly: after a
halving, about three fast batches win it back)."""


@dataclass(slots=True)
class BatchSize:
    """The share of ``BatchLimits`` the next batch takes, from how long the last ones held: halved
    after a batch that held longer than ``budget``, grown by ``GROWTH`` after one that held less
    than half of it, kept between ``SMALLEST_SHARE`` and 1 (the limits themselves: the ceiling)."""

    budget: float = BATCH_BUDGET_SECONDS
    """Seconds a batch's transaction may hold (``math.inf``: the limits as they are, always)."""
    share: float = 1.0
    """The share of the limits the next batch takes."""

    def held(self, seconds: float) -> None:
        """Size the next batch after one whose transaction held ``seconds``."""
        if seconds > self.budget:
            self.share = max(SMALLEST_SHARE, self.share / 2)
        elif seconds < self.budget / 2:
            self.share = min(1.0, self.share * GROWTH)

    def of(self, limits: BatchLimits) -> BatchLimits:
        """``limits`` scaled by the share, each at least 1."""
        scaled = {f.name: max(1, math.ceil(getattr(limits, f.name) * self.share)) for f in fields(limits)}
        return replace(limits, **scaled)


@dataclass(slots=True)
class Removed:
    """Rows removed per table (or that would be, for ``plan``), and hours compacted."""

    jobs: int = 0
    attempts: int = 0
    task_reports: int = 0
    preemptions: int = 0
    alerts: int = 0
    events: int = 0
    requests: int = 0
    inputs: int = 0
    snapshots: int = 0
    hours_compacted: int = 0

    def rows(self) -> int:
        """Rows removed, all tables together (compacted hours are not rows removed)."""
        return sum(getattr(self, f.name) for f in fields(self) if f.name != "hours_compacted")

    def __bool__(self) -> bool:
        return self.rows() > 0 or self.hours_compacted > 0

    def add(self, other: Removed) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def words(self) -> str:
        """What was removed, for a log line: the tables with rows, in order."""
        parts = [f"{count} {name.replace('_', ' ')}" for name, count in self.as_dict().items() if count]
        return ", ".join(parts) if parts else "nothing"


@dataclass(frozen=True, slots=True)
class Plan:
    """What a prune at ``now`` would do (``Retention.plan``)."""

    now: float
    cutoff: float | None
    """Finished jobs that ended before this instant go; None: retention 0, nothing goes."""
    removed: Removed
    oldest_kept_job: float | None
    """When the oldest job that stays was submitted; None: no job stays."""
    oldest_kept_input: float | None
    """The instant of the oldest input that stays; None: no input stays."""
    compacted_until: float | None
    """Hours before this instant are (or will be, by the prune) in ``quota_share_hours``."""


@dataclass(frozen=True, slots=True)
class Batch:
    """One batch: what it removed, its kind, and how long its transaction's work took."""

    kind: str
    """compact | jobs | inputs | orphans | none"""
    removed: Removed
    cutoff: float
    seconds: float

    def line(self) -> str:
        """The batch in one log line: what went, and the cutoff."""
        before = clock_time(self.cutoff)
        if self.kind == "compact":
            what = f"compacted {self.removed.hours_compacted} hours of share history into quota_share_hours"
        else:
            what = f"pruned {self.removed.words()}"
        return f"retention: {what} (cutoff {before}: ended before it) in {self.seconds * 1000:.1f} ms"


def cutoff_of(now: float, retention_days: float) -> float | None:
    """Jobs and inputs before this instant may go; None when retention keeps everything (0)."""
    return None if retention_days <= 0 else now - retention_days * DAY


@dataclass
class Retention:
    """Prunes by ``retention_days`` in batches of at most ``limits`` (see the module docstring)."""

    retention_days: float
    limits: BatchLimits = field(default_factory=BatchLimits)
    """The most a batch does; the next batch does ``size.of(limits)``."""
    size: BatchSize = field(default_factory=BatchSize)
    """The share of ``limits`` the next batch takes, from how long the last ones held."""
    _configs: tuple[tuple[int, int], list[tuple[float, QuotaConfig]]] | None = None
    """The configuration versions as parsed, kept until a version is added."""

    # -- one batch -----------------------------------------------------------------------

    def batch(self, session: Session, now: float) -> Batch:
        """One batch of at most ``size.of(limits)`` in the caller's transaction (the leader
        fences it first): the first kind of work there is, in this order: jobs (those whose hours
        are compacted), compact, inputs and snapshots, orphans. Jobs go before compacting on, so
        that over a long backlog the attempts a compaction reads stay few (those it compacted
        have gone). The caller reports how long the transaction held (``held``)."""
        started = time.perf_counter()
        cutoff = cutoff_of(now, self.retention_days)
        if cutoff is None:
            return Batch("none", Removed(), now, 0.0)
        limits = self.size.of(self.limits)
        _short_transaction(session)
        state = _take_turn(session, now)
        target = _hour(cutoff)
        start = self._history_start(session, state, target)
        compacted = target if start is None else start
        kind, removed = "jobs", self._prune_jobs(session, cutoff, compacted, limits)
        if not removed and start is not None and start < target:
            end = self._window_end(session, start, target, limits)
            kind, removed = "compact", self._compact(session, state, start, end)
        if not removed:
            kind, removed = "inputs", self._prune_inputs(session, state, cutoff, limits)
        if not removed:
            kind, removed = "orphans", self._prune_orphans(session, cutoff, limits)
        if not removed:
            kind = "none"
        return Batch(kind, removed, cutoff, time.perf_counter() - started)

    def _history_start(self, session: Session, state: RetentionState, target: float) -> float | None:
        """The first hour not compacted yet: where compaction goes on, or, the first time, the
        hour of the first placement or configuration version. None: nothing before ``target``
        needs compacting (the watermark moves up to it without work)."""
        if state.compacted_until is not None:
            return state.compacted_until
        firsts = [
            session.scalar(select(func.min(Attempt.placed_at))),
            session.scalar(select(func.min(ConfigVersion.created_at))),
        ]
        known = [float(value) for value in firsts if value is not None]
        if not known or min(known) >= target:
            state.compacted_until = target  # nothing happened before the cutoff's hour
            return None
        return _hour(min(known))

    def _window_end(self, session: Session, start: float, target: float, limits: BatchLimits) -> float:
        """Where a compaction from ``start`` stops: ``target``, at most ``limits.hours`` hours on,
        and before the hour of the ``limits.attempts``-th placement from ``start`` (at least one
        hour in all)."""
        end = min(target, start + limits.hours * HOUR)
        beyond = session.scalar(
            select(Attempt.placed_at)
            .where(Attempt.placed_at >= start, Attempt.placed_at < end)
            .order_by(Attempt.placed_at)
            .offset(limits.attempts)
            .limit(1)
        )
        if beyond is not None:
            end = max(start + HOUR, _hour(beyond))
        return end

    def _compact(self, session: Session, state: RetentionState, start: float, end: float) -> Removed:
        """Write the hours ``[start, end)`` of every share into ``quota_share_hours`` (added to a
        pruned job's totals already there), then move ``compacted_until`` to ``end``."""
        if state.first_placed_at is None:
            state.first_placed_at = session.scalar(select(func.min(Attempt.placed_at)))
        versions = self._versions(session)
        holds: dict[str, list[Held]] = {}
        for share, held in held_between(session, None, start, end):
            holds.setdefault(share, []).append(held)
        shares = set(holds) | {s.name for _, config in versions for s in config.shares}
        first, last = int(start), int(end)
        existing = {
            (row.share, row.hour): row
            for row in session.scalars(select(ShareHour).where(ShareHour.hour >= first, ShareHour.hour < last))
        }
        new: list[dict[str, Any]] = []
        for share in sorted(shares):
            points = usage_points(versions, holds.get(share, []), share, start, end) if versions else []
            for hour, (used, borrowed, limit) in hourly_integrals(points, first, last).items():
                row = existing.get((share, hour))
                if row is not None:
                    row.used_gpu_seconds, row.borrowed_gpu_seconds, row.limit_gpu_seconds = used, borrowed, limit
                elif used or borrowed or limit:
                    new.append(
                        _share_hour(
                            share, hour, used_gpu_seconds=used, borrowed_gpu_seconds=borrowed, limit_gpu_seconds=limit
                        )
                    )
        if new:
            session.execute(insert(ShareHour), new)
        state.compacted_until = end
        return Removed(hours_compacted=int((end - start) // HOUR))

    def _versions(self, session: Session) -> list[tuple[float, QuotaConfig]]:
        """The configuration history, parsed once per version added."""
        key_row = session.execute(select(func.count(), func.max(ConfigVersion.id))).one()
        key = (int(key_row[0] or 0), int(key_row[1] or 0))
        if self._configs is None or self._configs[0] != key:
            self._configs = (key, configuration_history(session))
        return self._configs[1]

    def _prune_jobs(self, session: Session, cutoff: float, compacted_until: float, limits: BatchLimits) -> Removed:
        """Delete at most ``limits.jobs`` prunable jobs with their rows; add their totals to the
        hours they ended in."""
        jobs = session.execute(
            _prunable_jobs(cutoff, compacted_until)
            .with_only_columns(
                JobRow.id,
                JobRow.share,
                JobRow.state,
                JobRow.updated_at,
                JobRow.gpu_hours,
                JobRow.lost_gpu_hours,
                JobRow.cost,
                JobRow.preemptions,
                JobRow.wait_seconds,
            )
            .order_by(JobRow.updated_at, JobRow.id)
            .limit(limits.jobs)
        ).all()
        if not jobs:
            return Removed()
        ids = [job.id for job in jobs]
        removed = Removed(jobs=len(ids))
        for name, model in _CHILDREN:
            setattr(removed, name, _count_deleted(session, delete(model).where(model.job_id.in_(ids))))
        removed.requests = _count_deleted(
            session, delete(Request).where(Request.job_id.in_(ids), Request.handled.is_(True))
        )
        sums: dict[tuple[str, int], dict[str, float]] = {}
        for job in jobs:
            totals = sums.setdefault((job.share, int(_hour(job.updated_at))), dict.fromkeys(_JOB_TOTALS, 0.0))
            totals["jobs_pruned"] += 1
            totals["jobs_succeeded"] += job.state == "SUCCEEDED"
            for column in ("gpu_hours", "lost_gpu_hours", "cost", "preemptions", "wait_seconds"):
                totals[column] += float(getattr(job, column) or 0.0)
        _add_totals(session, sums)
        _count_deleted(session, delete(JobRow).where(JobRow.id.in_(ids)))
        return removed

    def _prune_inputs(self, session: Session, state: RetentionState, cutoff: float, limits: BatchLimits) -> Removed:
        """Delete at most ``limits.inputs`` inputs the older of the two newest snapshots covers
        and that came before the cutoff, and at most ``limits.snapshots`` older snapshots. The
        last input removed is recorded (``inputs_pruned_through``): from then on the log alone
        no longer rebuilds the state, and recovery knows it (``service/snapshots.py``)."""
        bound = _covered(session)
        if bound is None:
            return Removed()
        older_snapshot, last_input_id = bound
        ids = select(Input.id).where(Input.id <= last_input_id, Input.at < cutoff).order_by(Input.id)
        batch = ids.limit(limits.inputs).subquery()
        through = session.scalar(select(func.max(batch.c.id)))
        inputs = 0
        if through is not None:  # the batch is the range up to it: "id IN (the batch)" reads the whole log
            inputs = _count_deleted(session, delete(Input).where(Input.id <= through, Input.at < cutoff))
        if inputs and through is not None:
            state.inputs_pruned_through = max(int(through), state.inputs_pruned_through or 0)
        old = select(Snapshot.id).where(Snapshot.id < older_snapshot).order_by(Snapshot.id).limit(limits.snapshots)
        snapshots = _count_deleted(session, delete(Snapshot).where(Snapshot.id.in_(old.scalar_subquery())))
        return Removed(inputs=inputs, snapshots=snapshots)

    def _prune_orphans(self, session: Session, cutoff: float, limits: BatchLimits) -> Removed:
        """Delete at most ``limits.orphans`` decisions and requests of no job (refused
        submissions: their job row went at the refusal) older than the cutoff."""
        # oldest first, by the instants' indexes: what is left before the cutoff, not the whole log
        events = select(EventRow.id).where(*_orphan_events(cutoff)).order_by(EventRow.at).limit(limits.orphans)
        requests = (
            select(Request.id).where(*_orphan_requests(cutoff)).order_by(Request.created_at).limit(limits.orphans)
        )
        return Removed(
            events=_count_deleted(session, delete(EventRow).where(EventRow.id.in_(events.scalar_subquery()))),
            requests=_count_deleted(session, delete(Request).where(Request.id.in_(requests.scalar_subquery()))),
        )

    # -- what would go -------------------------------------------------------------------

    def plan(self, session: Session, now: float) -> Plan:
        """What pruning at ``now`` until nothing is left would remove, counted per table
        without writing anything; and the oldest job and input that would stay."""
        cutoff = cutoff_of(now, self.retention_days)
        state = session.get(RetentionState, RETENTION_ROW)
        compacted = state.compacted_until if state is not None else None
        if cutoff is None:
            return Plan(now, None, Removed(), _oldest_job(session, None), _oldest_input(session, None), compacted)
        target = _hour(cutoff)
        compacted_until = max(compacted or target, target)
        hours = 0
        if compacted is not None and compacted < target:
            hours = int((target - compacted) // HOUR)
        elif compacted is None:
            with session.no_autoflush:
                first = [
                    session.scalar(select(func.min(Attempt.placed_at))),
                    session.scalar(select(func.min(ConfigVersion.created_at))),
                ]
            known = [float(value) for value in first if value is not None]
            if known and min(known) < target:
                hours = int((target - _hour(min(known))) // HOUR)
        jobs = _prunable_jobs(cutoff, compacted_until).with_only_columns(JobRow.id)
        ids = jobs.scalar_subquery()
        removed = Removed(hours_compacted=hours)
        removed.jobs = _count(session, jobs)
        for name, model in _CHILDREN:
            setattr(removed, name, _count(session, select(model).where(model.job_id.in_(ids))))
        removed.requests = _count(session, select(Request).where(Request.job_id.in_(ids), Request.handled.is_(True)))
        removed.events += _count(session, select(EventRow).where(*_orphan_events(cutoff)))
        removed.requests += _count(session, select(Request).where(*_orphan_requests(cutoff)))
        bound = _covered(session)
        bound_input = None
        if bound is not None:
            older_snapshot, bound_input = bound
            removed.inputs = _count(session, select(Input).where(Input.id <= bound_input, Input.at < cutoff))
            removed.snapshots = _count(session, select(Snapshot).where(Snapshot.id < older_snapshot))
        return Plan(
            now,
            cutoff,
            removed,
            _oldest_job(session, jobs),
            _oldest_input(session, None if bound_input is None else (bound_input, cutoff)),
            compacted_until,
        )

    def held(self, batch: Batch, seconds: float) -> None:
        """Size the next batch after ``batch``, whose transaction held ``seconds`` from its start
        to its commit. A batch that found nothing says nothing about the size (its time is the
        looking, whatever the limits)."""
        if batch.kind != "none":
            self.size.held(seconds)

    # -- until done ----------------------------------------------------------------------

    def batches(
        self, transaction: Callable[[], Any], now: float, fence: Callable[[Session], None] | None = None
    ) -> Iterator[Batch]:
        """Run batches, each in its own transaction (``transaction()``: a session context whose
        ``begin()`` commits), until one finds nothing to do; yields each batch once committed,
        with ``seconds`` the whole transaction's hold (that sizes the next batch)."""
        while True:
            started = time.perf_counter()
            with transaction() as session, session.begin():
                if fence is not None:
                    fence(session)
                batch = self.batch(session, now)
            batch = replace(batch, seconds=time.perf_counter() - started)
            if batch.kind == "none":
                return
            self.held(batch, batch.seconds)
            yield batch


_CHILDREN: Sequence[tuple[str, Any]] = (
    ("task_reports", TaskReport),
    ("attempts", Attempt),
    ("preemptions", Preemption),
    ("alerts", AlertRow),
    ("events", EventRow),
)
"""The rows of a job that go with it (``Removed``'s field, model), its children first."""

_JOB_TOTALS = ("jobs_pruned", "jobs_succeeded", "gpu_hours", "lost_gpu_hours", "cost", "preemptions", "wait_seconds")
_USAGE = ("used_gpu_seconds", "borrowed_gpu_seconds", "limit_gpu_seconds")


def _hour(instant: float) -> float:
    """The first second of the hour ``instant`` falls in."""
    return float(int(instant // HOUR) * HOUR)


def _short_transaction(session: Session) -> None:
    """PostgreSQL, for the batch's transaction: no JIT compilation (its statements are bounded
    and short, but with statistics not yet updated after a large prune the planner's costs pass
    ``jit_above_cost`` and compiling alone takes 10-30 ms), and a commit that does not wait for
    its WAL to reach the disk (``synchronous_commit``), whose flush on a busy disk held a batch
    for tens of milliseconds. A batch commits whole or not at all either way; a crash may lose
    the last batches' work (the rows come back), which the next batches do again."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SET LOCAL jit = off"))
        session.execute(text("SET LOCAL synchronous_commit = off"))


def _take_turn(session: Session, now: float) -> RetentionState:
    """Update retention's row first thing in the batch's transaction (one pruner at a time),
    creating it in a database where it is missing; returns it."""
    taken = session.execute(
        update(RetentionState).where(RetentionState.name == RETENTION_ROW).values(pruned_at=now),
        execution_options={"synchronize_session": False},
    )
    if not taken.rowcount:  # type: ignore[attr-defined]
        session.add(RetentionState(name=RETENTION_ROW, pruned_at=now))
        session.flush()
    state = session.get(RetentionState, RETENTION_ROW, populate_existing=True)
    assert state is not None
    return state


def _prunable_jobs(cutoff: float, compacted_until: float) -> Select[Any]:
    """Finished jobs that ended before ``cutoff`` and before ``compacted_until`` (their hours
    compacted), with every attempt ended before it and no backend action pending, no alert not
    yet delivered and no request not yet taken in."""
    attempt_open = (
        select(Attempt.job_id)
        .where(
            Attempt.job_id == JobRow.id,
            or_(Attempt.action.is_not(None), Attempt.ended_at.is_(None), Attempt.ended_at >= compacted_until),
        )
        .offset(0)  # each candidate's attempts by its key: see below
        .exists()
    )
    # Without the OFFSET, PostgreSQL turns "no such attempt" into an anti join and, since most
    # attempts (other jobs', later) match the condition, hashes every attempt of the table first:
    # 20-50 ms at 100,000 jobs, in every batch (benchmarks/prune.py). A subquery with an OFFSET
    # is not turned into a join: it is checked per candidate job, by the attempts' primary key.
    undelivered = select(AlertRow.id).where(AlertRow.job_id == JobRow.id, AlertRow.notified_at.is_(None)).exists()
    waiting = select(Request.id).where(Request.job_id == JobRow.id, Request.handled.is_(False)).exists()
    ended_before = min(cutoff, compacted_until)  # its hour compacted: the index's range holds only candidates
    return select(JobRow).where(
        JobRow.state.in_(FINISHED), JobRow.updated_at < ended_before, ~attempt_open, ~undelivered, ~waiting
    )


def _orphan_events(cutoff: float) -> list[ColumnElement[bool] | TextClause]:
    """Decisions before the cutoff about no job stored (refused submissions). Only refusals and
    decisions of no job can be (``UNATTACHED_EVENTS``: the rest go with their jobs), and the
    condition says so, for the partial index that holds just those."""
    return [
        EventRow.at < cutoff,
        text(f"({UNATTACHED_EVENTS})"),  # in brackets: it is ANDed with the rest
        or_(EventRow.job_id.is_(None), ~exists().where(JobRow.id == EventRow.job_id)),
    ]


def _orphan_requests(cutoff: float) -> list[ColumnElement[bool] | TextClause]:
    """Requests taken in before the cutoff about no job stored (refused submissions); never a
    configuration's (its version stays). Only refused ones and those of no job can be
    (``REFUSED_REQUESTS``: the others go with their jobs)."""
    return [
        Request.created_at < cutoff,
        text(f"({REFUSED_REQUESTS})"),
        or_(Request.job_id.is_(None), ~exists().where(JobRow.id == Request.job_id)),
    ]


def _covered(session: Session) -> tuple[int, int] | None:
    """The older of the two newest snapshots: its id and ``last_input_id`` (inputs up to it are
    covered twice over); None with fewer than two snapshots (no input is pruned then)."""
    newest = session.execute(select(Snapshot.id, Snapshot.last_input_id).order_by(Snapshot.id.desc()).limit(2)).all()
    if len(newest) < 2:
        return None
    return int(newest[1][0]), int(newest[1][1])


def _share_hour(share: str, hour: int, **values: float) -> dict[str, Any]:
    """A new ``quota_share_hours`` row: zeros but for ``values``."""
    row: dict[str, Any] = {"share": share, "hour": hour, **dict.fromkeys((*_USAGE, *_JOB_TOTALS), 0)}
    row.update(values)
    return row


def _add_totals(session: Session, sums: dict[tuple[str, int], dict[str, float]]) -> None:
    """Add pruned jobs' totals to their hours' rows (made when missing)."""
    hours = sorted({hour for _, hour in sums})
    existing = {
        (row.share, row.hour): row for row in session.scalars(select(ShareHour).where(ShareHour.hour.in_(hours)))
    }
    new = []
    for (share, hour), totals in sums.items():
        values = {column: int(value) if column in _COUNTS else value for column, value in totals.items()}
        row = existing.get((share, hour))
        if row is None:
            new.append(_share_hour(share, hour, **values))
            continue
        for column, value in values.items():
            setattr(row, column, getattr(row, column) + value)
    if new:
        session.execute(insert(ShareHour), new)
    session.flush()


_COUNTS = frozenset({"jobs_pruned", "jobs_succeeded", "preemptions"})
"""The whole-number columns among ``_JOB_TOTALS``."""


def _count_deleted(session: Session, statement: Any) -> int:
    result = session.execute(statement, execution_options={"synchronize_session": False})
    return int(result.rowcount)  # type: ignore[attr-defined]


def _count(session: Session, query: Select[Any]) -> int:
    return int(session.scalar(select(func.count()).select_from(query.subquery())) or 0)


def _oldest_job(session: Session, pruned: Select[Any] | None) -> float | None:
    """When the oldest job that stays was submitted."""
    query = select(func.min(JobRow.submitted_at))
    if pruned is not None:
        query = query.where(JobRow.id.not_in(pruned.scalar_subquery()))
    value = session.scalar(query)
    return None if value is None else float(value)


def _oldest_input(session: Session, pruned: tuple[int, float] | None) -> float | None:
    """The instant of the oldest input that stays (``pruned``: inputs up to that id and before
    that instant go)."""
    query = select(func.min(Input.at))
    if pruned is not None:
        query = query.where(or_(Input.id > pruned[0], Input.at >= pruned[1]))
    value = session.scalar(query)
    return None if value is None else float(value)
