"""The quota database: migrations, configuration versions, submissions, changes, reading; each on
SQLite and on PostgreSQL. On any error nothing is stored."""

from __future__ import annotations

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Engine, func, inspect, select

from airflow_quota.core.model import JobRequest
from airflow_quota.exceptions import ChangeRefused, InvalidInput, SubmissionRejected
from airflow_quota.service.backends.fake import FakeBackend
from airflow_quota.service.clock import ManualClock
from airflow_quota.service.scheduler import QuotaService
from airflow_quota.store.engine import (
    DatabaseUnavailable,
    _alembic_config,
    current_revision,
    head_revision,
    make_engine,
    migrate,
)
from airflow_quota.store.models import Base, ConfigVersion, Input, JobRow, Request
from airflow_quota.store.repository import QuotaStore
from airflow_quota.store.settings import ENV_URL, database_url
from tests.builders import request

QUOTA = {
    "pool": {"capacity": {"ml.g5.xlarge": 3}},
    "shares": [
        {"name": "qs1", "capacity_limits": {"ml.g5.xlarge": 1}, "strategy": "LEND_AND_BORROW", "max_priority": 50},
        {"name": "qs2", "capacity_limits": {"ml.g5.xlarge": 1}, "strategy": "LEND"},
        {"name": "off", "capacity_limits": {"ml.g5.xlarge": 1}, "state": "DISABLED"},
    ],
}


def rows(engine: Engine, table: type) -> int:
    with engine.connect() as connection:
        return int(connection.scalar(select(func.count()).select_from(table)) or 0)


def test_migrate_creates_then_finds_nothing_to_do(engine: Engine) -> None:
    assert current_revision(engine) == head_revision(engine)
    before, after = migrate(engine)
    assert before == after == head_revision(engine)


def test_the_migrations_build_the_schema_the_models_describe(engine: Engine) -> None:
    """A column added to a model without its migration (or the other way round) shows here."""
    with engine.connect() as connection:
        differences = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    assert differences == []


def job_columns(engine: Engine) -> set[str]:
    return {column["name"] for column in inspect(engine).get_columns("quota_jobs")}


def test_migration_0020_gives_stored_jobs_an_empty_expected_runtime(engine: Engine) -> None:
    """A database an older version left (revision 0019, a job stored) gains the column, empty:
    the job keeps its row and has no expected runtime; taken back down, the column goes."""
    store = QuotaStore(engine)
    store.apply_config(QUOTA)
    kept = store.submit(request("kept", "qs1"), "fake", {"duration": 1}).id
    command.downgrade(_alembic_config(engine), "0019")
    assert "expected_runtime_seconds" not in job_columns(engine)
    assert migrate(engine)[0] == "0019"
    assert "expected_runtime_seconds" in job_columns(engine)
    job = store.job(kept)
    assert job is not None and (job.name, job.expected_runtime_seconds) == ("kept", None)
    with engine.connect() as connection:
        assert compare_metadata(MigrationContext.configure(connection), Base.metadata) == []


def thresholds(store: QuotaStore) -> list[tuple[str, float | None, float | None, bool, float | None]]:
    """Each share's starvation threshold as readers see it: seconds, normal wait, fixed, multiple."""
    view = store.shown_view()[0]
    return [
        (s.share, s.starvation_threshold_seconds, s.normal_wait_seconds, s.starvation_fixed, s.starvation_multiple)
        for s in view.shares
    ]


def test_migration_0021_leaves_a_stored_view_without_thresholds_until_a_leader_starts(engine: Engine) -> None:
    """A view a quota scheduler wrote at revision 0020 gains the threshold's columns empty: no
    threshold, not fixed, until a leader starts and writes every row afresh; taken back down, the
    columns go."""
    clock = ManualClock(1000.0)
    store = QuotaStore(engine, clock.now)
    fixed_qs2 = [
        {**share, "starvation_after_seconds": 3600} if share["name"] == "qs2" else share for share in QUOTA["shares"]
    ]
    store.apply_config({**QUOTA, "shares": fixed_qs2})
    QuotaService(engine, {"fake": FakeBackend(clock.now)}, clock=clock).step()
    written = [
        ("qs1", 172800.0, None, False, 8.0),
        ("qs2", 3600.0, None, True, None),
        ("off", 172800.0, None, False, 8.0),
    ]
    assert thresholds(store) == written
    command.downgrade(_alembic_config(engine), "0020")
    assert "starvation_threshold_seconds" not in share_view_columns(engine)
    assert migrate(engine)[0] == "0020"
    assert thresholds(store) == [(name, None, None, False, None) for name in ("qs1", "qs2", "off")]
    with engine.connect() as connection:
        assert compare_metadata(MigrationContext.configure(connection), Base.metadata) == []
    QuotaService(engine, {"fake": FakeBackend(clock.now)}, clock=clock).recover()  # a leader starts
    assert thresholds(store) == written


def share_view_columns(engine: Engine) -> set[str]:
    return {column["name"] for column in inspect(engine).get_columns("quota_share_views")}


def test_a_submission_keeps_the_authors_expected_runtime_beside_its_request(engine: Engine) -> None:
    """Stored for the forecast, and no part of the request the scheduler decides on."""
    store = QuotaStore(engine)
    store.apply_config(QUOTA)
    timed = store.submit(request("timed", "qs1"), "fake", {"duration": 1}, expected_runtime_seconds=5400.0)
    store.submit(request("untimed", "qs1"), "fake", {"duration": 1})
    assert timed.expected_runtime_seconds == 5400.0
    stored = {job.name: job for job in store.jobs()}
    assert stored["timed"].expected_runtime_seconds == 5400.0
    assert stored["untimed"].expected_runtime_seconds is None
    assert stored["timed"].request == stored["untimed"].request | {"name": "timed"}


def test_an_invalid_configuration_stores_nothing(engine: Engine) -> None:
    store = QuotaStore(engine)
    broken = {**QUOTA, "shares": [{**QUOTA["shares"][0], "capacity_limits": {"ml.g5.xlarge": 9}}]}
    with pytest.raises(InvalidInput) as problems:
        store.apply_config(broken)
    assert any("limits sum to 9" in str(p) for p in problems.value.problems)
    assert rows(engine, ConfigVersion) == 0 and rows(engine, Request) == 0


def test_a_share_with_live_jobs_cannot_be_removed(engine: Engine) -> None:
    store = QuotaStore(engine)
    store.apply_config(QUOTA)
    store.submit(request("train", "qs2"), "fake", {"duration": 1})
    without_qs2 = {**QUOTA, "shares": [s for s in QUOTA["shares"] if s["name"] != "qs2"]}
    with pytest.raises(InvalidInput, match="share 'qs2' has live jobs"):
        store.apply_config(without_qs2)
    assert rows(engine, ConfigVersion) == 1


def test_configurations_are_versioned(engine: Engine) -> None:
    store = QuotaStore(engine)
    first = store.apply_config(QUOTA)
    second = store.apply_config({**QUOTA, "pool": {"capacity": {"ml.g5.xlarge": 4}}})
    assert second == first + 1
    latest = store.latest_config()
    assert latest is not None and latest[0] == second and latest[1].pool.capacity["ml.g5.xlarge"] == 4


@pytest.mark.parametrize(
    ("request_", "rule"),
    [
        (request("big", "qs1", ("ml.g5.xlarge", 4)), "more than the pool's capacity"),
        (request("mine", "qs2", ("ml.g5.xlarge", 2)), "can hold at most 1x"),
        (request("off", "off"), "DISABLED"),
        (request("nobody", "nobody"), "no share named"),
        (request("vip", "qs1", priority=60), "max_priority"),
    ],
    ids=["count over capacity", "LEND share over its limit", "disabled share", "unknown share", "priority too high"],
)
def test_a_submission_the_quota_refuses_stores_nothing(engine: Engine, request_: JobRequest, rule: str) -> None:
    store = QuotaStore(engine)
    store.apply_config(QUOTA)
    with pytest.raises(SubmissionRejected, match=rule):
        store.submit(request_, "fake", {"duration": 1})
    assert rows(engine, JobRow) == 0 and rows(engine, Request) == 1  # only the configuration


def test_no_submission_before_a_configuration(engine: Engine) -> None:
    with pytest.raises(SubmissionRejected, match="no quota configuration"):
        QuotaStore(engine).submit(request("early", "qs1"), "fake")


def test_a_live_name_is_taken_once_and_a_token_finds_its_job(engine: Engine) -> None:
    store = QuotaStore(engine)
    store.apply_config(QUOTA)
    first = store.submit(request("train", "qs1"), "fake", {"duration": 1}, client_token="dag.task.run.1")
    again = store.submit(request("train", "qs1"), "fake", {"duration": 1}, client_token="dag.task.run.1")
    assert again.id == first.id
    with pytest.raises(SubmissionRejected, match="already named 'train'"):
        store.submit(request("train", "qs1"), "fake", {"duration": 1})
    assert rows(engine, JobRow) == 1


def test_priority_changes_are_checked_against_the_share(engine: Engine) -> None:
    store = QuotaStore(engine)
    store.apply_config(QUOTA)
    submitted = store.submit(request("train", "qs1"), "fake", {"duration": 1})
    with pytest.raises(ChangeRefused, match="max_priority 50"):
        store.set_priority(submitted.id, 51)
    store.set_priority(submitted.id, 50)
    with pytest.raises(ChangeRefused, match="no job with id"):
        store.cancel(999)


def test_the_scheduler_takes_the_inbox_in_and_a_restart_replays_it(engine: Engine) -> None:
    clock = ManualClock(1000.0)
    store = QuotaStore(engine, clock.now)
    fake = FakeBackend(clock.now)
    store.apply_config(QUOTA)
    a = store.submit(request("a", "qs1"), "fake", {"duration": 100})
    b = store.submit(request("b", "qs1"), "fake", {"duration": 100})
    c = store.submit(request("c", "qs1"), "fake", {"duration": 100})
    service = QuotaService(engine, {"fake": fake}, clock=clock)
    service.step()
    states = {j.name: j.state for j in store.jobs()}
    assert states == {"a": "SCHEDULED", "b": "SCHEDULED", "c": "RUNNABLE"}
    waiting = store.job(c.id)
    assert waiting is not None and waiting.pending_reason == "WAITING_FOR_QUOTA" and waiting.position_in_share == 1
    assert fake.starts == [f"{a.id}-1", f"{b.id}-1"]
    assert store.pending_requests() == 0
    # a second scheduler replays the log into the same state and starts nothing again
    again = QuotaService(engine, {"fake": fake}, clock=clock)
    again.recover()
    assert again.scheduler is not None and service.scheduler is not None
    assert {j.name: j.state for j in again.scheduler.state.jobs.values()} == {
        j.name: j.state for j in service.scheduler.state.jobs.values()
    }
    assert fake.starts == [f"{a.id}-1", f"{b.id}-1"]
    assert rows(engine, Input) >= 5
    clock.advance_to(1100.0)
    again.step()
    assert {j.name: j.state for j in store.jobs()} == {"a": "SUCCEEDED", "b": "SUCCEEDED", "c": "SCHEDULED"}


def test_an_unreachable_database_is_one_clear_line() -> None:
    store = QuotaStore(make_engine("postgresql+psycopg://postgres@127.0.0.1:1/nowhere"))
    with pytest.raises(DatabaseUnavailable) as failure:
        store.jobs()
    message = str(failure.value)
    assert "127.0.0.1:1/nowhere is unreachable" in message and "\n" not in message


def test_the_database_url_setting(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    monkeypatch.delenv(ENV_URL, raising=False)
    monkeypatch.delenv("AIRFLOW_CONN_QUOTA_DEFAULT", raising=False)
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    assert database_url() == f"sqlite:///{tmp_path}/quota.db"
    monkeypatch.setenv("AIRFLOW_CONN_QUOTA_DEFAULT", "postgresql://u@db:5432/quota")
    assert database_url() == "postgresql+psycopg://u@db:5432/quota"
    (tmp_path / "airflow.cfg").write_text("[quota]\nsql_alchemy_conn = sqlite:////srv/q.db\n")  # type: ignore[operator]
    assert database_url() == "sqlite:////srv/q.db"
    monkeypatch.setenv(ENV_URL, "postgres://x@y/z")
    assert database_url() == "postgresql+psycopg://x@y/z"
    assert database_url("sqlite:///explicit.db") == "sqlite:///explicit.db"


class RefusingBackend(FakeBackend):
    """A backend whose start is refused (a bad training request, an API error)."""

    def start(self, attempt: object) -> None:
        from airflow_quota.service.backends.base import BackendError

        raise BackendError("CreateTrainingJob refused: bad request")


def test_a_refused_start_is_a_failed_attempt_even_across_a_restart(engine: Engine) -> None:
    clock = ManualClock(0.0)
    store = QuotaStore(engine, clock.now)
    store.apply_config(QUOTA)
    refused = store.submit(
        JobRequest(
            name="bad", share="qs1", retry_attempts=2, preferences=[{"instance_type": "ml.g5.xlarge", "count": 1}]
        ),
        "fake",
        {"duration": 5},
    )
    backend = RefusingBackend(clock.now)
    QuotaService(engine, {"fake": backend}, clock=clock).step()  # placed; its start is refused
    # the scheduler dies here; the next one learns of the refusal from the attempt it finds
    clock.advance_to(1.0)
    again = QuotaService(engine, {"fake": backend}, clock=clock)
    again.recover()
    again.step()
    attempts = store.attempts(refused.id)
    assert attempts[0].status == "FAILED" and "CreateTrainingJob refused" in (attempts[0].reason or "")
    lines = [e.line for e in store.events(job_id=refused.id)]
    assert any("REQUEUED bad" in line and "BackendError" in line for line in lines), lines
