"""Preemption grace for every command, and the one reason for a stop before start.

A string ``command`` runs under ``/bin/sh -c``; dash (Debian's ``/bin/sh``) forks the training
instead of replacing itself, and the stop's SIGTERM to the process group kills the shell at once.
The training must still get its whole grace to write a checkpoint (issue 14, finding 9).
"""

from __future__ import annotations

import json
import shlex
import sys
import textwrap
import time
from pathlib import Path

from airflow_quota.service.backends import local_runner as files
from airflow_quota.service.backends.base import STOPPED_BEFORE_START, AttemptStatus
from airflow_quota.service.backends.fake import FakeBackend
from airflow_quota.service.backends.local import LocalBackend
from tests.service.local_attempts import spec, wait_until_ended
from tests.waiting import wait_for

CHECKPOINTING = textwrap.dedent(
    """
    import pathlib, signal, sys, time

    checkpoint, ready = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    ignore = len(sys.argv) > 3

    def on_sigterm(signum, frame):
        if ignore:
            return
        time.sleep(0.5)  # writing a checkpoint takes a while
        checkpoint.write_text("step 42")
        sys.exit(0)

    signal.signal(signal.SIGTERM, on_sigterm)
    ready.write_text("ready")
    while True:
        time.sleep(0.02)
    """
)


def _string_command(tmp_path: Path, *extra: str) -> tuple[str, Path, Path]:
    """A shell command line (``;`` makes any shell fork the training) and its two marker files."""
    script = tmp_path / "checkpointing.py"
    script.write_text(CHECKPOINTING)
    checkpoint, ready = tmp_path / "checkpoint", tmp_path / "ready"
    args = " ".join(shlex.quote(a) for a in (sys.executable, str(script), str(checkpoint), str(ready), *extra))
    return f"echo starting; {args}", checkpoint, ready


def _command_is_a_shell(backend: LocalBackend, attempt_key: str) -> bool:
    record = files.read_json(backend.state_dir / attempt_key / files.COMMAND)
    assert record is not None
    cmdline = Path(f"/proc/{record['pid']}/cmdline").read_bytes().split(b"\0")
    return cmdline[0].endswith(b"sh")


def test_a_string_command_gets_its_grace_and_writes_its_checkpoint(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "state")
    command, checkpoint, ready = _string_command(tmp_path)
    attempt = spec(command, job_id=31)
    backend.start(attempt)
    wait_for(ready.exists, what="the training to install its SIGTERM handler")
    assert _command_is_a_shell(backend, attempt.key), "the test needs the shell to fork the training"
    stopped_at = time.monotonic()
    backend.stop(attempt, grace_seconds=5)
    report = wait_until_ended(backend, attempt, timeout=5)
    took = time.monotonic() - stopped_at
    assert report.status is AttemptStatus.STOPPED, report
    assert checkpoint.exists(), "the training's SIGTERM handler did not get to write its checkpoint"
    assert checkpoint.read_text() == "step 42"
    assert not (backend.attempt_dir(attempt) / files.KILLED).exists(), "no SIGKILL was needed"
    assert 0.4 < took < 4, f"the attempt ended {took:.2f} s after the stop: the handler takes 0.5 s"


def test_a_string_command_ignoring_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "state")
    command, checkpoint, ready = _string_command(tmp_path, "ignore")
    attempt = spec(command, job_id=32)
    backend.start(attempt)
    wait_for(ready.exists, what="the training to start")
    stopped_at = time.monotonic()
    backend.stop(attempt, grace_seconds=1)
    assert backend.poll(attempt).status is AttemptStatus.RUNNING, "inside the grace it still holds its capacity"
    report = wait_until_ended(backend, attempt, timeout=6)
    took = time.monotonic() - stopped_at
    assert report.status is AttemptStatus.STOPPED, report
    assert 0.9 < took < 5, f"ended {took:.2f} s after a stop with a 1 s grace"
    record = files.read_json(backend.attempt_dir(attempt) / files.COMMAND)
    assert record is not None
    assert not files.group_members(int(record["pid"])), "the whole process group is gone"
    assert not checkpoint.exists()


def test_stopped_before_the_command_started_has_the_one_reason(tmp_path: Path) -> None:
    """The runner saw the stop and never started the command; or it went on the stop's
    SIGTERM before it could record anything: both are ``StoppedBeforeStart``."""
    backend = LocalBackend(tmp_path / "state")
    seen = spec(["true"], job_id=33)
    directory = backend.attempt_dir(seen)
    directory.mkdir(parents=True)
    files.write_json(directory / files.EXIT, {"returncode": None, "started_at": None, "stopped": True})
    assert backend.poll(seen).reason == STOPPED_BEFORE_START

    lost = spec(["true"], job_id=34)
    directory = backend.attempt_dir(lost)
    directory.mkdir(parents=True)
    files.write_json(directory / files.ATTEMPT, {"launched_at": time.time()})
    files.write_json(directory / files.RUNNER, {"pid": 2**22 + 1, "start_ticks": 1})  # no such process
    files.write_json(directory / files.STOP, {"requested_at": time.time(), "deadline": time.time()})
    report = backend.poll(lost)
    assert (report.status, report.reason) == (AttemptStatus.STOPPED, STOPPED_BEFORE_START)


def test_the_fake_backend_says_the_same_for_a_stop_during_startup(tmp_path: Path) -> None:
    now = [100.0]
    backend = FakeBackend(lambda: now[0], tmp_path / "fake")
    attempt = spec(["true"], job_id=35, training={"duration": 10, "startup": 5})
    backend.start(attempt)
    backend.stop(attempt, grace_seconds=1)
    now[0] = 110.0
    report = backend.poll(attempt)
    assert (report.status, report.reason) == (AttemptStatus.STOPPED, STOPPED_BEFORE_START)
    running = spec(["true"], job_id=36, training={"duration": 10})
    backend.start(running)
    now[0] = 112.0
    backend.stop(running, grace_seconds=0)
    now[0] = 113.0
    assert backend.poll(running).reason == "stopped", json.dumps(report.__dict__)
