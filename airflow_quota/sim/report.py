"""The simulator's output: the JSON document of docs/simulate.md and a readable summary."""

from __future__ import annotations

import copy
import json
from typing import Any

from airflow_quota.core.explain import event_record, number
from airflow_quota.core.human_time import duration_words
from airflow_quota.core.measures import charge, percentile
from airflow_quota.core.model import (
    Alert,
    Job,
    JobState,
)
from airflow_quota.core.state import QuotaState
from airflow_quota.core.visibility import pending_view
from airflow_quota.sim.simulator import SimulationResult


def build_report(result: SimulationResult) -> dict[str, Any]:
    """The whole ``--json`` document."""
    scheduler = result.scheduler
    state = scheduler.state
    end = result.end
    for ledger in state.types.values():
        state.meter.touch(ledger, end)

    jobs: dict[str, Any] = {}
    waits: dict[str, list[float]] = {name: [] for name in state.shares}
    share_cost: dict[str, float] = dict.fromkeys(state.shares, 0.0)
    share_lost: dict[str, float] = dict.fromkeys(state.shares, 0.0)
    share_preemptions: dict[str, int] = dict.fromkeys(state.shares, 0)
    share_fallback: dict[str, float] = dict.fromkeys(state.shares, 0.0)
    for job in sorted(state.jobs.values(), key=lambda j: j.seq):
        wait = job.wait_seconds
        if job.placement is not None and job.state.holds_capacity and not job.placement.waiting_for:
            job = _charged_until(state, job, end)
        elif job.state is JobState.RUNNABLE:
            wait += end - job.runnable_since
        gpu_seconds, cost = job.gpu_seconds, job.cost
        last = job.last_placement
        record: dict[str, Any] = {
            "state": job.state.value,
            "reason": job.failure.value if job.failure else None,
            "share": job.share,
            "priority": job.priority,
            "attempts": job.attempts,
            "preemptions": len(job.preemptions),
            "wait_seconds": number(wait),
            "instance_type": last.instance_type if last else None,
            "count": last.count if last else None,
            "training_plan": last.training_plan if last else None,
            "gpu_hours": number(gpu_seconds / 3600),
            "lost_gpu_hours": number(job.lost_gpu_seconds / 3600),
            "cost": number(cost, 4),
            "failed_attempts": job.failed_attempts,
            "lost_seconds": number(sum(p.lost_seconds for p in job.preemptions)),
            "usage": [
                {
                    "instance_type": instance_type,
                    "source": source,
                    "instance_hours": number(line.instance_seconds / 3600),
                    "gpu_hours": number(line.gpu_seconds / 3600),
                    "cost": number(line.cost, 4),
                }
                for (instance_type, source), line in job.usage.items()
            ],
        }
        if job.state is JobState.RUNNABLE:
            record.update(pending_view(state, job, end))
        jobs[job.name] = record
        waits[job.share].append(wait)
        share_cost[job.share] += cost
        share_lost[job.share] += job.lost_gpu_seconds / 3600
        share_preemptions[job.share] += len(job.preemptions)
        share_fallback[job.share] += job.fallback_cost

    shares: dict[str, Any] = {}
    for name in state.shares:
        totals = state.meter.totals(name)
        ordered = sorted(waits[name])
        shares[name] = {
            "gpu_hours": number(totals.gpu_seconds / 3600),
            "utilization": number(totals.gpu_seconds / totals.limit_gpu_seconds, 4)
            if totals.limit_gpu_seconds
            else 0.0,
            "borrowed_gpu_hours": number(totals.borrowed_gpu_seconds / 3600),
            "lent_gpu_hours": number(totals.lent_gpu_seconds / 3600),
            "wait_mean": number(sum(ordered) / len(ordered), 3) if ordered else 0,
            "wait_p50": number(percentile(ordered, 0.50), 3),
            "wait_p95": number(percentile(ordered, 0.95), 3),
            "wait_max": number(ordered[-1], 3) if ordered else 0,
            "preemptions": share_preemptions[name],
            "lost_gpu_hours": number(share_lost[name]),
            "cost": number(share_cost[name], 4),
            "plan_fallback_cost": number(share_fallback[name], 4),
        }
    meter = state.meter
    pool = {
        "gpu_hours": number(meter.pool_gpu_seconds / 3600),
        "utilization": number(meter.pool_gpu_seconds / meter.capacity_gpu_seconds, 4)
        if meter.capacity_gpu_seconds
        else 0.0,
        "cost": number(sum(share_cost.values()), 4),
        "plan_fallback_cost": number(sum(share_fallback.values()), 4),
        "end": number(end),
        "cycles": result.cycles,
    }
    alerts = [
        {
            "t": number(d.at),
            "kind": d.kind.value,
            "job": d.job,
            "share": d.share,
            "reason": d.reason,
            "position": d.position,
            **({"overtaken_by": d.overtaken_by} if d.overtaken_by is not None else {}),
        }
        for d in result.decisions
        if isinstance(d, Alert)
    ]
    return {
        "events": [event_record(d) for d in result.decisions],
        "jobs": jobs,
        "shares": shares,
        "pool": pool,
        "alerts": alerts,
    }


def _charged_until(state: QuotaState, job: Job, end: float) -> Job:
    """A copy of a job still holding capacity at the end of the run, charged up to ``end``."""
    settled = copy.deepcopy(job)
    assert settled.placement is not None
    entry = settled.placement.entry
    ledger = state.types[entry.instance_type]
    price = state.plans[entry.training_plan].hourly_price if entry.training_plan else ledger.price
    charge(settled, entry, end - settled.placement.placed_at, ledger.gpus, price)
    return settled


def to_json(report: dict[str, Any]) -> str:
    """One JSON document, compact (the C encoder), one line."""
    return json.dumps(report, ensure_ascii=False, separators=(",", ":")) + "\n"


def table(headers: list[str], rows: list[list[Any]]) -> str:
    cells = [headers] + [["-" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _wait(seconds: float | None) -> str | None:
    """A wait in a table cell, in words (``core.human_time``); None (shown "-") for none."""
    return None if seconds is None else duration_words(seconds)


def to_text(report: dict[str, Any]) -> str:
    """The human summary: shares, jobs, alerts."""
    out = []
    pool = report["pool"]
    out.append(
        f"Simulated {pool['end']} s ({duration_words(pool['end'])}) in {pool['cycles']} cycles: pool GPU utilisation "
        f"{pool['utilization']:.0%}, {pool['gpu_hours']} GPU-hours, cost ${pool['cost']}"
    )
    out.append("")
    out.append("Shares")
    out.append(
        table(
            ["share", "GPU-h", "util", "borrowed GPU-h", "lent GPU-h", "wait mean", "p95", "max", "preempted", "cost"],
            [
                [
                    n,
                    s["gpu_hours"],
                    f"{s['utilization']:.0%}",
                    s["borrowed_gpu_hours"],
                    s["lent_gpu_hours"],
                    _wait(s["wait_mean"]),
                    _wait(s["wait_p95"]),
                    _wait(s["wait_max"]),
                    s["preemptions"],
                    s["cost"],
                ]
                for n, s in report["shares"].items()
            ],
        )
    )
    out.append("")
    out.append("Jobs")
    out.append(
        table(
            [
                "job",
                "share",
                "prio",
                "state",
                "reason",
                "placed on",
                "attempts",
                "preempted",
                "waited",
                "GPU-h",
                "cost",
            ],
            [
                [
                    n,
                    j["share"],
                    j["priority"],
                    j["state"],
                    j["reason"] or j.get("pending_reason"),
                    f"{j['count']}x {j['instance_type']}" if j["instance_type"] else None,
                    j["attempts"],
                    j["preemptions"],
                    _wait(j["wait_seconds"]),
                    j["gpu_hours"],
                    j["cost"],
                ]
                for n, j in report["jobs"].items()
            ],
        )
    )
    if report["alerts"]:
        out.append("")
        out.append("Alerts")
        out.append(
            table(
                ["t", "kind", "job", "share", "reason"],
                [[a["t"], a["kind"], a["job"], a["share"], a["reason"]] for a in report["alerts"]],
            )
        )
    return "\n".join(out) + "\n"
