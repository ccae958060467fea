"""A real Airflow api-server with the Quotas plugin, and a quota database with the AWS
walkthrough played into it, for the API and browser tests.

Each module that needs one starts it once (``served`` in the module): an api-server costs
20-40 s to start here. The users are SimpleAuthManager's: ``viewer`` may read DAGs, ``editor``
(role ``user``) may also edit them, ``admin`` may do everything.

Airflow is told to keep its home in a temporary directory before anything imports it (the
in-process tests import Airflow's security module).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="airflow-quota-plugin-tests-"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "True")

import httpx

from airflow_quota.devtools.stack import AirflowStack, StackSettings
from tests.conftest import ROOT
from tests.plugins.walkthrough import World, play

USERS = {"admin": "admin", "viewer": "viewer", "editor": "user"}
"""SimpleAuthManager users of the test Airflow, username to role."""

UNTIL = 7850.0
"""Where the walkthrough stops: after qs2-job's end (7800 s), when qs1-high borrows qs2's idle
instance, and before anything else ends (qs3-job at 8100 s). Shares then hold: qs1 two
instances (one borrowed), qs2 none (its instance lent), qs3 one; qs1-med waits; two
preemptions happened; qs1-med and qs1-high raised STARVING alerts (qs1-high's closed)."""


@dataclass
class Served:
    """The running api-server and the quota world behind it."""

    stack: AirflowStack
    world: World

    @property
    def url(self) -> str:
        return self.stack.api_url

    def client(self, user: str | None = None, token: str | None = None, **kwargs: Any) -> httpx.Client:
        """An HTTP client on the api-server, logged in as ``user`` (or with ``token``), or not."""
        if user is not None:
            token = self.stack.token(user)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.stack.api_url, headers=headers, timeout=60, **kwargs)


def serve(root: Path, quota: dict[str, Any] | None = None) -> Iterator[Served]:
    """Start the api-server (with the walkthrough DAG in its DAGs folder) and play the
    walkthrough into its quota database; stop everything afterwards."""
    settings = StackSettings(
        root=root,
        dags=[ROOT / "dags" / "quota_walkthrough.py"],
        users=USERS,
        components=("api-server",),
    )
    with AirflowStack(settings) as stack:
        world = play(stack.quota_url, UNTIL, quota=quota)
        try:
            yield Served(stack, world)
        finally:
            world.service.engine.dispose()
