"""The full-scan index: at every placing step, every queued job, in the step's rule order.

This is the reference the fast index (``fast.py``) must decide exactly as: it is the model's
text taken literally (docs/model.md rules 4.2 to 4.6), with no memo. It is also what a new
rule is first written against (docs/contributing.md, "Adding a rule"): the property tests
(``tests/core/test_index_equivalence.py``) then show whether the fast index still agrees.
"""

from __future__ import annotations

from collections.abc import Iterator

from airflow_quota.core.index.fast import CycleWork, fail_fast
from airflow_quota.core.lifecycle import Lifecycle, queued
from airflow_quota.core.model import Job
from airflow_quota.core.rules import PLACED_BECAUSE, Admit, Preempt, Step, Wait, assess, borrowing_order, share_order
from airflow_quota.core.state import QuotaState


def place_queued(life: Lifecycle, now: float, work: CycleWork) -> None:
    """Steps 2 to 5, each over every queued job. The guarantee watch that follows looks at
    every type (``work.improved``)."""
    state = life.state
    waits: set[int] = set()
    _place(life, now, Step.WITHIN_QUOTA, _share_by_share(state), waits)  # 2
    _place(life, now, Step.BORROWING, _borrowing_jobs(state), waits)  # 3
    if _preempt(life, now):  # 4
        _place(life, now, Step.WITHIN_QUOTA, _share_by_share(state), waits)  # 4b
        _place(life, now, Step.BORROWING, _borrowing_jobs(state), waits)
    work.waits = waits
    fail_fast(life, now, work)  # 5
    work.improved |= set(state.types)
    work.changes.placed = set()


def _place(life: Lifecycle, now: float, step: Step, jobs: Iterator[Job], waits: set[int]) -> None:
    """Steps 2 and 3: each job still queued takes what the rules admit; a job that found
    quota but no provider capacity is among ``waits`` for step 5."""
    for job in jobs:
        if not queued(job):
            continue
        verdict = assess(job, step, life.state, now)
        if isinstance(verdict, Admit):
            life.place(job, verdict.entry, verdict.borrowed, now, PLACED_BECAUSE[step])
        elif isinstance(verdict, Wait) and verdict.for_capacity:
            waits.add(job.seq)


def _preempt(life: Lifecycle, now: float) -> bool:
    """Step 4 over the jobs queued when it starts, share by share in share order; no job is
    visited twice in it, nor one of its victims. True when anything was preempted."""
    seen: set[int] = set()
    preempted = False
    for job in _share_by_share(life.state):
        if job.seq in seen or not queued(job):
            continue
        seen.add(job.seq)
        verdict = assess(job, Step.PREEMPTION, life.state, now)
        if isinstance(verdict, Preempt):
            seen.update(victim.seq for victim, _ in verdict.victims)
            preempted = preempted or bool(verdict.victims)
            life.preempt(job, verdict.entry, list(verdict.victims), now)
    return preempted


def _share_by_share(state: QuotaState) -> Iterator[Job]:
    """Steps 2 and 4: shares in share order (taken when the step starts), each share's jobs in
    queue order as the queue stands when the step reaches it."""
    for share in share_order(state, list(state.queues)):
        yield from [state.jobs[key[2]] for key in state.queues[share].runnable]


def _borrowing_jobs(state: QuotaState) -> Iterator[Job]:
    """Step 3: the borrowing shares' queued jobs in borrowing order, taken when the step starts."""
    jobs = [job for share in state.borrowing_shares for job in _queued_in(state, share)]
    yield from borrowing_order(jobs)


def _queued_in(state: QuotaState, share: str) -> list[Job]:
    return [job for key in state.queues[share].runnable if queued(job := state.jobs[key[2]])]
