"""A share's ``access`` rules where requests enter the quota database: ``QuotaStore.submit``
and ``set_priority`` refuse whom the rules leave out and store nothing; the command line asks
as the operating-system user and exits 2 with the rule."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import Engine, func, select

from airflow_quota.core.access import Actor
from airflow_quota.exceptions import PriorityChangeDenied, SubmissionDenied
from airflow_quota.store.engine import make_engine, migrate
from airflow_quota.store.models import JobRow, Request
from airflow_quota.store.repository import QuotaStore
from tests.builders import request
from tests.conftest import cli

G5 = "ml.g5.xlarge"
QUOTA: dict[str, Any] = {
    "pool": {"capacity": {G5: 3}},
    "shares": [
        {
            "name": "team-a",
            "capacity_limits": {G5: 1},
            "access": {
                "submit": {"dags": ["team_a_*"], "tags": ["team-a"], "users": ["alice"]},
                "set_priority": {"users": ["alice", "oncall-*"]},
            },
        },
        {"name": "open", "capacity_limits": {G5: 1}},
    ],
}
TEAM_A_DAG = Actor.of_dag("team_a_train", tags=["nightly"], bundle="dags-folder")
TEAM_B_DAG = Actor.of_dag("team_b_train", tags=["team-b"], bundle="dags-folder")


@pytest.fixture
def db(tmp_path: Path) -> Iterator[tuple[str, Engine, QuotaStore]]:
    url = f"sqlite:///{tmp_path / 'quota.db'}"
    engine = make_engine(url)
    migrate(engine)
    store = QuotaStore(engine)
    store.apply_config(QUOTA)
    yield url, engine, store
    engine.dispose()


def stored(engine: Engine) -> tuple[int, int]:
    """Jobs and inbox requests in the quota database (the configuration is one request)."""
    with engine.connect() as c:
        jobs = c.scalar(select(func.count()).select_from(JobRow)) or 0
        return jobs, c.scalar(select(func.count()).select_from(Request)) or 0


# -- the store ---------------------------------------------------------------------------------


def test_a_submission_from_a_dag_the_rule_leaves_out_is_refused_and_nothing_is_stored(
    db: tuple[str, Engine, QuotaStore],
) -> None:
    _, engine, store = db
    with pytest.raises(SubmissionDenied) as denied:
        store.submit(request("j1", "team-a"), "fake", actor=TEAM_B_DAG, client_token="t1")
    assert str(denied.value) == (
        "access.submit: share 'team-a' takes submissions only from DAGs 'team_a_*', DAGs tagged 'team-a' or "
        "users 'alice'; asked by DAG 'team_b_train' (tags 'team-b'; bundle 'dags-folder'): no pattern matches"
    )
    assert stored(engine) == (0, 1)
    assert store.job_by_token("t1") is None


@pytest.mark.parametrize(
    "actor",
    [TEAM_A_DAG, Actor.of_dag("anything", tags=["team-a"]), Actor.of_dag("team_b_train", user="alice")],
    ids=["by DAG id", "by tag", "a run alice triggered"],
)
def test_a_submission_the_rule_lists_is_stored(db: tuple[str, Engine, QuotaStore], actor: Actor) -> None:
    _, engine, store = db
    row = store.submit(request("j1", "team-a"), "fake", actor=actor)
    assert (row.share, row.state) == ("team-a", "SUBMITTED")
    assert stored(engine) == (1, 2)


def test_a_share_without_rules_takes_anyone_even_nobody_known(db: tuple[str, Engine, QuotaStore]) -> None:
    _, _, store = db
    assert store.submit(request("j1", "open"), "fake").share == "open"
    store.set_priority(store.submit(request("j2", "open"), "fake").id, 7)


def test_a_priority_override_needs_the_set_priority_rule_too(db: tuple[str, Engine, QuotaStore]) -> None:
    """The DAG may submit, but a run's ``quota_priority`` is a priority change: its rule lists
    users only, and a scheduled run has no triggering user."""
    _, engine, store = db
    with pytest.raises(PriorityChangeDenied, match=r"^access.set_priority: share 'team-a' lets only users"):
        store.submit(request("j1", "team-a", priority=9), "fake", actor=TEAM_A_DAG, priority_overridden=True)
    assert stored(engine) == (0, 1)
    by_oncall = Actor.of_dag("team_a_train", user="oncall-kim")
    assert (
        store.submit(request("j1", "team-a", priority=9), "fake", actor=by_oncall, priority_overridden=True).priority
        == 9
    )


def test_a_priority_change_by_someone_the_rule_leaves_out_is_refused(db: tuple[str, Engine, QuotaStore]) -> None:
    _, engine, store = db
    row = store.submit(request("j1", "team-a"), "fake", actor=TEAM_A_DAG)
    with pytest.raises(PriorityChangeDenied) as denied:
        store.set_priority(row.id, 5, TEAM_A_DAG)
    assert str(denied.value) == (
        "access.set_priority: share 'team-a' lets only users 'alice', 'oncall-*' change its jobs' priorities; "
        "asked by DAG 'team_a_train' (tags 'nightly'; bundle 'dags-folder'): no pattern matches"
    )
    assert stored(engine) == (1, 2)
    store.set_priority(row.id, 5, Actor(user="oncall-kim"))
    assert stored(engine) == (1, 3)


# -- the command line ----------------------------------------------------------------------------


def as_user(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """The operating-system user the CLI's subprocess sees (getpass reads LOGNAME first)."""
    monkeypatch.setenv("LOGNAME", name)
    monkeypatch.setenv("USER", name)


def test_the_cli_submits_as_the_operating_system_user(
    db: tuple[str, Engine, QuotaStore], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, engine, _ = db
    path = tmp_path / "job.yaml"
    raw = {"name": "j1", "share": "team-a", "preferences": [{"instance_type": G5, "count": 1}]}
    path.write_text(yaml.safe_dump({**raw, "dag_id": "team_a_train"}))  # a job file's dag_id is no identity
    as_user(monkeypatch, "bob")
    refused = cli("jobs", "submit", str(path), "--db", url)
    assert (refused.code, refused.stdout) == (2, ""), refused
    assert refused.stderr == (
        "access.submit: share 'team-a' takes submissions only from DAGs 'team_a_*', DAGs tagged 'team-a' or "
        "users 'alice'; asked by user 'bob': no pattern matches\n"
    )
    assert stored(engine) == (0, 1)
    as_user(monkeypatch, "alice")
    accepted = cli("jobs", "submit", str(path), "--db", url)
    assert accepted.code == 0 and accepted.stdout.startswith("submitted job 1 (j1) to share team-a"), accepted


def test_a_cli_priority_change_the_rule_leaves_out_exits_2_with_the_rule(
    db: tuple[str, Engine, QuotaStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, engine, store = db
    store.submit(request("j1", "team-a"), "fake", actor=TEAM_A_DAG)
    as_user(monkeypatch, "bob")
    refused = cli("jobs", "set-priority", "j1", "5", "--db", url, "--wait", "0")
    assert (refused.code, refused.stdout) == (2, ""), refused
    assert refused.stderr == (
        "access.set_priority: share 'team-a' lets only users 'alice', 'oncall-*' change its jobs' priorities; "
        "asked by user 'bob': no pattern matches\n"
    )
    assert stored(engine) == (1, 2)
    as_user(monkeypatch, "oncall-kim")
    asked = cli("jobs", "set-priority", "j1", "5", "--db", url, "--wait", "0")
    assert asked.code == 0 and "priority 5 asked" in asked.stdout, asked
    assert stored(engine) == (1, 3)
