"""DAG-level rights, in-process: the app with an auth manager that grants rights per DAG.

Airflow's SimpleAuthManager (the api-server tests) grants by role only, the same for every DAG;
a deployment's auth manager (FAB, Keycloak, ...) grants per DAG. This stand-in shows what the
app does with such rights: it hides jobs of DAGs a user may not read, refuses their pages, and
lets a user change only jobs of DAGs they may edit. Airflow's own ``requires_access_dag`` and
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
from airflow_quota.store.engine import make_engine
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
    assert refused.status_code == 403
    assert refused.json()["detail"] == f"reading quota job {world.ids['secret']} needs read access to DAG '{PRIVATE}'"


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
    refused = bob.post(f"/api/jobs/{outside}/cancel")
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
