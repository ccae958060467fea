"""``airflow-quota shares`` (and the Quotas page's API) between ``apply`` and the first quota
scheduler to take the configuration in: the configuration just stored shows, its limits with
nothing used, borrowed, lent or waiting, with one line (``config_taken_in`` false in JSON) saying
that no quota scheduler has run since it was stored; after one scheduler step the line is gone.

The commands run as a user runs them (``tests/conftest.py``, ``cli``), on a fresh SQLite and a
fresh PostgreSQL database; the scheduler is a ``QuotaService`` with the fake backend stepped
once on a manual clock.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import Engine

os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="airflow-quota-first-cycle-"))  # before Airflow loads


from airflow_quota.core.model import JobRequest
from airflow_quota.service.backends.fake import FakeBackend
from airflow_quota.service.clock import ManualClock
from airflow_quota.service.scheduler import QuotaService
from airflow_quota.store.engine import make_engine
from airflow_quota.store.repository import QuotaStore
from airflow_quota.store.settings import normalize
from tests.conftest import Run, cli
from tests.service.reader_api import reader_api

G5, P3 = "ml.g5.xlarge", "ml.p3.2xlarge"
QUOTA: dict[str, Any] = {
    "pool": {"capacity": {G5: 3, P3: 1}},
    "shares": [
        {"name": "research", "capacity_limits": {G5: 2, P3: 1}, "strategy": "LEND_AND_BORROW"},
        {"name": "prod", "capacity_limits": {G5: 1}, "strategy": "LEND"},
    ],
}
LIMITS = {"research": {G5: 2, P3: 1}, "prod": {G5: 1}}
NOT_YET = "no quota scheduler has run since configuration version 1 was stored"


@dataclass
class Database:
    url: str
    quota_file: Path

    def run(self, *args: str) -> Run:
        done = cli(*args, "--db", self.url)
        assert done.code == 0, done.stderr
        assert "Traceback" not in done.stderr
        return done

    def shares(self) -> dict[str, Any]:
        answer: dict[str, Any] = self.run("shares", "--json").json()
        return answer


@pytest.fixture
def database(db_url: str, tmp_path: Path) -> Database:
    """A fresh database, created by ``airflow-quota db migrate``, and a configuration file."""
    quota_file = tmp_path / "quota.yaml"
    quota_file.write_text(yaml.safe_dump(QUOTA))
    created = Database(db_url, quota_file)
    created.run("db", "migrate")
    return created


@pytest.fixture
def engine(database: Database) -> Iterator[Engine]:
    engine = make_engine(normalize(database.url))
    yield engine
    engine.dispose()


@dataclass
class Scheduler:
    """A quota scheduler stepped by hand: it leads from its first step (nobody else does)."""

    clock: ManualClock
    service: QuotaService

    def step(self, at: float) -> None:
        self.clock.advance_to(at)
        self.service.step()


@pytest.fixture
def scheduler(engine: Engine) -> Scheduler:
    clock = ManualClock(1000.0)
    return Scheduler(clock, QuotaService(engine, {"fake": FakeBackend(clock.now)}, clock=clock))


def limits(answer: dict[str, Any]) -> dict[str, dict[str, int]]:
    return {s["share"]: {name: t["limit"] for name, t in s["types"].items()} for s in answer["shares"]}


def usage(answer: dict[str, Any]) -> set[tuple[int, int, float, int]]:
    """Every type's (used, borrowed, lent, RUNNABLE), and each share's running and RUNNABLE."""
    figures = {
        (t["used"], t["borrowed"], t["lent"], t["runnable"]) for s in answer["shares"] for t in s["types"].values()
    }
    return figures | {(s["running"], 0, 0.0, s["runnable"]) for s in answer["shares"]}


def test_shares_show_the_stored_configuration_until_a_scheduler_takes_it_in(
    database: Database, scheduler: Scheduler
) -> None:
    before = database.run("shares")
    assert "no quota configuration is applied yet (airflow-quota apply quota.yaml)" in before.stdout
    assert database.shares() | {"now": None} == {
        "now": None,
        "computed_at": None,
        "config_version": None,
        "config_taken_in": False,
        "shares": [],
    }

    database.run("apply", str(database.quota_file))
    text = database.run("shares").stdout
    usage_table, starvation_table = text.split("\n\n")
    rows = [line.split() for line in usage_table.splitlines()[2:]]
    assert [row[:7] for row in rows] == [
        ["research", "LEND_AND_BORROW", G5, "2", "0", "0", "0.0"],
        ["research", "LEND_AND_BORROW", P3, "1", "0", "0", "0.0"],
        ["prod", "LEND", G5, "1", "0", "0", "0.0"],
    ]
    assert [line.split(maxsplit=1) for line in starvation_table.splitlines()[2:] if not line.startswith("no ")] == [
        [name, "after 2 days (normal wait not known yet)"] for name in ("research", "prod")
    ]
    notes = [line for line in text.splitlines() if line.startswith("no ")]
    assert notes == [f"{NOT_YET}: its limits, nothing used, borrowed or lent yet (start one: airflow-quota scheduler)"]
    answer = database.shares()
    assert (answer["config_version"], answer["config_taken_in"], answer["computed_at"]) == (1, False, None)
    assert limits(answer) == LIMITS
    assert usage(answer) == {(0, 0, 0.0, 0)}
    assert [s["strategy"] for s in answer["shares"]] == ["LEND_AND_BORROW", "LEND"]

    scheduler.step(1000.0)
    after = database.run("shares").stdout
    assert NOT_YET not in after and not [line for line in after.splitlines() if line.startswith("no ")]
    answer = database.shares()
    assert (answer["config_version"], answer["config_taken_in"], answer["computed_at"]) == (1, True, 1000.0)
    assert limits(answer) == LIMITS


def test_a_new_version_not_taken_in_yet_leaves_the_figures_of_the_one_before(
    database: Database, engine: Engine, scheduler: Scheduler, tmp_path: Path
) -> None:
    """Jobs run under the version in force: its figures stay shown, with a line saying the
    latest version waits for a scheduler, until one takes it in."""
    database.run("apply", str(database.quota_file))
    scheduler.step(1000.0)
    store = QuotaStore(engine)
    request = JobRequest(name="r1", share="research", priority=1, preferences=[{"instance_type": G5, "count": 1}])
    store.submit(request, "fake", {"duration": 10_000})
    scheduler.step(1001.0)
    changed = {**QUOTA, "shares": [{**QUOTA["shares"][0], "capacity_limits": {G5: 1, P3: 1}}, QUOTA["shares"][1]]}
    second = tmp_path / "second.yaml"
    second.write_text(yaml.safe_dump(changed))
    database.run("apply", str(second))

    note = f"{NOT_YET.replace('version 1', 'version 2')}: these figures are of the version before it"
    assert note in database.run("shares").stdout.splitlines()
    answer = database.shares()
    assert (answer["config_version"], answer["config_taken_in"]) == (2, False)
    assert limits(answer) == LIMITS
    assert answer["shares"][0]["types"][G5]["used"] == 1  # r1 still runs

    scheduler.step(1002.0)
    answer = database.shares()
    assert (answer["config_version"], answer["config_taken_in"]) == (2, True)
    assert limits(answer)["research"] == {G5: 1, P3: 1}
    assert "no quota scheduler" not in database.run("shares").stdout


def test_the_quotas_page_api_shows_the_stored_configuration_too(
    database: Database, engine: Engine, scheduler: Scheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``GET /api/shares`` reads the same view (``dashboard.share_summaries``): the page shows
    the shares' cards, not "no configuration", between ``apply`` and the first cycle."""
    store = QuotaStore(engine)
    api = reader_api(store, monkeypatch)

    database.run("apply", str(database.quota_file))
    answer = api.get("/api/shares").json()
    assert (answer["config_version"], answer["config_taken_in"], answer["computed_at"]) == (1, False, None)
    shown = {
        s["name"]: {t["instance_type"]: (t["limit"], t["used"], t["borrowed"], t["lent"]) for t in s["types"]}
        for s in answer["shares"]
    }
    assert shown == {name: {t: (limit, 0, 0, 0.0) for t, limit in types.items()} for name, types in LIMITS.items()}
    assert all(s["gpu_hours"] == s["cost"] == s["running"] == 0 for s in answer["shares"])

    scheduler.step(1000.0)
    answer = api.get("/api/shares").json()
    assert (answer["config_taken_in"], answer["computed_at"]) == (True, 1000.0)
