"""The detached runner of one ``local`` attempt: ``python -m airflow_quota.service.backends.local_runner DIR``.

The quota scheduler may be killed at any moment, so it never owns the training process. It
launches this small runner in a session of its own; the runner starts the command (in a further
session and process group of its own, so a stop can signal the whole group), records what
happens in the attempt directory ``DIR`` and exits when the command has ended. Whatever
scheduler runs next reads the directory: nothing about an attempt lives only in memory.

The attempt directory (also read by :mod:`airflow_quota.service.backends.local`)::

    attempt.json    what to run: command, cwd, launch time (written by ``start`` before launch)
    runner.json     the runner's pid and process start time (written first thing by the runner)
    command.json    the command's pid (= its process group), start time, ``started_at``
    stop.json       a stop request: ``requested_at``, ``deadline`` (written by ``stop``)
    term_sent       created exactly once by whoever sends the command its SIGTERM
    killed.json     when ``poll`` sent SIGKILL after the grace
    exit.json       the outcome: ``returncode`` (negative: killed by that signal), ``ended_at``,
                    ``stopped`` (a stop was requested before it ended)
    training.log    the command's stdout and stderr
    runner.log      the runner's own output (tracebacks, should anything go wrong)

Every JSON file is written atomically (a temporary file renamed into place), so a reader sees a
whole record or none. This module imports only the standard library, so the runner starts fast
and does not depend on the rest of the package.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

ATTEMPT = "attempt.json"
RUNNER = "runner.json"
COMMAND = "command.json"
STOP = "stop.json"
TERM_SENT = "term_sent"
KILLED = "killed.json"
EXIT = "exit.json"
TRAINING_LOG = "training.log"
RUNNER_LOG = "runner.log"

COMMAND_NOT_STARTED = 127
"""Exit code recorded when the command cannot be started at all (as a shell reports it)."""


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` to ``path`` atomically: a reader sees the old file, or the whole new one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("w", encoding="utf-8") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any] | None:
    """The record at ``path``, or None when there is none (yet)."""
    try:
        with path.open(encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    return data if isinstance(data, dict) else None


def start_ticks(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (Linux ``/proc``), or None.

    Stored next to every pid so that a pid reused by an unrelated process is never mistaken
    for ours (and never signalled).
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[19])


def process_alive(pid: int, ticks: int | None) -> bool:
    """Whether the process recorded as (``pid``, ``ticks``) still runs (a zombie does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:
        stat = ""
    if stat:
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] in ("Z", "X"):
            return False
        return ticks is None or int(fields[19]) == ticks
    # No /proc (not Linux): signal 0 says whether the pid exists, without the reuse check.
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group ``pgid``, from ``/proc`` (Linux; empty
    elsewhere, where the group is killed at once as before)."""
    members = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(entry))
    return members


def record_process(path: Path, pid: int, **extra: Any) -> None:
    """Write a pid record (pid, start ticks and ``extra``) to ``path``."""
    write_json(path, {"pid": pid, "start_ticks": start_ticks(pid), **extra})


def send_term_once(attempt_dir: Path, pid: int) -> bool:
    """Send SIGTERM to the command's process group, unless someone already did.

    The scheduler's ``stop`` and the runner may both want to forward the stop; a training
    script that takes a second SIGTERM for "abort now" would lose its checkpoint, so the first
    to create ``term_sent`` (an exclusive create, atomic) is the only one that signals.
    """
    try:
        fd = os.open(attempt_dir / TERM_SENT, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    os.close(fd)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    return True


class Runner:
    """Runs the command of the attempt in ``attempt_dir`` and records its life there."""

    def __init__(self, attempt_dir: Path) -> None:
        self.dir = attempt_dir
        self.proc: subprocess.Popen[bytes] | None = None
        self.stop_signalled = False

    def stop_requested(self) -> bool:
        """A stop came by signal or by ``stop.json`` (the scheduler writes it before signalling)."""
        return self.stop_signalled or (self.dir / STOP).exists()

    def on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        """Forward a SIGTERM to the command (once); before the command starts, keep it from starting."""
        self.stop_signalled = True
        if self.proc is not None:
            send_term_once(self.dir, self.proc.pid)

    def run(self) -> int:
        """Start the command, wait for it, record the outcome; the runner's own exit status."""
        record_process(self.dir / RUNNER, os.getpid())
        signal.signal(signal.SIGTERM, self.on_sigterm)
        # Detached: a hang-up or Ctrl-C meant for the scheduler's terminal is not for us.
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        spec = read_json(self.dir / ATTEMPT)
        if spec is None:
            raise SystemExit(f"{self.dir / ATTEMPT}: missing")
        if self.stop_requested():
            self.record_exit(None, started_at=None)
            return 0
        command = spec["command"]
        argv = ["/bin/sh", "-c", command] if isinstance(command, str) else [str(a) for a in command]
        started_at = time.time()
        with (self.dir / TRAINING_LOG).open("ab") as log:
            try:
                self.proc = subprocess.Popen(
                    argv,
                    cwd=spec.get("cwd"),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except OSError as exc:
                log.write(f"local backend: cannot start {argv!r}: {exc}\n".encode())
                self.record_exit(COMMAND_NOT_STARTED, started_at=None)
                return 0
        record_process(self.dir / COMMAND, self.proc.pid, started_at=started_at)
        # A stop that came while the command was being started: forward it now.
        if self.stop_requested():
            send_term_once(self.dir, self.proc.pid)
        returncode = self.wait_and_clean_up(self.proc)
        self.record_exit(returncode, started_at=started_at)
        return 0

    def wait_and_clean_up(self, proc: subprocess.Popen[bytes]) -> int:
        """Wait for the command to end, then kill what is left of its process group.

        Children the command left behind (data loader workers, a backgrounded process) would
        keep holding GPUs after the attempt is reported ended, so they go with it. When a stop
        was requested, they first get the rest of its grace: the process the runner started
        may be only a shell (``/bin/sh -c`` forks the training) that died of the SIGTERM while
        the training is still writing its checkpoint. The leader is waited for without being
        reaped (``WNOWAIT``) so that its pid, which names the group, cannot be reused before
        the group is killed.
        """
        if hasattr(os, "waitid"):
            os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
            if self.stop_requested():
                self.wait_for_group(proc.pid)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            return proc.wait()
        returncode = proc.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        return returncode

    def wait_for_group(self, pgid: int, interval: float = 0.02) -> None:
        """Until the stop's deadline (``stop.json``), wait for every live process of the group
        ``pgid`` to end; the group's SIGTERM has been sent (or is sent now if it was not)."""
        send_term_once(self.dir, pgid)
        request = read_json(self.dir / STOP)
        deadline = float(request["deadline"]) if request else time.time()
        while group_members(pgid) and time.time() < deadline:
            time.sleep(interval)

    def record_exit(self, returncode: int | None, started_at: float | None) -> None:
        """Write ``exit.json``: the outcome every later ``poll`` reports."""
        write_json(
            self.dir / EXIT,
            {
                "returncode": returncode,
                "started_at": started_at,
                "ended_at": time.time(),
                "stopped": self.stop_requested(),
            },
        )


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``local_runner ATTEMPT_DIR``."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m airflow_quota.service.backends.local_runner ATTEMPT_DIR", file=sys.stderr)
        return 2
    return Runner(Path(args[0])).run()


if __name__ == "__main__":
    sys.exit(main())
