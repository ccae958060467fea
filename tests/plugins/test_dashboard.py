"""The read queries behind the page, in-process on SQLite: history across a configuration
change, alerts opening and closing, queue order, and charts."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from airflow_quota.core.catalogue import builtin_catalogue
from airflow_quota.core.config import read_yaml
from airflow_quota.hooks.quota import QuotaHook, describe_job
from airflow_quota.plugins.charts import utilisation_svg
from airflow_quota.store import dashboard
from tests.conftest import cli
from tests.plugins.walkthrough import QUOTA, World, play


@pytest.fixture
def world(tmp_path: Any) -> Iterator[World]:
    world = play(f"sqlite:///{tmp_path / 'quota.db'}", 7850)
    yield world
    world.service.engine.dispose()


def test_history_follows_limits_as_configurations_change(world: World) -> None:
    """qs1's limit raised to 2 (and the pool to 4) at 7900 s: qs1-high's instance becomes its
    own, and qs1-med, waiting, borrows qs2's idle one."""
    raw: dict[str, Any] = read_yaml(QUOTA)
    raw["pool"]["capacity"]["ml.g5.xlarge"] = 4
    raw["shares"][0]["capacity_limits"]["ml.g5.xlarge"] = 2
    world.step(world.origin + 7900)
    world.store.apply_config(raw)
    world.step(world.origin + 7900)
    history = dashboard.utilisation_history(world.store, "qs1", world.origin, world.origin + 8000)
    steps = [(round(p.at - world.origin), p.used_gpus, p.borrowed_gpus, p.limit_gpus) for p in history.points]
    assert steps == [(0, 2, 1, 1), (600, 1, 0, 1), (7800, 2, 1, 1), (7900, 3, 1, 2)]
    assert history.gpu_hours == pytest.approx((2 * 600 + 7200 + 2 * 100 + 3 * 100) / 3600)
    assert history.borrowed_gpu_hours == pytest.approx((600 + 100 + 100) / 3600)
    assert history.limit_gpu_hours == pytest.approx((7900 + 2 * 100) / 3600)
    summary = {s.name: s for s in dashboard.share_summaries(world.store, world.clock.now())[1]}
    g5 = summary["qs1"].types[0]
    assert (g5.capacity, g5.limit, g5.used, g5.borrowed) == (4, 2, 3, 1)


def test_a_window_before_anything_ran_is_empty_and_its_chart_says_so(world: World) -> None:
    history = dashboard.utilisation_history(world.store, "qs1", world.origin - 7200, world.origin - 3600)
    assert [(p.used_gpus, p.limit_gpus) for p in history.points] == [(0, 1)]
    assert history.gpu_hours == 0 and history.utilisation == 0
    empty = dashboard.UtilisationHistory("qs1", 0, 3600)
    assert "no placements in this window" in utilisation_svg(empty)


def test_charts_are_deterministic_svg(world: World) -> None:
    history = dashboard.utilisation_history(world.store, "qs1", world.origin, world.origin + 7850)
    first, second = utilisation_svg(history), utilisation_svg(history)
    assert first == second
    assert first.lstrip().startswith("<?xml") and "<svg" in first
    # 8500 GPU-seconds used (two GPUs for 600 s and 50 s, one for 7200 s) over 7850 guaranteed
    assert "qs1 (times in UTC): 108% of its limit, 2.36 GPU-hours (0.18 borrowed)" in first


def test_an_alert_closes_when_its_job_is_placed(world: World) -> None:
    assert [(a.job, a.open) for a in dashboard.alert_records(world.store)] == [
        ("qs1-high", False),
        ("qs1-med", True),
    ]
    world.store.set_priority(world.ids["qs1-med"], 5)  # preempts qs1-high in its share
    world.settle()
    assert [(a.job, a.open) for a in dashboard.alert_records(world.store)] == [
        ("qs1-high", False),  # waiting again, but a new wait: its old alert stays closed
        ("qs1-med", False),
    ]


def test_waiting_jobs_come_first_in_queue_order(world: World) -> None:
    names = [j.name for j in dashboard.list_jobs(world.store)]
    assert names == ["qs1-med", "qs3-job", "qs2-job", "qs1-low", "qs1-high"]
    since = {j.name: j.runnable_since for j in dashboard.list_jobs(world.store) if j.runnable_since is not None}
    assert since == {"qs1-med": pytest.approx(world.origin + 600)}  # requeued when preempted


def test_running_jobs_cost_what_they_have_run_so_far(world: World) -> None:
    """qs3-job, placed at 900 s, has held one ml.g5.xlarge for 6950 s at 7850 s; the scheduler
    charges it only when the attempt ends, the page shows it as it goes."""
    price = builtin_catalogue()["ml.g5.xlarge"].hourly_price
    charges = dashboard.running_charges(world.store, dashboard.list_jobs(world.store))
    assert set(charges) == {world.ids[name] for name in ("qs1-low", "qs1-high", "qs3-job")}
    qs3 = charges[world.ids["qs3-job"]]
    assert qs3.gpu_hours == pytest.approx(6950 / 3600)
    assert qs3.cost == pytest.approx(6950 / 3600 * price)
    summary = {s.name: s for s in dashboard.share_summaries(world.store, world.clock.now())[1]}
    assert summary["qs3"].cost == pytest.approx(6950 / 3600 * price, abs=1e-4)
    assert summary["qs2"].cost == pytest.approx(2 * price, abs=1e-4)  # qs2-job: 7200 s, ended


def test_a_share_says_how_long_its_jobs_wait_before_in_share_preemption(world: World) -> None:
    """The read model carries each share's wait (the leader writes it with the configuration it
    applies): qs1 of examples/quota.yaml preempts at once; given the default, it waits 600 s."""
    summary = {s.name: s for s in dashboard.share_summaries(world.store, world.clock.now())[1]}
    assert summary["qs1"].in_share_preemption_after_seconds == 0
    raw: dict[str, Any] = read_yaml(QUOTA)
    del raw["shares"][0]["in_share_preemption_after_seconds"]
    world.store.apply_config(raw)
    world.step()
    summary = {s.name: s for s in dashboard.share_summaries(world.store, world.clock.now())[1]}
    assert summary["qs1"].in_share_preemption_after_seconds == 600
    assert summary["qs1"].in_share_preemption_after_text == "10 minutes"
    assert summary["qs2"].in_share_preemption_after_seconds is None


def test_a_job_borrows_what_is_above_the_limit_now_not_at_its_placement(world: World) -> None:
    """Issue 38: qs1-low (placed first, within the limit) cancelled, qs1-high (placed above the
    limit, borrowing 1) holds qs1's only guaranteed instance now; qs1-med, placed in its turn,
    holds the one above. The counts add up to the share's borrowed figure."""
    high, med = world.ids["qs1-high"], world.ids["qs1-med"]
    world.store.cancel(world.ids["qs1-low"])
    world.settle()
    jobs = dashboard.list_jobs(world.store, share="qs1")
    now = dashboard.current_borrowing(world.store, jobs)
    assert now == {high: 0, med: 1}
    assert {job.id: job.borrowed for job in jobs if job.id in now} == {high: 1, med: 1}  # at their placements
    g5 = dashboard.share_summaries(world.store, world.clock.now())[1][0].types[0]
    assert (g5.limit, g5.used, g5.borrowed) == (1, 2, sum(now.values()))


def test_the_cli_and_the_hook_say_the_borrowing_of_now_and_keep_the_placement_s_apart(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 38: ``jobs list``, ``jobs show`` (``--json`` and the table) and the hook's job line
    say what the Quotas page says (``dashboard.current_borrowing``), the count at placement under
    its own name. The scenario of the test above: qs1-high borrowed 1 when placed, 0 now."""
    high, med = world.ids["qs1-high"], world.ids["qs1-med"]
    world.store.cancel(world.ids["qs1-low"])
    world.settle()
    url = world.store.engine.url.render_as_string(hide_password=False)
    listed = {j["id"]: j for j in cli("jobs", "list", "--share", "qs1", "--json", "--db", url).json()["jobs"]}
    assert {i: (listed[i]["borrowed"], listed[i]["borrowed_when_placed"]) for i in (high, med)} == {
        high: (0, 1),
        med: (1, 1),
    }
    shown = cli("jobs", "show", str(high), "--json", "--db", url).json()
    assert (shown["borrowed"], shown["borrowed_when_placed"]) == (0, 1)
    assert "borrowing: 0 now, 1 when last placed" in cli("jobs", "show", str(high), "--db", url).stdout
    table = cli("jobs", "list", "--share", "qs1", "--db", url).stdout
    assert "1x ml.g5.xlarge (borrowing 1 now)" in table and table.count("(borrowing") == 1, table
    monkeypatch.setenv("AIRFLOW_CONN_QUOTA_DEFAULT", url)
    hook = QuotaHook()
    jobs = {job_id: world.store.job(job_id) for job_id in (high, med)}
    assert {job_id: hook.borrowed_now(job) for job_id, job in jobs.items() if job} == {high: 0, med: 1}
    high_line, med_line = (hook.describe(job) for job in jobs.values() if job)
    assert "borrow" not in high_line, high_line
    assert f"quota job {med} (qs1-med) in share qs1 is RUNNING on 1x ml.g5.xlarge (borrowing 1 now)" in med_line
    assert "(borrowed 1 when placed)" in describe_job(jobs[high])  # type: ignore[arg-type]  # without the read


def test_borrowed_now_takes_the_placements_in_the_order_they_were_made() -> None:
    """docs/model.md rule 4.3.3's count, with the placements still held: each counts the usage
    of those placed before it."""
    placed = [
        dashboard.Holding(job_id=3, placed_at=20.0, decision=9, count=2),
        dashboard.Holding(job_id=1, placed_at=10.0, decision=5, count=2),
        dashboard.Holding(job_id=2, placed_at=20.0, decision=7, count=3),
    ]
    assert dashboard.borrowed_now(placed, limit=3) == {1: 0, 2: 2, 3: 2}
    assert dashboard.borrowed_now(placed, limit=10) == {1: 0, 2: 0, 3: 0}
    assert dashboard.borrowed_now(placed[:1], limit=0) == {3: 2}  # never more than its own count
    assert dashboard.borrowed_now([], limit=1) == {}


@pytest.mark.parametrize(
    ("status", "reason", "preempted", "cancelled", "text"),
    [
        ("STOPPED", "ExitCode:-15", True, False, "stopped by SIGTERM: preempted"),
        ("STOPPED", "ExitCode:-9", False, True, "stopped by SIGKILL: cancelled"),
        ("FAILED", "ExitCode:-9", False, False, "killed by SIGKILL"),
        ("FAILED", "ExitCode:1", False, False, "exited with code 1"),
        ("STOPPED", None, True, False, "stopped: preempted"),
        ("NOT_STARTED", None, True, False, "never started: preempted"),
        ("CAPACITY_ERROR", "InsufficientCapacity", False, False, "no capacity at the provider (InsufficientCapacity)"),
        ("FAILED", "AlgorithmError: out of memory", False, False, "AlgorithmError: out of memory"),
        ("SUCCEEDED", None, False, False, None),
        ("RUNNING", None, False, False, None),
    ],
)
def test_why_an_attempt_ended_is_said_for_people(
    status: str, reason: str | None, preempted: bool, cancelled: bool, text: str | None
) -> None:
    assert dashboard.attempt_reason_text(status, reason, preempted, cancelled) == text
