"""The rules (``core/rules/``) hold no memo, no cache and write no state: the promise that lets a
newcomer read a rule as the model states it, and the full-scan index ask them of every job.

Checked on the source: no attribute or global is assigned, no cache decorator is used, nothing
mutable is kept at module level, and no method that changes the state, the queues or a job's
lifecycle is called.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from airflow_quota.core import rules
from airflow_quota.core.lifecycle import Lifecycle
from airflow_quota.core.queues import ShareQueue

RULES = sorted(Path(rules.__file__).parent.glob("*.py"))

WRITERS = (
    {name for name, _ in inspect.getmembers(Lifecycle, inspect.isfunction) if not name.startswith("__")}
    | {"enqueue", "dequeue", "take", "give_back", "final_jobs_forget", "load_config", "change_usage", "recompute"}
    | {name for name in vars(ShareQueue) if name.startswith(("add_", "remove_", "set_", "take_"))}
) - {"next_timer", "ready"}
"""What changes the state: the lifecycle's methods (but its two questions), the state's and the
ledgers' primitive changes, and the queues' updates."""


MUTATORS = {"add", "append", "extend", "update", "setdefault", "pop", "popitem", "clear", "remove", "discard", "insert"}


def _mutable(value: ast.expr) -> bool:
    """A list or set (a dict literal is a constant table), or a call making a container."""
    if isinstance(value, (ast.List, ast.Set, ast.ListComp, ast.SetComp)):
        return True
    return isinstance(value, ast.Call) and ast.unparse(value.func).split(".")[-1] in CONTAINERS


CONTAINERS = {"set", "list", "dict", "defaultdict", "deque", "OrderedDict", "Counter", "SortedList", "SortedDict"}


def _names(node: ast.expr) -> set[str]:
    return {part.id for part in ast.walk(node) if isinstance(part, ast.Name)}


def problems(source: str) -> list[str]:
    found = []
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for part in ast.walk(target):
                    if isinstance(part, ast.Attribute) and isinstance(part.ctx, ast.Store):
                        found.append(f"line {node.lineno}: assigns an attribute ({ast.unparse(part)})")
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            found.append(f"line {node.lineno}: {type(node).__name__.lower()} {', '.join(node.names)}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in WRITERS:
            found.append(f"line {node.lineno}: calls {node.func.attr}(), which changes the state")
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            for decorator in node.decorator_list:
                if "cache" in ast.unparse(decorator):
                    found.append(f"line {node.lineno}: {node.name} is cached ({ast.unparse(decorator)})")
    kept = set()
    for statement in tree.body:
        if isinstance(statement, (ast.Assign, ast.AnnAssign)) and statement.value is not None:
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            names = {target.id for target in targets if isinstance(target, ast.Name)}
            kept |= names - {"__all__"}
            if names != {"__all__"} and _mutable(statement.value):
                found.append(f"line {statement.lineno}: a mutable value kept at module level")
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store) and _names(node.value) & kept:
            found.append(f"line {node.lineno}: writes into {ast.unparse(node.value)}, kept at module level")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in MUTATORS
            and _names(node.func.value) & kept
        ):
            found.append(f"line {node.lineno}: {ast.unparse(node.func)}() changes a value kept at module level")
    return found


@pytest.mark.parametrize("path", RULES, ids=lambda path: path.name)
def test_a_rules_file_holds_no_state(path: Path) -> None:
    assert problems(path.read_text()) == []


@pytest.mark.parametrize(
    "sabotage",
    [
        "def f(job):\n    job.priority = 0\n",
        "def f(state, job):\n    state.dequeue(job)\n",
        "import functools\n@functools.cache\ndef f(x):\n    return x\n",
        "SEEN = set()\n",
        "TABLE = {}\ndef f(job):\n    TABLE[job.seq] = job\n",
        "TABLE = {}\ndef f(job):\n    TABLE.setdefault(job.seq, job)\n",
        "def f():\n    global SEEN\n",
        "def f(life, job, entry, now):\n    life.place(job, entry, 0, now, 'why')\n",
    ],
)
def test_the_check_finds_state_written(sabotage: str) -> None:
    assert problems(sabotage)
