"""The quota service with the local backend and a real training: a low-priority training is
preempted in-share by a higher-priority job, checkpoints on SIGTERM during its grace, waits, and
its next attempt resumes from the checkpoint and finishes."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import Engine

from airflow_quota.core.model import JobRequest
from airflow_quota.service.backends.local import LocalBackend
from airflow_quota.service.scheduler import QuotaService
from airflow_quota.store.repository import QuotaStore
from tests.service.local_attempts import TRAIN
from tests.waiting import wait_for

QUOTA = {
    "pool": {"capacity": {"ml.g5.xlarge": 1}},
    "shares": [
        {
            "name": "research",
            "capacity_limits": {"ml.g5.xlarge": 1},
            "strategy": "RESERVE",
            "in_share_preemption": True,
            "in_share_preemption_after_seconds": 0,  # preempts at once: these tests are about preemption
            "preemption_grace_seconds": 5,
        }
    ],
}


def training(steps: int) -> dict[str, object]:
    return {"command": [sys.executable, str(TRAIN), "--steps", str(steps), "--step-seconds", "0.05"]}


def run_until(service: QuotaService, store: QuotaStore, done: Callable[[], bool], seconds: float = 60) -> None:
    """Step the quota service every 0.05 s until ``done()``; fail after ``seconds``."""

    def stepped_and_done() -> bool:
        service.step()
        return done()

    wait_for(stepped_and_done, seconds, lambda: f"the jobs to be done: {[(j.name, j.state) for j in store.jobs()]}")


def test_preempted_training_resumes_from_its_checkpoint(sqlite_url: str, tmp_path: Path) -> None:
    from airflow_quota.store.engine import make_engine, migrate

    engine: Engine = make_engine(sqlite_url)
    migrate(engine)
    store = QuotaStore(engine)
    store.apply_config(QUOTA)
    backend = LocalBackend(tmp_path / "attempts")
    service = QuotaService(engine, {"local": backend}, poll_seconds=0.05)
    checkpoints = tmp_path / "ckpt"
    low = store.submit(
        JobRequest(
            name="low",
            share="research",
            priority=1,
            checkpoint_uri=f"file://{checkpoints}",
            preferences=[{"instance_type": "ml.g5.xlarge", "count": 1}],
        ),
        "local",
        training(200),
    )
    # the low-priority training runs and writes a checkpoint
    run_until(service, store, lambda: (checkpoints / "checkpoint.json").exists())
    high = store.submit(
        JobRequest(
            name="high", share="research", priority=5, preferences=[{"instance_type": "ml.g5.xlarge", "count": 1}]
        ),
        "local",
        {"command": [sys.executable, str(TRAIN), "--steps", "10", "--step-seconds", "0.02"]},
    )

    def finished() -> bool:
        return all(j.state in ("SUCCEEDED", "FAILED") for j in store.jobs())

    run_until(service, store, finished, seconds=90)
    states = {j.name: (j.state, j.attempts, j.preemptions) for j in store.jobs()}
    assert states == {"low": ("SUCCEEDED", 2, 1), "high": ("SUCCEEDED", 1, 0)}
    lines = [e.line for e in store.events()]
    assert any(re.search(r"PREEMPTED low \[research\] IN_SHARE by high", line) for line in lines), lines
    # the second attempt of "low" resumed from the step its first attempt saved on SIGTERM
    second_log = (tmp_path / "attempts" / f"{low.id}-2" / "training.log").read_text()
    resumed = re.search(r"resumed from step (\d+)", second_log)
    assert resumed is not None and int(resumed.group(1)) > 0, second_log
    print(f"attempt 2 of 'low' resumed from step {resumed.group(1)}")
    attempts = store.attempts(low.id)
    assert [a.status for a in attempts] == ["STOPPED", "SUCCEEDED"]
    assert store.job(high.id) is not None
