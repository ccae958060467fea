"""The output contract of docs/simulate.md: ``airflow-quota simulate --json`` (keys, stability across
hash seeds, measures computed by hand) and the human summary, through the real command line."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from airflow_quota.core.catalogue import builtin_catalogue
from airflow_quota.core.human_time import duration_words
from tests.conftest import CLI, ROOT, cli

WALKTHROUGH = ROOT / "tests" / "scenarios" / "s40_aws_walkthrough.yaml"
OVERTAKEN = ROOT / "tests" / "scenarios" / "s25_overtaken_by_borrowing.yaml"
"""A scenario with a STARVING alert (the walkthrough raises none under the defaults)."""
JOB_KEYS = {
    "state",
    "reason",
    "share",
    "priority",
    "attempts",
    "preemptions",
    "wait_seconds",
    "instance_type",
    "count",
    "gpu_hours",
    "lost_gpu_hours",
    "cost",
}
SHARE_KEYS = {
    "gpu_hours",
    "utilization",
    "borrowed_gpu_hours",
    "lent_gpu_hours",
    "wait_mean",
    "wait_p50",
    "wait_p95",
    "wait_max",
    "preemptions",
    "lost_gpu_hours",
    "cost",
}


def simulate_json(path: Path, hash_seed: str = "0") -> bytes:
    env = dict(os.environ, PYTHONHASHSEED=hash_seed)
    done = subprocess.run([*CLI, "simulate", str(path), "--json"], capture_output=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout


@pytest.fixture(scope="module")
def walkthrough() -> dict[str, Any]:
    report: dict[str, Any] = json.loads(simulate_json(WALKTHROUGH))
    return report


def write_scenario(tmp_path: Path, raw: dict[str, Any]) -> Path:
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def team_scenario(capacity: int, submits: list[dict[str, Any]], instance_type: str = "ml.g5.xlarge") -> dict[str, Any]:
    """A RESERVE share "team" holding the whole pool of one type, and an "idle" share that
    never submits anything."""
    return {
        "quota": {
            "pool": {"capacity": {instance_type: capacity, "ml.c5.xlarge": 1}},
            "shares": [
                {"name": "team", "capacity_limits": {instance_type: capacity}, "strategy": "RESERVE"},
                {"name": "idle", "capacity_limits": {"ml.c5.xlarge": 1}, "strategy": "RESERVE"},
            ],
        },
        "events": [{"at": 0, "submit": {"share": "team", "priority": 1, **s}} for s in submits],
    }


# -- the document ---------------------------------------------------------------------------


def test_json_is_byte_identical_across_hash_seeds() -> None:
    first = simulate_json(WALKTHROUGH, "1")
    second = simulate_json(WALKTHROUGH, "12345")
    assert first == second
    assert len(first) > 1000  # a real report, not two empty outputs
    json.loads(first)  # exactly one JSON document


def test_top_level_keys(walkthrough: dict[str, Any]) -> None:
    assert set(walkthrough) == {"events", "jobs", "shares", "pool", "alerts"}


def test_every_event_has_t_type_job_share(walkthrough: dict[str, Any]) -> None:
    assert walkthrough["events"]
    for event in walkthrough["events"]:
        assert {"t", "type", "job", "share"} <= set(event), event
        assert event["type"] in {
            "SUBMITTED",
            "REJECTED",
            "PLACED",
            "PREEMPTED",
            "REQUEUED",
            "SUCCEEDED",
            "FAILED",
            "PRIORITY_CHANGED",
            "ALERT",
        }
    times = [e["t"] for e in walkthrough["events"]]
    assert times == sorted(times)  # in the order they happened


def test_placed_and_preempted_events_have_their_keys(walkthrough: dict[str, Any]) -> None:
    placed = [e for e in walkthrough["events"] if e["type"] == "PLACED"]
    preempted = [e for e in walkthrough["events"] if e["type"] == "PREEMPTED"]
    assert placed and preempted
    for event in placed:
        assert {"instance_type", "count", "borrowed", "training_plan"} <= set(event), event
    for event in preempted:
        assert {"kind", "by", "lost_seconds"} <= set(event), event
        assert event["kind"] in {"CROSS_SHARE", "IN_SHARE"}


def test_job_records_have_the_simulate_md_keys(walkthrough: dict[str, Any]) -> None:
    assert set(walkthrough["jobs"]) == {"qs1-high", "qs1-med", "qs1-low", "qs2-job", "qs3-job"}
    for name, record in walkthrough["jobs"].items():
        assert set(record) >= JOB_KEYS, (name, JOB_KEYS - set(record))


def test_share_and_pool_records_have_their_keys(walkthrough: dict[str, Any]) -> None:
    assert set(walkthrough["shares"]) == {"qs1", "qs2", "qs3"}
    for name, record in walkthrough["shares"].items():
        assert set(record) >= SHARE_KEYS, (name, SHARE_KEYS - set(record))
    assert {"gpu_hours", "utilization", "cost"} <= set(walkthrough["pool"])


def test_alerts_have_their_keys_and_match_alert_events() -> None:
    report = json.loads(simulate_json(OVERTAKEN))
    alerts = report["alerts"]
    assert alerts  # big waits past its threshold and is overtaken by a borrower
    for alert in alerts:
        assert {"t", "kind", "job", "share", "reason", "position", "overtaken_by"} <= set(alert), alert
    events = [(e["t"], e["kind"], e["job"]) for e in report["events"] if e["type"] == "ALERT"]
    assert [(a["t"], a["kind"], a["job"]) for a in alerts] == events


def test_walkthrough_measures(walkthrough: dict[str, Any]) -> None:
    """Every job trains 7200 s on one 1-GPU ml.g5.xlarge and loses no work (checkpoints every
    300 s, preempted on a checkpoint, or without preemption): 2 GPU-hours each."""
    price = builtin_catalogue()["ml.g5.xlarge"].hourly_price
    for record in walkthrough["jobs"].values():
        assert record["gpu_hours"] == 2
        assert record["lost_gpu_hours"] == 0
        assert record["cost"] == pytest.approx(2 * price, abs=1e-4)
    assert walkthrough["pool"]["gpu_hours"] == 10
    assert walkthrough["shares"]["qs1"]["gpu_hours"] == 6
    # qs1-low waits from 0 to 1200 s, when its raised priority preempts qs1-high
    assert walkthrough["jobs"]["qs1-low"]["wait_seconds"] == 1200
    assert walkthrough["jobs"]["qs2-job"]["wait_seconds"] == 0
    assert walkthrough["jobs"]["qs3-job"]["wait_seconds"] == 0


# -- measures by hand -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("instance_type", "count", "duration", "gpu_hours"),
    [
        ("ml.g5.xlarge", 1, 3600, 1),
        ("ml.g5.12xlarge", 2, 1800, 4),
        ("ml.p4d.24xlarge", 1, 900, 2),
    ],
    ids=[
        "1x ml.g5.xlarge (1 GPU) for an hour is 1 GPU-hour at the hourly price",
        "2x ml.g5.12xlarge (4 GPUs) for half an hour is 4 GPU-hours at one hourly price",
        "1x ml.p4d.24xlarge (8 GPUs) for a quarter of an hour is 2 GPU-hours",
    ],
)
def test_gpu_hours_and_cost_of_one_job(
    tmp_path: Path, instance_type: str, count: int, duration: int, gpu_hours: float
) -> None:
    raw = team_scenario(
        count,
        [{"name": "solo", "duration": duration, "preferences": [{"instance_type": instance_type, "count": count}]}],
        instance_type,
    )
    run = cli("simulate", str(write_scenario(tmp_path, raw)), "--json")
    assert run.code == 0, run.stderr
    report = run.json()
    price = builtin_catalogue()[instance_type].hourly_price
    cost = count * duration / 3600 * price
    job = report["jobs"]["solo"]
    assert (job["state"], job["reason"], job["attempts"], job["preemptions"]) == ("SUCCEEDED", None, 1, 0)
    assert (job["instance_type"], job["count"]) == (instance_type, count)
    assert job["wait_seconds"] == 0
    assert job["gpu_hours"] == pytest.approx(gpu_hours)
    assert job["lost_gpu_hours"] == 0
    assert job["cost"] == pytest.approx(cost, abs=1e-4)
    team = report["shares"]["team"]
    assert team["gpu_hours"] == pytest.approx(gpu_hours)
    assert team["cost"] == pytest.approx(cost, abs=1e-4)
    assert team["utilization"] == pytest.approx(1.0)  # the whole limit, the whole run
    assert report["shares"]["idle"]["gpu_hours"] == 0
    assert report["pool"]["gpu_hours"] == pytest.approx(gpu_hours)
    assert report["pool"]["cost"] == pytest.approx(cost, abs=1e-4)


def test_share_wait_statistics(tmp_path: Path) -> None:
    """21 jobs of 100 s, one at a time, all submitted at t=0: job k waits 100·k s, so the waits
    are 0, 100, ..., 2000. Mean and median 1000, p95 1900 (the 20th of 21 values, by nearest
    rank and by interpolation alike), max 2000. The idle share has no waits at all."""
    jobs = [
        {"name": f"j{k:02d}", "duration": 100, "preferences": [{"instance_type": "ml.g5.xlarge", "count": 1}]}
        for k in range(21)
    ]
    run = cli("simulate", str(write_scenario(tmp_path, team_scenario(1, jobs))), "--json")
    assert run.code == 0, run.stderr
    report = run.json()
    assert [report["jobs"][f"j{k:02d}"]["wait_seconds"] for k in range(21)] == [100 * k for k in range(21)]
    team = report["shares"]["team"]
    assert (team["wait_mean"], team["wait_p50"], team["wait_p95"], team["wait_max"]) == (1000, 1000, 1900, 2000)
    idle = report["shares"]["idle"]
    assert (idle["wait_mean"], idle["wait_p50"], idle["wait_p95"], idle["wait_max"]) == (0, 0, 0, 0)
    assert team["gpu_hours"] == pytest.approx(21 * 100 / 3600)


def test_wait_statistics_of_uneven_waits(tmp_path: Path) -> None:
    """Durations 300, 100, 600: waits 0, 300, 400; mean 233.333, p50 300, max 400 (p95 of three
    values depends on the percentile method: docs/simulate.md says nearest rank)."""
    jobs = [
        {"name": name, "duration": duration, "preferences": [{"instance_type": "ml.g5.xlarge", "count": 1}]}
        for name, duration in (("a", 300), ("b", 100), ("c", 600))
    ]
    report = cli("simulate", str(write_scenario(tmp_path, team_scenario(1, jobs))), "--json").json()
    assert [report["jobs"][n]["wait_seconds"] for n in "abc"] == [0, 300, 400]
    team = report["shares"]["team"]
    assert team["wait_mean"] == pytest.approx(700 / 3, abs=1e-3)
    assert (team["wait_p50"], team["wait_max"]) == (300, 400)


# -- the human summary -------------------------------------------------------------------------


def test_text_output_shows_shares_jobs_and_alerts() -> None:
    walkthrough = json.loads(simulate_json(OVERTAKEN))
    run = cli("simulate", str(OVERTAKEN))
    assert run.code == 0, run.stderr
    text = run.stdout
    with pytest.raises(ValueError):
        json.loads(text)  # a summary for people, not the JSON document
    lines = text.splitlines()
    for heading in ("Shares", "Jobs", "Alerts"):
        assert heading in lines, heading
    shares_at, jobs_at, alerts_at = lines.index("Shares"), lines.index("Jobs"), lines.index("Alerts")
    assert shares_at < jobs_at < alerts_at
    share_rows = lines[shares_at + 1 : jobs_at]
    job_rows = lines[jobs_at + 1 : alerts_at]
    alert_rows = lines[alerts_at + 1 :]
    for name in walkthrough["shares"]:
        assert any(row.split()[:1] == [name] for row in share_rows), name
    for name, record in walkthrough["jobs"].items():
        row = next(r for r in job_rows if r.split()[:1] == [name])
        assert record["state"] in row.split()
        assert record["share"] in row.split()
        assert duration_words(record["wait_seconds"]) in row  # the wait in words, not seconds
    end = walkthrough["pool"]["end"]
    assert lines[0].startswith(f"Simulated {end} s ({duration_words(end)}) in ")
    for alert in walkthrough["alerts"]:
        assert any(alert["job"] in row.split() and alert["kind"] in row.split() for row in alert_rows), alert


def test_text_output_without_alerts_has_no_alerts_section(tmp_path: Path) -> None:
    jobs = [{"name": "solo", "duration": 60, "preferences": [{"instance_type": "ml.g5.xlarge", "count": 1}]}]
    run = cli("simulate", str(write_scenario(tmp_path, team_scenario(1, jobs))))
    assert run.code == 0, run.stderr
    lines = run.stdout.splitlines()
    assert "Shares" in lines and "Jobs" in lines
    assert "Alerts" not in lines
    assert any(line.split()[:1] == ["solo"] for line in lines)
