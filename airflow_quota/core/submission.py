"""Whether the quota state accepts a submission (docs/model.md rule 2.3): the rules that depend on the
current configuration and the live jobs, beyond the static field rules of ``JobRequest``.
Bad input is worded by ``core.wording``, the same from a job file, the operator and the executor.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from pydantic import ValidationError

from airflow_quota.core.config import pydantic_problems
from airflow_quota.core.model import JobFields, JobRequest, PreferenceEntry
from airflow_quota.core.quota import holding_cap
from airflow_quota.core.state import QuotaState
from airflow_quota.core.wording import not_in_pool, unknown_name
from airflow_quota.exceptions import InvalidInput, Problem, SubmissionRejected


def parse_submission(raw: Mapping[str, Any], pool_types: Collection[str] | None = None) -> tuple[JobRequest, JobFields]:
    """A submission as one mapping (a job file): its ``JobRequest`` and its ``JobFields``
    (``JobFields.keys()``), or InvalidInput with every problem of both, each naming its field
    and the rule or limit it breaks. With ``pool_types`` (the types of the pool applied now),
    the listed types not in it are named too, beside any other problem (six types, five of
    them not in the pool: both said at once). The CLI and the hook (``job_fields``) go through here."""
    keys = JobFields.keys()
    accepted = [*JobRequest.model_fields, *JobFields.model_fields]
    problems: list[Problem] = []
    request: JobRequest | None = None
    fields: JobFields | None = None
    try:
        request = JobRequest.model_validate({k: v for k, v in raw.items() if k not in keys})
    except ValidationError as exc:
        problems.extend(unknown_keys_named(pydantic_problems(exc), accepted, "preferences"))
    try:
        fields = job_fields({k: v for k, v in raw.items() if k in keys})
    except InvalidInput as exc:
        problems.extend(exc.problems)
    if pool_types is not None:
        problems.extend(pool_problems(raw.get("preferences"), pool_types, "preferences"))
    if problems or request is None or fields is None:
        raise InvalidInput(problems)
    return request, fields


def pool_problems(preferences: Any, pool_types: Collection[str], path: str) -> list[Problem]:
    """The types a preference list (as given, valid or not) names that are not in the pool, as
    one problem at ``path``; none when all are (or the list names no type it could read)."""
    if not isinstance(preferences, list):
        return []
    types = [str(e["instance_type"]) for e in preferences if isinstance(e, Mapping) and "instance_type" in e]
    message = not_in_pool(types, pool_types)
    return [] if message is None else [Problem(path, message)]


def unknown_keys_named(problems: list[Problem], accepted: Collection[str], preferences: str) -> list[Problem]:
    """Pydantic's "unknown key" problems of a request, worded with the keys accepted there (the
    request's ``accepted``, or an entry's of the list named ``preferences``) and the closest
    one as "did you mean"; other problems as they are."""
    named = []
    for problem in problems:
        if problem.message == "unknown key":
            head, dot, key = problem.path.rpartition(".")
            if not dot:
                problem = Problem(problem.path, unknown_name(key, accepted, "key"))
            elif head.startswith(f"{preferences}[") and head.endswith("]") and "." not in head:
                problem = Problem(problem.path, unknown_name(key, PreferenceEntry.model_fields, "key"))
        named.append(problem)
    return named


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
    pool_types = [name for name, ledger in state.types.items() if ledger.capacity > 0]
    outside = not_in_pool((entry.instance_type for entry in request.entries()), pool_types)
    if outside is not None:  # every type outside the pool named, before any capacity arithmetic
        raise SubmissionRejected(f"preferences: {outside}")
    for i, entry in enumerate(request.entries()):
        where = f"preferences[{i}]"
        name, n = entry.instance_type, entry.count
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
        ledger = state.types[name]  # in the pool: checked above
        capacity = ledger.capacity
        if n > capacity:
            raise SubmissionRejected(f"{where}.count: {n}x {name} is more than the pool's capacity of {capacity}")
        limit = ledger.limit_of(share.name)
        cap = holding_cap(share, limit)
        if cap is not None and n > cap:
            rule = (
                f"limit {limit} x (1 + borrow_limit {share.effective_borrow_limit}%) = {cap}"
                if share.borrows
                else f"limit {limit} ({share.strategy.value} never borrows)"
            )
            raise SubmissionRejected(f"{where}.count: share {share.name!r} can hold at most {cap}x {name}: {rule}")
        if share.borrows:
            others = sum(lim for s, lim in ledger.limits.items() if s != share.name and state.shares[s].lends)
            unassigned = capacity - sum(ledger.limits.values())
            reachable = limit + others + unassigned
            if n > reachable:
                raise SubmissionRejected(
                    f"{where}.count: share {share.name!r} can reach at most {reachable}x {name} "
                    f"(own limit {limit} + lenders' limits {others} + unassigned {unassigned})"
                )
