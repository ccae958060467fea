"""The read model (issue 15): what ``airflow-quota shares``, the JSON API (and so the Quotas
page), the capacity hook and the scheduler's gauges show of each share is the leading
scheduler's core view (``core.visibility``) at its last commit, on SQLite and on PostgreSQL;
every ``oldest_pending_seconds`` is one figure, ``pending_seconds`` of the stored instant.

A ``QuotaService`` with the fake backend steps on a manual clock; the CLI and the API read the
same database in-process (the CLI's store on the same clock, so that ages compare exactly).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="airflow-quota-read-model-"))  # before Airflow loads

from fastapi.testclient import TestClient
from sqlalchemy import Engine

from airflow_quota import admin, cli
from airflow_quota.core.cycle import QuotaScheduler
from airflow_quota.core.human_time import duration_words
from airflow_quota.core.model import JobRequest
from airflow_quota.core.normal_wait import starvation_threshold
from airflow_quota.core.visibility import pending_seconds, share_view
from airflow_quota.hooks.quota import QuotaHook
from airflow_quota.service.backends.fake import FakeBackend
from airflow_quota.service.clock import ManualClock
from airflow_quota.service.metrics import QuotaMetrics
from airflow_quota.service.scheduler import QuotaService
from airflow_quota.sim.scenario import load_scenario
from airflow_quota.sim.simulator import Simulator
from airflow_quota.store.repository import QuotaStore
from airflow_quota.store.views import ViewBuilder
from tests.conftest import ROOT
from tests.service.reader_api import reader_api

G5, P3 = "ml.g5.xlarge", "ml.p3.2xlarge"
QUOTA: dict[str, Any] = {
    "pool": {
        "capacity": {G5: 2, P3: 1},
        "training_plans": [{"name": "night", "instance_type": P3, "count": 1, "starts_at": 3000, "ends_at": 90000}],
    },
    "shares": [
        {
            "name": "research",
            "capacity_limits": {G5: 1, P3: 1},
            "strategy": "LEND_AND_BORROW",
            "preemption_grace_seconds": 30,
        },
        {"name": "prod", "capacity_limits": {G5: 1}, "strategy": "LEND"},
    ],
}
"""Two g5 instances, one per share (research borrows prod's until prod wants it back, with 30 s
of grace), and a p3 on a training plan whose window opens at 3000 s."""


@dataclass
class Gauges:
    """A ``StatsBackend`` that keeps the last value of each gauge by (name, share, type)."""

    last: dict[tuple[str, str, str], float] = field(default_factory=dict)

    def incr(self, stat: str, count: int = 1, *, tags: dict[str, str] | None = None) -> None:
        pass

    def gauge(self, stat: str, value: float, *, tags: dict[str, str] | None = None) -> None:
        assert tags is not None
        self.last[(stat, tags["share"], tags["instance_type"])] = value

    def timing(self, stat: str, dt: timedelta, *, tags: dict[str, str] | None = None) -> None:
        pass


@dataclass
class World:
    url: str
    clock: ManualClock
    store: QuotaStore
    service: QuotaService
    gauges: Gauges
    api: TestClient

    def step(self, at: float) -> None:
        self.clock.advance_to(at)
        self.service.step()

    def submit(self, name: str, share: str, duration: float, **entry: Any) -> None:
        preferences = [{"instance_type": G5, "count": 1, **entry}]
        request = JobRequest(name=name, share=share, priority=1, preferences=preferences)
        self.store.submit(request, "fake", {"duration": duration})

    def cli_shares(self, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
        capsys.readouterr()
        assert cli.main(["shares", "--db", self.url, "--json"]) == 0
        answer: dict[str, Any] = json.loads(capsys.readouterr().out)
        return answer

    def api_shares(self) -> dict[str, Any]:
        answer = self.api.get("/api/shares")
        assert answer.status_code == 200, answer.text
        shares: dict[str, Any] = answer.json()
        return shares


@pytest.fixture
def world(engine: Engine, db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    clock = ManualClock(1000.0)
    store = QuotaStore(engine, clock.now)
    store.apply_config(QUOTA)
    gauges = Gauges()
    service = QuotaService(
        engine,
        {"fake": FakeBackend(clock.now)},
        clock=clock,
        refresh_views_seconds=0.0,
        metrics=QuotaMetrics(gauges, gauge_seconds=0.0),
    )
    monkeypatch.setattr(admin, "_store", lambda args: store)  # the CLI reads on the same clock
    monkeypatch.setenv("AIRFLOW_CONN_QUOTA_DEFAULT", db_url)
    yield World(db_url, clock, store, service, gauges, reader_api(store, monkeypatch))


def core_view(world: World) -> list[dict[str, Any]]:
    """``core.visibility.share_view`` of every share of the leader's scheduler, now."""
    assert world.service.scheduler is not None
    state = world.service.scheduler.state
    return [share_view(state, share.name) for share in state.config.shares]


def from_cli(answer: dict[str, Any]) -> list[dict[str, Any]]:
    """The CLI's figures in the core's shape (ages as they were computed: from ``now``)."""
    return [
        {
            "share": share["share"],
            "running": share["running"],
            "runnable": share["runnable"],
            "oldest_pending_seconds": share["oldest_pending_seconds"],
            "types": {
                name: {k: t[k] for k in ("limit", "used", "borrowed", "lent", "idle", "runnable")}
                | {"oldest_pending_seconds": t["oldest_pending_seconds"]}
                for name, t in share["types"].items()
            },
        }
        for share in answer["shares"]
    ]


def from_api(answer: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "share": share["name"],
            "running": share["running"],
            "runnable": share["runnable"],
            "oldest_pending_seconds": share["oldest_pending_seconds"],
            "types": {
                t["instance_type"]: {k: t[k] for k in ("limit", "used", "borrowed", "lent", "idle", "runnable")}
                | {"oldest_pending_seconds": t["oldest_pending_seconds"]}
                for t in share["types"]
            },
        }
        for share in answer["shares"]
    ]


def expected(view: list[dict[str, Any]], now: float) -> list[dict[str, Any]]:
    """The core's view as a reader shows it at ``now``: instants become ``pending_seconds``."""
    return [
        {
            "share": share["share"],
            "running": share["running"],
            "runnable": share["runnable"],
            "oldest_pending_seconds": pending_seconds(share["oldest_runnable_since"], now),
            "types": {
                name: {k: t[k] for k in ("limit", "used", "borrowed", "lent", "idle", "runnable")}
                | {"oldest_pending_seconds": pending_seconds(t["oldest_runnable_since"], now)}
                for name, t in share["types"].items()
            },
        }
        for share in view
    ]


def test_the_cli_and_the_api_show_the_leaders_core_view_at_every_commit(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """Borrowing, a reclaim with a grace period, waiting jobs, ends: after every step the CLI
    and the API show exactly the core's ``share_view``, on SQLite and on PostgreSQL."""
    world.step(1000)  # the configuration is taken in
    world.submit("r1", "research", 100)
    world.submit("r2", "research", 200)  # borrows prod's idle instance
    world.step(1000)
    world.submit("r3", "research", 50)  # waits: the pool is full
    world.step(1005)
    world.submit("p1", "prod", 100)  # reclaims its instance from r2 (30 s of grace)
    seen = []
    for at in (1010, 1020, 1041, 1060, 1101, 1150, 1200, 1260, 1400):
        world.step(at)
        view = core_view(world)
        cli_answer, api_answer = world.cli_shares(capsys), world.api_shares()
        assert cli_answer["now"] == api_answer["now"] == at
        assert cli_answer["computed_at"] == api_answer["computed_at"] is not None
        assert from_cli(cli_answer) == expected(view, at), f"t={at}"
        assert from_api(api_answer) == expected(view, at), f"t={at}"
        research = view[0]["types"][G5]
        seen.append((research["used"], research["borrowed"], research["runnable"]))
    # research's g5 (used, borrowed, RUNNABLE): r2 preempted and r3 waiting, r3 borrowing, the end
    assert (1, 0, 2) in seen and (2, 1, 0) in seen and seen[-1] == (0, 0, 0), seen


def test_oldest_pending_seconds_is_one_figure_in_the_cli_the_api_and_the_metrics(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """A job waits from 1000 s; without any commit, the CLI, the API and the gauges read the
    same age at every instant (the view keeps the instant, each reader computes the age)."""
    world.step(1000)
    world.submit("r1", "research", 10_000)
    world.submit("r2", "research", 10_000)
    world.submit("r3", "research", 10_000)  # waits for the pool from 1000 s
    world.step(1000)
    computed_at = world.api_shares()["computed_at"]
    for at in (1000.0, 1030.25, 1234.56):
        world.step(at)  # a cycle that decides nothing commits nothing
        cli_type = world.cli_shares(capsys)["shares"][0]["types"][G5]
        api_answer = world.api_shares()
        api_type = api_answer["shares"][0]["types"][0]
        gauge = world.gauges.last[("quota.share.oldest_pending_seconds", "research", G5)]
        assert api_answer["computed_at"] == computed_at  # the view was not rewritten
        assert cli_type["oldest_pending_seconds"] == api_type["oldest_pending_seconds"] == gauge
        assert gauge == pending_seconds(1000.0, at) == round(at - 1000.0, 1)
        assert api_answer["shares"][0]["oldest_pending_seconds"] == gauge
        waiting = world.api.get("/api/jobs", params={"state": "RUNNABLE"}).json()["jobs"]
        assert [(j["name"], j["waiting_since"], j["pending_seconds"]) for j in waiting] == [("r3", 1000.0, gauge)]


def test_the_capacity_hook_sees_a_plan_window_open_without_any_commit(world: World) -> None:
    """Nothing waits for the plan, so nothing is decided when its window opens at 3000 s: the
    leader rewrites the view then all the same, and the hook's answer follows."""
    night = [{"instance_type": P3, "count": 1, "training_plan": "night"}]
    world.step(1000)
    check = QuotaHook().can_place_now("research", night)
    assert (check.placeable, check.reason) == (
        False,
        "1x ml.p3.2xlarge on plan night: training plan window not open; at most 0 now",
    )
    world.step(2999)
    assert not QuotaHook().can_place_now("research", night).placeable
    assert world.api_shares()["computed_at"] == 1000
    world.step(3000)
    check = QuotaHook().can_place_now("research", night)
    fits = "1x ml.p3.2xlarge on plan night fits now, within quota or by borrowing"
    assert (check.placeable, check.reason) == (True, fits)
    assert world.api_shares()["computed_at"] == 3000  # rewritten at the window's opening
    assert [e.type for e in world.store.events()] == []  # though nothing was decided
    assert not QuotaHook().can_place_now("prod", night).placeable  # prod has no p3 limit and lends only


def test_the_stored_pending_deadline_is_the_cores(world: World) -> None:
    """Issue 16: the task log says when ``max_pending_time`` falls due, from the deadline the
    scheduler stores with the job, which is the core's own: from when the job became RUNNABLE,
    or from its plan's window when every entry is a plan entry; None once placed, and None
    for a job without one."""
    world.step(1000)
    for name in ("r1", "r2"):
        world.submit(name, "research", 10_000)  # the pool's two g5 instances
    requests = [
        JobRequest(
            name="g5-limited",
            share="research",
            priority=1,
            preferences=[{"instance_type": G5, "count": 1}],
            max_pending_seconds=600,
        ),
        JobRequest(
            name="night-only",
            share="research",
            priority=1,
            max_pending_seconds=600,
            preferences=[{"instance_type": P3, "count": 1, "training_plan": "night"}],
        ),
        JobRequest(name="unlimited", share="research", priority=1, preferences=[{"instance_type": G5, "count": 1}]),
    ]
    ids = {request.name: world.store.submit(request, "fake", {"duration": 10_000}).id for request in requests}
    world.step(1010)
    assert world.service.scheduler is not None
    core = {job.name: job.pending_deadline for job in world.service.scheduler.state.jobs.values()}
    stored = {name: world.store.job(job_id).pending_deadline for name, job_id in ids.items()}  # type: ignore[union-attr]
    assert stored == {name: core[name] for name in ids} == {"g5-limited": 1610, "night-only": 3600, "unlimited": None}
    world.step(3000)  # the night plan's window opens: night-only is placed
    placed = world.store.job(ids["night-only"])
    assert placed is not None and placed.state != "RUNNABLE" and placed.pending_deadline is None


@pytest.mark.parametrize("path", sorted((ROOT / "tests" / "scenarios").glob("*.yaml")), ids=lambda p: p.stem)
def test_the_leaders_kept_figures_equal_a_fresh_computation(path: Path) -> None:
    """The leader keeps each share's waiting figures until its queue changes
    (``ViewBuilder``): after every cycle of every scenario, its view equals one computed
    afresh."""
    simulator = Simulator(load_scenario(path))
    kept = ViewBuilder()
    problems: list[str] = []

    def after_cycle(scheduler: QuotaScheduler, now: float) -> None:
        state = scheduler.state
        if kept.view_of(state, now) != ViewBuilder().view_of(state, now):
            problems.append(f"t={now:g}")

    simulator.after_each_cycle(after_cycle)
    simulator.run()
    assert not problems, problems


def test_a_shares_starvation_threshold_moves_with_its_placements_in_the_cli_and_the_api(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """Model v5 (docs/model.md rule 8.2): prod's threshold is 48 h until 20 of its jobs are
    placed, then 8x its normal wait (the 90% point of their waits). Its jobs wait for one
    another on its one instance, so each placement changes its queue, and the leader rewrites
    its row: after every step the CLI and the API show the core's threshold, in words too."""
    world.step(1000)
    for number in range(24):
        world.submit(f"p{number:02}", "prod", 600)  # one after another: waits of 0, 600, 1200 s...
    assert world.service.scheduler is not None
    state = world.service.scheduler.state
    seen: list[tuple[int, float, float | None]] = []
    for at in range(1000, 1000 + 24 * 600, 600):
        world.step(at)
        core = starvation_threshold(state.shares["prod"], state.recent_waits["prod"])
        cli_prod = world.cli_shares(capsys)["shares"][1]
        api_prod = world.api_shares()["shares"][1]
        assert cli_prod["share"] == api_prod["name"] == "prod"
        figures = (core.seconds, core.normal, False, 8.0)
        assert tuple(cli_prod[k] for k in THRESHOLD_FIELDS) == tuple(api_prod[k] for k in THRESHOLD_FIELDS) == figures
        assert api_prod["starvation_threshold_text"] == duration_words(core.seconds)
        assert api_prod["normal_wait_text"] == (None if core.normal is None else duration_words(core.normal))
        seen.append((len(state.recent_waits["prod"]), core.seconds, core.normal))
    # placed at 1000, 1600, 2200 s...: the n-th placement waited 600 (n - 1) seconds
    assert seen[:19] == [(n, 172800.0, None) for n in range(1, 20)]
    # from the 20th, 8x the 90% point: the 18th wait of 20 and of 21, the 19th of 22, ...
    assert seen[19:] == [
        (20, 86400.0, 10800.0),
        (21, 86400.0, 10800.0),
        (22, 91200.0, 11400.0),
        (23, 96000.0, 12000.0),
        (24, 100800.0, 12600.0),
    ]
    capsys.readouterr()
    assert cli.main(["shares", "--db", world.url]) == 0
    text = capsys.readouterr().out
    assert "prod      after 1 day 4 hours (8x a normal wait of 3 hours 30 minutes)" in text, text
    assert "research  after 2 days (normal wait not known yet)" in text, text


THRESHOLD_FIELDS = ("starvation_threshold_seconds", "normal_wait_seconds", "starvation_fixed", "starvation_multiple")
