"""The core stays readable top-down (issue 15): no function of ``airflow_quota/core`` runs
over 60 lines, docstring included."""

from __future__ import annotations

import ast
from pathlib import Path

import airflow_quota.core

MOST_LINES = 60


def long_functions(most: int) -> list[str]:
    """``module:function (lines)`` of every function of the core longer than ``most`` lines."""
    found = []
    for path in sorted(Path(airflow_quota.core.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > most:
                    found.append(f"{path.name}:{node.name} ({lines} lines)")
    return found


def test_no_core_function_is_over_60_lines() -> None:
    assert long_functions(MOST_LINES) == []


def test_the_count_reads_the_core_s_functions() -> None:
    """The check reads the real modules: with a low limit it finds many, the cycle's among them."""
    short = long_functions(10)
    assert len(short) > 20
    assert any(name.startswith("cycle.py:") for name in short)
