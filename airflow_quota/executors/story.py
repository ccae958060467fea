"""The quota's lines in a ``QuotaExecutor`` task's own log: its job's story so far, in time order.

A ``QuotaTrainingOperator`` task logs its job's story as it waits (``describe_job`` at each
change, then ``job_story``). A plain task run by ``QuotaExecutor`` waits while it is QUEUED, with
no process and no log of its own; its try's process starts only once the job is placed. So, when
the try starts, the task process writes the story so far (``executors/task_listener.py``, an
Airflow listener): submitted (job id, share, priority), why and where it waited, placed on
(count x type, plan, borrowing), preempted (by whom, why, work lost), and what this try runs on
and resumes from. Every line is in the words the operator's log uses (``hooks/quota.py``,
``core/explain.py``), stamped with the instant it happened.

The quota scheduler's decision log has every decision but not the waits: why a job waited
changes without a decision. ``QuotaExecutor`` follows each job it holds and keeps those lines
(``WaitLog``); they travel to the try with its placement, in ``AIRFLOW_QUOTA_WAITED``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from airflow_quota.core.explain import instant
from airflow_quota.executors.placement import WAITED, Placement
from airflow_quota.hooks.quota import QuotaHook, describe_job
from airflow_quota.store.models import EventRow, JobRow

MAX_WAIT_LINES = 10
"""A wait keeps its first line and its latest ones up to this many (a long wait in a long queue
changes position often; the try's log needs where it started and how it ended)."""


@dataclass
class WaitLog:
    """Why a held task's job waited, each change once, with when it was first seen."""

    lines: list[tuple[float, str]] = field(default_factory=list)

    def note(self, at: float, line: str) -> None:
        """Keep ``line`` unless it is the last one kept; past ``MAX_WAIT_LINES``, the oldest but
        the first goes."""
        if self.lines and self.lines[-1][1] == line:
            return
        self.lines.append((at, line))
        if len(self.lines) > MAX_WAIT_LINES:
            del self.lines[1]

    def environment(self) -> dict[str, str]:
        """The lines for the try's environment (empty when the job never waited)."""
        return {WAITED: json.dumps(self.lines)} if self.lines else {}


def waited_lines(environ: Mapping[str, str]) -> list[tuple[float, str]]:
    """The wait lines ``QuotaExecutor`` gave this try (``WaitLog.environment``); none when the
    variable is missing or not what the executor writes."""
    try:
        return [(float(at), str(line)) for at, line in json.loads(environ.get(WAITED, "[]"))]
    except (ValueError, TypeError):
        return []


def waiting_line(
    job_id: int,
    name: str,
    share: str,
    state: str,
    pending_reason: str | None,
    waiting_for: str | None,
    position_in_share: int | None,
    position_in_queue: int | None,
) -> str:
    """``describe_job``'s line for a job known only by the executor's narrow read of a held job
    (``ExecutorJobs.states``): a job never placed yet, so never preempted."""
    job = JobRow(
        id=job_id,
        name=name,
        share=share,
        state=state,
        pending_reason=pending_reason,
        waiting_for=waiting_for,
        position_in_share=position_in_share,
        position_in_queue=position_in_queue,
        preemptions=0,
    )
    return describe_job(job)


def event_line(event: EventRow, job: JobRow) -> str:
    """A decision of the job's log as the operator's log says it: the submission with the job's
    id, share and priority (the operator's "submitted as" line), anything else as the decision
    log wrote it (``job_story``; a placement's line says what it borrowed then)."""
    if event.type == "SUBMITTED":
        priority = job.request.get("priority", job.priority)
        return (
            f"{instant(event.at)} submitted as quota job {job.id} to share {job.share} "
            f"({job.name}, priority {priority})"
        )
    return event.line


def story_so_far(hook: QuotaHook, placement: Placement, waited: list[tuple[float, str]], try_number: int) -> list[str]:
    """The lines for the try's log, in time order: the job's decisions and waits, then what
    this try runs on now (borrowing as it is now) and, after a preemption, what it resumes."""
    job = hook.get_job(placement.job_id)
    if job is None:
        return [f"quota job {placement.job_id} is not in the quota database: no story to tell"]
    events = hook.store.events(job_id=job.id)
    timed = [(event.at, 0, event_line(event, job)) for event in events]
    timed += [(at, 1, f"{instant(at)} {line}") for at, line in waited]
    lines = [line for _, _, line in sorted(timed, key=lambda item: (item[0], item[1]))]
    lines.append(f"this try (Airflow try {try_number}): {hook.describe(job)}")
    if placement.preemptions:
        source = f"from checkpoint {placement.checkpoint_uri}" if placement.checkpoint_uri else "with no checkpoint_uri"
        lines.append(
            f"quota job {job.id} resumes on attempt {placement.attempt} after "
            f"{placement.preemptions} preemption(s), {source}"
        )
    return lines
