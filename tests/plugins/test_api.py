"""The Quotas JSON API against a real Airflow 3.3 api-server with the plugin loaded, on a quota
database holding the AWS walkthrough at 7850 s (see ``conftest.UNTIL``): every route, what it
answers, and who may call it.

The reading tests come first; the tests that change jobs run last, in file order.
"""

from __future__ import annotations

import json
import math
import threading
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from airflow_quota.core.config import read_yaml
from airflow_quota.core.human_time import clock_time, duration_words
from airflow_quota.store.models import Request
from tests.plugins.conftest import UNTIL, Served, raw_request, serve
from tests.plugins.walkthrough import DAG_ID, MAPPED, QUOTA, starving_in_an_hour

MAX_PRIORITY = 10
"""qs1's max_priority in these tests (the walkthrough's priorities are 1-4)."""


def _quota() -> dict[str, Any]:
    """examples/quota.yaml with a max_priority on qs1, to show its refusal (and the 1-hour
    starvation threshold of ``starving_in_an_hour``)."""
    raw: dict[str, Any] = starving_in_an_hour(read_yaml(QUOTA))
    raw["shares"][0]["max_priority"] = MAX_PRIORITY
    return raw


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    yield from serve(tmp_path_factory.mktemp("api"), quota=_quota())


@pytest.fixture(scope="module")
def viewer(served: Served) -> Iterator[Any]:
    with served.client("viewer") as client:
        yield client


@pytest.fixture(scope="module")
def editor(served: Served) -> Iterator[Any]:
    with served.client("editor") as client:
        yield client


def ids(served: Served) -> dict[str, int]:
    return served.world.ids


ROUTES = [
    ("GET", "/quota/"),
    ("GET", "/quota/jobs/1"),
    ("GET", "/quota/static/quotas.js"),
    ("GET", "/quota/openapi.json"),
    ("GET", "/quota/api/shares"),
    ("GET", "/quota/api/jobs"),
    ("GET", "/quota/api/jobs/1"),
    ("GET", "/quota/api/preemptions"),
    ("GET", "/quota/api/alerts"),
    ("GET", "/quota/api/shares/qs1/utilisation"),
    ("GET", "/quota/api/shares/qs1/utilisation.svg"),
    ("PUT", "/quota/api/jobs/1/priority"),
    ("POST", "/quota/api/jobs/1/cancel"),
]


# -- authentication -----------------------------------------------------------------------------


@pytest.mark.parametrize(("method", "path"), ROUTES, ids=[f"{m} {p}" for m, p in ROUTES])
def test_every_route_refuses_a_request_without_a_login(served: Served, method: str, path: str) -> None:
    with served.client() as anonymous:
        answer = anonymous.request(method, path, json={"priority": 1} if method == "PUT" else None)
    assert answer.status_code == 401, answer.text
    assert answer.json() == {"detail": "Not authenticated"}


@pytest.mark.parametrize("path", ["/quota/", "/quota/jobs/1"])
def test_a_browser_without_a_login_is_sent_to_airflows_login_page_and_back(served: Served, path: str) -> None:
    with served.client(follow_redirects=False) as browser:
        answer = browser.get(path, headers={"Accept": "text/html,application/xhtml+xml"})
    assert answer.status_code == 303, answer.text
    login = urllib.parse.urlsplit(answer.headers["location"])
    assert login.path.endswith("/auth/login"), login
    assert urllib.parse.parse_qs(login.query)["next"] == [f"{served.stack.api_url}{path}"]


@pytest.mark.parametrize(("method", "path"), ROUTES[:3], ids=[f"{m} {p}" for m, p in ROUTES[:3]])
def test_a_forged_token_is_refused(served: Served, method: str, path: str) -> None:
    with served.client(token="not-a-jwt") as forged:
        assert forged.request(method, path).status_code == 403


def test_the_ui_session_cookie_authenticates_like_the_page_in_its_iframe(served: Served) -> None:
    """The Airflow UI keeps its JWT in the ``_token`` cookie; the same-origin iframe sends it."""
    token = served.stack.token("viewer")
    with served.client(cookies={"_token": token}) as browser:
        page = browser.get("/quota/")
        shares = browser.get("/quota/api/shares")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert 'data-root="/quota"' in page.text
    assert shares.status_code == 200


def test_the_page_assets_are_served_from_the_wheel_and_nothing_else(viewer: Any) -> None:
    page = viewer.get("/quota/").text
    for asset in ("common.js", "quotas.js", "quotas.css", "quotas-icon.svg"):
        answer = viewer.get(f"/quota/static/{asset}")
        assert answer.status_code == 200, asset
        assert len(answer.content) > 100
    assert "http://" not in page and "https://" not in page  # nothing fetched from the network
    assert viewer.get("/quota/static/..%2Fapi.py").status_code == 404
    assert viewer.get("/quota/static/missing.js").status_code == 404


# -- reading ------------------------------------------------------------------------------------


def for_people(item: dict[str, Any], now: float) -> dict[str, str | None]:
    """Check each ``*_text`` field of an answer's item against ``core.human_time`` for the
    figure beside it: ``X_text`` is ``duration_words(X_seconds)`` or ``clock_time(X, now)``, and
    an alert's ``age_text`` is ``duration_words(now - at)``; None beside None. Returns the texts."""
    texts = {key: value for key, value in item.items() if key.endswith("_text")}
    for key, text in texts.items():
        base = key.removesuffix("_text")
        if key == "age_text":
            expected = duration_words(now - item["at"])
        elif f"{base}_seconds" in item:
            seconds = item[f"{base}_seconds"]
            expected = None if seconds is None else duration_words(seconds)
        else:
            assert base in item, f"{key}: no figure beside it"
            expected = None if item[base] is None else clock_time(item[base], now)
        assert text == expected, (key, item)
    return texts


def test_shares_report_use_borrowing_lending_and_the_queue(viewer: Any) -> None:
    answer = viewer.get("/quota/api/shares").json()
    scheduler = answer["scheduler"]
    assert scheduler["running"] is True and scheduler["leader"] == "walkthrough-scheduler", scheduler
    assert scheduler["heartbeat_seconds"] == 1.0 and 0 <= scheduler["silent_seconds"] <= 3.0, scheduler
    assert answer["config_version"] == 1
    assert for_people(scheduler, answer["now"]).keys() == {"silent_text"}
    for share in answer["shares"]:
        assert for_people(share, answer["now"]).keys() == {
            "oldest_pending_text",
            "in_share_preemption_after_text",
            "starvation_threshold_text",
            "normal_wait_text",
        }
        for usage in share["types"]:
            assert for_people(usage, answer["now"]).keys() == {"oldest_pending_text"}
            usage.pop("oldest_pending_text")
    shares = {s["name"]: s for s in answer["shares"]}
    assert list(shares) == ["qs1", "qs2", "qs3"]
    g5 = {name: share["types"][0] for name, share in shares.items()}
    oldest = g5["qs1"].pop("oldest_pending_seconds")
    assert oldest >= UNTIL - 600  # qs1-med has waited since its preemption at 600 s
    for name in ("qs2", "qs3"):
        assert g5[name].pop("oldest_pending_seconds") == 0
    common = {"instance_type": "ml.g5.xlarge", "gpus_per_instance": 1, "capacity": 3, "limit": 1}
    assert g5 == {
        "qs1": {**common, "used": 2, "borrowed": 1, "lent": 0.0, "idle": 0, "runnable": 1},
        "qs2": {**common, "used": 0, "borrowed": 0, "lent": 1.0, "idle": 1, "runnable": 0},
        "qs3": {**common, "used": 1, "borrowed": 0, "lent": 0.0, "idle": 0, "runnable": 0},
    }
    assert (shares["qs1"]["running"], shares["qs1"]["runnable"], shares["qs1"]["preemptions"]) == (2, 1, 2)
    assert shares["qs1"]["max_priority"] == MAX_PRIORITY
    assert shares["qs1"]["strategy"] == "LEND_AND_BORROW" and shares["qs1"]["borrow_limit"] == 200
    assert shares["qs1"]["in_share_preemption_after_seconds"] == 0  # examples/quota.yaml
    assert shares["qs2"]["in_share_preemption_after_seconds"] is None
    starvation = ("starvation_threshold_seconds", "starvation_fixed", "normal_wait_seconds", "starvation_multiple")
    # the walkthrough's shares starve after a fixed hour (walkthrough.starving_in_an_hour)
    assert {name: tuple(share[k] for k in starvation) for name, share in shares.items()} == {
        name: (3600.0, True, None, None) for name in ("qs1", "qs2", "qs3")
    }
    assert shares["qs2"]["cost"] > 0 and shares["qs2"]["running"] == 0
    assert shares["qs3"]["cost"] > 0  # qs3-job still runs: its attempt so far


def test_jobs_filter_by_state_share_and_dag_and_show_where_waiting_jobs_stand(served: Served, viewer: Any) -> None:
    answer = viewer.get("/quota/api/jobs", params={"state": "RUNNABLE"}).json()
    waiting = answer["jobs"]
    assert [
        (j["name"], j["pending_reason"], j["waiting_for"], j["position_in_share"], j["position_in_queue"])
        for j in waiting
    ] == [("qs1-med", "WAITING_FOR_QUOTA", "1x ml.g5.xlarge", 1, 1)]
    assert waiting[0]["waiting_since"] is not None
    texts = for_people(waiting[0], answer["now"])
    assert texts.keys() == {"wait_text", "waited_text", "waiting_since_text", "pending_text", "submitted_at_text"}
    assert texts["pending_text"].startswith("2 hours")  # waiting since its preemption at 600 s
    # waited in all: before its first placement (none: placed at once) and its current wait
    assert waiting[0]["waited_seconds"] == pytest.approx(waiting[0]["wait_seconds"] + waiting[0]["pending_seconds"])
    assert str(texts["waited_text"]).startswith("2 hours")
    qs1 = viewer.get("/quota/api/jobs", params={"share": "qs1"}).json()["jobs"]
    assert [j["name"] for j in qs1] == ["qs1-med", "qs1-low", "qs1-high"]  # queue first, then newest first
    running = {j["name"]: (j["state"], j["instance_type"], j["count"], j["borrowed"]) for j in qs1[1:]}
    assert running == {"qs1-low": ("RUNNING", "ml.g5.xlarge", 1, 0), "qs1-high": ("RUNNING", "ml.g5.xlarge", 1, 1)}
    assert qs1[0]["borrowed"] == 0 and qs1[0]["borrowed_when_placed"] == 1  # qs1-med holds nothing now

    live = viewer.get("/quota/api/jobs", params=[("state", "RUNNING"), ("state", "RUNNABLE")]).json()["jobs"]
    assert {j["name"] for j in live} == {"qs1-med", "qs1-low", "qs1-high", "qs3-job"}
    assert len(viewer.get("/quota/api/jobs", params={"dag_id": DAG_ID}).json()["jobs"]) == 5
    assert viewer.get("/quota/api/jobs", params={"dag_id": "another_dag"}).json()["jobs"] == []
    assert viewer.get("/quota/api/jobs", params={"state": "WAITING"}).status_code == 422
    everyone = viewer.get("/quota/api/jobs").json()
    for each in everyone["jobs"]:
        for_people(each, everyone["now"])
    assert {each["pending_text"] is None for each in everyone["jobs"] if each["state"] != "RUNNABLE"} == {True}

    job = waiting[0]
    assert job["dag_id"] == DAG_ID and job["task_id"] == "qs1_med"
    assert job["page_url"] == f"/quota/jobs/{job['id']}"
    assert job["task_url"] == f"/dags/{DAG_ID}/runs/manual__walkthrough/tasks/qs1_med"
    mapped = next(j for j in live if j["name"] == "qs3-job")
    assert mapped["map_index"] == MAPPED["qs3-job"] and job["map_index"] is None
    assert mapped["task_url"] == f"/dags/{DAG_ID}/runs/manual__walkthrough/tasks/qs3_job/mapped/{MAPPED['qs3-job']}"
    assert job["preferences"] == [{"instance_type": "ml.g5.xlarge", "count": 1, "training_plan": None}]


def test_whether_a_user_may_change_a_job_is_in_each_job(viewer: Any, editor: Any) -> None:
    def editable(client: Any) -> dict[str, bool]:
        return {j["name"]: j["can_edit"] for j in client.get("/quota/api/jobs").json()["jobs"]}

    assert set(editable(viewer).values()) == {False}
    assert editable(editor) == {
        "qs1-high": True,
        "qs1-med": True,
        "qs1-low": True,
        "qs2-job": False,  # SUCCEEDED: nothing left to change
        "qs3-job": True,
    }


def test_one_job_has_its_attempts_preemptions_cost_and_story(served: Served, viewer: Any) -> None:
    high = ids(served)["qs1-high"]
    answer = viewer.get(f"/quota/api/jobs/{high}").json()
    job = answer["job"]
    assert (job["name"], job["state"], job["attempts"], job["preemptions"], job["borrowed"]) == (
        "qs1-high",
        "RUNNING",
        2,
        1,
        1,
    )
    assert job["cost"] > 0 and job["gpu_hours"] > 0
    for item in [job, *answer["attempts"], *answer["preemptions"], *answer["alerts"]]:
        assert for_people(item, answer["now"]), item  # every time in it has its text
    assert [a["ended_at_text"] is None for a in answer["attempts"]] == [False, True]
    attempts = [(a["number"], a["status"], a["instance_type"], a["count"], a["borrowed"]) for a in answer["attempts"]]
    assert attempts == [(1, "STOPPED", "ml.g5.xlarge", 1, 0), (2, "RUNNING", "ml.g5.xlarge", 1, 1)]
    # why an attempt ended, for people, the backend's reason beside it (the fake says "stopped")
    assert [(a["why_ended"], a["reason"]) for a in answer["attempts"]] == [
        ("stopped: preempted", "stopped"),
        (None, None),
    ]
    assert answer["now_text"] == clock_time(answer["now"], answer["now"])
    assert answer["attempts"][1]["placed_at"] - served.world.origin == pytest.approx(7800)
    assert [(p["kind"], p["preemptor"], p["lost_seconds"], p["attempt"]) for p in answer["preemptions"]] == [
        ("IN_SHARE", "qs1-low", 0.0, 1)
    ]
    assert answer["preemptions"][0]["preemptor_id"] == ids(served)["qs1-low"]
    assert answer["caused"] == []
    assert [(a["kind"], a["open"]) for a in answer["alerts"]] == [("STARVING", False)]
    assert any("PREEMPTED qs1-high [qs1] IN_SHARE by qs1-low" in line for line in answer["story"])
    assert any("PLACED qs1-high [qs1] on 1x ml.g5.xlarge, attempt 2" in line for line in answer["story"])

    low = viewer.get(f"/quota/api/jobs/{ids(served)['qs1-low']}").json()
    assert [(p["job"], p["kind"]) for p in low["caused"]] == [("qs1-high", "IN_SHARE")]
    assert viewer.get("/quota/api/jobs/999").status_code == 404


def test_preemption_history_newest_first_and_by_share(viewer: Any) -> None:
    answer = viewer.get("/quota/api/preemptions").json()
    history = answer["preemptions"]
    assert [for_people(p, answer["now"])["lost_text"] for p in history] == ["0 seconds", "0 seconds"]
    assert [
        (p["job"], p["share"], p["kind"], p["preemptor"], p["preemptor_share"], p["lost_seconds"]) for p in history
    ] == [
        ("qs1-high", "qs1", "IN_SHARE", "qs1-low", "qs1", 0.0),
        ("qs1-med", "qs1", "CROSS_SHARE", "qs2-job", "qs2", 0.0),
    ]
    assert history[0]["at"] - history[1]["at"] == pytest.approx(600)
    by_qs2 = viewer.get("/quota/api/preemptions", params={"share": "qs2"}).json()["preemptions"]
    assert [p["kind"] for p in by_qs2] == ["CROSS_SHARE"]
    assert len(viewer.get("/quota/api/preemptions", params={"limit": 1}).json()["preemptions"]) == 1


def test_alerts_and_which_are_still_open(viewer: Any) -> None:
    answer = viewer.get("/quota/api/alerts").json()
    alerts = answer["alerts"]
    for alert in alerts:
        assert for_people(alert, answer["now"]).keys() == {"at_text", "age_text"}
    assert [(a["kind"], a["job"], a["open"], a["job_state"]) for a in alerts] == [
        ("STARVING", "qs1-high", False, "RUNNING"),  # placed again at 7800 s: closed
        ("STARVING", "qs1-med", True, "RUNNABLE"),
    ]
    assert alerts[1]["reason"] == (
        "RUNNABLE for 3600 s, past its threshold of 3600 s (starvation_after_seconds); "
        "overtaken by 1 later placement, latest qs1-low (qs1)"
    )
    assert alerts[1]["position"] == 2
    opened = viewer.get("/quota/api/alerts", params={"open": "true"}).json()["alerts"]
    assert [a["job"] for a in opened] == ["qs1-med"]
    assert viewer.get("/quota/api/alerts", params={"share": "qs2"}).json()["alerts"] == []


def test_utilisation_history_is_exact_and_charted(served: Served, viewer: Any) -> None:
    """The simulator's measures of the walkthrough at 7850 s (``airflow-quota simulate --until``)
    plus what the held instances add until the answer's ``end``."""
    answer = viewer.get("/quota/api/shares/qs1/utilisation").json()
    start = served.world.origin
    assert answer["start"] == pytest.approx(start)
    extra = (answer["end"] - (start + UNTIL)) / 3600  # the api-server reads "now" from the wall clock
    steps = [(round(p["at"] - start), p["used_gpus"], p["borrowed_gpus"], p["limit_gpus"]) for p in answer["points"]]
    assert steps == [(0, 2, 1, 1), (600, 1, 0, 1), (7800, 2, 1, 1)]
    assert answer["gpu_hours"] == pytest.approx((600 * 2 + 7200 * 1 + 50 * 2) / 3600 + 2 * extra, abs=1e-4)
    assert answer["borrowed_gpu_hours"] == pytest.approx((600 + 50) / 3600 + extra, abs=1e-4)
    assert answer["utilisation"] == pytest.approx(answer["gpu_hours"] / answer["limit_gpu_hours"])

    chart = viewer.get("/quota/api/shares/qs1/utilisation.svg")
    assert chart.status_code == 200
    assert chart.headers["content-type"].startswith("image/svg+xml")
    assert "<svg" in chart.text and "qs1 (times in UTC)" in chart.text
    assert viewer.get("/quota/api/shares/nope/utilisation").status_code == 404
    assert viewer.get("/quota/api/shares/qs1/utilisation", params={"hours": 0}).status_code == 422


def test_the_openapi_schema_documents_every_route(viewer: Any) -> None:
    schema = viewer.get("/quota/openapi.json").json()
    assert schema["servers"] == [{"url": "/quota"}]
    assert set(schema["paths"]) == {
        "/api/shares",
        "/api/jobs",
        "/api/jobs/{job_id}",
        "/api/jobs/{job_id}/priority",
        "/api/jobs/{job_id}/cancel",
        "/api/preemptions",
        "/api/alerts",
        "/api/shares/{share}/utilisation",
        "/api/shares/{share}/utilisation.svg",
    }
    change = schema["paths"]["/api/jobs/{job_id}/priority"]["put"]
    body = change["requestBody"]["content"]["application/json"]["schema"]
    assert "max_priority" in body["properties"]["priority"]["description"]
    assert {"403", "404", "409", "413", "422"} <= set(change["responses"])


def test_the_plugin_is_listed_with_its_navigation_entry(served: Served) -> None:
    plugins = served.stack.api("GET", "/api/v2/plugins")["plugins"]
    quota = next(p for p in plugins if p["name"] == "airflow_quota")
    assert quota["fastapi_apps"][0]["url_prefix"] == "/quota"
    view = quota["external_views"][0]
    assert (view["name"], view["href"], view["url_route"]) == ("Quotas", "/quota/", "quotas")
    assert (view["destination"], view["nav_top_level"]) == ("nav", True)


# -- hardening: cross-site requests, permission before the body, bounded inputs ----------------

EVIL = "https://evil.example"
MAX_ID = 2**63 - 1


def still_running(served: Served, name: str) -> None:
    """The job is as the walkthrough left it, and nobody asked the quota scheduler anything."""
    job = served.world.store.job(ids(served)[name])
    assert job is not None and job.state == "RUNNING", job
    assert served.world.store.pending_requests() == 0


def test_a_cross_site_form_post_to_cancel_is_refused_and_the_job_runs_on(served: Served) -> None:
    """What an auto-submitting form on another site sends with an editor's login cookie."""
    job = ids(served)["qs3-job"]
    with served.client(cookies={"_token": served.stack.token("editor")}) as browser:
        form = browser.post(
            f"/quota/api/jobs/{job}/cancel",
            content=b"",
            headers={"Content-Type": "application/x-www-form-urlencoded", "Origin": EVIL},
        )
        assert form.status_code == 403, form.text
        assert "Content-Type: application/json" in form.json()["detail"]
        plain = browser.post(
            f"/quota/api/jobs/{job}/cancel", content=b"{}", headers={"Content-Type": "text/plain", "Origin": EVIL}
        )
        assert plain.status_code == 403
        foreign = browser.post(f"/quota/api/jobs/{job}/cancel", json={}, headers={"Origin": EVIL})
        assert foreign.status_code == 403
        assert foreign.json()["detail"] == f"refused as a cross-site request: Origin '{EVIL}' is not this api-server's"
        fetched = browser.post(f"/quota/api/jobs/{job}/cancel", json={}, headers={"Sec-Fetch-Site": "cross-site"})
        assert fetched.status_code == 403
        sandboxed = browser.put(f"/quota/api/jobs/{job}/priority", json={"priority": 1}, headers={"Origin": "null"})
        assert sandboxed.status_code == 403
    still_running(served, "qs3-job")


def test_a_same_origin_json_request_passes_the_cross_site_check(served: Served) -> None:
    """The page's own requests: Origin is the api-server's (here a finished job, so 409)."""
    done = ids(served)["qs2-job"]
    with served.client(cookies={"_token": served.stack.token("editor")}) as browser:
        headers = {"Origin": served.url, "Sec-Fetch-Site": "same-origin"}
        answer = browser.post(f"/quota/api/jobs/{done}/cancel", content=b"{}", headers=headers | JSON)
    assert answer.status_code == 409, answer.text


JSON = {"Content-Type": "application/json"}


def test_without_a_login_a_huge_body_is_refused_before_it_is_sent(served: Served) -> None:
    """The headers announce 50 MB and no byte of the body follows: the 401 comes anyway."""
    for method, path in (("PUT", "/quota/api/jobs/1/priority"), ("POST", "/quota/api/jobs/1/cancel")):
        answer = raw_request(served.url, method, path, JSON, content_length=50 * 2**20, timeout=10)
        assert answer.status == 401, answer.head
        assert answer.seconds < 2


def test_a_viewer_is_refused_before_the_body_is_read(served: Served) -> None:
    """403 for a user who may not edit, with 8 MB announced and none of it sent."""
    token = served.stack.token("viewer")
    path = f"/quota/api/jobs/{ids(served)['qs1-med']}/priority"
    answer = raw_request(served.url, "PUT", path, JSON | {"Authorization": f"Bearer {token}"}, content_length=8 << 20)
    assert answer.status == 403, answer.head


def attack_body(size: int) -> bytes:
    """A valid JSON object of about ``size`` bytes with a priority and many extra keys (the
    issue's 8.8 MB body had 500,000)."""
    keys = size // 16
    return ("{" + '"priority": 1, ' + ", ".join(f'"k{i:09d}": 0' for i in range(keys)) + "}").encode()


def test_huge_bodies_do_not_stall_the_api_server(served: Served) -> None:
    """A viewer's, an editor's and an anonymous 8 MB body to the priority route, sent in full
    at the same time, while Airflow's ``/api/v2/version`` is asked again and again: the answers
    come within 200 ms, and the uploads are refused (403, 413, 401). A stall would hold every
    probe sent while the uploads last; one probe alone may meet the machine's other work (a
    process descheduled on a loaded 2-core host took 366 ms once), so one is allowed up to 1 s."""
    body = attack_body(8 << 20)
    path = f"/quota/api/jobs/{ids(served)['qs1-med']}/priority"
    senders = {
        "viewer": {"Authorization": f"Bearer {served.stack.token('viewer')}"},
        "editor": {"Authorization": f"Bearer {served.stack.token('editor')}"},
        "anonymous": {},
    }
    answers: dict[str, Any] = {}

    def upload(who: str, headers: dict[str, str]) -> None:
        answers[who] = raw_request(served.url, "PUT", path, JSON | headers, body=body)

    with httpx.Client(base_url=served.url, timeout=10) as probe:
        assert probe.get("/api/v2/version").status_code == 200  # connected and warm
        uploads = [threading.Thread(target=upload, args=item) for item in senders.items()]
        for thread in uploads:
            thread.start()
        latencies = []
        while any(thread.is_alive() for thread in uploads) or len(latencies) < 10:
            started = time.monotonic()
            assert probe.get("/api/v2/version").status_code == 200
            latencies.append(time.monotonic() - started)
        for thread in uploads:
            thread.join()
    slow = [latency for latency in latencies if latency >= 0.2]
    assert len(slow) <= 1 and max(latencies) < 1.0, (len(latencies), sorted(latencies)[-5:])
    assert {who: a.status for who, a in answers.items()} == {"viewer": 403, "editor": 413, "anonymous": 401}
    assert all(a.body_sent < len(body) for a in answers.values())  # answered before the body was all sent
    assert served.world.store.pending_requests() == 0


def test_bodies_over_4096_bytes_are_413_even_without_a_length(served: Served, editor: Any) -> None:
    path = f"/quota/api/jobs/{ids(served)['qs1-med']}/priority"
    padded = b'{"priority": 3' + b" " * 4096 + b"}"
    assert editor.put(path, content=padded, headers=JSON).status_code == 413
    chunked = editor.put(path, content=iter([padded[:100], padded[100:]]), headers=JSON)  # no Content-Length
    assert chunked.status_code == 413
    assert chunked.json() == {"detail": "the body is larger than 4096 bytes"}
    assert served.world.store.pending_requests() == 0


@pytest.mark.parametrize("job_id", [MAX_ID + 1, 10**30, 0, -1, MAX_ID, 2**31 - 1, 2**31])
def test_job_ids_outside_the_databases_range_are_404(served: Served, editor: Any, job_id: int) -> None:
    """Ids no job has, at and beyond the ends of the 64-bit and 32-bit ranges: 404 everywhere,
    never a 500 (test_api_postgres.py runs this on PostgreSQL too)."""
    assert editor.get(f"/quota/api/jobs/{job_id}").status_code == 404
    if not 1 <= job_id <= MAX_ID:  # the page itself does not look the job up
        assert editor.get(f"/quota/jobs/{job_id}").status_code == 404
    assert editor.put(f"/quota/api/jobs/{job_id}/priority", json={"priority": 1}).status_code == 404
    assert editor.post(f"/quota/api/jobs/{job_id}/cancel", json={}).status_code == 404


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_a_priority_that_is_not_a_finite_number_is_422_naming_the_field(
    served: Served, editor: Any, number: str
) -> None:
    path = f"/quota/api/jobs/{ids(served)['qs1-med']}/priority"
    refused = editor.put(path, content=f'{{"priority": {number}}}'.encode(), headers=JSON)
    assert refused.status_code == 422, refused.text
    assert refused.json()["detail"][0]["loc"] == ["body", "priority"]
    assert refused.json()["detail"][0]["msg"] == "priority: must be a finite number, not NaN or Infinity"
    assert served.world.store.pending_requests() == 0


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        (b"", "missing"),
        (b"{not json", "json_invalid"),
        (b"[" * 3000, "json_invalid"),
        (b'{"priority": 1, "x": 2}', "extra_forbidden"),
    ],
    ids=["empty", "not JSON", "deeply nested", "extra field"],
)
def test_bodies_that_are_not_a_priority_are_422(served: Served, editor: Any, body: bytes, kind: str) -> None:
    refused = editor.put(f"/quota/api/jobs/{ids(served)['qs1-med']}/priority", content=body, headers=JSON)
    assert refused.status_code == 422, refused.text
    assert refused.json()["detail"][0]["type"] == kind


def listening_addresses(port: int) -> set[str]:
    """The local addresses of the TCP sockets listening on ``port`` (Linux's /proc/net)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as rows:
            next(rows)
            for row in rows:
                local, state = row.split()[1], row.split()[3]
                address, hex_port = local.split(":")
                if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                    found.add(address)
    return found


def test_the_api_server_listens_on_this_machine_only(served: Served) -> None:
    assert listening_addresses(served.stack.api_port) == {"0100007F"}  # 127.0.0.1, little-endian hex


# -- changing (these run last: they change the world) ---------------------------------------------


def test_a_viewer_may_read_but_not_change_a_job(served: Served, viewer: Any) -> None:
    med = ids(served)["qs1-med"]
    refused = viewer.put(f"/quota/api/jobs/{med}/priority", json={"priority": 5})
    assert refused.status_code == 403
    assert refused.json()["detail"] == f"changing quota job {med} (qs1-med) needs edit access to DAG '{DAG_ID}'"
    assert viewer.post(f"/quota/api/jobs/{med}/cancel", json={}).status_code == 403
    assert served.world.store.pending_requests() == 0


def test_a_priority_above_the_share_max_priority_is_refused_naming_field_and_rule(served: Served, editor: Any) -> None:
    med = ids(served)["qs1-med"]
    refused = editor.put(f"/quota/api/jobs/{med}/priority", json={"priority": MAX_PRIORITY + 1})
    assert refused.status_code == 422
    assert refused.json() == {
        "detail": [
            {
                "loc": ["body", "priority"],
                "msg": f"priority: {MAX_PRIORITY + 1} is above share 'qs1''s max_priority {MAX_PRIORITY}",
                "type": "quota_rule",
            }
        ]
    }
    assert served.world.store.pending_requests() == 0


@pytest.mark.parametrize("priority", [-1, 10_000, "high", 2.5], ids=["negative", "above 9999", "text", "fraction"])
def test_a_priority_that_is_not_an_integer_0_to_9999_is_refused(served: Served, editor: Any, priority: Any) -> None:
    refused = editor.put(f"/quota/api/jobs/{ids(served)['qs1-med']}/priority", json={"priority": priority})
    assert refused.status_code == 422
    assert refused.json()["detail"][0]["loc"] == ["body", "priority"]


def test_changes_to_unknown_or_finished_jobs_are_refused(served: Served, editor: Any) -> None:
    assert editor.put("/quota/api/jobs/999/priority", json={"priority": 1}).status_code == 404
    assert editor.post("/quota/api/jobs/999/cancel", json={}).status_code == 404
    done = ids(served)["qs2-job"]
    finished = editor.put(f"/quota/api/jobs/{done}/priority", json={"priority": 1})
    assert finished.status_code == 409
    assert finished.json()["detail"] == f"quota job {done} (qs2-job) is already SUCCEEDED"
    assert editor.post(f"/quota/api/jobs/{done}/cancel", json={}).status_code == 409


def test_a_priority_change_the_share_access_rule_leaves_out_is_403_naming_the_rule(served: Served, editor: Any) -> None:
    """The editor may edit the DAG, but qs1's ``access.set_priority`` lists only admin."""
    store = served.world.store
    latest = store.latest_config()
    assert latest is not None
    document = latest[1].model_dump(mode="json", exclude_defaults=True)
    shares = [
        {**share, "access": {"set_priority": {"users": ["admin", "oncall-*"]}}} if share["name"] == "qs1" else share
        for share in document["shares"]
    ]
    med = ids(served)["qs1-med"]
    store.apply_config({**document, "shares": shares})
    try:
        refused = editor.put(f"/quota/api/jobs/{med}/priority", json={"priority": 5})
        assert refused.status_code == 403
        assert refused.json()["detail"] == (
            "access.set_priority: share 'qs1' lets only users 'admin', 'oncall-*' change its jobs' priorities; "
            "asked by user 'editor': no pattern matches"
        )
        shown = editor.get(f"/quota/api/jobs/{med}").json()["job"]
        assert (shown["can_edit"], shown["can_set_priority"]) == (True, False)  # the page offers no priority field
        with served.world.store.sessions() as session:
            kinds = session.scalars(select(Request.kind).where(Request.handled.is_(False))).all()
        assert kinds == ["config"]  # no set_priority request
    finally:
        store.apply_config(document)
        served.world.settle()
    assert store.pending_requests() == 0
    again = editor.get(f"/quota/api/jobs/{med}").json()["job"]
    assert (again["can_edit"], again["can_set_priority"]) == (True, True)


def test_an_editor_changes_a_priority_and_the_quota_scheduler_applies_it(served: Served, editor: Any) -> None:
    """qs1-med raised from 2 to 5 preempts qs1-high (priority 3) inside qs1 and takes its place."""
    med, high = ids(served)["qs1-med"], ids(served)["qs1-high"]
    asked = editor.put(f"/quota/api/jobs/{med}/priority", json={"priority": 5})
    assert asked.status_code == 202
    assert asked.json() == {
        "job_id": med,
        "name": "qs1-med",
        "change": "priority",
        "priority": 5,
        "status": "requested",
        "message": "priority 2 -> 5 asked; it applies at the quota scheduler's next cycle",
    }
    served.world.settle()
    job = editor.get(f"/quota/api/jobs/{med}").json()["job"]
    assert (job["priority"], job["state"], job["borrowed"]) == (5, "RUNNING", 1)
    assert editor.get(f"/quota/api/jobs/{high}").json()["job"]["state"] == "RUNNABLE"
    newest = editor.get("/quota/api/preemptions", params={"limit": 1}).json()["preemptions"][0]
    assert (newest["job"], newest["kind"], newest["preemptor"]) == ("qs1-high", "IN_SHARE", "qs1-med")


def test_an_editor_cancels_a_job(served: Served, editor: Any) -> None:
    job_id = ids(served)["qs3-job"]
    asked = editor.post(f"/quota/api/jobs/{job_id}/cancel", json={})
    assert asked.status_code == 202
    assert asked.json()["change"] == "cancel"
    served.world.settle()
    job = editor.get(f"/quota/api/jobs/{job_id}").json()["job"]
    assert (job["state"], job["reason"], job["can_edit"]) == ("FAILED", "CANCELLED", False)
    assert editor.post(f"/quota/api/jobs/{job_id}/cancel", json={}).status_code == 409


def test_a_job_borrows_no_more_once_the_jobs_placed_before_it_have_left(served: Served, editor: Any) -> None:
    """Issue 38: after the priority change above, qs1-low (placed first, within qs1's limit of
    1) and qs1-med (placed above it: borrowing 1) run. qs1-low cancelled, qs1-high takes its
    place: qs1-med's instance is now within the limit and qs1-high's is the one above it
    (docs/model.md rule 4.3.3, placements in order), though qs1-med was placed borrowing 1."""
    low, med, high = (ids(served)[name] for name in ("qs1-low", "qs1-med", "qs1-high"))
    assert editor.post(f"/quota/api/jobs/{low}/cancel", json={}).status_code == 202
    served.world.settle()
    qs1 = {j["name"]: j for j in editor.get("/quota/api/jobs", params={"share": "qs1"}).json()["jobs"]}
    now = {name: (j["state"], j["borrowed"], j["borrowed_when_placed"]) for name, j in qs1.items()}
    assert now == {"qs1-low": ("FAILED", 0, 0), "qs1-med": ("RUNNING", 0, 1), "qs1-high": ("RUNNING", 1, 1)}
    bar = editor.get("/quota/api/shares").json()["shares"][0]["types"][0]
    assert (bar["limit"], bar["used"], bar["borrowed"]) == (1, 2, 1)  # the badges add up to the bar
    assert editor.get(f"/quota/api/jobs/{med}").json()["job"]["borrowed"] == 0
    assert editor.get(f"/quota/api/jobs/{high}").json()["job"]["borrowed"] == 1
    attempts = editor.get(f"/quota/api/jobs/{low}").json()["attempts"]
    assert attempts[-1]["why_ended"].endswith(": cancelled"), attempts


# -- any input: only 2xx and 4xx (this runs last; it changes nothing) -----------------------------

ROUTE_TEMPLATES = [
    ("GET", "/quota/api/shares"),
    ("GET", "/quota/api/jobs"),
    ("GET", "/quota/api/jobs/{id}"),
    ("GET", "/quota/api/preemptions"),
    ("GET", "/quota/api/alerts"),
    ("GET", "/quota/api/shares/{share}/utilisation"),
    ("GET", "/quota/api/shares/{share}/utilisation.svg"),
    ("PUT", "/quota/api/jobs/{id}/priority"),
    ("POST", "/quota/api/jobs/{id}/cancel"),
    ("GET", "/quota/jobs/{id}"),
    ("PUT", "/quota/api/jobs/{id}/priority"),  # the changes twice: they are where bodies are read
    ("POST", "/quota/api/jobs/{id}/cancel"),
]
QUERY_NAMES = ["share", "state", "dag_id", "limit", "hours", "open"]
BOUNDARY_IDS = [0, -1, 2**63 - 1, 2**63, -(2**63) - 1, 10**30]
"""Ids at and beyond the ends of the database's integer range (no job has them)."""

NOT_FINITE = [math.nan, math.inf, -math.inf]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
bodies = st.one_of(
    json_values.map(json.dumps),  # NaN and Infinity included: json.dumps writes them
    st.fixed_dictionaries({"priority": st.one_of(st.floats(), st.sampled_from(NOT_FINITE), json_values)}).map(
        json.dumps
    ),
    st.binary(max_size=64).map(lambda raw: raw.decode("latin-1")),
)
no_digits = st.text(st.characters(blacklist_categories=("Nd", "Cs")), max_size=12)
query_values = st.one_of(
    st.integers().map(str), st.floats().map(str), no_digits, st.sampled_from(["RUNNING", "qs1", "true"])
)


def path_ids_but(live: set[int], done: int) -> st.SearchStrategy[str]:
    """Path ids other than ``live`` ones: the finished job ``done`` (twice as likely: a change
    to it reads the body), ids at the ends of the integer range, any integer, text."""
    return st.one_of(
        st.just(str(done)),
        st.just(str(done)),
        st.sampled_from(BOUNDARY_IDS).map(str),
        st.integers().filter(lambda n: n not in live).map(str),
        no_digits.filter(lambda text: text.strip() != ""),
    )


def test_any_json_body_path_id_and_query_gets_2xx_or_4xx_never_500(served: Served, viewer: Any, editor: Any) -> None:
    """Random JSON (and not-JSON) bodies, path ids and query values on every route, as a
    viewer and as an editor. Ids of live jobs are left out, so nothing is changed: a valid
    change meets a finished job (409) or none (404)."""
    live = {job.id for job in served.world.store.jobs() if job.state not in ("SUCCEEDED", "FAILED")}
    done = ids(served)["qs2-job"]
    path_ids = path_ids_but(live, done)
    clients = {"viewer": viewer, "editor": editor}

    @settings(
        max_examples=100, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture]
    )
    @given(
        route=st.sampled_from(ROUTE_TEMPLATES),
        job_id=path_ids,
        share=st.one_of(st.sampled_from(["qs1", "nope"]), no_digits.filter(bool)),
        body=bodies,
        query=st.dictionaries(st.sampled_from(QUERY_NAMES), query_values, max_size=3),
        user=st.sampled_from(sorted(clients)),
        content_type=st.sampled_from(["application/json", "application/json; charset=utf-8", "text/plain"]),
    )
    def probe(
        route: tuple[str, str], job_id: str, share: str, body: str, query: dict[str, str], user: str, content_type: str
    ) -> None:
        method, template = route
        path = template.format(id=urllib.parse.quote(job_id, safe=""), share=urllib.parse.quote(share, safe=""))
        answer = clients[user].request(
            method, path, params=query, content=body.encode(), headers={"Content-Type": content_type}
        )
        assert 200 <= answer.status_code < 500, (method, path, query, body, answer.status_code, answer.text[:500])

    probe()
    assert served.world.store.pending_requests() == 0


def test_a_waiting_job_carries_its_forecast(served: Served, viewer: Any) -> None:
    """Issue 41: a live job's forecast as the quota scheduler stored it, in the API's words."""
    from airflow_quota.store.forecast_words import forecast_short, forecast_words

    served.replay()  # the walkthrough at its end again, whatever the tests before changed
    answer = viewer.get("/quota/api/jobs", params={"state": "RUNNABLE"}).json()
    job = answer["jobs"][0]
    stored = served.world.store.forecasts([job["id"]]).get(job["id"])
    assert stored is not None, "the quota scheduler stored no forecast for the waiting job"
    assert job["forecast"]["start"] == stored.start and job["forecast"]["estimate_source"] == stored.source
    assert job["forecast_words"] == forecast_words(stored, answer["now"])
    assert job["forecast_short"] == forecast_short(stored, answer["now"])
    finished = viewer.get("/quota/api/jobs", params={"state": "SUCCEEDED"}).json()["jobs"]
    assert finished and all(j["forecast"] is None for j in finished), "a finished job has no forecast"
