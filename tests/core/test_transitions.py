"""One writer of a job's state (``core/lifecycle.py``), along one table (``TRANSITIONS``).

The source of every other module of the core is read for a write of a job's ``state`` or
``attempts``; the table is checked against the model's states (docs/model.md rule 3.1); and a
move the table does not hold is refused. The property and scenario tests run every move the
core makes through ``Lifecycle.move``, so a move outside the table fails them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from airflow_quota.core import lifecycle
from airflow_quota.core.lifecycle import TRANSITIONS, IllegalTransition, Lifecycle
from airflow_quota.core.model import Entry, Job, JobState
from tests.builders import request

CORE = Path(lifecycle.__file__).parent
WRITTEN_ONLY_BY_THE_LIFECYCLE = {"state", "attempts"}


def make_job(state: JobState = JobState.SUBMITTED) -> Job:
    return Job(1, "j", "research", 1, (Entry("ml.g5.xlarge", 1),), request("j"), 0.0, state=state)


def writes(source: str) -> list[str]:
    """Where the source writes ``<something>.state`` with a ``JobState``, or ``<something>.attempts``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.Assign, ast.AugAssign)):
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for target in targets:
            if not isinstance(target, ast.Attribute) or target.attr not in WRITTEN_ONLY_BY_THE_LIFECYCLE:
                continue
            if target.attr == "state" and "JobState" not in ast.unparse(node.value):
                continue  # ``self.state = QuotaState(...)``: the quota state, not a job's
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize(
    "path",
    [path for path in sorted(CORE.rglob("*.py")) if path.name != "lifecycle.py"],
    ids=lambda path: str(path.relative_to(CORE)),
)
def test_only_the_lifecycle_writes_a_jobs_state(path: Path) -> None:
    assert writes(path.read_text()) == []


def test_the_check_finds_a_write() -> None:
    assert writes("job.state = JobState.RUNNING\n")
    assert writes("job.attempts -= 1\n")
    assert not writes("self.state = QuotaState(config)\n")


def test_the_table_covers_every_state_and_ends_in_the_final_ones() -> None:
    assert set(TRANSITIONS) == set(JobState)
    for state, targets in TRANSITIONS.items():
        assert bool(targets) != state.is_final, f"{state.value}: only a final state goes nowhere"
        assert JobState.SUBMITTED not in targets, "nothing goes back to SUBMITTED"


@pytest.mark.parametrize(
    ("start", "to"),
    [
        (JobState.FAILED, JobState.RUNNABLE),
        (JobState.SUCCEEDED, JobState.FAILED),
        (JobState.RUNNABLE, JobState.RUNNING),
        (JobState.SUBMITTED, JobState.SCHEDULED),
    ],
)
def test_a_move_outside_the_table_is_refused(start: JobState, to: JobState) -> None:
    job = make_job(start)
    with pytest.raises(IllegalTransition, match=f"from {start.value} to {to.value}"):
        Lifecycle.move(job, to)
    assert job.state is start


def test_a_move_in_the_table_is_made() -> None:
    job = make_job()
    Lifecycle.move(job, JobState.RUNNABLE)
    assert job.state is JobState.RUNNABLE
