"""DAG-level rights, in-process: the app with an auth manager that grants rights per DAG.

Airflow's SimpleAuthManager (the api-server tests) grants by role only, the same for every DAG;
a deployment's auth manager (FAB, Keycloak, ...) grants per DAG. This stand-in shows what the
app does with such rights: it hides jobs of DAGs a user may not read, answers their ids as ids
of no job, and lets a user change only jobs of DAGs they may edit. Airflow's own ``requires_access_dag`` and
``get_user`` run as in the api-server; only the user and the auth manager are stand-ins.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from airflow.api_fastapi.core_api import security as airflow_security
from fastapi.testclient import TestClient

from airflow_quota.core.model import JobRequest
from airflow_quota.plugins import security
from airflow_quota.plugins.app import create_app
from airflow_quota.store.engine import make_engine, migrate
from airflow_quota.store.repository import QuotaStore
from tests.plugins.walkthrough import DAG_ID, World, play

PRIVATE = "private_dag"
RIGHTS: dict[str, set[tuple[str, str | None]]] = {
    "alice": {("GET", DAG_ID), ("GET", None)},
    "bob": {("GET", DAG_ID), ("GET", PRIVATE), ("GET", None), ("PUT", DAG_ID)},
    "carol": set(),
}
"""(method, DAG id) each user may use; ``None`` stands for DAGs in general."""


@dataclass
class User:
    name: str


class RightsPerDag:
    """An auth manager deciding by DAG id."""

    def is_authorized_dag(self, *, method: str, details: Any = None, user: User, **_: Any) -> bool:
        return (method, details.id if details else None) in RIGHTS[user.name]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    world = play(f"sqlite:///{tmp_path_factory.mktemp('rights') / 'quota.db'}", 7850)
    request = JobRequest(
        name="secret", share="qs3", priority=1, preferences=[{"instance_type": "ml.g5.xlarge", "count": 1}]
    )
    world.ids["secret"] = world.store.submit(request, "fake", {}, dag_id=PRIVATE, task_id="t", run_id="r").id
    outside = request.model_copy(update={"name": "outside"})
    world.ids["outside"] = world.store.submit(outside, "fake", {}).id
    world.settle()
    yield world
    world.service.engine.dispose()


@pytest.fixture
def as_user(world: World, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    manager = RightsPerDag()
    monkeypatch.setattr(airflow_security, "get_auth_manager", lambda: manager)
    monkeypatch.setattr(security, "get_auth_manager", lambda: manager)

    def client(name: str) -> TestClient:
        app = create_app(store=lambda: world.store)
        app.dependency_overrides[airflow_security.get_user] = lambda: User(name)
        return TestClient(app, root_path="/quota")

    yield client


def test_jobs_of_dags_a_user_may_not_read_are_hidden(world: World, as_user: Any) -> None:
    alice, bob = as_user("alice"), as_user("bob")
    seen_by_alice = {j["name"] for j in alice.get("/api/jobs").json()["jobs"]}
    assert "secret" not in seen_by_alice and "outside" in seen_by_alice and "qs1-med" in seen_by_alice
    assert "secret" in {j["name"] for j in bob.get("/api/jobs").json()["jobs"]}
    refused = alice.get(f"/api/jobs/{world.ids['secret']}")
    assert refused.status_code == 404
    assert refused.json()["detail"] == f"no quota job {world.ids['secret']}"  # neither its DAG nor that it exists
    assert alice.get(f"/jobs/{world.ids['secret']}").status_code == 200  # the page: its script then meets the 404


def answer(client: TestClient, method: str, path: str) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body of a request, byte for byte (the date header left out)."""
    body = {"priority": 3} if method == "PUT" else {}
    got = client.request(method, path, json=None if method == "GET" else body)
    return got.status_code, {k: v for k, v in got.headers.items() if k != "date"}, got.content


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/api/jobs/{id}"), ("PUT", "/api/jobs/{id}/priority"), ("POST", "/api/jobs/{id}/cancel")],
)
def test_a_job_the_user_may_not_read_is_answered_byte_for_byte_as_one_that_does_not_exist(
    world: World, as_user: Any, tmp_path: Path, method: str, path: str
) -> None:
    """Alice may not read ``secret``'s DAG: reading it, changing its priority and cancelling it
    get what the same id gets from a quota database where no job has it, so she learns neither
    the DAG nor that the id exists; nothing is asked of the quota scheduler."""
    secret = world.ids["secret"]
    engine = make_engine(f"sqlite:///{tmp_path / 'empty.db'}")
    try:
        migrate(engine)
        empty = QuotaStore(engine)
        latest = world.store.latest_config()
        assert latest is not None
        empty.apply_config(latest[1].model_dump(mode="json", exclude_defaults=True))
        assert empty.job(secret) is None and empty.jobs() == []
        app = create_app(store=lambda: empty)
        app.dependency_overrides[airflow_security.get_user] = lambda: User("alice")
        absent = answer(TestClient(app, root_path="/quota"), method, path.format(id=secret))
    finally:
        engine.dispose()
    hidden = answer(as_user("alice"), method, path.format(id=secret))
    assert hidden == absent
    assert hidden[0] == 404 and PRIVATE.encode() not in hidden[2], hidden
    assert world.store.pending_requests() == 0


def test_a_user_who_may_read_no_dag_may_read_nothing(as_user: Any) -> None:
    carol = as_user("carol")
    for path in ("/", "/api/shares", "/api/jobs", "/api/alerts", "/openapi.json", "/static/quotas.js"):
        assert carol.get(path).status_code == 403, path


def test_only_jobs_of_dags_a_user_may_edit_can_be_changed(world: World, as_user: Any) -> None:
    alice, bob = as_user("alice"), as_user("bob")
    med, outside = world.ids["qs1-med"], world.ids["outside"]
    assert {j["can_edit"] for j in alice.get("/api/jobs").json()["jobs"]} == {False}
    assert alice.put(f"/api/jobs/{med}/priority", json={"priority": 3}).status_code == 403

    editable = {j["name"]: j["can_edit"] for j in bob.get("/api/jobs").json()["jobs"]}
    assert (editable["qs1-med"], editable["secret"], editable["outside"]) == (True, False, False)
    secret = world.ids["secret"]
    seen_not_editable = bob.put(f"/api/jobs/{secret}/priority", json={"priority": 3})
    assert seen_not_editable.status_code == 403  # bob sees the job: the refusal may say what he misses
    assert (
        seen_not_editable.json()["detail"]
        == f"changing quota job {secret} (secret) needs edit access to DAG '{PRIVATE}'"
    )
    refused = bob.post(f"/api/jobs/{outside}/cancel", json={})
    assert refused.status_code == 403
    assert refused.json()["detail"] == (
        f"changing quota job {outside} (outside) needs edit access to DAGs (the job was submitted outside Airflow)"
    )
    assert bob.put(f"/api/jobs/{med}/priority", json={"priority": 3}).status_code == 202


def test_an_unreachable_quota_database_is_one_clear_503(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    manager = RightsPerDag()
    monkeypatch.setattr(airflow_security, "get_auth_manager", lambda: manager)
    gone = QuotaStore(make_engine("postgresql+psycopg://nobody@127.0.0.1:9/quota", connect_args={"connect_timeout": 2}))
    app = create_app(store=lambda: gone)
    app.dependency_overrides[airflow_security.get_user] = lambda: User("alice")
    answer = TestClient(app).get("/api/shares")
    assert answer.status_code == 503
    assert answer.json()["detail"].startswith(
        "quota database postgresql+psycopg://nobody@127.0.0.1:9/quota is unreachable"
    )


@pytest.fixture(scope="module")
def names_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """The walkthrough at 7850 s, then two jobs of ``PRIVATE`` (which alice may not read):
    ``hidden-reclaimer`` in qs2 takes back the instance qs1-high borrows (preempting it), and
    ``hidden-top`` (priority 9) preempts qs1-low inside qs1; then qs1-med, raised to 10,
    preempts ``hidden-top``. Alice may read qs1-high, qs1-low and qs1-med, whose preemptors or
    victims she may not."""
    world = play(f"sqlite:///{tmp_path_factory.mktemp('names') / 'quota.db'}", 7850)
    walkthrough = world.fake.remaining
    assert walkthrough is not None
    world.fake.remaining = lambda spec: 3600.0 if spec.job_name.startswith("hidden-") else walkthrough(spec)
    one = [{"instance_type": "ml.g5.xlarge", "count": 1}]
    for name, share, priority in (("hidden-reclaimer", "qs2", 1), ("hidden-top", "qs1", 9)):
        request = JobRequest(name=name, share=share, priority=priority, preferences=one)
        world.ids[name] = world.store.submit(request, "fake", {}, dag_id=PRIVATE, task_id="t", run_id="r").id
        world.settle()
    world.store.set_priority(world.ids["qs1-med"], 10)
    world.settle()
    yield world
    world.service.engine.dispose()


@pytest.fixture
def names_as_user(names_world: World, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    manager = RightsPerDag()
    monkeypatch.setattr(airflow_security, "get_auth_manager", lambda: manager)
    monkeypatch.setattr(security, "get_auth_manager", lambda: manager)

    def client(name: str) -> TestClient:
        app = create_app(store=lambda: names_world.store)
        app.dependency_overrides[airflow_security.get_user] = lambda: User(name)
        return TestClient(app, root_path="/quota")

    yield client


def test_preemptors_in_dags_a_user_may_not_read_are_another_job(names_world: World, names_as_user: Any) -> None:
    alice, bob = names_as_user("alice"), names_as_user("bob")
    high, low = names_world.ids["qs1-high"], names_world.ids["qs1-low"]
    seen = alice.get(f"/api/jobs/{high}").json()
    assert [(p["kind"], p["preemptor"], p["preemptor_id"]) for p in seen["preemptions"]] == [
        ("CROSS_SHARE", "another job", None),
        ("IN_SHARE", "qs1-low", low),
    ]
    assert not any("hidden-" in line for line in seen["story"])
    assert any("CROSS_SHARE by another job" in line for line in seen["story"]), seen["story"]
    low_story = alice.get(f"/api/jobs/{low}").json()["story"]
    assert any("IN_SHARE by another job" in line and "another job (qs1, priority 9)" in line for line in low_story), (
        low_story
    )
    assert not any("hidden-" in line for line in low_story)

    history = alice.get("/api/preemptions").json()["preemptions"]
    assert {p["preemptor"] for p in history} == {"another job", "qs1-low", "qs2-job"}
    assert "hidden-top" not in {p["job"] for p in history}  # its own preemption: not shown at all

    full = bob.get(f"/api/jobs/{high}").json()
    reclaimer = names_world.ids["hidden-reclaimer"]
    assert full["preemptions"][0]["preemptor"] == "hidden-reclaimer"
    assert full["preemptions"][0]["preemptor_id"] == reclaimer
    assert any("CROSS_SHARE by hidden-reclaimer" in line for line in full["story"])


def test_victims_in_dags_a_user_may_not_read_are_another_job_in_the_story(
    names_world: World, names_as_user: Any
) -> None:
    med = names_world.ids["qs1-med"]
    seen = names_as_user("alice").get(f"/api/jobs/{med}").json()
    assert seen["caused"] == []
    placed = [line for line in seen["story"] if "PLACED qs1-med" in line]
    assert any("after preempting another job" in line for line in placed), seen["story"]
    assert not any("hidden-" in line for line in seen["story"])
    full = names_as_user("bob").get(f"/api/jobs/{med}").json()
    assert [p["job"] for p in full["caused"]] == ["hidden-top"]
    assert any("after preempting hidden-top" in line for line in full["story"])
