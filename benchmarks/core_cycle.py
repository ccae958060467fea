"""Benchmark of the scheduling core and of ``airflow-quota simulate`` end to end.

    python benchmarks/core_cycle.py            # everything (a few minutes)
    python benchmarks/core_cycle.py --quick    # smaller sizes

1. Cycle latency: 20 shares × 5 types, 2,000 running jobs, and 1k / 10k / 100k RUNNABLE jobs.
   A steady cycle follows one job finishing (the usual wake-up); a cold cycle looks at every
   job and type (as after a configuration change or a restart).
2. Placement throughput: a cold cycle that places thousands of jobs at once.
3. ``airflow-quota simulate --json`` on full-load scenarios of 5k, 10k and 20k jobs.

    python benchmarks/core_cycle.py --indexes  # the fast index against the full-scan reference

4. With ``--indexes``: the steady cycle at 1k / 10k / 100k RUNNABLE jobs and the simulator on
   the full load and on the ITP trace's first jobs, with each index (``core/index/``): what the
   fast index's memos buy over the model taken literally.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from airflow_quota.core.config import parse_config
from airflow_quota.core.cycle import QuotaScheduler
from airflow_quota.core.index import IndexName
from airflow_quota.core.model import JobRequest, JobState
from benchmarks import workload

RESULTS = Path(__file__).resolve().parent / "results"


def _request(rng: random.Random, config: dict[str, Any], i: int) -> JobRequest:
    share = rng.choice(config["shares"])
    types = rng.sample(list(share["capacity_limits"]), min(len(share["capacity_limits"]), rng.randint(1, 3)))
    prefs = [{"instance_type": t, "count": min(rng.randint(1, 4), share["capacity_limits"][t])} for t in types]
    return JobRequest(name=f"j{i}", share=share["name"], priority=rng.choice([1, 5, 9]), preferences=prefs)


def cycle_latency(runnable: int, running: int = 2000, cycles: int = 200, index: IndexName = "fast") -> dict[str, float]:
    raw = workload.quota(capacity_per_type=running)
    config = parse_config(raw)
    rng = random.Random(3)
    scheduler = QuotaScheduler(config)
    scheduler.index = index
    i = 0
    while sum(1 for j in scheduler.state.jobs.values() if j.state is JobState.SCHEDULED) < running and i < 20000:
        scheduler.submit(_request(rng, raw, i), 0.0)
        scheduler.run_cycle(0.0)
        i += 1
    placed = [j for j in scheduler.state.jobs.values() if j.state is JobState.SCHEDULED]
    for n in range(runnable):
        scheduler.submit(_request(rng, raw, i + n), 1.0)
    start = time.perf_counter()
    scheduler.rescan_next_cycle()
    scheduler.run_cycle(1.0)
    cold = time.perf_counter() - start
    times = []
    now = 2.0
    finishing = sorted(placed, key=lambda j: j.seq)
    for k in range(cycles):
        victim = finishing[k % len(finishing)]
        if not victim.state.holds_capacity:
            victim = next(j for j in scheduler.state.jobs.values() if j.state.holds_capacity)
        start = time.perf_counter()
        scheduler.job_running(victim, now)
        scheduler.job_finished(victim, now, succeeded=True)
        scheduler.run_cycle(now)
        times.append(time.perf_counter() - start)
        now += 1.0
    return {
        "runnable": runnable,
        "running": len(placed),
        "cold_cycle_ms": cold * 1000,
        "median_cycle_ms": statistics.median(times) * 1000,
        "p95_cycle_ms": sorted(times)[int(0.95 * len(times))] * 1000,
    }


def placement_throughput(jobs: int = 20000, capacity_per_type: int = 4000) -> dict[str, float]:
    """One cycle placing as many jobs as the pool holds from a queue of ``jobs``; every job in
    the queue is a decision (placed, or left waiting with its reason)."""
    raw = workload.quota(capacity_per_type=capacity_per_type)
    config = parse_config(raw)
    rng = random.Random(5)
    scheduler = QuotaScheduler(config)
    for n in range(jobs):
        scheduler.submit(_request(rng, raw, n), 0.0)
    start = time.perf_counter()
    decisions = scheduler.run_cycle(0.0)
    elapsed = time.perf_counter() - start
    placements = sum(1 for d in decisions if type(d).__name__ == "Placed")
    return {
        "queued": jobs,
        "capacity": sum(config.pool.capacity.values()),
        "placements": placements,
        "seconds": elapsed,
        "placements_per_second": placements / elapsed,
        "decisions_per_second": jobs / elapsed,
    }


def simulate_end_to_end(jobs: int) -> dict[str, float]:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"fullload-{jobs}.yaml"
    path.write_text(json.dumps(workload.scenario(jobs)))
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "airflow_quota.cli", "simulate", str(path), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    elapsed = time.perf_counter() - start
    report = json.loads(done.stdout)
    types = {e["type"] for e in report["events"]}
    counts = {t: sum(1 for e in report["events"] if e["type"] == t) for t in sorted(types)}
    borrowed = sum(1 for e in report["events"] if e["type"] == "PLACED" and e["borrowed"])
    return {
        "jobs": jobs,
        "seconds": elapsed,
        "us_per_job": elapsed / jobs * 1e6,
        "placed": counts.get("PLACED", 0),
        "borrowing_placements": borrowed,
        "preempted": counts.get("PREEMPTED", 0),
        "rejected": counts.get("REJECTED", 0),
        "guarantee_violated": sum(1 for a in report["alerts"] if a["kind"] == "GUARANTEE_VIOLATED"),
        "pool_utilization": report["pool"]["utilization"],
        "cycles": report["pool"]["cycles"],
    }


def simulate_in_process(loaded: Any, index: IndexName) -> dict[str, Any]:
    """The simulator's run of a loaded scenario with the index, timed (loading and the report
    left out)."""
    from airflow_quota.sim.simulator import Simulator

    simulator = Simulator(loaded, index=index)
    start = time.perf_counter()
    decisions = simulator.run().decisions
    return {"index": index, "seconds": time.perf_counter() - start, "decisions": len(decisions)}


def compare_indexes(quick: bool) -> None:
    from airflow_quota.sim.scenario import parse_scenario
    from benchmarks.service_trace import itp_scenario

    print("4a. steady cycle by index (20 shares x 5 types, ~2,000 running)")
    for size in [1000, 10000] if quick else [1000, 10000, 100000]:
        for index in ("fast", "full-scan"):
            row = cycle_latency(size, cycles=200 if index == "fast" else 20, index=index)
            print(
                f"   {index:9} runnable {size}: "
                f"median {row['median_cycle_ms']:.2f} ms, p95 {row['p95_cycle_ms']:.2f} ms",
                flush=True,
            )
    print("4b. the simulator by index")
    workloads = [("full load 5,000 jobs", parse_scenario(workload.scenario(5000), Path(".")))]
    workloads.append(("ITP first 5,000 jobs", itp_scenario(5000)))
    for name, loaded in workloads:
        rows = [simulate_in_process(loaded, index) for index in ("fast", "full-scan")]
        same = "same decisions" if rows[0]["decisions"] == rows[1]["decisions"] else "DIFFERENT COUNTS"
        print(
            f"   {name}: fast {rows[0]['seconds']:.2f} s, full scan {rows[1]['seconds']:.2f} s "
            f"({rows[1]['seconds'] / rows[0]['seconds']:.1f}x), {rows[0]['decisions']} decisions, {same}",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--indexes", action="store_true", help="only the fast index against the full scan")
    args = parser.parse_args()
    if args.indexes:
        compare_indexes(args.quick)
        return
    sizes = [1000, 10000] if args.quick else [1000, 10000, 100000]
    print("1. cycle latency (20 shares x 5 types, ~2,000 running)")
    for size in sizes:
        row = cycle_latency(size)
        print(
            "   " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()),
            flush=True,
        )
    print("2. placement throughput")
    for capacity in (4000, 40000):
        row = placement_throughput(5000 if args.quick else 20000, capacity)
        print(
            "   " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()),
            flush=True,
        )
    print("3. airflow-quota simulate --json, full load")
    for size in [5000, 10000] if args.quick else [5000, 10000, 20000]:
        row = simulate_end_to_end(size)
        print(
            "   " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()),
            flush=True,
        )


if __name__ == "__main__":
    main()
