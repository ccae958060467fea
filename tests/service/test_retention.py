"""Retention (issue 39, ``store/retention.py``): what a prune removes and what it never does.

- A real quota service (fake backend, manual clock, SQLite and PostgreSQL) runs jobs 200 days
  ago, with a reclaim (a preemption) and a job still running; a second leader with 90 days'
  retention prunes in its idle steps: the share totals and the utilisation chart read the same
  before and after, the live job keeps every row, and ``db prune --dry-run`` had counted
  exactly what went.
- A property test over random mixes of rows (every job state, attempts open and with backend
  actions pending, alerts delivered and not, requests taken in and not): no live job's row, no
  undelivered alert, no job with a pending action goes; every batch stays within its limits;
  the dry run counts what the prune removes; the same with batches shrinking after each one
  (a time budget of 0).
- Batches adapt: a batch that held longer than the budget halves the next one's limits, fast
  ones grow them back to the limits and no further, never below the floor (the durations are
  injected: nothing sleeps).
- Inputs go only below the older of the two newest snapshots; ``retention_days`` 0 removes
  nothing; a bad setting exits 2 naming it.
"""

from __future__ import annotations

import functools
import json
import math
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, exists, func, or_, select

from airflow_quota import cli
from airflow_quota.core.model import JobRequest, JobState
from airflow_quota.service.backends.fake import FakeBackend
from airflow_quota.service.clock import ManualClock
from airflow_quota.service.scheduler import QuotaService
from airflow_quota.store import dashboard
from airflow_quota.store.engine import make_engine, migrate, session_factory
from airflow_quota.store.models import (
    AlertRow,
    Attempt,
    EventRow,
    Input,
    JobRow,
    Preemption,
    Request,
    ShareHour,
    Snapshot,
)
from airflow_quota.store.prune_report import TABLES, prune_now
from airflow_quota.store.repository import QuotaStore
from airflow_quota.store.retention import (
    BATCH_BUDGET_SECONDS,
    DAY,
    SMALLEST_SHARE,
    BatchLimits,
    BatchSize,
    Removed,
    Retention,
)

G5 = "ml.g5.xlarge"
QUOTA: dict[str, Any] = {
    "pool": {"capacity": {G5: 2}},
    "shares": [
        {"name": "research", "capacity_limits": {G5: 1}, "strategy": "LEND_AND_BORROW"},
        {"name": "prod", "capacity_limits": {G5: 1}, "strategy": "LEND"},
    ],
}
"""Two instances, one per share: research borrows prod's until prod reclaims it."""
HOUR = 3600.0


@dataclass
class Played:
    engine: Engine
    clock: ManualClock
    store: QuotaStore
    fake: FakeBackend
    origin: float
    live: int
    """The id of the job still running at the end."""


def play(url: str, state_dir: Path) -> Played:
    """200 days ago: research takes both instances for 3 h; prod reclaims one after 30 min (a
    preemption), research's victim runs again later, a submission is refused each day; a few
    days of jobs after, and one more refusal 10 days ago. 10 days ago a
    long job starts in prod and still runs. Played by a leader keeping everything."""
    engine = make_engine(url)
    migrate(engine)
    origin = (time.time() // HOUR - 200 * 24) * HOUR + 600  # 200 days ago, not on the hour
    clock = ManualClock(origin)
    store = QuotaStore(engine, clock.now)
    fake = FakeBackend(clock.now, state_dir / "fake")
    service = QuotaService(engine, {"fake": fake}, clock=clock, retention_days=0)
    store.apply_config(QUOTA)

    def submit(name: str, share: str, hours: float) -> int:
        request = JobRequest(name=name, share=share, priority=1, preferences=[{"instance_type": G5, "count": 1}])
        return store.submit(request, "fake", {"duration": hours * HOUR}).id

    def run(until: float, every: float = 600.0) -> None:
        while clock.now() + every <= until:
            clock.advance_to(clock.now() + every)
            service.step()

    def refuse(job_id: int) -> None:
        """The submission names a share the configuration in force does not have when the leader
        takes it in (as when the store checked it against the one before): refused, its row goes."""
        with session_factory(engine)() as session, session.begin():
            row = session.get(JobRow, job_id)
            assert row is not None
            row.share, row.request = "gone", {**row.request, "share": "gone"}

    service.recover()
    service.step()
    for day in range(2):
        start = origin + day * 24 * HOUR
        clock.advance_to(start)
        submit(f"r{day}a", "research", 3)
        submit(f"r{day}b", "research", 3)
        service.step()
        refuse(submit(f"x{day}", "prod", 1))
        service.step()
        run(start + 1800)
        submit(f"p{day}", "prod", 1)
        service.step()
        run(start + 12 * HOUR)
    clock.advance_to(origin + 190 * 24 * HOUR)
    live = submit("long", "prod", 100 * 24)
    service.step()
    refuse(submit("recent", "prod", 1))  # within the retention: it stays
    service.step()
    run(clock.now() + 3600)
    clock.advance_to(origin + 200 * 24 * HOUR)
    service.step()
    service.engine.dispose()
    return Played(engine, clock, store, fake, origin, live)


def figures(played: Played, now: float) -> dict[str, Any]:
    """What the Quotas page shows of history at ``now``: each share's totals (the running job's
    charge so far included) and its utilisation over the whole played time (an hour-aligned
    window) and over its first day."""
    store = QuotaStore(played.engine, lambda: now)
    start = played.origin // HOUR * HOUR
    shown: dict[str, Any] = {}
    for share in dashboard.share_summaries(store, now).summaries:
        whole = dashboard.utilisation_history(store, share.name, start, now // HOUR * HOUR)
        day = dashboard.utilisation_history(store, share.name, start, start + 24 * HOUR)
        shown[share.name] = {
            "totals": (round(share.gpu_hours, 4), round(share.lost_gpu_hours, 4), round(share.cost, 3)),
            "preemptions": share.preemptions,
            "whole": (round(whole.gpu_hours, 4), round(whole.borrowed_gpu_hours, 4), round(whole.limit_gpu_hours, 4)),
            "day": (round(day.gpu_hours, 4), round(day.borrowed_gpu_hours, 4), round(day.limit_gpu_hours, 4)),
        }
    return shown


def of_no_job(engine: Engine) -> dict[str, int]:
    """Decisions and requests (but a configuration's) whose job is not stored, whatever their kind:
    what retention's narrower search (refusals only) must find all of."""
    gone = ~exists().where(JobRow.id == EventRow.job_id)
    request_gone = ~exists().where(JobRow.id == Request.job_id)
    return {
        "events": count(engine, EventRow, or_(EventRow.job_id.is_(None), gone)),
        "requests": count(engine, Request, Request.kind != "config", or_(Request.job_id.is_(None), request_gone)),
    }


def count(engine: Engine, model: Any, *where: Any) -> int:
    with engine.connect() as connection:
        return int(connection.scalar(select(func.count()).select_from(model).where(*where)) or 0)


@pytest.fixture
def played(db_url: str, tmp_path: Path) -> Iterator[Played]:
    from airflow_quota.store.settings import normalize

    played = play(normalize(db_url), tmp_path)
    yield played
    played.engine.dispose()


def test_the_leader_prunes_the_past_and_the_history_reads_the_same(played: Played) -> None:
    engine, clock = played.engine, played.clock
    at = clock.now()
    before = figures(played, at)
    assert before["research"]["preemptions"] >= 1 and before["research"]["whole"][1] > 0  # borrowed, reclaimed
    jobs_before = count(engine, JobRow)
    assert of_no_job(engine) == {"events": 3, "requests": 3}  # the refused submissions
    live_rows = {model: count(engine, model, model.job_id == played.live) for model in (Attempt, EventRow)}
    with session_factory(engine)() as session:
        planned = Retention(90).plan(session, clock.now())
    assert planned.removed.jobs == jobs_before - 1  # all but the live one
    assert planned.removed.hours_compacted > 0

    leader = QuotaService(engine, {"fake": played.fake}, clock=clock, retention_days=90)
    # what goes, not how big the batches are (the budget tests below): under a loaded CI the
    # 25 ms budget shrinks them towards 1/32 of the limits, past the steps this loop allows
    leader.pruning.retention.size = BatchSize(budget=math.inf)
    leader.recover()
    removed = Removed()
    for _ in range(200):
        clock.advance_to(clock.now() + 2)
        leader.step()
        if leader.pruning.last is not None:
            removed.add(leader.pruning.last.removed)
            leader.pruning.last = None
        with session_factory(engine)() as session:
            if not Retention(90).plan(session, clock.now()).removed:
                break
    else:
        pytest.fail("the leader's idle steps did not finish pruning in 200 steps")
    leader.engine.dispose()

    assert removed.jobs == planned.removed.jobs and removed.attempts == planned.removed.attempts
    assert removed.events == planned.removed.events and removed.preemptions == planned.removed.preemptions
    assert count(engine, JobRow) == 1 and count(engine, Preemption) == 0
    assert {model: count(engine, model, model.job_id == played.live) for model in (Attempt, EventRow)} == live_rows
    assert count(engine, ShareHour) > 0
    assert of_no_job(engine) == {"events": 1, "requests": 1}  # the refusal after the cutoff stays
    assert figures(played, at) == before


def test_the_dry_run_counts_what_the_prune_removes_and_writes_nothing(played: Played) -> None:
    engine, now = played.engine, played.clock.now()
    sizes = {table: count(engine, model) for table, model in ((t, m) for t, m in _models().items())}
    dry, _ = prune_now(engine, 90, dry_run=True, now=now)
    assert {table: count(engine, model) for table, model in _models().items()} == sizes
    assert dry["tables"]["quota_jobs"] == sizes["quota_jobs"] - 1
    done, text = prune_now(engine, 90, dry_run=False, now=now)
    assert done["tables"] == dry["tables"] and done["hours_compacted"] == dry["hours_compacted"]
    assert {table: sizes[table] - count(engine, model) for table, model in _models().items()} == done["tables"]
    assert "removed:" in text and "quota_jobs" in text
    again, _ = prune_now(engine, 90, dry_run=True, now=now)
    assert sum(again["tables"].values()) == 0


def test_retention_zero_removes_nothing(played: Played) -> None:
    sizes = {table: count(played.engine, model) for table, model in _models().items()}
    document, text = prune_now(played.engine, 0, dry_run=False, now=played.clock.now())
    assert sum(document["tables"].values()) == 0 and document["cutoff"] is None
    assert "everything is kept" in text
    assert {table: count(played.engine, model) for table, model in _models().items()} == sizes


def _models() -> dict[str, Any]:
    from airflow_quota.store import models

    by_table = {model.__tablename__: model for model in models.Base.__subclasses__()}
    return {table: by_table[table] for table in TABLES.values()}


# -- inputs and snapshots ----------------------------------------------------------------


def test_inputs_go_only_below_the_older_of_the_two_newest_snapshots(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'quota.db'}")
    migrate(engine)
    now = 200 * DAY
    with session_factory(engine)() as session, session.begin():
        session.add_all(Input(id=i, at=i * DAY, kind="cycle", payload={}) for i in range(1, 201))
    retention = Retention(90, BatchLimits(inputs=7, snapshots=1))

    def prune() -> list[Removed]:
        return [batch.removed for batch in retention.batches(session_factory(engine), now)]

    assert prune() == [] and count(engine, Input) == 200  # no snapshot: the log is all there is
    snapshot(engine, 1, last_input_id=150)
    assert prune() == [] and count(engine, Input) == 200  # one: it might not load
    snapshot(engine, 2, last_input_id=170)
    snapshot(engine, 3, last_input_id=190)
    with session_factory(engine)() as session:
        planned = retention.plan(session, now).removed
    batches = prune()
    assert all(b.inputs <= 7 and b.snapshots <= 1 for b in batches)
    total = Removed()
    for b in batches:
        total.add(b)
    assert (total.inputs, total.snapshots) == (planned.inputs, planned.snapshots) == (109, 1)
    with engine.connect() as connection:
        kept = list(connection.scalars(select(Input.id).order_by(Input.id)))
        snapshots = list(connection.scalars(select(Snapshot.id).order_by(Snapshot.id)))
    assert kept == list(range(110, 201))  # 1..109 are before the cutoff (day 110) and covered (≤ 170)
    assert snapshots == [2, 3]


def snapshot(engine: Engine, number: int, last_input_id: int) -> None:
    with session_factory(engine)() as session, session.begin():
        session.add(
            Snapshot(
                id=number,
                last_input_id=last_input_id,
                taken_at=0.0,
                format=1,
                checksum="0" * 64,
                size=1,
                jobs=0,
                payload=b"x",
            )
        )


# -- any mix of rows -----------------------------------------------------------------------

LIVE = [s.value for s in JobState if not s.is_final]
FINAL = [s.value for s in JobState if s.is_final]

jobs_strategy = st.lists(
    st.fixed_dictionaries(
        {
            "state": st.sampled_from(LIVE + FINAL + FINAL),
            "ended_days_ago": st.floats(80, 100),
            "attempts": st.lists(st.tuples(st.booleans(), st.sampled_from([None, None, "START", "STOP"])), max_size=3),
            "alerts": st.lists(st.booleans(), max_size=2),
            "requests": st.lists(st.booleans(), max_size=2),
            "preempted": st.booleans(),
        }
    ),
    max_size=25,
)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    jobs=jobs_strategy,
    batch=st.integers(1, 6),
    hours=st.integers(6, 72),
    placements=st.integers(1, 8),
    budget=st.sampled_from([BATCH_BUDGET_SECONDS, 0.0]),
)
def test_no_live_job_undelivered_alert_or_pending_action_is_ever_pruned(
    jobs: list[dict[str, Any]], batch: int, hours: int, placements: int, budget: float
) -> None:
    """Jobs that ended 80 to 100 days ago (the cutoff: 90), pruned in batches of at most
    ``batch`` jobs, compacting at most ``hours`` hours or ``placements`` placements at once;
    with a time budget of 0, every batch halves the next one's limits down to the floor."""
    now = 400 * DAY
    with tempfile.TemporaryDirectory() as folder:
        shutil.copy(migrated_sqlite(), Path(folder) / "quota.db")
        engine = make_engine(f"sqlite:///{Path(folder) / 'quota.db'}")
        protected = fill(engine, jobs, now)
        limits = BatchLimits(jobs=batch, hours=hours, attempts=placements, orphans=batch)
        retention = Retention(90, limits, BatchSize(budget=budget))
        with session_factory(engine)() as session:
            planned = retention.plan(session, now).removed
        total = Removed()
        for done in retention.batches(session_factory(engine), now):
            assert done.removed.jobs <= batch and done.removed.hours_compacted <= hours
            assert done.removed.events <= batch * 10  # a job's few, or the orphans' limit
            total.add(done.removed)
        assert total == planned
        with engine.connect() as connection:
            kept = set(connection.scalars(select(JobRow.id)))
            undelivered = set(connection.scalars(select(AlertRow.id).where(AlertRow.notified_at.is_(None))))
            ended_before = {
                row.id
                for row in connection.execute(select(JobRow.id, JobRow.state, JobRow.updated_at))
                if row.state in FINAL and row.updated_at < now - 90 * DAY
            }
        assert protected["jobs"] <= kept
        assert protected["alerts"] <= undelivered
        pruned = set(range(1, len(jobs) + 1)) - kept
        assert all(jobs[i - 1]["state"] in FINAL and jobs[i - 1]["ended_days_ago"] > 90 for i in pruned)
        # what stays past the cutoff stays for a reason: protected, or not compacted yet (none here)
        assert ended_before <= protected["jobs"]
        engine.dispose()


@functools.cache
def migrated_sqlite() -> Path:
    """A SQLite database at the latest revision, migrated once: each example copies it."""
    path = Path(tempfile.mkdtemp(prefix="airflow-quota-retention-")) / "quota.db"
    engine = make_engine(f"sqlite:///{path}")
    migrate(engine)
    engine.dispose()
    return path


def fill(engine: Engine, jobs: list[dict[str, Any]], now: float) -> dict[str, set[int]]:
    """The rows for ``jobs``; returns the ids of the jobs that must stay (live, with an attempt
    open or an action pending, an alert undelivered or a request not taken in) and of the
    undelivered alerts."""
    protected: dict[str, set[int]] = {"jobs": set(), "alerts": set()}
    alert_id = 0
    with session_factory(engine)() as session, session.begin():
        for number, job in enumerate(jobs, start=1):
            ended = now - job["ended_days_ago"] * DAY
            session.add(
                JobRow(
                    id=number,
                    name=f"job-{number}",
                    share="research",
                    priority=1,
                    backend="fake",
                    request={},
                    training={},
                    submitted_at=ended - 7200,
                    state=job["state"],
                    updated_at=ended,
                    gpu_hours=1.0,
                )
            )
            session.flush()
            must_stay = job["state"] in LIVE
            for attempt, (closed, action) in enumerate(job["attempts"], start=1):
                session.add(
                    Attempt(
                        job_id=number,
                        number=attempt,
                        backend="fake",
                        instance_type=G5,
                        count=1,
                        placed_at=ended - 3600,
                        ended_at=ended if closed else None,
                        action=action,
                    )
                )
                must_stay = must_stay or not closed or action is not None
            for delivered in job["alerts"]:
                alert_id += 1
                session.add(
                    AlertRow(
                        id=alert_id,
                        at=ended - 100,
                        job_id=number,
                        job=f"job-{number}",
                        share="research",
                        kind="STARVING",
                        reason="waited",
                        notified_at=ended if delivered else None,
                    )
                )
                if not delivered:
                    protected["alerts"].add(alert_id)
                    must_stay = True
            for handled in job["requests"]:
                session.add(Request(created_at=ended - 7200, kind="submit", job_id=number, payload={}, handled=handled))
                must_stay = must_stay or not handled
            if job["preempted"]:
                session.add(
                    Preemption(job_id=number, attempt=1, at=ended - 10, kind="CROSS_SHARE", by_job="x", lost_seconds=5)
                )
            session.add(
                EventRow(
                    at=ended,
                    type="PLACED",
                    job=f"job-{number}",
                    job_id=number,
                    share="research",
                    record={},
                    line="placed",
                )
            )
            if must_stay:
                protected["jobs"].add(number)
    return protected


# -- batches sized to a time budget ------------------------------------------------------


def test_a_batch_over_the_budget_halves_the_limits_fast_ones_grow_them_back_to_the_ceiling() -> None:
    limits = BatchLimits()
    size = BatchSize()
    assert size.of(limits) == limits  # the limits are where batches start

    size.held(BATCH_BUDGET_SECONDS * 1.01)
    assert size.of(limits) == BatchLimits(jobs=50, inputs=1000, hours=24, attempts=500, orphans=250, snapshots=3)
    size.held(BATCH_BUDGET_SECONDS * 0.75)  # within the budget, not well under it: unchanged
    assert size.of(limits).jobs == 50

    grown = []
    for _ in range(6):
        size.held(BATCH_BUDGET_SECONDS / 4)
        grown.append(size.of(limits).jobs)
    assert grown == sorted(grown) and grown[0] > 50 and grown[-1] == 100  # slowly, back to the ceiling
    assert grown.count(100) < len(grown)  # not at once

    for _ in range(100):
        size.held(0.0)
    assert size.of(limits) == limits  # never above the limits

    for _ in range(100):
        size.held(10.0)
    assert size.share == SMALLEST_SHARE  # never below the floor
    assert size.of(limits) == BatchLimits(jobs=4, inputs=63, hours=2, attempts=32, orphans=16, snapshots=1)
    assert size.of(BatchLimits(jobs=1, snapshots=1)).jobs == 1  # at least one of each


def test_an_infinite_budget_keeps_the_limits_whatever_a_batch_holds() -> None:
    size = BatchSize(budget=math.inf)
    size.held(3600.0)
    assert size.of(BatchLimits()) == BatchLimits()


def test_the_next_batch_prunes_half_as_many_jobs_after_a_slow_one_and_more_after_fast_ones() -> None:
    """60 finished jobs, at most 8 a batch: the transaction's hold reported for each batch (here
    injected) sizes the jobs the next batch removes."""
    now = 400 * DAY
    finished = {"state": "SUCCEEDED", "attempts": [(True, None)], "alerts": [True], "requests": [True]}
    jobs = [{**finished, "ended_days_ago": 95 + number / 100, "preempted": False} for number in range(60)]
    with tempfile.TemporaryDirectory() as folder:
        shutil.copy(migrated_sqlite(), Path(folder) / "quota.db")
        engine = make_engine(f"sqlite:///{Path(folder) / 'quota.db'}")
        fill(engine, jobs, now)
        retention = Retention(90, BatchLimits(jobs=8))
        sessions = session_factory(engine)

        def one_batch(seconds_it_held: float, kind: str = "jobs") -> int:
            """One batch, of ``kind``, reported as holding ``seconds_it_held``; the jobs it removed."""
            with sessions() as session, session.begin():
                batch = retention.batch(session, now)
            assert batch.kind == kind
            retention.held(batch, seconds_it_held)
            return batch.removed.jobs

        fast, slow = 0.0, BATCH_BUDGET_SECONDS * 2
        one_batch(fast, "compact")  # the jobs' hours first (all within the first 48)
        pruned = [one_batch(slow), one_batch(slow), one_batch(fast)]
        assert pruned == [8, 4, 2]
        while len(pruned) < 20 and pruned[-1] < 8:
            pruned.append(one_batch(fast))
        growing = pruned[2:]
        assert growing == sorted(growing) and growing[-1] == 8 and len(growing) > 3
        pruned.append(one_batch(fast))
        assert pruned[-1] == 8  # the limit is the ceiling
        assert count(engine, JobRow) == 60 - sum(pruned)
        engine.dispose()


# -- the setting ---------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["-1", "ninety", "nan"])
def test_a_bad_retention_on_the_command_line_exits_2_naming_it(
    value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'quota.db'}"
    assert cli.main(["db", "prune", "--dry-run", "--db", url, f"--retention-days={value}"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("--retention-days:") and "Traceback" not in error
    assert cli.main(["scheduler", "--db", url, f"--retention-days={value}"]) == 2
    assert capsys.readouterr().err.startswith("--retention-days:")


def test_a_bad_retention_in_airflow_config_exits_2_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'quota.db'}"
    config = tmp_path / "airflow.cfg"
    config.write_text("[quota]\nretention_days = -3\n")
    monkeypatch.setenv("AIRFLOW_CONFIG", str(config))
    monkeypatch.delenv("AIRFLOW__QUOTA__RETENTION_DAYS", raising=False)
    assert cli.main(["db", "prune", "--dry-run", "--db", url]) == 2
    assert capsys.readouterr().err.startswith("[quota] retention_days: must be a number of days")
    monkeypatch.setenv("AIRFLOW__QUOTA__RETENTION_DAYS", "soon")
    assert cli.main(["db", "prune", "--dry-run", "--db", url]) == 2
    assert capsys.readouterr().err.startswith("AIRFLOW__QUOTA__RETENTION_DAYS: 'soon' is not a number")


def test_the_setting_comes_from_the_environment_then_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'quota.db'}"
    migrate(make_engine(url))
    config = tmp_path / "airflow.cfg"
    config.write_text("[quota]\nretention_days = 30\n")
    monkeypatch.setenv("AIRFLOW_CONFIG", str(config))
    monkeypatch.delenv("AIRFLOW__QUOTA__RETENTION_DAYS", raising=False)
    assert cli.main(["db", "prune", "--dry-run", "--json", "--db", url]) == 0
    assert json.loads(capsys.readouterr().out)["retention_days"] == 30
    monkeypatch.setenv("AIRFLOW__QUOTA__RETENTION_DAYS", "0")
    assert cli.main(["db", "prune", "--dry-run", "--json", "--db", url]) == 0
    assert json.loads(capsys.readouterr().out)["cutoff"] is None
    assert cli.main(["db", "prune", "--dry-run", "--json", "--db", url, "--retention-days", "7"]) == 0
    assert json.loads(capsys.readouterr().out)["retention_days"] == 7
