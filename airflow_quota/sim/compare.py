"""One trace under several quota policies (issue 6): what a policy does to each team before an
administrator adopts it.

A policy is one of

``shares``
    the quota configuration as given (``--quota``);
``static``
    the same shares at the same limits, every one RESERVE: a static partition, which is what
    Airflow pools give (no share uses another's idle GPUs);
``open``
    one open FIFO pool with no quotas: every job goes to a single share holding the whole pool,
    without starvation reservations, so the pool packs as tightly as FIFO with backfilling
    allows. It is the utilisation bound the other policies are measured against;
a path
    another quota file, to compare any two configurations;
``what-if``
    the quota configuration with some share fields changed on every share (``--what-if
    FIELD=VALUE``, ``what_if_policy``): what a setting would do, beside the policy as given.

Each policy replays the same trace through the simulator; the per-share figures are computed
per *tenant* of the trace (its share under ``shares``), so the open pool's single share is
broken down the same way. Figures are those of ``simulate --json`` wherever the simulator
reports them (``build_report``); the timeline, the wait quantiles and the under-limit flags
are recorded from the decisions as the run goes.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_quota.core.config import QuotaConfig, Share, Strategy, load_config, parse_config
from airflow_quota.core.explain import number
from airflow_quota.core.measures import percentile
from airflow_quota.core.model import Decision, Failed, Placed, Preempted, Rejected, Requeued, Submitted, Succeeded
from airflow_quota.exceptions import InvalidInput, Problem
from airflow_quota.sim.gc_tuning import fewer_collections
from airflow_quota.sim.report import build_report
from airflow_quota.sim.simulator import Simulator
from airflow_quota.sim.traces import Trace, TraceJobs, listed, map_rows, trace_scenario

BUILTIN = ("shares", "static", "open")
DEFAULT_POLICIES = BUILTIN
WHAT_IF = "what-if"
"""The name of the policy ``--what-if`` adds."""
WHAT_IF_FIELDS = tuple(
    name for name in Share.model_fields if name not in ("name", "capacity_limits", "access", "aws_conn_id")
)
"""The share fields a what-if may change: every field that holds one value and bears on the
scheduling (not the name, the limits, access rules or the AWS connection)."""
OPEN_SHARE = "open"
NO_STARVATION = 1e12
"""Seconds: a starvation threshold never reached, so the open pool makes no reservation."""
TIMELINE_BINS = 300
QUANTILES = tuple(range(101))
"""Percent ranks of the wait-time distribution kept per share and policy (0 = min, 100 = max)."""

Progress = Callable[[str, float, int, int], None]
"""(policy, simulated time, jobs finished, jobs in the trace), called after every cycle."""


@dataclass(frozen=True)
class Policy:
    """A named quota configuration to replay the trace under."""

    name: str
    description: str
    config: QuotaConfig
    open_pool: bool = False
    """Every job goes to the single share ``open``, whatever its tenant."""
    types_from: QuotaConfig | None = None
    """Where a trace row without an instance type finds its type: the open pool's rows take
    the type their tenant's share would give them under the quota file."""


def static_partition(config: QuotaConfig) -> QuotaConfig:
    """The same shares at the same limits, every one RESERVE: nobody lends or borrows."""
    raw = config.model_dump(mode="python", exclude_none=True)
    for share in raw["shares"]:
        share["strategy"] = Strategy.RESERVE
        share.pop("borrow_limit", None)
    return QuotaConfig.model_validate(raw)


def open_pool(config: QuotaConfig) -> QuotaConfig:
    """One share ``open`` holding the whole pool, with no starvation reservation: FIFO (by
    priority, then submission) with backfilling, the tightest packing of the three."""
    capacity = config.pool.capacity
    if len(capacity) > 5:
        raise InvalidInput.single(
            "--policy open", f"the pool has {len(capacity)} instance types; one share may hold at most 5"
        )
    raw = config.model_dump(mode="python", exclude_none=True)
    raw["shares"] = [
        {
            "name": OPEN_SHARE,
            "capacity_limits": dict(capacity),
            "strategy": Strategy.RESERVE,
            "starvation_after_seconds": NO_STARVATION,
        }
    ]
    return QuotaConfig.model_validate(raw)


def resolve_policies(names: list[str], config: QuotaConfig) -> list[Policy]:
    """``shares`` / ``static`` / ``open`` / a path to another quota file, in the order given."""
    policies: list[Policy] = []
    problems = []
    seen: set[str] = set()
    for given in names:
        if given == "shares":
            policy = Policy("shares", "the quota configuration as given", config)
        elif given == "static":
            policy = Policy(
                "static", "every share RESERVE at the same limits (a static partition)", static_partition(config)
            )
        elif given == "open":
            policy = Policy(
                "open", "one open FIFO pool, no quotas (the utilisation bound)", open_pool(config), True, config
            )
        else:
            path = Path(given)
            if not path.suffix and not path.exists():
                problems.append(f"{given!r} is not a policy ({', '.join(BUILTIN)}) nor a quota file")
                continue
            other = load_config(path)  # its problems name the file
            policy = Policy(path.stem, f"the quota configuration of {path}", other)
        if policy.name in seen:
            problems.append(f"{given!r}: a policy named {policy.name!r} is already compared")
            continue
        seen.add(policy.name)
        policies.append(policy)
    if problems:
        raise InvalidInput.single("--policy", "; ".join(problems))
    return policies


def what_if_changes(items: list[str]) -> dict[str, Any]:
    """``FIELD=VALUE`` items (``--what-if``) as share fields: VALUE is read as a YAML scalar
    (``86400``, ``true``, ``LEND``), FIELD must be a one-value field of a share; a field given
    twice keeps its last value."""
    import yaml

    changes: dict[str, Any] = {}
    problems: list[Problem] = []
    for item in items:
        field_name, sep, text = item.partition("=")
        field_name = field_name.strip()
        if not sep or not field_name or not text.strip():
            problems.append(Problem("--what-if", f"{item!r} must be FIELD=VALUE, e.g. starvation_after_seconds=86400"))
            continue
        if field_name not in WHAT_IF_FIELDS:
            problems.append(
                Problem("--what-if", f"{field_name!r} is not a share field it can change ({', '.join(WHAT_IF_FIELDS)})")
            )
            continue
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError:
            value = text  # not YAML: the share's own validation says what is wrong with it
        if isinstance(value, dict | list):
            problems.append(Problem("--what-if", f"{item!r}: the value must be a single value, not a list or mapping"))
            continue
        changes[field_name] = value
    if problems:
        raise InvalidInput(problems)
    return changes


def what_if_policy(config: QuotaConfig, changes: dict[str, Any]) -> Policy:
    """The policy ``what-if``: ``config`` with ``changes`` set on every share (the same limits,
    the same trace mapping). A value a share refuses is an error under ``--what-if``, once per
    field, not once per share."""
    raw = config.model_dump(mode="python", exclude_none=True)
    for share in raw["shares"]:
        share.update(changes)
    try:
        changed = parse_config(raw)
    except InvalidInput as exc:
        seen: dict[str, Problem] = {}
        for problem in exc.problems:
            field_name = problem.path.rpartition(".")[2]
            shown = f"{field_name}={changes[field_name]!r}" if field_name in changes else problem.path
            seen.setdefault(shown, Problem("--what-if", f"{shown}: {problem.message}"))
        raise InvalidInput(list(seen.values())) from None
    described = ", ".join(f"{name}={value}" for name, value in changes.items())
    return Policy(WHAT_IF, f"the quota configuration with {described} on every share", changed)


@dataclass
class Recorder:
    """Watches one run's decisions: GPUs held per tenant over time, and which submissions found
    their share under its limit."""

    tenant_of: dict[str, str]
    gpus_per_instance: dict[str, int]
    scheduler: Any = None
    changes: list[tuple[float, str, int]] = field(default_factory=list)
    """(time, tenant, change in GPUs held)."""
    under_limit: set[str] = field(default_factory=set)
    rejected: Counter[str] = field(default_factory=Counter)
    _held: dict[str, int] = field(default_factory=dict)

    def __call__(self, decision: Decision) -> None:
        name = decision.job
        if isinstance(decision, Placed):
            gpus = decision.entry.count * self.gpus_per_instance[decision.entry.instance_type]
            self._held[name] = gpus
            self.changes.append((decision.at, self.tenant_of[name], gpus))
        elif isinstance(decision, Preempted | Succeeded | Failed | Requeued):
            gpus = self._held.pop(name, 0)
            if gpus:
                self.changes.append((decision.at, self.tenant_of[name], -gpus))
        elif isinstance(decision, Submitted) and self.scheduler is not None:
            job = self.scheduler.job(name)
            entry = job.entries[0]
            ledger = self.scheduler.state.types[entry.instance_type]
            if ledger.usage_of(job.share) + entry.count <= ledger.limit_of(job.share):
                self.under_limit.add(name)
        elif isinstance(decision, Rejected) and decision.request == "submit":
            self.rejected[self.tenant_of.get(name, decision.share)] += 1


@dataclass
class PolicyRun:
    """What one policy did to the trace, kept small: the simulator's report is summarised and
    dropped (for the full trace it is hundreds of MB)."""

    policy: Policy
    tenants: list[str]
    tenant_of: dict[str, str]
    pool: dict[str, Any]
    shares: dict[str, dict[str, Any]]
    waits: dict[str, float]
    """job name → seconds it waited (RUNNABLE), for jobs that were not rejected."""
    wait_quantiles: dict[str, list[float]]
    changes: list[tuple[float, str, int]]
    under_limit: set[str]
    alerts: dict[str, int]
    end: float
    wall_seconds: float
    skipped: list[Problem]
    """Rows left out under skip_bad_rows (unreadable, or not mappable under this policy)."""


def _share_of(policy: Policy) -> Callable[[str], str] | None:
    return (lambda _tenant: OPEN_SHARE) if policy.open_pool else None


@fewer_collections()
def run_policy(
    policy: Policy,
    trace: Trace,
    *,
    skip_bad_rows: bool = False,
    checkpoint_interval: float | None = None,
    until: float | None = None,
    progress: Progress | None = None,
) -> PolicyRun:
    """Replay the trace under one policy and summarise it per tenant."""
    started = time.perf_counter()
    jobs: TraceJobs = trace_scenario(
        trace,
        policy.config,
        skip_bad_rows=skip_bad_rows,
        share_of=_share_of(policy),
        types_from=policy.types_from,
        checkpoint_interval=checkpoint_interval,
    )
    total = len(jobs.scenario.events)
    report_progress = None
    if progress is not None:
        notify = progress

        def report_progress(now: float, _cycles: int, finished: int) -> None:
            notify(policy.name, now, finished, total)

    simulator = Simulator(jobs.scenario, until=until, progress=report_progress)
    catalogue = policy.config.catalogue()
    recorder = Recorder(jobs.tenant_of, {t: catalogue[t].gpus for t in policy.config.pool.capacity})
    if not policy.open_pool:
        recorder.scheduler = simulator.scheduler
    simulator.on_decision = recorder
    result = simulator.run()
    report = build_report(result)
    tenants = sorted(set(jobs.tenant_of.values()))
    summary = _per_tenant(report, jobs.tenant_of, tenants, recorder, policy.open_pool)
    alerts = Counter(a["kind"] for a in report["alerts"])
    waits = {name: float(job["wait_seconds"]) for name, job in report["jobs"].items()}
    quantiles = {tenant: summary[tenant].pop("_quantiles") for tenant in tenants}
    pool = dict(report["pool"])
    pool["rejected"] = sum(recorder.rejected.values())
    pool["jobs"] = len(report["jobs"])
    ordered = sorted(waits.values())
    pool["wait_mean"] = number(sum(ordered) / len(ordered), 3) if ordered else 0
    pool["wait_p50"] = number(percentile(ordered, 0.50), 3)
    pool["wait_p95"] = number(percentile(ordered, 0.95), 3)
    pool["wait_max"] = number(ordered[-1], 3) if ordered else 0
    pool["preemptions"] = sum(s["preemptions"] for s in summary.values())
    pool["lost_gpu_hours"] = number(sum(s["lost_gpu_hours"] for s in summary.values()))
    return PolicyRun(
        policy=policy,
        tenants=tenants,
        tenant_of=jobs.tenant_of,
        pool=pool,
        shares=summary,
        waits=waits,
        wait_quantiles=quantiles,
        changes=recorder.changes,
        under_limit=recorder.under_limit,
        alerts={kind: alerts.get(kind, 0) for kind in ("STARVING", "PREEMPTED_REPEATEDLY", "GUARANTEE_VIOLATED")},
        end=result.end,
        wall_seconds=time.perf_counter() - started,
        skipped=jobs.skipped,
    )


def _per_tenant(
    report: dict[str, Any], tenant_of: dict[str, str], tenants: list[str], recorder: Recorder, open_pool: bool
) -> dict[str, dict[str, Any]]:
    """Per tenant: the simulator's share figures when the tenant is a share of the policy,
    else the same figures computed from its jobs (the open pool's one share, broken down)."""
    waits: dict[str, list[float]] = {t: [] for t in tenants}
    totals: dict[str, Counter[str]] = {t: Counter() for t in tenants}
    for name, job in report["jobs"].items():
        tenant = tenant_of[name]
        waits[tenant].append(float(job["wait_seconds"]))
        totals[tenant].update(
            {
                "gpu_hours": job["gpu_hours"],
                "lost_gpu_hours": job["lost_gpu_hours"],
                "preemptions": job["preemptions"],
                "cost": job["cost"],
            }
        )
    out: dict[str, dict[str, Any]] = {}
    for tenant in tenants:
        ordered = sorted(waits[tenant])
        own = None if open_pool else report["shares"].get(tenant)
        if own is not None:
            record = {k: own[k] for k in own if k != "plan_fallback_cost"}
        else:
            t = totals[tenant]
            record = {
                "gpu_hours": number(t["gpu_hours"]),
                "utilization": None,
                "borrowed_gpu_hours": None,
                "lent_gpu_hours": None,
                "wait_mean": number(sum(ordered) / len(ordered), 3) if ordered else 0,
                "wait_p50": number(percentile(ordered, 0.50), 3),
                "wait_p95": number(percentile(ordered, 0.95), 3),
                "wait_max": number(ordered[-1], 3) if ordered else 0,
                "preemptions": int(t["preemptions"]),
                "lost_gpu_hours": number(t["lost_gpu_hours"]),
                "cost": number(t["cost"], 4),
            }
        record["jobs"] = len(ordered)
        record["rejected"] = recorder.rejected.get(tenant, 0)
        record["cost_per_job"] = number(record["cost"] / len(ordered), 4) if ordered else 0
        record["_quantiles"] = [number(percentile(ordered, q / 100), 3) for q in QUANTILES]
        out[tenant] = record
    return out


def compare(
    trace: Trace,
    policies: list[Policy],
    *,
    skip_bad_rows: bool = False,
    checkpoint_interval: float | None = None,
    until: float | None = None,
    progress: Progress | None = None,
    on_done: Callable[[PolicyRun], None] | None = None,
) -> list[PolicyRun]:
    """Replay the trace under each policy in turn (one run at a time: memory stays that of one).

    Every policy's mapping of the trace is checked first, so that a row a later policy cannot
    take (a share its quota file lacks) is refused before any run, not after the first."""
    found: dict[Problem, list[str]] = {}
    for policy in policies:
        _, bad = map_rows(trace, policy.config, _share_of(policy), policy.types_from)
        for problem in bad:
            found.setdefault(problem, []).append(policy.name)
    if found and not skip_bad_rows:
        # a row every policy refuses is listed once; one some policies refuse names them
        problems = [
            p if len(names) == len(policies) else Problem(p.path, f"{p.message} (policy {', '.join(names)})")
            for p, names in found.items()
        ]
        raise InvalidInput(listed(problems))
    runs = []
    for policy in policies:
        run = run_policy(
            policy,
            trace,
            skip_bad_rows=skip_bad_rows,
            checkpoint_interval=checkpoint_interval,
            until=until,
            progress=progress,
        )
        if on_done is not None:
            on_done(run)
        runs.append(run)
    return runs


# -- the comparison document ------------------------------------------------------------------


def capacity_gpus(config: QuotaConfig) -> int:
    catalogue = config.catalogue()
    return sum(count * catalogue[name].gpus for name, count in config.pool.capacity.items())


def limit_gpus(config: QuotaConfig) -> dict[str, int]:
    """Each share's limits in GPUs, all types together."""
    catalogue = config.catalogue()
    return {s.name: sum(n * catalogue[t].gpus for t, n in s.capacity_limits.items()) for s in config.shares}


def timeline(
    changes: list[tuple[float, str, int]], tenants: list[str], width: float, bins: int
) -> dict[str, list[float]]:
    """Mean GPUs held per tenant in each of ``bins`` bins of ``width`` seconds from t=0: the
    exact time integral of the step function the changes describe, divided by the width."""
    area = {t: [0.0] * bins for t in tenants}
    level = dict.fromkeys(tenants, 0)
    since = dict.fromkeys(tenants, 0.0)

    def spread(tenant: str, start: float, end: float, gpus: int) -> None:
        if gpus == 0 or end <= start:
            return
        row = area[tenant]
        index = min(int(start / width), bins - 1)
        while start < end and index < bins:
            edge = (index + 1) * width if index < bins - 1 else end
            stop = min(end, edge)
            row[index] += gpus * (stop - start)
            start = stop
            index += 1

    horizon = width * bins
    for at, tenant, delta in changes:
        spread(tenant, since[tenant], at, level[tenant])
        level[tenant] += delta
        since[tenant] = at
    for tenant in tenants:
        spread(tenant, since[tenant], horizon, level[tenant])
    return {t: [number(a / width, 3) for a in row] for t, row in area.items()}


def held_gpu_seconds(changes: list[tuple[float, str, int]], start: float, end: float) -> float:
    """GPU-seconds held by everyone between ``start`` and ``end``."""
    total = 0.0
    level = 0
    last = start
    for at, _, delta in changes:
        if at > end:
            break
        if at > last:
            total += level * (at - last)
            last = at
        level += delta
    if end > last:
        total += level * (end - last)
    return total


def comparison_document(trace: Trace, runs: list[PolicyRun]) -> dict[str, Any]:
    """The comparison as one JSON document: per policy its pool and share figures, and the
    data of every figure of the report under ``figures``."""
    tenants = sorted({t for run in runs for t in run.tenants})
    horizon = max(run.end for run in runs) or 1.0
    width = horizon / TIMELINE_BINS
    first = trace.rows[0].submit if trace.rows else 0.0
    last = trace.rows[-1].submit if trace.rows else 0.0
    by_name = {run.policy.name: run for run in runs}
    open_run = next((run for run in runs if run.policy.open_pool), None)
    policies: dict[str, Any] = {}
    figures: dict[str, Any] = {
        "utilisation": {
            "bin_seconds": number(width, 3),
            "t": [number(i * width, 3) for i in range(TIMELINE_BINS)],
            "trace_window": [number(first), number(last)],
            "policies": {},
        },
        "wait_distribution": {"quantiles": list(QUANTILES), "policies": {}},
        "borrowed_lent": {},
        "preemptions": {},
        "cost": {},
        "wait_table": {},
        "protection": {},
    }
    for run in runs:
        name = run.policy.name
        cap = capacity_gpus(run.policy.config)
        window = last - first
        during = held_gpu_seconds(run.changes, first, last) / (cap * window) if cap and window > 0 else 0.0
        pool = dict(run.pool)
        pool["capacity_gpus"] = cap
        pool["utilization_during_trace"] = number(during, 4)
        policies[name] = {
            "description": run.policy.description,
            "pool": pool,
            "alerts": run.alerts,
            "shares": run.shares,
            "wall_seconds": number(run.wall_seconds, 2),
            "skipped_rows": len(run.skipped),
        }
        series = timeline(run.changes, tenants, width, TIMELINE_BINS)
        pool_series = [number(sum(series[t][i] for t in tenants), 3) for i in range(TIMELINE_BINS)]
        limits = {} if run.policy.open_pool else limit_gpus(run.policy.config)
        figures["utilisation"]["policies"][name] = {
            "capacity_gpus": cap,
            "limit_gpus": {t: limits.get(t) for t in tenants},
            "pool": pool_series,
            "shares": series,
        }
        figures["wait_distribution"]["policies"][name] = run.wait_quantiles
        shares = run.shares
        if not run.policy.open_pool:
            figures["borrowed_lent"][name] = {
                t: {k: shares[t][k] for k in ("borrowed_gpu_hours", "lent_gpu_hours")} for t in run.tenants
            }
        figures["preemptions"][name] = {
            t: {k: shares[t][k] for k in ("preemptions", "lost_gpu_hours")} for t in run.tenants
        }
        figures["cost"][name] = {t: {k: shares[t][k] for k in ("cost", "cost_per_job")} for t in run.tenants}
        figures["wait_table"][name] = {
            t: {k: shares[t][k] for k in ("jobs", "rejected", "wait_mean", "wait_p50", "wait_p95", "wait_max")}
            for t in run.tenants
        }
        if open_run is not None and not run.policy.open_pool:
            figures["protection"][name] = _protection(run, open_run)
    return {
        "trace": {
            "spec": trace.spec,
            "jobs": len(trace.rows),
            "bad_rows": len(trace.problems),
            "first_submit": number(first),
            "last_submit": number(last),
        },
        "policies": policies,
        "figures": figures,
        "compared": list(by_name),
    }


def _protection(run: PolicyRun, open_run: PolicyRun) -> dict[str, Any]:
    """Per tenant: jobs submitted while their share was under its limit (their entry fitted
    under it), their mean wait under this policy and the same jobs' mean wait in the open pool."""
    out: dict[str, Any] = {}
    names_of: dict[str, list[str]] = {t: [] for t in run.tenants}
    for name in sorted(run.under_limit):
        if name in run.waits and name in open_run.waits:
            names_of[run.tenant_of[name]].append(name)
    for tenant, names in names_of.items():
        mine = sum(run.waits[n] for n in names) / len(names) if names else 0.0
        theirs = sum(open_run.waits[n] for n in names) / len(names) if names else 0.0
        out[tenant] = {
            "jobs_under_limit": len(names),
            "wait_mean": number(mine, 3),
            "open_wait_mean": number(theirs, 3),
        }
    return out
