"""The quota configuration (docs/model.md section 1): pydantic models, YAML loading and the
rules that span fields, every problem reported at once with its path.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from datetime import date, datetime, timezone
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from airflow_quota.core.access import ShareAccess
from airflow_quota.core.catalogue import InstanceTypeSpec, builtin_catalogue
from airflow_quota.core.timestamps import STORED, zoned
from airflow_quota.exceptions import InvalidInput, Problem, join_path

NAME_CHARACTERS = "A-Za-z0-9_-"
"""The name rule: letters, digits, ``_`` and ``-`` (share, job, plan and notifier names; with
``.`` added, instance-type names). Nothing a page or a log line could misread: no spaces,
markup or line breaks."""
NAME_MAX_LENGTH = 128
INSTANCE_TYPE_MAX_LENGTH = 64
"""Instance-type names are shorter (the store's column): AWS's are at most 24 characters."""


def name_pattern(max_length: int = NAME_MAX_LENGTH, dots: bool = False) -> str:
    """The regex of the name rule (``NAME_CHARACTERS``, 1 to ``max_length`` of them); ``dots``
    allows ``.`` too, as instance types have (``ml.g5.xlarge``)."""
    return f"^[{'.' if dots else ''}{NAME_CHARACTERS}]{{1,{max_length}}}$"


NAME_PATTERN = name_pattern()
INSTANCE_TYPE_PATTERN = name_pattern(INSTANCE_TYPE_MAX_LENGTH, dots=True)
PositiveInt = Annotated[int, Field(ge=1, strict=True)]
Name = Annotated[str, Field(pattern=NAME_PATTERN, strict=True)]
InstanceTypeName = Annotated[str, Field(pattern=INSTANCE_TYPE_PATTERN, strict=True)]
"""An instance type: the name rule with dots; whether it is known is checked against the catalogue."""


def at_most(limit: int) -> AfterValidator:
    """A text of at most ``limit`` characters; longer is refused naming the limit and the
    length (``at most 250 characters (got 300000)``), never echoing the text."""

    def check(value: str) -> str:
        if len(value) > limit:
            raise ValueError(f"at most {limit} characters (got {len(value)})")
        return value

    return AfterValidator(check)


URI_MAX_LENGTH = 2048
"""``checkpoint_uri``, a plan's ``arn``: S3 keys are at most 1024 bytes, URLs in practice 2048."""
Uri = Annotated[str, Field(strict=True), at_most(URI_MAX_LENGTH)]
Instant = Annotated[datetime | float, BeforeValidator(zoned)]
"""A point in time: a zoned timestamp (``core.timestamps``: ``2026-12-01T09:00:00+01:00``,
``2026-12-01T09:00:00 Europe/Paris``), or seconds from the scheduler's origin."""


class Strategy(str, Enum):
    RESERVE = "RESERVE"
    LEND = "LEND"
    LEND_AND_BORROW = "LEND_AND_BORROW"


class ShareState(str, Enum):
    ENABLED = "ENABLED"
    DISABLED = "DISABLED"


class _Model(BaseModel):
    """Configuration models: unknown keys refused; no infinite or NaN numbers (a
    configuration is stored as JSON, which has neither)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class TrainingPlan(_Model):
    """Reserved capacity, usable only by preference entries that name the plan, in its window."""

    name: Name
    arn: Uri | None = None
    instance_type: InstanceTypeName
    count: PositiveInt
    starts_at: Instant
    ends_at: Instant
    hourly_price: float = Field(default=0.0, ge=0)


class Pool(_Model):
    """What may run at once (AWS: the service environment)."""

    capacity: dict[InstanceTypeName, PositiveInt] = Field(min_length=1)
    training_plans: list[TrainingPlan] = Field(default_factory=list)


class Share(_Model):
    """A quota share: a guaranteed limit per instance type and how idle capacity is shared."""

    name: Name
    capacity_limits: dict[InstanceTypeName, PositiveInt] = Field(min_length=1, max_length=5)
    strategy: Strategy = Strategy.RESERVE
    borrow_limit: int | None = Field(default=None, ge=-1, strict=True)
    in_share_preemption: bool = False
    in_share_preemption_after_seconds: float = Field(default=600, ge=0)
    """How long a job waits, RUNNABLE, before it may preempt lower-priority jobs of its own
    share (a reclaim of lent capacity is never delayed). 0 preempts at once, as AWS does; the
    default lets the share's own finishes serve a job first, which on the synthetic workload
    cuts the preemptions by 45% (docs/model.md rule 4.4.3; docs/concepts.md, "In-share preemption
    waits, 600 s by default")."""
    state: ShareState = ShareState.ENABLED
    preemption_protection_seconds: float = Field(default=0, ge=0)
    preemption_grace_seconds: float = Field(default=0, ge=0)
    starvation_after_seconds: float | None = Field(default=None, gt=0)
    """A fixed starvation threshold (docs/model.md rule 8.2). None, the default: the threshold
    adapts to the share's recent waits (``starvation_multiple`` times its normal wait, at least
    ``starvation_min_seconds``). A fixed 48 h, tuned on ITP, alerted on 42% of jobs when ITP's
    pool was halved; the adaptive one on 1.8% (BENCHMARKS.md, "Starvation that adapts")."""
    starvation_multiple: float = Field(default=8, ge=1)
    """How many times its share's normal wait a job waits before it may be starving."""
    starvation_min_seconds: float = Field(default=7200, ge=0)
    """No job is starving before it has waited this long, however short its share's waits."""
    starvation_reservation: bool = False
    """Whether a starving job holds a reservation (docs/model.md rule 8.4). Off by default: measured
    on the ITP trace, every reservation rule tried cost more mean wait than it saved in the
    tail (docs/concepts.md, "Starving jobs reserve nothing by default")."""
    max_priority: int = Field(default=9999, ge=0, le=9999, strict=True)
    require_checkpoint: bool = False
    preempted_alert_after: PositiveInt = 3
    aws_conn_id: str | None = Field(default=None, min_length=1, max_length=250)
    """The Airflow AWS connection of the share's SageMaker jobs (a team's own identity), where
    a job names none; None: the quota scheduler's own credentials."""
    access: ShareAccess | None = None
    """Who may submit and who may change priorities (``core.access``); None: everyone."""
    max_running_jobs: PositiveInt | None = None
    """The most of the share's jobs that hold capacity at once, whatever their size
    (docs/model.md rule 4.0.6); None: no such limit."""

    @model_validator(mode="after")
    def _one_kind_of_threshold(self) -> Share:
        adaptive_only = [
            name
            for name in ("starvation_min_seconds", "starvation_multiple")
            if getattr(self, name) != Share.model_fields[name].default
        ]
        if self.starvation_after_seconds is not None and adaptive_only:
            raise ValueError(
                f"{' and '.join(adaptive_only)} shape the adaptive starvation threshold; "
                "with starvation_after_seconds (a fixed one) leave them out"
            )
        return self

    @property
    def lends(self) -> bool:
        """RESERVE capacity is never lent."""
        return self.strategy is not Strategy.RESERVE

    @property
    def borrows(self) -> bool:
        return self.strategy is Strategy.LEND_AND_BORROW

    @property
    def effective_borrow_limit(self) -> int:
        """Percent of the own limit that may be borrowed on top; -1 is unlimited."""
        return -1 if self.borrow_limit is None else self.borrow_limit

    @property
    def can_be_preempted(self) -> bool:
        """Whether this share's jobs may ever be victims (they borrow, or in-share preemption)."""
        return self.borrows or self.in_share_preemption


IMPORT_PATH_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")
AlertKindName = Literal["STARVING", "PREEMPTED_REPEATEDLY", "GUARANTEE_VIOLATED"]
"""The kinds of ``AlertKind`` (core.model imports this module, so they are spelled out here)."""


class NotifierEntry(_Model):
    """One item of ``alerts.notifiers``: a notifier class by import path and its arguments.

    ``class`` names an Airflow ``BaseNotifier`` subclass (the amazon provider's ``SnsNotifier``,
    the Slack provider's, your own) or an ``airflow_quota.notifications.QuotaNotifier``;
    ``kwargs`` are its constructor's keyword arguments, templated fields rendered against the
    alert (``{{ alert.message }}``); ``name`` identifies the notifier in logs and in the
    delivery records (default: the class's name); ``kinds`` limits it to some alert kinds.
    Only the shape is checked here (the core imports nothing): the quota service imports and
    instantiates the class, and ``airflow-quota validate``/``apply`` do where they can.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, serialize_by_alias=True)

    class_path: str = Field(alias="class")
    kwargs: dict[str, Any] = Field(default_factory=dict)
    name: Name | None = None
    kinds: list[AlertKindName] | None = Field(default=None, min_length=1)

    @field_validator("class_path")
    @classmethod
    def _import_path(cls, value: str) -> str:
        if not IMPORT_PATH_PATTERN.match(value):
            raise ValueError(
                f"{value!r} is not an import path: module.Class, "
                "e.g. airflow.providers.amazon.aws.notifications.sns.SnsNotifier"
            )
        return value

    @property
    def class_name(self) -> str:
        return self.class_path.rsplit(".", 1)[1]


class AlertsConfig(_Model):
    """Where alerts go; used by the quota service (the core only raises them). No notifiers
    means the log notifier (one line per alert in the quota scheduler's log)."""

    notifiers: list[NotifierEntry] = Field(default_factory=list)

    def notifier_names(self) -> list[str]:
        """Each notifier's name: its ``name``, else its class's name, with ``-<index>`` added
        when an earlier notifier already has that name (two SNS topics, say)."""
        names: list[str] = []
        for i, entry in enumerate(self.notifiers):
            name = entry.name or entry.class_name
            names.append(f"{name}-{i}" if name in names else name)
        return names


class QuotaConfig(_Model):
    """One quota configuration: instance types, the pool, and the shares."""

    instance_types: dict[InstanceTypeName, InstanceTypeSpec] = Field(default_factory=dict)
    pool: Pool
    shares: list[Share] = Field(min_length=1)
    alerts: AlertsConfig = Field(default_factory=AlertsConfig)

    def catalogue(self) -> dict[str, InstanceTypeSpec]:
        """The built-in catalogue extended or overridden by ``instance_types``."""
        merged = dict(builtin_catalogue())
        merged.update(self.instance_types)
        return merged

    def share(self, name: str) -> Share | None:
        return next((s for s in self.shares if s.name == name), None)

    def plan(self, name: str) -> TrainingPlan | None:
        return next((p for p in self.pool.training_plans if p.name == name), None)


def instant_seconds(value: Instant, origin: datetime) -> float:
    """Seconds from ``origin``: a number is already seconds from origin."""
    if isinstance(value, datetime):
        aware = value if value.tzinfo else value.replace(tzinfo=timezone.utc)
        return (aware - origin).total_seconds()
    return float(value)


def check_rules(config: QuotaConfig) -> list[Problem]:
    """The rules of docs/model.md rule 1.2 that span fields; every broken one, each with its path."""
    known = config.catalogue()
    problems = [
        Problem(f"pool.capacity.{type_name}", _unknown_type(type_name))
        for type_name in config.pool.capacity
        if type_name not in known
    ]
    problems += _share_problems(config, known)
    problems += _capacity_problems(config)
    problems += _plan_problems(config)
    problems += _notifier_problems(config)
    return problems


def _share_problems(config: QuotaConfig, known: dict[str, InstanceTypeSpec]) -> list[Problem]:
    """Share names used twice, limits on unknown types or types outside the pool, a
    borrow_limit on a share that does not borrow."""
    problems: list[Problem] = []
    capacity = config.pool.capacity
    names: set[str] = set()
    for i, share in enumerate(config.shares):
        where = f"shares[{i}]"
        if share.name in names:
            problems.append(Problem(f"{where}.name", f"share name {share.name!r} is used twice"))
        names.add(share.name)
        for type_name in share.capacity_limits:
            if type_name not in known:
                problems.append(Problem(f"{where}.capacity_limits.{type_name}", _unknown_type(type_name)))
            elif type_name not in capacity:
                problems.append(
                    Problem(
                        f"{where}.capacity_limits.{type_name}",
                        f"{type_name} has no capacity in the pool (pool.capacity)",
                    )
                )
        if share.borrow_limit is not None and not share.borrows:
            problems.append(
                Problem(
                    f"{where}.borrow_limit",
                    f"borrow_limit is allowed only with strategy LEND_AND_BORROW, not {share.strategy.value}",
                )
            )
    return problems


def _capacity_problems(config: QuotaConfig) -> list[Problem]:
    """Types whose shares' limits sum to more than the pool's capacity."""
    problems: list[Problem] = []
    for type_name, cap in config.pool.capacity.items():
        total = sum(s.capacity_limits.get(type_name, 0) for s in config.shares)
        if total > cap:
            parts = " + ".join(
                f"{s.name} {s.capacity_limits[type_name]}" for s in config.shares if type_name in s.capacity_limits
            )
            problems.append(
                Problem(
                    f"pool.capacity.{type_name}",
                    f"limits sum to {total} ({parts}) but capacity is {cap}: "
                    "a share's limit is a guarantee, so the limits must fit in the capacity",
                )
            )
    return problems


def _plan_problems(config: QuotaConfig) -> list[Problem]:
    """Plan names used twice, plans on types outside the pool or larger than its capacity,
    plans that end before they start."""
    problems: list[Problem] = []
    capacity = config.pool.capacity
    plan_names: set[str] = set()
    for i, plan in enumerate(config.pool.training_plans):
        where = f"pool.training_plans[{i}]"
        if plan.name in plan_names:
            problems.append(Problem(f"{where}.name", f"plan name {plan.name!r} is used twice"))
        plan_names.add(plan.name)
        if plan.instance_type not in capacity:
            problems.append(
                Problem(f"{where}.instance_type", f"{plan.instance_type} is not in the pool (pool.capacity)")
            )
        elif plan.count > capacity[plan.instance_type]:
            problems.append(
                Problem(
                    f"{where}.count",
                    f"plan has {plan.count} instances but the pool's capacity of "
                    f"{plan.instance_type} is {capacity[plan.instance_type]}",
                )
            )
        epoch = datetime(1970, 1, 1, tzinfo=timezone.utc)
        try:
            ordered = instant_seconds(plan.ends_at, epoch) > instant_seconds(plan.starts_at, epoch)
        except TypeError:
            ordered = True  # a number next to a datetime: resolved against the scenario start later
        if not ordered:
            problems.append(Problem(f"{where}.ends_at", "the plan must end after it starts"))
    return problems


def _notifier_problems(config: QuotaConfig) -> list[Problem]:
    """Notifier names used twice."""
    problems: list[Problem] = []
    named: set[str] = set()
    for i, entry in enumerate(config.alerts.notifiers):
        if entry.name is not None:
            if entry.name in named:
                problems.append(Problem(f"alerts.notifiers[{i}].name", f"notifier name {entry.name!r} is used twice"))
            named.add(entry.name)
    return problems


def _unknown_type(name: str) -> str:
    return f"unknown instance type {name!r}: not in the catalogue nor in instance_types"


def pydantic_problems(error: ValidationError, prefix: str = "") -> list[Problem]:
    """Turn a pydantic error into ``path: message`` problems with dotted, indexed paths."""
    problems = []
    for item in error.errors():
        path = prefix
        for part in item["loc"]:
            if isinstance(part, int):
                path += f"[{part}]"
            elif part in ("function-after[", "tagged-union", "[key]"):
                continue
            else:
                path = join_path(path, path_key(str(part)))
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown key"
        elif item["type"] == "missing":
            message = "required field is missing"
        problems.append(Problem(path, message))
    return problems


_PLAIN_KEY = re.compile(name_pattern(dots=True))


def path_key(key: str) -> str:
    """A mapping key as a part of an error path: as it is when it follows the name rule (with
    dots: ``pool.capacity.ml.g5.xlarge``), else quoted and cut to 40 characters
    (``pool.capacity['<b>x</b>\\n']``), so that a path is one short line whatever the input."""
    if _PLAIN_KEY.match(key):
        return key
    shown = repr(key[:40]) if len(key) <= 40 else repr(key[:40])[:-1] + "...'"
    return f"[{shown}]"


def parse_config(raw: Any, prefix: str = "") -> QuotaConfig:
    """Validate a mapping as a configuration; raise InvalidInput with every problem.

    The pool and each share are validated on their own, so that a broken share does not hide
    the problems of the others nor the rules that span them (checked on the parts that are valid).
    """
    if not isinstance(raw, Mapping):
        raise not_a_mapping(raw, QUOTA_SECTIONS, prefix)
    problems: list[Problem] = []
    parts: dict[str, Any] = {}
    for key in raw:
        if key not in QuotaConfig.model_fields:
            problems.append(Problem(join_path(prefix, str(key)), "unknown key"))
    for key in ("instance_types", "pool", "alerts"):
        if key not in raw:
            continue
        try:
            parts[key] = QuotaConfig.model_validate({**_placeholder(), key: raw[key]}).__getattribute__(key)
        except ValidationError as exc:
            problems.extend(pydantic_problems(exc, prefix))
    shares = raw.get("shares")
    valid_shares: list[Share] = []
    original_index: list[int] = []
    if not isinstance(shares, list) or not shares:
        problems.append(Problem(join_path(prefix, "shares"), "a list of at least one share is required"))
    else:
        for i, item in enumerate(shares):
            try:
                valid_shares.append(Share.model_validate(item))
                original_index.append(i)
            except ValidationError as exc:
                problems.extend(pydantic_problems(exc, join_path(prefix, f"shares[{i}]")))
    if "pool" not in raw:
        problems.append(Problem(join_path(prefix, "pool"), "required field is missing"))
    if "pool" in parts:
        partial = QuotaConfig.model_construct(
            instance_types=parts.get("instance_types", {}),
            pool=parts["pool"],
            shares=valid_shares,
            alerts=parts.get("alerts", AlertsConfig()),
        )
        broken = {p.path for p in problems}
        for problem in check_rules(partial):
            path = join_path(prefix, _renumber_shares(problem.path, original_index))
            if path not in broken:
                problems.append(Problem(path, problem.message))
    if problems:
        raise InvalidInput(problems)
    return QuotaConfig.model_validate(raw)


def _renumber_shares(path: str, original_index: list[int]) -> str:
    """``shares[i]`` of the valid shares only, as ``shares[j]`` of the file."""
    match = re.match(r"shares\[(\d+)\]", path)
    if match is None:
        return path
    return f"shares[{original_index[int(match.group(1))]}]" + path[match.end() :]


def _placeholder() -> dict[str, Any]:
    """The smallest valid configuration, to validate one section of another in its place."""
    return {"pool": {"capacity": {"ml.m5.large": 1}}, "shares": [{"name": "x", "capacity_limits": {"ml.m5.large": 1}}]}


_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

QUOTA_SECTIONS = "quota sections (pool, shares, instance_types, alerts)"
"""What the top level of a quota file (or a scenario's ``quota``) maps: see ``not_a_mapping``."""

T = TypeVar("T")


def load_file(path: Path, of: str, parse: Callable[[dict[str, Any]], T]) -> T:
    """Read the YAML (or JSON) file at ``path``, whose top level must be a mapping of ``of``,
    and ``parse`` it: the one way every input file is loaded. Every problem, with reading the
    file, its YAML, its top level or anything ``parse`` refuses, raises InvalidInput naming
    the file once, ahead of the problems (``InvalidInput.file``)."""
    try:
        raw = read_yaml(path)
        if raw is None:
            raise InvalidInput.single("", "the file is empty")
        if not isinstance(raw, dict):
            raise not_a_mapping(raw, of)
        return parse(raw)
    except InvalidInput as exc:
        raise exc.in_file(str(path)) from None


def read_yaml(path: Path) -> Any:
    """Parse a YAML file; a file that cannot be read, or whose YAML does not parse, raises
    InvalidInput in the file (with the line and column of a parse error). Input files are
    loaded with ``load_file``, which checks the top level too."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidInput([Problem("", f"cannot read the file: {exc.strerror}")], str(path)) from None
    except UnicodeDecodeError as exc:  # YAML and JSON files are UTF-8 text
        message = f"not UTF-8 text: byte 0x{exc.object[exc.start]:02x} at offset {exc.start} is not UTF-8"
        raise InvalidInput([Problem("", message)], str(path)) from None
    try:
        if text.lstrip().startswith("{"):
            try:
                return json.loads(text)  # JSON is YAML too, and generated workloads load much faster
            except ValueError:
                pass
        return yaml.load(text, Loader=_LOADER)
    except RecursionError:
        raise InvalidInput([Problem("", "nested too deeply to be read")], str(path)) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or "not valid YAML"
        raise InvalidInput([Problem("", f"not valid YAML: {problem}")], where) from None


def not_a_mapping(value: Any, of: str, path: str = "") -> InvalidInput:
    """The refusal of ``value`` where a mapping of ``of`` belongs: at ``path``, or at the top
    level of a file (no path)."""
    subject = "must" if path else "the top level must"
    return InvalidInput.single(path, f"{subject} be a mapping of {of}, got {_kind(value)}")


def _kind(value: Any) -> str:
    """What a YAML value is, in the words of a message: ``a list``, ``a string``, ..."""
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, date):
        return "a date"
    return f"a {type(value).__name__}"


def stored_config(document: Mapping[str, Any]) -> QuotaConfig:
    """A configuration read back from the quota database (its input log, its versions): it
    was checked when applied, so one stored before timestamps needed a zone is read as it was
    then, a zoneless timestamp as UTC (``core.timestamps.STORED``)."""
    return QuotaConfig.model_validate(document, context={STORED: True})


def load_config(path: Path) -> QuotaConfig:
    """Read and validate a quota.yaml; every problem names the file (see ``load_file``)."""
    return load_file(path, QUOTA_SECTIONS, parse_config)
