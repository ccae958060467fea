"""Trace importers: a cluster's job log turned into the simulator's submissions.

Two formats, named on the command line as ``FORMAT:PATH``:

``itp:PATH``
    The Microsoft ITP trace (ElasticFlow raw traces): one CSV per cluster with the header
    ``job_id,submission_time,duration,num_gpu``. PATH is one such file or a directory of them
    (every ``*.csv`` in name order). Each cluster is a tenant named after its file
    (``cluster04.csv`` → share ``cluster04``); the files share one time origin.
``csv:PATH``
    Any CSV with a header, read through a column mapping (``--columns``): which column holds
    the submit time, the duration, the GPU count and the tenant, and optionally the priority,
    the instance type and the job name. PATH is a file or a directory of ``*.csv`` files.

A column mapping is ``field=column`` pairs separated by commas::

    --columns submit=submitted,duration=runtime_s,gpus=gpu_count,tenant=team,priority=prio

or ``@mapping.yaml``, a YAML mapping with the same keys (``submit: submitted``...).

Submit times are seconds (any origin) or ISO 8601 timestamps; either way t=0 of the
simulation is the trace's first submission. Rows become ``SimJob`` submissions against a quota
configuration (``trace_scenario``), in submit-time order (ties in file order): the tenant is
the share; the instance type is the row's, else the pool's only type, else the
share's only accelerated type; a job asking for more GPUs than one instance has gets
``ceil(gpus / GPUs per instance)`` instances. A row that cannot be read or mapped is a
``Problem`` naming ``file:line``, the field, the value and the rule: by default the trace is
refused (exit status 2), with ``skip_bad_rows`` the row is skipped and reported.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from airflow_quota.core.config import NAME_PATTERN, QuotaConfig, load_file
from airflow_quota.core.model import PreferenceEntry
from airflow_quota.exceptions import InvalidInput, Problem, join_path
from airflow_quota.sim.scenario import EPOCH, Event, LoadedScenario, ProviderState, SimJob

FORMATS = ("itp", "csv")
ITP_COLUMNS = ("job_id", "submission_time", "duration", "num_gpu")
REQUIRED_FIELDS = ("submit", "duration", "gpus", "tenant")
OPTIONAL_FIELDS = ("priority", "instance_type", "name")
MAX_LISTED = 20
"""Bad rows listed one by one; the rest are counted in one line."""

_NAME = re.compile(NAME_PATTERN)


@dataclass(frozen=True, slots=True)
class ColumnMap:
    """Which CSV column holds each field of a trace row (None: the trace has no such column)."""

    submit: str
    duration: str
    gpus: str
    tenant: str
    priority: str | None = None
    instance_type: str | None = None
    name: str | None = None

    def columns(self) -> dict[str, str]:
        """field → column, for the fields the mapping gives."""
        fields = (*REQUIRED_FIELDS, *OPTIONAL_FIELDS)
        return {f: getattr(self, f) for f in fields if getattr(self, f) is not None}


ITP_MAP = ColumnMap(submit="submission_time", duration="duration", gpus="num_gpu", tenant="", name="job_id")
"""The ITP trace's columns; its tenant is the file's name, not a column."""


@dataclass(frozen=True, slots=True)
class TraceRow:
    """One job of a trace, read and checked on its own (not yet against a configuration)."""

    where: str
    """``file:line``, for messages."""
    name: str
    submit: float
    """Seconds from the trace's first submission (t=0 of the simulation)."""
    duration: float
    gpus: int
    tenant: str
    priority: int = 0
    instance_type: str | None = None


@dataclass(frozen=True, slots=True)
class Trace:
    """The readable rows of a trace in submission order, and what could not be read."""

    spec: str
    rows: list[TraceRow]
    problems: list[Problem]
    start: datetime = EPOCH
    """The instant of t=0 when the trace gives timestamps (its first submission)."""


@dataclass(frozen=True, slots=True)
class TraceJobs:
    """A trace mapped onto one configuration: the scenario, and the rows that were skipped."""

    scenario: LoadedScenario
    tenant_of: dict[str, str]
    """job name → its tenant in the trace (the share it was submitted to may differ: open pool)."""
    skipped: list[Problem]


def parse_spec(spec: str) -> tuple[str, Path]:
    """``FORMAT:PATH`` → (format, path); an unknown format or a missing path is InvalidInput."""
    fmt, sep, path = spec.partition(":")
    if not sep or fmt not in FORMATS or not path:
        raise InvalidInput.single(
            "--trace", f"{spec!r} must be FORMAT:PATH with FORMAT one of {', '.join(FORMATS)} (e.g. itp:traces/)"
        )
    return fmt, Path(path)


def parse_columns(text: str) -> ColumnMap:
    """A column mapping: ``field=column,...`` or ``@file.yaml``; every problem reported at once
    (those of a file in that file)."""
    if text.startswith("@"):
        return load_file(Path(text[1:]), "trace fields to column names (field: column)", _column_map)
    raw = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        field, sep, column = part.partition("=")
        if not sep or not field.strip() or not column.strip():
            raise InvalidInput.single("--columns", f"{part!r} must be field=column (e.g. gpus=num_gpu)")
        raw[field.strip()] = column.strip()
    return _column_map(raw, "--columns")


def _column_map(raw: Mapping[str, Any], where: str = "") -> ColumnMap:
    known = (*REQUIRED_FIELDS, *OPTIONAL_FIELDS)
    problems = [
        Problem(join_path(where, str(k)), f"unknown field; the fields are {', '.join(known)}")
        for k in raw
        if k not in known
    ]
    problems += [
        Problem(join_path(where, k), "required field is missing (the column that holds it)")
        for k in REQUIRED_FIELDS
        if k not in raw
    ]
    problems += [
        Problem(join_path(where, str(k)), "must be a column name") for k, v in raw.items() if not isinstance(v, str)
    ]
    if problems:
        raise InvalidInput(problems)
    return ColumnMap(**{k: v for k, v in raw.items()})


def read_trace(spec: str, columns: ColumnMap | None = None) -> Trace:
    """Read every row of a trace given as ``FORMAT:PATH``; rows that cannot be read are kept as
    problems. A file that cannot be opened, or whose header lacks a mapped column, is refused
    at once: no row of it could be read."""
    fmt, path = parse_spec(spec)
    if fmt == "itp" and columns is not None:
        raise InvalidInput.single("--columns", "the itp format has fixed columns; --columns is for csv")
    if fmt == "csv" and columns is None:
        raise InvalidInput.single("--columns", "the csv format needs a column mapping (see --help)")
    mapping = ITP_MAP if fmt == "itp" else columns
    assert mapping is not None
    rows: list[TraceRow] = []
    problems: list[Problem] = []
    stamped: list[tuple[TraceRow, datetime]] = []
    names: dict[str, str] = {}
    for file in _files(path):
        tenant = file.stem if fmt == "itp" else None
        for row in _read_file(file, mapping, tenant, problems, stamped):
            first = names.setdefault(row.name, row.where)
            if first != row.where:
                problems.append(Problem(row.where, f"name={row.name!r}: job names must be unique; {first} has it"))
                continue
            rows.append(row)
    start = EPOCH
    if stamped:
        if len(stamped) != len(rows):
            raise InvalidInput.single(str(path), "submit times mix timestamps and seconds; use one or the other")
        start = min(when for _, when in stamped)
        rows = [_at(row, (when - start).total_seconds()) for row, when in stamped]
    elif rows:
        # t=0 is the first submission: the simulator measures capacity from t=0, so a trace
        # in epoch seconds would otherwise count decades of idle capacity
        origin = min(row.submit for row in rows)
        rows = [_at(row, row.submit - origin) for row in rows]
    order = {id(row): i for i, row in enumerate(rows)}
    rows.sort(key=lambda r: (r.submit, order[id(r)]))
    return Trace(spec, rows, problems, start)


def _at(row: TraceRow, submit: float) -> TraceRow:
    return TraceRow(row.where, row.name, submit, row.duration, row.gpus, row.tenant, row.priority, row.instance_type)


def _files(path: Path) -> list[Path]:
    if path.is_dir():
        files = sorted(path.glob("*.csv"))
        if not files:
            raise InvalidInput.single(str(path), "the directory holds no *.csv file")
        return files
    if not path.exists():
        raise InvalidInput.single(str(path), "no such file or directory")
    return [path]


def _read_file(
    file: Path,
    mapping: ColumnMap,
    tenant: str | None,
    problems: list[Problem],
    stamped: list[tuple[TraceRow, datetime]],
) -> Iterator[TraceRow]:
    """The readable rows of one CSV file; a problem per unreadable row."""
    try:
        handle = file.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise InvalidInput.single(str(file), f"cannot read the file: {exc.strerror}") from None
    with handle:
        reader = csv.reader(handle)
        try:
            header = next(reader, None)
        except (csv.Error, UnicodeDecodeError) as exc:
            raise InvalidInput.single(f"{file}:1", f"not a CSV header: {exc}") from None
        wanted = mapping.columns()
        if tenant is not None:
            wanted.pop("tenant", None)
        if header is None:
            expected = ITP_COLUMNS if tenant is not None else tuple(wanted.values())
            raise InvalidInput.single(
                f"{file}:1", f"the file is empty: expected a header with the columns {', '.join(expected)}"
            )
        header = [h.strip() for h in header]
        missing = [f"{c} ({f})" for f, c in wanted.items() if c not in header]
        if missing:
            raise InvalidInput.single(
                f"{file}:1", f"no column {', '.join(missing)} in the header; it has: {', '.join(header)}"
            )
        index = {f: header.index(c) for f, c in wanted.items()}
        width = len(header)
        line = 1
        while True:
            try:
                cells = next(reader)
            except StopIteration:
                break
            except (csv.Error, UnicodeDecodeError) as exc:
                line += 1
                problems.append(Problem(f"{file}:{line}", f"not a CSV row: {exc}"))
                continue
            line = reader.line_num
            if not cells or all(not c.strip() for c in cells):
                continue  # a blank line
            where = f"{file}:{line}"
            if len(cells) != width:
                problems.append(
                    Problem(where, f"{len(cells)} fields where the header has {width} ({', '.join(header)})")
                )
                continue
            try:
                row, when = _row(cells, index, mapping, where, tenant, file.stem, line)
            except _BadField as bad:
                problems.append(Problem(where, str(bad)))
                continue
            if when is not None:
                stamped.append((row, when))
            yield row


class _BadField(Exception):
    """A field of one row breaks a rule: ``column=value: rule``."""


def _row(
    cells: list[str],
    index: dict[str, int],
    mapping: ColumnMap,
    where: str,
    tenant: str | None,
    stem: str,
    line: int,
) -> tuple[TraceRow, datetime | None]:
    def cell(field: str) -> str:
        return cells[index[field]].strip()

    def bad(field: str, rule: str) -> _BadField:
        return _BadField(f"{getattr(mapping, field)}={cell(field)!r}: {rule}")

    submit_text = cell("submit")
    when: datetime | None = None
    try:
        submit = float(submit_text)
    except ValueError:
        try:
            when = datetime.fromisoformat(submit_text.replace("Z", "+00:00"))
        except ValueError:
            raise bad("submit", "must be seconds (a number) or an ISO 8601 timestamp") from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=timezone.utc)
        submit = 0.0
    if not math.isfinite(submit) or submit < 0:
        raise bad("submit", "must be ≥ 0 seconds")
    duration = _number(cell("duration"))
    if duration is None or not duration > 0:
        raise bad("duration", "must be a number of seconds > 0")
    gpus = _integer(cell("gpus"))
    if gpus is None or gpus < 1:
        raise bad("gpus", "must be an integer ≥ 1 (GPUs the job asks for)")
    if tenant is None:
        tenant = cell("tenant")
        if not tenant:
            raise bad("tenant", "must not be empty (it names the job's share)")
    priority = 0
    if mapping.priority is not None and cell("priority"):
        value = _integer(cell("priority"))
        if value is None or not 0 <= value <= 9999:
            raise bad("priority", "must be an integer from 0 to 9999")
        priority = value
    instance_type = (cell("instance_type") or None) if mapping.instance_type is not None else None
    name = cell("name") if mapping.name is not None else f"{stem}-{line}"
    if not _NAME.match(name):
        raise bad("name", "a job name is 1-128 letters, digits, '-' or '_'")
    return TraceRow(where, name, submit, duration, gpus, tenant, priority, instance_type), when


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _integer(text: str) -> int | None:
    value = _number(text)
    if value is None or value != int(value):
        return None
    return int(value)


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a row's job goes under one configuration: its share and its one preference entry."""

    row: TraceRow
    share: str
    instance_type: str
    count: int


def map_rows(
    trace: Trace,
    config: QuotaConfig,
    share_of: Callable[[str], str] | None = None,
    types_from: QuotaConfig | None = None,
) -> tuple[list[Placement], list[Problem]]:
    """Each readable row's share and entry under ``config``; a problem for each row that cannot
    be mapped (no such share, an unknown type or one the pool lacks, a type without GPUs),
    after the rows that could not be read.

    A row without an instance type gets the default of its tenant's share in ``types_from``
    when given (so that a job asks for the same type under every policy compared, the open
    pool's single share included), else of the share it goes to."""
    problems = list(trace.problems)
    catalogue = config.catalogue()
    capacity = config.pool.capacity
    shares = {s.name for s in config.shares}
    types: dict[str, str | Problem] = {}
    placed: list[Placement] = []
    for row in trace.rows:
        share_name = share_of(row.tenant) if share_of is not None else row.tenant
        if share_name not in shares:
            problems.append(Problem(row.where, f"tenant={row.tenant!r}: no share named {share_name!r} in the quota"))
            continue
        instance_type = row.instance_type
        if instance_type is None:
            owner = row.tenant if types_from is not None else share_name
            chosen = types.get(owner)
            if chosen is None:
                chosen = types[owner] = _default_type(types_from or config, owner)
            if isinstance(chosen, Problem):
                problems.append(Problem(row.where, chosen.message))
                continue
            instance_type = chosen
        spec = catalogue.get(instance_type)
        if spec is None:
            problems.append(Problem(row.where, f"instance_type={instance_type!r}: unknown instance type"))
        elif instance_type not in capacity:
            problems.append(Problem(row.where, f"instance_type={instance_type!r}: not in the pool (pool.capacity)"))
        elif spec.gpus < 1:
            problems.append(Problem(row.where, f"instance_type={instance_type!r}: has no GPU; the trace asks GPUs"))
        else:
            placed.append(Placement(row, share_name, instance_type, math.ceil(row.gpus / spec.gpus)))
    return placed, problems


def trace_scenario(
    trace: Trace,
    config: QuotaConfig,
    *,
    skip_bad_rows: bool = False,
    share_of: Callable[[str], str] | None = None,
    types_from: QuotaConfig | None = None,
    checkpoint_interval: float | None = None,
) -> TraceJobs:
    """The trace as a scenario on ``config``: one submission per row, at its submit time.

    ``share_of`` maps a tenant to the share its jobs go to (default: the share of that name);
    ``types_from`` is where a row without an instance type finds its default (see map_rows).
    Rows that cannot be read or mapped refuse the whole trace (InvalidInput listing them),
    unless ``skip_bad_rows``: then they are left out and returned in ``skipped``.
    """
    placed, problems = map_rows(trace, config, share_of, types_from)
    if problems and not skip_bad_rows:
        raise InvalidInput(listed(problems))
    if not placed:
        raise InvalidInput.single(trace.spec, "the trace holds no job that can be replayed")
    events: list[Event] = []
    tenant_of: dict[str, str] = {}
    for p in placed:
        # validated above, field by field: model_construct skips pydantic's second look
        job = SimJob.model_construct(
            name=p.row.name,
            share=p.share,
            priority=p.row.priority,
            preferences=[_entry(p.instance_type, p.count)],
            duration=p.row.duration,
            checkpoint_interval=checkpoint_interval,
            failures=[],  # given, not defaulted: a default_factory costs pydantic a signature parse
        )
        events.append(Event.model_construct(at=p.row.submit, submit=job))
        tenant_of[p.row.name] = p.row.tenant
    scenario = LoadedScenario.model_construct(start=trace.start, config=config, provider=ProviderState(), events=events)
    return TraceJobs(scenario, tenant_of, problems)


def _entry(instance_type: str, count: int) -> PreferenceEntry:
    return PreferenceEntry.model_construct(instance_type=instance_type, count=count, training_plan=None)


def _default_type(config: QuotaConfig, share: str) -> str | Problem:
    """The type of a row that names none: the pool's only type, else the share's only
    accelerated type."""
    if len(config.pool.capacity) == 1:
        return next(iter(config.pool.capacity))
    catalogue = config.catalogue()
    found = config.share(share)
    limits = found.capacity_limits if found is not None else {}
    accelerated = [t for t in limits if catalogue[t].accelerated]
    if len(accelerated) == 1:
        return accelerated[0]
    return Problem(
        "",
        f"the row names no instance type and share {share!r} has {len(accelerated)} accelerated types "
        f"(the pool has {len(config.pool.capacity)}): map an instance_type column",
    )


def listed(problems: list[Problem], limit: int = MAX_LISTED) -> list[Problem]:
    """The first ``limit`` problems and one line counting the rest."""
    if len(problems) <= limit:
        return problems
    return [*problems[:limit], Problem("", f"… and {len(problems) - limit:,} more bad rows")]
