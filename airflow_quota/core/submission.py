"""Whether the quota state accepts a submission (docs/model.md rule 2.3): the rules that depend on the
current configuration and the live jobs, beyond the static field rules of ``JobRequest``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from airflow_quota.core.config import pydantic_problems
from airflow_quota.core.model import JobFields, JobRequest
from airflow_quota.core.quota import holding_cap
from airflow_quota.core.state import QuotaState
from airflow_quota.exceptions import InvalidInput, Problem, SubmissionRejected


def parse_submission(raw: Mapping[str, Any]) -> tuple[JobRequest, JobFields]:
    """A submission as one mapping (a job file): its ``JobRequest`` and its ``JobFields``
    (``JobFields.keys()``), or InvalidInput with every problem of both, each naming its field
    and the rule or limit it breaks. The CLI and the hook (``job_fields``) go through here."""
    keys = JobFields.keys()
    problems: list[Problem] = []
    request: JobRequest | None = None
    fields: JobFields | None = None
    try:
        request = JobRequest.model_validate({k: v for k, v in raw.items() if k not in keys})
    except ValidationError as exc:
        problems.extend(pydantic_problems(exc))
    try:
        fields = job_fields({k: v for k, v in raw.items() if k in keys})
    except InvalidInput as exc:
        problems.extend(exc.problems)
    if problems or request is None or fields is None:
        raise InvalidInput(problems)
    return request, fields


def job_fields(raw: Mapping[str, Any]) -> JobFields:
    """Validate what is stored beside a request (backend, training, client_token, dag_id,
    task_id, run_id); InvalidInput names each field and its limit."""
    try:
        return JobFields.model_validate(dict(raw))
    except ValidationError as exc:
        raise InvalidInput(pydantic_problems(exc)) from None


def check_submission(state: QuotaState, request: JobRequest) -> None:
    """Raise SubmissionRejected naming the rule when the job can never be accepted as it is.

    Mirrors SageMaker: if any entry of the list could never be placed, the request is rejected.
    """
    share = state.shares.get(request.share)
    if share is None:
        raise SubmissionRejected(f"share: no share named {request.share!r}")
    if share.state.value == "DISABLED":
        raise SubmissionRejected(f"share: share {share.name!r} is DISABLED and accepts no submissions")
    if request.name in state.live_names:
        raise SubmissionRejected(f"name: a live job is already named {request.name!r}")
    if request.priority > share.max_priority:
        raise SubmissionRejected(
            f"priority: {request.priority} is above share {share.name!r}'s max_priority {share.max_priority}"
        )
    if share.require_checkpoint and share.can_be_preempted and not request.checkpoint_uri:
        raise SubmissionRejected(
            f"checkpoint_uri: share {share.name!r} requires a checkpoint location for jobs that can be preempted"
        )
    for i, entry in enumerate(request.entries()):
        where = f"preferences[{i}]"
        name, n = entry.instance_type, entry.count
        if name not in state.catalogue:
            raise SubmissionRejected(f"{where}.instance_type: unknown instance type {name!r}")
        if entry.training_plan is not None:
            plan = state.plans.get(entry.training_plan)
            if plan is None:
                raise SubmissionRejected(f"{where}.training_plan: no training plan named {entry.training_plan!r}")
            if plan.instance_type != name:
                raise SubmissionRejected(
                    f"{where}.training_plan: plan {plan.name!r} is for {plan.instance_type}, not {name}"
                )
            if n > plan.count:
                raise SubmissionRejected(f"{where}.count: {n} is more than plan {plan.name!r}'s {plan.count} instances")
        ledger = state.types.get(name)
        capacity = ledger.capacity if ledger else 0
        if n > capacity:
            raise SubmissionRejected(f"{where}.count: {n}x {name} is more than the pool's capacity of {capacity}")
        limit = ledger.limit_of(share.name) if ledger else 0
        cap = holding_cap(share, limit)
        if cap is not None and n > cap:
            rule = (
                f"limit {limit} x (1 + borrow_limit {share.effective_borrow_limit}%) = {cap}"
                if share.borrows
                else f"limit {limit} ({share.strategy.value} never borrows)"
            )
            raise SubmissionRejected(f"{where}.count: share {share.name!r} can hold at most {cap}x {name}: {rule}")
        if share.borrows and ledger is not None:
            others = sum(lim for s, lim in ledger.limits.items() if s != share.name and state.shares[s].lends)
            unassigned = capacity - sum(ledger.limits.values())
            reachable = limit + others + unassigned
            if n > reachable:
                raise SubmissionRejected(
                    f"{where}.count: share {share.name!r} can reach at most {reachable}x {name} "
                    f"(own limit {limit} + lenders' limits {others} + unassigned {unassigned})"
                )
