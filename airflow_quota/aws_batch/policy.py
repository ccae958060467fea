"""A quota configuration as AWS Batch quota-management objects, and back; pure (no I/O).

The objects of one job queue (docs/aws-batch.md has the field mapping and why each field is
translated, kept by airflow-quota only, or refused):

- the **service environment**'s ``capacityLimits`` (one ``{capacityUnit: instance type,
  maxCapacity}`` per type): the pool's ``capacity``;
- the job queue's **scheduling policy**: a ``quotaSharePolicy`` with
  ``idleResourceAssignmentStrategy: FIFO`` (the only value); it is checked, never changed
  (AWS does not let a policy's type change);
- one **quota share** per share (``CreateQuotaShare`` / ``UpdateQuotaShare``): its
  ``capacityLimits``, ``resourceSharingConfiguration`` (strategy, and ``borrowLimit`` with
  ``LEND_AND_BORROW``), ``preemptionConfiguration.inSharePreemption`` and ``state``.

``plan`` diffs them against what AWS returned (``JobQueueState``) as a list of ``Change``:
create, update (field by field, old → new) and ``unmanaged`` for a quota share AWS has and the
file lacks, which is left as it is: deleting one terminates all its jobs, so airflow-quota
never does it. ``import_yaml`` is the reverse: AWS's objects as a quota.yaml that
``airflow-quota validate`` accepts.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import yaml

from airflow_quota.core.config import QuotaConfig, Share, Strategy, parse_config
from airflow_quota.exceptions import InvalidInput, Problem

MAX_QUOTA_SHARES = 20
"""AWS Batch user guide (quota-shares.html): "A maximum of 20 can be attached to any job queue"."""
MAX_CAPACITY_LIMITS = 5
"""A quota share has 1 to 5 capacity limits, and so has a quota-management service environment
(user guide; botocore's model states no bound)."""
QUOTA_MANAGED_QUEUE_TYPE = "SAGEMAKER_TRAINING"
IDLE_FIFO = "FIFO"
TRAINING_PLAN_ARN = re.compile(r"^arn:aws[a-z\-]*:sagemaker:[a-z0-9\-]*:[0-9]{12}:training-plan/.+$")
"""SageMaker's pattern of a training plan's ARN (``InstancePreference.TrainingPlanArns``)."""

ENABLED, DISABLED = "ENABLED", "DISABLED"

Action = Literal["create", "update", "unmanaged"]


@dataclass(frozen=True)
class FieldChange:
    """One field of an AWS object, as AWS names it, and its value on AWS and in the file
    (``None``: not set there)."""

    name: str
    old: Any
    new: Any

    def __str__(self) -> str:
        return f"{self.name}: {shown(self.old)} → {shown(self.new)}"


@dataclass(frozen=True)
class Note:
    """A setting of the file AWS cannot express: where it is, its value (None: the setting as a
    whole) and why it is kept by airflow-quota only, or refused."""

    path: str
    value: str | None
    why: str

    def shown(self, verdict: str) -> str:
        value = f" = {self.value}" if self.value is not None else ""
        return f"{self.path}{value}: {verdict} ({self.why})"

    def document(self) -> dict[str, Any]:
        return {"path": self.path, "value": self.value, "why": self.why}


@dataclass(frozen=True)
class Change:
    """What ``apply`` does to one AWS object: ``operation`` with ``request`` (without the
    object's ARN when it is not known yet); ``unmanaged`` changes call nothing."""

    action: Action
    kind: Literal["quota share", "service environment"]
    name: str
    operation: str | None
    request: Mapping[str, Any] | None
    fields: tuple[FieldChange, ...] = ()
    note: str = ""


@dataclass(frozen=True)
class JobQueueState:
    """What AWS Batch returned for one job queue: the queue (``DescribeJobQueues``), its
    scheduling policy (``DescribeSchedulingPolicies``), its service environments
    (``DescribeServiceEnvironments``) and its quota shares (``ListQuotaShares``, every page)."""

    queue: Mapping[str, Any]
    scheduling_policy: Mapping[str, Any] | None
    service_environments: Sequence[Mapping[str, Any]]
    quota_shares: Sequence[Mapping[str, Any]]

    @property
    def name(self) -> str:
        return str(self.queue["jobQueueName"])

    @property
    def service_environment(self) -> Mapping[str, Any]:
        """The one service environment (``queue_problems`` checks there is one)."""
        return self.service_environments[0]


@dataclass(frozen=True)
class Desired:
    """The AWS objects a configuration asks for, and what AWS cannot express of it: each
    ``kept`` problem is a setting airflow-quota keeps acting on by itself, each ``refused``
    one a setting AWS would silently not honour."""

    capacity: dict[str, int]
    quota_shares: tuple[dict[str, Any], ...]
    kept: tuple[Note, ...]
    refused: tuple[Note, ...]


@dataclass(frozen=True)
class Plan:
    job_queue: str
    service_environment: str
    scheduling_policy: str
    changes: tuple[Change, ...]
    kept: tuple[Note, ...]
    refused: tuple[Note, ...]

    @property
    def calls(self) -> tuple[Change, ...]:
        """The changes that call AWS, in the order ``apply`` makes them."""
        return tuple(c for c in self.changes if c.operation is not None)

    def count(self, action: Action) -> int:
        return sum(1 for c in self.changes if c.action == action)


def shown(value: Any) -> str:
    if value is None:
        return "(none)"
    return str(value)


def quota_share(share: Share) -> dict[str, Any]:
    """One share as ``CreateQuotaShare``'s fields (less ``jobQueue``)."""
    sharing: dict[str, Any] = {"strategy": share.strategy.value}
    if share.borrows:
        sharing["borrowLimit"] = share.effective_borrow_limit
    return {
        "quotaShareName": share.name,
        "capacityLimits": [{"maxCapacity": n, "capacityUnit": t} for t, n in share.capacity_limits.items()],
        "resourceSharingConfiguration": sharing,
        "preemptionConfiguration": {"inSharePreemption": ENABLED if share.in_share_preemption else DISABLED},
        "state": share.state.value,
    }


def desired(config: QuotaConfig) -> Desired:
    """The AWS objects of ``config``, and its settings AWS cannot express: kept, or refused."""
    kept, refused = expressibility(config)
    return Desired(
        capacity=dict(config.pool.capacity),
        quota_shares=tuple(quota_share(share) for share in config.shares),
        kept=tuple(kept),
        refused=tuple(refused),
    )


KEPT_WHY = {
    "starvation_after_seconds": "starvation alerts come from airflow-quota (AWS Batch raises none)",
    "starvation_multiple": "starvation alerts come from airflow-quota (AWS Batch raises none)",
    "starvation_min_seconds": "starvation alerts come from airflow-quota (AWS Batch raises none)",
    "preempted_alert_after": "PREEMPTED_REPEATEDLY alerts come from airflow-quota",
    "max_priority": "airflow-quota refuses a higher priority at submission and at a priority change; "
    "AWS takes any schedulingPriority from 0 to 9999 in any share",
    "require_checkpoint": "airflow-quota checks it at submission; AWS has no such rule",
    "access": "airflow-quota checks it at submission and at a priority change; AWS scopes a whole job queue "
    "with IAM, not a quota share",
    "aws_conn_id": "the AWS connection airflow-quota submits the share's jobs with",
}
"""Share fields with no AWS counterpart that airflow-quota still acts on when AWS places: why."""

REFUSED_WHY = {
    "preemption_protection_seconds": "AWS Batch chooses preemption victims by a heuristic it does not publish "
    "and has no protection time; set it to 0 to accept that",
    "preemption_grace_seconds": "AWS Batch stops a preempted training job with no configurable grace; "
    "set it to 0 to accept that",
    "starvation_reservation": "AWS Batch reserves no capacity for a starving job; set it to false to accept that",
    "max_running_jobs": "AWS Batch has no limit on a quota share's number of running jobs; leave it out",
}
"""Share fields that change where and when jobs run and that AWS cannot express: why each is
refused rather than dropped (AWS places in this mode, so the setting would silently do nothing)."""


def _differs(share: Share, name: str) -> bool:
    return bool(getattr(share, name) != Share.model_fields[name].default)


def expressibility(config: QuotaConfig) -> tuple[list[Note], list[Note]]:
    """(kept, refused): each setting of ``config`` AWS Batch cannot express, with why, under
    its path in the file. Fields left at their defaults say nothing, but for a share that
    preempts inside: its default wait of 600 s is refused too, as AWS does not wait."""
    kept: list[Note] = []
    refused: list[Note] = []
    if len(config.shares) > MAX_QUOTA_SHARES:
        refused.append(
            Note("shares", str(len(config.shares)), f"AWS Batch attaches at most {MAX_QUOTA_SHARES} to a job queue")
        )
    if len(config.pool.capacity) > MAX_CAPACITY_LIMITS:
        refused.append(
            Note(
                "pool.capacity",
                f"{len(config.pool.capacity)} instance types",
                f"a quota-management service environment has at most {MAX_CAPACITY_LIMITS} capacity limits",
            )
        )
    for i, share in enumerate(config.shares):
        where = f"shares[{i}]"
        if len(share.capacity_limits) > MAX_CAPACITY_LIMITS:
            refused.append(
                Note(
                    f"{where}.capacity_limits",
                    f"{len(share.capacity_limits)} instance types",
                    f"a quota share has at most {MAX_CAPACITY_LIMITS} capacity limits",
                )
            )
        if share.in_share_preemption and share.in_share_preemption_after_seconds > 0:
            default = "" if "in_share_preemption_after_seconds" in share.model_fields_set else " (the default)"
            refused.append(
                Note(
                    f"{where}.in_share_preemption_after_seconds",
                    _value(share.in_share_preemption_after_seconds) + default,
                    "AWS Batch preempts in a share at once, with no wait; set it to 0 to accept that",
                )
            )
        for name, why in REFUSED_WHY.items():
            if _differs(share, name):
                refused.append(Note(f"{where}.{name}", _value(getattr(share, name)), why))
        for name, why in KEPT_WHY.items():
            if _differs(share, name):
                kept.append(Note(f"{where}.{name}", _value(getattr(share, name)), why))
    for i, plan in enumerate(config.pool.training_plans):
        where = f"pool.training_plans[{i}]"
        if plan.arn is None:
            refused.append(
                Note(
                    f"{where}.arn",
                    None,
                    f"plan {plan.name!r} has no ARN: SageMaker knows a training plan only by its ARN "
                    "(arn:aws:sagemaker:REGION:ACCOUNT:training-plan/NAME)",
                )
            )
        elif not TRAINING_PLAN_ARN.match(plan.arn):
            refused.append(Note(f"{where}.arn", repr(plan.arn), "not a SageMaker training plan's ARN"))
        else:
            kept.append(
                Note(
                    where,
                    plan.name,
                    "AWS Batch's quota objects have no training plans: SageMaker applies the plan (its window and "
                    "count) to a job whose preference entry names its ARN",
                )
            )
    for name in config.instance_types:
        kept.append(Note(f"instance_types.{name}", None, "GPUs and prices for airflow-quota's pages and costs"))
    if config.alerts.notifiers:
        kept.append(Note("alerts.notifiers", None, "alerts are sent by airflow-quota"))
    return kept, refused


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    if value is None:
        return "set"
    if isinstance(value, (int, str)):
        return str(value)
    return "set"


# -- the job queue -----------------------------------------------------------------------------


def queue_problems(queue: JobQueueState) -> list[Problem]:
    """Why the job queue cannot hold quota shares, each under ``--job-queue``: not a
    SAGEMAKER_TRAINING queue, no quota-share scheduling policy, not one service environment
    with limits per instance type. airflow-quota does not create nor convert the queue."""
    where = "--job-queue"
    name = queue.name
    problems: list[Problem] = []
    queue_type = queue.queue.get("jobQueueType")
    if queue_type != QUOTA_MANAGED_QUEUE_TYPE:
        problems.append(
            Problem(
                where,
                f"job queue {name!r} is of type {queue_type or 'ECS (the default)'}: quota shares need a "
                f"{QUOTA_MANAGED_QUEUE_TYPE} job queue (jobQueueType)",
            )
        )
    policy = queue.scheduling_policy
    if policy is None:
        problems.append(
            Problem(
                where,
                f"job queue {name!r} has no scheduling policy: quota shares need one with a quotaSharePolicy "
                "(CreateSchedulingPolicy, then a job queue created with it)",
            )
        )
    elif policy.get("quotaSharePolicy") is None:
        problems.append(
            Problem(
                where,
                f"job queue {name!r} has the fair-share scheduling policy {policy.get('name')!r}: quota shares need "
                "a quotaSharePolicy, and AWS does not change a policy's type",
            )
        )
    environments = queue.service_environments
    if len(environments) != 1:
        problems.append(
            Problem(
                where,
                f"job queue {name!r} has {len(environments)} service environments: quota management needs exactly "
                "one SAGEMAKER_TRAINING service environment (serviceEnvironmentOrder)",
            )
        )
    else:
        units = [limit.get("capacityUnit") for limit in environments[0].get("capacityLimits", [])]
        if "NUM_INSTANCES" in units:
            problems.append(
                Problem(
                    where,
                    f"service environment {environments[0]['serviceEnvironmentName']!r} limits NUM_INSTANCES: "
                    "quota management needs one capacity limit per instance type",
                )
            )
    return problems


# -- the diff ----------------------------------------------------------------------------------


def capacity_of(limits: Iterable[Mapping[str, Any]]) -> dict[str, int | None]:
    """``capacityLimits`` as {instance type: maxCapacity}."""
    return {str(limit["capacityUnit"]): limit.get("maxCapacity") for limit in limits}


def share_fields(aws: Mapping[str, Any]) -> dict[str, Any]:
    """A quota share's fields, flat and as AWS names them, with AWS's defaults filled in:
    ``state`` ENABLED, a LEND_AND_BORROW share's ``borrowLimit`` -1 (no other strategy has one)."""
    fields: dict[str, Any] = {
        f"capacityLimits.{unit}": n for unit, n in capacity_of(aws.get("capacityLimits", [])).items()
    }
    sharing = aws.get("resourceSharingConfiguration") or {}
    strategy = sharing.get("strategy")
    fields["resourceSharingConfiguration.strategy"] = strategy
    if strategy == Strategy.LEND_AND_BORROW.value:
        fields["resourceSharingConfiguration.borrowLimit"] = sharing.get("borrowLimit", -1)
    fields["preemptionConfiguration.inSharePreemption"] = (aws.get("preemptionConfiguration") or {}).get(
        "inSharePreemption"
    )
    fields["state"] = aws.get("state") or ENABLED
    return fields


def field_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> tuple[FieldChange, ...]:
    """The fields whose values differ, in the order of ``new`` then those only in ``old``."""
    names = list(new) + [name for name in old if name not in new]
    return tuple(FieldChange(n, old.get(n), new.get(n)) for n in names if old.get(n) != new.get(n))


SECTIONS = ("capacityLimits", "resourceSharingConfiguration", "preemptionConfiguration", "state")
"""The parts of a quota share ``UpdateQuotaShare`` sets, each whole."""


def plan(config: QuotaConfig, queue: JobQueueState) -> Plan:
    """What ``apply`` would change on ``queue`` to make it ``config``; raises InvalidInput
    when the queue cannot hold quota shares (``queue_problems``)."""
    problems = queue_problems(queue)
    if problems:
        raise InvalidInput(problems)
    want = desired(config)
    refused = list(want.refused)
    environment = queue.service_environment
    policy = queue.scheduling_policy or {}
    changes: list[Change] = []

    actual_capacity = capacity_of(environment.get("capacityLimits", []))
    capacity_changes = field_changes(
        {f"capacityLimits.{t}": n for t, n in actual_capacity.items()},
        {f"capacityLimits.{t}": n for t, n in want.capacity.items()},
    )
    if capacity_changes:
        changes.append(
            Change(
                "update",
                "service environment",
                str(environment["serviceEnvironmentName"]),
                "UpdateServiceEnvironment",
                {
                    "serviceEnvironment": environment["serviceEnvironmentArn"],
                    "capacityLimits": [{"maxCapacity": n, "capacityUnit": t} for t, n in want.capacity.items()],
                },
                capacity_changes,
            )
        )

    on_aws = {str(s["quotaShareName"]): s for s in queue.quota_shares if s.get("status") != "DELETING"}
    deleting = sorted(str(s["quotaShareName"]) for s in queue.quota_shares if s.get("status") == "DELETING")
    going = "being deleted on AWS: not counted among the job queue's shares"
    changes += [_left_alone(name, going) for name in deleting]
    for share in want.quota_shares:
        name = share["quotaShareName"]
        existing = on_aws.get(name)
        if name in deleting:
            refused.append(
                Note("shares", name, "a quota share of this name is being deleted on AWS: plan again once it is gone")
            )
            continue
        if existing is None:
            changes.append(
                Change(
                    "create",
                    "quota share",
                    name,
                    "CreateQuotaShare",
                    {**share, "jobQueue": queue.queue["jobQueueArn"]},
                    field_changes({}, share_fields(share)),
                )
            )
            continue
        differences = field_changes(share_fields(existing), share_fields(share))
        if differences:
            touched = {d.name.split(".")[0] for d in differences}
            request = {"quotaShareArn": existing["quotaShareArn"]}
            request.update({section: share[section] for section in SECTIONS if section in touched})
            changes.append(Change("update", "quota share", name, "UpdateQuotaShare", request, differences))
    wanted = {s["quotaShareName"] for s in want.quota_shares}
    unmanaged = [name for name in on_aws if name not in wanted]
    not_in_file = (
        "on AWS, not in the file: left as it is (deleting a quota share terminates all its jobs; "
        "disable it, then DeleteQuotaShare, in AWS Batch yourself)"
    )
    changes += [_left_alone(name, not_in_file) for name in unmanaged]
    total = len(wanted) + len(unmanaged)
    if total > MAX_QUOTA_SHARES >= len(wanted):
        refused.append(
            Note(
                "shares",
                f"{len(wanted)} shares, and {len(unmanaged)} more on AWS ({', '.join(unmanaged)})",
                f"the job queue would have {total} quota shares: AWS Batch attaches at most {MAX_QUOTA_SHARES}",
            )
        )
    for type_name, capacity in want.capacity.items():
        left_alone = {
            name: n for name in unmanaged if (n := capacity_of(on_aws[name].get("capacityLimits", [])).get(type_name))
        }
        total_limits = sum(s.capacity_limits.get(type_name, 0) for s in config.shares) + sum(left_alone.values())
        if left_alone and total_limits > capacity:
            refused.append(
                Note(
                    f"pool.capacity.{type_name}",
                    str(capacity),
                    f"the limits would sum to {total_limits} with the quota shares left alone on AWS "
                    f"({', '.join(f'{k} {v}' for k, v in left_alone.items())}); a limit is a guarantee, so the "
                    "limits must fit in the capacity: add those shares to the file, or delete them in AWS Batch",
                )
            )
    return Plan(
        job_queue=queue.name,
        service_environment=str(environment["serviceEnvironmentName"]),
        scheduling_policy=str(policy.get("name", "")),
        changes=tuple(_apply_order(changes)),
        kept=want.kept,
        refused=tuple(refused),
    )


def _apply_order(changes: list[Change]) -> list[Change]:
    """The service environment's capacity first (a share's limits fit in it), then the updates,
    then the creations, then what is left alone."""
    rank = {("update", "service environment"): 0, ("update", "quota share"): 1, ("create", "quota share"): 2}
    return sorted(changes, key=lambda c: rank.get((c.action, c.kind), 3))


# -- showing a plan ----------------------------------------------------------------------------

SYMBOL = {"create": "+", "update": "~", "unmanaged": "?"}


def plan_text(plan: Plan) -> str:
    """The plan as ``terraform plan`` shows one: ``+`` create, ``~`` update (``field: old →
    new``), ``?`` left alone, ``=`` kept by airflow-quota only, ``!`` refused."""
    lines = [
        f"Job queue {plan.job_queue} (service environment {plan.service_environment}, "
        f"quota-share scheduling policy {plan.scheduling_policy})",
        "",
    ]
    for change in plan.changes:
        head = f"{SYMBOL[change.action]} {change.kind} {change.name}"
        if change.operation:
            head += f" ({change.operation})"
        if change.note:
            head += f": {change.note}"
        lines.append(head)
        for item in change.fields:
            lines.append(f"    {item.name}: {shown(item.new)}" if change.action == "create" else f"    {item}")
    lines += [f"= {note.shown('kept by airflow-quota only')}" for note in plan.kept]
    lines += [f"! {note.shown('refused')}" for note in plan.refused]
    if len(lines) == 2:
        lines.append("No changes: the job queue matches the file.")
    lines += ["", summary(plan)]
    return "\n".join(lines) + "\n"


def summary(plan: Plan) -> str:
    parts = [
        f"{plan.count('create')} to create",
        f"{plan.count('update')} to update",
        f"{plan.count('unmanaged')} not managed here",
        f"{len(plan.kept)} kept by airflow-quota only",
        f"{len(plan.refused)} refused",
    ]
    verdict = "AWS Batch cannot express the file: nothing to apply." if plan.refused else ""
    return f"Plan: {', '.join(parts)}." + (f" {verdict}" if verdict else "")


def plan_document(plan: Plan) -> dict[str, Any]:
    """The plan as one JSON document (``--json``)."""
    return {
        "job_queue": plan.job_queue,
        "service_environment": plan.service_environment,
        "scheduling_policy": plan.scheduling_policy,
        "changes": [
            {
                "action": c.action,
                "kind": c.kind,
                "name": c.name,
                "operation": c.operation,
                "request": dict(c.request) if c.request is not None else None,
                "fields": [{"name": f.name, "old": f.old, "new": f.new} for f in c.fields],
                **({"note": c.note} if c.note else {}),
            }
            for c in plan.changes
        ],
        "kept": [note.document() for note in plan.kept],
        "refused": [note.document() for note in plan.refused],
    }


# -- import ------------------------------------------------------------------------------------


def _left_alone(name: str, why: str) -> Change:
    """A quota share on AWS that the plan does not touch, and why."""
    return Change("unmanaged", "quota share", name, None, None, note=why)


def quota_mapping(queue: JobQueueState) -> dict[str, Any]:
    """The job queue's quota objects as a quota.yaml mapping: the pool from the service
    environment's limits, a share per quota share (those being deleted left out). A share that
    preempts inside gets ``in_share_preemption_after_seconds: 0``, as AWS preempts at once."""
    problems = queue_problems(queue)
    if problems:
        raise InvalidInput(problems)
    capacity = capacity_of(queue.service_environment.get("capacityLimits", []))
    shares = []
    for aws in queue.quota_shares:
        if aws.get("status") == "DELETING":
            continue
        sharing = aws.get("resourceSharingConfiguration") or {}
        share: dict[str, Any] = {
            "name": aws["quotaShareName"],
            "capacity_limits": capacity_of(aws.get("capacityLimits", [])),
            "strategy": sharing.get("strategy"),
        }
        if sharing.get("strategy") == Strategy.LEND_AND_BORROW.value:
            share["borrow_limit"] = sharing.get("borrowLimit", -1)
        preempts = (aws.get("preemptionConfiguration") or {}).get("inSharePreemption") == ENABLED
        share["in_share_preemption"] = preempts
        if preempts:
            share["in_share_preemption_after_seconds"] = 0
        share["state"] = aws.get("state") or ENABLED
        shares.append(share)
    return {"pool": {"capacity": capacity}, "shares": shares}


def import_config(queue: JobQueueState) -> tuple[dict[str, Any], QuotaConfig]:
    """``quota_mapping`` and the configuration it is; what airflow-quota's rules refuse of it
    (a limit sum above the service environment's capacity, an unknown instance type, ...)
    raises InvalidInput under the job queue's name, so no file ``validate`` refuses is written."""
    mapping = quota_mapping(queue)
    try:
        return mapping, parse_config(mapping)
    except InvalidInput as exc:
        raise exc.in_file(f"job queue {queue.name}") from None


def import_yaml(queue: JobQueueState) -> str:
    """The job queue's quota objects as quota.yaml text, with where they came from."""
    mapping, _ = import_config(queue)
    environment = queue.service_environment
    head = [
        f"# Imported from AWS Batch job queue {queue.name} ({queue.queue['jobQueueArn']}),",
        f"# service environment {environment['serviceEnvironmentName']}. AWS preempts in a share at once:",
        "# in_share_preemption_after_seconds is 0 where in-share preemption is on.",
    ]
    body = yaml.safe_dump(mapping, sort_keys=False, default_flow_style=None, width=120)
    return "\n".join(head) + "\n" + body


__all__ = [
    "Change",
    "Desired",
    "FieldChange",
    "JobQueueState",
    "Note",
    "Plan",
    "desired",
    "expressibility",
    "import_config",
    "import_yaml",
    "plan",
    "plan_document",
    "plan_text",
    "queue_problems",
    "quota_mapping",
    "quota_share",
]
