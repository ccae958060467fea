"""Every scenario in tests/scenarios, run through the real command line
(``airflow-quota simulate --json``), checked against its ``expect`` block:

- ``events``: these, in this order (other events may come between);
- ``never``: no event matches;
- ``final``: these fields of the final job records;
- ``alerts``: how many alerts of each kind;
- ``until``: run with ``--until`` (to look at jobs still waiting, with their pending reasons).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import SCENARIOS, cli


def matches(event: dict[str, Any], wanted: dict[str, Any]) -> bool:
    return all(event.get(key) == value for key, value in wanted.items())


def check_expectations(report: dict[str, Any], expect: dict[str, Any]) -> list[str]:
    """Every unmet expectation, as a readable line (empty when all hold)."""
    failures = []
    events = report["events"]
    position = 0
    for wanted in expect.get("events", []):
        while position < len(events) and not matches(events[position], wanted):
            position += 1
        if position == len(events):
            failures.append(f"expected event not found (in order): {wanted}")
            break
        position += 1
    for forbidden in expect.get("never", []):
        hits = [e for e in events if matches(e, forbidden)]
        if hits:
            failures.append(f"forbidden event happened: {forbidden} -> {hits[0]}")
    for job, fields in (expect.get("final") or {}).items():
        record = report["jobs"].get(job)
        if record is None:
            failures.append(f"final: no job {job!r} in the output")
            continue
        for key, value in fields.items():
            if record.get(key) != value:
                failures.append(f"final: {job}.{key} is {record.get(key)!r}, expected {value!r}")
    for key, value in (expect.get("alerts") or {}).items():
        count = sum(1 for a in report["alerts"] if a["kind"] == key)
        if count != value:
            failures.append(f"alerts: {count} {key} alerts, expected {value}")
    return failures


def test_there_are_enough_scenarios() -> None:
    assert len(SCENARIOS) >= 20


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario(path: Path) -> None:
    expect = yaml.safe_load(path.read_text()).get("expect")
    assert expect, f"{path.name} has no expect block"
    until = ["--until", str(expect["until"])] if "until" in expect else []
    run = cli("simulate", str(path), "--json", *until)
    assert run.code == 0, run.stderr
    failures = check_expectations(run.json(), expect)
    assert not failures, "\n".join(failures)


def test_expectations_can_fail() -> None:
    """The checker itself: order matters, never and final are enforced."""
    report = {
        "events": [{"t": 0, "type": "PLACED", "job": "a"}, {"t": 5, "type": "PLACED", "job": "b"}],
        "jobs": {"a": {"state": "SUCCEEDED"}},
        "alerts": [],
    }
    assert check_expectations(report, {"events": [{"job": "a"}, {"job": "b"}]}) == []
    assert check_expectations(report, {"events": [{"job": "b"}, {"job": "a"}]})
    assert check_expectations(report, {"never": [{"job": "b", "t": 5}]})
    assert check_expectations(report, {"final": {"a": {"state": "FAILED"}}})
    assert check_expectations(report, {"final": {"zz": {"state": "FAILED"}}})
