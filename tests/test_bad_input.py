"""Bad input through the real command line (docs/simulate.md, "Two kinds of bad input";
docs/model.md rules 1.2 and 2.1).

A malformed scenario or quota.yaml is refused as a whole: exit status 2, nothing on standard
output, no traceback, and every problem on standard error as a ``path: message`` line whose
path names the field in the file that breaks the rule. The file itself is named once, first:
``FILE: message`` for the file as a whole (cannot be read, not YAML, empty, not a mapping),
else a ``FILE:`` line with the problems under it.
"""

from __future__ import annotations

import copy
import os
import re
import subprocess
import threading
from collections.abc import Callable, Iterator
from datetime import date, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import Engine, func, select, update

from airflow_quota.core.config import parse_config
from airflow_quota.core.model import MAX_SECONDS, JobRequest
from airflow_quota.core.state import QuotaState
from airflow_quota.core.submission import check_submission
from airflow_quota.exceptions import SubmissionRejected
from airflow_quota.store.backend_names import TEST_BACKENDS_VARIABLE
from airflow_quota.store.engine import make_engine, migrate
from airflow_quota.store.models import JobRow, Request
from airflow_quota.store.repository import QuotaStore
from airflow_quota.store.settings import normalize
from tests.conftest import CLI, ROOT, Run, cli
from tests.postgres import postgres_admin, postgres_url
from tests.waiting import wait_for

__all__ = ["postgres_admin", "postgres_url"]  # the fixtures of the id-range tests on PostgreSQL

G5 = "ml.g5.xlarge"
P4D = "ml.p4d.24xlarge"

# Expected problems are (path, regex on the message). In a path, "{file}" is the file written.
Expected = list[tuple[str, str]]

# --------------------------------------------------------------------------- building inputs

BASE_QUOTA: dict[str, Any] = {
    "pool": {"capacity": {G5: 4, P4D: 2}},
    "shares": [
        {"name": "qs1", "capacity_limits": {G5: 2}, "strategy": "LEND_AND_BORROW"},
        {"name": "qs2", "capacity_limits": {G5: 1, P4D: 2}, "strategy": "RESERVE"},
    ],
}


def quota(**changes: Any) -> dict[str, Any]:
    """The base quota with top-level keys replaced."""
    raw = copy.deepcopy(BASE_QUOTA)
    raw.update(changes)
    return raw


def share(index: int, **changes: Any) -> dict[str, Any]:
    """The base quota with one share's fields changed (None deletes a field)."""
    raw = copy.deepcopy(BASE_QUOTA)
    for key, value in changes.items():
        if value is None:
            raw["shares"][index].pop(key, None)
        else:
            raw["shares"][index][key] = value
    return raw


def job(name: str = "j1", share: str = "qs1", **fields: Any) -> dict[str, Any]:
    """A well-formed submission; keyword arguments replace or add fields."""
    submit: dict[str, Any] = {
        "name": name,
        "share": share,
        "priority": 1,
        "preferences": [{"instance_type": G5, "count": 1}],
        "duration": 60,
    }
    submit.update(fields)
    return submit


def submit(at: float, **fields: Any) -> dict[str, Any]:
    return {"at": at, "submit": job(**fields)}


def scenario(*events: dict[str, Any], quota_: dict[str, Any] | None = None, **top: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {"quota": BASE_QUOTA if quota_ is None else quota_, "events": list(events)}
    raw.update(top)
    return raw


def write(tmp_path: Path, content: str | dict[str, Any], name: str = "scenario.yaml") -> Path:
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else yaml.safe_dump(content, sort_keys=False))
    return path


# --------------------------------------------------------------------------- checking output


def problem_lines(stderr: str) -> list[tuple[str, str]]:
    """Every ``path: message`` line of standard error, split at the first ": "."""
    lines = []
    for line in stderr.splitlines():
        path, sep, message = line.partition(": ")
        if sep:
            lines.append((path.strip(), message.strip()))
    return lines


def assert_refused(run: Run, expected: Expected, file: Path, *, stdout_empty: bool = True) -> None:
    """Exit 2, no traceback, (optionally) empty stdout, the file named once at the start of
    standard error, and each expected problem reported."""
    shown = f"exit {run.code}\n--- stdout ---\n{run.stdout}\n--- stderr ---\n{run.stderr}"
    assert "Traceback" not in run.stderr, shown
    assert run.code == 2, shown
    if stdout_empty:
        assert run.stdout == "", shown
    assert run.stderr.startswith(f"{file}:"), shown
    assert run.stderr.count(str(file)) == 1, shown
    lines = problem_lines(run.stderr)
    missing = []
    for path, pattern in expected:
        path = path.replace("{file}", str(file))
        if not any(p == path and re.search(pattern, m, re.IGNORECASE) for p, m in lines):
            missing.append(f"{path}: /{pattern}/")
    assert not missing, "problems not reported as `path: message`:\n  " + "\n  ".join(missing) + "\n" + shown


# --------------------------------------------------------------------------- simulate: one problem each

PLAN = {
    "name": "night",
    "instance_type": G5,
    "count": 1,
    "starts_at": "2026-12-01T00:00:00Z",
    "ends_at": datetime(2026, 12, 2),  # written by YAML as 2026-12-02 00:00:00, unquoted: no zone
}

AT_LEAST_ONE = r"≥ 1|>= 1|greater than or equal to 1|at least 1"
AT_LEAST_ZERO = r"≥ 0|>= 0|greater than or equal to 0|negative"

SIMULATE_CASES: list[tuple[str, str | dict[str, Any], Expected]] = [
    (
        "YAML that does not parse is refused with the file, line and column",
        "quota:\n  pool: {capacity: {ml.g5.xlarge: 2}\nevents: []\n",
        [("{file}:3:1", r"not valid YAML")],
    ),
    (
        "an unknown key at the top level of the scenario (a typo of events)",
        scenario(evnts=[]),
        [("evnts", r"unknown key")],
    ),
    (
        "an unknown key inside a share (a typo of borrow_limit)",
        scenario(quota_=share(0, borrow_limt=50)),
        [("quota.shares[0].borrow_limt", r"unknown key")],
    ),
    (
        "an unknown key inside a submission",
        scenario(submit(0, prioriti=3)),
        [("events[0].submit.prioriti", r"unknown key")],
    ),
    (
        "an unknown instance type in pool.capacity",
        scenario(quota_=quota(pool={"capacity": {G5: 4, P4D: 2, "ml.g5.huge": 1}})),
        [("quota.pool.capacity.ml.g5.huge", r"unknown instance type")],
    ),
    (
        "an unknown instance type in the second entry of a submission's preferences",
        scenario(
            submit(0, preferences=[{"instance_type": G5, "count": 1}, {"instance_type": "ml.x9.mega", "count": 1}])
        ),
        [("events[0].submit.preferences[1].instance_type", r"unknown instance type")],
    ),
    (
        "share limits that sum to more than the pool's capacity",
        scenario(quota_=share(0, capacity_limits={G5: 4})),
        [("quota.pool.capacity.ml.g5.xlarge", r"limit.*capacity|capacity.*limit")],
    ),
    (
        "a borrow_limit on a RESERVE share",
        scenario(quota_=share(1, borrow_limit=50)),
        [("quota.shares[1].borrow_limit", r"LEND_AND_BORROW")],
    ),
    (
        "a max_running_jobs of 0 (at least 1, or none)",
        scenario(quota_=share(1, max_running_jobs=0)),
        [("quota.shares[1].max_running_jobs", r"greater than or equal to 1")],
    ),
    (
        "a submission with six preferences (at most five)",
        scenario(
            submit(
                0,
                preferences=[
                    {"instance_type": t, "count": 1}
                    for t in (G5, "ml.g5.2xlarge", "ml.g5.4xlarge", "ml.g5.8xlarge", "ml.g5.12xlarge", P4D)
                ],
            )
        ),
        [("events[0].submit.preferences", r"^6 instance types listed; a job lists at most 5$")],
    ),
    (
        "a submission listing the same instance type twice",
        scenario(submit(0, preferences=[{"instance_type": G5, "count": 1}, {"instance_type": G5, "count": 2}])),
        [("events[0].submit.preferences", r"twice|more than once|duplicate|at most once")],
    ),
    (
        "a preference entry with count 0",
        scenario(submit(0, preferences=[{"instance_type": G5, "count": 0}])),
        [("events[0].submit.preferences[0].count", AT_LEAST_ONE)],
    ),
    (
        "a submission with priority 10000 (0 to 9999)",
        scenario(submit(0, priority=10000)),
        [("events[0].submit.priority", r"9999")],
    ),
    (
        "a submission to a share that does not exist",
        scenario(submit(0, share="qs9")),
        [("events[0].submit.share", r"qs9")],
    ),
    (
        "set_priority for a job that is never submitted",
        scenario(submit(0), {"at": 10, "set_priority": {"job": "ghost", "priority": 5}}),
        [("events[1].set_priority.job", r"ghost")],
    ),
    (
        "set_priority for a job submitted only after it (same instant, later in the file)",
        scenario({"at": 0, "set_priority": {"job": "j1", "priority": 5}}, submit(0)),
        [("events[0].set_priority.job", r"j1")],
    ),
    (
        "cancel for a job that is never submitted",
        scenario(submit(0), {"at": 10, "cancel": {"job": "ghost"}}),
        [("events[1].cancel.job", r"ghost")],
    ),
    (
        "cancel for a job submitted only at a later time",
        scenario({"at": 0, "cancel": {"job": "j1"}}, submit(10)),
        [("events[0].cancel.job", r"j1")],
    ),
    (
        "an event at a negative time",
        scenario(submit(-5)),
        [("events[0].at", AT_LEAST_ZERO)],
    ),
    (
        "an event earlier than the event before it",
        scenario(submit(10, name="j1"), submit(5, name="j2")),
        [("events[1].at", r"before|earlier|decreas|previous")],
    ),
    (
        "an event with two kinds at once (submit and cancel)",
        scenario(submit(0), {"at": 5, "submit": job(name="j2"), "cancel": {"job": "j1"}}),
        [("events[1]", r"exactly one")],
    ),
    (
        "an update_share that raises a limit over the pool's capacity",
        scenario(submit(0), {"at": 5, "update_share": {"name": "qs1", "capacity_limits": {G5: 4}}}),
        [("events[1].update_share.capacity_limits.ml.g5.xlarge", r"limit.*capacity|capacity.*limit")],
    ),
    (
        "an update_share that gives a borrow_limit to a RESERVE share",
        scenario(submit(0), {"at": 5, "update_share": {"name": "qs2", "borrow_limit": 50}}),
        [("events[1].update_share.borrow_limit", r"LEND_AND_BORROW")],
    ),
    (
        "a start without a zone (read as UTC here, as local time by a person)",
        "start: '2026-12-01T09:00:00'\n" + yaml.safe_dump(scenario(submit(0)), sort_keys=False),
        [("start", r"'2026-12-01T09:00:00' has no zone; a timestamp needs a zone: an offset")],
    ),
    (
        "a plan window whose end is a YAML timestamp without a zone",
        scenario(quota_=quota(pool={**BASE_QUOTA["pool"], "training_plans": [PLAN]})),
        [("quota.pool.training_plans[0].ends_at", r"^2026-12-02T00:00:00 has no zone")],
    ),
]


@pytest.mark.parametrize(
    ("content", "expected"),
    [pytest.param(content, expected, id=name) for name, content, expected in SIMULATE_CASES],
)
def test_simulate_refuses_a_malformed_scenario(tmp_path: Path, content: Any, expected: Expected) -> None:
    path = write(tmp_path, content)
    assert_refused(cli("simulate", str(path), "--json"), expected, path)


# --------------------------------------------------------------------------- simulate: several problems

SEVERAL_CASES: list[tuple[str, dict[str, Any], Expected]] = [
    (
        "two bad fields in one submission and a bad time in another event",
        scenario(
            submit(0, priority=10000, preferences=[{"instance_type": G5, "count": 0}]),
            submit(-1, name="j2"),
        ),
        [
            ("events[0].submit.priority", r"9999"),
            ("events[0].submit.preferences[0].count", AT_LEAST_ONE),
            ("events[1].at", AT_LEAST_ZERO),
        ],
    ),
    (
        "two broken configuration rules in the quota",
        scenario(
            submit(0),
            quota_=quota(
                shares=[
                    {"name": "qs1", "capacity_limits": {G5: 4}, "strategy": "LEND_AND_BORROW"},
                    {"name": "qs2", "capacity_limits": {G5: 1}, "strategy": "RESERVE", "borrow_limit": 50},
                ]
            ),
        ),
        [
            ("quota.pool.capacity.ml.g5.xlarge", r"limit.*capacity|capacity.*limit"),
            ("quota.shares[1].borrow_limit", r"LEND_AND_BORROW"),
        ],
    ),
    (
        "an unknown share, an unknown instance type and a reference to a job never submitted",
        scenario(
            submit(0, share="qs9"),
            submit(1, name="j2", preferences=[{"instance_type": "ml.x9.mega", "count": 1}]),
            {"at": 2, "cancel": {"job": "ghost"}},
        ),
        [
            ("events[0].submit.share", r"qs9"),
            ("events[1].submit.preferences[0].instance_type", r"unknown instance type"),
            ("events[2].cancel.job", r"ghost"),
        ],
    ),
    (
        "a broken quota rule together with an event naming a job never submitted",
        scenario(submit(0), {"at": 5, "cancel": {"job": "ghost"}}, quota_=share(1, borrow_limit=50)),
        [
            ("quota.shares[1].borrow_limit", r"LEND_AND_BORROW"),
            ("events[1].cancel.job", r"ghost"),
        ],
    ),
    (
        "problems at every level: an unknown top-level key, a broken quota rule, a bad job field and a missing job",
        scenario(
            submit(0, preferences=[{"instance_type": G5, "count": 0}]),
            {"at": 5, "cancel": {"job": "ghost"}},
            quota_=share(1, borrow_limit=50),
            evnts=[],
        ),
        [
            ("evnts", r"unknown key"),
            ("quota.shares[1].borrow_limit", r"LEND_AND_BORROW"),
            ("events[0].submit.preferences[0].count", AT_LEAST_ONE),
            ("events[1].cancel.job", r"ghost"),
        ],
    ),
]


@pytest.mark.parametrize(
    ("content", "expected"),
    [pytest.param(content, expected, id=name) for name, content, expected in SEVERAL_CASES],
)
def test_simulate_reports_every_problem_of_a_file(tmp_path: Path, content: Any, expected: Expected) -> None:
    assert len(expected) >= 2
    path = write(tmp_path, content)
    run = cli("simulate", str(path), "--json")
    assert_refused(run, expected, path)
    assert len(problem_lines(run.stderr)) >= len(expected)


@pytest.mark.parametrize(
    "command",
    ["simulate", "validate"],
    ids=["simulate a file that does not exist", "validate a file that does not exist"],
)
def test_a_missing_file_is_a_clear_error(tmp_path: Path, command: str) -> None:
    path = tmp_path / "no-such-scenario.yaml"
    args = (command, str(path), "--json") if command == "simulate" else (command, str(path))
    run = cli(*args)
    assert_refused(run, [(str(path), r"no such file|not found|does not exist|cannot read")], path)


# --------------------------------------------------------------------------- a file as a whole

TOP_LEVEL = r"^the top level must be a mapping of .+, got "
ITP_EXCERPT = f"itp:{ROOT / 'examples' / 'traces' / 'itp-excerpt'}"


def assert_file_refused(run: Run, file: Path, message: str) -> None:
    """Exit 2, no traceback, nothing on stdout, and one line on stderr: the file and a colon,
    then what matches ``message`` (a regex)."""
    shown = f"exit {run.code}\n--- stdout ---\n{run.stdout}\n--- stderr ---\n{run.stderr}"
    assert "Traceback" not in run.stderr, shown
    assert run.code == 2, shown
    assert run.stdout == "", shown
    lines = run.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{file}:"), shown
    assert re.search(message, lines[0].removeprefix(f"{file}:").lstrip()), shown


# (what the quota file is, its content or None for no file, what follows "FILE:" as a regex)
QUOTA_FILE_CASES: list[tuple[str, str | None, str]] = [
    (
        "a quota file that is a YAML list",
        "- pool: {capacity: {ml.g5.xlarge: 1}}\n- shares: []\n",
        TOP_LEVEL + "a list$",
    ),
    ("a quota file that is a number", "42\n", TOP_LEVEL + "a number$"),
    ("a quota file that is a string", "pool capacity 3\n", TOP_LEVEL + "a string$"),
    ("an empty quota file", "", r"^the file is empty$"),
    ("a quota file of comments only", "# shares to come\n", r"^the file is empty$"),
    ("a quota file that is not valid YAML", "pool:\n  capacity: [1, 2\nshares: []\n", r"^3:7: not valid YAML: "),
    ("a quota file that does not exist", None, r"^cannot read the file: No such file"),
]

# (the command, its arguments given the quota file and a folder for outputs)
QUOTA_COMMANDS: list[tuple[str, Callable[[str, Path], list[str]]]] = [
    ("validate QUOTA", lambda quota, out: ["validate", quota]),
    ("simulate --trace with --quota QUOTA", lambda quota, out: ["simulate", "--trace", ITP_EXCERPT, "--quota", quota]),
    (
        "compare --quota QUOTA with a report",
        lambda quota, out: ["compare", "--trace", ITP_EXCERPT, "--quota", quota, "--report", f"{out}/report.html"],
    ),
    (
        "compare --policy QUOTA",
        lambda quota, out: [
            "compare",
            "--trace",
            ITP_EXCERPT,
            "--quota",
            str(ROOT / "examples" / "itp-quota.yaml"),
            "--policy",
            quota,
        ],
    ),
]


@pytest.mark.parametrize("command", [pytest.param(args, id=name) for name, args in QUOTA_COMMANDS])
@pytest.mark.parametrize(
    ("content", "message"),
    [pytest.param(content, message, id=name) for name, content, message in QUOTA_FILE_CASES],
)
def test_a_quota_file_refused_as_a_whole_is_named(
    tmp_path: Path, command: Callable[[str, Path], list[str]], content: str | None, message: str
) -> None:
    path = tmp_path / "quota.yaml" if content is None else write(tmp_path, content, "quota.yaml")
    out = tmp_path / "out"
    assert_file_refused(cli(*command(str(path), out)), path, message)
    assert not out.exists()  # nothing written


# (what the scenario file is, its content, what follows "FILE:" as a regex)
SCENARIO_FILE_CASES: list[tuple[str, str, str]] = [
    ("a scenario file that is a YAML list", yaml.safe_dump([scenario(submit(0))]), TOP_LEVEL + "a list$"),
    ("a scenario file that is a string", "just some words\n", TOP_LEVEL + "a string$"),
    ("an empty scenario file", "", r"^the file is empty$"),
    ("a scenario file that is not valid YAML", "quota: {pool: [\nevents: []\n", r"^\d+:\d+: not valid YAML: "),
]


@pytest.mark.parametrize("command", ["simulate", "validate"], ids=["simulate SCENARIO", "validate SCENARIO"])
@pytest.mark.parametrize(
    ("content", "message"),
    [pytest.param(content, message, id=name) for name, content, message in SCENARIO_FILE_CASES],
)
def test_a_scenario_file_refused_as_a_whole_is_named(tmp_path: Path, command: str, content: str, message: str) -> None:
    path = write(tmp_path, content)
    assert_file_refused(cli(command, str(path)), path, message)


# (what the scenario's quota is, the scenario, the quota.yaml next to it or None, the problem:
# in the path, "{file}" is the scenario; in the message, "{quota}" is the quota.yaml)
SCENARIO_QUOTA_CASES: list[tuple[str, dict[str, Any], str | None, Expected]] = [
    (
        "a scenario whose quota is a list",
        {"quota": [BASE_QUOTA], "events": [submit(0)]},
        None,
        [("quota", r"^must be a mapping of quota sections .+, got a list$")],
    ),
    (
        "a scenario whose quota is a string",
        {"quota": "quota.yaml", "events": [submit(0)]},
        None,
        [("quota", r"^must be a mapping of quota sections .+, got a string$")],
    ),
    (
        "a scenario whose quota_file is a YAML list",
        {"quota_file": "quota.yaml", "events": [submit(0)]},
        "- shares: []\n",
        [("quota_file", r"^{quota}: the top level must be a mapping of quota sections .+, got a list$")],
    ),
    (
        "a scenario whose quota_file does not exist",
        {"quota_file": "quota.yaml", "events": [submit(0)]},
        None,
        [("quota_file", r"^{quota}: cannot read the file: No such file")],
    ),
    (
        "a scenario whose quota_file breaks a rule",
        {"quota_file": "quota.yaml", "events": [submit(0)]},
        yaml.safe_dump(share(1, borrow_limit=50)),
        [("quota_file", r"^{quota}: shares\[1\]\.borrow_limit: .*LEND_AND_BORROW")],
    ),
]


@pytest.mark.parametrize("command", ["simulate", "validate"], ids=["simulate SCENARIO", "validate SCENARIO"])
@pytest.mark.parametrize(
    ("content", "quota_file", "expected"),
    [pytest.param(*case, id=name) for name, *case in SCENARIO_QUOTA_CASES],
)
def test_a_problem_of_a_scenarios_quota_names_the_scenario(
    tmp_path: Path, command: str, content: dict[str, Any], quota_file: str | None, expected: Expected
) -> None:
    path = write(tmp_path, content)
    quota_path = tmp_path / "quota.yaml"
    if quota_file is not None:
        write(tmp_path, quota_file, quota_path.name)
    named = [(where, pattern.replace("{quota}", re.escape(str(quota_path)))) for where, pattern in expected]
    assert_refused(cli(command, str(path)), named, path)


# --------------------------------------------------------------------------- validate

VALID_QUOTA: dict[str, Any] = {
    "pool": {"capacity": {G5: 6, P4D: 5}},
    "shares": [
        {"name": "research", "capacity_limits": {G5: 1, P4D: 2}, "strategy": "LEND_AND_BORROW", "borrow_limit": 100},
        {"name": "prod", "capacity_limits": {G5: 2, P4D: 1}, "strategy": "RESERVE"},
    ],
}
# lendable(T) = capacity - sum of limits + limits of lending shares
VALID_SUMMARY = {G5: (6, 6 - 3 + 1), P4D: (5, 5 - 3 + 2)}


def test_validate_summarises_a_valid_quota_file(tmp_path: Path) -> None:
    path = write(tmp_path, VALID_QUOTA, "quota.yaml")
    run = cli("validate", str(path))
    assert run.code == 0, run.stderr
    assert "Traceback" not in run.stderr
    assert "capacity" in run.stdout.lower() and "lendable" in run.stdout.lower(), run.stdout
    for type_name, (capacity, lendable) in VALID_SUMMARY.items():
        rows = [line for line in run.stdout.splitlines() if type_name in line.split()]
        assert rows, f"{type_name} is not in the summary:\n{run.stdout}"
        tokens = rows[0].split()
        assert str(capacity) in tokens and str(lendable) in tokens, (
            f"{type_name}: expected capacity {capacity} and lendable {lendable} in {rows[0]!r}"
        )


VALIDATE_INVALID_CASES: list[tuple[str, str | dict[str, Any], Expected]] = [
    (
        "limits over capacity and a borrow_limit on a RESERVE share",
        {
            "pool": {"capacity": {G5: 2}},
            "shares": [
                {"name": "a", "capacity_limits": {G5: 2}, "strategy": "LEND"},
                {"name": "b", "capacity_limits": {G5: 1}, "strategy": "RESERVE", "borrow_limit": 10},
            ],
        },
        [
            ("pool.capacity.ml.g5.xlarge", r"limit.*capacity|capacity.*limit"),
            ("shares[1].borrow_limit", r"LEND_AND_BORROW"),
        ],
    ),
    (
        "an unknown strategy and a limit of 0",
        {
            "pool": {"capacity": {G5: 2}},
            "shares": [
                {"name": "a", "capacity_limits": {G5: 1}, "strategy": "SHARE_EVERYTHING"},
                {"name": "b", "capacity_limits": {G5: 0}},
            ],
        },
        [
            ("shares[0].strategy", r"RESERVE|LEND"),
            ("shares[1].capacity_limits.ml.g5.xlarge", AT_LEAST_ONE),
        ],
    ),
    (
        "an unknown key in a share and an unknown instance type in the pool",
        {
            "pool": {"capacity": {G5: 2, "ml.x9.mega": 1}},
            "shares": [{"name": "a", "capacity_limits": {G5: 1}, "colour": "blue"}],
        },
        [
            ("shares[0].colour", r"unknown key"),
            ("pool.capacity.ml.x9.mega", r"unknown instance type"),
        ],
    ),
    (
        "a quota file that is not valid YAML",
        "pool:\n  capacity: [1, 2\nshares: []\n",
        [("{file}:3:7", r"not valid YAML")],
    ),
]


@pytest.mark.parametrize(
    ("content", "expected"),
    [pytest.param(content, expected, id=name) for name, content, expected in VALIDATE_INVALID_CASES],
)
def test_validate_reports_every_error_of_an_invalid_quota_file(
    tmp_path: Path, content: Any, expected: Expected
) -> None:
    path = write(tmp_path, content, "quota.yaml")
    run = cli("validate", str(path))
    assert_refused(run, expected, path)


def test_validate_accepts_a_valid_scenario_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        scenario(
            submit(0), {"at": 10, "set_priority": {"job": "j1", "priority": 3}}, {"at": 20, "cancel": {"job": "j1"}}
        ),
    )
    run = cli("validate", str(path))
    assert run.code == 0, run.stderr
    assert "Traceback" not in run.stderr
    assert run.stderr == ""
    assert "valid" in run.stdout and "scenario" in run.stdout, run.stdout
    assert G5 in run.stdout and P4D in run.stdout, run.stdout


# --------------------------------------------------------------------------- job files and the quota database
# (issue 14, findings 3-6: wrong types, sizes, encodings and ids are `path: message`, exit 2,
# nothing stored; set-priority on a job that ended; a notifier that cannot be imported)

LIMIT_QUOTA: dict[str, Any] = {
    "pool": {"capacity": {G5: 4}},
    "shares": [{"name": "qs1", "capacity_limits": {G5: 2}, "strategy": "LEND_AND_BORROW"}],
}


def migrated(url: str) -> Iterator[tuple[str, Engine]]:
    """The quota database at ``url``, migrated with ``LIMIT_QUOTA`` applied, and its engine."""
    engine = make_engine(normalize(url))
    migrate(engine)
    QuotaStore(engine).apply_config(LIMIT_QUOTA)
    yield url, engine
    engine.dispose()


@pytest.fixture
def quota_db(tmp_path: Path) -> Iterator[tuple[str, Engine]]:
    """A migrated SQLite quota database with ``LIMIT_QUOTA`` applied, and its engine."""
    yield from migrated(f"sqlite:///{tmp_path / 'quota.db'}")


@pytest.fixture(params=["sqlite", "postgresql"])
def quota_db_each(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Engine]]:
    """``quota_db`` on SQLite, then the same on a fresh PostgreSQL database: for the tests of
    the id range, which PostgreSQL's column types bound (issue 39)."""
    if request.param == "sqlite":
        yield from migrated(f"sqlite:///{tmp_path / 'quota.db'}")
    else:
        yield from migrated(request.getfixturevalue("postgres_url"))


def stored_rows(engine: Engine) -> tuple[int, int]:
    """How many jobs and requests the quota database holds."""
    with engine.connect() as c:
        return c.scalar(select(func.count()).select_from(JobRow)) or 0, c.scalar(
            select(func.count()).select_from(Request)
        ) or 0


def job_file(**fields: Any) -> dict[str, Any]:
    """A valid job file for ``jobs submit``; keyword arguments replace or add fields."""
    raw: dict[str, Any] = {
        "name": "j1",
        "share": "qs1",
        "preferences": [{"instance_type": G5, "count": 1}],
        "backend": "fake",
        "training": {"duration": 5},
    }
    raw.update(fields)
    return raw


NOT_IN_POOL = ("ml.g5.2xlarge", "ml.g5.4xlarge", "ml.g5.8xlarge", "ml.g5.12xlarge", "ml.m5.xlarge")
"""Types of the catalogue that ``LIMIT_QUOTA``'s pool (only ml.g5.xlarge) does not have."""


def exactly(message: str) -> str:
    """A pattern matching ``message`` word for word, nothing before or after."""
    return f"^{re.escape(message)}$"


# (what is wrong, the job file's fields, the problems expected: every one, in one run)
SUBMIT_CASES: list[tuple[str, dict[str, Any], Expected]] = [
    (
        "dag_id is a list and client_token a mapping",
        {"dag_id": ["a", "b"], "client_token": {"a": 1}},
        [("dag_id", r"valid string"), ("client_token", r"valid string")],
    ),
    (
        "every bounded field beyond its limit",
        {
            "dag_id": "d" * 300_000,
            "task_id": "t" * 251,
            "run_id": "r" * 251,
            "client_token": "c" * 257,
            "checkpoint_uri": "s3://bucket/" + "k" * 1_000_000,
            "training": {"blob": "x" * 2_000_000},
            "retry_on": ["ExitCode:1"] * 21,
        },
        [
            ("dag_id", r"^at most 250 characters \(got 300000\)$"),
            ("task_id", r"^at most 250 characters \(got 251\)$"),
            ("run_id", r"^at most 250 characters \(got 251\)$"),
            ("client_token", r"^at most 256 characters \(got 257\)$"),
            ("checkpoint_uri", r"^at most 2048 characters \(got 1000012\)$"),
            ("training", r"^at most 65536 bytes as JSON \(got 2000012\)$"),
            ("retry_on", r"at most 20 items"),
        ],
    ),
    ("a training that is not JSON (a date)", {"training": {"at": date(2026, 1, 1)}}, [("training", r"must be JSON")]),
    (
        "an instance type with markup, an infinite max_pending_seconds, a huge count",
        {
            "preferences": [{"instance_type": "<b>ml.g5</b>\n", "count": 10**30}],
            "max_pending_seconds": float("inf"),
        },
        [
            ("preferences[0].instance_type", r"should match pattern"),
            ("preferences[0].count", r"less than or equal"),
            ("max_pending_seconds", r"finite"),
        ],
    ),
    (
        "an expected runtime of 0 seconds",
        {"expected_runtime_seconds": 0},
        [("expected_runtime_seconds", exactly("Input should be greater than 0"))],
    ),
    (
        "six instance types, five of them not in the pool: both said, every type named",
        {"preferences": [{"instance_type": t, "count": 1} for t in (G5, *NOT_IN_POOL)]},
        [
            ("preferences", exactly("6 instance types listed; a job lists at most 5")),
            ("preferences", exactly(f"{', '.join(NOT_IN_POOL)} are not in the pool (its types: {G5})")),
        ],
    ),
    (
        "a CPU-only type not in the pool: said as such, not as a capacity of 0",
        {"preferences": [{"instance_type": "ml.m5.xlarge", "count": 1}]},
        [("preferences", exactly(f"ml.m5.xlarge is not in the pool (its types: {G5})"))],
    ),
    (
        "misspelled keys, of the job and of an entry: named with the known ones and the closest",
        {"prioriti": 3, "preferences": [{"instance_type": G5, "count": 1, "training_pln": "night"}]},
        [
            (
                "prioriti",
                exactly(
                    "unknown key; did you mean 'priority'? The known ones are name, share, priority, preferences,"
                    " max_pending_seconds, preemption_retries, retry_attempts, retry_on, checkpoint_uri,"
                    " checkpoint_interval, wait_for_capacity, backend, training, client_token, dag_id, task_id,"
                    " run_id, map_index, aws_conn_id, expected_runtime_seconds"
                ),
            ),
            (
                "preferences[0].training_pln",
                exactly(
                    "unknown key; did you mean 'training_plan'? The known ones are instance_type, count, training_plan"
                ),
            ),
        ],
    ),
]


@pytest.mark.parametrize(("fields", "expected"), [pytest.param(f, e, id=name) for name, f, e in SUBMIT_CASES])
def test_jobs_submit_refuses_a_field_of_the_wrong_type_or_beyond_its_limit(
    tmp_path: Path, quota_db: tuple[str, Engine], fields: dict[str, Any], expected: Expected
) -> None:
    url, engine = quota_db
    path = write(tmp_path, job_file(**fields), "job.yaml")
    assert_refused(cli("jobs", "submit", str(path), "--db", url), expected, path)
    assert stored_rows(engine) == (0, 1)  # the configuration's request only: no job, no submit request


@pytest.mark.parametrize(
    ("preferences", "message"),
    [
        (
            [(t, 1) for t in ("ml.m5.xlarge", G5, "ml.g5.2xlarge")],
            f"preferences: ml.m5.xlarge, ml.g5.2xlarge are not in the pool (its types: {G5})",
        ),
        ([(G5, 5)], f"preferences[0].count: 5x {G5} is more than the pool's capacity of 4"),
    ],
    ids=["two types not in the pool, before any count", "a count above the capacity of a type in the pool"],
)
def test_the_core_names_every_type_not_in_the_pool_before_any_capacity_arithmetic(
    preferences: list[tuple[str, int]], message: str
) -> None:
    """What the scheduler, the hook and the simulator say (``check_submission``): the types the
    pool does not have, all of them, as such; the capacity rule only for types it has."""
    state = QuotaState(parse_config(LIMIT_QUOTA), origin=datetime(2026, 1, 1))
    entries = [{"instance_type": t, "count": n} for t, n in preferences]
    request = JobRequest.model_validate({"name": "j1", "share": "qs1", "preferences": entries})
    with pytest.raises(SubmissionRejected) as rejected:
        check_submission(state, request)
    assert str(rejected.value) == message


def test_jobs_submit_accepts_fields_at_their_limits(tmp_path: Path, quota_db: tuple[str, Engine]) -> None:
    """The limits are where they are documented: at the limit is accepted (so the tests above
    refuse for the size, not for something else)."""
    url, engine = quota_db
    fields = job_file(
        dag_id="d" * 250,
        task_id="t" * 250,
        run_id="r" * 250,
        client_token="c" * 256,
        checkpoint_uri="s3://" + "k" * 2043,
        training={"blob": "x" * (64 * 1024 - 20)},
        retry_on=["ExitCode:1"] * 20,
        expected_runtime_seconds=MAX_SECONDS,
    )
    run = cli("jobs", "submit", str(write(tmp_path, fields, "job.yaml")), "--db", url)
    assert run.code == 0 and "Traceback" not in run.stderr, run
    assert stored_rows(engine) == (1, 2)
    with engine.connect() as c:
        assert c.scalar(select(JobRow.expected_runtime_seconds)) == MAX_SECONDS, "stored for the forecast"


@pytest.mark.parametrize(
    "command",
    [["jobs", "submit"], ["apply"], ["validate"], ["simulate"]],
    ids=["jobs submit", "apply", "validate", "simulate"],
)
def test_a_file_that_is_not_utf8_is_named_with_the_offending_byte(
    tmp_path: Path, quota_db: tuple[str, Engine], command: list[str]
) -> None:
    url, engine = quota_db
    path = tmp_path / "latin1.yaml"
    path.write_bytes("name: caf\u00e9\nshare: qs1\n".encode("latin-1"))
    database = ["--db", url] if command[0] in ("jobs", "apply") else []
    run = cli(*command, str(path), *database)
    assert_file_refused(run, path, r"^not UTF-8 text: byte 0xe9 at offset 9")
    assert stored_rows(engine) == (0, 1)


@pytest.mark.parametrize(
    ("command", "key"),
    [(["jobs", "show"], str(2**63)), (["jobs", "cancel"], "0"), (["jobs", "set-priority"], "1" + "0" * 5000)],
    ids=["show 2^63", "cancel 0", "set-priority a 5001-digit id"],
)
def test_a_job_id_out_of_the_databases_range_is_a_clear_error(
    quota_db_each: tuple[str, Engine], command: list[str], key: str
) -> None:
    url, engine = quota_db_each
    extra = ["1"] if command[1] == "set-priority" else []
    run = cli(*command, key, *extra, "--db", url)
    assert "Traceback" not in run.stderr and run.code == 2, run
    assert re.fullmatch(r"job: a job id is 1 to 9223372036854775807 \(got [^\n]{1,40}\)\n", run.stderr), run
    assert stored_rows(engine) == (0, 1)


@pytest.mark.parametrize("key", [str(2**31), str(2**63 - 1)], ids=["2^31", "2^63-1"])
@pytest.mark.parametrize("command", [["jobs", "show"], ["jobs", "cancel"], ["jobs", "set-priority"]], ids=" ".join)
def test_an_id_in_range_that_names_no_job_is_a_clear_error(
    quota_db_each: tuple[str, Engine], command: list[str], key: str
) -> None:
    """Ids just past the 32-bit range and at the end of the 64-bit one, which no job has: on PostgreSQL as on
    SQLite, one line naming the id, exit 2 (before migration 0013, a traceback on PostgreSQL)."""
    url, engine = quota_db_each
    extra = ["1"] if command[1] == "set-priority" else []
    run = cli(*command, key, *extra, "--db", url)
    assert "Traceback" not in run.stderr and run.code == 2, run
    assert run.stderr == f"job: no job '{key}'\n", run
    assert stored_rows(engine) == (0, 1)


def test_set_priority_out_of_range_names_the_rule(quota_db: tuple[str, Engine]) -> None:
    url, engine = quota_db
    run = cli("jobs", "set-priority", "j1", "100000", "--db", url)
    assert run.code == 2 and run.stderr == "priority: 0 to 9999 (got 100000)\n", run
    assert stored_rows(engine) == (0, 1)


def _submitted(engine: Engine) -> JobRow:
    request = {k: v for k, v in job_file().items() if k not in ("backend", "training")}
    return QuotaStore(engine).submit(JobRequest.model_validate(request), "fake", {"duration": 5})


def _set_row(engine: Engine, job_id: int, **columns: Any) -> None:
    """What the quota scheduler writes to a job's row (its state, its priority)."""
    with engine.begin() as c:
        c.execute(update(JobRow).where(JobRow.id == job_id).values(**columns))


def test_set_priority_on_a_job_that_ended_says_so(quota_db: tuple[str, Engine]) -> None:
    url, engine = quota_db
    done = _submitted(engine)
    _set_row(engine, done.id, state="SUCCEEDED")
    run = cli("jobs", "set-priority", str(done.id), "3", "--db", url)
    assert run.code == 2 and "Traceback" not in run.stderr, run
    assert "already SUCCEEDED" in run.stderr and run.stdout == "", run
    assert stored_rows(engine) == (1, 2)  # no set_priority request


@pytest.mark.parametrize(
    ("scheduler_writes", "code", "answer"),
    [
        ({"state": "SUCCEEDED"}, 2, r"^job: 'j1' ended \(SUCCEEDED\) before its new priority was taken in"),
        ({"priority": 3}, 0, r"^job \d+ \(j1\): priority 3 set$"),
        ({}, 0, r"^job \d+ \(j1\): priority 3 asked; it takes effect at the next cycle$"),
    ],
    ids=["the job ends first", "the scheduler takes it in", "no scheduler answers in time"],
)
def test_set_priority_waits_for_the_scheduler_and_reports_what_happened(
    quota_db: tuple[str, Engine], scheduler_writes: dict[str, Any], code: int, answer: str
) -> None:
    """The job is live when asked; while the command waits, the scheduler (here: a write to the
    job's row, as the scheduler makes) ends the job, or takes the change in, or does nothing."""
    url, engine = quota_db
    live = _submitted(engine)

    def asked() -> bool:
        with engine.connect() as c:
            return bool(c.scalar(select(func.count()).select_from(Request).where(Request.kind == "set_priority")))

    failures: list[AssertionError] = []

    def scheduler() -> None:
        """Once the change is asked (its request stored), write as the scheduler would."""
        try:
            wait_for(asked, 30, "the set_priority request to be stored")
        except AssertionError as failure:  # reported by the test, after the command
            failures.append(failure)
            return
        if scheduler_writes:
            _set_row(engine, live.id, **scheduler_writes)

    writer = threading.Thread(target=scheduler)
    writer.start()
    try:
        run = cli("jobs", "set-priority", str(live.id), "3", "--db", url, "--wait", "3")
    finally:
        writer.join()
    assert not failures, f"{failures[0]}: {run}"
    assert run.code == code and "Traceback" not in run.stderr, run
    assert re.search(answer, (run.stderr or run.stdout).strip()), run


def test_apply_warns_of_a_notifier_that_cannot_be_imported(tmp_path: Path, quota_db: tuple[str, Engine]) -> None:
    url, engine = quota_db
    config = {**LIMIT_QUOTA, "alerts": {"notifiers": [{"class": "no_such_package.notify.Pager"}]}}
    path = write(tmp_path, config, "quota.yaml")
    run = cli("apply", str(path), "--db", url)
    assert run.code == 0 and "Traceback" not in run.stderr, run
    assert re.fullmatch(
        rf"{re.escape(str(path))}: warning: alerts\.notifiers\[0\]\.class: "
        r"cannot import no_such_package\.notify\.Pager: 'no_such_package' is not installed here; [^\n]+\n",
        run.stderr,
    ), run
    assert "stored as configuration version 2" in run.stdout, run
    assert QuotaStore(engine).latest_config() is not None
    validated = cli("validate", str(path))
    assert validated.code == 0 and "warning: alerts.notifiers[0].class: cannot import" in validated.stderr, validated


def test_an_instance_type_name_follows_the_name_rule(tmp_path: Path, quota_db: tuple[str, Engine]) -> None:
    url, engine = quota_db
    config = {**LIMIT_QUOTA, "instance_types": {"<script>x</script>": {"gpus": 1}}}
    path = write(tmp_path, config, "quota.yaml")
    assert_refused(
        cli("apply", str(path), "--db", url),
        [("instance_types['<script>x</script>']", r"should match pattern '\^\[\.A-Za-z0-9_-\]\{1,64\}\$'")],
        path,
    )
    assert stored_rows(engine) == (0, 1)


@pytest.mark.parametrize(
    ("value", "message"),
    [("{ml.g5: [0]", r"^--gpu-indices: not JSON: "), ('{"ml.g5.xlarge": "0"}', r"^--gpu-indices: must map")],
    ids=["not JSON", "not a mapping of lists"],
)
def test_the_schedulers_gpu_indices_are_checked_before_it_starts(
    tmp_path: Path, quota_db: tuple[str, Engine], value: str, message: str
) -> None:
    url, _ = quota_db
    run = cli("scheduler", "--db", url, "--state-dir", str(tmp_path / "state"), "--gpu-indices", value)
    assert run.code == 2 and "Traceback" not in run.stderr, run
    assert re.search(message, run.stderr.splitlines()[-1]), run


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["ml.nope.xlarge", "3"], "instance_type: 'ml.nope.xlarge' is not in the pool"),
        ([G5, "lots"], "available: 'lots' is not a whole number or 'unlimited'"),
        ([G5, "-1"], "available: -1 is negative"),
    ],
    ids=["a type outside the pool", "not a number", "negative"],
)
def test_provider_capacity_names_the_field_and_stores_nothing(
    quota_db: tuple[str, Engine], arguments: list[str], message: str
) -> None:
    url, engine = quota_db
    run = cli("provider", *arguments, "--db", url)
    assert run.code == 2 and "Traceback" not in run.stderr and message in run.stderr, run
    assert stored_rows(engine) == (0, 1)  # only the configuration's request


def test_provider_capacity_is_asked_of_the_scheduler(quota_db: tuple[str, Engine]) -> None:
    url, engine = quota_db
    run = cli("provider", G5, "unlimited", "--db", url)
    assert run.code == 0 and f"provider capacity of {G5}: unlimited" in run.stdout, run
    with engine.connect() as c:
        kinds = c.execute(select(Request.kind, Request.payload).order_by(Request.id)).all()
    assert kinds[-1] == ("provider", {"instance_type": G5, "available": None})


def test_production_knows_no_fake_backend(tmp_path: Path, quota_db: tuple[str, Engine], monkeypatch: Any) -> None:
    """Without the explicit test setting the store refuses a fake job (naming the field and how a
    test enables it) and ``airflow-quota scheduler`` registers only the real backends."""
    url, engine = quota_db
    monkeypatch.delenv(TEST_BACKENDS_VARIABLE)
    run = cli("jobs", "submit", str(write(tmp_path, job_file(), "job.yaml")), "--db", url)
    assert run.code == 2 and "Traceback" not in run.stderr, run
    assert (
        "backend: 'fake' is not one of local, sagemaker, airflow "
        f"(the fake backend is for tests: {TEST_BACKENDS_VARIABLE}=fake)" in run.stderr
    )
    assert stored_rows(engine) == (0, 1)
    monkeypatch.setenv(TEST_BACKENDS_VARIABLE, "fake,mock")
    run = cli("jobs", "submit", str(write(tmp_path, job_file(), "job.yaml")), "--db", url)
    assert run.code == 2 and f"{TEST_BACKENDS_VARIABLE}: mock: only fake can be enabled for tests" in run.stderr, run


@pytest.mark.parametrize(
    ("enabled", "backends"), [(None, "airflow, local, sagemaker"), ("fake", "airflow, fake, local, sagemaker")]
)
def test_the_scheduler_registers_the_fake_backend_only_when_enabled(
    quota_db: tuple[str, Engine], tmp_path: Path, enabled: str | None, backends: str
) -> None:
    url, _ = quota_db
    env = {k: v for k, v in os.environ.items() if k != TEST_BACKENDS_VARIABLE}
    if enabled is not None:
        env[TEST_BACKENDS_VARIABLE] = enabled
    command = [*CLI, "scheduler", "--db", url, "--state-dir", str(tmp_path / "state")]
    with subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env) as scheduler:
        assert scheduler.stderr is not None
        try:
            started = next((line for line in scheduler.stderr if "with backends" in line), "")
        finally:
            scheduler.terminate()
    assert started.rstrip().endswith(f"with backends {backends}"), started
