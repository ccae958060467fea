"""What a task asks of ``QuotaExecutor``: ``executor_config={"quota": {...}}``, checked once.

A task opts in with ``executor="quota"`` (the alias of ``[core] executor =
LocalExecutor,quota:airflow_quota.executors.QuotaExecutor``) and says what it needs::

    @task(executor="quota", executor_config=quota_config(share="research",
          instance_preferences=[{"instance_type": "ml.g5.xlarge", "count": 1}], priority=10))
    def train(): ...

The fields are the operator's (``operators/arguments.py``: the same ``JobRequest``, the same
messages), under ``executor_config.quota.``; the task's ``queue`` names the share when the config
does not (a queue other than Airflow's default one). The check runs three times, always the same
function: when ``quota_config`` builds the mapping (in the DAG file), for every task of the quota
executor at DAG parse time (the cluster policy of ``executors/policy.py``: a broken field is an
import error naming it), and when the executor takes the workload (a task failure naming it).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from airflow_quota.core.wording import unknown_name
from airflow_quota.exceptions import InvalidInput, Problem
from airflow_quota.operators.arguments import request_problems

QUOTA_KEY = "quota"
PREFIX = f"executor_config.{QUOTA_KEY}."
FIELDS = (
    "share",
    "instance_preferences",
    "priority",
    "max_pending_time",
    "preemption_retries",
    "checkpoint_uri",
    "checkpoint_interval",
    "expected_runtime",
)
"""What ``executor_config["quota"]`` may hold. Genuine failures are Airflow's to retry (the
task's ``retries``), so the quota job gets one attempt per Airflow try (``retry_attempts`` 1)."""
DEFAULT_QUEUE = "default"
"""Airflow's default ``[operators] default_queue``: a task on it names no share by its queue."""


def quota_arguments(executor_config: Mapping[str, Any] | None, queue: str | None = None) -> dict[str, Any]:
    """The quota arguments of a task (``FIELDS``, the share filled in from ``queue`` when the
    config names none), without checking their values; ``InvalidInput`` when the config is not
    a mapping or holds an unknown field."""
    problems, arguments = _read(executor_config, queue)
    if problems:
        raise InvalidInput(problems)
    return arguments


def config_problems(
    executor_config: Mapping[str, Any] | None,
    queue: str | None = None,
    parse_time: bool = False,
    priority: int | None = None,
) -> list[Problem]:
    """Every broken rule of a task's quota config, each named ``executor_config.quota.<field>``."""
    problems, arguments = _read(executor_config, queue)
    if problems:
        return problems
    return request_problems(arguments, parse_time, priority, prefix=PREFIX)


def quota_config(
    *,
    share: str | None = None,
    instance_preferences: list[dict[str, Any]] | None = None,
    priority: int = 0,
    max_pending_time: float | timedelta | None = None,
    preemption_retries: int | None = None,
    checkpoint_uri: str | None = None,
    checkpoint_interval: float | None = None,
    expected_runtime: float | timedelta | None = None,
    **unknown: Any,
) -> dict[str, Any]:
    """The ``executor_config`` of a task under the quota shares, checked now (in the DAG file):
    ``InvalidInput`` names each broken field. Without ``share``, the task's ``queue`` names it.

    A keyword it does not know (a typo: ``instance_preference=``) is named with the known ones
    and the closest as "did you mean", as an unknown field of ``executor_config["quota"]`` is,
    rather than Python's bare ``TypeError``; so is a missing ``instance_preferences``."""
    fields: dict[str, Any] = {"priority": priority, **unknown}
    optional = {
        "share": share,
        "instance_preferences": instance_preferences,
        "max_pending_time": max_pending_time.total_seconds()
        if isinstance(max_pending_time, timedelta)
        else max_pending_time,
        "preemption_retries": preemption_retries,
        "checkpoint_uri": checkpoint_uri,
        "checkpoint_interval": checkpoint_interval,
        "expected_runtime": expected_runtime.total_seconds()
        if isinstance(expected_runtime, timedelta)
        else expected_runtime,
    }
    fields.update({k: v for k, v in optional.items() if v is not None})
    config = {QUOTA_KEY: fields}
    problems = config_problems(config, "stand-in-share", parse_time=True)
    if instance_preferences is None:
        where = PREFIX + "instance_preferences"
        problems = [Problem(where, "required field is missing"), *(p for p in problems if not p.path.startswith(where))]
    if problems:
        raise InvalidInput(problems)
    return config


def _read(executor_config: Mapping[str, Any] | None, queue: str | None) -> tuple[list[Problem], dict[str, Any]]:
    if executor_config is None or QUOTA_KEY not in executor_config:
        return [Problem(PREFIX.rstrip("."), "missing: a task of QuotaExecutor says what it needs there")], {}
    raw = executor_config[QUOTA_KEY]
    if not isinstance(raw, Mapping):
        return [Problem(PREFIX.rstrip("."), f"must be a mapping of {', '.join(FIELDS)}, got {raw!r}")], {}
    unknown = sorted(str(k) for k in raw if k not in FIELDS)
    if unknown:
        return [Problem(PREFIX + name, unknown_name(name, FIELDS)) for name in unknown], {}
    arguments = dict(raw)
    if arguments.get("share") is None:
        if queue and queue != DEFAULT_QUEUE:
            arguments["share"] = queue
        else:
            return [
                Problem(PREFIX + "share", "missing: name the share here or as the task's queue (queue='research')")
            ], {}
    return [], arguments
