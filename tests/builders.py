"""Builders for configurations, scenarios and job requests used across the tests (fluent,
readable): ``share``, ``quota``, ``job`` and ``scenario`` write the documents a user writes;
``request`` makes the core's ``JobRequest`` that the store and the service take."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine

from airflow_quota.core.config import parse_config
from airflow_quota.core.model import JobRequest, PreferenceEntry
from airflow_quota.sim.scenario import LoadedScenario, parse_scenario
from tests.conftest import ROOT


def share(name: str, limits: dict[str, int], strategy: str = "LEND_AND_BORROW", **fields: Any) -> dict[str, Any]:
    return {"name": name, "capacity_limits": limits, "strategy": strategy, **fields}


def quota(capacity: dict[str, int], *shares: dict[str, Any], **pool: Any) -> dict[str, Any]:
    return {"pool": {"capacity": capacity, **pool}, "shares": list(shares)}


def job(
    name: str, share: str, *prefs: tuple[str, int], at: float = 0, duration: float = 3600, **fields: Any
) -> dict[str, Any]:
    preferences = [{"instance_type": t, "count": n} for t, n in prefs]
    return {
        "at": at,
        "submit": {"name": name, "share": share, "preferences": preferences, "duration": duration, **fields},
    }


def scenario(quota_raw: dict[str, Any], *events: dict[str, Any], **extra: Any) -> LoadedScenario:
    parse_config(quota_raw)
    return parse_scenario({"quota": quota_raw, "events": list(events), **extra}, ROOT)


def request(
    name: str, share: str = "research", *prefs: tuple[str, int], priority: int = 1, **fields: Any
) -> JobRequest:
    """A job request for ``prefs`` ((instance type, count), most preferred first; one
    ml.g5.xlarge when none are given) in ``share``; ``fields`` set the request's other fields."""
    entries = [PreferenceEntry(instance_type=t, count=n) for t, n in (prefs or (("ml.g5.xlarge", 1),))]
    return JobRequest(name=name, share=share, priority=priority, preferences=entries, **fields)


def write_forecast(engine: Engine, job_id: int, made_at: float, start: float, spread: float, source: str) -> None:
    """Store a waiting job's forecast by hand, as the quota scheduler's refresh would
    (``quota_forecasts``): expected at ``start`` on one ml.g5.xlarge, ± ``spread`` seconds."""
    from sqlalchemy.orm import Session

    from airflow_quota.store.models import ForecastRow

    row = ForecastRow(
        job_id=job_id,
        made_at=made_at,
        start=start,
        low=start - spread,
        high=start + spread,
        end=None,
        instance_type="ml.g5.xlarge",
        count=1,
        borrowed=0,
        preempts=False,
        must_borrow=0,
        source=source,
        reason=None,
    )
    with Session(engine) as session, session.begin():
        session.merge(row)
