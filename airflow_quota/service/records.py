"""The rows a committed decision makes besides its event: an attempt for a placement, a stop
for a preemption or a cancel, a preemption record, an alert. Each decision type says its own
rows (``ROWS_OF``); a type with none there makes only its event.

The attempts are the leader's kept copies (``QuotaService._attempts_of``), changed here and
written by the commit; the other rows are inserted as Core executemanys (the ORM's unit of
work costs more CPU than the database does for them, and nothing reads them back).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from airflow_quota.core.explain import describe, event_record
from airflow_quota.core.model import Alert, Decision, Failed, FailureReason, Job, Placed, Preempted
from airflow_quota.service.polling import ActionKind
from airflow_quota.store.bulk import insert_rows
from airflow_quota.store.models import AlertRow, Attempt, AttemptState, EventRow, Preemption


@dataclass(slots=True)
class DecisionRows:
    """What a commit's decisions make, gathered before it writes them."""

    placed: list[Attempt]
    """The attempts placed (inserted by the commit, and asked to start once committed)."""
    attempts: dict[int, dict[int, Attempt]]
    """The open attempts of the jobs the decisions stop, by job id and number (changed here)."""
    backends: dict[int, str]
    """The backend of each job placed, by job id."""
    events: list[dict[str, Any]] = field(default_factory=list)
    preemptions: list[dict[str, Any]] = field(default_factory=list)
    alerts: list[dict[str, Any]] = field(default_factory=list)

    def insert(self, session: Session) -> None:
        """The rows besides attempts, one executemany a table."""
        for model, rows in ((EventRow, self.events), (Preemption, self.preemptions), (AlertRow, self.alerts)):
            insert_rows(session, model, rows)


def _placed(decision: Placed, job: Job, job_id: int, rows: DecisionRows) -> None:
    """A new attempt, to start on the job's backend."""
    attempt = Attempt(
        job_id=job_id,
        number=decision.attempt,
        backend=rows.backends.get(job_id, "fake"),
        instance_type=decision.entry.instance_type,
        count=decision.entry.count,
        training_plan=decision.entry.training_plan,
        borrowed=decision.borrowed,
        placed_at=decision.at,
        action=ActionKind.START.value,
        status=AttemptState.PLACED.value,
        stop_grace=0.0,
        running_since=None,
        ended_at=None,
        reason=None,
        external_name=None,
        external_arn=None,
    )
    rows.placed.append(attempt)
    rows.attempts.setdefault(job_id, {})[attempt.number] = attempt


def _preempted(decision: Preempted, job: Job, job_id: int, rows: DecisionRows) -> None:
    """The victim's attempt stops (after its grace), and the preemption is recorded."""
    # the attempt placed last *before* this decision: a victim preempted with no grace may be
    # placed again (attempt n + 1) later in the same step, and then job.attempts, the state
    # after the whole step, names the new attempt, not the one to stop
    known = rows.attempts.get(job_id, {})
    number = max(known, default=job.attempts)
    attempt = known.get(number)
    if attempt is not None and attempt.ended_at is None:
        if attempt.status == AttemptState.PLACED.value:  # placed in this step: no backend heard of it
            attempt.action, attempt.status = None, AttemptState.NOT_STARTED.value
        else:  # running, or STARTING (its start may be in flight): stopped after it
            attempt.action, attempt.stop_grace = ActionKind.STOP.value, decision.grace_seconds
            attempt.status = AttemptState.STOPPING.value
    rows.preemptions.append(
        {
            "job_id": job_id,
            "attempt": number,
            "at": decision.at,
            "kind": decision.kind.value,
            "by_job": decision.by,
            "lost_seconds": decision.lost_seconds,
        }
    )


def _failed(decision: Failed, job: Job, job_id: int, rows: DecisionRows) -> None:
    """A cancelled job's attempt stops at once; any other failure ends no attempt here (its
    attempt had ended, or it never had one)."""
    if decision.reason is not FailureReason.CANCELLED:
        return
    attempt = rows.attempts.get(job_id, {}).get(job.attempts)
    if attempt is not None and attempt.ended_at is None and attempt.status != AttemptState.STOPPING.value:
        attempt.action, attempt.stop_grace = ActionKind.STOP.value, 0.0
        attempt.status = AttemptState.STOPPING.value


def _alert(decision: Alert, job: Job, job_id: int, rows: DecisionRows) -> None:
    """The alert, for the notifiers to deliver once committed."""
    rows.alerts.append(alert_row(decision, job_id))


def alert_row(decision: Alert, job_id: int) -> dict[str, Any]:
    """An alert's ``quota_alerts`` row, for the notifiers to deliver once committed."""
    return {
        "at": decision.at,
        "job_id": job_id,
        "job": decision.job,
        "share": decision.share,
        "kind": decision.kind.value,
        "reason": decision.reason,
        "position": decision.position,
        "age_seconds": decision.age_seconds,
    }


def event_row(
    decision: Decision, job_id: int | None, wall_clock: bool, leader_epoch: int | None, input_id: int | None = None
) -> dict[str, Any]:
    """A decision's ``quota_events`` row: its record, its line for people, the leader that made
    it and the input that caused it."""
    record = event_record(decision)
    return {
        "at": decision.at,
        "type": record["type"],
        "job": decision.job,
        "job_id": job_id,
        "share": decision.share,
        "record": record,
        "line": describe(decision, wall_clock=wall_clock),
        "leader_epoch": leader_epoch,
        "input_id": input_id,
    }


RowsOf = Callable[[Any, Job, int, DecisionRows], None]
ROWS_OF: dict[type[Decision], RowsOf] = {Placed: _placed, Preempted: _preempted, Failed: _failed, Alert: _alert}
"""The rows each decision type makes besides its event, given the job it is about."""


def stops_an_attempt(decision: Decision) -> bool:
    """Whether the decision stops the job's open attempt (a preemption or a cancel): its
    attempts are then among ``DecisionRows.attempts``."""
    return isinstance(decision, Preempted) or (
        isinstance(decision, Failed) and decision.reason is FailureReason.CANCELLED
    )


def add_rows(decision: Decision, job: Job, job_id: int, rows: DecisionRows) -> None:
    """The rows of one decision about ``job`` (stored as ``job_id``), besides its event."""
    rows_of = ROWS_OF.get(type(decision))
    if rows_of is not None:
        rows_of(decision, job, job_id, rows)
