"""Property tests over random configurations and event sequences (docs/model.md sections 4, 6
and 8; the strategies and the invariant check are in ``properties.py``):

- after every cycle the invariant of section 4 holds, and no share holds more than it may;
- every job is finished with a reason, RUNNABLE with a pending reason, or holding capacity;
- every preemption is followed by the placement it was for;
- the cycle only skips jobs that could not fit: a scheduler that rescans every job and type
  each cycle (the spec taken literally) makes exactly the same decisions;
- the same input gives the same output;
- while the pool is full no queued job's entry fits without victims (steps 2 and 3 then
  look at nothing).
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings

from airflow_quota.core.cycle import QuotaScheduler
from airflow_quota.core.model import Alert, AlertKind, Decision, Entry, FailureReason, Placed, Preempted
from airflow_quota.sim.report import build_report, to_json
from airflow_quota.sim.scenario import LoadedScenario
from airflow_quota.sim.simulator import Simulator
from tests.core.properties import after_every_cycle, full_load, one_busy_type, run_checked, scenarios


def describe(decisions: list[Decision]) -> list[str]:
    return [repr(d) for d in decisions]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_invariants_hold_after_every_cycle(loaded: LoadedScenario) -> None:
    decisions = run_checked(loaded)
    violated = [d for d in decisions if isinstance(d, Alert) and d.kind is AlertKind.GUARANTEE_VIOLATED]
    assert not violated, f"a guarantee went unmet: {violated[0]}"
    for i, decision in enumerate(decisions):
        if isinstance(decision, Preempted):
            later = [d for d in decisions[i:] if d.job == decision.by and isinstance(d, Placed)]
            cancelled = any(
                d.job == decision.by and getattr(d, "reason", None) is FailureReason.CANCELLED for d in decisions[i:]
            )
            assert later or cancelled, f"{decision.job} was preempted for {decision.by}, which was never placed"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_incremental_cycle_decides_as_a_full_rescan(loaded: LoadedScenario) -> None:
    assert describe(run_checked(loaded)) == describe(run_checked(loaded, literal=True))


@settings(max_examples=30, deadline=None)
@given(scenarios())
def test_same_input_same_output(loaded: LoadedScenario) -> None:
    first = to_json(build_report(Simulator(loaded).run()))
    second = to_json(build_report(Simulator(loaded).run()))
    assert first == second


def test_incremental_cycle_decides_as_a_full_rescan_at_full_load() -> None:
    """The same check on a busy pool: 2,500 jobs, 20 shares x 5 types, queues, borrowing and
    preemption all happening (the benchmark's workload)."""
    loaded = full_load(2500)
    incremental = describe(run_checked(loaded))
    assert sum(1 for d in incremental if d.startswith("Preempted")) > 50
    assert not [d for d in incremental if "GUARANTEE_VIOLATED" in d]
    assert incremental == describe(run_checked(loaded, literal=True))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_step_4s_bound_is_room_or_reclaim_for_every_count(loaded: LoadedScenario) -> None:
    """Step 4 admits a bucket only when its count is within ``reclaim_bound``: after every
    cycle, for every share, type and count, ``room_or_reclaim`` holds exactly up to that bound
    (a bound that cut one count short would leave a job that could reclaim waiting)."""
    from airflow_quota.core.index.fast import reclaim_bound, room_or_reclaim

    mismatches: list[str] = []
    compared = 0

    def compare(scheduler: QuotaScheduler, now: float) -> None:
        nonlocal compared
        state = scheduler.state
        for share in state.shares:
            for name, ledger in state.types.items():
                bound = reclaim_bound(state, share, name, now)
                for count in range(1, ledger.capacity + 3):
                    compared += 1
                    if room_or_reclaim(state, share, name, count, now) != (count <= bound):
                        mismatches.append(f"t={now:g} {share} {count}x {name}: bound {bound}")

    after_every_cycle(loaded, compare)
    assert compared > 0
    assert not mismatches, mismatches[:5]


def _full_pool_premise(loaded: LoadedScenario) -> tuple[int, list[str]]:
    """Run the scenario; each time a step asks whether the pool is full and it is
    (``QuotaState.full``), check every entry of every queued job in the modes of steps 2 and 3.
    Returns how many full answers were checked and the entries that would have fitted."""
    from unittest.mock import patch

    from airflow_quota.core.lifecycle import queued
    from airflow_quota.core.rules.placement import Mode, placement_check
    from airflow_quota.core.state import QuotaState

    simulator = Simulator(loaded)
    scheduler = simulator.scheduler
    fitted: list[str] = []
    full_answers = 0
    cycle_at = [0.0]
    run_cycle, full = scheduler.run_cycle, QuotaState.full

    def timed_cycle(now: float) -> list[Decision]:
        cycle_at[0] = now
        return run_cycle(now)

    def checked_full(self: QuotaState) -> bool:
        nonlocal full_answers
        if not full(self):
            return False
        full_answers += 1
        now = cycle_at[0]
        for job in self.jobs.values():
            if queued(job):
                for entry in job.entries:
                    for mode in (Mode.WITHIN_QUOTA, Mode.BORROW):
                        if placement_check(self, job, entry, mode, now) is None:
                            fitted.append(f"t={now:g} {job.name} {entry} in {mode.name}")
        return True

    scheduler.run_cycle = timed_cycle  # type: ignore[method-assign]
    with patch.object(QuotaState, "full", checked_full):
        simulator.run()
    return full_answers, fitted


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_a_full_pool_fits_no_entry_without_victims(loaded: LoadedScenario) -> None:
    """Steps 2 and 3 look at nothing while the pool is full: that is only sound if no
    queued job's entry then passes the check of either step."""
    _, fitted = _full_pool_premise(loaded)
    assert not fitted, fitted[:5]


def test_a_full_pool_fits_no_entry_without_victims_on_one_busy_type() -> None:
    """The same on a congested pool of one type, where the pool is full after most cycles."""
    full_answers, fitted = _full_pool_premise(one_busy_type())
    assert full_answers > 100
    assert not fitted, fitted[:5]


def _step_4_left_out(loaded: LoadedScenario) -> tuple[int, list[str]]:
    """Run the scenario; after every cycle, for every share and type with waiting jobs, the
    jobs of the buckets above step 4's ``most`` for the share and type (which never join its
    walk): how many there were, and those that may preempt now all the same (by reclaim, or
    in their share once they have waited, with a victim set that fits them under the share's
    cap) without being in the share's ``Waited`` stream for their count."""
    from airflow_quota.core.index.fast import _Preemption, may_preempt
    from airflow_quota.core.rules.victims import may_preempt_in_share_now, within_cap_with_victims

    wrongly_left_out: list[str] = []
    left_out = 0

    def compare(scheduler: QuotaScheduler, now: float) -> None:
        nonlocal left_out
        state = scheduler.state
        for share, queue in state.queues.items():
            policy = _Preemption(scheduler.state, share, now, None, set())  # type: ignore[arg-type]
            for name, counts in queue.counts.items():
                most = policy.most(share, name)
                for count in counts:
                    if count <= most:
                        continue
                    waited = dict(policy.waited(share, name)).get(count, ())
                    for key in queue.buckets[(name, count)]:
                        left_out += 1
                        job = state.jobs[key[2]]
                        if not may_preempt(state, share, name, count, job, now):
                            continue
                        if not may_preempt_in_share_now(state, job, now):
                            continue  # offered reclaim candidates only, and count is over the bound
                        if not within_cap_with_victims(state, job, Entry(name, count), now):
                            continue  # no victim set fits it under its share's cap
                        if key not in waited:
                            wrongly_left_out.append(f"t={now:g} {share} {count}x {name} job {key[2]}")

    after_every_cycle(loaded, compare)
    return left_out, wrongly_left_out


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_step_4_leaves_out_only_buckets_that_may_not_preempt(loaded: LoadedScenario) -> None:
    """Step 4 lets only a share's buckets within ``reclaim_bound`` join its walk
    (``_Preemption.most``), and its jobs that have waited to preempt in their share come in the
    ``Waited`` stream: no job it leaves out may preempt now."""
    _, wrongly_left_out = _step_4_left_out(loaded)
    assert not wrongly_left_out, wrongly_left_out[:5]


def test_step_4_leaves_out_only_buckets_that_may_not_preempt_at_full_load() -> None:
    """The same on the benchmark's busy pool (in-share preemption in some shares)."""
    left_out, wrongly_left_out = _step_4_left_out(full_load(1000))
    assert left_out > 1000
    assert not wrongly_left_out, wrongly_left_out[:5]


def _waited_disagreements(loaded: LoadedScenario) -> tuple[int, list[str]]:
    """Run the scenario; after every cycle, each share's ``Waited`` jobs per type and per entry
    (its ``patient`` and ``patient_buckets`` indexes, caught up to now) against its RUNNABLE
    jobs that may preempt in their share now, worked out from scratch: how many such jobs there
    were, and every difference."""
    from airflow_quota.core.lifecycle import queued
    from airflow_quota.core.rules.victims import may_preempt_in_share_now

    differences: list[str] = []
    patient = 0

    def compare(scheduler: QuotaScheduler, now: float) -> None:
        nonlocal patient
        state = scheduler.state
        for share, queue in state.queues.items():
            queue.take_patient(now)
            expected: dict[Any, set[tuple[int, float, int]]] = {}
            for key in queue.runnable:
                job = state.jobs[key[2]]
                if queued(job) and may_preempt_in_share_now(state, job, now):
                    patient += 1
                    for entry in job.entries:
                        expected.setdefault(entry.instance_type, set()).add(key)
                        expected.setdefault((entry.instance_type, entry.count), set()).add(key)
            indexed = {
                at: set(keys) for index in (queue.patient, queue.patient_buckets) for at, keys in index.items() if keys
            }
            if indexed != expected:
                differences.append(f"t={now:g} {share}: indexed {indexed}, expected {expected}")

    after_every_cycle(loaded, compare)
    return patient, differences


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_the_waited_index_holds_exactly_the_jobs_that_may_preempt_in_their_share(loaded: LoadedScenario) -> None:
    """The ``Waited`` stream step 4 walks (``ShareQueue.patient``) is kept up to date through
    submissions, placements, requeues, priority changes and changes of the share's wait."""
    _, differences = _waited_disagreements(loaded)
    assert not differences, differences[:3]


def test_the_waited_index_at_full_load() -> None:
    """The same on the benchmark's busy pool, where many jobs wait past the share's wait."""
    patient, differences = _waited_disagreements(full_load(1000))
    assert patient > 1000
    assert not differences, differences[:3]


def _may_act_missed(loaded: LoadedScenario) -> tuple[int, list[str]]:
    """Run the scenario; after every cycle, for every type and for all types together, the
    shares for which ``_may_preempt_in`` holds: how many, and those ``_shares_that_may_act``
    leaves out."""
    from airflow_quota.core.index.fast import _may_preempt_in, _shares_that_may_act

    missed: list[str] = []
    held = 0

    def compare(scheduler: QuotaScheduler, now: float) -> None:
        nonlocal held
        state = scheduler.state
        for improved in [set(state.types), *({name} for name in state.types)]:
            may_act = _shares_that_may_act(state, improved)
            for share in state.queues:
                if _may_preempt_in(state, share, improved, now):
                    held += 1
                    if not (may_act is None or share in may_act):
                        missed.append(f"t={now:g} {share} on {sorted(improved)}")

    after_every_cycle(loaded, compare)
    return held, missed


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_step_4_asks_only_shares_that_may_act_whether_they_may_preempt(loaded: LoadedScenario) -> None:
    """Step 4 asks ``_may_preempt_in`` only of the shares ``_shares_that_may_act`` gives (a
    set worked out per type): none for which it holds is left out."""
    _, missed = _may_act_missed(loaded)
    assert not missed, missed[:5]


def test_step_4_asks_only_shares_that_may_act_on_one_busy_type() -> None:
    """The same on a congested pool of one type, with in-share preemption in one share."""
    held, missed = _may_act_missed(one_busy_type())
    assert held > 50
    assert not missed, missed[:5]
