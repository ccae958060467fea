"""The attempts not ended, as the leader last committed them: ``OpenAttempts``.

The leader is the only writer of attempts, so it keeps them up to date from its own commits
instead of reading them at every step; recovery (and any error in a step) reloads them. The
step reads from here which attempts to follow (``in_order``), which backend actions are
pending (``with_action_in_order``), and which attempts changed since it last looked
(``take_to_recheck``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from airflow_quota.service.polling import ActionOutcome, AttemptKey
from airflow_quota.store.models import Attempt, EventRow

ATTEMPT_COLUMNS = tuple(column.key for column in Attempt.__table__.columns)
_ATTEMPT_KEY = ("job_id", "number")


class OpenAttempts:
    """The open attempts (detached rows), by key, with what the step needs of them."""

    def __init__(self) -> None:
        self.by_key: dict[AttemptKey, Attempt] = {}
        self.by_job: dict[int, set[int]] = {}
        """The numbers of each job's open attempts."""
        self.with_action: set[AttemptKey] = set()
        """The open attempts with a backend action pending (a start or a stop)."""
        self.to_recheck: set[AttemptKey] | None = None
        """The open attempts whose latest report the next step looks at besides the ones the
        poller has news of: those changed since (a commit, a backend action done) and those whose
        report was news not resolved yet. None: every open attempt (just loaded)."""
        self.placement_order: dict[int, int] = {}
        """Each job's latest placement, as a number that grows with each one (the PLACED event's
        id for the ones loaded): the open attempts' order after their instant."""
        self.placements = 0
        """The largest number in ``placement_order`` so far."""
        self.loaded = False
        """Whether they were read since the process took the lease, or since a step failed."""

    def forget(self) -> None:
        """Read them again at their next use: what this process kept may not be what is committed."""
        self.loaded = False

    def load(self, session: Session) -> None:
        """Read the attempts not ended, with each job's latest PLACED decision (its order); the
        next step looks at all of them (``to_recheck`` is None)."""
        placed = (
            select(func.max(EventRow.id))
            .where(EventRow.job_id == Attempt.job_id, EventRow.type == "PLACED")
            .correlate(Attempt)
            .scalar_subquery()
        )
        loaded = session.execute(select(Attempt, placed).where(Attempt.ended_at.is_(None))).all()
        self.by_key = {(attempt.job_id, attempt.number): attempt for attempt, _ in loaded}
        self.by_job = {}
        for job_id, number in self.by_key:
            self.by_job.setdefault(job_id, set()).add(number)
        self.with_action = {key for key, attempt in self.by_key.items() if attempt.action is not None}
        self.to_recheck = None
        self.placement_order = {attempt.job_id: event_id or 0 for attempt, event_id in loaded}
        self.placements = max(self.placement_order.values(), default=0)
        self.loaded = True

    def get(self, key: AttemptKey) -> Attempt | None:
        return self.by_key.get(key)

    def in_order(self) -> list[Attempt]:
        """The open attempts with no backend action pending, in the order they were placed (the
        order a recovered leader reads them in, so a failover changes no decision)."""
        order = self.placement_order
        return sorted(
            (attempt for attempt in self.by_key.values() if attempt.action is None),
            key=lambda a: (a.placed_at, order.get(a.job_id, 0), a.job_id, a.number),
        )

    def with_action_in_order(self) -> list[Attempt]:
        """The open attempts with a backend action pending, in the order they were placed."""
        return sorted((self.by_key[key] for key in self.with_action), key=lambda a: (a.placed_at, a.job_id, a.number))

    def take_to_recheck(self) -> set[AttemptKey]:
        """The attempts changed since the last call (and the unresolved ones), from now on none."""
        assert self.to_recheck is not None
        changed, self.to_recheck = self.to_recheck, set()
        return changed

    def copies_of(self, job_ids: Iterable[int]) -> dict[int, dict[int, Attempt]]:
        """Detached copies of these jobs' open attempts, by job id and number, for a commit to
        change and write; the kept ones are replaced by them once committed (``committed``)."""
        found: dict[int, dict[int, Attempt]] = {}
        for job_id in sorted(job_ids):
            for number in sorted(self.by_job.get(job_id, ())):
                found.setdefault(job_id, {})[number] = copy_attempt(self.by_key[job_id, number])
        return found

    def changed(self, key: AttemptKey, attempt: Attempt | None) -> None:
        """Keep ``attempt`` (None: ended) as the open attempt ``key`` now is, as committed."""
        if attempt is None:
            self.by_key.pop(key, None)
            numbers = self.by_job.get(key[0])
            if numbers is not None:
                numbers.discard(key[1])
                if not numbers:
                    del self.by_job[key[0]]
        else:
            self.by_key[key] = attempt
            self.by_job.setdefault(key[0], set()).add(key[1])
        if attempt is not None and attempt.action is not None:
            self.with_action.add(key)
        else:
            self.with_action.discard(key)
        if self.to_recheck is not None:
            self.to_recheck.add(key)

    def committed(self, attempts: dict[int, dict[int, Attempt]], placed: list[Attempt]) -> None:
        """After a commit: the attempts it wrote, as committed, replace the open ones kept;
        ``placed`` (in the order of their PLACED decisions) are numbered after the ones before."""
        if not self.loaded:
            return
        for attempt in placed:
            self.placements += 1
            self.placement_order[attempt.job_id] = self.placements
        for job_attempts in attempts.values():
            for attempt in job_attempts.values():
                key = (attempt.job_id, attempt.number)
                if attempt.ended_at is None:
                    self.changed(key, attempt)
                elif key in self.by_key:
                    self.changed(key, None)

    def marked_done(self, outcome: ActionOutcome, values: dict[str, Any]) -> None:
        """After an outcome was written (the attempt still had that action): the open attempt
        kept changes as its row did."""
        attempt = self.by_key.get(outcome.key) if self.loaded else None
        if attempt is not None and attempt.action == outcome.kind.value:
            for name, value in values.items():
                setattr(attempt, name, value)
            self.changed(outcome.key, attempt)


def attempt_values(attempt: Attempt) -> tuple[Any, ...]:
    return tuple(getattr(attempt, name) for name in ATTEMPT_COLUMNS)


def attempt_row(attempt: Attempt) -> dict[str, Any]:
    """An attempt's columns by name, as ``insert_rows`` takes them."""
    return dict(zip(ATTEMPT_COLUMNS, attempt_values(attempt), strict=True))


def copy_attempt(attempt: Attempt) -> Attempt:
    """A detached copy, to change without touching the one kept until the change is committed."""
    return Attempt(**attempt_row(attempt))


def keyed(attempts: dict[int, dict[int, Attempt]]) -> Iterator[tuple[AttemptKey, Attempt]]:
    for job_id, numbered in attempts.items():
        for number, attempt in numbered.items():
            yield (job_id, number), attempt


def attempt_changes(
    attempts: dict[int, dict[int, Attempt]], before: dict[AttemptKey, tuple[Any, ...]]
) -> list[dict[str, Any]]:
    """For ``update_by_key``: the columns each attempt changed since ``before``; one not in
    ``before`` was placed in this step, and is inserted whole."""
    changes = []
    for key, attempt in keyed(attempts):
        if key not in before:
            continue
        now = attempt_values(attempt)
        changed = {
            name: value
            for name, value, was in zip(ATTEMPT_COLUMNS, now, before[key], strict=True)
            if value != was and name not in _ATTEMPT_KEY
        }
        if changed:
            changes.append({"job_id": key[0], "number": key[1], **changed})
    return changes
