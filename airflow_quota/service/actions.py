"""The leader's backend actions: what a start is given (``attempt_spec``), what came of the starts
and stops the poller made, written back as compare-and-sets (``write_outcomes``), and the checks
the poller's threads make around each call so that a leader that lost its lease acts no more
(``LeaseGuards``).

``QuotaService`` asks the poller for the actions its commits recorded (``_dispatch``) and marks
them done with these (``_mark_done``); the attempts' rows are the log of what was asked.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from airflow_quota.core.state import QuotaState
from airflow_quota.service.backends.base import AttemptSpec
from airflow_quota.service.polling import ActionKind, ActionOutcome, BackendAction
from airflow_quota.store.bulk import pipelined, update_by_key
from airflow_quota.store.lock import LeaderLease
from airflow_quota.store.models import Attempt, AttemptState, JobRow

Written = list[tuple[ActionOutcome, dict[str, Any]]]
"""The outcomes written, each with the columns it set (the leader's kept attempts follow them)."""

_STARTED_OR_TO_START = frozenset(
    state.value for state in (AttemptState.PLACED, AttemptState.STARTING, AttemptState.PENDING, AttemptState.RUNNING)
)
"""An open attempt's statuses in which its leader wants it running (``undo_of_late_start``)."""


def attempt_spec(row: JobRow, attempt: Attempt, state: QuotaState | None) -> AttemptSpec:
    """What a backend is given to start or stop an attempt: the job's submission (``row``), the
    attempt's placement, and from the configuration the scheduler runs (``state``) the type's
    GPUs, the plan's ARN and the share's AWS connection where the job names none."""
    plan_arn, gpus, share_conn = None, 0, None
    if state is not None:
        spec = state.catalogue.get(attempt.instance_type)
        gpus = spec.gpus if spec else 0
        if attempt.training_plan:
            plan = state.config.plan(attempt.training_plan)
            plan_arn = plan.arn if plan else None
        share = state.config.share(row.share)
        share_conn = share.aws_conn_id if share is not None else None
    return AttemptSpec(
        job_id=row.id,
        job_name=row.name,
        attempt=attempt.number,
        share=row.share,
        instance_type=attempt.instance_type,
        count=attempt.count,
        gpus=gpus,
        training_plan=attempt.training_plan,
        training_plan_arn=plan_arn,
        checkpoint_uri=row.request.get("checkpoint_uri"),
        training=row.training,
        aws_conn_id=row.aws_conn_id or share_conn,
    )


def write_outcomes(
    session: Session, outcomes: list[ActionOutcome], retry_stops: bool
) -> tuple[Written, list[ActionOutcome]]:
    """Write what came of starts and stops in the session's (fenced) transaction, each as a
    compare-and-set: only if the attempt still has that action. So an outcome that comes back
    after another leader took over is not written (the fence rolls it back), nor a start's after
    a preemption turned it into a stop (the stop decides what comes next). A start's training
    job name and ARN are kept either way. Returns the outcomes written and the failures to log.

    A stop the backend refused stays asked for (``retry_stops``), and the next step asks for it
    again: the attempt may still run, its capacity already given to its preemptor, and the job's
    next attempt must not start before it has stopped. Only a stop no backend here can make (not
    configured) is given up."""
    done = [outcome for outcome in outcomes if outcome.error is None]
    failed: list[ActionOutcome] = []
    written: Written = []
    with pipelined(session):  # compare-and-sets whose counts nobody reads: one round trip
        for kind, status in ((ActionKind.START, AttemptState.PENDING.value), (ActionKind.STOP, None)):
            values: dict[str, Any] = {"action": None} if status is None else {"action": None, "status": status}
            of_kind = [outcome for outcome in done if outcome.kind is kind]
            written.extend((outcome, values) for outcome in of_kind)
            update_by_key(
                session,
                Attempt,
                [{"job_id": o.key[0], "number": o.key[1], **values} for o in of_kind],
                only_if={"action": kind.value},
            )
        named = [
            {"job_id": o.key[0], "number": o.key[1], "external_name": o.started.name, "external_arn": o.started.arn}
            for o in done
            if o.started is not None
        ]
        if named:  # the deterministic name: writing it again is harmless
            update_by_key(session, Attempt, named)
    for outcome in outcomes:
        if outcome.error is None:
            continue
        if outcome.kind is ActionKind.STOP and retry_stops:
            failed.append(outcome)  # its action stays: asked again at the next step
            continue
        values = {"action": None}
        if outcome.kind is ActionKind.START:  # the next poll reports it as a failed attempt
            values.update(status=AttemptState.START_FAILED.value, reason=f"BackendError: {outcome.error}")
        job_id, number = outcome.key
        result = session.execute(
            update(Attempt)
            .where(Attempt.job_id == job_id, Attempt.number == number, Attempt.action == outcome.kind.value)
            .values(**values),
            execution_options={"synchronize_session": False},
        )
        if result.rowcount:  # type: ignore[attr-defined]
            failed.append(outcome)
            written.append((outcome, values))
    return written, failed


def mark_starting_since_upgrade(session: Session) -> None:
    """A START recorded by a version that carried it out inside the step is still PLACED: it is
    STARTING from now on, as every start recorded since (``records._placed``)."""
    session.execute(
        update(Attempt)
        .where(Attempt.action == ActionKind.START.value, Attempt.status == AttemptState.PLACED.value)
        .values(status=AttemptState.STARTING.value)
    )


class LeaseGuards:
    """What the poller's threads ask around each backend call, in two reads of their own so that
    they never wait on the step's transactions. Only while ``fencing()`` (``run`` leads): a step
    driven by tests has no lease to lose."""

    def __init__(self, sessions: sessionmaker[Session], lock: LeaderLease, fencing: Callable[[], bool]) -> None:
        self.sessions = sessions
        self.lock = lock
        self.fencing = fencing

    def still_wanted(self, action: BackendAction) -> bool:
        """Just before a backend action: this process still leads (its lease, under its epoch,
        has not run out) and the action is still the one recorded. A leader frozen after asking
        for an action and resumed after a takeover does not carry it out."""
        if not self.fencing():
            return True
        with self.sessions() as session:
            if not self.lock.holds(session.connection()):
                return False
            fresh = session.get(Attempt, action.key)
            return fresh is not None and fresh.action == action.kind.value

    def undo_of_late_start(self, action: BackendAction) -> BackendAction | None:
        """Just after a start returned: the stop that undoes it when it came too late, else
        None. While this process leads, None: its own step handles whatever its log says (a stop
        asked for meanwhile waits for this start to return). Once it has lost the lease, the start
        may have been made after the next leader stopped the attempt, or gave it up: unless the log
        still has it to start or started and open (then the next leader follows it), the stop with
        the log's grace, the same the next leader's own stop has."""
        if not self.fencing():
            return None
        with self.sessions() as session:
            if self.lock.holds(session.connection()):
                return None
            fresh = session.get(Attempt, action.key)
            wanted = (
                fresh is not None
                and fresh.ended_at is None
                and fresh.action != ActionKind.STOP.value
                and fresh.status in _STARTED_OR_TO_START
            )
            if wanted:
                return None  # the next leader starts it under the same key (a no-op) and follows it
            grace = fresh.stop_grace if fresh is not None and fresh.stop_grace is not None else 0.0
        return BackendAction(ActionKind.STOP, action.spec, grace)
