"""``airflow-quota db prune``: what retention removes now (``store/retention.py``), counted per
table with the cutoff and the oldest rows kept, and, unless it is a dry run, removed in the
leader's batches, each its own short transaction (a running leader goes on between them)."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import Engine

from airflow_quota.core.human_time import clock_time
from airflow_quota.store.engine import reachable, session_factory
from airflow_quota.store.retention import Plan, Removed, Retention

TABLES = {
    "jobs": "quota_jobs",
    "attempts": "quota_attempts",
    "task_reports": "quota_task_reports",
    "preemptions": "quota_preemptions",
    "alerts": "quota_alerts",
    "events": "quota_events",
    "requests": "quota_requests",
    "inputs": "quota_inputs",
    "snapshots": "quota_snapshots",
}
"""``Removed``'s counts by the table they count."""


def prune_now(
    engine: Engine, retention_days: float, dry_run: bool, now: float | None = None
) -> tuple[dict[str, Any], str]:
    """Plan (and unless ``dry_run``, prune) at ``now`` (default: the wall clock, the scheduler's);
    returns the JSON document and the text for people."""
    now = time.time() if now is None else now
    retention = Retention(retention_days)
    sessions = session_factory(engine)
    with reachable(str(engine.url)):
        with sessions() as session:
            plan = retention.plan(session, now)
        removed, batches, longest = Removed(), 0, 0.0
        if not dry_run:
            for batch in retention.batches(sessions, now):
                removed.add(batch.removed)
                batches += 1
                longest = max(longest, batch.seconds)
    shown = plan.removed if dry_run else removed
    document: dict[str, Any] = {
        "dry_run": dry_run,
        "retention_days": retention_days,
        "now": now,
        "cutoff": plan.cutoff,
        "cutoff_text": None if plan.cutoff is None else clock_time(plan.cutoff),
        "tables": {table: getattr(shown, name) for name, table in TABLES.items()},
        "hours_compacted": shown.hours_compacted,
        "oldest_kept_job_submitted_at": plan.oldest_kept_job,
        "oldest_kept_input_at": plan.oldest_kept_input,
    }
    if not dry_run:
        document.update(batches=batches, longest_batch_ms=round(longest * 1000, 3))
    return document, _text(plan, shown, dry_run, batches, longest)


def _text(plan: Plan, shown: Removed, dry_run: bool, batches: int, longest: float) -> str:
    """The report for people: the cutoff, rows per table, hours compacted, the oldest kept."""
    if plan.cutoff is None:
        return "retention_days is 0: everything is kept, nothing is pruned"
    cutoff = clock_time(plan.cutoff)
    verb = "would remove (dry run, nothing written)" if dry_run else "removed"
    lines = [f"cutoff {cutoff}: finished jobs that ended before it go, and the inputs a snapshot covers", f"{verb}:"]
    width = max(len(table) for table in TABLES.values())
    lines += [f"  {table:<{width}}  {getattr(shown, name):>9,}" for name, table in TABLES.items()]
    lines.append(f"hours of share history compacted into quota_share_hours: {shown.hours_compacted:,}")
    kept_job = "none" if plan.oldest_kept_job is None else f"submitted {clock_time(plan.oldest_kept_job)}"
    kept_input = "none" if plan.oldest_kept_input is None else clock_time(plan.oldest_kept_input)
    lines.append(f"oldest kept: job {kept_job}; input {kept_input}")
    if not dry_run:
        lines.append(f"in {batches:,} batches, the longest {longest * 1000:.1f} ms")
    return "\n".join(lines)
