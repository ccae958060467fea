"""Starvation of the jobs AWS Batch places (``aws_batch/starvation.py``): docs/model.md rules 8.1
to 8.3 over what the mirror sees; pure."""

from __future__ import annotations

from typing import Any

from airflow_quota.aws_batch.service_jobs import KnownJob
from airflow_quota.aws_batch.starvation import DelegatedStarvation
from airflow_quota.core.config import parse_config
from airflow_quota.core.model import JobState

G5, P4 = "ml.g5.xlarge", "ml.p4d.24xlarge"
CONFIG = parse_config(
    {
        "pool": {"capacity": {G5: 4, P4: 2}},
        "shares": [
            {"name": "a", "capacity_limits": {G5: 2, P4: 1}, "strategy": "LEND_AND_BORROW"},
            {"name": "b", "capacity_limits": {G5: 2, P4: 1}, "strategy": "LEND_AND_BORROW"},
        ],
    }
)


def job(job_id: int, share: str = "a", types: tuple[str, ...] = (G5,), **fields: Any) -> KnownJob:
    values: dict[str, Any] = {
        "job_id": job_id, "name": f"j{job_id}", "share": share, "state": JobState.RUNNABLE, "attempts": 0,
        "preemptions": 0, "runnable_since": 0.0, "wait_seconds": 0.0, "types": types, **fields,
    }  # fmt: skip
    return KnownJob(**values)


LATE = 172_800.0 + 1  # past the threshold of a share with no normal wait yet (48 h)


def test_a_later_job_of_its_share_overtakes_and_past_the_threshold_it_starves_once() -> None:
    watch, waiting = DelegatedStarvation(), job(1)
    watch.placed(job(2), G5, at=1.0, wait=10.0, borrowed=0)
    assert watch.alerts(CONFIG, [waiting], now=LATE - 2) == []
    [(job_id, alert)] = watch.alerts(CONFIG, [waiting], now=LATE)
    assert (job_id, alert.kind.value, alert.overtaken_by) == (1, "STARVING", 1)
    assert "no normal wait yet" in alert.reason and alert.reason.endswith("latest j2 (a)")
    assert watch.alerts(CONFIG, [waiting], now=LATE + 100) == []


def test_only_a_borrowing_placement_of_another_share_overtakes() -> None:
    watch, waiting = DelegatedStarvation(), job(1)
    watch.placed(job(2, share="b"), G5, at=1.0, wait=0.0, borrowed=0)  # b's own guarantee
    assert watch.alerts(CONFIG, [waiting], now=LATE) == []
    watch.placed(job(3, share="b"), G5, at=1.0, wait=0.0, borrowed=1)
    assert [a.overtaken_by for _, a in watch.alerts(CONFIG, [waiting], now=LATE)] == [1]


def test_an_earlier_job_or_another_type_does_not_overtake_and_a_requeue_starts_afresh() -> None:
    watch, waiting = DelegatedStarvation(), job(5)
    watch.placed(job(2), G5, at=1.0, wait=0.0, borrowed=0)  # submitted before it
    watch.placed(job(6), P4, at=1.0, wait=0.0, borrowed=0)  # a type it does not ask for
    assert watch.alerts(CONFIG, [waiting], now=LATE) == []
    watch.placed(job(7), G5, at=1.0, wait=0.0, borrowed=0)
    watch.requeued(5)  # RUNNABLE again at 2: overtakes before count no more
    assert watch.alerts(CONFIG, [job(5, runnable_since=2.0)], now=LATE + 2) == []


def test_the_threshold_adapts_to_the_waits_of_the_shares_placements() -> None:
    watch, waiting = DelegatedStarvation(), job(100)
    for index in range(30):
        watch.placed(job(200 + index), G5, at=1.0, wait=1000.0, borrowed=0)
    assert watch.alerts(CONFIG, [waiting], now=7_999.0) == []  # 8x the normal wait of 1000 s
    [(_, alert)] = watch.alerts(CONFIG, [waiting], now=8_000.0)
    assert "8.0x its share's normal wait of 1000 s" in alert.reason
