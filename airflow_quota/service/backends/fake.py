"""A deterministic backend for tests, the scenario replay through the service, and the soak.

``training`` says what the fake attempt does: ``{"duration": seconds of work, "startup": seconds
before it runs, "failures": [{"after": seconds, "reason": "ExitCode:1"}, ...] (item k for attempt
k+1), "capacity_error": true}``. ``remaining`` may say how much work an attempt still has (a
training resuming from its checkpoint). Time comes from the service's clock. With a
``state_dir`` the attempts live in files, so schedulers in other processes (a restarted leader)
see the same attempts.

A stop of an attempt the backend never heard of leaves a *tombstone*: the attempt is recorded
as stopped before it started, and a later start of it does nothing (``base.py``: a start made
late by a deposed leader, after the next leader stopped the attempt, must not run it). Start
and tombstone each create the attempt's record only if none exists (``os.link`` of a finished
file, atomic), so of a start and a stop racing from two schedulers exactly one creates it: a
start first is then stopped, a stop first leaves the start nothing to do.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from airflow_quota.service.backends.base import STOPPED_BEFORE_START, AttemptReport, AttemptSpec, AttemptStatus


class FakeBackend:
    name = "fake"

    def __init__(
        self,
        clock: Callable[[], float],
        state_dir: Path | None = None,
        remaining: Callable[[AttemptSpec], float] | None = None,
        poll_interval_seconds: float = 0.0,
    ) -> None:
        self.clock = clock
        self.poll_interval_seconds = poll_interval_seconds
        """0 by default: polled at every step, so a test's manual clock sees a change at once."""
        self.state_dir = state_dir
        self.remaining = remaining
        self._memory: dict[str, dict[str, Any]] = {}
        self._memory_lock = threading.Lock()
        """Makes "create if absent" atomic for the in-memory store (the poller's threads share it)."""
        self.starts: list[str] = []
        """Every attempt key ever started by this object, in order (tests check "never twice")."""

    def start(self, attempt: AttemptSpec) -> None:
        """Start the attempt, unless the backend has it already: started before, or stopped
        before it was ever started (a tombstone)."""
        if self._load(attempt.key) is not None:
            return
        work = self.remaining(attempt) if self.remaining else float(attempt.training.get("duration", 0))
        failures = attempt.training.get("failures") or []
        failure = failures[attempt.attempt - 1] if attempt.attempt <= len(failures) else None
        state = {
            "started_at": self.clock(),
            "training": attempt.training,
            "work": work,
            "failure": failure,
            "stop_at": None,
        }
        if self._create(attempt.key, state):
            self.starts.append(attempt.key)

    def poll(self, attempt: AttemptSpec) -> AttemptReport:
        state = self._load(attempt.key)
        if state is None:
            return AttemptReport(AttemptStatus.UNKNOWN)
        if state.get("tombstone"):
            return AttemptReport(AttemptStatus.STOPPED, STOPPED_BEFORE_START, ended_at=float(state["stop_at"]))
        if state["training"].get("capacity_error"):
            started = float(state["started_at"])
            return AttemptReport(AttemptStatus.CAPACITY_ERROR, "CapacityError: no capacity", ended_at=started)
        now = self.clock()
        running_since, ends, outcome, reason = _timeline(state)
        if now >= ends:
            return AttemptReport(outcome, reason, running_since, ends)
        if now >= running_since:
            return AttemptReport(AttemptStatus.RUNNING, None, running_since)
        return AttemptReport(AttemptStatus.PENDING)

    def next_change(self, after: float) -> float | None:
        """The earliest moment after ``after`` at which some attempt's status changes (tests
        that drive the clock step to it); only for the in-memory store."""
        moments = []
        for state in list(self._memory.values()):
            running_since, ends, _, _ = _timeline(state)
            moments += [t for t in (running_since, ends) if t > after]
        return min(moments, default=None)

    def all_ended(self) -> bool:
        """Whether every attempt this backend's store holds has ended by now (tests wait on it)."""
        keys = self._memory if self.state_dir is None else [path.stem for path in self.state_dir.glob("*.json")]
        now = self.clock()
        return all(_timeline(state)[1] <= now for key in keys if (state := self._load(key)) is not None)

    def stop(self, attempt: AttemptSpec, grace_seconds: float) -> None:
        """Stop the attempt after ``grace_seconds`` (the first stop's deadline holds); one never
        started is left a tombstone, so that no later start runs it."""
        state = self._load(attempt.key)
        if state is None:
            now = self.clock()  # a record like any other (readers of the files), running from now to now
            tombstone = {
                "tombstone": True,
                "started_at": now,
                "training": {},
                "work": 0.0,
                "failure": None,
                "stop_at": now,
            }
            if self._create(attempt.key, tombstone):
                return
            state = self._load(attempt.key)  # a racing start created it first: stop that
            assert state is not None
        if state["stop_at"] is not None:
            return
        state["stop_at"] = self.clock() + grace_seconds
        self._save(attempt.key, state)

    def attempt_keys(self) -> list[str]:
        """The key of every attempt this backend's store holds, tombstones included."""
        if self.state_dir is None:
            with self._memory_lock:
                return sorted(self._memory)
        return sorted(path.stem for path in self.state_dir.glob("*.json"))

    def _create(self, key: str, state: dict[str, Any]) -> bool:
        """Store ``state`` as the attempt's record if it has none; whether it did (atomic)."""
        if self.state_dir is None:
            with self._memory_lock:
                if key in self._memory:
                    return False
                self._memory[key] = state
                return True
        self.state_dir.mkdir(parents=True, exist_ok=True)
        temporary = self._temporary(key)
        temporary.write_text(json.dumps(state))
        try:
            os.link(temporary, self.state_dir / f"{key}.json")  # fails if the record exists
        except FileExistsError:
            return False
        finally:
            temporary.unlink()
        return True

    def _load(self, key: str) -> dict[str, Any] | None:
        if self.state_dir is None:
            return self._memory.get(key)
        path = self.state_dir / f"{key}.json"
        return json.loads(path.read_text()) if path.exists() else None

    def _save(self, key: str, state: dict[str, Any]) -> None:
        if self.state_dir is None:
            self._memory[key] = state
            return
        self.state_dir.mkdir(parents=True, exist_ok=True)
        temporary = self._temporary(key)
        temporary.write_text(json.dumps(state))
        os.replace(temporary, self.state_dir / f"{key}.json")

    def _temporary(self, key: str) -> Path:
        """A file of this process's thread to write a record in before it takes its name."""
        assert self.state_dir is not None
        return self.state_dir / f".{key}.{os.getpid()}.{threading.get_ident()}.json.tmp"


def _timeline(state: dict[str, Any]) -> tuple[float, float, AttemptStatus, str | None]:
    """When a fake attempt runs, when it ends, and how: stopped (if asked before its end),
    failed (its attempt's failure comes before the work is done) or succeeded. A tombstone never
    ran: it ended, stopped, when it was stopped."""
    if state.get("tombstone"):
        stopped = float(state["stop_at"])
        return stopped, stopped, AttemptStatus.STOPPED, STOPPED_BEFORE_START
    running_since = float(state["started_at"]) + float(state["training"].get("startup", 0))
    ends = running_since + float(state["work"])
    outcome, reason = AttemptStatus.SUCCEEDED, None
    failure = state["failure"]
    if failure is not None and running_since + float(failure["after"]) < ends:
        ends = running_since + float(failure["after"])
        outcome, reason = AttemptStatus.FAILED, str(failure.get("reason", "ExitCode:1"))
    stop_at = state["stop_at"]
    if stop_at is not None and float(stop_at) < ends:
        reason = STOPPED_BEFORE_START if float(stop_at) <= running_since else "stopped"
        ends, outcome = float(stop_at), AttemptStatus.STOPPED
    return running_since, ends, outcome, reason
