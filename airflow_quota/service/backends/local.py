"""The ``local`` backend: runs each attempt's command as a process on this host.

Every attempt has a directory ``state_dir/<attempt.key>/`` (layout in
:mod:`airflow_quota.service.backends.local_runner`). ``start`` creates it atomically and
launches a detached runner, which starts the command and records its pid and exit code there;
``poll`` and ``stop`` only read that directory and signal the recorded processes. So a quota
scheduler killed at any point and restarted (a new ``LocalBackend`` on the same ``state_dir``)
finds every attempt as it left it, and starting an attempt twice is impossible: an existing
directory means "already started".

A stop of an attempt that has no directory leaves a *tombstone*: its directory, created the
same atomic way, holding only ``stop.json`` and an ``exit.json`` that says it was stopped before
it started. A later ``start`` finds the directory and does nothing, so a start made late by a
leader deposed meanwhile (the next leader having stopped the attempt) never runs it; of a start
and a stop racing, exactly one creates the directory (``base.py``).

How outcomes map to :class:`AttemptStatus`:

- no directory: UNKNOWN; the runner launched but the command not yet started: PENDING;
- the command runs: RUNNING, ``running_since`` when it was started;
- it ended after a stop was requested (whatever its exit code): STOPPED, reason ``ExitCode:N``;
  stopped before the command started: STOPPED, reason ``StoppedBeforeStart`` (the one reason
  every backend and the scheduler give for that);
- it exited 0: SUCCEEDED; any other exit: FAILED with reason ``ExitCode:N``. A command killed by
  a signal has N = minus the signal number (``ExitCode:-9`` for SIGKILL, ``ExitCode:-15`` for
  SIGTERM), as Python's ``subprocess`` reports it; a command that could not be started at all
  (no such program, bad cwd) gives ``ExitCode:127``, as a shell does;
- the runner vanished (killed) without recording an exit code: FAILED ``RunnerLost`` once the
  command is gone too; the runner never appeared ``launch_timeout`` seconds after ``start``
  (the scheduler died between creating the directory and launching it): FAILED ``LaunchFailed``.

Preemption: ``stop`` records the request (and its deadline, request time + grace) and sends
SIGTERM to the command's process group; the first ``poll`` after the deadline sends SIGKILL if
it is still alive. Every process of the group gets the grace, not only the one the runner
started: a string command runs under ``/bin/sh -c``, and the shell (dash) forks the training
and dies of the SIGTERM at once, so the runner waits for the rest of the group to end (or the
deadline) before it kills what is left. Since the deadline is on disk, the kill happens even if the scheduler
restarted during the grace.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from airflow_quota.service.backends import local_runner as files
from airflow_quota.service.backends.base import (
    STOPPED_BEFORE_START,
    AttemptReport,
    AttemptSpec,
    AttemptStatus,
    BackendError,
    StartedAttempt,
)

log = logging.getLogger(__name__)

RUNNER_MODULE = "airflow_quota.service.backends.local_runner"
_PACKAGE_PARENT = Path(__file__).resolve().parents[3]
"""The directory holding the ``airflow_quota`` package: the runner's cwd, so ``-m`` finds it
even when the package is not installed."""
_URI_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def checkpoint_location(uri: str, cwd: str | None) -> str:
    """What the training gets as ``QUOTA_CHECKPOINT_URI``: a local directory for ``file://PATH``
    or a plain path (relative paths are taken from the training's cwd), anything else unchanged.
    """
    if uri.startswith("file://"):
        path = uri[len("file://") :]
        if path.startswith("localhost/"):
            path = path[len("localhost") :]
    elif _URI_SCHEME.match(uri):
        return uri
    else:
        path = uri
    return str(Path(cwd or os.getcwd(), os.path.expanduser(path)).resolve())


class LocalBackend:
    """Runs attempts as local processes, with all their state under ``state_dir``.

    :param state_dir: one directory per attempt is kept here; it must survive scheduler restarts.
    :param gpu_indices: for the instance types this host serves, the GPU indices it may hand
        out; an attempt of such a type gets ``CUDA_VISIBLE_DEVICES`` set to the first
        ``gpus × count`` of them not held by another attempt still running here.
    :param clock: epoch seconds; stop deadlines and launch times are measured with it.
    :param launch_timeout: how long after ``start`` a runner that never showed up is reported
        as ``LaunchFailed``.
    :param python: the interpreter that runs the runner.
    :param poll_interval_seconds: how often the scheduler asks about each running attempt
        (``--local-poll-seconds``); a stop's SIGKILL after its grace is sent by a poll, so at
        most this late.
    """

    name: str = "local"

    def __init__(
        self,
        state_dir: Path,
        gpu_indices: dict[str, list[int]] | None = None,
        clock: Callable[[], float] = time.time,
        *,
        launch_timeout: float = 60.0,
        python: str = sys.executable,
        poll_interval_seconds: float = 1.0,
    ) -> None:
        self.state_dir = Path(state_dir)
        self.gpu_indices = dict(gpu_indices or {})
        self.clock = clock
        self.launch_timeout = launch_timeout
        self.python = python
        self.poll_interval_seconds = poll_interval_seconds
        self._launched: list[subprocess.Popen[bytes]] = []
        """Runners this object launched, kept only to reap them (no zombies); no state."""
        self._launched_lock = threading.Lock()
        """``start`` (the leader's step) adds to ``_launched`` while polls (the poller's threads) reap it."""

    def attempt_dir(self, attempt: AttemptSpec) -> Path:
        """Where everything about ``attempt`` is kept."""
        return self.state_dir / attempt.key

    # -- start -------------------------------------------------------------------------------

    def start(self, attempt: AttemptSpec) -> StartedAttempt:
        """Launch the attempt's runner; does nothing if the attempt directory already exists.
        Returns where the training's output goes (its ``training.log``), for the task's log."""
        self._reap()
        final = self.attempt_dir(attempt)
        started = StartedAttempt(str((final / files.TRAINING_LOG).resolve()))
        if final.exists():
            return started
        command = self._command(attempt)
        cwd = attempt.training.get("cwd")
        cwd = str(Path(cwd).resolve()) if cwd else os.getcwd()
        env, devices, checkpoint_dir = self._environment(attempt, cwd)
        record: dict[str, Any] = {
            "key": attempt.key,
            "job_id": attempt.job_id,
            "attempt": attempt.attempt,
            "instance_type": attempt.instance_type,
            "count": attempt.count,
            "gpus": attempt.gpus,
            "command": command,
            "cwd": cwd,
            "checkpoint_dir": checkpoint_dir,
            "cuda_visible_devices": devices,
            "launched_at": self.clock(),
        }
        # of two concurrent starts (or a start and a stop before it), exactly one creates it
        if not self._create_whole(attempt, final, "starting", {files.ATTEMPT: record}):
            return started
        try:
            with (final / files.RUNNER_LOG).open("ab") as runner_log:
                proc = subprocess.Popen(
                    [self.python, "-m", RUNNER_MODULE, str(final)],
                    cwd=_PACKAGE_PARENT,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=runner_log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        except OSError as exc:
            # Leave the directory: poll reports LaunchFailed, and the attempt is never retried
            # under the same key (a restarted scheduler cannot tell whether it had launched).
            raise BackendError(f"attempt {attempt.key}: cannot launch its runner with {self.python}: {exc}") from exc
        with self._launched_lock:
            self._launched.append(proc)
        log.info("attempt %s: started %r (runner pid %d) in %s", attempt.key, command, proc.pid, final)
        return started

    @staticmethod
    def _command(attempt: AttemptSpec) -> str | list[str]:
        """The training command, checked: a non-empty string (run by ``/bin/sh -c``) or list."""
        command = attempt.training.get("command")
        if isinstance(command, str) and command.strip():
            return command
        if isinstance(command, list) and command and all(isinstance(a, (str, int, float)) for a in command):
            return [str(a) for a in command]
        raise BackendError(
            f"attempt {attempt.key}: training.command must be a non-empty string or list of strings, got {command!r}"
        )

    def _environment(self, attempt: AttemptSpec, cwd: str) -> tuple[dict[str, str], list[int] | None, str | None]:
        """The command's environment, the GPU indices it gets and its checkpoint directory."""
        env = dict(os.environ)
        env.pop("QUOTA_CHECKPOINT_URI", None)  # never a stale one inherited from the scheduler
        extra = attempt.training.get("env") or {}
        if not isinstance(extra, dict):
            raise BackendError(f"attempt {attempt.key}: training.env must be a mapping, got {extra!r}")
        env.update({str(k): str(v) for k, v in extra.items()})
        env.update(
            QUOTA_JOB_ID=str(attempt.job_id),
            QUOTA_ATTEMPT=str(attempt.attempt),
            QUOTA_INSTANCE_TYPE=attempt.instance_type,
            QUOTA_INSTANCE_COUNT=str(attempt.count),
            QUOTA_GPUS=str(attempt.gpus * attempt.count),
        )
        checkpoint_dir = None
        if attempt.checkpoint_uri:
            location = checkpoint_location(attempt.checkpoint_uri, cwd)
            if not _URI_SCHEME.match(location):
                checkpoint_dir = location
                try:
                    Path(location).mkdir(parents=True, exist_ok=True)
                except OSError as exc:
                    raise BackendError(
                        f"attempt {attempt.key}: cannot create checkpoint directory {location}: {exc}"
                    ) from exc
            env["QUOTA_CHECKPOINT_URI"] = location
        devices = self._devices(attempt)
        if devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in devices)
        return env, devices, checkpoint_dir

    def _devices(self, attempt: AttemptSpec) -> list[int] | None:
        """GPU indices for the attempt: the first ``gpus × count`` of its type's indices that no
        running attempt holds; None when the type has no mapping."""
        indices = self.gpu_indices.get(attempt.instance_type)
        if indices is None:
            return None
        needed = attempt.gpus * attempt.count
        if needed > len(indices):
            raise BackendError(
                f"attempt {attempt.key}: {attempt.count} × {attempt.instance_type} needs {needed} GPUs "
                f"but gpu_indices maps that type to only {len(indices)}: {indices}"
            )
        busy = self._busy_devices()
        free = [i for i in indices if i not in busy]
        if len(free) < needed:
            raise BackendError(
                f"attempt {attempt.key}: needs {needed} GPUs of {attempt.instance_type} {indices}, "
                f"but only {free} are free (held by running attempts: {sorted(busy)})"
            )
        return free[:needed]

    def _busy_devices(self) -> set[int]:
        """GPU indices held by attempts under ``state_dir`` that have not ended."""
        busy: set[int] = set()
        for directory in self._attempt_dirs():
            record = files.read_json(directory / files.ATTEMPT)
            if record and record.get("cuda_visible_devices") and self._holds_resources(directory, record):
                busy.update(int(i) for i in record["cuda_visible_devices"])
        return busy

    def _attempt_dirs(self) -> Iterable[Path]:
        if not self.state_dir.is_dir():
            return []
        return (p for p in self.state_dir.iterdir() if p.is_dir() and not p.name.startswith("."))

    def _holds_resources(self, directory: Path, record: dict[str, Any]) -> bool:
        """Whether the attempt may still be using its GPUs: it has not recorded an exit and a
        process of it lives, or its runner may still appear."""
        if (directory / files.EXIT).exists():
            return False
        runner = files.read_json(directory / files.RUNNER)
        command = files.read_json(directory / files.COMMAND)
        if _alive(runner) or _alive(command):
            return True
        return runner is None and self.clock() - float(record.get("launched_at", 0)) < self.launch_timeout

    # -- poll --------------------------------------------------------------------------------

    def poll(self, attempt: AttemptSpec) -> AttemptReport:
        """What became of the attempt, from its directory; sends SIGKILL once a stop's grace is over."""
        self._reap()
        directory = self.attempt_dir(attempt)
        if not directory.is_dir():
            return AttemptReport(AttemptStatus.UNKNOWN)
        ended = files.read_json(directory / files.EXIT)
        if ended is not None:
            return _outcome(ended)
        self._enforce_deadline(directory)
        runner = files.read_json(directory / files.RUNNER)
        command = files.read_json(directory / files.COMMAND)
        if _alive(command):
            assert command is not None
            return AttemptReport(AttemptStatus.RUNNING, running_since=command.get("started_at"))
        if _alive(runner):
            # Not started yet, or ended and the runner is writing exit.json right now.
            if command is None:
                return AttemptReport(AttemptStatus.PENDING)
            return AttemptReport(AttemptStatus.RUNNING, running_since=command.get("started_at"))
        # Nothing of it lives: the runner may have written exit.json and left since we looked.
        ended = files.read_json(directory / files.EXIT)
        if ended is not None:
            return _outcome(ended)
        if (directory / files.STOP).exists():
            # stopped before its command started (the runner went on the stop's SIGTERM), or lost
            reason = STOPPED_BEFORE_START if command is None else "RunnerLost"
            return AttemptReport(AttemptStatus.STOPPED, reason=reason)
        if runner is None:
            record = files.read_json(directory / files.ATTEMPT) or {}
            if self.clock() - float(record.get("launched_at", 0)) < self.launch_timeout:
                return AttemptReport(AttemptStatus.PENDING)
            return AttemptReport(AttemptStatus.FAILED, reason="LaunchFailed")
        return AttemptReport(AttemptStatus.FAILED, reason="RunnerLost")

    # -- stop --------------------------------------------------------------------------------

    def stop(self, attempt: AttemptSpec, grace_seconds: float) -> None:
        """Record a stop request and send the command's process group SIGTERM (once).

        A second request keeps the first request time and can only bring the deadline
        forward (a cancel with a shorter grace during a preemption's grace). Harmless for an
        attempt that has already ended; one that never started is left a tombstone (see the
        module docstring), so that no later start runs it.
        """
        directory = self.attempt_dir(attempt)
        if not directory.is_dir() and self._bury(attempt, grace_seconds):
            return
        if (directory / files.EXIT).exists():
            return
        now = self.clock()
        deadline = now + max(grace_seconds, 0.0)
        previous = files.read_json(directory / files.STOP)
        if previous is not None:
            now = float(previous["requested_at"])
            deadline = min(deadline, float(previous["deadline"]))
        files.write_json(
            directory / files.STOP, {"requested_at": now, "deadline": deadline, "grace_seconds": grace_seconds}
        )
        command = files.read_json(directory / files.COMMAND)
        runner = files.read_json(directory / files.RUNNER)
        if command is not None and _alive(command):
            if files.send_term_once(directory, int(command["pid"])):
                log.info("attempt %s: SIGTERM sent, SIGKILL after %.0f s", attempt.key, grace_seconds)
        elif command is None and runner is not None and _alive(runner):
            # The command is being started: the runner forwards the stop to it (or never starts it).
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(runner["pid"]), signal.SIGTERM)
        self._enforce_deadline(directory)

    def _create_whole(self, attempt: AttemptSpec, final: Path, doing: str, records: dict[str, Any]) -> bool:
        """Create the attempt's directory holding ``records`` (file name → JSON), appearing
        whole by a rename, which fails onto an existing directory: False when another start or
        stop created it first."""
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=f".{doing}-{attempt.key}-", dir=self.state_dir))
            for name, record in records.items():
                files.write_json(staging / name, record)
        except OSError as exc:
            raise BackendError(f"attempt {attempt.key}: cannot write its state in {self.state_dir}: {exc}") from exc
        try:
            staging.rename(final)
        except OSError as exc:
            shutil.rmtree(staging, ignore_errors=True)
            if final.is_dir():
                return False
            raise BackendError(f"attempt {attempt.key}: cannot create {final}: {exc}") from exc
        return True

    def _bury(self, attempt: AttemptSpec, grace_seconds: float) -> bool:
        """Create the tombstone of an attempt stopped before it was ever started: its directory
        with ``stop.json`` and an ``exit.json`` saying so, appearing whole by a rename that fails
        if a racing start created the directory first. Whether the tombstone was made (False:
        the attempt was started, and is stopped as any other)."""
        now = self.clock()
        stop = {"requested_at": now, "deadline": now, "grace_seconds": grace_seconds}
        ended = {"returncode": None, "started_at": None, "ended_at": now, "stopped": True}
        tombstone = {files.STOP: stop, files.EXIT: ended}
        if not self._create_whole(attempt, self.attempt_dir(attempt), "stopping", tombstone):
            return False
        log.info("attempt %s: stopped before it was started (a tombstone: no later start runs it)", attempt.key)
        return True

    def _enforce_deadline(self, directory: Path) -> None:
        """SIGKILL what is left of a stopped attempt once its deadline has passed."""
        request = files.read_json(directory / files.STOP)
        if request is None or self.clock() < float(request["deadline"]):
            return
        command = files.read_json(directory / files.COMMAND)
        if command is not None and _alive(command):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(command["pid"]), signal.SIGKILL)
            files.write_json(directory / files.KILLED, {"at": self.clock(), "pid": command["pid"]})
            log.warning("attempt %s: still running after its grace, SIGKILL sent", directory.name)
        # A runner that has not started its command yet is left alone: it has seen the stop and
        # will not start it, or will forward the stop; killing it could orphan a command whose
        # pid it had not yet recorded.

    def _reap(self) -> None:
        """Collect runners this object launched that have exited (they would stay zombies)."""
        with self._launched_lock:
            self._launched = [p for p in self._launched if p.poll() is None]


def _alive(record: dict[str, Any] | None) -> bool:
    """Whether the process a pid record names is still running."""
    if record is None:
        return False
    ticks = record.get("start_ticks")
    return files.process_alive(int(record["pid"]), None if ticks is None else int(ticks))


def _outcome(ended: dict[str, Any]) -> AttemptReport:
    """The report for a recorded exit (see the module docstring for the mapping)."""
    returncode = ended.get("returncode")
    reason = None if returncode is None else f"ExitCode:{returncode}"
    started_at, ended_at = ended.get("started_at"), ended.get("ended_at")
    if ended.get("stopped"):
        if started_at is None:  # the runner saw the stop and never started the command
            reason = STOPPED_BEFORE_START
        return AttemptReport(AttemptStatus.STOPPED, reason=reason, running_since=started_at, ended_at=ended_at)
    if returncode == 0:
        return AttemptReport(AttemptStatus.SUCCEEDED, running_since=started_at, ended_at=ended_at)
    return AttemptReport(AttemptStatus.FAILED, reason=reason, running_since=started_at, ended_at=ended_at)
