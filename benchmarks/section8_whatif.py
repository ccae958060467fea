"""What if: the Microsoft ITP trace (../shared/traces/itp-2021) replayed under the ITP quota with
some share fields changed, and the wait-time figures the quota model is judged by.

    python benchmarks/section8_whatif.py                                  # whole trace, model defaults
    python benchmarks/section8_whatif.py --jobs 2000 --open               # and the open pool, ratios
    python benchmarks/section8_whatif.py --set starvation_after_seconds=86400 \\
        --set preemption_protection_seconds=1800 --label 'starve 1 d, protect 30 min'
    python benchmarks/section8_whatif.py --what-if no-lender-protection --json

The quota is ``itp_replay.itp_quota()``: 10 LEND_AND_BORROW shares
over 1,200 V100 GPUs, limits proportional to each cluster's GPU-hours in the whole trace, and
every other share field at the quota model's default (STARVING after 48 h, no reservation)
unless ``--set FIELD=VALUE`` gives it, on every share (VALUE is read as a YAML scalar). The
policy is replayed with ``compare.run_policy``, as ``airflow-quota compare`` does; ``--what-if``
goes to ``itp_replay.what_if`` before that run (``measure-idle`` attaches nothing here).

Printed on stdout: a markdown table (header, rule, one row) and, with ``--json``, the same
figures as one JSON object on the last line. Waits are in hours. They are the ``wait_seconds``
of the simulator's report (``build_report``) for every job of the run that was not rejected:
the seconds it spent RUNNABLE, summed over its attempts (a preempted job waits again). The
simulation runs until every job has finished, so each of these jobs was placed (the script
warns if one was left waiting: its wait then counts up to the end of the run). Quantiles are
nearest-rank (``core.measures.percentile``). The other figures:

``STARVING``
    jobs that raised a STARVING alert (the model raises it once per job), and their percent of
    the jobs; ``GUAR_VIOL`` counts GUARANTEE_VIOLATED alerts;
``preempt``
    preemptions, in all and per 1,000 jobs; ``lost GPU-h`` the GPU-hours of work they lost,
    and their percent of all GPU-hours run (the pool meter's, lost work included);
``under-limit``
    the jobs submitted while their share's usage left room for them under its limit (the
    ``Recorder`` of compare.py, its "protection" figure), and their mean wait;
``cycles``, ``wall s``
    scheduling cycles, and the seconds ``run_policy`` took (mapping, simulation, report).

``--open`` also replays the same jobs on the open FIFO pool (``compare.open_pool``: one share,
no quotas, no reservation), or loads its figures from ``benchmarks/results/open-<N>.json``
(keyed by the number of jobs only: delete the file when the core changes), and adds its mean,
p95, p99 and max wait and the ratios of this run's mean, p95 and max to them. The open pool runs
before ``--what-if`` is applied, so that it stays the reference.

Progress (a line per ~10% of jobs finished) goes to stderr. No HTML report, no plots.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from airflow_quota.core.config import QuotaConfig, parse_config
from airflow_quota.core.explain import number
from airflow_quota.core.measures import percentile
from airflow_quota.exceptions import InvalidInput
from airflow_quota.sim.compare import PolicyRun, _protection, capacity_gpus, resolve_policies, run_policy
from airflow_quota.sim.traces import Trace, read_trace
from benchmarks.itp_replay import RESULTS, TRACE, bare_fifo, itp_quota, what_if

HOUR = 3600.0


def parse_sets(items: list[str]) -> dict[str, Any]:
    """``FIELD=VALUE`` pairs, each VALUE a YAML scalar (``86400``, ``true``, ``LEND_ONLY``)."""
    fields: dict[str, Any] = {}
    for item in items:
        field, sep, text = item.partition("=")
        if not sep or not field.strip():
            raise SystemExit(f"--set {item!r}: must be FIELD=VALUE (e.g. starvation_after_seconds=86400)")
        value = yaml.safe_load(text)
        if isinstance(value, dict | list):
            raise SystemExit(f"--set {item!r}: the value must be a scalar")
        fields[field.strip()] = value
    return fields


def quota(fields: dict[str, Any]) -> QuotaConfig:
    """The ITP quota at the model's defaults, with ``fields`` set on every share."""
    raw = itp_quota()
    for share in raw["shares"]:
        share.update(fields)
    try:
        return parse_config(raw)
    except InvalidInput as exc:
        raise SystemExit("--set: the quota is not valid:\n" + "\n".join(f"  {p}" for p in exc.problems)) from None


def first_jobs(jobs: int | None) -> Trace:
    """The first ``jobs`` rows of the trace by submission (all of them for None)."""
    full = read_trace(f"itp:{TRACE}")
    if full.problems:
        print(f"warning: {len(full.problems):,} unreadable rows in the trace, left out", file=sys.stderr)
    rows = full.rows if jobs is None else full.rows[:jobs]
    return Trace(full.spec, rows, [], full.start)


class TenPercent:
    """compare's progress hook: a line on stderr each time another ~10% of the jobs have finished."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.next = 0.1
        self.last = (0, 0)

    def __call__(self, policy: str, now: float, finished: int, total: int) -> None:
        self.last = (finished, total)
        if total and finished >= self.next * total:
            while finished >= self.next * total:
                self.next += 0.1
            print(
                f"  [{policy}] {finished / total:4.0%} of {total:,} jobs finished, simulated "
                f"{now / 86400:,.1f} days, {time.perf_counter() - self.started:,.1f} s",
                file=sys.stderr,
                flush=True,
            )


def replay(config: QuotaConfig, trace: Trace, policy: str) -> PolicyRun:
    """One policy (``shares`` or ``open``) of compare.py on the trace, with progress on stderr."""
    (chosen,) = resolve_policies([policy], config)
    progress = TenPercent()
    run = run_policy(chosen, trace, progress=progress)
    finished, total = progress.last
    placed = total - run.pool["rejected"]
    if finished < placed:
        print(
            f"warning: [{policy}] {placed - finished:,} jobs had not finished at the end of the run; "
            "their waits count up to the end",
            file=sys.stderr,
        )
    if run.pool["rejected"]:
        print(f"warning: [{policy}] {run.pool['rejected']:,} submissions rejected, not counted", file=sys.stderr)
    return run


def waits_hours(run: PolicyRun) -> dict[str, float]:
    """Mean, p50, p95, p99 and max wait of the run's jobs, in hours."""
    ordered = sorted(run.waits.values())
    mean = sum(ordered) / len(ordered) if ordered else 0.0
    return {
        "mean_h": mean / HOUR,
        "p50_h": percentile(ordered, 0.50) / HOUR,
        "p95_h": percentile(ordered, 0.95) / HOUR,
        "p99_h": percentile(ordered, 0.99) / HOUR,
        "max_h": (ordered[-1] if ordered else 0.0) / HOUR,
    }


def open_figures(config: QuotaConfig, trace: Trace) -> dict[str, Any]:
    """The open pool's waits for these jobs: from the cache file, else a run (then cached)."""
    jobs = len(trace.rows)
    path = RESULTS / f"open-{jobs}.json"
    if path.exists():
        cached: dict[str, Any] = json.loads(path.read_text())
        print(f"open pool: {path} (cached, {cached['wall_seconds']:.1f} s when run)", file=sys.stderr)
        return cached
    print(f"open pool: replaying {jobs:,} jobs", file=sys.stderr)
    run = replay(config, trace, "open")
    figures: dict[str, Any] = {"jobs": len(run.waits), **waits_hours(run), "wall_seconds": run.wall_seconds}
    # cross-check (itp_replay): a bare FIFO event loop must give the open pool's waits
    bare, _ = bare_fifo([(r.submit, r.duration, r.gpus) for r in trace.rows], capacity_gpus(config))
    figures["bare_fifo_mean_h"] = sum(bare) / len(bare) / HOUR
    if abs(figures["bare_fifo_mean_h"] - figures["mean_h"]) > 1e-6 * max(1.0, figures["mean_h"]):
        print(
            f"warning: open pool mean wait {figures['mean_h']:.4f} h but bare FIFO {figures['bare_fifo_mean_h']:.4f} h",
            file=sys.stderr,
        )
    figures["trace"] = trace.spec
    RESULTS.mkdir(exist_ok=True)
    path.write_text(json.dumps(figures, indent=1) + "\n")
    return figures


def ratio(mine: float, theirs: float) -> float | None:
    return mine / theirs if theirs else None


def figures(label: str, run: PolicyRun, open_pool: dict[str, Any] | None) -> dict[str, Any]:
    """The row: every figure of the module docstring, rounded for JSON."""
    pool = run.pool
    jobs = len(run.waits)
    protection = _protection(run, run).values()  # this run's under-limit jobs and their mean wait
    under = sum(p["jobs_under_limit"] for p in protection)
    under_wait = sum(p["jobs_under_limit"] * p["wait_mean"] for p in protection) / under if under else 0.0
    gpu_hours = float(pool["gpu_hours"])
    row: dict[str, Any] = {
        "label": label,
        "jobs": jobs,
        **{k: number(v, 4) for k, v in waits_hours(run).items()},
        "starving_jobs": run.alerts["STARVING"],
        "starving_pct": number(100 * run.alerts["STARVING"] / jobs, 3) if jobs else 0,
        "guarantee_violated": run.alerts["GUARANTEE_VIOLATED"],
        "preemptions": pool["preemptions"],
        "preemptions_per_1k_jobs": round(1000 * pool["preemptions"] / jobs, 3) if jobs else 0,
        "lost_gpu_hours": round(float(pool["lost_gpu_hours"]), 2),
        "lost_pct": number(100 * pool["lost_gpu_hours"] / gpu_hours, 4) if gpu_hours else 0,
        "under_limit_jobs": under,
        "under_limit_mean_h": number(under_wait / HOUR, 4),
        "cycles": pool["cycles"],
        "wall_s": round(run.wall_seconds, 1),
    }
    if open_pool is not None:
        row.update({f"open_{k}": number(open_pool[k], 4) for k in ("mean_h", "p95_h", "p99_h", "max_h")})
        for k in ("mean", "p95", "max"):
            value = ratio(row[f"{k}_h"], open_pool[f"{k}_h"])
            row[f"{k}_over_open"] = None if value is None else number(value, 3)
    return row


COLUMNS = {
    "label": "label",
    "jobs": "jobs",
    "mean_h": "mean h",
    "p50_h": "p50 h",
    "p95_h": "p95 h",
    "p99_h": "p99 h",
    "max_h": "max h",
    "starving_jobs": "STARVING",
    "starving_pct": "STARVING %",
    "guarantee_violated": "GUAR_VIOL",
    "preemptions": "preempt",
    "preemptions_per_1k_jobs": "preempt/1k",
    "lost_gpu_hours": "lost GPU-h",
    "lost_pct": "lost %",
    "under_limit_jobs": "under-limit jobs",
    "under_limit_mean_h": "under-limit mean h",
    "cycles": "cycles",
    "wall_s": "wall s",
    "open_mean_h": "open mean h",
    "open_p95_h": "open p95 h",
    "open_p99_h": "open p99 h",
    "open_max_h": "open max h",
    "mean_over_open": "mean/open",
    "p95_over_open": "p95/open",
    "max_over_open": "max/open",
}


def cell(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key.endswith("_h") or key.endswith("_over_open"):
        return f"{value:,.3f}" if key.endswith("_over_open") else f"{value:,.2f}"
    if key.endswith("_pct"):
        return f"{value:.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.1f}"
    return str(value)


def markdown(row: dict[str, Any]) -> str:
    keys = [k for k in COLUMNS if k in row]
    header = "| " + " | ".join(COLUMNS[k] for k in keys) + " |"
    rule = "|" + "|".join("---" if k == "label" else "--:" for k in keys) + "|"
    return "\n".join([header, rule, "| " + " | ".join(cell(k, row[k]) for k in keys) + " |"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, metavar="N", help="only the first N jobs by submission (default: all)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        dest="sets",
        help="set a share field on every share (repeatable), e.g. starvation_after_seconds=86400",
    )
    parser.add_argument("--what-if", default="", metavar="MODES", help="diagnostics of itp_replay.what_if, ','-joined")
    parser.add_argument("--label", help="the row's label (default: the --set and --what-if given)")
    parser.add_argument("--open", action="store_true", help="also the open FIFO pool (cached) and the ratios to it")
    parser.add_argument("--json", action="store_true", help="also the figures as one JSON object (last line)")
    parser.add_argument(
        "--policy",
        choices=["shares", "static"],
        default="shares",
        help="static: every share RESERVE at its limit, as airflow-quota compare's static policy",
    )
    args = parser.parse_args()
    if args.jobs is not None and args.jobs < 1:
        parser.error("--jobs must be ≥ 1")
    started = time.perf_counter()
    fields = parse_sets(args.sets)
    config = quota(fields)
    trace = first_jobs(args.jobs)
    print(f"{len(trace.rows):,} jobs of {TRACE}, quota read in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    label = args.label or " ".join([*(f"{k}={v}" for k, v in fields.items()), *filter(None, [args.what_if])])
    open_pool = open_figures(config, trace) if args.open else None
    what_if(args.what_if)
    print(f"{args.policy}: replaying {len(trace.rows):,} jobs ({label or 'model defaults'})", file=sys.stderr)
    run = replay(config, trace, args.policy)
    row = figures(label or "defaults", run, open_pool)
    row["total_s"] = round(time.perf_counter() - started, 1)
    print(f"done in {row['total_s']} s", file=sys.stderr)
    print(markdown(row))
    if args.json:
        print(json.dumps(row, ensure_ascii=False))


if __name__ == "__main__":
    main()
