"""Zoned timestamps in quota.yaml and scenarios (``core.timestamps``): every accepted form
names one instant, a timestamp without a zone is refused naming the rule, and a configuration
stored before zones were required still loads."""

from __future__ import annotations

from datetime import date, datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from airflow_quota.core.config import parse_config, stored_config
from airflow_quota.core.timestamps import ZONE_RULE, parse_zoned
from airflow_quota.exceptions import InvalidInput
from airflow_quota.sim.scenario import parse_scenario

G5 = "ml.g5.xlarge"
NINE_IN_PARIS = datetime(2026, 12, 1, 8, 0, tzinfo=timezone.utc)  # winter: Paris is UTC+1


@pytest.mark.parametrize(
    ("text", "instant"),
    [
        pytest.param("2026-12-01T09:00:00+01:00", NINE_IN_PARIS, id="an offset"),
        pytest.param("2026-12-01T08:00:00Z", NINE_IN_PARIS, id="Z for UTC"),
        pytest.param("2026-12-01T09:00:00 Europe/Paris", NINE_IN_PARIS, id="a zone name"),
        pytest.param("2026-12-01 09:00 Europe/Paris", NINE_IN_PARIS, id="a zone name after a short local time"),
        pytest.param(
            "2026-07-01T09:00:00 Europe/Paris",
            datetime(2026, 7, 1, 7, 0, tzinfo=timezone.utc),
            id="a zone name in summer: that day's offset (UTC+2)",
        ),
        pytest.param("2026-12-01T08:00:00 UTC", NINE_IN_PARIS, id="UTC by name"),
    ],
)
def test_a_zoned_timestamp_names_one_instant(text: str, instant: datetime) -> None:
    parsed = parse_zoned(text)
    assert parsed == instant
    assert type(parsed) is datetime  # a plain datetime, dumped and pickled as before


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("2026-12-01T09:00:00", f"'2026-12-01T09:00:00' has no zone; {ZONE_RULE}", id="no zone"),
        pytest.param("2026-12-01", f"'2026-12-01' has no zone; {ZONE_RULE}", id="a bare date"),
        pytest.param(
            "2026-12-01T09:00:00 Mars/Olympus",
            f"'2026-12-01T09:00:00 Mars/Olympus' is not an ISO 8601 timestamp; {ZONE_RULE}",
            id="an unknown zone name",
        ),
        pytest.param(
            "2026-12-01T09:00:00+01:00 Europe/Paris",
            "'2026-12-01T09:00:00+01:00 Europe/Paris' gives both an offset and a zone name: give one",
            id="an offset and a zone name",
        ),
        pytest.param("next tuesday", f"'next tuesday' is not an ISO 8601 timestamp; {ZONE_RULE}", id="not ISO 8601"),
    ],
)
def test_a_timestamp_without_a_clear_zone_is_refused_naming_the_rule(text: str, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_zoned(text)
    assert str(caught.value) == message


def quota(starts_at: Any, ends_at: Any) -> dict[str, Any]:
    plan = {"name": "night", "instance_type": G5, "count": 1, "starts_at": starts_at, "ends_at": ends_at}
    return {
        "pool": {"capacity": {G5: 2}, "training_plans": [plan]},
        "shares": [{"name": "research", "capacity_limits": {G5: 2}}],
    }


@pytest.mark.parametrize(
    ("starts_at", "ends_at", "problems"),
    [
        pytest.param(
            "2026-12-01T09:00:00",
            datetime(2026, 12, 2, 9),
            [
                f"pool.training_plans[0].starts_at: '2026-12-01T09:00:00' has no zone; {ZONE_RULE}",
                f"pool.training_plans[0].ends_at: 2026-12-02T09:00:00 has no zone; {ZONE_RULE}",
            ],
            id="text and a YAML timestamp without a zone",
        ),
        pytest.param(
            date(2026, 12, 1),
            "2026-12-02T09:00:00Z",
            [f"pool.training_plans[0].starts_at: 2026-12-01 is a date without a time or zone; {ZONE_RULE}"],
            id="a YAML date",
        ),
    ],
)
def test_quota_yaml_refuses_a_plan_window_without_a_zone(starts_at: Any, ends_at: Any, problems: list[str]) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_config(quota(starts_at, ends_at))
    assert [str(p) for p in caught.value.problems] == problems


def test_quota_yaml_keeps_taking_numbers_and_aware_yaml_timestamps() -> None:
    config = parse_config(quota(3600, datetime(2026, 12, 2, 9, tzinfo=timezone.utc)))
    plan = config.pool.training_plans[0]
    assert (plan.starts_at, plan.ends_at) == (3600.0, datetime(2026, 12, 2, 9, tzinfo=timezone.utc))


def test_a_configuration_stored_before_zones_were_required_still_loads_as_utc() -> None:
    """The quota database's input log replays what was applied: a zoneless timestamp stored
    then is read as it was then, not refused (the scheduler would not recover otherwise)."""
    config = stored_config(quota("2026-12-01T09:00:00", "2026-12-02T09:00:00+01:00"))
    plan = config.pool.training_plans[0]
    assert plan.starts_at == datetime(2026, 12, 1, 9)
    assert plan.ends_at == datetime(2026, 12, 2, 8, tzinfo=timezone.utc)


def test_a_zoned_scenario_is_the_scenario_in_seconds() -> None:
    """A start and a plan window in Paris time resolve to the same instants as UTC and seconds
    from the start: the simulator sees one scenario."""
    zoned = parse_scenario(
        {
            "start": "2026-12-01T01:00:00 Europe/Paris",
            "quota": quota("2026-12-01T02:00:00 Europe/Paris", "2026-12-01T03:00:00+01:00"),
        },
        Path("."),
    )
    plain = parse_scenario({"start": "2026-12-01T00:00:00Z", "quota": quota(3600, 7200)}, Path("."))
    assert zoned.start == plain.start
    origin = zoned.start
    plan, numbers = zoned.config.pool.training_plans[0], plain.config.pool.training_plans[0]
    assert isinstance(plan.starts_at, datetime) and isinstance(plan.ends_at, datetime)
    assert ((plan.starts_at - origin).total_seconds(), (plan.ends_at - origin).total_seconds()) == (
        numbers.starts_at,
        numbers.ends_at,
    )
