"""The scenario files, replayed through the quota service (store, inbox, leader steps, fake
backend, a manual clock), make the same decisions as ``airflow-quota simulate``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import Engine

from airflow_quota.sim.report import build_report
from airflow_quota.sim.scenario import load_scenario
from airflow_quota.sim.simulator import Simulator
from benchmarks import congested
from benchmarks.service_replay import ServiceReplay, comparable, first_difference
from tests.conftest import ROOT, SCENARIOS


def _uses_provider(path: Path) -> bool:
    raw = yaml.safe_load(path.read_text())
    return "provider" in raw or any("provider" in e for e in raw.get("events", []))


def through_service(path: Path, engine: Engine) -> list[dict[str, Any]]:
    """The scenario file's decision log, replayed through the service (``ServiceReplay``)."""
    replay = ServiceReplay(load_scenario(path), engine)
    if not replay.run(max_steps=100_000):
        pytest.fail("the replay through the service did not end")
    return replay.records()[0]


def test_every_scenario_is_compared_provider_ones_too() -> None:
    assert len(SCENARIOS) >= 20
    assert any(_uses_provider(path) for path in SCENARIOS)


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_service_decides_as_the_simulator(path: Path, sqlite_url: str) -> None:
    from airflow_quota.store.engine import make_engine, migrate

    engine = make_engine(sqlite_url)
    migrate(engine)
    simulated = build_report(Simulator(load_scenario(path)).run())["events"]
    served = through_service(path, engine)
    expected = comparable(simulated)
    assert len(expected) > 0
    assert comparable(served) == expected


def test_the_walkthrough_on_postgresql(postgres_url: str) -> None:
    from airflow_quota.store.engine import make_engine, migrate
    from airflow_quota.store.settings import normalize

    engine = make_engine(normalize(postgres_url))
    migrate(engine)
    path = ROOT / "tests" / "scenarios" / "s40_aws_walkthrough.yaml"
    simulated = build_report(Simulator(load_scenario(path)).run())["events"]
    assert comparable(through_service(path, engine)) == comparable(simulated)


# -- congested workloads (the model issue: the service and the simulator agree there too) ------

CONGESTED = [(1, False, "sqlite"), (2, False, "postgresql"), (3, True, "sqlite")]
"""(seed of ``benchmarks/congested.py``, reservations on in every share, database)."""


def _congested(directory: Path, seed: int, reserving: bool, jobs: int = 150) -> Path:
    """The congested workload of ``seed`` as a scenario file (the service replays a file). With
    ``reserving``, every share's starving jobs hold reservations (``starvation_reservation``,
    off by default: docs/model.md section 8); the in-share wait stays as generated."""
    raw = yaml.safe_load(congested.scenario(jobs, seed))
    if reserving:
        for share in raw["quota"]["shares"]:
            share["starvation_reservation"] = True
    out = directory / f"congested-{jobs}-{seed}.yaml"
    out.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert not _uses_provider(out), "the congested workloads have no provider events"
    return out


@pytest.mark.parametrize(
    ("seed", "reserving", "database"),
    CONGESTED,
    ids=[f"seed{s}-{'reserving' if r else 'as-generated'}-{d}" for s, r, d in CONGESTED],
)
def test_service_decides_as_the_simulator_on_congested_workloads(
    seed: int, reserving: bool, database: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """150 jobs over 6 shares in a small pool: queues, borrowing, reclaim, in-share
    preemption, starvation (and, with reservations on, held jobs) all happen."""
    from airflow_quota.store.engine import make_engine, migrate
    from airflow_quota.store.settings import normalize

    path = _congested(tmp_path, seed, reserving)
    if database == "sqlite":
        url = f"sqlite:///{tmp_path / 'quota.db'}"
    else:
        url = normalize(str(request.getfixturevalue("postgres_url")))
    engine = make_engine(url)
    migrate(engine)
    expected = comparable(build_report(Simulator(load_scenario(path)).run())["events"])
    kinds = [e["type"] for e in expected]
    assert kinds.count("PREEMPTED") > 10 and kinds.count("ALERT") > 10, "the workload does not congest"
    assert any(e["type"] == "PLACED" and e["borrowed"] > 0 for e in expected)
    served = comparable(through_service(path, engine))
    engine.dispose()
    assert served == expected, first_difference(expected, served)


def test_simultaneous_finish_and_failure_are_logged_in_the_same_order(sqlite_url: str, tmp_path: Path) -> None:
    """The smallest form of the congested workloads' disagreement: two attempts end at the
    same instant, one failing (placed first) and one succeeding. The simulator plays every
    finish of an instant before its failures, each kind in placement order; the service used
    to ingest reports in the order its query of open attempts returned them (no ORDER BY: row
    order, which PostgreSQL changes once rows are updated), and now sorts them the same way."""
    from airflow_quota.store.engine import make_engine, migrate

    path = tmp_path / "finish-and-failure.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "quota": {
                    "pool": {"capacity": {"ml.g5.xlarge": 2}},
                    "shares": [{"name": "a", "capacity_limits": {"ml.g5.xlarge": 2}, "strategy": "LEND_AND_BORROW"}],
                },
                "events": [
                    {
                        "at": 0,
                        "submit": {
                            "name": "fails",
                            "share": "a",
                            "duration": 600,
                            "retry_attempts": 2,
                            "failures": [{"after": 100, "reason": "ExitCode:1"}],
                            "preferences": [{"instance_type": "ml.g5.xlarge", "count": 1}],
                        },
                    },
                    {
                        "at": 0,
                        "submit": {
                            "name": "ends",
                            "share": "a",
                            "duration": 100,
                            "preferences": [{"instance_type": "ml.g5.xlarge", "count": 1}],
                        },
                    },
                ],
            }
        )
    )
    engine = make_engine(sqlite_url)
    migrate(engine)
    expected = comparable(build_report(Simulator(load_scenario(path)).run())["events"])
    served = comparable(through_service(path, engine))
    assert served == expected, first_difference(expected, served)
