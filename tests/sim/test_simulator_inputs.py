"""The simulator drives the core through typed inputs naming jobs by reference: a name used
again after its job ended, and rejected submissions, never make an event reach the wrong job."""

from __future__ import annotations

from airflow_quota.core.model import Failed, PriorityChanged, Rejected
from airflow_quota.sim.simulator import Simulator
from tests.builders import job, quota, scenario, share

G5 = "ml.g5.xlarge"


def test_events_reach_the_latest_job_of_a_name() -> None:
    run = Simulator(
        scenario(
            quota({G5: 2}, share("t", {G5: 2})),
            job("a", "t", (G5, 1), at=0, duration=10),
            job("x", "t", (G5, 9), at=1),  # rejected: more than the pool
            job("a", "t", (G5, 1), at=20, duration=10),
            job("b", "t", (G5, 1), at=21, duration=100),
            {"at": 22, "set_priority": {"job": "a", "priority": 5}},
            {"at": 23, "cancel": {"job": "b"}},
            {"at": 24, "cancel": {"job": "x"}},
        )
    ).run()
    changed = [d for d in run.decisions if isinstance(d, PriorityChanged)]
    assert [(d.job, d.at) for d in changed] == [("a", 22)]
    failed = [d for d in run.decisions if isinstance(d, Failed)]
    assert [(d.job, d.reason.value) for d in failed] == [("b", "CANCELLED")]
    rejected = [(d.job, d.request) for d in run.decisions if isinstance(d, Rejected)]
    assert rejected == [("x", "submit"), ("x", "cancel")]
    final = {j.name: j.state.value for j in run.scheduler.state.jobs.values()}
    assert final == {"a": "SUCCEEDED", "b": "FAILED"}
