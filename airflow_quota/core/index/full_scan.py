"""The full-scan index: at every placing step, every queued job, in the step's rule order.

This is the reference the fast index (``fast.py``) must decide exactly as: it is the model's
text taken literally (docs/model.md rules 4.2 to 4.6), with no memo. It is also what a new
rule is first written against (docs/contributing.md, "Adding a rule"): the property tests
(``tests/core/test_index_equivalence.py``) then show whether the fast index still agrees.
"""

from __future__ import annotations

from collections.abc import Iterator

from airflow_quota.core.index.fast import CycleWork
from airflow_quota.core.lifecycle import Lifecycle, queued
from airflow_quota.core.model import Job
from airflow_quota.core.rules import Candidate, Preempt, Step, borrowing_order, share_order
from airflow_quota.core.state import QuotaState
from airflow_quota.core.steps import Candidates, fail_cpu_only_lists, run_step


def place_queued(life: Lifecycle, now: float, work: CycleWork) -> None:
    """Steps 2 to 5, each over every queued job. The guarantee watch that follows looks at
    every type (``work.improved``)."""
    state = life.state
    waits = work.waits
    run_step(life, Step.WITHIN_QUOTA, _queued(_share_by_share(state)), now, waits)  # 2
    run_step(life, Step.BORROWING, _queued(_borrowing_jobs(state)), now, waits)  # 3
    took = run_step(life, Step.PREEMPTION, _preemption(state), now, waits)  # 4
    if any(isinstance(verdict, Preempt) and verdict.victims for verdict in took):
        run_step(life, Step.WITHIN_QUOTA, _queued(_share_by_share(state)), now, waits)  # 4b
        run_step(life, Step.BORROWING, _queued(_borrowing_jobs(state)), now, waits)
    fail_cpu_only_lists(life, now, waits)  # 5
    work.improved |= set(state.types)
    work.changes.placed = set()


def _queued(jobs: Iterator[Job]) -> Candidates:
    """Steps 2 and 3: every job of ``jobs`` still queued when the step reaches it."""
    for job in jobs:
        if queued(job):
            yield Candidate(job)


def _preemption(state: QuotaState) -> Candidates:
    """Step 4 over the jobs queued when it starts, share by share in share order; no job is
    offered twice in it, nor one of its victims."""
    seen: set[int] = set()
    for job in _share_by_share(state):
        if job.seq in seen or not queued(job):
            continue
        seen.add(job.seq)
        verdict = yield Candidate(job)
        if isinstance(verdict, Preempt):
            seen.update(victim.seq for victim, _ in verdict.victims)


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
