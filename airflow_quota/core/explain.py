"""One readable line per decision, for logs: what happened, to whom, and why."""

from __future__ import annotations

from airflow_quota.core.model import (
    Alert,
    Decision,
    Failed,
    Placed,
    Preempted,
    PriorityChanged,
    Rejected,
    Requeued,
    Submitted,
    Succeeded,
)


def describe(decision: Decision) -> str:
    """``t=600 PREEMPTED qs1-med [qs1] CROSS_SHARE by qs2-job, lost 0 s: <why>``."""
    head = f"t={decision.at:g}"
    who = f"{decision.job} [{decision.share}]"
    if isinstance(decision, Submitted):
        return f"{head} SUBMITTED {who}"
    if isinstance(decision, Rejected):
        return f"{head} REJECTED {decision.request} of {who}: {decision.error}"
    if isinstance(decision, Placed):
        return f"{head} PLACED {who} on {decision.entry}, attempt {decision.attempt}: {decision.reason}"
    if isinstance(decision, Preempted):
        return (
            f"{head} PREEMPTED {who} {decision.kind.value} by {decision.by}, lost {decision.lost_seconds:g} s, "
            f"grace {decision.grace_seconds:g} s: {decision.reason}"
        )
    if isinstance(decision, Requeued):
        return f"{head} REQUEUED {who} after a failed attempt: {decision.reason}"
    if isinstance(decision, Succeeded):
        return f"{head} SUCCEEDED {who}"
    if isinstance(decision, Failed):
        return f"{head} FAILED {who} {decision.reason.value}: {decision.detail}"
    if isinstance(decision, PriorityChanged):
        return f"{head} PRIORITY_CHANGED {who} {decision.old} -> {decision.new}"
    if isinstance(decision, Alert):
        where = f", position {decision.position} in its share" if decision.position else ""
        return f"{head} ALERT {decision.kind.value} {who}: {decision.reason}{where}"
    return f"{head} {type(decision).__name__} {who}"
