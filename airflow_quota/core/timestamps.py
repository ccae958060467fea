"""Points in time as quota.yaml and scenarios take them (a plan's ``starts_at`` and
``ends_at``, a scenario's ``start``): zoned, as Airflow users write ``start_date`` with pendulum.

A timestamp names its zone, by an offset or by a zone name, so that a plan window means the
same instant on every machine whatever its local zone:

- ``2026-12-01T09:00:00+01:00`` or ``2026-12-01T08:00:00Z``: ISO 8601 with an offset, parsed
  by pendulum (YAML's own timestamps, unquoted, are read the same way);
- ``2026-12-01T09:00:00 Europe/Paris``: a local time, a space, an IANA zone name; the zone's
  offset on that day applies (winter and summer time alike), as ``pendulum.datetime(...,
  tz="Europe/Paris")`` in a DAG.

A timestamp without a zone (``2026-12-01T09:00:00``, or a bare date) is refused naming the
rule: read as UTC by one machine and as local time by a person, it would silently move a plan
window by hours. Numbers are left to the field (a plan's seconds from the scenario's start).
"""

from __future__ import annotations

import re
from datetime import date, datetime
from typing import Annotated, Any

import pendulum
from pendulum.parsing.exceptions import ParserError
from pendulum.tz.exceptions import InvalidTimezone
from pydantic import BeforeValidator, ValidationInfo

ZONE_RULE = (
    "a timestamp needs a zone: an offset (2026-12-01T09:00:00+01:00, 2026-12-01T08:00:00Z) "
    "or a zone name after a space (2026-12-01T09:00:00 Europe/Paris)"
)
"""The rule, as every refusal states it."""

STORED = "stored"
"""The validation-context key of a configuration read back from the quota database's input
log (``{"stored": True}``): it was checked when applied, and one written before zones were
required may hold a timestamp without one, which is read as UTC, as it was then."""

_NUMBER = re.compile(r"^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$")


def parse_zoned(text: str) -> datetime:
    """A zoned timestamp (module docstring) as an aware ``datetime`` with a fixed offset;
    ValueError naming the rule for anything else."""
    shown = repr(text[:40]) if len(text) <= 40 else repr(text[:40])[:-1] + "...'"
    local, _, zone_name = text.strip().rpartition(" ")
    zone = _zone(zone_name) if local else None
    try:
        parsed = pendulum.parse(local if zone else text.strip(), tz=None)
    except (ParserError, ValueError):
        raise ValueError(f"{shown} is not an ISO 8601 timestamp; {ZONE_RULE}") from None
    if not isinstance(parsed, pendulum.DateTime):
        raise ValueError(f"{shown} is not a timestamp; {ZONE_RULE}")
    if zone is not None:
        if parsed.tzinfo is not None:
            raise ValueError(f"{shown} gives both an offset and a zone name: give one")
        parsed = pendulum.parse(local, tz=zone)
        assert isinstance(parsed, pendulum.DateTime)  # the same text parsed a moment ago
    if parsed.tzinfo is None:
        raise ValueError(f"{shown} has no zone; {ZONE_RULE}")
    return datetime.fromisoformat(parsed.isoformat())  # a plain datetime: pickled, dumped as before


def _zone(name: str) -> pendulum.Timezone | None:
    """The IANA zone of that name (``Europe/Paris``, ``UTC``), or None when it names none."""
    if not name or not name[0].isalpha():
        return None
    try:
        return pendulum.timezone(name)
    except (InvalidTimezone, ValueError):
        return None


def zoned(value: Any, info: ValidationInfo) -> Any:
    """The pydantic before-validator of a point in time: text is parsed by ``parse_zoned``; a
    naive ``datetime`` or a bare ``date`` (YAML's unquoted ``2026-12-01 09:00:00``,
    ``2026-12-01``) is refused, unless the configuration is a stored one (``STORED``); a
    number, or text that is one, is left to the field as before."""
    stored = bool(info.context and info.context.get(STORED))
    if isinstance(value, str) and not _NUMBER.match(value):
        if stored:
            try:
                return parse_zoned(value)
            except ValueError:
                return value  # checked when it was applied: read as it was then
        return parse_zoned(value)
    if isinstance(value, datetime):
        if value.tzinfo is None and not stored:
            raise ValueError(f"{value.isoformat()} has no zone; {ZONE_RULE}")
    elif isinstance(value, date) and not stored:
        raise ValueError(f"{value.isoformat()} is a date without a time or zone; {ZONE_RULE}")
    return value


ZonedDatetime = Annotated[datetime, BeforeValidator(zoned)]
"""An aware point in time (module docstring)."""
