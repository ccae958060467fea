"""What a person asks of the queue (docs/model.md section 7): ``pending_reason``, ``pending_view``,
``queue_position``, ``share_view`` and ``most_placeable`` on small states built through the
scheduler's API, and ``most_placeable`` against every count on random scenarios."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from airflow_quota.core.config import parse_config
from airflow_quota.core.cycle import QuotaScheduler
from airflow_quota.core.model import Entry, Job, JobRequest, PendingReason
from airflow_quota.core.quota import Block
from airflow_quota.core.rules.placement import Mode, placement_check
from airflow_quota.core.visibility import (
    PROBE_SEQ,
    most_placeable,
    pending_reason,
    pending_seconds,
    pending_view,
    queue_position,
    share_view,
)
from airflow_quota.sim.scenario import LoadedScenario
from airflow_quota.sim.simulator import Simulator
from tests.builders import quota, share
from tests.core.properties import v2_scenarios

G5 = "ml.g5.xlarge"
P4 = "ml.p4d.24xlarge"


def scheduler_for(*shares: dict[str, Any], capacity: dict[str, int] | None = None, **pool: Any) -> QuotaScheduler:
    return QuotaScheduler(parse_config(quota(capacity or {G5: 2}, *shares, **pool)))


def submit(
    scheduler: QuotaScheduler,
    name: str,
    share_name: str,
    at: float,
    priority: int = 0,
    count: int = 1,
    instance_type: str = G5,
    **entry: Any,
) -> None:
    scheduler.submit(
        JobRequest.model_validate(
            {
                "name": name,
                "share": share_name,
                "priority": priority,
                "preferences": [{"instance_type": instance_type, "count": count, **entry}],
            }
        ),
        at,
    )


# -- pending reasons ------------------------------------------------------------------------


def waiting_for_quota() -> tuple[QuotaScheduler, str, float]:
    s = scheduler_for(share("team", {G5: 1}, "RESERVE"), capacity={G5: 1})
    submit(s, "holder", "team", 0)
    submit(s, "waiter", "team", 0)
    s.run_cycle(0)
    return s, "waiter", 0


def waiting_for_capacity() -> tuple[QuotaScheduler, str, float]:
    s = scheduler_for(share("team", {G5: 1}, "RESERVE"), capacity={G5: 1})
    s.set_provider_available(G5, 0, 0)
    submit(s, "waiter", "team", 0)
    s.run_cycle(0)
    return s, "waiter", 0


def waiting_for_plan() -> tuple[QuotaScheduler, str, float]:
    plan = {"name": "december", "instance_type": P4, "count": 1, "starts_at": 1000, "ends_at": 5000}
    s = scheduler_for(share("team", {P4: 1}, "RESERVE"), capacity={P4: 1}, training_plans=[plan])
    submit(s, "waiter", "team", 0, instance_type=P4, training_plan="december")
    s.run_cycle(0)
    return s, "waiter", 0


def waiting_for_victims() -> tuple[QuotaScheduler, str, float]:
    s = scheduler_for(
        share("borrower", {G5: 1}, "LEND_AND_BORROW", preemption_grace_seconds=60),
        share("lender", {G5: 1}, "LEND"),
    )
    submit(s, "own", "borrower", 0)
    submit(s, "lent", "borrower", 0)
    s.run_cycle(0)
    submit(s, "owner", "lender", 100)
    s.run_cycle(100)  # "lent" is asked to stop and gets 60 s; its instance is held for "owner"
    return s, "owner", 100


def held_for_starving_job() -> tuple[QuotaScheduler, str, float]:
    s = scheduler_for(share("team", {G5: 2}, "RESERVE", starvation_after_seconds=100, starvation_reservation=True))
    submit(s, "holder", "team", 0)
    submit(s, "big", "team", 0, count=2)
    s.run_cycle(0)
    submit(s, "early", "team", 10)  # placed beside "holder": it overtakes "big"
    s.run_cycle(10)
    s.run_cycle(100)  # "big" starves: its type is reserved for it
    s.job_finished(s.job("early"), 120, succeeded=True)
    s.run_cycle(120)
    submit(s, "small", "team", 150)  # would fit on the free instance
    s.run_cycle(150)
    return s, "small", 150


@pytest.mark.parametrize(
    ("build", "reason", "entry"),
    [
        (waiting_for_quota, PendingReason.WAITING_FOR_QUOTA, "1x ml.g5.xlarge"),
        (waiting_for_capacity, PendingReason.WAITING_FOR_CAPACITY, "1x ml.g5.xlarge"),
        (waiting_for_plan, PendingReason.WAITING_FOR_PLAN, "1x ml.p4d.24xlarge on plan december"),
        (waiting_for_victims, PendingReason.WAITING_FOR_VICTIMS, "1x ml.g5.xlarge"),
        (held_for_starving_job, PendingReason.HELD_FOR_STARVING_JOB, "1x ml.g5.xlarge"),
    ],
    ids=[
        "a RESERVE share at its limit waits for quota",
        "quota allows it but the provider has none: waits for capacity",
        "its only entry is a plan whose window has not begun: waits for the plan",
        "capacity is held for it while its victim checkpoints: waits for victims",
        "a starving job ahead of it reserves the type: held for the starving job",
    ],
)
def test_pending_reason(build: Any, reason: PendingReason, entry: str) -> None:
    scheduler, name, now = build()
    job = scheduler.job(name)
    assert pending_reason(scheduler.state, job, now) == (reason, entry)
    assert pending_view(scheduler.state, job, now)["pending_reason"] == reason.value
    assert pending_view(scheduler.state, job, now)["waiting_for"] == entry


def test_a_reserve_share_at_its_limit_does_not_wait_for_capacity_when_the_pool_has_room() -> None:
    """The pool has a free instance (another share's RESERVE limit), but it is not this share's:
    the job waits for quota, not for capacity."""
    s = scheduler_for(share("team", {G5: 1}, "RESERVE"), share("other", {G5: 1}, "RESERVE"))
    submit(s, "holder", "team", 0)
    submit(s, "waiter", "team", 0)
    s.run_cycle(0)
    assert pending_reason(s.state, s.job("waiter"), 0)[0] is PendingReason.WAITING_FOR_QUOTA


# -- positions ----------------------------------------------------------------------------------


def four_waiting_jobs() -> QuotaScheduler:
    """Two RESERVE shares, each full; four jobs wait: by priority, then first submission."""
    s = scheduler_for(share("c1", {G5: 1}, "RESERVE"), share("c2", {G5: 1}, "RESERVE"))
    submit(s, "hold1", "c1", 0)
    submit(s, "hold2", "c2", 0)
    s.run_cycle(0)
    submit(s, "w", "c2", 0.5, priority=1)
    submit(s, "x", "c1", 1, priority=1)
    submit(s, "y", "c1", 2, priority=5)
    submit(s, "z", "c2", 3, priority=5)
    submit(s, "v", "c1", 3, priority=5)  # same priority and time as z, submitted after it
    s.run_cycle(3)
    return s


@pytest.mark.parametrize(
    ("name", "in_share", "in_queue"),
    [("y", 1, 1), ("z", 1, 2), ("v", 2, 3), ("w", 2, 4), ("x", 3, 5)],
    ids=[
        "highest priority, first submitted: first everywhere",
        "same priority, later: first in its share, second in the queue",
        "same priority and time as z, submitted after it: behind z",
        "lower priority, earliest submission: behind every higher priority",
        "lower priority, later than w: last",
    ],
)
def test_positions_are_one_based_by_priority_then_submission(name: str, in_share: int, in_queue: int) -> None:
    s = four_waiting_jobs()
    job = s.job(name)
    view = pending_view(s.state, job, 3)
    assert (view["position_in_share"], view["position_in_queue"]) == (in_share, in_queue)
    assert queue_position(s.state, job) == in_queue


def test_a_running_job_has_no_position() -> None:
    s = four_waiting_jobs()
    view = pending_view(s.state, s.job("hold1"), 3)
    assert (view["position_in_share"], view["position_in_queue"]) == (None, None)


def test_positions_move_up_when_a_job_ahead_is_placed() -> None:
    s = four_waiting_jobs()
    s.cancel(s.job("hold1"), 10)
    s.run_cycle(10)  # y, first in c1, takes the freed instance
    assert pending_view(s.state, s.job("v"), 10)["position_in_share"] == 1
    assert [queue_position(s.state, s.job(n)) for n in ("z", "v", "w", "x")] == [1, 2, 3, 4]


# -- share view -----------------------------------------------------------------------------------


def borrowing_state() -> QuotaScheduler:
    """Capacity 2: the borrower (limit 1) runs 2, one borrowed from the lender's idle instance,
    and has a third job waiting since t=10. ml.c5.xlarge belongs to the lender only."""
    s = scheduler_for(
        share("borrower", {G5: 1}, "LEND_AND_BORROW"),
        share("lender", {G5: 1, "ml.c5.xlarge": 1}, "LEND"),
        capacity={G5: 2, "ml.c5.xlarge": 1},
    )
    submit(s, "own", "borrower", 0)
    submit(s, "lent", "borrower", 0)
    s.run_cycle(0)
    submit(s, "waiting", "borrower", 10)
    s.run_cycle(10)
    return s


def test_share_view_of_a_borrower() -> None:
    view = share_view(borrowing_state().state, "borrower")
    assert view["share"] == "borrower"
    assert view["runnable"] == 1
    assert set(view["types"]) == {G5}  # no limit, usage nor demand on ml.c5.xlarge
    g5 = view["types"][G5]
    assert {k: g5[k] for k in ("limit", "used", "borrowed", "idle", "runnable")} == {
        "limit": 1,
        "used": 2,
        "borrowed": 1,
        "idle": 0,
        "runnable": 1,
    }
    assert g5["oldest_runnable_since"] == 10  # "waiting" was submitted at 10
    assert pending_seconds(g5["oldest_runnable_since"], 70) == 60
    assert (view["running"], view["oldest_runnable_since"]) == (2, 10)


def test_share_view_of_a_lender() -> None:
    view = share_view(borrowing_state().state, "lender")
    assert view["runnable"] == 0
    assert set(view["types"]) == {G5, "ml.c5.xlarge"}
    for name in (G5, "ml.c5.xlarge"):
        t = view["types"][name]
        assert {k: t[k] for k in ("limit", "used", "borrowed", "idle", "runnable")} == {
            "limit": 1,
            "used": 0,
            "borrowed": 0,
            "idle": 1,
            "runnable": 0,
        }
        assert t["oldest_runnable_since"] is None
        assert pending_seconds(t["oldest_runnable_since"], 70) == 0


def test_share_view_reports_lent_capacity() -> None:
    """docs/model.md rule 7.2: every share's view has, per type, what it lends. The lender's one idle
    ml.g5.xlarge is what the borrower runs above its limit (the pool has nothing unassigned), so
    the lender lends 1 of it and none of ml.c5.xlarge, and the borrower lends nothing."""
    state = borrowing_state().state
    lender = share_view(state, "lender")["types"]
    borrower = share_view(state, "borrower")["types"]
    assert lender[G5].get("lent") == 1
    assert lender["ml.c5.xlarge"].get("lent") == 0
    assert borrower[G5].get("lent") == 0


# -- what a new job could be placed on -------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "share_name", "entry", "expected"),
    [
        (borrowing_state, "borrower", Entry(G5, 1), (0, Block.POOL_FULL)),
        (borrowing_state, "lender", Entry(G5, 1), (0, Block.POOL_FULL)),
        (borrowing_state, "lender", Entry("ml.c5.xlarge", 1), (1, Block.SHARE_LIMIT)),
        (waiting_for_capacity, "team", Entry(G5, 1), (0, Block.NO_PROVIDER_CAPACITY)),
        (waiting_for_plan, "team", Entry(P4, 1, "december"), (0, Block.PLAN_NOT_ACTIVE)),
        (waiting_for_plan, "team", Entry(P4, 1), (1, Block.SHARE_LIMIT)),
        (held_for_starving_job, "team", Entry(G5, 1), (0, Block.HELD_FOR_STARVING_JOB)),
    ],
    ids=[
        "the borrower holds the whole pool",
        "the lender's idle instance is lent: only preemption would give it back",
        "the lender's own idle type, up to its limit",
        "the provider has none",
        "the plan's window has not begun",
        "on demand beside the plan, up to the share's limit",
        "a starving job ahead reserves the type",
    ],
)
def test_most_placeable(build: Any, share_name: str, entry: Entry, expected: tuple[int, Block]) -> None:
    built = build()
    scheduler = built[0] if isinstance(built, tuple) else built
    now = built[2] if isinstance(built, tuple) else 10
    assert most_placeable(scheduler.state, share_name, entry, now) == expected


def test_a_borrower_may_place_up_to_its_borrow_limit_in_an_idle_pool() -> None:
    s = scheduler_for(
        share("borrower", {G5: 2}, "LEND_AND_BORROW", borrow_limit=100),
        share("lender", {G5: 6}, "LEND"),
        capacity={G5: 8},
    )
    s.run_cycle(0)
    assert most_placeable(s.state, "borrower", Entry(G5, 1), 0) == (4, Block.BORROW_LIMIT)
    assert most_placeable(s.state, "lender", Entry(G5, 1), 0) == (6, Block.SHARE_LIMIT)


def fitting_counts(scheduler: QuotaScheduler, share_name: str, entry: Entry, now: float) -> list[int]:
    """Every count from 1 to the pool's capacity that the core's check lets a new job of the
    share place now: what ``most_placeable``'s binary search assumes is 1..most."""
    state = scheduler.state
    mode = Mode.BORROW if state.shares[share_name].borrows else Mode.WITHIN_QUOTA
    found = []
    for count in range(1, state.types[entry.instance_type].capacity + 1):
        sized = Entry(entry.instance_type, count, entry.training_plan)
        request = JobRequest.model_construct(name="probe", share=share_name, priority=0, preferences=[])
        probe = Job(PROBE_SEQ, "probe", share_name, 0, (sized,), request, now)
        if placement_check(state, probe, sized, mode, now) is None:
            found.append(count)
    return found


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(v2_scenarios())
def test_the_counts_that_fit_are_one_to_most(loaded: LoadedScenario) -> None:
    """The binary search of ``most_placeable`` is exact: after every cycle of random
    scenarios, for every share, type and source, the counts the core's check accepts are
    exactly 1..most (a larger count never fits where a smaller one does not)."""
    simulator = Simulator(loaded)
    problems: list[str] = []

    def after_cycle(scheduler: QuotaScheduler, now: float) -> None:
        state = scheduler.state
        for share_name in state.shares:
            for name in state.types:
                plans = [p.name for p in state.plans.values() if p.instance_type == name]
                for source in [None, *plans]:
                    entry = Entry(name, 1, source)
                    most, _ = most_placeable(state, share_name, entry, now)
                    fits = fitting_counts(scheduler, share_name, entry, now)
                    if fits != list(range(1, most + 1)):
                        problems.append(f"t={now:g} {share_name} {entry}: most {most}, fits {fits}")

    simulator.after_each_cycle(after_cycle)
    simulator.run()
    assert not problems, "\n".join(problems[:5])
