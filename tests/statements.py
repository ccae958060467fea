"""The statements a block runs on an engine, for tests that count the database's work."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, event


@contextmanager
def statements_run(engine: Engine, kept: Callable[[str], bool]) -> Iterator[list[str]]:
    """The statements run on ``engine`` while the block runs, those ``kept`` keeps, in order."""
    seen: list[str] = []

    def _seen(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if kept(statement):
            seen.append(statement)

    event.listen(engine, "before_cursor_execute", _seen)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", _seen)
