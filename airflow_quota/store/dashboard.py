"""Read queries behind the Quotas page and its JSON API: what each share holds, lends and waits
for; the queue and the running jobs; one job with its attempts, placements and preemptions; the
preemption history; alerts still open; and GPU use over time per share.

Everything is read from the tables the quota scheduler writes; nothing here writes. What each
share holds and waits for is the leader's view (``store/views.py``), and why a job waits and
where it stands are its columns of ``quota_jobs``: both are computed by the core
(``core.visibility``) and only read here, never re-derived. Figures are as of the scheduler's
last commit; ages are computed from the stored instants at ``QuotaStore.clock()``.

The quota scheduler charges an attempt (GPU-hours, cost) when it ends; ``running_charges`` adds
what a job holding capacity has run up since its placement, so a running job's cost is never
shown as zero.

Every figure for programs (seconds, epoch instants) has its text for people beside it
(``*_text``), from ``core.human_time`` as the CLI and the task log write it: the Quotas page shows
these and formats no time itself.

Usage over time needs no sampling: an attempt holds its instances from ``placed_at`` until
``ended_at`` (a victim's until it has stopped), so a sweep over those instants gives the exact
step function of instances held per share and type, as the core's ``Meter`` integrates it.
"""

from __future__ import annotations

import bisect
import signal
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, NamedTuple

from pydantic import Field
from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from airflow_quota.core.config import QuotaConfig, stored_config
from airflow_quota.core.human_time import clock_time, duration_words
from airflow_quota.core.model import HOLDING_STATES, LIVE_STATES, WAITING_STATES, JobState
from airflow_quota.store.engine import reachable
from airflow_quota.store.models import (
    RETENTION_ROW,
    AlertRow,
    Attempt,
    ConfigVersion,
    EventRow,
    Input,
    JobRow,
    Preemption,
    RetentionState,
    ShareHour,
)
from airflow_quota.store.repository import QuotaStore
from airflow_quota.store.views import LatestConfiguration, TypeView, read_shown_view

"""States of a job that waits for capacity (SUBMITTED: not taken in by the scheduler yet)."""


def words(seconds: float | None) -> str | None:
    """A duration for people (``core.human_time.duration_words``); None for none. A negative
    figure (two clocks a moment apart) reads as no time at all."""
    return None if seconds is None else duration_words(max(0.0, seconds))


def clock(at: float | None, now: float) -> str | None:
    """An instant for people, on a UTC clock, with its date unless it is ``now``'s day
    (``core.human_time.clock_time``); None for none."""
    return None if at is None else clock_time(at, now)


OPEN_WHILE_WAITING = frozenset({"STARVING", "GUARANTEE_VIOLATED"})
"""Alert kinds about a wait: open while the wait they were raised for goes on (the job has not
been placed since); the other kind (PREEMPTED_REPEATEDLY) stays open while the job lives."""


# -- shares ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TypeUsage:
    """One instance type of one share, in instances (``lent`` may be fractional, see
    ``core.quota.lent_by``). ``idle`` is the limit the share does not use itself, lent or not,
    as ``airflow-quota shares`` prints it; the part nobody uses is ``idle - lent``."""

    instance_type: str
    gpus_per_instance: Annotated[int, Field(description="GPUs per instance (catalogue)")]
    capacity: Annotated[int, Field(description="instances of this type in the pool")]
    limit: Annotated[int, Field(description="the share's guaranteed limit")]
    used: Annotated[int, Field(description="instances the share's jobs hold (SCHEDULED, STARTING, RUNNING)")]
    borrowed: Annotated[int, Field(description="instances held above the limit: borrowed from others")]
    lent: Annotated[float, Field(description="of the idle limit, instances others borrow now (may be fractional)")]
    idle: Annotated[int, Field(description="limit the share does not use, lent or not (limit - used, at least 0)")]
    runnable: Annotated[int, Field(description="RUNNABLE jobs that list this type")]
    oldest_pending_seconds: Annotated[
        float, Field(description="how long the longest-waiting of them has been RUNNABLE, now; 0 when none")
    ]
    oldest_pending_text: Annotated[str, Field(description="oldest_pending_seconds in words (core.human_time)")]


@dataclass(frozen=True, slots=True)
class ShareSummary:
    """A share as its card shows it: configuration, per-type use, queue length, and GPU-hours
    and cost of all its jobs ever, running attempts included."""

    name: str
    strategy: str
    state: str
    borrow_limit: int | None
    in_share_preemption: bool
    in_share_preemption_after_seconds: Annotated[
        float | None,
        Field(description="how long a job waits before it may preempt lower-priority jobs of the share; None without"),
    ]
    in_share_preemption_after_text: Annotated[str | None, Field(description="the same in words")]
    starvation_threshold_seconds: Annotated[
        float | None,
        Field(
            description="how long a job of the share waits, RUNNABLE, before it may be starving, now (docs/model.md "
            "rule 8.2): starvation_after_seconds when set (starvation_fixed), else starvation_multiple times "
            "normal_wait_seconds and at least starvation_min_seconds, 48 h while the normal wait is not known; "
            "None in a view the quota scheduler wrote before migration 0021, until it starts again"
        ),
    ]
    starvation_threshold_text: Annotated[str | None, Field(description="the same in words")]
    starvation_fixed: Annotated[
        bool, Field(description="whether the threshold is the share's starvation_after_seconds")
    ]
    normal_wait_seconds: Annotated[
        float | None,
        Field(
            description="the share's normal wait the threshold is drawn from: the 90% point of its last 200 "
            "placements' waits; None when the threshold is fixed or fewer than 20 placements are known"
        ),
    ]
    normal_wait_text: Annotated[str | None, Field(description="the same in words")]
    starvation_multiple: Annotated[
        float | None, Field(description="the share's starvation_multiple; None when the threshold is fixed")
    ]
    max_priority: int
    types: tuple[TypeUsage, ...]
    running: Annotated[int, Field(description="jobs holding capacity")]
    runnable: Annotated[int, Field(description="RUNNABLE jobs (a submission counts once the scheduler took it in)")]
    oldest_pending_seconds: Annotated[
        float, Field(description="how long the share's longest-waiting job has been RUNNABLE, now; 0 when none")
    ]
    oldest_pending_text: Annotated[str, Field(description="oldest_pending_seconds in words (core.human_time)")]
    gpu_hours: Annotated[float, Field(description="GPU-hours of the share's jobs, all time, running attempts included")]
    lost_gpu_hours: Annotated[float, Field(description="GPU-hours of work lost to preemptions and failures")]
    cost: Annotated[float, Field(description="USD, on-demand prices of the catalogue or the plan's")]
    preemptions: Annotated[int, Field(description="preemptions the share's jobs suffered")]


@dataclass(frozen=True, slots=True)
class Charge:
    """GPU-hours and cost (USD) of a job's current attempt so far."""

    gpu_hours: float
    cost: float


def running_charges(store: QuotaStore, jobs: Sequence[JobRow], config: QuotaConfig | None = None) -> dict[int, Charge]:
    """What each job among ``jobs`` that holds capacity has run up in its open attempt, from its
    placement to now, at the price its placement pays (the plan's, else on-demand), as the core
    will charge it when the attempt ends."""
    holding = [job.id for job in jobs if job.state in HOLDING_STATES]
    if not holding:
        return {}
    if config is None:
        latest = store.latest_config()
        if latest is None:
            return {}
        config = latest[1]
    with reachable(str(store.engine.url)), store.sessions() as session:
        query = select(Attempt).where(Attempt.job_id.in_(holding), Attempt.ended_at.is_(None))
        attempts = list(session.scalars(query))
    catalogue = config.catalogue()
    now = store.clock()
    charges = {}
    for attempt in attempts:
        spec = catalogue.get(attempt.instance_type)
        plan = config.plan(attempt.training_plan) if attempt.training_plan else None
        price = plan.hourly_price if plan else (spec.hourly_price if spec else 0.0)
        hours = max(0.0, now - attempt.placed_at) / 3600 * attempt.count
        charges[attempt.job_id] = Charge(gpu_hours=hours * (spec.gpus if spec else 0), cost=hours * price)
    return charges


class Shares(NamedTuple):
    """The shares as readers show them (``share_summaries``)."""

    computed_at: float | None
    """When the leader computed its view; None before its first commit."""
    summaries: list[ShareSummary]
    configuration: LatestConfiguration
    """The latest configuration version and whether a quota scheduler has taken it in."""


def share_summaries(store: QuotaStore, now: float) -> Shares:
    """Every share of the view readers show (``store/views.py``, ``read_shown_view``), in
    configuration order, with when the leader computed it: before a quota scheduler has taken
    in any configuration, the latest stored one's shares and limits with nothing used
    (``computed_at`` None). Ages are at ``now``; GPU-hours and cost add the running attempts'
    charges so far."""
    with reachable(str(store.engine.url)), store.sessions() as session:
        view, latest = read_shown_view(session)
        holding = list(session.scalars(select(JobRow).where(JobRow.state.in_(HOLDING_STATES))))
        totals: dict[str, tuple[float, float, float, int]] = {}
        for query in (_share_totals(), _pruned_share_totals()):  # the jobs kept, and those pruned
            for share, gpu, lost, cost, preempted in session.execute(query):
                before = totals.get(share, (0.0, 0.0, 0.0, 0))
                totals[share] = (
                    before[0] + float(gpu or 0.0),
                    before[1] + float(lost or 0.0),
                    before[2] + float(cost or 0.0),
                    before[3] + int(preempted or 0),
                )
    charges = running_charges(store, holding)
    accrued: dict[str, tuple[float, float]] = {}
    for job in holding:
        charge = charges.get(job.id, Charge(0.0, 0.0))
        gpu, cost = accrued.get(job.share, (0.0, 0.0))
        accrued[job.share] = (gpu + charge.gpu_hours, cost + charge.cost)
    summaries = []
    for share in view.shares:
        gpu, lost, cost, preempted = totals.get(share.share, (0.0, 0.0, 0.0, 0))
        running_gpu, running_cost = accrued.get(share.share, (0.0, 0.0))
        oldest = share.oldest_pending_seconds(now)
        summaries.append(
            ShareSummary(
                name=share.share,
                strategy=share.strategy,
                state=share.state,
                borrow_limit=share.borrow_limit,
                in_share_preemption=share.in_share_preemption,
                in_share_preemption_after_seconds=share.in_share_preemption_after_seconds,
                in_share_preemption_after_text=words(share.in_share_preemption_after_seconds),
                starvation_threshold_seconds=share.starvation_threshold_seconds,
                starvation_threshold_text=words(share.starvation_threshold_seconds),
                starvation_fixed=share.starvation_fixed,
                normal_wait_seconds=share.normal_wait_seconds,
                normal_wait_text=words(share.normal_wait_seconds),
                starvation_multiple=share.starvation_multiple,
                max_priority=share.max_priority,
                types=tuple(_type_usage(t, now) for t in share.types),
                running=share.running,
                runnable=share.runnable,
                oldest_pending_seconds=oldest,
                oldest_pending_text=duration_words(oldest),
                gpu_hours=round(gpu + running_gpu, 6),
                lost_gpu_hours=round(lost, 6),
                cost=round(cost + running_cost, 4),
                preemptions=preempted,
            )
        )
    return Shares(view.computed_at, summaries, latest)


def _type_usage(view: TypeView, now: float) -> TypeUsage:
    oldest = view.oldest_pending_seconds(now)
    return TypeUsage(
        instance_type=view.instance_type,
        gpus_per_instance=view.gpus_per_instance,
        capacity=view.capacity,
        limit=view.limit,
        used=view.used,
        borrowed=view.borrowed,
        lent=view.lent,
        idle=view.idle,
        runnable=view.runnable,
        oldest_pending_seconds=oldest,
        oldest_pending_text=duration_words(oldest),
    )


def _share_totals() -> Any:
    return select(
        JobRow.share,
        func.sum(JobRow.gpu_hours),
        func.sum(JobRow.lost_gpu_hours),
        func.sum(JobRow.cost),
        func.sum(JobRow.preemptions),
    ).group_by(JobRow.share)


def _pruned_share_totals() -> Any:
    """The same totals of the jobs retention has pruned (``quota_share_hours``)."""
    return select(
        ShareHour.share,
        func.sum(ShareHour.gpu_hours),
        func.sum(ShareHour.lost_gpu_hours),
        func.sum(ShareHour.cost),
        func.sum(ShareHour.preemptions),
    ).group_by(ShareHour.share)


# -- borrowing now -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Holding:
    """A job that holds instances of one type now: its open attempt's placement and size."""

    job_id: int
    placed_at: float
    decision: int
    """The PLACED decision's place in the log: the order of placements made at one instant."""
    count: int


def borrowed_now(holdings: Sequence[Holding], limit: int) -> dict[int, int]:
    """How many of each holding job's instances are above its share's ``limit`` now, for the
    jobs of one share on one instance type: ``docs/model.md`` rule 4.3.3's borrowed count
    (``max(0, min(n, U_s(T) − L_s(T)))``, ``U_s(T)`` after the placement) with the placements
    still held taken again in the order they were made, each counting the usage of those before
    it. A job placed above the limit is therefore no longer borrowing once the jobs placed
    before it have left, and the counts always add up to the share's borrowed figure
    ``max(0, U_s(T) − L_s(T))``. Placements made at one instant go in the order the cycle
    decided them (as the scheduler's poller orders open attempts)."""
    counts: dict[int, int] = {}
    used = 0
    for holding in sorted(holdings, key=lambda h: (h.placed_at, h.decision, h.job_id)):
        used += holding.count
        counts[holding.job_id] = max(0, min(holding.count, used - limit))
    return counts


def current_borrowing(store: QuotaStore, jobs: Sequence[JobRow]) -> dict[int, int]:
    """``borrowed_now`` for each job among ``jobs`` that holds capacity (SCHEDULED, STARTING,
    RUNNING), against the limits of the view readers show (``read_shown_view``, the figures of
    the share's bars). A job not in the answer holds nothing: it borrows nothing now."""
    shares = {job.share for job in jobs if job.state in HOLDING_STATES}
    if not shares:
        return {}
    decision = (
        select(func.max(EventRow.id))
        .where(EventRow.job_id == Attempt.job_id, EventRow.type == "PLACED")
        .correlate(Attempt)
        .scalar_subquery()
    )
    with reachable(str(store.engine.url)), store.sessions() as session:
        view, _ = read_shown_view(session)
        rows = list(
            session.execute(
                select(JobRow.id, JobRow.share, Attempt.instance_type, Attempt.count, Attempt.placed_at, decision)
                .join(Attempt, Attempt.job_id == JobRow.id)
                .where(
                    JobRow.share.in_(sorted(shares)),
                    JobRow.state.in_(HOLDING_STATES),
                    Attempt.ended_at.is_(None),
                )
            )
        )
    limits = {(share.share, t.instance_type): t.limit for share in view.shares for t in share.types}
    groups: dict[tuple[str, str], list[Holding]] = {}
    for job_id, share, instance_type, count, placed_at, placed in rows:
        groups.setdefault((share, instance_type), []).append(Holding(job_id, placed_at, placed or 0, count))
    counts: dict[int, int] = {}
    for key, holdings in groups.items():
        counts.update(borrowed_now(holdings, limits.get(key, 0)))
    return counts


# -- jobs --------------------------------------------------------------------------------------


def list_jobs(
    store: QuotaStore,
    share: str | None = None,
    states: Sequence[str] | None = None,
    dag_id: str | None = None,
    limit: int = 500,
) -> list[JobRow]:
    """Jobs matching every filter given: waiting jobs first in queue order (position in the
    whole queue), then the others, newest first; at most ``limit``."""
    with reachable(str(store.engine.url)), store.sessions() as session:
        query = select(JobRow)
        if share:
            query = query.where(JobRow.share == share)
        if states:
            query = query.where(JobRow.state.in_(list(states)))
        if dag_id:
            query = query.where(JobRow.dag_id == dag_id)
        rows = list(session.scalars(query.order_by(JobRow.id.desc()).limit(limit)))
    return sorted(rows, key=queue_order)


def queue_order(job: JobRow) -> tuple[int, int, int]:
    """1. waiting jobs with a position, by position in the queue; 2. other waiting jobs; 3. the
    rest, newest first (the id is the stable tiebreak)."""
    if job.state in WAITING_STATES:
        position = job.position_in_queue
        return (0, position if position is not None else 1 << 30, job.id)
    return (1, 0, -job.id)


@dataclass(frozen=True, slots=True)
class JobDetail:
    """One job as its page shows it (``airflow-quota jobs show``): the row, its attempts (one
    per placement), the preemptions it suffered and those it caused, its alerts and its story."""

    job: JobRow
    attempts: list[Attempt]
    preemptions: list[PreemptionRecord]
    caused: list[PreemptionRecord]
    alerts: list[AlertRecord]
    story: list[str]


def story_line(line: str, input_id: int | None, kind: str | None) -> str:
    """A decision's line in a job's story, with the input that caused it: its id in the input
    log and what it was (``submit``, ``report``, ``cycle``...), or that retention has pruned it."""
    if input_id is None:
        return line
    return f"{line} [input #{input_id}: {kind if kind is not None else 'pruned'}]"


def job_detail(store: QuotaStore, job_id: int, now: float | None = None) -> JobDetail | None:
    """The job's detail; the preemptions' and alerts' texts for people as of ``now`` (default:
    the store's clock)."""
    now = store.clock() if now is None else now
    job = store.job(job_id)
    if job is None:
        return None
    with reachable(str(store.engine.url)), store.sessions() as session:
        events = session.execute(
            select(EventRow.line, EventRow.input_id, Input.kind)
            .outerjoin(Input, Input.id == EventRow.input_id)
            .where(EventRow.job_id == job_id)
            .order_by(EventRow.id)
        )
        story = [story_line(line, input_id, kind) for line, input_id, kind in events]
    caused = preemption_history(store, limit=1000, by_job=job.name, now=now)
    return JobDetail(
        job=job,
        attempts=store.attempts(job_id),
        preemptions=preemption_history(store, limit=1000, job_id=job_id, now=now),
        caused=[p for p in caused if p.preemptor_id == job.id],
        alerts=alert_records(store, job_id=job_id, now=now),
        story=story,
    )


# -- why an attempt ended ----------------------------------------------------------------------


def attempt_reason_text(
    status: str, reason: str | None, preempted: bool = False, cancelled: bool = False
) -> str | None:
    """Why an attempt ended, for people: how it ended (the backend's ``reason``: "stopped by
    SIGTERM" for ``ExitCode:-15``, "exited with code 1" for ``ExitCode:1``, another reason as
    it is) and, after a colon, what stopped it ("preempted", "cancelled"):
    "stopped by SIGTERM: preempted". The raw ``reason`` stays beside it in the API and on the
    page. None for an attempt with nothing to say (running, succeeded)."""
    how: str | None = None
    code = _exit_code(reason)
    if code is not None:
        if code < 0:
            signal_name = _signal_name(-code)
            how = (
                f"stopped by {signal_name}"
                if (preempted or cancelled or status == "STOPPED")
                else f"killed by {signal_name}"
            )
        elif code == 0:
            how = "exited normally"
        else:
            how = f"exited with code {code}"
    elif status == "CAPACITY_ERROR":
        how = "no capacity at the provider" + (f" ({reason})" if reason else "")
    elif reason:
        how = reason
    elif status == "NOT_STARTED":
        how = "never started"
    elif status in ("STOPPED", "STOPPING"):
        how = "stopped"
    cause = "preempted" if preempted else "cancelled" if cancelled else None
    return ": ".join(part for part in (how, cause) if part) or None


def _exit_code(reason: str | None) -> int | None:
    """N of a backend's ``ExitCode:N`` reason; None for any other reason."""
    if reason is None or not reason.startswith("ExitCode:"):
        return None
    try:
        return int(reason.removeprefix("ExitCode:"))
    except ValueError:
        return None


def _signal_name(number: int) -> str:
    """SIGTERM for 15; "signal 99" for a number this platform does not name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


# -- preemptions -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PreemptionRecord:
    """One preemption: the victim (job, share, DAG), which attempt it lost, how, by whom, and
    the work lost since the victim's last checkpoint."""

    id: int
    at: float
    at_text: Annotated[str, Field(description="at, on a UTC clock (core.human_time)")]
    job_id: int
    job: str
    share: str
    dag_id: str | None
    attempt: int
    kind: Annotated[str, Field(description="CROSS_SHARE (reclaim) or IN_SHARE (priority)")]
    preemptor: str
    preemptor_id: int | None
    preemptor_share: str | None
    lost_seconds: float
    lost_text: Annotated[str, Field(description="lost_seconds in words (core.human_time)")]
    instance_type: str | None
    count: int | None


def preemption_history(
    store: QuotaStore,
    share: str | None = None,
    limit: int = 50,
    by_job: str | None = None,
    job_id: int | None = None,
    now: float | None = None,
) -> list[PreemptionRecord]:
    """The latest preemptions first; ``share`` keeps those whose victim or preemptor is in it.
    The preemptor is named in the log; its id is the job of that name placed at that instant.
    Texts for people are as of ``now`` (default: the store's clock)."""
    now = store.clock() if now is None else now
    with reachable(str(store.engine.url)), store.sessions() as session:
        query = (
            select(Preemption, JobRow.name, JobRow.share, JobRow.dag_id, Attempt.instance_type, Attempt.count)
            .join(JobRow, JobRow.id == Preemption.job_id)
            .outerjoin(Attempt, (Attempt.job_id == Preemption.job_id) & (Attempt.number == Preemption.attempt))
            .order_by(Preemption.id.desc())
        )
        if by_job is not None:
            query = query.where(Preemption.by_job == by_job)
        if job_id is not None:
            query = query.where(Preemption.job_id == job_id)
        rows = list(session.execute(query.limit(limit if share is None else limit * 10)))
        names = {row[0].by_job for row in rows}
        preemptors: dict[str, list[JobRow]] = {}
        if names:
            for job in session.scalars(select(JobRow).where(JobRow.name.in_(sorted(names))).order_by(JobRow.id)):
                preemptors.setdefault(job.name, []).append(job)
    records = []
    for preemption, name, victim_share, dag_id, instance_type, count in rows:
        preemptor = _preemptor(preemptors.get(preemption.by_job, []), preemption.at)
        preemptor_share = preemptor.share if preemptor else None
        if share is not None and share not in (victim_share, preemptor_share):
            continue
        records.append(
            PreemptionRecord(
                id=preemption.id,
                at=preemption.at,
                at_text=clock_time(preemption.at, now),
                job_id=preemption.job_id,
                job=name,
                share=victim_share,
                dag_id=dag_id,
                attempt=preemption.attempt,
                kind=preemption.kind,
                preemptor=preemption.by_job,
                preemptor_id=preemptor.id if preemptor else None,
                preemptor_share=preemptor_share,
                lost_seconds=preemption.lost_seconds,
                lost_text=duration_words(max(0.0, preemption.lost_seconds)),
                instance_type=instance_type,
                count=count,
            )
        )
        if len(records) >= limit:
            break
    return records


def _preemptor(candidates: list[JobRow], at: float) -> JobRow | None:
    """Of the jobs with the preemptor's name (names are reused once a job is final), the latest
    submitted at or before the preemption."""
    earlier = [job for job in candidates if job.submitted_at <= at]
    return earlier[-1] if earlier else None


# -- alerts ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AlertRecord:
    """An alert with its job's DAG and whether it is still open: a STARVING or
    GUARANTEE_VIOLATED alert while the wait it was raised for goes on, a PREEMPTED_REPEATEDLY
    one while its job lives."""

    id: int
    at: float
    at_text: Annotated[str, Field(description="when it was raised, on a UTC clock (core.human_time)")]
    age_text: Annotated[str, Field(description="how long ago it was raised (now - at), in words (core.human_time)")]
    kind: str
    job_id: int
    job: str
    share: str
    reason: str
    position: int | None
    dag_id: str | None
    job_state: str | None
    open: Annotated[bool, Field(description="STARVING, GUARANTEE_VIOLATED: the job still waits; others: it lives")]


def alert_records(
    store: QuotaStore,
    share: str | None = None,
    only_open: bool = False,
    job_id: int | None = None,
    now: float | None = None,
) -> list[AlertRecord]:
    """Alerts, newest first; their texts for people as of ``now`` (default: the store's clock)."""
    now = store.clock() if now is None else now
    with reachable(str(store.engine.url)), store.sessions() as session:
        query = (
            select(AlertRow, JobRow.dag_id, JobRow.state, JobRow.runnable_since)
            .outerjoin(JobRow, JobRow.id == AlertRow.job_id)
            .order_by(AlertRow.id.desc())
        )
        if share:
            query = query.where(AlertRow.share == share)
        if job_id is not None:
            query = query.where(AlertRow.job_id == job_id)
        rows = list(session.execute(query))
    records = []
    for alert, dag_id, state, runnable_since in rows:
        if alert.kind in OPEN_WHILE_WAITING:
            # still the same wait: RUNNABLE since before the alert (not placed and requeued since)
            is_open = state == JobState.RUNNABLE.value and runnable_since is not None and runnable_since <= alert.at
        else:
            is_open = state in LIVE_STATES
        if only_open and not is_open:
            continue
        records.append(
            AlertRecord(
                id=alert.id,
                at=alert.at,
                at_text=clock_time(alert.at, now),
                age_text=duration_words(max(0.0, now - alert.at)),
                kind=alert.kind,
                job_id=alert.job_id,
                job=alert.job,
                share=alert.share,
                reason=alert.reason,
                position=alert.position,
                dag_id=dag_id,
                job_state=state,
                open=is_open,
            )
        )
    return records


# -- utilisation over time ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class UtilisationPoint:
    """From ``at`` until the next point: GPUs the share holds, of which borrowed (held above its
    limit), and its limit in GPUs under the configuration then in force. Whole numbers, except
    in the past retention has compacted (``store/retention.py``): there one point an hour, the
    hour's averages."""

    at: float
    used_gpus: float
    borrowed_gpus: float
    limit_gpus: float


@dataclass(frozen=True, slots=True)
class UtilisationHistory:
    """A share's GPU use as a step function over ``[start, end]``, and its averages there."""

    share: str
    start: float
    end: float
    points: list[UtilisationPoint] = field(default_factory=list)
    gpu_hours: float = 0.0
    borrowed_gpu_hours: float = 0.0
    limit_gpu_hours: float = 0.0

    @property
    def utilisation(self) -> float | None:
        """Used over guaranteed GPU-hours in the window (above 1 when the share borrowed)."""
        return self.gpu_hours / self.limit_gpu_hours if self.limit_gpu_hours else None


HOUR = 3600
"""The resolution of the compacted past (``quota_share_hours``), in seconds."""


class Held(NamedTuple):
    """An attempt's hold on instances: from ``placed_at`` until ``ended_at`` (None: still held)."""

    placed_at: float
    ended_at: float | None
    instance_type: str
    instances: int


def utilisation_history(store: QuotaStore, share: str, start: float, end: float) -> UtilisationHistory:
    """The share's GPUs held over ``[start, end]``, exact at every placement and end.

    Limits follow the configuration versions as they were applied (a limit changes at the
    version's ``created_at``); GPUs per instance come from the latest configuration's catalogue.
    The past before ``compacted_until`` (retention, ``store/retention.py``) is read from its
    hourly aggregates, one point an hour; an hour the window cuts counts pro rata.
    """
    with reachable(str(store.engine.url)), store.sessions() as session:
        versions = configuration_history(session)
        compacted_until = compacted_until_of(session)
        hours: dict[int, ShareHour] = {}
        if compacted_until is not None and start < compacted_until:
            first_hour = int(start // HOUR) * HOUR
            query = select(ShareHour).where(
                ShareHour.share == share, ShareHour.hour >= first_hour, ShareHour.hour < min(end, compacted_until)
            )
            hours = {row.hour: row for row in session.scalars(query)}
        live_start = start if compacted_until is None else max(start, compacted_until)
        holds = [held for _, held in held_between(session, share, live_start, end)] if live_start < end else []
    if not versions:
        return UtilisationHistory(share, start, end)
    compacted = _compacted_points(hours, start, min(end, live_start))
    points = _without_repeats([*compacted, *usage_points(versions, holds, share, live_start, end)])
    used = borrowed = limit = 0.0
    for current, following in zip(points, [*points[1:], None][: len(points)], strict=True):
        seconds = (following.at if following else end) - current.at
        used += current.used_gpus * seconds
        borrowed += current.borrowed_gpus * seconds
        limit += current.limit_gpus * seconds
    return UtilisationHistory(
        share=share,
        start=start,
        end=end,
        points=points,
        gpu_hours=round(used / 3600, 6),
        borrowed_gpu_hours=round(borrowed / 3600, 6),
        limit_gpu_hours=round(limit / 3600, 6),
    )


def configuration_history(session: Session) -> list[tuple[float, QuotaConfig]]:
    """Every configuration version with when it was applied, oldest first."""
    return [
        (row.created_at, stored_config(row.document))
        for row in session.scalars(select(ConfigVersion).order_by(ConfigVersion.id))
    ]


def compacted_until_of(session: Session) -> float | None:
    """Before this instant, history is read from ``quota_share_hours``; None: nothing compacted."""
    return session.scalar(select(RetentionState.compacted_until).where(RetentionState.name == RETENTION_ROW))


def held_between(session: Session, share: str | None, start: float, end: float) -> list[tuple[str, Held]]:
    """The attempts (of ``share``, or of every share for None) that held instances at some time
    in ``[start, end)``, with their share.

    For every share (retention's compaction), each attempt's share is looked up by its job's id
    rather than joined: a join lets PostgreSQL hash the whole jobs table, whose cost grows with
    the history kept, where a window holds a bounded number of attempts."""
    held = (Attempt.placed_at < end, or_(Attempt.ended_at.is_(None), Attempt.ended_at > start))
    columns = (Attempt.placed_at, Attempt.ended_at, Attempt.instance_type, Attempt.count)
    if share is None:
        share_of = select(JobRow.share).where(JobRow.id == Attempt.job_id).scalar_subquery()
        query = select(share_of, *columns).where(*held).order_by(Attempt.placed_at)  # by the placements' index
    else:
        query = select(JobRow.share, *columns).join(JobRow, JobRow.id == Attempt.job_id).where(*held)
        query = query.where(JobRow.share == share)
    return [(row[0], Held(*row[1:])) for row in session.execute(query)]


def usage_points(
    versions: Sequence[tuple[float, QuotaConfig]],
    holds: Sequence[Held],
    share: str,
    start: float,
    end: float,
) -> list[UtilisationPoint]:
    """The share's step function over ``[start, end)`` from its attempts' holds: a point at
    ``start`` and at every instant anything changes (a placement, an end, a configuration
    version). ``versions`` must not be empty."""
    if start >= end:
        return []
    catalogue = versions[-1][1].catalogue()

    def gpus(instance_type: str) -> int:
        spec = catalogue.get(instance_type)
        return spec.gpus if spec else 0

    # 1. the instants where anything changes: placements, ends, configuration versions
    changes: list[tuple[float, str, int]] = []
    for held in holds:
        changes.append((max(held.placed_at, start), held.instance_type, held.instances))
        if held.ended_at is not None and held.ended_at < end:
            changes.append((held.ended_at, held.instance_type, -held.instances))
    instants = sorted({start} | {t for t, _, _ in changes} | {t for t, _ in versions if start < t < end})
    changes.sort(key=lambda change: change[0])
    version_times = [t for t, _ in versions]
    # 2. sweep: usage per type after all changes at an instant, limits of the version in force
    usage: dict[str, int] = {}
    points: list[UtilisationPoint] = []
    index = 0
    for instant in instants:
        while index < len(changes) and changes[index][0] <= instant:
            _, instance_type, delta = changes[index]
            usage[instance_type] = usage.get(instance_type, 0) + delta
            index += 1
        config = versions[max(0, bisect.bisect_right(version_times, instant) - 1)][1]
        config_share = config.share(share)
        limits = dict(config_share.capacity_limits) if config_share else {}
        types = set(usage) | set(limits)
        points.append(
            UtilisationPoint(
                at=instant,
                used_gpus=sum(usage.get(t, 0) * gpus(t) for t in types),
                borrowed_gpus=sum(max(0, usage.get(t, 0) - limits.get(t, 0)) * gpus(t) for t in types),
                limit_gpus=sum(limits.get(t, 0) * gpus(t) for t in types),
            )
        )
    return _without_repeats(points)


def hourly_integrals(points: Sequence[UtilisationPoint], start: int, end: int) -> dict[int, tuple[float, float, float]]:
    """GPU-seconds used, borrowed and guaranteed in each whole hour of ``[start, end)`` (hour
    aligned) under the step function ``points`` (its first point at ``start``)."""
    totals = {hour: (0.0, 0.0, 0.0) for hour in range(start, end, HOUR)}
    for current, following in zip(points, [*points[1:], None][: len(points)], strict=True):
        left, right = current.at, following.at if following else end
        while left < right:
            hour = int(left // HOUR) * HOUR
            cut = min(right, hour + HOUR)
            seconds = cut - left
            used, borrowed, limit = totals[hour]
            totals[hour] = (
                used + current.used_gpus * seconds,
                borrowed + current.borrowed_gpus * seconds,
                limit + current.limit_gpus * seconds,
            )
            left = cut
    return totals


def _compacted_points(hours: dict[int, ShareHour], start: float, end: float) -> list[UtilisationPoint]:
    """One point an hour over ``[start, end)``: the hour's averages (none stored: nothing)."""
    points: list[UtilisationPoint] = []
    if start >= end:
        return points
    hour = int(start // HOUR) * HOUR
    while hour < end:
        row = hours.get(hour)
        used, borrowed, limit = (
            (row.used_gpu_seconds, row.borrowed_gpu_seconds, row.limit_gpu_seconds) if row else (0.0, 0.0, 0.0)
        )
        points.append(UtilisationPoint(max(float(hour), start), used / HOUR, borrowed / HOUR, limit / HOUR))
        hour += HOUR
    return points


def _without_repeats(points: list[UtilisationPoint]) -> list[UtilisationPoint]:
    """The step function without points that change nothing (the step goes on)."""
    kept: list[UtilisationPoint] = []
    for point in points:
        if kept and (kept[-1].used_gpus, kept[-1].borrowed_gpus, kept[-1].limit_gpus) == (
            point.used_gpus,
            point.borrowed_gpus,
            point.limit_gpus,
        ):
            continue
        kept.append(point)
    return kept


def first_activity(store: QuotaStore) -> float | None:
    """The first placement ever recorded (the default start of a history), if any: kept by
    retention once the attempt that made it may be pruned."""
    with reachable(str(store.engine.url)), store.sessions() as session:
        placed = session.scalar(select(func.min(Attempt.placed_at)))
        kept = session.scalar(select(RetentionState.first_placed_at).where(RetentionState.name == RETENTION_ROW))
    found = [float(value) for value in (placed, kept) if value is not None]
    return min(found) if found else None
