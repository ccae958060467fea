"""``benchmarks/per_job.py --cycles`` counts a run's cycles by what started each: the reading of
issue 15's per-job cost rests on it (the full load asks for more timer cycles a job as its
waits grow), so the count must be right: each cycle counted once, under its cause."""

from __future__ import annotations

import json
from pathlib import Path

from airflow_quota.sim.scenario import parse_scenario
from airflow_quota.sim.simulator import Simulator
from benchmarks import workload
from benchmarks.per_job import _count_cycles

ONE_TYPE = "ml.g5.xlarge"


def _submit(name: str, priority: int, duration: int) -> dict[str, object]:
    return {
        "name": name,
        "share": "team",
        "priority": priority,
        "preferences": [{"instance_type": ONE_TYPE, "count": 2}],
        "duration": duration,
        "checkpoint_interval": 600,
    }


def test_a_wait_reaching_in_share_preemption_is_a_timer_cycle(tmp_path: Path) -> None:
    # low runs from 0; high arrives at 10 and may preempt it in the share at 610 (a timer alone);
    # high finishes at 1210, low (placed again) at 7810
    scenario = {
        "quota": {
            "pool": {"capacity": {ONE_TYPE: 2}},
            "shares": [
                {"name": "team", "capacity_limits": {ONE_TYPE: 2}, "strategy": "RESERVE", "in_share_preemption": True}
            ],
        },
        "events": [{"at": 0, "submit": _submit("low", 1, 7200)}, {"at": 10, "submit": _submit("high", 9, 600)}],
    }
    path = tmp_path / "preempt.json"
    path.write_text(json.dumps(scenario))
    count = _count_cycles(path)
    assert (count.arrival, count.backend, count.timers) == (2, 2, 1)
    assert count.total == 5
    assert sorted(count.waits) == [600.0, 600.0]


def test_the_full_load_counts_each_cycle_once_under_its_cause(tmp_path: Path) -> None:
    document = workload.scenario(2_000)
    path = tmp_path / "full-load.json"
    path.write_text(json.dumps(document))
    count = _count_cycles(path)
    plain = Simulator(parse_scenario(document, tmp_path)).run()
    assert count.total == plain.cycles
    assert count.arrival == len({event["at"] for event in document["events"]})
    assert count.backend > 0
    assert count.timers > 0
    assert count.jobs == len(plain.scheduler.state.jobs)
