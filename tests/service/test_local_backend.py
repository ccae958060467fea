"""The local backend with real processes: a real training script, real signals, no mocks."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from airflow_quota.service.backends.base import (
    STOPPED_BEFORE_START,
    AttemptReport,
    AttemptSpec,
    AttemptStatus,
    BackendError,
)
from airflow_quota.service.backends.local import LocalBackend
from tests.service.local_attempts import spec, train, wait_until_ended
from tests.waiting import wait_for


def training_log(backend: LocalBackend, attempt: AttemptSpec) -> str:
    return (backend.attempt_dir(attempt) / "training.log").read_text()


@pytest.fixture
def backend(tmp_path: Path) -> LocalBackend:
    return LocalBackend(tmp_path / "state")


def test_unknown_attempt_is_unknown_and_stopping_it_leaves_a_tombstone_no_start_runs(
    backend: LocalBackend, tmp_path: Path
) -> None:
    """A stop of an attempt never started (the next leader's, before a deposed leader's late
    start) records it as stopped before it started; the start that comes after runs nothing."""
    marker = tmp_path / "ran"
    attempt = spec(f"touch {marker}")
    assert backend.poll(attempt) == AttemptReport(AttemptStatus.UNKNOWN)
    backend.stop(attempt, grace_seconds=1)
    stopped = backend.poll(attempt)
    assert (stopped.status, stopped.reason, stopped.running_since) == (
        AttemptStatus.STOPPED,
        STOPPED_BEFORE_START,
        None,
    )
    backend.start(attempt)
    backend.stop(attempt, grace_seconds=1)  # a second stop changes nothing either
    assert backend.poll(attempt) == stopped
    assert sorted(p.name for p in backend.attempt_dir(attempt).iterdir()) == ["exit.json", "stop.json"], "launched"
    assert not marker.exists()


def test_the_environment_reaches_the_training(backend: LocalBackend, tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    attempt = spec(
        'echo "job=$QUOTA_JOB_ID attempt=$QUOTA_ATTEMPT type=$QUOTA_INSTANCE_TYPE count=$QUOTA_INSTANCE_COUNT '
        'gpus=$QUOTA_GPUS ckpt=$QUOTA_CHECKPOINT_URI team=$TEAM pwd=$(pwd)"',
        job_id=42,
        attempt=3,
        instance_type="ml.g5.12xlarge",
        count=2,
        gpus=4,
        checkpoint_uri=f"file://{tmp_path}/ckpt/job-42",
        training={"cwd": str(workdir), "env": {"TEAM": "vision"}},
    )
    backend.start(attempt)
    assert wait_until_ended(backend, attempt).status is AttemptStatus.SUCCEEDED
    assert training_log(backend, attempt).strip() == (
        f"job=42 attempt=3 type=ml.g5.12xlarge count=2 gpus=8 ckpt={tmp_path}/ckpt/job-42 team=vision pwd={workdir}"
    )
    assert (tmp_path / "ckpt" / "job-42").is_dir(), "a file:// checkpoint uri is created as a local directory"


def test_the_training_sizes_itself_and_exit_0_is_success(backend: LocalBackend, tmp_path: Path) -> None:
    attempt = spec(train("--steps", 3, "--step-seconds", 0.01), checkpoint_uri=str(tmp_path / "ckpt"), gpus=1)
    backend.start(attempt)
    report = wait_until_ended(backend, attempt)
    assert report.status is AttemptStatus.SUCCEEDED and report.reason is None
    assert report.running_since is not None and report.ended_at is not None
    assert report.running_since <= report.ended_at
    log = training_log(backend, attempt)
    assert "sized for 1x ml.g5.xlarge with 1 GPU(s)" in log
    assert "done at step 3" in log


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        (train("--steps", 1, "--step-seconds", 0, "--fail-with", 3), "ExitCode:3"),
        ("kill -9 $$", "ExitCode:-9"),
        (["/nonexistent/program"], "ExitCode:127"),
    ],
    ids=["a non-zero exit code", "a death by signal is minus the signal", "a command that cannot start"],
)
def test_failures_carry_their_exit_code(backend: LocalBackend, command: str | list[str], reason: str) -> None:
    attempt = spec(command)
    backend.start(attempt)
    report = wait_until_ended(backend, attempt)
    assert (report.status, report.reason) == (AttemptStatus.FAILED, reason)


def test_starting_twice_starts_one_process(backend: LocalBackend, tmp_path: Path) -> None:
    marker = tmp_path / "starts"
    attempt = spec(f"echo started >> {marker}; echo training output; sleep 0.5")
    started = backend.start(attempt)
    assert backend.start(attempt) == started
    assert LocalBackend(backend.state_dir).start(attempt) == started  # a restarted scheduler starting it again
    assert wait_until_ended(backend, attempt).status is AttemptStatus.SUCCEEDED
    assert marker.read_text() == "started\n"
    # where the task's log finds the training's output (triggers/training_log.py)
    assert Path(started.name).read_text() == training_log(backend, attempt)
    assert "training output" in training_log(backend, attempt)


def test_preempted_training_checkpoints_on_sigterm_and_the_next_attempt_resumes(
    backend: LocalBackend, tmp_path: Path
) -> None:
    checkpoint_uri = f"file://{tmp_path}/ckpt"
    checkpoint = tmp_path / "ckpt" / "checkpoint.json"
    command = train("--steps", 60, "--step-seconds", 0.05, "--checkpoint-every", 5)
    first = spec(command, job_id=9, attempt=1, checkpoint_uri=checkpoint_uri)
    backend.start(first)
    wait_for(checkpoint.exists, what="the first checkpoint")
    assert backend.poll(first).status is AttemptStatus.RUNNING

    backend.stop(first, grace_seconds=5)
    report = wait_until_ended(backend, first, timeout=4)  # well within the grace: no SIGKILL needed
    assert (report.status, report.reason) == (AttemptStatus.STOPPED, "ExitCode:143")
    assert not (backend.attempt_dir(first) / "killed.json").exists()
    stopped_at = re.search(r"SIGTERM at step (\d+): checkpoint written", training_log(backend, first))
    assert stopped_at, training_log(backend, first)
    saved = json.loads(checkpoint.read_text())["step"]
    assert saved == int(stopped_at.group(1)) > 0, "the checkpoint holds the step it was stopped at"

    second = spec(command, job_id=9, attempt=2, checkpoint_uri=checkpoint_uri)
    backend.start(second)
    assert wait_until_ended(backend, second).status is AttemptStatus.SUCCEEDED
    log = training_log(backend, second)
    resumed = re.search(r"resumed from step (\d+)", log)
    assert resumed, log
    print(f"attempt 1 was stopped at step {saved}; attempt 2 {resumed.group(0)}")
    assert int(resumed.group(1)) == saved > 0
    assert "done at step 60" in log


def test_a_training_ignoring_sigterm_is_killed_after_the_grace(backend: LocalBackend, tmp_path: Path) -> None:
    got_term, trapping = tmp_path / "got-term", tmp_path / "trapping"
    attempt = spec(f"trap 'echo TERM >> {got_term}' TERM; touch {trapping}; while :; do sleep 0.05; done")
    backend.start(attempt)
    wait_for(lambda: backend.poll(attempt).status is AttemptStatus.RUNNING, what="RUNNING")
    wait_for(trapping.exists, what="the training's SIGTERM trap in place")  # RUNNING may come first
    group = json.loads((backend.attempt_dir(attempt) / "command.json").read_text())["pid"]
    stopped = time.monotonic()
    backend.stop(attempt, grace_seconds=1)
    wait_for(got_term.exists, timeout=5, what="the training to receive SIGTERM")
    assert backend.poll(attempt).status is AttemptStatus.RUNNING, "SIGTERM is ignored: it runs through its grace"

    report = wait_until_ended(backend, attempt, timeout=5)
    assert (report.status, report.reason) == (AttemptStatus.STOPPED, "ExitCode:-9")
    assert 1 <= time.monotonic() - stopped < 5
    assert (backend.attempt_dir(attempt) / "killed.json").exists()
    wait_for(lambda: not group_exists(group), timeout=3, what="its process group (the sleep too) to be gone")


def group_exists(pgid: int) -> bool:
    """Whether any process (a zombie not yet reaped by init included) is in process group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_the_kill_after_the_grace_happens_even_after_a_scheduler_restart(backend: LocalBackend) -> None:
    attempt = spec("trap '' TERM; sleep 60")
    backend.start(attempt)
    wait_for(lambda: backend.poll(attempt).status is AttemptStatus.RUNNING, what="RUNNING")
    backend.stop(attempt, grace_seconds=0.5)
    restarted = LocalBackend(backend.state_dir)  # during the grace: the deadline is on disk
    report = wait_until_ended(restarted, attempt, timeout=5)
    assert (report.status, report.reason) == (AttemptStatus.STOPPED, "ExitCode:-9")


SCHEDULER = """
import sys, time
from pathlib import Path
from airflow_quota.service.backends.base import AttemptSpec
from airflow_quota.service.backends.local import LocalBackend
LocalBackend(Path(sys.argv[1])).start(AttemptSpec(
    job_id=5, job_name="job-5", attempt=1, share="qs1", instance_type="ml.g5.xlarge", count=1, gpus=1,
    training={"command": sys.argv[2:]}))
print("started", flush=True)
time.sleep(60)
"""


def test_a_restarted_scheduler_sees_the_attempt_running_then_succeeded(tmp_path: Path) -> None:
    state = tmp_path / "state"
    command = train("--steps", 30, "--step-seconds", 0.05)
    scheduler = subprocess.Popen(
        [sys.executable, "-c", SCHEDULER, str(state), *command], stdout=subprocess.PIPE, text=True
    )
    assert scheduler.stdout is not None and scheduler.stdout.readline() == "started\n"
    scheduler.send_signal(signal.SIGKILL)  # the scheduler dies; the training must not
    scheduler.wait()

    restarted = LocalBackend(state)
    attempt = spec(command, job_id=5)
    wait_for(lambda: restarted.poll(attempt).status is AttemptStatus.RUNNING, what="RUNNING")
    report = restarted.poll(attempt)
    assert report.running_since is not None and report.running_since <= time.time()
    restarted.start(attempt)  # starting it again does nothing
    report = wait_until_ended(restarted, attempt)
    assert report.status is AttemptStatus.SUCCEEDED
    assert training_log(restarted, attempt).count("sized for") == 1


def test_cuda_visible_devices_come_from_gpu_indices(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "state", gpu_indices={"ml.g5.12xlarge": [4, 5, 6, 7, 0, 1, 2, 3]})
    show = 'echo "devices=${CUDA_VISIBLE_DEVICES-unset}"; sleep 1'
    big = [spec(show, job_id=j, instance_type="ml.g5.12xlarge", gpus=4) for j in (1, 2, 3)]
    unmapped = spec(show, job_id=4, instance_type="ml.g5.xlarge", gpus=1)
    backend.start(big[0])
    backend.start(big[1])  # while the first runs: the next free indices
    with pytest.raises(BackendError, match=r"needs 4 GPUs .* only \[\] are free"):
        backend.start(big[2])
    backend.start(unmapped)
    for attempt in (big[0], big[1], unmapped):
        assert wait_until_ended(backend, attempt).status is AttemptStatus.SUCCEEDED
    assert training_log(backend, big[0]).strip() == "devices=4,5,6,7"
    assert training_log(backend, big[1]).strip() == "devices=0,1,2,3"
    assert training_log(backend, unmapped).strip() == f"devices={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}"
    backend.start(big[2])  # the GPUs are free again
    assert wait_until_ended(backend, big[2]).status is AttemptStatus.SUCCEEDED
    assert training_log(backend, big[2]).strip() == "devices=4,5,6,7"


def test_a_bad_command_is_refused_and_leaves_nothing(backend: LocalBackend) -> None:
    attempt = spec("")
    with pytest.raises(BackendError, match=r"training\.command must be a non-empty string or list"):
        backend.start(attempt)
    assert backend.poll(attempt).status is AttemptStatus.UNKNOWN
