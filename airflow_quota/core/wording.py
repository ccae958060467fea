"""How bad input about a job is worded, once for every way a job comes in (a job file, the
operator's arguments, ``executor_config["quota"]``, a scenario's submission): in the project's
own words, naming every offending entry, never the validation library's phrasing."""

from __future__ import annotations

import difflib
from collections.abc import Collection, Iterable

MAX_PREFERENCES = 5
"""How many instance types one job may list (docs/model.md rule 2.1), as SageMaker allows."""


def too_many_preferences(count: int) -> str:
    """A preference list longer than ``MAX_PREFERENCES``: how many it has and the limit."""
    return f"{count} instance types listed; a job lists at most {MAX_PREFERENCES}"


def not_in_pool(types: Iterable[str], pool_types: Collection[str]) -> str | None:
    """The listed types the pool does not have, all named, with the pool's own types: ``ml.x,
    ml.y are not in the pool (its types: ...)``; None when every type is in the pool. Said
    before any capacity arithmetic: a type outside the pool has no capacity to compare with."""
    missing = list(dict.fromkeys(t for t in types if t not in pool_types))
    if not missing:
        return None
    verb = "is" if len(missing) == 1 else "are"
    has = ", ".join(sorted(pool_types)) or "none"
    return f"{', '.join(missing)} {verb} not in the pool (its types: {has})"


def unknown_name(given: str, accepted: Iterable[str], kind: str = "field") -> str:
    """A keyword or key that is none of ``accepted``: the accepted ones listed, and the closest
    one (``difflib``) offered first as "did you mean" when there is one."""
    known = list(accepted)
    close = difflib.get_close_matches(given, known, n=1)
    listed = ", ".join(known)
    if close:
        return f"unknown {kind}; did you mean {close[0]!r}? The known ones are {listed}"
    return f"unknown {kind}; the known ones are {listed}"
