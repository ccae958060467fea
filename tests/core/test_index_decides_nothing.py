"""An index only offers candidates (docs/contributing.md, "Adding a rule"): the source of
``core/index/`` is read for any call that checks an entry, looks for victims or changes a job,
which belong to the rules (``core/rules/``) and to ``core/steps.py``'s ``run_step``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from airflow_quota.core import index

INDEX = Path(index.__file__).parent
DECIDING_CALLS = {
    "check",
    "placement_check",
    "assess",
    "find_victims",
    "place",
    "preempt",
    "fail",
    "dequeue",
    "enqueue",
    "move",
}
"""Calls that decide or apply: the placement check, a verdict, the victim oracle, a lifecycle move."""


def deciding_calls(source: str) -> list[str]:
    """Where the source calls one of ``DECIDING_CALLS``, as a name or an attribute."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
        if name in DECIDING_CALLS:
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize("path", sorted(INDEX.rglob("*.py")), ids=lambda path: path.name)
def test_an_index_decides_nothing(path: Path) -> None:
    assert deciding_calls(path.read_text()) == []


@pytest.mark.parametrize(
    "source",
    [
        "state.check(job, entry, Mode.BORROW, now)\n",
        "placement_check(state, job, entry, Mode.BORROW, now)\n",
        "victims = find_victims(state, job, entry, now)\n",
        "self.life.place(job, entry, 0, now, 'because')\n",
        "life.preempt(job, entry, [], now)\n",
        "verdict = assess(job, step, state, now)\n",
    ],
)
def test_the_reading_finds_a_deciding_call(source: str) -> None:
    assert deciding_calls(source)
