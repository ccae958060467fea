"""Snapshots of the core (``core/snapshot.py``): a state written at any input and read back,
then fed the rest of the log, makes the decisions and ends in the state a replay of the whole
log does; a snapshot that cannot be read says why; the snapshot classes' layout is pinned to
the format, so a change to them cannot slip by without a new format and its loader."""

from __future__ import annotations

import pickle
from collections import deque
from datetime import datetime
from enum import Enum
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from sortedcontainers import SortedList

from airflow_quota.core import snapshot
from airflow_quota.core.cycle import QuotaScheduler
from airflow_quota.core.lifecycle import STARVE
from airflow_quota.core.model import Decision, Rejected
from airflow_quota.service.inputs import apply, from_row
from airflow_quota.sim.scenario import LoadedScenario
from benchmarks.input_log import Row, input_log, starting_core
from tests.core.properties import congested_workload, scenarios, with_reservations

STORED = Path(__file__).parent / "snapshots"
"""A snapshot of each format, written from ``stored_state``."""

Made = list[Decision] | None
"""What one input made: its decisions, or None when it was about a job the core forgot (the
quota service refuses a change to one itself, and takes no report of one in)."""


def play(scheduler: QuotaScheduler, rows: list[Row]) -> tuple[QuotaScheduler, list[Made]]:
    made: list[Made] = []
    for kind, payload, at in rows:
        if "job_id" in payload and kind != "submit" and payload["job_id"] not in scheduler.state.refs:
            made.append(None)
        else:
            made.append(apply(scheduler, from_row(kind, payload), at)[1])
    return scheduler, made


def same_decisions(after_snapshot: list[Made], replayed: list[Made]) -> bool:
    """Input by input the same decisions, where an input about a forgotten job made, in the
    replay, one refusal or nothing."""
    assert len(after_snapshot) == len(replayed)
    for ours, theirs in zip(after_snapshot, replayed, strict=True):
        if ours is None:
            if not (theirs == [] or (theirs and len(theirs) == 1 and isinstance(theirs[0], Rejected))):
                return False
        elif ours != theirs:
            return False
    return True


def comparable(value: Any, seen: dict[int, int] | None = None) -> Any:
    """The value as plain data to compare: objects as their attributes, sets and dicts sorted
    (their order may follow the string hashes', which differ from process to process anyway),
    pydantic models as their dump. An object met again is named by the order it was first met
    in."""
    seen = {} if seen is None else seen
    if value is None or isinstance(value, (bool, int, float, str, Enum)):
        return value
    if isinstance(value, BaseModel):
        return (type(value).__name__, value.model_dump())
    if isinstance(value, (set, frozenset)):
        return ("set", sorted((comparable(v, seen) for v in value), key=repr))
    if isinstance(value, dict):
        pairs = [(comparable(k, seen), comparable(v, seen)) for k, v in value.items()]
        return ("dict", sorted(pairs, key=repr))
    if isinstance(value, (list, tuple, SortedList, deque)):
        return (type(value).__name__, [comparable(v, seen) for v in value])
    if isinstance(value, datetime):
        return value.isoformat()
    if id(value) in seen:
        return ("again", seen[id(value)])
    seen[id(value)] = len(seen)
    names = [n for cls in type(value).__mro__ for n in getattr(cls, "__slots__", ())]
    names += list(getattr(value, "__dict__", {}))
    return (type(value).__name__, [(n, comparable(getattr(value, n), seen)) for n in names if hasattr(value, n)])


def whole_state(scheduler: QuotaScheduler) -> Any:
    """The whole state, finished jobs forgotten, to compare."""
    scheduler.forget_finished()
    return comparable(scheduler)


def assert_round_trip(loaded: LoadedScenario, at: float) -> None:
    """A snapshot after the first ``at`` (a fraction) of the log, read back and fed the rest,
    ends as the whole replay does."""
    rows = input_log(loaded)
    cut = int(at * len(rows))
    whole, decided = play(starting_core(loaded), rows)
    before, decided_before = play(starting_core(loaded), rows[:cut])
    assert decided_before == decided[:cut]
    before.forget_finished()
    after, decided_after = play(snapshot.decode(snapshot.encode(before)), rows[cut:])
    assert same_decisions(decided_after, decided[cut:]), "the decisions after the snapshot differ"
    assert whole_state(after) == whole_state(whole), "the state after the snapshot and the rest differs"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(loaded=scenarios(), where=st.floats(0.0, 1.0))
def test_a_snapshot_read_back_and_fed_the_rest_decides_as_the_whole_replay(
    loaded: LoadedScenario, where: float
) -> None:
    assert_round_trip(loaded, where)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), where=st.floats(0.05, 0.95), reservations=st.booleans())
def test_the_round_trip_holds_on_congested_workloads(seed: int, where: float, reservations: bool) -> None:
    loaded = congested_workload(300, seed)
    assert_round_trip(with_reservations(loaded) if reservations else loaded, where)


def test_forgetting_the_finished_jobs_keeps_the_snapshot_to_the_live_ones() -> None:
    loaded = congested_workload(600, 3)
    rows = input_log(loaded)
    scheduler, _ = play(starting_core(loaded), rows[: len(rows) // 2])
    live = sum(1 for job in scheduler.state.jobs.values() if not job.state.is_final)
    finished = len(scheduler.state.jobs) - live
    assert finished > 100 and live > 0
    forgotten = scheduler.forget_finished()
    assert 0 < forgotten <= finished
    assert len(scheduler.state.jobs) == live + finished - forgotten
    assert set(scheduler.state.refs.values()) <= set(scheduler.state.jobs)


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (lambda data: b"not a snapshot" + data, "does not start as a snapshot does"),
        (lambda data: data.replace(b'"format": 3', b'"format": 99'), "format 99; this version reads formats 1, 2, 3"),
        (lambda data: data.replace(b'"format": 3', b'"format": 0'), "format 0"),
        (lambda data: data.replace(b'{"format"', b'{"fromat"'), "header is damaged"),
        (lambda data: data[: len(data) // 2], "body is damaged"),
        (lambda data: data.replace(snapshot.LAYOUTS[3].encode(), b"0" * 16), "laid out as 0000000000000000"),
    ],
)
def test_a_snapshot_that_cannot_be_read_says_why(damage: Any, why: str) -> None:
    loaded = congested_workload(40, 1)
    scheduler, _ = play(starting_core(loaded), input_log(loaded))
    with pytest.raises(snapshot.SnapshotUnreadable, match=why):
        snapshot.decode(damage(snapshot.encode(scheduler)))


def test_a_snapshot_naming_anything_but_the_core_is_refused_unread() -> None:
    class Payload:
        def __reduce__(self) -> tuple[Any, ...]:
            return (print, ("never run",))

    import json
    import zlib

    header = json.dumps({"format": 1, "layout": snapshot.LAYOUTS[1]}).encode()
    data = snapshot.MAGIC + header + b"\n" + zlib.compress(pickle.dumps(Payload()))
    with pytest.raises(snapshot.SnapshotUnreadable, match=r"names builtins\.print"):
        snapshot.decode(data)


def test_the_snapshot_classes_are_laid_out_as_the_current_format_says() -> None:
    """A field added to, renamed in or removed from a class of the core's state changes what
    a snapshot holds: raise ``SNAPSHOT_FORMAT``, add the new layout to ``LAYOUTS`` and a loader
    from the previous format to ``LOADERS``, and store a snapshot of the new format here."""
    assert snapshot.core_layout() == snapshot.LAYOUTS[snapshot.SNAPSHOT_FORMAT]


def stored_state() -> QuotaScheduler:
    """The state the stored snapshots were written from, replayed again: a congested
    workload's log, its first half."""
    loaded = congested_workload(200, 11)
    rows = input_log(loaded)
    scheduler, _ = play(starting_core(loaded), rows[: len(rows) // 2])
    return scheduler


@pytest.mark.parametrize("version", sorted(snapshot.LOADERS))
def test_a_stored_snapshot_of_every_format_loads_as_its_log_replays(version: int) -> None:
    """Formats before 3 kept no share's recent waits: they load with none, to be learnt anew."""
    loaded = snapshot.decode((STORED / f"format-{version}.snapshot").read_bytes())
    replayed = stored_state()
    if version < 3:
        assert all(len(waits) == 0 for waits in loaded.state.recent_waits.values())
        assert set(loaded.state.recent_waits) == set(replayed.state.shares)
        assert sum(len(waits) for waits in replayed.state.recent_waits.values()) > 0
        replayed.state.recent_waits = loaded.state.recent_waits
        assert loaded.state.overtakes._names == {}  # placers' names, for the alerts: kept from format 3
        replayed.state.overtakes._names = {}
        assert_one_starvation_timer_a_share(loaded)
        for scheduler in (loaded, replayed):  # a timer a job then, a timer a share now
            lifecycle = scheduler.lifecycle
            lifecycle._timers = sorted((at, 0, kind, what) for at, _, kind, what in lifecycle._timers if kind != STARVE)
            lifecycle._timer_seq = 0
            lifecycle._starve_due = {}
            attributes = sorted(vars(lifecycle).items())
            vars(lifecycle).clear()
            vars(lifecycle).update(attributes)
    assert whole_state(loaded) == whole_state(replayed)


def assert_one_starvation_timer_a_share(scheduler: QuotaScheduler) -> None:
    """Each share with jobs not yet past its threshold has one STARVE timer, when the earliest
    of them passes it."""
    lifecycle = scheduler.lifecycle
    live = {t[3]: t[0] for t in lifecycle._timers if t[2] == STARVE}
    expected = {
        name: queue.unjudged[0][0] + lifecycle.threshold(name).seconds
        for name, queue in scheduler.state.queues.items()
        if queue.unjudged
    }
    assert expected and live == expected


def test_a_format_2_share_at_the_old_default_threshold_adapts_and_a_set_one_stays() -> None:
    """The stored state's shares set ``starvation_after_seconds``: they keep it. A share that
    left it at v4's default of 48 h has it no longer (its threshold adapts, rule 8.2)."""
    loaded = snapshot.decode((STORED / "format-2.snapshot").read_bytes())
    assert {share.starvation_after_seconds for share in loaded.state.shares.values()} == {1800}
    share = next(iter(loaded.state.shares.values()))
    share.__pydantic_fields_set__.discard("starvation_after_seconds")
    share.__dict__.pop("starvation_multiple")
    snapshot._adapt_starvation(loaded)
    assert share.starvation_after_seconds is None
    assert share.starvation_multiple == 8
