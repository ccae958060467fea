"""The scenario file of docs/simulate.md: models, loading, and the checks that refuse a malformed
scenario as a whole (exit status 2) before anything runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from airflow_quota.core.access import ShareAccess
from airflow_quota.core.config import (
    PositiveInt,
    QuotaConfig,
    ShareState,
    Strategy,
    TrainingPlan,
    load_config,
    load_file,
    not_a_mapping,
    parse_config,
    pydantic_problems,
)
from airflow_quota.core.model import JobRequest
from airflow_quota.core.timestamps import ZonedDatetime
from airflow_quota.exceptions import InvalidInput, Problem

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FailureSpec(_Model):
    """Attempt k of a simulated job fails after ``after`` seconds of work within that attempt."""

    after: float = Field(ge=0)
    reason: str = "ExitCode:1"


class SimJob(JobRequest):
    """A submission plus what the simulator needs to play the training."""

    duration: float = Field(gt=0, description="seconds of training work the job needs")
    startup_seconds: float = Field(default=0, ge=0)
    failures: list[FailureSpec] = Field(default_factory=list)

    def request(self) -> JobRequest:
        return JobRequest.model_validate(self.model_dump(exclude={"duration", "startup_seconds", "failures"}))


class PriorityChange(_Model):
    job: str
    priority: int = Field(ge=0, le=9999, strict=True)


class JobRef(_Model):
    job: str


class ShareUpdate(_Model):
    """Changes only the fields it gives; a mapping such as capacity_limits is replaced whole.
    Every field of a share but its name (docs/model.md section 1.1); the configuration it
    leaves is validated whole."""

    name: str
    capacity_limits: dict[str, PositiveInt] | None = None
    strategy: Strategy | None = None
    borrow_limit: int | None = None
    in_share_preemption: bool | None = None
    in_share_preemption_after_seconds: float | None = None
    state: ShareState | None = None
    preemption_protection_seconds: float | None = None
    preemption_grace_seconds: float | None = None
    starvation_after_seconds: float | None = None
    starvation_multiple: float | None = None
    starvation_min_seconds: float | None = None
    starvation_reservation: bool | None = None
    max_priority: int | None = None
    require_checkpoint: bool | None = None
    preempted_alert_after: int | None = None
    aws_conn_id: str | None = None
    access: ShareAccess | None = None


class PoolUpdate(_Model):
    capacity: dict[str, PositiveInt] | None = None
    training_plans: list[TrainingPlan] | None = None


class ProviderState(_Model):
    available: dict[str, int | None] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _not_negative(self) -> ProviderState:
        for name, count in self.available.items():
            if count is not None and count < 0:
                raise ValueError(f"available {name}: must be ≥ 0")
        return self


class Event(_Model):
    at: float = Field(ge=0)
    submit: SimJob | None = None
    set_priority: PriorityChange | None = None
    update_share: ShareUpdate | None = None
    update_pool: PoolUpdate | None = None
    provider: ProviderState | None = None
    cancel: JobRef | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> Event:
        given = [k for k in _EVENT_KINDS if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"an event has exactly one of {', '.join(_EVENT_KINDS)}; this one has {len(given)}")
        return self

    @property
    def kind(self) -> str:
        return next(k for k in _EVENT_KINDS if getattr(self, k) is not None)


_EVENT_KINDS = ("submit", "set_priority", "update_share", "update_pool", "provider", "cancel")


class Scenario(_Model):
    start: ZonedDatetime = EPOCH
    """The instant of t=0: a zoned timestamp (``core.timestamps``)."""
    quota: dict[str, Any] | None = None
    quota_file: str | None = None
    provider: ProviderState = Field(default_factory=ProviderState)
    events: list[Event] = Field(default_factory=list)
    expect: Any = None


class LoadedScenario(_Model):
    """A scenario whose configuration and events have passed every check."""

    start: datetime
    config: QuotaConfig
    provider: ProviderState
    events: list[Event]


SCENARIO_KEYS = "scenario keys (quota or quota_file, events, start, provider, expect)"
"""What the top level of a scenario file maps: see ``core.config.not_a_mapping``."""


def load_scenario(path: Path) -> LoadedScenario:
    """Read, validate and resolve a scenario file; InvalidInput names the file and lists every
    problem."""
    return load_file(path, SCENARIO_KEYS, lambda raw: parse_scenario(raw, path.parent))


def parse_scenario(raw: Any, base: Path) -> LoadedScenario:
    """Validate a scenario; every problem of every part is reported, not only the first. The
    problems of a ``quota_file`` are reported at ``quota_file``, each naming that file."""
    if not isinstance(raw, Mapping):
        raise not_a_mapping(raw, SCENARIO_KEYS)
    problems: list[Problem] = [Problem(str(k), "unknown key") for k in raw if k not in Scenario.model_fields]
    header = {k: raw[k] for k in ("start", "provider", "quota_file") if k in raw}
    try:
        scenario = Scenario.model_validate(header)
    except ValidationError as exc:
        problems.extend(pydantic_problems(exc))
        scenario = Scenario()
    config: QuotaConfig | None = None
    if ("quota" in raw) == ("quota_file" in raw):
        problems.append(Problem("quota", "give exactly one of quota (inline) or quota_file"))
    elif "quota" in raw:
        try:
            config = parse_config(raw["quota"], "quota")
        except InvalidInput as exc:
            problems.extend(exc.problems)
    else:
        try:
            config = load_config(base / str(raw["quota_file"]))
        except InvalidInput as exc:
            problems.extend(exc.under("quota_file"))
    events: list[tuple[int, Event]] = []
    raw_events = raw.get("events", [])
    if not isinstance(raw_events, list):
        problems.append(Problem("events", "must be a list of events"))
        raw_events = []
    for i, item in enumerate(raw_events):
        try:
            events.append((i, Event.model_validate(item)))
        except ValidationError as exc:
            problems.extend(pydantic_problems(exc, f"events[{i}]"))
    problems.extend(_check_events(events, scenario.provider, config))
    if problems:
        raise InvalidInput(problems)
    assert config is not None
    return LoadedScenario(
        start=scenario.start, config=config, provider=scenario.provider, events=[e for _, e in events]
    )


def apply_share_update(config: QuotaConfig, update: ShareUpdate) -> dict[str, Any]:
    """The configuration, as a mapping, with one share's given fields replaced."""
    raw = config.model_dump(mode="python", exclude_none=True)
    changes = update.model_dump(exclude_none=True, exclude={"name"})
    for share in raw["shares"]:
        if share["name"] == update.name:
            share.update(changes)
    return raw


def apply_pool_update(config: QuotaConfig, update: PoolUpdate) -> dict[str, Any]:
    raw = config.model_dump(mode="python", exclude_none=True)
    raw["pool"].update(update.model_dump(exclude_none=True))
    return raw


def _check_events(
    events: list[tuple[int, Event]], provider: ProviderState, config: QuotaConfig | None
) -> list[Problem]:
    """Time order, job references, and, given a valid configuration, static job rules against
    the configuration in force and the configuration after each instant's changes."""
    problems: list[Problem] = []
    submitted: set[str] = set()
    previous = 0.0
    current = config
    pending_config: tuple[int, dict[str, Any], Event] | None = None

    def settle() -> None:
        nonlocal current, pending_config
        if pending_config is None:
            return
        index, raw, event = pending_config
        pending_config = None
        try:
            current = parse_config(raw)
        except InvalidInput as exc:
            problems.extend(
                Problem(f"events[{index}].{_event_field(p.path, event, raw)}", p.message) for p in exc.problems
            )

    for i, event in events:
        where = f"events[{i}]"
        if event.at < previous:
            problems.append(Problem(f"{where}.at", f"{event.at:g} is before the previous event's time {previous:g}"))
        if event.at != previous:
            settle()
        previous = max(previous, event.at)
        kind = event.kind
        if kind == "submit":
            assert event.submit is not None
            if current is not None:
                problems.extend(_check_job(event.submit, current, f"{where}.submit"))
            submitted.add(event.submit.name)
        elif kind in ("set_priority", "cancel"):
            ref = event.set_priority or event.cancel
            assert ref is not None
            if ref.job not in submitted:
                problems.append(
                    Problem(f"{where}.{kind}.job", f"no job named {ref.job!r} is submitted before this event")
                )
        elif current is None:
            continue
        elif kind in ("update_share", "update_pool"):
            base = QuotaConfig.model_validate(pending_config[1]) if pending_config else current
            if event.update_share is not None:
                if base.share(event.update_share.name) is None:
                    problems.append(
                        Problem(f"{where}.update_share.name", f"no share named {event.update_share.name!r}")
                    )
                    continue
                raw = apply_share_update(base, event.update_share)
            else:
                assert event.update_pool is not None
                raw = apply_pool_update(base, event.update_pool)
            try:
                QuotaConfig.model_validate(raw)
            except ValidationError as exc:
                problems.extend(pydantic_problems(exc, f"{where}.{kind}"))
                continue
            pending_config = (i, raw, event)
        elif kind == "provider":
            assert event.provider is not None
            known = current.catalogue()
            for name in event.provider.available:
                if name not in known:
                    problems.append(Problem(f"{where}.provider.available.{name}", f"unknown instance type {name!r}"))
    settle()
    if config is None:
        return problems
    known = config.catalogue()
    for name in provider.available:
        if name not in known:
            problems.append(Problem(f"provider.available.{name}", f"unknown instance type {name!r}"))
    return problems


def _event_field(path: str, event: Event, raw: dict[str, Any]) -> str:
    """Point a problem of the configuration after an update at the update's own field."""
    if event.update_pool is not None:
        return "update_pool" + path.removeprefix("pool") if path.startswith("pool.") else path
    assert event.update_share is not None
    index = next(i for i, s in enumerate(raw["shares"]) if s["name"] == event.update_share.name)
    own = f"shares[{index}]"
    if path.startswith(own + "."):
        return "update_share" + path.removeprefix(own)
    limits = raw["shares"][index]["capacity_limits"]
    if path.startswith("pool.capacity.") and path.removeprefix("pool.capacity.") in limits:
        return "update_share.capacity_limits." + path.removeprefix("pool.capacity.")
    return path


def _check_job(job: SimJob, config: QuotaConfig, where: str) -> list[Problem]:
    problems = []
    if config.share(job.share) is None:
        problems.append(Problem(f"{where}.share", f"no share named {job.share!r}"))
    known = config.catalogue()
    for i, entry in enumerate(job.preferences):
        if entry.instance_type not in known:
            problems.append(
                Problem(f"{where}.preferences[{i}].instance_type", f"unknown instance type {entry.instance_type!r}")
            )
        if entry.training_plan is not None and config.plan(entry.training_plan) is None:
            problems.append(
                Problem(f"{where}.preferences[{i}].training_plan", f"no training plan named {entry.training_plan!r}")
            )
    return problems
