"""The leader looks only at the reports that may have changed something (``QuotaService._reports_changed``:
the attempts it changed and the ones the poller has news of), not at every open attempt at every
step. The full walk (``_reports_walked``: every open attempt told to the poller, each one's
report looked at) is the reference: after every step of the scenarios, of congested workloads
and of the ITP trace's first jobs, with the fake backend polled, listing its changes, or with
the starts' and stops' outcomes taken a step late (as when the poller's threads carry them out),
the incremental way finds the same news and leaves the poller following the same attempts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from airflow_quota.service.backends.base import AttemptReport
from airflow_quota.service.intake import is_news
from airflow_quota.service.scheduler import QuotaService
from airflow_quota.sim.scenario import LoadedScenario, load_scenario
from airflow_quota.store.engine import make_engine, migrate
from benchmarks import congested
from benchmarks.service_replay import ServiceReplay
from tests.conftest import SCENARIOS

_WORKLOADS = [path.stem for path in SCENARIOS[::3]] + ["congested-seed1", "congested-seed3-reserving", "itp-400"]


def _workload(name: str, directory: Path) -> LoadedScenario:
    if name == "itp-400":
        from benchmarks.service_trace import itp_scenario

        return itp_scenario(400)
    if name.startswith("congested"):
        seed = int(name.split("seed")[1][0])
        raw = yaml.safe_load(congested.scenario(150, seed))
        if name.endswith("reserving"):
            for share in raw["quota"]["shares"]:
                share["starvation_reservation"] = True
        path = directory / f"{name}.yaml"
        path.write_text(yaml.safe_dump(raw, sort_keys=False))
        return load_scenario(path)
    return load_scenario(next(path for path in SCENARIOS if path.stem == name))


def _walked(service: QuotaService) -> list[tuple[tuple[int, int], AttemptReport]]:
    """What the full walk finds now, without its side effects (telling the poller)."""
    reports = service.poller.reports()
    found = []
    for attempt in service.open_attempts.in_order():
        report = reports.get(attempt.backend, {}).get((attempt.job_id, attempt.number))
        if report is not None and is_news(attempt, report):
            found.append(((attempt.job_id, attempt.number), report))
    return found


def _outcomes_a_step_late(service: QuotaService) -> None:
    """The outcomes of the actions a step carries out inline are taken at the next step, after
    its reports: an attempt's action is marked done between two looks at the reports."""
    poller = service.poller
    act_due, take_outcomes = poller.act_due, poller.take_outcomes
    acted = [False]

    def _act_due(now: float) -> None:
        act_due(now)
        acted[0] = True

    def _take_outcomes() -> list[Any]:
        if acted[0]:
            acted[0] = False
            return []  # kept by the poller (still "requested") until the next step takes them
        return take_outcomes()

    poller.act_due = _act_due  # type: ignore[method-assign]
    poller.take_outcomes = _take_outcomes  # type: ignore[method-assign]


@pytest.mark.parametrize("mode", ["polled", "listing", "outcomes-late"])
@pytest.mark.parametrize("name", _WORKLOADS)
def test_the_reports_looked_at_are_the_full_walks_news_after_every_step(
    name: str, mode: str, sqlite_url: str, tmp_path: Path
) -> None:
    engine = make_engine(sqlite_url)
    migrate(engine)
    replay = ServiceReplay(_workload(name, tmp_path), engine, listing=mode == "listing")
    service = replay.service
    if mode == "outcomes-late":
        _outcomes_a_step_late(service)
    incremental = service._reports_changed
    compared = {"steps": 0, "news": 0}

    def _checked(now: float) -> Any:
        found = incremental(now)
        assert service.open_attempts.loaded
        expected = _walked(service)
        assert sorted(((a.job_id, a.number), r) for a, r in found) == sorted(expected), f"step {replay.steps}"
        followed = set().union(*service.poller.tracking().values())
        should = {(a.job_id, a.number) for a in service.open_attempts.in_order() if a.backend in service.backends}
        assert followed == should, f"step {replay.steps}: the poller follows other attempts than the open ones"
        compared["steps"] += 1
        compared["news"] += len(found)
        return found

    service._reports_changed = _checked  # type: ignore[method-assign]
    assert replay.run(max_steps=100_000), "the replay did not end"
    engine.dispose()
    assert compared["steps"] > 0 and compared["news"] > 0, f"nothing compared: {compared}"
