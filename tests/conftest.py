"""Shared helpers: running the real command line, and the scenario files the tests replay."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import pytest
from hypothesis import settings

from airflow_quota.store.backend_names import TEST_BACKENDS_VARIABLE

# CI replays the same examples on every run (a red build then means the change broke something,
# not that a new example turned up); HYPOTHESIS_PROFILE=explore draws new ones on each run.
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

TIMED_FILES = frozenset(
    {"tests/service/test_crash_recovery.py", "tests/service/test_soak.py", "tests/service/test_database_faults.py"}
)
"""Tests that assert how soon a standby takes over or a leader recovers: ``make test`` runs them
on their own after the others (marker ``timed``), so the workers' load cannot stretch them."""
LONGEST_FIRST = (
    "tests/test_demo.py",
    "tests/airflow/test_end_to_end.py",
    "tests/airflow/test_executor_end_to_end.py",
    "tests/airflow/test_executor_celery_end_to_end.py",
    "tests/airflow/test_install_page.py",
    "tests/core/test_properties.py",
    "tests/service/test_cli_service.py",
)
"""Files that take minutes: started first, so the workers finish together (each file stays whole
on one worker, in its own order)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def file_of(item: pytest.Item) -> str:
        return Path(item.fspath).resolve().relative_to(ROOT).as_posix()

    for item in items:
        if file_of(item) in TIMED_FILES:
            item.add_marker(pytest.mark.timed)
    rank = {name: index for index, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(file_of(item), len(rank)))  # stable: a file keeps its order


# The deterministic fake backend exists only where a test configuration enables it explicitly
# (store/backend_names.py): here, for the tests and every process they start.
os.environ[TEST_BACKENDS_VARIABLE] = "fake"

ROOT = Path(__file__).resolve().parent.parent
IN_CI = os.environ.get("CI", "").lower() == "true"
"""Under ``CI=true`` (``.ci/run`` sets it) a missing part the Makefile installs fails the test."""


def missing(reason: str) -> NoReturn:
    """A part of the test stack is not here: skip on a developer's machine, fail in CI, where
    ``make test`` installs PostgreSQL and Chromium and a skip would hide a suite that never ran."""
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: a missing part fails rather than skips)")
    pytest.skip(reason)


SCENARIOS = sorted((ROOT / "tests" / "scenarios").glob("*.yaml"))
"""Every scenario file of tests/scenarios, each checking rules of docs/model.md (its header says
which) through its ``expect`` block."""
CLI = [sys.executable, "-m", "airflow_quota.cli"]


@dataclass
class Run:
    code: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)


def cli(*args: str, cwd: Path | None = None) -> Run:
    """Run ``airflow-quota`` as a user would, in a subprocess."""
    env = dict(os.environ, PYTHONHASHSEED="0")
    done = subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300)
    return Run(done.returncode, done.stdout, done.stderr)
