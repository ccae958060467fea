"""The quota arguments of an Airflow task, and their one check.

``QuotaTrainingOperator``'s arguments and ``QuotaExecutor``'s ``executor_config["quota"]`` say the
same things (share, instance preferences, priority, pending time, preemption retries, checkpoint,
expected runtime); both build their ``JobRequest`` here, and both report a broken rule with the
same message, named by the argument's name (``instance_preferences[0].count: ...``), never by
the model's field. The expected runtime is no part of the request: it is stored beside it
(``JobFields.expected_runtime_seconds``) for the forecast, and decides nothing.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from pydantic import ValidationError

from airflow_quota.core.config import pydantic_problems
from airflow_quota.core.model import MAX_SECONDS, JobRequest
from airflow_quota.core.submission import unknown_keys_named
from airflow_quota.exceptions import Problem

REQUEST_ARGUMENTS = (
    "share",
    "instance_preferences",
    "priority",
    "max_pending_time",
    "preemption_retries",
    "retry_attempts",
    "retry_on",
    "checkpoint_uri",
    "checkpoint_interval",
    "wait_for_capacity",
    "job_name",
)
"""The arguments that make a task's ``JobRequest``."""
RUNTIME_ARGUMENT = "expected_runtime"
"""How long the author expects the training to run: stored beside the request, for the forecast."""
SUBMISSION_ARGUMENTS = (*REQUEST_ARGUMENTS, RUNTIME_ARGUMENT)
"""The arguments of a task's submission: its request's and its expected runtime."""

_PARAMETER_OF = {"name": "job_name", "preferences": "instance_preferences", "max_pending_seconds": "max_pending_time"}


def has_template(value: Any) -> bool:
    """Whether a value is known only at run time: Jinja, or a value Airflow resolves when the
    task runs (a TaskFlow output, an ``XComArg``), anywhere inside it. Such a value is checked
    once rendered, in ``execute``, not at DAG parse time."""
    if isinstance(value, str):
        return "{{" in value or "{%" in value
    if callable(getattr(value, "resolve", None)) and callable(getattr(value, "iter_references", None)):
        return True  # airflow.sdk's ResolveMixin: XComArg and its kin
    if isinstance(value, Mapping):
        return any(has_template(k) or has_template(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(has_template(v) for v in value)
    return False


def rendered_as(value: Any, kind: type) -> Any:
    """A rendered value as the ``kind`` (list, dict, int or float) a parameter expects: Jinja
    renders to strings, so ``"2"`` is 2 and ``'[{"instance_type": ...}]'`` a list. Anything
    that does not read as that kind is returned as it is, for the checks to name."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if kind is int and re.fullmatch(r"[+-]?\d+", text):
        return int(text)
    if kind is float:
        try:
            return float(text)
        except ValueError:
            return value
    if kind in (list, dict) and text[:1] in "[{":
        try:
            parsed = json.loads(text)
        except ValueError:
            return value
        return parsed if isinstance(parsed, kind) else value
    return value


def seconds(value: float | timedelta | None) -> float | None:
    """``max_pending_time`` (or ``expected_runtime``) in seconds: a number or a ``timedelta``;
    ValueError otherwise."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"must be seconds or a timedelta, got {value!r}")
    return float(value)


def expected_runtime_seconds(value: float | timedelta | None) -> float | None:
    """``expected_runtime`` in seconds: None, or a number or a ``timedelta`` above 0 (finite,
    at most ten years); ValueError naming the rule otherwise."""
    given = seconds(value)
    if given is None:
        return None
    if not math.isfinite(given) or not 0 < given <= MAX_SECONDS:
        raise ValueError(
            f"must be more than 0 seconds and at most ten years (how long the training is expected to run),"
            f" got {given:g} seconds"
        )
    return given


def job_request(
    arguments: Mapping[str, Any], default_name: str, priority: int | None = None, placeholders: bool = False
) -> JobRequest:
    """The ``JobRequest`` of a task's quota arguments (``REQUEST_ARGUMENTS``; absent ones take
    their defaults); ``priority`` overrides theirs (a run's ``quota_priority``). With
    ``placeholders``, arguments still holding Jinja get a valid stand-in. Raises pydantic's
    ``ValidationError`` or ``ValueError`` (``max_pending_time``); ``request_problems`` names them."""

    def value(name: str, stand_in: Any, default: Any = None) -> Any:
        given = arguments.get(name, default)
        return stand_in if placeholders and has_template(given) else given

    retry_on = value("retry_on", None)
    return JobRequest(
        name=value("job_name", default_name) or default_name,
        share=value("share", "share"),
        priority=value("priority", 0, 0) if priority is None else priority,
        preferences=value("instance_preferences", [{"instance_type": "stand-in", "count": 1}]),
        max_pending_seconds=seconds(value("max_pending_time", None)),
        preemption_retries=value("preemption_retries", None),
        retry_attempts=value("retry_attempts", 1, 1),
        retry_on=list(retry_on) if retry_on is not None else None,
        checkpoint_uri=value("checkpoint_uri", "stand-in"),
        checkpoint_interval=value("checkpoint_interval", None),
        wait_for_capacity=bool(arguments.get("wait_for_capacity", False)),
    )


def request_problems(
    arguments: Mapping[str, Any], parse_time: bool = False, priority: int | None = None, prefix: str = ""
) -> list[Problem]:
    """Every broken rule of the quota arguments, as ``argument: message`` (each path behind
    ``prefix``, e.g. ``executor_config.quota.``). At parse time an argument still holding Jinja
    is checked only once rendered. Worded as a job file's problems are (``core.wording``)."""
    problems: list[Problem] = []
    try:
        job_request(arguments, "parse-time-check", priority, placeholders=parse_time)
    except ValidationError as exc:
        for problem in unknown_keys_named(pydantic_problems(exc), REQUEST_ARGUMENTS, "preferences"):
            head, dot, rest = problem.path.partition(".")
            head, bracket, index = head.partition("[")
            path = _PARAMETER_OF.get(head, head) + bracket + index + dot + rest
            problems.append(Problem(prefix + path, problem.message))
    except ValueError as exc:
        problems.append(Problem(prefix + "max_pending_time", str(exc)))
    runtime = arguments.get(RUNTIME_ARGUMENT)
    if not (parse_time and has_template(runtime)):
        try:
            expected_runtime_seconds(runtime)
        except ValueError as exc:
            problems.append(Problem(prefix + RUNTIME_ARGUMENT, str(exc)))
    return problems


def read_rendered(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """Rendered quota arguments with the strings that hold a list, an object or a number read as
    that value where the argument expects one (Jinja renders to text)."""
    read = dict(arguments)
    preferences = rendered_as(read.get("instance_preferences"), list)
    if isinstance(preferences, list):
        preferences = [
            {**entry, "count": rendered_as(entry["count"], int)}
            if isinstance(entry, Mapping) and "count" in entry
            else entry
            for entry in preferences
        ]
    if "instance_preferences" in read:
        read["instance_preferences"] = preferences
    for name, kind in (
        ("priority", int),
        ("max_pending_time", float),
        (RUNTIME_ARGUMENT, float),
        ("preemption_retries", int),
        ("retry_attempts", int),
        ("retry_on", list),
        ("checkpoint_interval", float),
    ):
        if name in read:
            read[name] = rendered_as(read[name], kind)
    return read
