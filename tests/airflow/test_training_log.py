"""The training's own output in the task log while it runs (``triggers/training_log.py``): the
local backend's log file and a SageMaker job's CloudWatch streams, each line once, read by the
trigger in the triggerer (no worker slot)."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from pathlib import Path

import boto3
import pytest
from sqlalchemy import update

from airflow_quota.store.models import Attempt
from airflow_quota.triggers.quota import QuotaJobTrigger
from airflow_quota.triggers.training_log import (
    MAX_LINES_PER_READ,
    SAGEMAKER_LOG_GROUP,
    CloudWatchTrainingLog,
    LocalTrainingLog,
)
from tests.airflow.conftest import QuotaWorld, events_of, payload_of, request
from tests.moto_server import REGION
from tests.waiting import wait_for_async


def test_a_local_log_gives_each_complete_line_once(tmp_path: Path) -> None:
    path = tmp_path / "training.log"
    tail = LocalTrainingLog(1, path, 1.0)
    assert tail.read_new() == []  # not written yet
    path.write_bytes(b"epoch 1 loss 0.9\nepoch 2 lo")
    assert tail.read_new() == ["epoch 1 loss 0.9"]  # the line being written waits for its end
    assert tail.read_new() == []
    with path.open("ab") as handle:
        handle.write(b"ss 0.7\n\xffbad bytes\n")
    assert tail.read_new() == ["epoch 2 loss 0.7", "\ufffdbad bytes"]


def test_a_burst_of_lines_is_logged_in_pieces(tmp_path: Path) -> None:
    path = tmp_path / "training.log"
    path.write_text("".join(f"line {i}\n" for i in range(MAX_LINES_PER_READ + 5)))
    tail = LocalTrainingLog(1, path, 1.0)
    first = tail.read_new()
    assert len(first) == MAX_LINES_PER_READ and first[-1] == f"line {MAX_LINES_PER_READ - 1}"
    assert tail.read_new() == [f"line {i}" for i in range(MAX_LINES_PER_READ, MAX_LINES_PER_READ + 5)]


def test_the_task_log_shows_the_trainings_lines_while_it_runs(
    world: QuotaWorld, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The test's "local" backend is the fake one, which writes no log: the attempt's log file is
    named in the store as the local backend names it when it starts an attempt."""
    log = tmp_path / "training.log"
    log.write_text("epoch 1\n")
    job = world.store.submit(request("talk"), "local", {"duration": 100})
    trigger = QuotaJobTrigger(job_id=job.id, poll_interval=0.01, print_log=True)
    seen: list[str] = []

    def logged(text: str) -> int:
        captured = capsys.readouterr()
        for line in (captured.out + captured.err).splitlines():
            if "[training, attempt" in line:  # structlog: time [level] message [logger] loc=...
                seen.append(line.split("] ", 1)[1].rsplit(" [", 1)[0].strip())
        return seen.count(f"[training, attempt 1] {text}")

    async def scenario() -> list[object]:
        task = asyncio.create_task(events_of(trigger.run(), timeout=60))
        await asyncio.to_thread(world.step, 1000.0)  # placed and started
        with world.engine.begin() as connection:
            connection.execute(update(Attempt).where(Attempt.job_id == job.id).values(external_name=str(log)))
        await asyncio.to_thread(world.step, 1001.0)  # running
        await wait_for_async(lambda: logged("epoch 1") == 1, what="the first line")
        with log.open("a") as handle:
            handle.write("epoch 2\nsaving a check")
        await wait_for_async(
            lambda: logged("epoch 2") == 1, what="a line written while it runs, without the job changing"
        )
        with log.open("a") as handle:
            handle.write("point\n")
        await asyncio.to_thread(world.step, 1100.0)  # it ends: the last line comes with the end
        return await task

    events = asyncio.run(scenario())
    assert payload_of(events[0])["status"] == "success"  # type: ignore[arg-type]
    logged("")
    assert seen == [
        "[training, attempt 1] epoch 1",
        "[training, attempt 1] epoch 2",
        "[training, attempt 1] saving a checkpoint",
    ]


def test_a_sagemaker_jobs_cloudwatch_streams_give_each_event_once(
    moto_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_AWS_MOTO",
        json.dumps({"conn_type": "aws", "extra": {"endpoint_url": moto_url, "region_name": REGION}}),
    )
    logs = boto3.client("logs", region_name=REGION, endpoint_url=moto_url)
    job = "quota-llm-42-1"
    tail = CloudWatchTrainingLog(1, job, "aws_moto")
    assert tail.read_new() == []  # no log group yet
    logs.create_log_group(logGroupName=SAGEMAKER_LOG_GROUP)
    for stream in ("algo-1-1700000000", "algo-2-1700000000"):
        logs.create_log_stream(logGroupName=SAGEMAKER_LOG_GROUP, logStreamName=f"{job}/{stream}")
    logs.create_log_stream(logGroupName=SAGEMAKER_LOG_GROUP, logStreamName="another-job/algo-1-1700000000")

    clock = itertools.count(int(time.time() * 1000))  # recent (CloudWatch refuses events 14 days old), rising

    def put(stream: str, *messages: str) -> None:
        logs.put_log_events(
            logGroupName=SAGEMAKER_LOG_GROUP,
            logStreamName=stream,
            logEvents=[{"timestamp": next(clock), "message": m} for m in messages],
        )

    put(f"{job}/algo-1-1700000000", "epoch 1", "epoch 2")
    put(f"{job}/algo-2-1700000000", "worker 2 up")
    put("another-job/algo-1-1700000000", "not ours")
    assert tail.read_new() == [
        "algo-1-1700000000: epoch 1",
        "algo-1-1700000000: epoch 2",
        "algo-2-1700000000: worker 2 up",
    ]
    assert tail.read_new() == []
    put(f"{job}/algo-1-1700000000", "epoch 3")
    assert tail.read_new() == ["algo-1-1700000000: epoch 3"]
