"""What the rules say of one queued job at one step: ``Admit``, ``Preempt`` or ``Wait``.

A verdict is a value: it changes nothing. The cycle applies it (``Lifecycle.place`` or
``Lifecycle.preempt``), or records why the job waits.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple

from airflow_quota.core.model import Entry, Job, PendingReason, PreemptionKind
from airflow_quota.core.quota import Block


class Step(Enum):
    """The placing steps of a cycle (docs/model.md rule 4.0.5), each with its own check."""

    WITHIN_QUOTA = 2
    """Rule 4.2: under the share's limit, borrowing nothing."""
    BORROWING = 3
    """Rule 4.3: up to the holding cap, with lender protection and the borrowing hold."""
    PREEMPTION = 4
    """Rule 4.4: as step 3, after taking victims if need be."""


PLACED_BECAUSE = {Step.WITHIN_QUOTA: "within its share's limit", Step.BORROWING: "borrowing idle capacity"}
"""The reason a placement of steps 2 and 3 gives (rule 7.3)."""

CAPACITY_BLOCKS = frozenset({Block.NO_PROVIDER_CAPACITY, Block.PLAN_FULL, Block.BACKING_OFF})
"""Blocks that mean quota allows the entry but its source cannot give it now (rule 4.6)."""
SOURCE_BLOCKS = CAPACITY_BLOCKS | {Block.PLAN_NOT_ACTIVE}
"""Blocks of the entry's source: a plan window not open, or no capacity to give."""

_PENDING_REASONS = {
    Block.PLAN_NOT_ACTIVE: PendingReason.WAITING_FOR_PLAN,
    Block.PLAN_FULL: PendingReason.WAITING_FOR_CAPACITY,
    Block.NO_PROVIDER_CAPACITY: PendingReason.WAITING_FOR_CAPACITY,
    Block.BACKING_OFF: PendingReason.WAITING_FOR_CAPACITY,
    Block.HELD_FOR_STARVING_JOB: PendingReason.HELD_FOR_STARVING_JOB,
    Block.BORROWING_HELD: PendingReason.HELD_FOR_STARVING_JOB,
}
"""The blocks that name a pending reason other than WAITING_FOR_QUOTA (rule 3.3)."""


class Candidate(NamedTuple):
    """A job an index offers a placing step. In step 4 the index may name the entries of its
    list to try (in list order), leaving out those it knows no victim set serves now (never one
    that could be served); None is every entry, and steps 2 and 3 always try every entry."""

    job: Job
    entries: tuple[Entry, ...] | None = None


@dataclass(frozen=True, slots=True)
class Admit:
    """The job takes ``entry`` now, ``borrowed`` of its instances above its share's limit."""

    job: Job
    entry: Entry
    borrowed: int


@dataclass(frozen=True, slots=True)
class Preempt:
    """The job takes ``entry`` once ``victims`` are gone (at once when there are none)."""

    job: Job
    entry: Entry
    victims: tuple[tuple[Job, PreemptionKind], ...]


@dataclass(frozen=True, slots=True)
class Wait:
    """The job stays queued: ``blocks`` holds, entry by entry of its list, why that entry
    could not be taken (None, in step 4, for an entry no victim set served or not tried)."""

    job: Job
    blocks: tuple[Block | None, ...]

    @property
    def for_capacity(self) -> bool:
        """Quota allowed an entry but its source had no capacity (rule 4.6 fails a CPU-only
        list for this)."""
        return any(block in CAPACITY_BLOCKS for block in self.blocks)

    @property
    def reason(self) -> tuple[PendingReason, Entry]:
        """The pending reason and the entry it names (rule 3.3): the first entry quota allows
        names what else stops it; otherwise the job waits for quota on its first entry."""
        for entry, block in zip(self.job.entries, self.blocks, strict=True):
            reason = _PENDING_REASONS.get(block) if block is not None else None
            if reason is not None:
                return reason, entry
        return PendingReason.WAITING_FOR_QUOTA, self.job.entries[0]


Verdict = Admit | Preempt | Wait
