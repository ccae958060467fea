"""The scenario files, replayed through the quota service (store, inbox, leader steps, fake
backend, a manual clock), make the same decisions as ``airflow-quota simulate``."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import Engine

from airflow_quota.core.config import QuotaConfig
from airflow_quota.exceptions import Refused
from airflow_quota.service.backends.base import AttemptSpec
from airflow_quota.service.backends.fake import FakeBackend
from airflow_quota.service.clock import ManualClock
from airflow_quota.service.scheduler import QuotaService
from airflow_quota.sim.report import build_report
from airflow_quota.sim.scenario import LoadedScenario, apply_pool_update, apply_share_update, load_scenario
from airflow_quota.sim.simulator import Simulator
from airflow_quota.store.repository import QuotaStore
from benchmarks import congested
from tests.conftest import ROOT, SCENARIOS

COMPARED = ("PLACED", "PREEMPTED", "REQUEUED", "SUCCEEDED", "FAILED", "PRIORITY_CHANGED", "ALERT")
KEYS = ("t", "type", "job", "share", "instance_type", "count", "borrowed", "training_plan", "kind", "by", "reason")


def _uses_provider(path: Path) -> bool:
    raw = yaml.safe_load(path.read_text())
    return "provider" in raw or any("provider" in e for e in raw.get("events", []))


def _absolute_plans(document: dict[str, Any], loaded: LoadedScenario) -> dict[str, Any]:
    """Plan instants given as seconds from the scenario's start, as datetimes (the service's
    clock is absolute)."""
    for plan in document.get("pool", {}).get("training_plans", []):
        for key in ("starts_at", "ends_at"):
            if isinstance(plan[key], (int, float)):
                plan[key] = (loaded.start + timedelta(seconds=plan[key])).isoformat()
    return document


def _document(config: QuotaConfig, loaded: LoadedScenario) -> dict[str, Any]:
    return _absolute_plans(config.model_dump(mode="json", exclude_none=True), loaded)


def through_service(path: Path, engine: Engine) -> list[dict[str, Any]]:
    loaded = load_scenario(path)
    origin = loaded.start.timestamp()
    clock = ManualClock(origin)
    store = QuotaStore(engine, clock.now)
    durations: dict[str, float] = {}
    service: QuotaService

    def remaining(spec: AttemptSpec) -> float:
        assert service.scheduler is not None
        return durations[spec.job_name] - service.scheduler.by_ref(spec.job_id).progress

    fake = FakeBackend(clock.now, remaining=remaining)
    service = QuotaService(
        engine, {"fake": fake}, clock=clock, cycle_seconds=float("inf"), refresh_views_seconds=float("inf")
    )
    config = loaded.config
    store.apply_config(_document(config, loaded))
    for instance_type, available in loaded.provider.available.items():
        store.set_provider_available(instance_type, available)
    ids: dict[str, int] = {}
    rejected: list[dict[str, Any]] = []
    events = loaded.events
    next_event = 0
    now = origin
    for _ in range(100_000):
        candidates = []
        if next_event < len(events):
            candidates.append(origin + events[next_event].at)
        change = fake.next_change(now)
        if change is not None:
            candidates.append(change)
        live = [j for j in store.jobs(states=["SUBMITTED", "RUNNABLE", "SCHEDULED", "STARTING", "RUNNING"])]
        timer = service.scheduler.next_timer() if service.scheduler else None
        if timer is not None and (live or next_event < len(events)):
            candidates.append(max(timer, now))
        if not candidates:
            break
        now = min(candidates)
        clock.advance_to(now)
        while next_event < len(events) and origin + events[next_event].at == now:
            event = events[next_event]
            next_event += 1
            try:
                if event.submit is not None:
                    sim = event.submit
                    durations[sim.name] = sim.duration
                    training = {
                        "startup": sim.startup_seconds,
                        "failures": [f.model_dump() for f in sim.failures],
                    }
                    ids[sim.name] = store.submit(sim.request(), "fake", training).id
                elif event.set_priority is not None:
                    store.set_priority(ids[event.set_priority.job], event.set_priority.priority)
                elif event.cancel is not None:
                    store.cancel(ids[event.cancel.job])
                elif event.update_share is not None:
                    config = QuotaConfig.model_validate(apply_share_update(config, event.update_share))
                    store.apply_config(_document(config, loaded))
                elif event.update_pool is not None:
                    config = QuotaConfig.model_validate(apply_pool_update(config, event.update_pool))
                    store.apply_config(_document(config, loaded))
                elif event.provider is not None:
                    for instance_type, available in event.provider.available.items():
                        store.set_provider_available(instance_type, available)
            except (Refused, KeyError) as exc:
                rejected.append({"t": now - origin, "error": str(exc)})
        service.step()
    else:
        pytest.fail("the replay through the service did not end")
    records = []
    for row in store.events():
        record = dict(row.record)
        record["t"] = round(row.at - origin, 6)
        records.append(record)
    return records


def _comparable(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for event in events:
        if event["type"] not in COMPARED:
            continue
        item = {k: event[k] for k in KEYS if k in event}
        item["t"] = round(float(item["t"]), 6)
        out.append(item)
    return out


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
    expected = _comparable(simulated)
    assert len(expected) > 0
    assert _comparable(served) == expected


def test_the_walkthrough_on_postgresql(postgres_url: str) -> None:
    from airflow_quota.store.engine import make_engine, migrate
    from airflow_quota.store.settings import normalize

    engine = make_engine(normalize(postgres_url))
    migrate(engine)
    path = ROOT / "tests" / "scenarios" / "s40_aws_walkthrough.yaml"
    simulated = build_report(Simulator(load_scenario(path)).run())["events"]
    assert _comparable(through_service(path, engine)) == _comparable(simulated)


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


def _first_difference(expected: list[dict[str, Any]], served: list[dict[str, Any]]) -> str:
    """Where the service's decisions first leave the simulator's, with what led there."""
    index = next(
        (i for i, (a, b) in enumerate(zip(expected, served, strict=False)) if a != b), min(len(expected), len(served))
    )
    before = "\n".join(f"  {e}" for e in expected[max(0, index - 3) : index])
    simulated = expected[index] if index < len(expected) else "(nothing: the simulator ends here)"
    service = served[index] if index < len(served) else "(nothing: the service ends here)"
    return (
        f"first difference at decision {index} of {len(expected)} (simulator) / {len(served)} (service)\n"
        f"after:\n{before}\nsimulator: {simulated}\nservice:   {service}"
    )


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
    expected = _comparable(build_report(Simulator(load_scenario(path)).run())["events"])
    kinds = [e["type"] for e in expected]
    assert kinds.count("PREEMPTED") > 10 and kinds.count("ALERT") > 10, "the workload does not congest"
    assert any(e["type"] == "PLACED" and e["borrowed"] > 0 for e in expected)
    served = _comparable(through_service(path, engine))
    engine.dispose()
    assert served == expected, _first_difference(expected, served)


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
    expected = _comparable(build_report(Simulator(load_scenario(path)).run())["events"])
    served = _comparable(through_service(path, engine))
    assert served == expected, _first_difference(expected, served)
