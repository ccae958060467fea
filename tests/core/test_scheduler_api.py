"""``QuotaScheduler`` driven directly, without the simulator: events in, the whole list of
decisions out (in the style of a state-machine test). ``reason`` texts are free prose, so they
are matched with ``ANY``; everything else is compared exactly."""

from __future__ import annotations

import copy
from typing import Any
from unittest.mock import ANY

import pytest

from airflow_quota.core.config import parse_config
from airflow_quota.core.cycle import QuotaScheduler
from airflow_quota.core.model import (
    Entry,
    Failed,
    FailureReason,
    JobRequest,
    JobState,
    Placed,
    Preempted,
    PreemptionKind,
    PriorityChanged,
    Requeued,
    Submitted,
)
from airflow_quota.core.rules.placement import Mode, placement_check
from airflow_quota.core.rules.victims import find_victims
from airflow_quota.exceptions import ChangeRefused, SubmissionRejected
from tests.builders import quota, share

G5 = "ml.g5.xlarge"
ONE = Entry(G5, 1)


def make_scheduler() -> QuotaScheduler:
    """The walkthrough's pool plus a DISABLED share:
    borrower (LEND_AND_BORROW, in-share preemption, max_priority 5), lender (LEND),
    reserved (RESERVE), closed (DISABLED); one ml.g5.xlarge each."""
    return QuotaScheduler(
        parse_config(
            quota(
                {G5: 4},
                share(
                    "borrower",
                    {G5: 1},
                    "LEND_AND_BORROW",
                    in_share_preemption=True,
                    in_share_preemption_after_seconds=0,
                    max_priority=5,
                ),
                share("lender", {G5: 1}, "LEND"),
                share("reserved", {G5: 1}, "RESERVE"),
                share("closed", {G5: 1}, "RESERVE", state="DISABLED"),
            )
        )
    )


def request(name: str, share_name: str, priority: int = 0, **fields: Any) -> JobRequest:
    return JobRequest.model_validate(
        {
            "name": name,
            "share": share_name,
            "priority": priority,
            "preferences": [{"instance_type": G5, "count": 1}],
            **fields,
        }
    )


def usage(scheduler: QuotaScheduler) -> dict[str, int]:
    ledger = scheduler.state.types[G5]
    return {s: ledger.usage_of(s) for s in ("borrower", "lender", "reserved", "closed")}


def ledger_state(scheduler: QuotaScheduler) -> dict[str, Any]:
    """A deep copy of everything each ledger keeps (usage and the running sums)."""
    return {
        name: copy.deepcopy(
            {
                "usage": ledger.usage,
                "pressure": ledger.pressure,
                "used": ledger.used,
                "borrowed_total": ledger.borrowed_total,
                "draining": ledger.draining,
                "on_demand_used": ledger.on_demand_used,
                "capacity": ledger.capacity,
                "limits": ledger.limits,
            }
        )
        for name, ledger in scheduler.state.types.items()
    }


# -- submit and place ---------------------------------------------------------------------


def test_submit_then_cycle_gives_submitted_then_placed() -> None:
    scheduler = make_scheduler()
    assert scheduler.submit(request("j1", "borrower"), 0) == [Submitted(0, "j1", "borrower")]
    assert scheduler.run_cycle(0) == [
        Placed(0, "j1", "borrower", entry=ONE, borrowed=0, attempt=1, reason=ANY),
    ]
    job = scheduler.job("j1")
    assert job.state is JobState.SCHEDULED
    assert usage(scheduler) == {"borrower": 1, "lender": 0, "reserved": 0, "closed": 0}


def test_borrowing_and_the_reserve_limit_in_one_cycle() -> None:
    """The first job runs within the limit of 1 and the second borrows the lender's idle
    instance; the third waits: the limits fill the capacity of 4, and the RESERVE shares (one
    of them DISABLED) lend nothing."""
    scheduler = make_scheduler()
    for i in range(3):
        assert scheduler.submit(request(f"j{i}", "borrower"), 0) == [Submitted(0, f"j{i}", "borrower")]
    assert scheduler.run_cycle(0) == [
        Placed(0, "j0", "borrower", entry=ONE, borrowed=0, attempt=1, reason=ANY),
        Placed(0, "j1", "borrower", entry=ONE, borrowed=1, attempt=1, reason=ANY),
    ]
    assert scheduler.job("j2").state is JobState.RUNNABLE
    assert usage(scheduler) == {"borrower": 2, "lender": 0, "reserved": 0, "closed": 0}


def test_submission_to_a_disabled_share_is_rejected_and_nothing_is_stored() -> None:
    scheduler = make_scheduler()
    state = scheduler.state
    jobs_before, names_before = dict(state.jobs), dict(state.live_names)
    ledgers_before = ledger_state(scheduler)
    with pytest.raises(SubmissionRejected, match="DISABLED"):
        scheduler.submit(request("late", "closed"), 0)
    assert state.jobs == jobs_before
    assert state.live_names == names_before
    assert len(state.queues["closed"].runnable) == 0
    assert ledger_state(scheduler) == ledgers_before
    assert scheduler.run_cycle(0) == []
    # the name is still free: nothing was kept of the rejected submission
    assert scheduler.submit(request("late", "reserved"), 1) == [Submitted(1, "late", "reserved")]


# -- set_priority ---------------------------------------------------------------------------


def test_set_priority_above_max_priority_is_refused_and_changes_nothing() -> None:
    scheduler = make_scheduler()
    scheduler.submit(request("a", "borrower", priority=2), 0)
    scheduler.submit(request("b", "borrower", priority=3), 0)
    scheduler.submit(request("c", "borrower", priority=1), 0)
    scheduler.run_cycle(0)  # b and a run, c waits
    waiting = scheduler.job("c")
    queue = scheduler.state.queues["borrower"]
    before = (waiting.priority, waiting.key, list(queue.runnable), {t: list(v) for t, v in queue.running.items()})
    with pytest.raises(ChangeRefused, match="max_priority"):
        scheduler.set_priority(waiting, 6, 10)
    after = (waiting.priority, waiting.key, list(queue.runnable), {t: list(v) for t, v in queue.running.items()})
    assert after == before
    # no PriorityChanged is left behind, and the refused priority preempts nobody
    assert scheduler.run_cycle(10) == []
    # at max_priority the change is accepted and preempts in-share (a control for the above)
    assert scheduler.set_priority(waiting, 5, 20) == [PriorityChanged(20, "c", "borrower", 1, 5)]
    decisions = scheduler.run_cycle(20)
    assert [type(d) for d in decisions] == [Preempted, Placed]
    assert decisions[0] == Preempted(
        20, "a", "borrower", PreemptionKind.IN_SHARE, by="c", lost_seconds=ANY, grace_seconds=0, reason=ANY
    )


# -- cancel -----------------------------------------------------------------------------------


def test_cancel_of_a_running_job_releases_its_capacity_for_a_waiting_job() -> None:
    scheduler = make_scheduler()
    scheduler.submit(request("first", "reserved"), 0)
    scheduler.submit(request("second", "reserved"), 0)
    assert scheduler.run_cycle(0) == [Placed(0, "first", "reserved", entry=ONE, borrowed=0, attempt=1, reason=ANY)]
    ledger = scheduler.state.types[G5]
    pressure_running = ledger.pressure
    running = scheduler.job("first")
    scheduler.job_running(running, 0)
    assert scheduler.cancel(running, 100) == [
        Failed(100, "first", "reserved", FailureReason.CANCELLED, detail=ANY),
    ]
    assert ledger.usage_of("reserved") == 0
    assert ledger.used == 0
    assert ledger.pressure == pressure_running  # RESERVE: the idle limit stays reserved
    assert running.state is JobState.FAILED and running.failure is FailureReason.CANCELLED
    assert scheduler.run_cycle(100) == [
        Placed(100, "second", "reserved", entry=ONE, borrowed=0, attempt=1, reason=ANY),
    ]
    assert ledger.usage_of("reserved") == 1
    with pytest.raises(ChangeRefused):
        scheduler.cancel(running, 200)


def test_cancel_of_a_borrowing_job_lowers_borrowed() -> None:
    scheduler = make_scheduler()
    scheduler.submit(request("own", "borrower"), 0)
    scheduler.submit(request("lent", "borrower"), 0)
    scheduler.run_cycle(0)
    ledger = scheduler.state.types[G5]
    assert (ledger.borrowed_total, ledger.pressure) == (1, 4)
    scheduler.cancel(scheduler.job("lent"), 10)
    assert (ledger.borrowed_total, ledger.pressure, ledger.used) == (0, 3, 1)


# -- failures and retries ---------------------------------------------------------------------


def test_a_failed_attempt_with_retries_left_is_requeued_and_placed_again() -> None:
    scheduler = make_scheduler()
    scheduler.submit(request("flaky", "reserved", retry_attempts=2), 0)
    assert scheduler.run_cycle(0) == [Placed(0, "flaky", "reserved", entry=ONE, borrowed=0, attempt=1, reason=ANY)]
    job = scheduler.job("flaky")
    scheduler.job_running(job, 0)
    assert scheduler.job_finished(job, 100, succeeded=False, reason="ExitCode:1") == [
        Requeued(100, "flaky", "reserved", "ExitCode:1"),
    ]
    assert job.state is JobState.RUNNABLE
    assert scheduler.state.types[G5].usage_of("reserved") == 0
    assert scheduler.run_cycle(100) == [
        Placed(100, "flaky", "reserved", entry=ONE, borrowed=0, attempt=2, reason=ANY),
    ]
    scheduler.job_running(job, 100)
    assert scheduler.job_finished(job, 150, succeeded=False, reason="ExitCode:1") == [
        Failed(150, "flaky", "reserved", FailureReason.ATTEMPTS_EXHAUSTED, detail=ANY),
    ]
    assert scheduler.run_cycle(150) == []


def test_capacity_error_requeues_without_consuming_an_attempt() -> None:
    scheduler = make_scheduler()
    scheduler.submit(request("j", "reserved"), 0)  # retry_attempts defaults to 1
    scheduler.run_cycle(0)
    job = scheduler.job("j")
    assert job.attempts == 1
    scheduler.capacity_error(job, 10, backoff_seconds=60)
    assert job.state is JobState.RUNNABLE
    assert job.placement is None
    assert (job.attempts, job.failed_attempts) == (0, 0)
    assert scheduler.state.types[G5].usage_of("reserved") == 0
    assert scheduler.run_cycle(10) == []  # the entry backs off
    assert scheduler.run_cycle(70) == [Placed(70, "j", "reserved", entry=ONE, borrowed=0, attempt=1, reason=ANY)]
    # the one genuine attempt allowed is still there: a success ends the job
    scheduler.job_running(job, 70)
    scheduler.job_finished(job, 80, succeeded=True)
    assert job.state is JobState.SUCCEEDED


# -- timers -------------------------------------------------------------------------------------


def test_next_timer_is_the_max_pending_deadline() -> None:
    scheduler = make_scheduler()
    scheduler.submit(request("holder", "reserved"), 0)
    scheduler.run_cycle(0)
    scheduler.submit(request("impatient", "reserved", max_pending_seconds=100), 5)
    assert scheduler.run_cycle(5) == []
    assert scheduler.next_timer() == 105
    assert scheduler.run_cycle(105) == [
        Failed(105, "impatient", "reserved", FailureReason.PENDING_TIMEOUT, detail=ANY),
    ]


def test_find_victims_gives_up_at_once_when_no_set_brings_the_share_under_what_it_may_hold() -> None:
    """A RESERVE share with in-share preemption at its limit of 4: two priority-1 jobs of one
    instance each and a priority-5 job of two. A priority-3 job asking 4 could free only the two
    lower ones (2 instances): 4 - 2 + 4 > 4, so no victim set works, and the check agrees even
    with every candidate gone. Asking 2, it takes exactly those two."""
    scheduler = QuotaScheduler(
        parse_config(
            quota(
                {G5: 6},
                share(
                    "team",
                    {G5: 4},
                    "RESERVE",
                    in_share_preemption=True,
                    in_share_preemption_after_seconds=0,
                    max_priority=9,
                ),
            )
        )
    )
    sizes = {"low-a": (1, 1), "low-b": (1, 1), "mid": (5, 2)}
    for name, (priority, count) in sizes.items():
        scheduler.submit(request(name, "team", priority, preferences=[{"instance_type": G5, "count": count}]), 0)
    scheduler.run_cycle(0)
    for name in sizes:
        scheduler.job_running(scheduler.job(name), 0)
    scheduler.submit(request("urgent", "team", 3, preferences=[{"instance_type": G5, "count": 4}]), 10)
    state, urgent = scheduler.state, scheduler.job("urgent")
    lower = [scheduler.job("low-a"), scheduler.job("low-b")]

    assert find_victims(state, urgent, Entry(G5, 4), 10) is None
    assert placement_check(state, urgent, Entry(G5, 4), Mode.PREEMPT, 10, lower) is not None
    taken = find_victims(state, urgent, Entry(G5, 2), 10)
    assert taken is not None and sorted(v.name for v, _ in taken) == ["low-a", "low-b"]
    assert {kind for _, kind in taken} == {PreemptionKind.IN_SHARE}


# -- what-if checks leave the state alone ----------------------------------------------------


def test_find_victims_and_check_do_not_change_the_snapshot() -> None:
    scheduler = make_scheduler()
    scheduler.submit(request("own", "borrower", priority=1), 0)
    scheduler.submit(request("lent", "borrower", priority=1), 0)
    scheduler.run_cycle(0)
    for name in ("own", "lent"):
        scheduler.job_running(scheduler.job(name), 0)
    scheduler.submit(request("owner", "lender"), 100)
    scheduler.submit(request("urgent", "borrower", priority=5), 100)
    state = scheduler.state
    before = ledger_state(scheduler)
    states_before = {j.name: (j.state, j.placement, j.stopping) for j in state.jobs.values()}
    share_usage_before = dict(state.share_usage)

    owner, urgent = scheduler.job("owner"), scheduler.job("urgent")
    reclaim = find_victims(state, owner, ONE, 100)
    assert reclaim == [(scheduler.job("lent"), PreemptionKind.CROSS_SHARE)]
    in_share = find_victims(state, urgent, ONE, 100)
    assert in_share is not None and len(in_share) == 1
    victims = [v for v, _ in reclaim]
    assert placement_check(state, owner, ONE, Mode.PREEMPT, 100, victims) is None
    assert placement_check(state, owner, ONE, Mode.PREEMPT, 100) is not None

    assert ledger_state(scheduler) == before
    assert {j.name: (j.state, j.placement, j.stopping) for j in state.jobs.values()} == states_before
    assert state.share_usage == share_usage_before

    # the cycle then does preempt: the situation above was a real reclaim
    decisions = scheduler.run_cycle(100)
    assert (
        Preempted(
            100,
            "lent",
            "borrower",
            PreemptionKind.CROSS_SHARE,
            by="owner",
            lost_seconds=100,
            grace_seconds=0,
            reason=ANY,
        )
        in decisions
    )
    assert ledger_state(scheduler) != before


# -- in-share preemption waits (README, "In-share preemption waits") ---------------------------


def waiting_team(after: float) -> Any:
    """One RESERVE share of one g5.xlarge with in-share preemption after ``after`` seconds."""
    return parse_config(quota({G5: 1}, share("team", {G5: 1}, "RESERVE", in_share_preemption=True, **waits(after))))


def waits(after: float) -> dict[str, Any]:
    return {"in_share_preemption_after_seconds": after, "max_priority": 9}


def urgent_behind_low() -> QuotaScheduler:
    """``low`` (priority 1) runs on the only instance from t=0; ``urgent`` (9) arrives at 100."""
    scheduler = QuotaScheduler(waiting_team(600))
    scheduler.submit(request("low", "team", 1), 0)
    scheduler.run_cycle(0)
    scheduler.job_running(scheduler.job("low"), 0)
    scheduler.submit(request("urgent", "team", 9), 100)
    return scheduler


def preempted_by(decisions: list[Any], name: str) -> list[str]:
    return [d.job for d in decisions if isinstance(d, Preempted) and d.by == name]


def test_a_job_finds_in_share_victims_only_once_it_has_waited() -> None:
    scheduler = urgent_behind_low()
    state, urgent = scheduler.state, scheduler.job("urgent")
    assert find_victims(state, urgent, ONE, 699) is None
    assert find_victims(state, urgent, ONE, 700) == [(scheduler.job("low"), PreemptionKind.IN_SHARE)]
    assert preempted_by(scheduler.run_cycle(100), "urgent") == []
    assert scheduler.next_timer() == 700  # a cycle when the wait ends, with nothing else happening
    assert preempted_by(scheduler.run_cycle(700), "urgent") == ["low"]


def test_a_wait_shortened_by_a_new_configuration_ends_at_its_new_time() -> None:
    scheduler = urgent_behind_low()
    scheduler.run_cycle(100)
    scheduler.apply_config(waiting_team(300), 200)
    assert preempted_by(scheduler.run_cycle(200), "urgent") == []
    assert scheduler.next_timer() == 400
    assert preempted_by(scheduler.run_cycle(400), "urgent") == ["low"]


def test_a_wait_lengthened_by_a_new_configuration_is_kept() -> None:
    scheduler = urgent_behind_low()
    scheduler.run_cycle(100)
    scheduler.apply_config(waiting_team(1000), 200)
    assert scheduler.next_timer() == 700  # the first wait's end: nothing happens then
    assert preempted_by(scheduler.run_cycle(700), "urgent") == []
    assert scheduler.next_timer() == 1100
    assert preempted_by(scheduler.run_cycle(1100), "urgent") == ["low"]


def test_a_requeued_job_waits_again_from_when_it_became_runnable() -> None:
    """A preempted job's wait counts from its requeue, not from its first submission."""
    scheduler = urgent_behind_low()
    scheduler.run_cycle(700)  # urgent preempts low (grace 0): low is RUNNABLE again at 700
    low = scheduler.job("low")
    assert low.runnable_since == 700
    scheduler.set_priority(low, 9, 710)
    scheduler.set_priority(scheduler.job("urgent"), 0, 720)  # urgent is now low's candidate
    assert find_victims(scheduler.state, low, ONE, 1299) is None
    assert find_victims(scheduler.state, low, ONE, 1300) == [(scheduler.job("urgent"), PreemptionKind.IN_SHARE)]


def test_a_wait_shortened_below_the_time_already_waited_preempts_at_the_next_cycle() -> None:
    scheduler = urgent_behind_low()
    scheduler.run_cycle(100)
    scheduler.apply_config(waiting_team(300), 500)  # urgent has waited 400 s
    assert preempted_by(scheduler.run_cycle(500), "urgent") == ["low"]


def test_the_jobs_that_have_waited_follow_the_configuration() -> None:
    """Step 4 walks a share's jobs that have waited (``ShareQueue.patient``, by count
    ``patient_buckets``) beside its buckets:
    the index follows the wait as configurations lengthen, end and bring it back."""
    scheduler = urgent_behind_low()
    queue, urgent = scheduler.state.queues["team"], scheduler.job("urgent")

    def waited(now: float) -> list[Any]:
        queue.take_patient(now)
        by_count = [key for _, keys in queue.patient_counts(G5) for key in keys]
        assert by_count == list(queue.patient.get(G5, []))  # one count asked: the same jobs
        return by_count

    assert waited(699) == []
    assert waited(700) == [urgent.key]
    scheduler.apply_config(waiting_team(1000), 800)
    assert waited(1099) == []
    assert waited(1100) == [urgent.key]
    no_wait = parse_config(quota({G5: 1}, share("team", {G5: 1}, "RESERVE", max_priority=9)))
    scheduler.apply_config(no_wait, 1200)
    assert queue.patience is None and waited(1200) == []
    scheduler.apply_config(waiting_team(600), 1300)
    assert waited(1300) == [urgent.key]
    scheduler.set_priority(urgent, 5, 1400)  # a new key, the same wait
    assert waited(1400) == [urgent.key]
