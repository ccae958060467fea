"""A capacity error backs its source off for every job (docs/model.md rule 6.5: "that source is
skipped for a back-off time, by every job: the type on demand, or the plan"), for a plan entry
as for an on-demand one. The simulator has no capacity errors (a backend reports them), so the
scheduler is driven directly."""

from __future__ import annotations

from unittest.mock import ANY

from airflow_quota.core.config import parse_config
from airflow_quota.core.cycle import QuotaScheduler
from airflow_quota.core.model import Entry, JobRequest, PendingReason, Placed
from airflow_quota.core.visibility import pending_reason
from tests.builders import quota, share

P4 = "ml.p4d.24xlarge"
G5 = "ml.g5.xlarge"
PLAN = "p4-december"
ON_PLAN = Entry(P4, 1, PLAN)
ON_DEMAND = Entry(P4, 1)
G5_ON_DEMAND = Entry(G5, 1)


def make_scheduler() -> QuotaScheduler:
    """One share with a limit of 2 p4d instances, 1 of them in a plan open from 0 to 10,000 s,
    and of 1 g5 instance."""
    plan = {"name": PLAN, "instance_type": P4, "count": 1, "starts_at": 0, "ends_at": 10_000, "hourly_price": 19.0}
    return QuotaScheduler(
        parse_config(quota({P4: 2, G5: 1}, share("team", {P4: 2, G5: 1}, "RESERVE"), training_plans=[plan]))
    )


def request(name: str, *entries: Entry) -> JobRequest:
    preferences = [
        {"instance_type": e.instance_type, "count": e.count}
        | ({"training_plan": e.training_plan} if e.training_plan else {})
        for e in entries
    ]
    return JobRequest.model_validate({"name": name, "share": "team", "preferences": preferences})


def test_a_plan_backs_off_after_a_capacity_error_and_the_job_falls_back_to_its_next_entry() -> None:
    scheduler = make_scheduler()
    scheduler.submit(request("j", ON_PLAN, G5_ON_DEMAND), 0)
    assert scheduler.run_cycle(0) == [Placed(0, "j", "team", entry=ON_PLAN, borrowed=0, attempt=1, reason=ANY)]
    job = scheduler.job("j")
    scheduler.capacity_error(job, 10, backoff_seconds=60)
    # the plan backs off: the job's next entry, on demand, does not
    assert scheduler.run_cycle(10) == [Placed(10, "j", "team", entry=G5_ON_DEMAND, borrowed=0, attempt=1, reason=ANY)]


def test_a_plan_backs_off_for_every_job_until_a_cycle_at_the_end_of_the_back_off() -> None:
    scheduler = make_scheduler()
    scheduler.submit(request("j", ON_PLAN), 0)
    scheduler.run_cycle(0)
    scheduler.capacity_error(scheduler.job("j"), 10, backoff_seconds=60)
    scheduler.submit(request("k", ON_PLAN), 20)
    assert scheduler.run_cycle(10) == []
    assert scheduler.run_cycle(20) == []
    for name in ("j", "k"):
        assert pending_reason(scheduler.state, scheduler.job(name), 20)[0] is PendingReason.WAITING_FOR_CAPACITY
    assert scheduler.next_timer() == 70
    assert scheduler.run_cycle(70) == [Placed(70, "j", "team", entry=ON_PLAN, borrowed=0, attempt=1, reason=ANY)]


def test_a_plan_backing_off_leaves_on_demand_capacity_of_its_type_alone() -> None:
    scheduler = make_scheduler()
    scheduler.submit(request("j", ON_PLAN), 0)
    scheduler.run_cycle(0)
    scheduler.capacity_error(scheduler.job("j"), 10, backoff_seconds=60)
    scheduler.submit(request("d", ON_DEMAND), 20)
    assert scheduler.run_cycle(20) == [Placed(20, "d", "team", entry=ON_DEMAND, borrowed=0, attempt=1, reason=ANY)]
