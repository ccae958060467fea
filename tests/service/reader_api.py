"""The Quotas page's JSON API over a given store, for a signed-in user allowed to read every DAG:
how the service tests read what the page would show, without an Airflow api-server."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from airflow.api_fastapi.core_api import security as airflow_security
from fastapi.testclient import TestClient

from airflow_quota.plugins import security
from airflow_quota.plugins.app import create_app
from airflow_quota.store.repository import QuotaStore


@dataclass
class User:
    name: str


class EveryoneReads:
    """An auth manager letting every user read and edit every DAG."""

    def is_authorized_dag(self, **_: Any) -> bool:
        return True


def reader_api(store: QuotaStore, monkeypatch: pytest.MonkeyPatch) -> TestClient:
    """A client of the page's API reading ``store``, signed in as a reader of every DAG."""
    manager = EveryoneReads()
    monkeypatch.setattr(airflow_security, "get_auth_manager", lambda: manager)
    monkeypatch.setattr(security, "get_auth_manager", lambda: manager)
    app = create_app(store=lambda: store)
    app.dependency_overrides[airflow_security.get_user] = lambda: User("reader")
    return TestClient(app)
