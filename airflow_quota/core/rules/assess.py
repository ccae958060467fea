"""The rules of a placing step for one job (docs/model.md rules 4.2, 4.3 and 4.4): ``assess``.

Everything here reads the state and changes nothing; nothing is remembered between calls. What
a step may skip because it cannot fit is the index's business (``core/index/``), never the rules'.
"""

from __future__ import annotations

from airflow_quota.core.model import Entry, Job
from airflow_quota.core.quota import Block
from airflow_quota.core.rules.placement import Mode, placement_check
from airflow_quota.core.rules.verdicts import Admit, Preempt, Step, Verdict, Wait
from airflow_quota.core.rules.victims import find_victims
from airflow_quota.core.state import QuotaState

_MODES = {Step.WITHIN_QUOTA: Mode.WITHIN_QUOTA, Step.BORROWING: Mode.BORROW}


def assess(job: Job, step: Step, state: QuotaState, now: float, entries: tuple[Entry, ...] | None = None) -> Verdict:
    """What ``step`` does with the queued job now: the first entry of its list that the step's
    check allows is admitted (steps 2 and 3), or the first entry for which a victim set exists
    (step 4, the set possibly empty); otherwise the job waits, each entry with its block.

    ``entries`` (step 4 only) leaves out entries the caller knows no victim set serves now."""
    if step is Step.PREEMPTION:
        return _assess_preemption(job, state, now, job.entries if entries is None else entries)
    if entries is not None:
        raise ValueError(f"step {step.value} tries every entry of a job's list; only step 4 may leave some out")
    mode = _MODES[step]
    blocks: list[Block | None] = []
    for entry in job.entries:
        block = placement_check(state, job, entry, mode, now)
        if block is None:
            return Admit(job, entry, state.borrowed_by(job.share, entry))
        blocks.append(block)
    return Wait(job, tuple(blocks))


def _assess_preemption(job: Job, state: QuotaState, now: float, entries: tuple[Entry, ...]) -> Verdict:
    for entry in entries:
        victims = find_victims(state, job, entry, now)
        if victims is not None:
            return Preempt(job, entry, tuple(victims))
    return Wait(job, (None,) * len(job.entries))


def as_its_share_places(job: Job, state: QuotaState, now: float) -> Wait:
    """Every entry of the job checked as its share would place it (within its limit, or up to
    its holding cap for a share that borrows): the ``Wait`` whose ``reason`` is the job's
    pending reason (rule 3.3). An entry that fits now has no block."""
    mode = Mode.BORROW if state.shares[job.share].borrows else Mode.WITHIN_QUOTA
    return Wait(job, tuple(placement_check(state, job, entry, mode, now) for entry in job.entries))
