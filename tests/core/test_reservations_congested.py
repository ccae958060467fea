"""Section 8's reservations on the congested workloads (docs/model.md section 8, with section 4's
guarantee): ``benchmarks.congested.scenario(300, seed, reservations=True)`` for seeds 1 to 8,
every share reserving, with in-share preemption after 0 s where a share has it. After every
cycle (``Simulator.after_each_cycle``):

1. no job waits with an entry that step 2 would place now (within its share's limit, the
   invariant holding, no starving job ahead in its share reserving the type): a reservation
   that moves to a job ahead of the former holder frees what it no longer covers in the same
   cycle;
2. every job reported HELD_FOR_STARVING_JOB is held by a reservation that the rule gives:
   either its own share's holder is ahead of it and lists the type it waits for, or every
   placement of that entry would increase borrowed(T) (without victims ``U_s(T) + n > L_s(T)``,
   and so also after the in-share victims it may take) and an earlier job in borrowing order
   holds the type pool-wide (a starving holder of a LEND_AND_BORROW share whose entry on it is
   above its share's limit; borrowing order as step 3 has it, a job after the jobs ahead of it
   in its own share), and only the hold stops it (the pool has room for the entry).
   Placements that borrow nothing are never held;
3. each reserving share's holder is its first starving job in queue order;

and over the whole run no GUARANTEE_VIOLATED alert is raised, and (4.) the cycle, which looks
only where something got easier, decides exactly as one that rescans every job and type before
each cycle: what a reservation stops holding (it moves to a job ahead of the holder, or its
holder or a held job changes place in borrowing order) is looked at again at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from airflow_quota.core.cycle import QuotaScheduler
from airflow_quota.core.model import Alert, AlertKind, Decision, Entry, Job, PendingReason
from airflow_quota.core.queues import victim_key
from airflow_quota.core.quota import Block
from airflow_quota.core.rules.placement import Mode, placement_check
from airflow_quota.core.rules.victims import may_preempt_in_share_now
from airflow_quota.core.state import QuotaState
from airflow_quota.core.visibility import pending_reason
from airflow_quota.sim.scenario import LoadedScenario, parse_scenario
from airflow_quota.sim.simulator import Simulator
from benchmarks import congested

SEEDS = range(1, 9)
JOBS = 300


def _holders(state: QuotaState) -> dict[str, Job]:
    """Each share's reservation holder."""
    holders = {}
    for name, queue in state.queues.items():
        key = queue.holder()
        if key is not None:
            holders[name] = state.jobs[key[2]]
    return holders


def _in_share_victims_free(state: QuotaState, job: Job, instance_type: str, now: float) -> int:
    """Instances of the type the job could take from its own share's lower-priority jobs now
    (in-share preemption, once it has waited for it; protected and stopping jobs are left out)."""
    if not may_preempt_in_share_now(state, job, now):
        return 0
    protection = state.shares[job.share].preemption_protection_seconds
    freed = 0
    for key in state.queues[job.share].running.get(instance_type, ()):
        victim = state.jobs[-key[3]]
        assert victim.placement is not None
        if victim_key(victim)[0] >= job.priority:
            break
        if not victim.stopping and now - victim.placement.placed_at >= protection:
            freed += victim.placement.entry.count
    return freed


def _borrowing_place(state: QuotaState, job: Job) -> tuple[float, int, tuple[int, float, int]]:
    """Where the queued job stands in step 3's borrowing order (docs/model.md rule 4.3.3): at the
    latest (first submission, seq) among it and the jobs ahead of it in its share's queue, which
    it is considered only after; ties (the same latest job) in queue order."""
    ahead = [state.jobs[key[2]] for key in state.queues[job.share].runnable if key <= job.key]
    latest = max((j.submitted_at, j.seq) for j in ahead)
    return (latest[0], latest[1], job.key)


def _why_held_wrongly(state: QuotaState, job: Job, entry: Entry, holders: dict[str, Job], now: float) -> str | None:
    """Why the rule does not hold ``job`` on ``entry``, or None when it does (property 2)."""
    name, n = entry.instance_type, entry.count
    own = holders.get(job.share)
    if own is not None and own.key < job.key and name in own.instance_types:
        return None
    ledger = state.types[name]
    usage, limit = ledger.usage_of(job.share), ledger.limit_of(job.share)
    if usage + n <= limit:
        return f"{n}x {name} fits under its share's limit ({usage} of {limit} used): it borrows nothing"
    if usage - _in_share_victims_free(state, job, name, now) + n <= limit:
        return f"{n}x {name} fits under its share's limit after an in-share preemption: it borrows nothing"
    place = _borrowing_place(state, job)
    earlier = [
        h
        for h in holders.values()
        if _borrowing_place(state, h) < place
        and state.shares[h.share].borrows
        and name in h.instance_types
        and h.entry_on(name).count > ledger.limit_of(h.share)
    ]
    if not earlier:
        return f"no earlier holder in borrowing order asks for {name} above its share's limit"
    if ledger.used + ledger.draining + n > ledger.capacity:
        return f"the pool has no room for {n}x {name}: the hold is not what stops it"
    return None


def problems_after_cycle(scheduler: QuotaScheduler, now: float) -> list[str]:
    """Properties 1 to 3 after one cycle."""
    state = scheduler.state
    holders = _holders(state)
    problems = []
    for name, queue in state.queues.items():
        starving = sorted(state.jobs[key[2]].key for key in queue.starving)
        expected = starving[0] if starving and queue.reserving else None
        if queue.holder() != expected:
            problems.append(f"t={now:g}: {name}'s holder is {queue.holder()}, its first starving job {expected}")
    for job in state.jobs.values():
        if not scheduler.queued(job):
            continue
        for entry in job.entries:
            if placement_check(state, job, entry, Mode.WITHIN_QUOTA, now) is None:
                problems.append(f"t={now:g}: {job.name} [{job.share}] waits though step 2 would place {entry}")
        reason, waiting_for = pending_reason(state, job, now)
        if reason is PendingReason.HELD_FOR_STARVING_JOB:
            entry = next(e for e in job.entries if str(e) == waiting_for)
            why = _why_held_wrongly(state, job, entry, holders, now)
            if why is not None:
                who = {share: h.name for share, h in holders.items()}
                problems.append(f"t={now:g}: {job.name} [{job.share}] HELD_FOR_STARVING_JOB: {why}; holders {who}")
    return problems


def workload(seed: int) -> LoadedScenario:
    """The seed's congested workload with every share reserving."""
    return parse_scenario(yaml.safe_load(congested.scenario(JOBS, seed, reservations=True)), Path("."))


@dataclass
class Run:
    decisions: list[Decision]
    problems: list[str] = field(default_factory=list)
    """What properties 1 to 3 found after every cycle."""
    held: dict[str, int] = field(default_factory=lambda: {"in share": 0, "borrowing": 0})
    """How many times a waiting job was found held after a cycle, by its share's holder and by
    a borrowing hold: the properties are not empty."""

    def violated(self) -> list[Alert]:
        return [d for d in self.decisions if isinstance(d, Alert) and d.kind is AlertKind.GUARANTEE_VIOLATED]


def run(seed: int) -> Run:
    """The seed's workload, properties 1 to 3 checked after every cycle."""
    simulator = Simulator(workload(seed))
    result = Run([])

    def look(scheduler: QuotaScheduler, now: float) -> None:
        result.problems.extend(problems_after_cycle(scheduler, now))
        state = scheduler.state
        for job in state.jobs.values():
            if scheduler.queued(job):
                blocks = {placement_check(state, job, entry, Mode.BORROW, now) for entry in job.entries}
                result.held["in share"] += Block.HELD_FOR_STARVING_JOB in blocks
                result.held["borrowing"] += Block.BORROWING_HELD in blocks

    simulator.after_each_cycle(look)
    result.decisions = simulator.run().decisions
    return result


def rescanning(seed: int) -> list[Decision]:
    """The seed's workload decided by a cycle that looks at every queued job and every type
    (``QuotaScheduler.rescan_next_cycle`` before each cycle): the rules taken literally."""
    simulator = Simulator(workload(seed))
    scheduler = simulator.scheduler
    simulator.after_each_cycle(lambda scheduler, now: scheduler.rescan_next_cycle())
    scheduler.rescan_next_cycle()
    return simulator.run().decisions


@pytest.mark.parametrize("seed", SEEDS)
def test_reservations_keep_guarantees_and_hold_only_by_the_rule(seed: int) -> None:
    result = run(seed)
    violated = result.violated()
    assert not violated, "\n".join(f"t={a.at:g} {a.job} [{a.share}]: {a.reason}" for a in violated)
    assert not result.problems, "\n".join(result.problems[:20])
    assert result.held["in share"] > 0 and result.held["borrowing"] > 0, result.held
    # 4. a reservation that moves, a holder that stands elsewhere in borrowing order: what they
    # no longer hold is looked at again at once, as a cycle that rescans everything would
    assert [repr(d) for d in result.decisions] == [repr(d) for d in rescanning(seed)]
