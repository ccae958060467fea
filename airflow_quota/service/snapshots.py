"""The leader's snapshots of the core, and recovery from them (issue 39).

Recovery loads the newest snapshot that loads and replays only the inputs logged after it, so
a new leader's start costs what the live jobs and the last ``snapshot_every`` inputs cost,
whatever the history. A snapshot is written in a transaction fenced like the decisions (an
old leader writes none), right after a commit: the state then is exactly that of the inputs
committed so far, the newest of which it records (``last_input_id``).

A snapshot that does not load (damaged: its checksum differs; or of a format or layout this
version does not read, ``core/snapshot.py``) is skipped, with a warning, for the one before,
then for the whole input log. Retention prunes the inputs that two snapshots cover
(``store/retention.py``): once it has, the whole log no longer rebuilds the state, and when no
snapshot loads either, recovery refuses to lead (``RecoveryImpossible``) rather than lead on a
wrong state.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from airflow_quota.core import snapshot
from airflow_quota.core.cycle import QuotaScheduler
from airflow_quota.service.inputs import replay_known, replay_onto
from airflow_quota.store.models import Input as InputRow
from airflow_quota.store.models import RetentionState, Snapshot
from airflow_quota.store.settings import DEFAULT_SNAPSHOT_EVERY

log = logging.getLogger("airflow_quota.scheduler")

REPLAY_CHUNK = 5_000
"""Inputs read from the log at a time during recovery."""


__all__ = [
    "DEFAULT_SNAPSHOT_EVERY",
    "Recovered",
    "RecoveryImpossible",
    "inputs_pruned",
    "recover",
    "recover_whole_log",
    "write_snapshot",
]


class RecoveryImpossible(RuntimeError):
    """No snapshot loads and the inputs before them were pruned: the state cannot be rebuilt."""


@dataclass(frozen=True)
class Recovered:
    """What recovery rebuilt, and from what."""

    scheduler: QuotaScheduler | None
    snapshot_id: int | None
    """The snapshot it started from; None: the whole log."""
    after_input: int
    """The last input the snapshot holds (0 from the whole log)."""
    replayed: int
    """Inputs replayed after it."""
    skipped: tuple[str, ...]
    """Each snapshot skipped, and why."""
    last_input: int = 0
    """The last input the scheduler holds (the snapshot's, or the last replayed)."""


def write_snapshot(session: Session, scheduler: QuotaScheduler, now: float, epoch: int | None) -> Snapshot:
    """Add a snapshot of ``scheduler`` as of the newest input committed (in the caller's
    fenced transaction); the finished jobs nothing refers to are forgotten first."""
    scheduler.forget_finished()
    last_input_id = session.scalar(select(func.max(InputRow.id))) or 0
    data = snapshot.encode(scheduler)
    row = Snapshot(
        last_input_id=int(last_input_id),
        taken_at=now,
        format=snapshot.SNAPSHOT_FORMAT,
        checksum=snapshot.checksum(data),
        size=len(data),
        jobs=len(scheduler.state.jobs),
        payload=data,
        leader_epoch=epoch,
    )
    session.add(row)
    session.flush()
    return row


def recover(session: Session, inputs_pruned: bool) -> Recovered:
    """The newest snapshot that loads and the inputs after it, else the whole log (only when
    ``inputs_pruned`` is False: nothing has been removed from it)."""
    skipped: list[str] = []
    newest_first = session.execute(
        select(Snapshot.id, Snapshot.last_input_id).order_by(Snapshot.last_input_id.desc(), Snapshot.id.desc())
    ).all()
    for snapshot_id, last_input_id in newest_first:
        row = session.get(Snapshot, snapshot_id)
        if row is None:  # pruned meanwhile
            continue
        try:
            if snapshot.checksum(row.payload) != row.checksum:
                raise snapshot.SnapshotUnreadable("its checksum differs: the stored bytes are damaged")
            scheduler = snapshot.decode(row.payload)
        except snapshot.SnapshotUnreadable as exc:
            why = f"snapshot {snapshot_id} (after input {last_input_id}) skipped: {exc}"
            log.warning("%s; trying the one before", why)
            skipped.append(why)
            continue
        finally:
            session.expunge_all()  # its payload may be large: not kept in the session
        replayed, last = replay_after(session, scheduler, int(last_input_id))
        return Recovered(scheduler, int(snapshot_id), int(last_input_id), replayed, tuple(skipped), last)
    if inputs_pruned:
        raise RecoveryImpossible(
            "no snapshot could be loaded ("
            + ("; ".join(skipped) or "there is none")
            + ") and retention has pruned the inputs before them, so the input log no longer rebuilds the"
            " state: run the airflow-quota version that wrote the newest snapshot, or restore the database"
        )
    if skipped:
        log.warning("recovering from the whole input log, since no snapshot loads")
    return recover_whole_log(session, tuple(skipped))


def recover_whole_log(session: Session, skipped: tuple[str, ...] = ()) -> Recovered:
    """Every input replayed into a fresh core (what recovery did before snapshots)."""
    from_log: QuotaScheduler | None = None
    replayed = last = 0
    for through, rows in _chunks(session, 0):
        from_log = replay_onto(from_log, rows)
        replayed, last = replayed + len(rows), through
    return Recovered(from_log, None, 0, replayed, skipped, last)


def inputs_pruned(session: Session) -> bool:
    """Whether retention has removed inputs from the log, so that the whole log no longer
    rebuilds the state (``store/retention.py`` records the newest it removed)."""
    return session.scalar(select(RetentionState.inputs_pruned_through)) is not None


def replay_after(
    session: Session, scheduler: QuotaScheduler, last_input_id: int, forgotten_ok: bool = False
) -> tuple[int, int]:
    """Feed ``scheduler`` the inputs after id ``last_input_id``; how many, and the last one's id.
    ``forgotten_ok``: an input naming a job the scheduler has forgotten (``forget_finished``)
    is skipped, as the quota service answers it itself (a follower forgets at its own times)."""
    replayed, last = 0, last_input_id
    for through, rows in _chunks(session, last_input_id):
        if forgotten_ok:
            replay_known(scheduler, rows)
        else:
            replay_onto(scheduler, rows)
        replayed, last = replayed + len(rows), through
    return replayed, last


def _chunks(session: Session, after: int) -> Iterable[tuple[int, list[tuple[str, dict[str, Any], float]]]]:
    """The inputs after id ``after``, in order, a chunk at a time (so a long tail is never all
    in memory at once), each with the id of its last input."""
    while True:
        rows = session.execute(
            select(InputRow.id, InputRow.kind, InputRow.payload, InputRow.at)
            .where(InputRow.id > after)
            .order_by(InputRow.id)
            .limit(REPLAY_CHUNK)
        ).all()
        if not rows:
            return
        after = int(rows[-1][0])
        yield after, [(kind, payload, at) for _, kind, payload, at in rows]
