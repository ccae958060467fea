"""A scheduler's whole state as bytes, and back: what the quota service's snapshots hold
(``service/snapshots.py``), so that recovery loads the newest snapshot and replays only the
inputs after it instead of the whole history.

A snapshot is ``MAGIC``, a one-line JSON header (``format``, ``layout``) and the state, pickled
and compressed. Reading it accepts only the core's own classes (``SNAPSHOT_CLASSES``): a
snapshot is data, never code. Two things tell an unreadable snapshot apart, so that recovery
skips it for an older one or the log (``SnapshotUnreadable``):

- ``format`` is the encoding's version, ``SNAPSHOT_FORMAT``; each format this version can read
  has a loader in ``LOADERS``;
- ``layout`` is a fingerprint of the snapshot classes' fields (``core_layout``). A snapshot
  holds the core's objects as they are laid out, so a change to their fields is a new format.
  ``tests/core/test_snapshot.py`` pins the current layout to ``LAYOUTS[SNAPSHOT_FORMAT]``: a
  change to a snapshot class fails it until ``SNAPSHOT_FORMAT`` is raised, with a loader that
  turns the previous format into the new one and a stored snapshot of it for the test that
  loads every older format. Retention removes the inputs before a snapshot, so a format no
  loader reads leaves a database that only the previous version can recover.

Before it is written, the state forgets the finished jobs nothing refers to any more
(``QuotaScheduler.forget_finished``): their rows stay in the database until retention removes
them, and a snapshot costs what the live jobs cost, whatever the history.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import heapq
import importlib
import io
import json
import pickle
import zlib
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel
from sortedcontainers import SortedList

from airflow_quota.core.config import Share
from airflow_quota.core.cycle import QuotaScheduler
from airflow_quota.core.lifecycle import STARVE, queued
from airflow_quota.core.normal_wait import RecentWaits

SNAPSHOT_FORMAT = 3
"""The format ``encode`` writes."""

MAGIC = b"airflow-quota snapshot\n"

SNAPSHOT_CLASSES: tuple[str, ...] = (
    "airflow_quota.core.catalogue.InstanceTypeSpec",
    "airflow_quota.core.config.AlertsConfig",
    "airflow_quota.core.config.Pool",
    "airflow_quota.core.config.QuotaConfig",
    "airflow_quota.core.config.Share",
    "airflow_quota.core.config.ShareState",
    "airflow_quota.core.config.Strategy",
    "airflow_quota.core.config.TrainingPlan",
    "airflow_quota.core.config.NotifierEntry",
    "airflow_quota.core.cycle.QuotaScheduler",
    "airflow_quota.core.guarantees.GuaranteeWatch",
    "airflow_quota.core.lifecycle.Lifecycle",
    "airflow_quota.core.measures.Meter",
    "airflow_quota.core.measures.ShareTotals",
    "airflow_quota.core.model.AlertKind",
    "airflow_quota.core.model.Entry",
    "airflow_quota.core.model.FailureReason",
    "airflow_quota.core.model.Job",
    "airflow_quota.core.model.JobRequest",
    "airflow_quota.core.model.JobState",
    "airflow_quota.core.model.Placement",
    "airflow_quota.core.model.PreemptionKind",
    "airflow_quota.core.model.PreemptionRecord",
    "airflow_quota.core.model.PreferenceEntry",
    "airflow_quota.core.model.UsageLine",
    "airflow_quota.core.normal_wait.RecentWaits",
    "airflow_quota.core.overtaking.OvertakeLog",
    "airflow_quota.core.queues.ShareQueue",
    "airflow_quota.core.quota.Plan",
    "airflow_quota.core.quota.TypeLedger",
    "airflow_quota.core.state.Changes",
    "airflow_quota.core.state.QuotaState",
)
"""The core's classes a scheduler's state is made of: the only ones a snapshot may name."""

OTHER_CLASSES: frozenset[tuple[str, str]] = frozenset(
    {
        ("collections", "defaultdict"),
        ("collections", "deque"),
        ("datetime", "datetime"),
        ("datetime", "timedelta"),
        ("datetime", "timezone"),
        ("sortedcontainers.sortedlist", "SortedList"),
        ("copyreg", "_reconstructor"),
        ("builtins", "set"),
        ("builtins", "frozenset"),
        ("builtins", "object"),
    }
)
"""What else a state holds: containers and time, no code."""

LAYOUTS: dict[int, str] = {1: "89e33aa89e88b552", 2: "1e68f23d590979a6", 3: "64d0c39a550579c8"}
"""Each format's ``core_layout``: a snapshot of format N loads only into classes laid out so."""


class SnapshotUnreadable(Exception):
    """The bytes are not a snapshot this version can load; the message says why."""


def _split(name: str) -> tuple[str, str]:
    module, _, qualname = name.rpartition(".")
    return module, qualname


def _fields(cls: type) -> list[str]:
    """What a class's instances hold, as far as its definition says."""
    if isinstance(cls, type) and issubclass(cls, enum.Enum):
        return [f"{member.name}={member.value}" for member in cls]
    if isinstance(cls, type) and issubclass(cls, BaseModel):
        return sorted(cls.model_fields)
    if dataclasses.is_dataclass(cls):
        return [f.name for f in dataclasses.fields(cls)]
    slots = getattr(cls, "__slots__", None)
    if slots:
        return sorted(slots)
    return sorted(set(cls.__init__.__code__.co_names))  # the attributes its __init__ sets, and the names it calls


def core_layout() -> str:
    """A fingerprint of the snapshot classes' fields: equal while every class keeps its fields."""
    described = []
    for name in SNAPSHOT_CLASSES:
        module, qualname = _split(name)
        cls = getattr(importlib.import_module(module), qualname)
        described.append(f"{name}({','.join(_fields(cls))})")
    return hashlib.sha256("\n".join(described).encode()).hexdigest()[:16]


class _CoreUnpickler(pickle.Unpickler):
    """Loads the core's classes and plain data, and refuses anything else by name."""

    allowed = frozenset(_split(name) for name in SNAPSHOT_CLASSES) | OTHER_CLASSES

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self.allowed:
            raise SnapshotUnreadable(f"it names {module}.{name}, which is not part of the core's state")
        return super().find_class(module, name)


def encode(scheduler: QuotaScheduler) -> bytes:
    """The scheduler's state, in the current format."""
    header = json.dumps({"format": SNAPSHOT_FORMAT, "layout": core_layout()}).encode()
    return MAGIC + header + b"\n" + zlib.compress(pickle.dumps(scheduler, protocol=pickle.HIGHEST_PROTOCOL), 1)


def checksum(data: bytes) -> str:
    """What a stored snapshot is checked against before it is read (SHA-256, hex)."""
    return hashlib.sha256(data).hexdigest()


def decode(data: bytes) -> QuotaScheduler:
    """The scheduler a snapshot holds; SnapshotUnreadable when it cannot be read."""
    if not data.startswith(MAGIC):
        raise SnapshotUnreadable("it does not start as a snapshot does")
    header_line, _, body = data[len(MAGIC) :].partition(b"\n")
    try:
        header = json.loads(header_line)
        version = int(header["format"])
    except (ValueError, KeyError, TypeError) as exc:
        raise SnapshotUnreadable(f"its header is damaged ({exc})") from None
    loader = LOADERS.get(version)
    if loader is None:
        readable = ", ".join(str(v) for v in sorted(LOADERS))
        raise SnapshotUnreadable(f"it is of format {version}; this version reads formats {readable}")
    return loader(header, body)


def _unpickle(body: bytes) -> Any:
    try:
        return _CoreUnpickler(io.BytesIO(zlib.decompress(body))).load()
    except SnapshotUnreadable:
        raise
    except Exception as exc:  # a damaged body fails in zlib or pickle, in many ways
        raise SnapshotUnreadable(f"its body is damaged ({type(exc).__name__}: {exc})") from None


def _load_pickled(header: dict[str, Any], body: bytes, version: int) -> QuotaScheduler:
    """The pickled ``QuotaScheduler`` of a snapshot of format ``version``, whose classes this
    version's loader for it turns into today's (``LAYOUTS[SNAPSHOT_FORMAT]``)."""
    if header.get("layout") != LAYOUTS[version] or core_layout() != LAYOUTS[SNAPSHOT_FORMAT]:
        raise SnapshotUnreadable(
            f"its classes are laid out as {header.get('layout')}, this version's as {core_layout()}"
        )
    scheduler = _unpickle(body)
    if not isinstance(scheduler, QuotaScheduler):
        raise SnapshotUnreadable(f"it holds a {type(scheduler).__name__}, not a scheduler")
    return scheduler


def _load_format_1(header: dict[str, Any], body: bytes) -> QuotaScheduler:
    """Format 1, before ``max_running_jobs`` (docs/model.md rule 4.0.6): its shares have no such
    limit, and how many jobs each share holds is counted from the jobs."""
    scheduler = _load_pickled(header, body, 1)
    state = scheduler.state
    for share in [*state.config.shares, *state.shares.values()]:
        share.__dict__.setdefault("max_running_jobs", None)
    holding = dict.fromkeys(state.shares, 0)
    for job in state.jobs.values():
        if job.placement is not None:
            holding[job.share] = holding.get(job.share, 0) + 1
    state.holding_jobs = holding
    return _adapt_starvation(scheduler)


def _adapt_starvation(scheduler: QuotaScheduler) -> QuotaScheduler:
    """Format 2 into 3, before the adaptive starvation threshold (docs/model.md rule 8.2, model
    v5): a share that left ``starvation_after_seconds`` at its old default of 48 h now adapts; one
    that set it keeps its fixed threshold. No share's recent waits were kept: each share's normal
    wait is learnt anew from its next placements (48 h until it is known). A starvation timer a
    job becomes one a share, for its jobs not yet past the threshold (``await_starvation``)."""
    state = scheduler.state
    for share in [*state.config.shares, *state.shares.values()]:
        if "starvation_after_seconds" not in share.model_fields_set:
            share.__dict__["starvation_after_seconds"] = None
        for name in ("starvation_multiple", "starvation_min_seconds"):
            share.__dict__.setdefault(name, Share.model_fields[name].default)
    state.recent_waits = {name: RecentWaits() for name in state.shares}
    lifecycle = scheduler.lifecycle
    lifecycle._timers = [timer for timer in lifecycle._timers if timer[2] != STARVE]  # one a job, then
    heapq.heapify(lifecycle._timers)
    lifecycle._starve_due = {}
    state.overtakes._names = {}  # the placers' names, for the alerts: none for the earlier ones
    watched = state.overtakes.watched()
    for queue in state.queues.values():
        queue.unjudged = SortedList()
    for job in state.jobs.values():
        job.past_threshold = job.starving or job.seq in watched
        if queued(job) and not job.past_threshold:
            state.queues[job.share].unjudged.add((job.runnable_since, job.seq))
    for name in state.shares:
        lifecycle.await_starvation(name, 0.0)
    return scheduler


def _load_format_2(header: dict[str, Any], body: bytes) -> QuotaScheduler:
    """Format 2: the pickled ``QuotaScheduler``, its classes laid out as ``LAYOUTS[2]``."""
    return _adapt_starvation(_load_pickled(header, body, 2))


def _load_format_3(header: dict[str, Any], body: bytes) -> QuotaScheduler:
    """Format 3: the pickled ``QuotaScheduler``, its classes laid out as ``LAYOUTS[3]``."""
    return _load_pickled(header, body, 3)


LOADERS: dict[int, Callable[[dict[str, Any], bytes], QuotaScheduler]] = {
    1: _load_format_1,
    2: _load_format_2,
    3: _load_format_3,
}
"""Each format this version reads, and how."""
