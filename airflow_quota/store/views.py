"""The read model: what each share holds and waits for, as the leading quota scheduler's core
sees it (``core.visibility.share_view``), stored so that every reader shows the same figures.

The leader computes the view after a step that commits anything and, when it differs from
what it last wrote, rewrites ``quota_share_views`` and ``quota_share_type_views`` in the same
transaction as the decisions (``QuotaService._commit``). The scheduler process does so at most
once a second while its steps follow one another (``VIEW_SECONDS``), and in the first step that
finds nothing to do, so a reader sees it at most a second behind the decisions during a burst and
exact once it is over. The view changes only when the core's state does, so between commits it
stays exact; it stores instants, not ages (when the oldest
RUNNABLE job became RUNNABLE), and readers turn them into ages at read time with
``core.visibility.pending_seconds``, the one definition. The per-job half of the read model
(pending reason, the entry waited for, positions, ``runnable_since``) is in the columns of
``quota_jobs`` the leader writes (``service/scheduler.py``, ``_job_columns``).

Readers: ``airflow-quota shares`` (``QuotaStore.shown_view``), the JSON API and the Quotas page
(``store/dashboard.py``, ``share_summaries``), and the scheduler's gauges
(``service/metrics.py``, from the view the leader just wrote).

Before any quota scheduler has taken in a configuration, there is no leader's view: the readers
show the latest stored configuration's shares and limits instead, with nothing used, borrowed,
lent or waiting (``read_shown_view``), and say that no quota scheduler has run since it was
stored (``LatestConfiguration``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import delete, func, select, tuple_, update
from sqlalchemy.orm import Session

from airflow_quota.core.config import QuotaConfig, stored_config
from airflow_quota.core.cycle import EPOCH
from airflow_quota.core.human_time import duration_words
from airflow_quota.core.model import Entry
from airflow_quota.core.normal_wait import starvation_threshold
from airflow_quota.core.queues import ShareQueue
from airflow_quota.core.state import QuotaState
from airflow_quota.core.visibility import Waiting, most_placeable, pending_seconds, share_view, waiting
from airflow_quota.store.bulk import insert_rows, table_of, update_by_key
from airflow_quota.store.models import ConfigVersion, PlaceableViewRow, Request, ShareTypeViewRow, ShareViewRow


@dataclass(frozen=True, slots=True)
class TypeView:
    """One share's use of one instance type (a type it has a limit on, uses or waits for)."""

    instance_type: str
    gpus_per_instance: int
    capacity: int
    limit: int
    used: int
    borrowed: int
    lent: float
    idle: int
    runnable: int
    oldest_runnable_since: float | None

    def oldest_pending_seconds(self, now: float) -> float:
        return pending_seconds(self.oldest_runnable_since, now)


@dataclass(frozen=True, slots=True)
class ShareView:
    """One share: its configuration as the leader applies it, its job counts, its types."""

    share: str
    strategy: str
    state: str
    borrow_limit: int | None
    in_share_preemption: bool
    in_share_preemption_after_seconds: float | None
    """How long a job waits before it may preempt in the share; None without in-share preemption."""
    max_priority: int
    running: int
    runnable: int
    oldest_runnable_since: float | None
    starvation_threshold_seconds: float | None
    """How long a job of the share waits before it may be starving, now (docs/model.md rule 8.2,
    ``core.normal_wait.starvation_threshold``); None in a view a quota scheduler wrote before
    migration 0021, until the leader writes it afresh (at its start)."""
    normal_wait_seconds: float | None
    """The share's normal wait the threshold is drawn from; None when it is fixed or not known yet."""
    starvation_fixed: bool
    """Whether the threshold is the share's ``starvation_after_seconds`` (False when not known)."""
    starvation_multiple: float | None
    """The share's ``starvation_multiple`` (times its normal wait); None when the threshold is fixed."""
    types: tuple[TypeView, ...] = ()

    def oldest_pending_seconds(self, now: float) -> float:
        return pending_seconds(self.oldest_runnable_since, now)

    def starvation_words(self) -> str:
        """When a waiting job of the share may be starving, and why, for people: "after 1 day
        (8x a normal wait of 3 hours)", "after 2 days (normal wait not known yet)", "after 1
        hour (fixed)", "after 10 minutes (the minimum; 8x a normal wait of 30 seconds is
        less)". The Quotas page says the same from the API's figures (``static/quotas.js``)."""
        seconds, normal, multiple = (
            self.starvation_threshold_seconds,
            self.normal_wait_seconds,
            self.starvation_multiple,
        )
        if seconds is None:
            return "not known yet (the quota scheduler has not written it since its upgrade)"
        after = f"after {duration_words(seconds)}"
        if self.starvation_fixed:
            return f"{after} (fixed)"
        if normal is None or multiple is None:
            return f"{after} (normal wait not known yet)"
        drawn = f"{multiple:g}x a normal wait of {duration_words(normal)}"
        return f"{after} (the minimum; {drawn} is less)" if seconds > multiple * normal else f"{after} ({drawn})"


@dataclass(frozen=True, slots=True)
class Placeable:
    """The most instances of a type, from a source (a plan, or on demand when None), that a new
    job of the share could be placed on now without preemption, and why one more could not."""

    share: str
    instance_type: str
    training_plan: str | None
    most: int
    blocked_by: str | None


@dataclass(frozen=True, slots=True)
class QuotaView:
    """Every share of the leader's configuration, in configuration order (each share's types
    by name), and what a new job of each could be placed on, as computed at ``computed_at``
    (None: no leader has written a view yet).

    ``valid_until``: the next instant at which time alone changes what could be placed (a plan
    window opens or closes, a back-off ends); the leader rewrites the view then."""

    shares: tuple[ShareView, ...] = ()
    placeable: tuple[Placeable, ...] = ()
    computed_at: float | None = field(default=None, compare=False)
    valid_until: float | None = field(default=None, compare=False)

    def share(self, name: str) -> ShareView | None:
        return next((view for view in self.shares if view.share == name), None)


_TYPE_FIELDS = tuple(f.name for f in dataclasses.fields(TypeView))
"""The columns of ``quota_share_type_views`` beside ``share``: one per field of ``TypeView``."""
_SHARE_FIELDS = tuple(f.name for f in dataclasses.fields(ShareView) if f.name not in ("share", "types"))
"""The columns of ``quota_share_views`` from a ``ShareView`` beside its key (``share``)."""


class ViewBuilder:
    """Computes the view of the core's state; what comes from a share's RUNNABLE jobs
    (``core.visibility.waiting``: one pass over them) is kept until its queue changes, so a
    commit costs a pass only over the shares whose queues it changed."""

    def __init__(self) -> None:
        self._waiting: dict[str, tuple[ShareQueue, int, Waiting]] = {}

    def view_of(self, state: QuotaState, now: float) -> QuotaView:
        """``core.visibility.share_view`` of every share, and ``most_placeable`` of every
        share, type and source, at ``now``."""
        return QuotaView(self.shares_of(state), _placeable(state, now), now, _valid_until(state, now))

    def shares_of(self, state: QuotaState) -> tuple[ShareView, ...]:
        """``core.visibility.share_view`` of every share, in configuration order, with its
        starvation threshold now (``core.normal_wait.starvation_threshold``: it moves with each
        placement of the share's jobs, which changes its queue and so its row)."""
        shares = []
        for share in state.config.shares:
            figures = share_view(state, share.name, self._waits(state, share.name))
            threshold = starvation_threshold(state.shares[share.name], state.recent_waits[share.name])
            shares.append(
                ShareView(
                    share=share.name,
                    strategy=share.strategy.value,
                    state=share.state.value,
                    borrow_limit=share.borrow_limit,
                    in_share_preemption=share.in_share_preemption,
                    in_share_preemption_after_seconds=(
                        share.in_share_preemption_after_seconds if share.in_share_preemption else None
                    ),
                    max_priority=share.max_priority,
                    running=figures["running"],
                    runnable=figures["runnable"],
                    oldest_runnable_since=figures["oldest_runnable_since"],
                    starvation_threshold_seconds=threshold.seconds,
                    normal_wait_seconds=threshold.normal,
                    starvation_fixed=threshold.fixed,
                    starvation_multiple=None if threshold.fixed else float(share.starvation_multiple),
                    types=tuple(TypeView(instance_type=name, **t) for name, t in sorted(figures["types"].items())),
                )
            )
        return tuple(shares)

    def _waits(self, state: QuotaState, share: str) -> Waiting:
        queue = state.queues[share]
        kept = self._waiting.get(share)
        if kept is not None and kept[0] is queue and kept[1] == queue.version:
            return kept[2]
        waits = waiting(state, share)
        self._waiting[share] = (queue, queue.version, waits)
        return waits


def _placeable(state: QuotaState, now: float) -> tuple[Placeable, ...]:
    """``core.visibility.most_placeable`` of every share, pool type and source of the type."""
    found = []
    for share in state.config.shares:
        for name in sorted(state.types):
            plans = sorted(plan.name for plan in state.plans.values() if plan.instance_type == name)
            for source in [None, *plans]:
                most, block = most_placeable(state, share.name, Entry(name, 1, source), now)
                found.append(Placeable(share.name, name, source, most, None if block is None else block.value))
    return tuple(found)


def _valid_until(state: QuotaState, now: float) -> float | None:
    """The next instant after ``now`` at which a plan window opens or closes or a back-off ends."""
    instants = [t for plan in state.plans.values() for t in (plan.starts_at, plan.ends_at)]
    instants.extend(state.backoff_until.values())
    return min((t for t in instants if t > now), default=None)


def write_view(session: Session, view: QuotaView, stored: QuotaView | None = None) -> None:
    """Replace the stored view by ``view`` (a handful of rows: shares x types), in the caller's
    transaction. Given ``stored``, the view the tables hold now, only the rows that differ are
    written (the leader's usual case: a step changes a share or two), in a few statements
    rather than a DELETE and an INSERT of every row of the three tables."""
    assert view.computed_at is not None
    same_shares = stored is not None and [s.share for s in stored.shares] == [s.share for s in view.shares]
    if stored is not None and stored.computed_at is not None and same_shares:
        _write_changes(session, view, stored)
        return
    session.execute(delete(PlaceableViewRow))
    session.execute(delete(ShareTypeViewRow))
    session.execute(delete(ShareViewRow))
    session.add_all(
        PlaceableViewRow(
            share=p.share,
            instance_type=p.instance_type,
            training_plan=p.training_plan or "",
            most=p.most,
            blocked_by=p.blocked_by,
        )
        for p in view.placeable
    )
    for position, share in enumerate(view.shares):
        session.add(
            ShareViewRow(
                share=share.share,
                position=position,
                strategy=share.strategy,
                state=share.state,
                borrow_limit=share.borrow_limit,
                in_share_preemption=share.in_share_preemption,
                in_share_preemption_after_seconds=share.in_share_preemption_after_seconds,
                max_priority=share.max_priority,
                running=share.running,
                runnable=share.runnable,
                oldest_runnable_since=share.oldest_runnable_since,
                starvation_threshold_seconds=share.starvation_threshold_seconds,
                normal_wait_seconds=share.normal_wait_seconds,
                starvation_fixed=share.starvation_fixed,
                starvation_multiple=share.starvation_multiple,
                computed_at=view.computed_at,
            )
        )
        session.add_all(ShareTypeViewRow(share=share.share, **_fields(t)) for t in share.types)


def _write_changes(session: Session, view: QuotaView, stored: QuotaView) -> None:
    """``write_view`` given the stored view of the same shares in the same order: every share
    row's ``computed_at`` in one UPDATE, then the rows that changed, came or went."""
    session.execute(update(table_of(ShareViewRow)).values(computed_at=view.computed_at))
    changed_shares = [
        {"share": new.share, **_share_fields(new)}
        for old, new in zip(stored.shares, view.shares, strict=True)
        if _share_fields(old) != _share_fields(new)
    ]
    if changed_shares:
        update_by_key(session, ShareViewRow, changed_shares)  # one executemany by primary key
    _sync(session, ShareTypeViewRow, _type_rows(stored), _type_rows(view))
    _sync(session, PlaceableViewRow, _placeable_rows(stored), _placeable_rows(view))


def _share_fields(share: ShareView) -> dict[str, Any]:
    """A share row's columns beside its key, its position and ``computed_at``."""
    return {name: getattr(share, name) for name in _SHARE_FIELDS}


def _type_rows(view: QuotaView) -> dict[tuple[str, ...], dict[str, Any]]:
    return {(s.share, t.instance_type): {"share": s.share, **_fields(t)} for s in view.shares for t in s.types}


def _placeable_rows(view: QuotaView) -> dict[tuple[str, ...], dict[str, Any]]:
    return {
        (p.share, p.instance_type, p.training_plan or ""): {
            "share": p.share,
            "instance_type": p.instance_type,
            "training_plan": p.training_plan or "",
            "most": p.most,
            "blocked_by": p.blocked_by,
        }
        for p in view.placeable
    }


def _sync(
    session: Session,
    model: type[ShareTypeViewRow] | type[PlaceableViewRow],
    stored: dict[tuple[str, ...], dict[str, Any]],
    wanted: dict[tuple[str, ...], dict[str, Any]],
) -> None:
    """Make ``model``'s rows, stored as ``stored``, be ``wanted`` (both by primary key): a
    DELETE of the keys gone, an UPDATE of the rows changed, an INSERT of the new ones."""
    keys = model.__mapper__.primary_key
    gone = [key for key in stored if key not in wanted]
    if gone:
        session.execute(delete(table_of(model)).where(tuple_(*keys).in_(gone)))
    changed = [row for key, row in wanted.items() if key in stored and stored[key] != row]
    if changed:
        update_by_key(session, model, changed)
    insert_rows(session, model, [row for key, row in wanted.items() if key not in stored])


def read_view(session: Session) -> QuotaView:
    """The view the leader last wrote; empty before its first commit."""
    types: dict[str, list[TypeView]] = {}
    query = select(ShareTypeViewRow).order_by(ShareTypeViewRow.share, ShareTypeViewRow.instance_type)
    for row in session.scalars(query):
        types.setdefault(row.share, []).append(TypeView(**{name: getattr(row, name) for name in _TYPE_FIELDS}))
    rows = list(session.scalars(select(ShareViewRow).order_by(ShareViewRow.position)))
    shares = tuple(
        ShareView(
            share=row.share,
            strategy=row.strategy,
            state=row.state,
            borrow_limit=row.borrow_limit,
            in_share_preemption=row.in_share_preemption,
            in_share_preemption_after_seconds=row.in_share_preemption_after_seconds,
            max_priority=row.max_priority,
            running=row.running,
            runnable=row.runnable,
            oldest_runnable_since=row.oldest_runnable_since,
            starvation_threshold_seconds=row.starvation_threshold_seconds,
            normal_wait_seconds=row.normal_wait_seconds,
            starvation_fixed=row.starvation_fixed,
            starvation_multiple=row.starvation_multiple,
            types=tuple(types.get(row.share, ())),
        )
        for row in rows
    )
    return QuotaView(shares, tuple(read_placeable(session)), rows[0].computed_at if rows else None)


@dataclass(frozen=True, slots=True)
class LatestConfiguration:
    """The latest configuration version stored (``airflow-quota apply``; None: none yet) and
    whether a quota scheduler has taken it in: until one has, the view readers show is not
    that version's."""

    version: int | None
    taken_in: bool


def read_shown_view(session: Session) -> tuple[QuotaView, LatestConfiguration]:
    """The view every reader shows, with the latest configuration and whether a quota
    scheduler has taken it in. It is the leader's view (``read_view``) once a scheduler has
    committed one; before that, the latest stored configuration's shares and limits with
    nothing used, borrowed, lent or waiting (``configured_view``; ``computed_at`` None). A
    view of an earlier version stays shown until the leader takes the latest in: its jobs
    still hold what it shows."""
    version = session.scalar(select(func.max(ConfigVersion.id)))
    waiting_config = session.scalar(select(func.count()).where(Request.handled.is_(False), Request.kind == "config"))
    latest = LatestConfiguration(version, taken_in=version is not None and not waiting_config)
    view = read_view(session)
    if view.computed_at is None and version is not None:
        row = session.get(ConfigVersion, version)
        assert row is not None
        view = configured_view(stored_config(row.document))
    return view, latest


def configured_view(config: QuotaConfig) -> QuotaView:
    """The view of ``config`` before any job: ``core.visibility.share_view`` of a fresh state,
    each share's limits with nothing used, borrowed, lent or waiting; nothing computed by a
    leader (``computed_at`` None) and no placeable figures (those need the leader's state)."""
    return QuotaView(ViewBuilder().shares_of(QuotaState(config, EPOCH)))


def read_placeable(session: Session, share: str | None = None) -> list[Placeable]:
    """What the leader last wrote of what a new job (of ``share``) could be placed on now."""
    query = select(PlaceableViewRow).order_by(
        PlaceableViewRow.share, PlaceableViewRow.instance_type, PlaceableViewRow.training_plan
    )
    if share is not None:
        query = query.where(PlaceableViewRow.share == share)
    return [
        Placeable(row.share, row.instance_type, row.training_plan or None, row.most, row.blocked_by)
        for row in session.scalars(query)
    ]


def _fields(view: TypeView) -> dict[str, Any]:
    return {name: getattr(view, name) for name in _TYPE_FIELDS}


def share_placeable(session: Session, share: str) -> tuple[ShareViewRow, list[Placeable]] | None:
    """One share's row of the view and what a new job of it could be placed on now; None when
    the leader's view has no such share."""
    row = session.get(ShareViewRow, share)
    return None if row is None else (row, read_placeable(session, share))
