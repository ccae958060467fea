"""The Quotas API on a quota database in PostgreSQL whose ids all lie above 2^31 (issue 39): the
walkthrough's jobs are read and changed by their 64-bit ids, and test_api.py's tests that probe
the ends of the id range (an absent id is 404 on every route, any id or body is never a 500)
run here too, against a real Airflow 3.3 api-server.

Before migration 0013 these ids made the API answer 500: PostgreSQL's id columns were 32-bit.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest

from tests.plugins.conftest import Served, serve
from tests.plugins.test_api import (
    _quota,
    ids,
    test_any_json_body_path_id_and_query_gets_2xx_or_4xx_never_500,
    test_job_ids_outside_the_databases_range_are_404,
)
from tests.postgres import continue_ids_after, fresh_database, postgres_admin

__all__ = [  # collected here as well, with this module's fixtures: the api-server on PostgreSQL
    "postgres_admin",
    "test_any_json_body_path_id_and_query_gets_2xx_or_4xx_never_500",
    "test_job_ids_outside_the_databases_range_are_404",
]

FIRST_ID = 2**31 + 100
"""The first id of every table: above 2^31, and 2^31 itself names no job."""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, postgres_admin: str) -> Iterator[Served]:
    with fresh_database(postgres_admin) as url:
        yield from serve(
            tmp_path_factory.mktemp("api-postgres"),
            quota=_quota(),
            quota_url=url,
            before_play=partial(continue_ids_after, last=FIRST_ID - 1),
        )


@pytest.fixture(scope="module")
def viewer(served: Served) -> Iterator[Any]:
    with served.client("viewer") as client:
        yield client


@pytest.fixture(scope="module")
def editor(served: Served) -> Iterator[Any]:
    with served.client("editor") as client:
        yield client


def test_jobs_with_ids_above_2_31_are_listed_and_shown(served: Served, viewer: Any) -> None:
    known = ids(served)
    assert min(known.values()) == FIRST_ID, known
    listed = {job["name"]: job["id"] for job in viewer.get("/quota/api/jobs").json()["jobs"]}
    assert listed == known
    med = known["qs1-med"]
    shown = viewer.get(f"/quota/api/jobs/{med}")
    assert shown.status_code == 200, shown.text
    assert (shown.json()["job"]["id"], shown.json()["job"]["name"]) == (med, "qs1-med")
    assert viewer.get(f"/quota/jobs/{med}").status_code == 200
    preempted = {p["job_id"] for p in viewer.get("/quota/api/preemptions").json()["preemptions"]}
    assert preempted and min(preempted) >= FIRST_ID, preempted
    alerted = {a["job_id"] for a in viewer.get("/quota/api/alerts").json()["alerts"]}
    assert alerted and min(alerted) >= FIRST_ID, alerted


def test_an_editor_changes_and_cancels_jobs_with_ids_above_2_31(served: Served, editor: Any) -> None:
    med, qs3 = ids(served)["qs1-med"], ids(served)["qs3-job"]
    raised = editor.put(f"/quota/api/jobs/{med}/priority", json={"priority": 5})
    assert raised.status_code == 202, raised.text
    assert raised.json()["job_id"] == med
    cancelled = editor.post(f"/quota/api/jobs/{qs3}/cancel", json={})
    assert cancelled.status_code == 202, cancelled.text
    served.world.settle()
    assert editor.get(f"/quota/api/jobs/{med}").json()["job"]["priority"] == 5
    job = editor.get(f"/quota/api/jobs/{qs3}").json()["job"]
    assert (job["state"], job["reason"]) == ("FAILED", "CANCELLED")
