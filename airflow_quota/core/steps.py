"""One placing step of the cycle, as the model reads (docs/model.md rules 4.2, 4.3 and 4.4): the
index offers candidates in the step's rule order, the rules assess each, the verdict is applied,
and the index sees the verdict before it offers the next. Then step 5 (rule 4.6).

Both indexes (``core/index/``) run their steps through ``run_step``: what differs between them is
only which candidates they offer, never what is done with one.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from airflow_quota.core.lifecycle import Lifecycle, queued
from airflow_quota.core.model import FailureReason
from airflow_quota.core.rules import PLACED_BECAUSE, Admit, Candidate, Preempt, Step, Verdict, Wait, assess

Candidates = Generator[Candidate, Verdict, Any]
"""An index's candidates for one step, in rule order; each is sent the verdict it got, once
that verdict is applied (a placement or a preemption changes what the index may skip)."""


def run_step(life: Lifecycle, step: Step, candidates: Candidates, now: float, waits: set[int]) -> list[Admit | Preempt]:
    """Assess each candidate the index offers and apply the verdict; a job whose entry quota
    allowed but its source could not give goes among ``waits`` (step 5 looks at them).
    Returns the verdicts that gave capacity, in the order applied."""
    took: list[Admit | Preempt] = []
    candidate = next(candidates, None)
    while candidate is not None:
        verdict = assess(candidate.job, step, life.state, now, candidate.entries)
        if isinstance(verdict, Wait):
            if verdict.for_capacity:
                waits.add(verdict.job.seq)
        else:
            apply(life, verdict, step, now)
            took.append(verdict)
        try:
            candidate = candidates.send(verdict)
        except StopIteration:
            candidate = None
    return took


def apply(life: Lifecycle, verdict: Admit | Preempt, step: Step, now: float) -> None:
    """Carry a verdict out: a placement (steps 2 and 3), or the victims' preemption and the
    preemptor's placement (step 4)."""
    if isinstance(verdict, Admit):
        life.place(verdict.job, verdict.entry, verdict.borrowed, now, PLACED_BECAUSE[step])
    else:
        life.preempt(verdict.job, verdict.entry, list(verdict.victims), now)


def fail_cpu_only_lists(life: Lifecycle, now: float, waits: set[int]) -> None:
    """Step 5 (rule 4.6): a job of ``waits`` still queued whose list is CPU-only, and that does
    not ask to wait for capacity, fails now: quota allowed it, the provider cannot serve it."""
    state = life.state
    for seq in sorted(waits):
        job = state.jobs[seq]
        if not queued(job) or job.request.wait_for_capacity:
            continue
        if any(state.accelerated(e.instance_type) for e in job.entries):
            continue
        state.dequeue(job)
        life.fail(job, FailureReason.CAPACITY_ERROR, "no provider capacity for a CPU-only list", now)
