"""Benchmark: the Microsoft ITP trace (69,351 jobs, ``data/traces/itp-2021``) replayed through
the quota scheduler, next to a bare FIFO replay of the same jobs.

    python benchmarks/itp_replay.py              # scaling 1k / 10k / 69k, then the 3-policy comparison
    python benchmarks/itp_replay.py --quick      # 1k / 10k only, no comparison
    python benchmarks/itp_replay.py --compare-only
    python benchmarks/itp_replay.py --quick --measure-idle   # and GPU-hours idle while a fitting job waits

The quota: 10 shares (one per cluster file) over 1,200 V100 GPUs (``ml.p3.2xlarge``, one GPU
each), each limit proportional to its cluster's GPU-hours in the trace (largest remainder, so
the limits add up to 1,200), all LEND_AND_BORROW without a borrow limit. It is the same as
``examples/itp-quota.yaml``; the benchmark builds it from the trace and checks that.

1. Scaling: the first 1k / 10k / all jobs (by submission) under that quota, each in a fresh
   process: reading and mapping the trace, the simulation, the report, peak memory (max RSS);
   and, timed in the same process, ``bare_fifo``: a plain event loop with no quota logic.
2. ``airflow-quota compare`` on the whole trace (shares, static, open), with the HTML report
   and its figures written to ``benchmarks/results/``.

``bare_fifo`` replays the jobs on one pool the way the open pool of ``compare`` does (first
fit in FIFO order: a job that does not fit lets the ones behind it start), so its waits must
equal the open pool's: the benchmark prints both as a cross-check.
"""

from __future__ import annotations

import argparse
import heapq
import json
import resource
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_quota.core.cycle import QuotaScheduler
    from airflow_quota.sim.traces import Trace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TRACE = ROOT / "data" / "traces" / "itp-2021"
RESULTS = Path(__file__).resolve().parent / "results"
CAPACITY = 1200
INSTANCE_TYPE = "ml.p3.2xlarge"


def itp_quota(trace_dir: Path = TRACE, capacity: int = CAPACITY) -> dict[str, Any]:
    """One LEND_AND_BORROW share per cluster, limits proportional to its GPU-hours, every other
    setting the model's default (as examples/itp-quota.yaml)."""
    from airflow_quota.sim.traces import read_trace

    trace = read_trace(f"itp:{trace_dir}")
    hours: dict[str, float] = {}
    for row in trace.rows:
        hours[row.tenant] = hours.get(row.tenant, 0.0) + row.duration * row.gpus / 3600
    total = sum(hours.values())
    exact = {name: capacity * h / total for name, h in hours.items()}
    limits = {name: int(value) for name, value in exact.items()}
    # largest remainder: the limits add up to the capacity exactly (ties by name)
    left = capacity - sum(limits.values())
    for name in sorted(exact, key=lambda n: (-(exact[n] - limits[n]), n))[:left]:
        limits[name] += 1
    shares: list[dict[str, Any]] = []
    for name in sorted(limits):
        share: dict[str, Any] = {
            "name": name,
            "capacity_limits": {INSTANCE_TYPE: limits[name]},
            "strategy": "LEND_AND_BORROW",
        }
        shares.append(share)
    return {"pool": {"capacity": {INSTANCE_TYPE: capacity}}, "shares": shares}


def first_jobs(jobs: int | None = None, trace_dir: Path = TRACE) -> Trace:
    """The first ``jobs`` rows of the trace by submission (all of them for None)."""
    from airflow_quota.sim.traces import Trace, read_trace

    full = read_trace(f"itp:{trace_dir}")
    if full.problems:
        print(f"warning: {len(full.problems):,} unreadable rows in the trace, left out", file=sys.stderr)
    rows = full.rows if jobs is None else full.rows[:jobs]
    return Trace(full.spec, rows, [], full.start)


def bare_fifo(jobs: list[tuple[float, float, int]], capacity: int) -> tuple[list[float], float]:
    """Replay ``(submit, duration, gpus)`` jobs, sorted by submit time, on one pool of
    ``capacity`` GPUs: at each instant, finishes release GPUs, arrivals queue, then jobs start
    in FIFO order, each one that fits (first fit). Returns every job's wait and the end time.

    The queue is kept per GPU count (a trace has few distinct counts), so choosing the next job
    to start is a look at the head of each count's queue, not a scan of the whole queue."""
    waits = [0.0] * len(jobs)
    queues: dict[int, deque[int]] = {}
    running: list[tuple[float, int]] = []  # (finish time, gpus)
    free = capacity
    now = 0.0
    nxt = 0
    while nxt < len(jobs) or running:
        now = min(jobs[nxt][0] if nxt < len(jobs) else float("inf"), running[0][0] if running else float("inf"))
        while running and running[0][0] <= now:
            free += heapq.heappop(running)[1]
        while nxt < len(jobs) and jobs[nxt][0] == now:
            gpus = jobs[nxt][2]
            if gpus <= capacity:
                queues.setdefault(gpus, deque()).append(nxt)
            nxt += 1
        while free > 0:
            heads = [(q[0], gpus) for gpus, q in queues.items() if q and gpus <= free]
            if not heads:
                break
            index, gpus = min(heads)
            queues[gpus].popleft()
            submit, duration, _ = jobs[index]
            waits[index] = now - submit
            free -= gpus
            heapq.heappush(running, (now + duration, gpus))
    return waits, now


class IdleWhileWaiting:
    """GPU-seconds left idle while a RUNNABLE job that would fit in them waits (the open pool,
    first fit, leaves none): after every cycle (``Simulator.after_each_cycle``), the idle count
    and whether the smallest job waiting fits in it, integrated until the next cycle."""

    def __init__(self) -> None:
        self.last = 0.0
        self.idle = 0
        self.fits = False
        self.gpu_seconds = 0.0

    def __call__(self, scheduler: QuotaScheduler, now: float) -> None:
        if self.fits:
            self.gpu_seconds += self.idle * (now - self.last)
        state = scheduler.state
        ledger = state.types[INSTANCE_TYPE]
        self.idle = ledger.capacity - ledger.used - ledger.draining
        waiting = [n for q in state.queues.values() for (_, n), bucket in q.buckets.items() if bucket]
        self.fits = bool(waiting) and min(waiting) <= self.idle
        self.last = now


def worker(jobs: int, quota_path: Path, measure_idle: bool = False) -> dict[str, Any]:
    """One measure, in this (fresh) process: the first ``jobs`` jobs under the quota, then the
    bare FIFO replay of the same jobs."""
    from airflow_quota.core.config import load_config
    from airflow_quota.sim.report import build_report
    from airflow_quota.sim.simulator import Simulator
    from airflow_quota.sim.traces import trace_scenario

    started = time.perf_counter()
    trace = first_jobs(jobs)
    config = load_config(quota_path)
    scenario = trace_scenario(trace, config).scenario
    loaded = time.perf_counter()
    simulator = Simulator(scenario)
    idle = IdleWhileWaiting() if measure_idle else None
    if idle is not None:
        simulator.after_each_cycle(idle)
    result = simulator.run()
    simulated = time.perf_counter()
    report = build_report(result)
    reported = time.perf_counter()
    waits = [j["wait_seconds"] for j in report["jobs"].values()]
    alerts = [a["kind"] for a in report["alerts"]]
    summary = {
        "jobs": len(trace.rows),
        "load_s": loaded - started,
        "simulate_s": simulated - loaded,
        "report_s": reported - simulated,
        "policy_s": reported - started,
        "cycles": result.cycles,
        "pool_utilization": report["pool"]["utilization"],
        "wait_mean": sum(waits) / len(waits),
        "preemptions": sum(1 for e in report["events"] if e["type"] == "PREEMPTED"),
        "guarantee_violated": alerts.count("GUARANTEE_VIOLATED"),
    }
    if idle is not None:
        summary["idle_while_waiting_gpu_hours"] = idle.gpu_seconds / 3600
    del report, result, scenario
    rows = [(r.submit, r.duration, r.gpus) for r in trace.rows]
    start = time.perf_counter()
    bare_waits, _ = bare_fifo(rows, CAPACITY)
    summary["bare_s"] = time.perf_counter() - start
    summary["bare_wait_mean"] = sum(bare_waits) / len(bare_waits)
    summary["ratio"] = summary["policy_s"] / summary["bare_s"]
    summary["max_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return summary


def scaling(sizes: list[int], quota_path: Path, measure_idle: bool = False) -> list[dict[str, Any]]:
    """Each size in a fresh process (``--worker``), one line each."""
    rows = []
    for size in sizes:
        idle = ["--measure-idle"] if measure_idle else []
        done = subprocess.run(
            [sys.executable, __file__, "--worker", str(size), "--quota", str(quota_path), *idle],
            capture_output=True,
            text=True,
            check=True,
        )
        row = json.loads(done.stdout)
        rows.append(row)
        print(
            f"   {row['jobs']:>6,} jobs: policy {row['policy_s']:6.1f} s (load {row['load_s']:.1f}, simulate "
            f"{row['simulate_s']:.1f}, report {row['report_s']:.1f}), {row['cycles']:,} cycles, "
            f"max RSS {row['max_rss_mib']:,.0f} MiB | bare FIFO {row['bare_s']:.2f} s, ratio {row['ratio']:.0f}x | "
            f"util {row['pool_utilization']:.1%}, mean wait {row['wait_mean']:,.0f} s "
            f"(bare FIFO {row['bare_wait_mean']:,.0f} s), preemptions {row['preemptions']:,}, "
            f"GUARANTEE_VIOLATED {row['guarantee_violated']}"
            + (
                f", idle while a fitting job waits {row['idle_while_waiting_gpu_hours']:,.0f} GPU-h"
                if "idle_while_waiting_gpu_hours" in row
                else ""
            ),
            flush=True,
        )
    return rows


def comparison(quota_path: Path) -> dict[str, Any]:
    """``airflow-quota compare`` on the whole trace, as a user runs it."""
    RESULTS.mkdir(exist_ok=True)
    report = RESULTS / "itp-report.html"
    command = [
        sys.executable,
        "-m",
        "airflow_quota.cli",
        "compare",
        "--trace",
        f"itp:{TRACE}",
        "--quota",
        str(quota_path),
        *("--policy", "shares", "--policy", "static", "--policy", "open"),
        "--report",
        str(report),
        "--plots",
        str(RESULTS / "itp-plots"),
        "--json",
    ]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    elapsed = time.perf_counter() - start
    document: dict[str, Any] = json.loads(done.stdout)
    print(f"   compare (3 policies, report) in {elapsed:,.0f} s; report {report}", flush=True)
    policies = document["policies"]
    for name, policy in policies.items():
        pool = policy["pool"]
        print(
            f"   {name:>7}: util {pool['utilization']:.2%} (while submitting {pool['utilization_during_trace']:.2%}), "
            f"wait mean {pool['wait_mean']:,.0f} s p95 {pool['wait_p95']:,.0f} s, rejected {pool['rejected']:,}, "
            f"preemptions {pool['preemptions']:,}, lost {pool['lost_gpu_hours']:,.0f} GPU-h, "
            f"GUARANTEE_VIOLATED {policy['alerts']['GUARANTEE_VIOLATED']}, {policy['wall_seconds']:.1f} s",
            flush=True,
        )
    shares, open_pool = policies["shares"]["wall_seconds"], policies["open"]["wall_seconds"]
    print(f"   shares / open replay time: {shares / open_pool:.2f}x (issue 15's target: at most 1.5x)", flush=True)
    return document


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1k and 10k jobs only, no comparison")
    parser.add_argument("--compare-only", action="store_true", help="only the 3-policy comparison")
    parser.add_argument(
        "--measure-idle",
        action="store_true",
        help="also measure the GPU-hours left idle while a job that would fit them waits (scaling runs)",
    )
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--quota", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        print(json.dumps(worker(args.worker, args.quota, args.measure_idle)))
        return
    import yaml

    from airflow_quota.core.config import load_config, parse_config

    RESULTS.mkdir(exist_ok=True)
    quota = itp_quota()
    quota_path = RESULTS / "itp-quota.yaml"
    quota_path.write_text(yaml.safe_dump(quota, sort_keys=False))
    example = load_config(ROOT / "examples" / "itp-quota.yaml")
    same = parse_config(quota) == example
    print(f"quota: 10 shares over {CAPACITY:,} GPUs, the same as examples/itp-quota.yaml: {same}")
    if not args.compare_only:
        print("1. scaling: one policy (the quota above) next to a bare FIFO replay")
        scaling([1000, 10000] if args.quick else [1000, 10000, 69351], quota_path, args.measure_idle)
    if not args.quick:
        print("2. airflow-quota compare --policy shares --policy static --policy open, whole trace")
        comparison(quota_path)


if __name__ == "__main__":
    main()
