"""Victim selection (docs/model.md rule 4.4). Only decides; the cycle carries the decision out.

What-if removals are passed to ``placement_check`` as a list of victims, so the state itself
is never changed while a victim set is being looked for.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from itertools import takewhile

from airflow_quota.core.lifecycle import patience_ends
from airflow_quota.core.model import Entry, Job, PreemptionKind
from airflow_quota.core.queues import victim_key, victim_seq
from airflow_quota.core.rules.placement import Mode, placement_check, protected_idle
from airflow_quota.core.state import QuotaState


def _candidates(state: QuotaState, job: Job, entry: Entry, now: float) -> Iterator[tuple[Job, PreemptionKind]]:
    """Victim candidates in order: reclaim candidates (other shares above their limit on the
    type, whatever their priority), then in-share candidates (strictly lower priority, once
    the job has waited long enough).
    Within each group, the order of ``victim_key``, with ties of priority and placement
    time broken by the least work since the last checkpoint. Protected jobs are left out."""
    name, n = entry.instance_type, entry.count
    ledger = state.types[name]
    groups: list[tuple[PreemptionKind, list[Iterator[tuple[int, float, float, int]]]]] = []
    if ledger.usage_of(job.share) + n <= ledger.limit_of(job.share):
        sources = [
            iter(state.queues[other].running.get(name, ()))
            for other, usage in ledger.usage.items()
            if other != job.share and usage > ledger.limit_of(other)
        ]
        groups.append((PreemptionKind.CROSS_SHARE, sources))
    if may_preempt_in_share_now(state, job, now):
        groups.append((PreemptionKind.IN_SHARE, [_lower_priority(state, job, name)]))
    for kind, sources in groups:
        pending: list[Job] = []
        for key in heapq.merge(*sources):
            victim = state.jobs[victim_seq(key)]
            if not _preemptible(state, victim, now):
                continue
            if pending and victim_key(pending[0])[:2] != key[:2]:
                yield from _by_unsaved_work(pending, now, kind)
                pending = []
            pending.append(victim)
        yield from _by_unsaved_work(pending, now, kind)


def _by_unsaved_work(tied: list[Job], now: float, kind: PreemptionKind) -> Iterator[tuple[Job, PreemptionKind]]:
    if len(tied) > 1:
        tied.sort(key=lambda v: (v.unsaved_work(now), -v.submitted_at, -v.seq))
    for victim in tied:
        yield victim, kind


def _lower_priority(state: QuotaState, job: Job, instance_type: str) -> Iterator[tuple[int, float, float, int]]:
    """Victim keys of the jobs of ``job``'s own share on the type with strictly lower priority
    than it, in candidate order."""
    return _below(state, job.share, instance_type, job.priority)


def _below(state: QuotaState, share: str, instance_type: str, priority: int) -> Iterator[tuple[int, float, float, int]]:
    """Victim keys of the share's jobs on the type with a priority below ``priority``, in
    candidate order."""
    return takewhile(lambda key: key[0] < priority, state.queues[share].running.get(instance_type, ()))


def may_preempt_in_share_now(state: QuotaState, job: Job, now: float) -> bool:
    """Its share has in-share preemption and the job has waited, RUNNABLE, for the share's
    ``in_share_preemption_after_seconds`` (docs/model.md rule 4.4.3)."""
    ends = patience_ends(state, job)
    return ends is not None and now >= ends


def within_cap_with_victims(state: QuotaState, job: Job, entry: Entry, now: float) -> bool:
    """Whether the job's share could hold the entry once every candidate in the share is gone
    (victims of other shares free none of its own usage): without, no victim set lets the job
    start on it. A job that has waited to preempt in its share is offered every candidate there;
    for such a job, every job after it in the share's queue (of no higher priority, so offered
    no more candidates) cannot start on the same entry either."""
    priority = job.priority if may_preempt_in_share_now(state, job, now) else None
    return entry.count <= most_under_cap(state, job.share, entry.instance_type, priority, now)


def most_under_cap(state: QuotaState, share: str, instance_type: str, priority: int | None, now: float) -> float:
    """The most instances of the type a job of ``share`` could hold under the share's cap once
    every candidate in the share below ``priority`` is gone (None: a job that may not preempt
    in its share yet, offered none); unbounded for a share without a cap."""
    ledger = state.types[instance_type]
    cap = ledger.cap_of(share)
    if cap is None:
        return float("inf")
    freeable = 0
    if priority is not None:
        for key in _below(state, share, instance_type, priority):
            victim = state.jobs[victim_seq(key)]
            if _preemptible(state, victim, now):
                assert victim.placement is not None
                freeable += victim.placement.entry.count
    return cap - ledger.usage_of(share) + freeable


def _preemptible(state: QuotaState, victim: Job, now: float) -> bool:
    """Neither stopping already nor protected."""
    return not victim.stopping and not _protected(state, victim, now)


def _protected(state: QuotaState, victim: Job, now: float) -> bool:
    """A job placed less than its share's preemption_protection_seconds ago is never a victim."""
    assert victim.placement is not None
    protection = state.shares[victim.share].preemption_protection_seconds
    return protection > 0 and now - victim.placement.placed_at < protection


def find_victims(state: QuotaState, job: Job, entry: Entry, now: float) -> list[tuple[Job, PreemptionKind]] | None:
    """The smallest set of victims, taken greedily in candidate order, that lets ``job`` start
    on ``entry``; then a reverse pass drops every victim whose removal is not needed.
    None when no set works (nothing is preempted then)."""
    if not within_cap_with_victims(state, job, entry, now):
        return None
    ledger = state.types[entry.instance_type]
    idle = protected_idle(state, ledger, now)  # the same for every victim set: nothing changes here
    if placement_check(state, job, entry, Mode.PREEMPT, now, idle=idle) is None:
        return []
    chosen: list[tuple[Job, PreemptionKind]] = []
    removed_from: dict[str, int] = {}
    for victim, kind in _candidates(state, job, entry, now):
        assert victim.placement is not None
        if kind is PreemptionKind.CROSS_SHARE:
            # a share stops being a source once its usage is back at its limit
            left = ledger.usage_of(victim.share) - removed_from.get(victim.share, 0)
            if left <= ledger.limit_of(victim.share):
                continue
        chosen.append((victim, kind))
        removed_from[victim.share] = removed_from.get(victim.share, 0) + victim.placement.entry.count
        if placement_check(state, job, entry, Mode.PREEMPT, now, [v for v, _ in chosen], idle) is None:
            break
    else:
        return None
    for item in reversed(list(chosen)):
        trial = [c for c in chosen if c is not item]
        if placement_check(state, job, entry, Mode.PREEMPT, now, [v for v, _ in trial], idle) is None:
            chosen = trial
    return chosen
