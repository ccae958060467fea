"""Benchmark: the Microsoft ITP trace (69,351 jobs, ../shared/traces/itp-2021) replayed through
the quota scheduler, next to a bare FIFO replay of the same jobs.

    python benchmarks/itp_replay.py              # scaling 1k / 10k / 69k, then the 3-policy comparison
    python benchmarks/itp_replay.py --quick      # 1k / 10k only, no comparison
    python benchmarks/itp_replay.py --compare-only
    python benchmarks/itp_replay.py --compare-only --what-if 'no-lender-protection;no-preemption'

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
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TRACE = ROOT.parent / "shared" / "traces" / "itp-2021"
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


def what_if(mode: str) -> None:
    """Diagnostics, not options: switch off a rule of quota-model.md in this process to see
    what it costs (``no-lender-protection``: lenders lend even while their own jobs wait;
    ``no-preemption``: no step 4, so guarantees go unmet; ``borrowing-hold-only``: a starving
    job's reservation holds only borrowing pool-wide, not its own share; ``in-share-hold-only``:
    the reverse, and only for entries that fit under the share's limit), or ``measure-idle`` (see
    ``IdleWhileWaiting``). Variants of section 8 (issue 13), with ``borrowing-hold-only``:
    ``hold-cap-hours=X`` (a starving job holds its reservation at most X hours, then gives it up
    for good: see ``_hold_cap``), ``hold-after-own-count`` (the hold starts only once placements
    overtaking the job since it started starving add up to its own count of instances), and
    ``hold-log`` (how long holds lasted, on stderr at exit). Comma-separated."""
    from airflow_quota.core import phases
    from airflow_quota.core.state import QuotaState

    for item in filter(None, mode.split(",")):
        if item == "measure-idle":
            continue  # the worker attaches the meter
        if item == "no-lender-protection":
            QuotaState.protected_idle = lambda self, ledger, now, usage=None, base=None: 0  # type: ignore[method-assign]
        elif item == "no-preemption":
            phases.preemption = lambda *args, **kwargs: False
        elif item == "borrowing-hold-only":
            from airflow_quota.core.queues import ShareQueue

            ShareQueue.reserves = lambda self, instance_type: False  # type: ignore[method-assign]
        elif item == "in-share-hold-only":
            _in_share_hold_only()
        elif item.startswith("hold-cap-hours="):
            _hold_cap(float(item.partition("=")[2]) * 3600)
        elif item == "hold-after-own-count":
            _hold_after_own_count()
        elif item == "hold-log":
            _hold_log()
        elif item == "borrow-by-usage":
            _borrow_by_usage()
        elif item == "victims-by-lost-gpu-work":
            _victims_by_lost_gpu_work()
        elif item == "victims-no-larger-first":
            _victims_no_larger_first()
        elif item == "starving-takes-later-borrowers":
            _starving_takes_later_borrowers(shielded=False)
        elif item == "starving-takes-later-borrowers-shielded":
            _starving_takes_later_borrowers(shielded=True)
        else:
            raise SystemExit(f"unknown --what-if {item!r}")


def _victims_by_lost_gpu_work() -> None:
    """Victim candidates of each group (reclaim, then in-share) by priority, then by the
    GPU-seconds a preemption would lose (instances x work since the last checkpoint), least
    first, instead of the most recently placed first."""
    from airflow_quota.core import preempt

    original = preempt._candidates

    def candidates(state: Any, job: Any, entry: Any, now: float) -> Any:
        groups: dict[Any, list[Any]] = {}
        for victim, kind in original(state, job, entry, now):
            groups.setdefault(kind, []).append(victim)
        for kind, victims in groups.items():
            victims.sort(key=lambda v: (v.priority, v.placement.entry.count * v.unsaved_work(now), -v.seq))
            for victim in victims:
                yield victim, kind

    preempt._candidates = candidates


def _starving_takes_later_borrowers(shielded: bool) -> None:
    """A starving job (section 8's threshold and overtaken) whose entry is above its share's
    limit may preempt, after step 4, borrowers of other shares submitted after it (later in
    submission order), taken as reclaim victims are and only while their share is above its
    limit, so that it starts at once instead of gathering capacity that frees in pieces. No
    capacity idles and no guaranteed job is touched. With ``shielded``, a
    job placed so is never a reclaim victim afterwards (lenders' jobs then wait for it): the
    ``-shielded`` switch."""
    import heapq

    from airflow_quota.core import phases, preempt
    from airflow_quota.core.lifecycle import Lifecycle, queued
    from airflow_quota.core.model import PreemptionKind

    starving: set[int] = set()
    shield: set[int] = set()
    start_starving = Lifecycle.start_starving
    preemption = phases.preemption
    protected = preempt._protected

    def noting(self: Any, job: Any, now: float) -> None:
        starving.add(job.seq)
        start_starving(self, job, now)

    def later_borrowers(state: Any, job: Any, entry: Any, now: float) -> list[Any] | None:
        def candidates(state: Any, job: Any, entry: Any, now: float) -> Any:
            name = entry.instance_type
            ledger = state.types[name]
            sources = [
                iter(state.queues[other].running.get(name, ()))
                for other, usage in ledger.usage.items()
                if other != job.share and usage > ledger.limit_of(other)
            ]
            for key in heapq.merge(*sources):
                victim = state.jobs[-key[3]]
                if victim.seq > job.seq and preempt._preemptible(state, victim, now):
                    yield victim, PreemptionKind.CROSS_SHARE

        model_candidates = preempt._candidates
        preempt._candidates = candidates  # find_victims' greedy set and reverse pass, on these
        try:
            return preempt.find_victims(state, job, entry, now)
        finally:
            preempt._candidates = model_candidates

    def then_starving(life: Any, now: float, work: Any) -> bool:
        preempted = preemption(life, now, work)
        state = life.state
        for seq in sorted(starving):
            job = state.jobs.get(seq)
            if job is None or not queued(job) or not job.starving:
                starving.discard(seq)
                continue
            for entry in job.entries:
                ledger = state.types[entry.instance_type]
                if ledger.usage_of(job.share) + entry.count <= ledger.limit_of(job.share):
                    continue
                victims = later_borrowers(state, job, entry, now)
                if victims:
                    life.preempt(job, entry, victims, now)
                    starving.discard(seq)
                    if shielded:
                        shield.add(seq)
                    preempted = True
                    break
        return preempted

    def shielded_too(state: Any, victim: Any, now: float) -> bool:
        return victim.seq in shield or protected(state, victim, now)

    Lifecycle.start_starving = noting  # type: ignore[method-assign]
    phases.preemption = then_starving
    if shielded:
        preempt._protected = shielded_too


def _victims_no_larger_first() -> None:
    """Victim candidates of each group in the model's order, but those holding no more
    instances than the preemptor asks for first, larger ones after: a 1-instance reclaim
    does not stop a 64-instance borrower while 1-instance borrowers would do."""
    from airflow_quota.core import preempt

    original = preempt._candidates

    def candidates(state: Any, job: Any, entry: Any, now: float) -> Any:
        larger: list[Any] = []
        last_kind = None
        for victim, kind in original(state, job, entry, now):
            if kind is not last_kind:
                yield from larger
                larger = []
                last_kind = kind
            if victim.placement.entry.count > entry.count:
                larger.append((victim, kind))
            else:
                yield victim, kind
        yield from larger

    preempt._candidates = candidates


def _borrow_by_usage() -> None:
    """Step 3 takes the borrowing shares by usage/limit at the step's start (lowest first, as
    step 2 visits shares), then FIFO by first submission, instead of FIFO across shares."""
    from airflow_quota.core import phases

    original_init = phases._Borrowing.__init__
    original_order = phases._Borrowing.order

    def init(self: Any, life: Any, now: float, work: Any) -> None:
        original_init(self, life, now, work)
        state = self.state
        self.ratios = {name: state.share_usage[name] / state.share_limit[name] for name in self.shares}

    def order(self: Any, key: Any) -> tuple[float, float, int, Any]:
        holder = original_order(self, key)
        return (self.ratios[self.state.jobs[key[2]].share], *holder)

    phases._Borrowing.__init__ = init  # type: ignore[method-assign]
    phases._Borrowing.order = order  # type: ignore[method-assign]


def _in_share_hold_only() -> None:
    """A starving job's reservation holds only its own share, and only the types of its
    entries that fit under the share's limit: no pool-wide borrowing hold."""
    from airflow_quota.core.lifecycle import Lifecycle
    from airflow_quota.core.model import Job
    from airflow_quota.core.state import QuotaState

    QuotaState.borrowing_holder = lambda self, instance_type: None  # type: ignore[method-assign]
    start_starving = Lifecycle.start_starving

    def starving_within_limit(self: Lifecycle, job: Job, now: float) -> None:
        start_starving(self, job, now)
        state = self.state
        queue = state.queues[job.share]
        if job.key not in queue.starving_types:
            return
        fitting = frozenset(
            e.instance_type for e in job.entries if e.count <= state.types[e.instance_type].limit_of(job.share)
        )
        if fitting:
            queue.starving_types[job.key] = fitting
        else:
            queue.remove_starving(job)

    Lifecycle.start_starving = starving_within_limit  # type: ignore[method-assign]


def _hold_cap(cap_seconds: float) -> None:
    """A job holds its share's reservation for at most ``cap_seconds`` from when it started
    starving; then it gives the reservation up for good (it stays starving: the alert stands),
    and the share's next starving job, if any, holds it. Checked at the start of each cycle, so
    a hold may outlive its cap until the next cycle (on ITP cycles come every ~40 s)."""
    from airflow_quota.core.cycle import QuotaScheduler
    from airflow_quota.core.lifecycle import Lifecycle
    from airflow_quota.core.queues import ShareQueue

    started: dict[int, float] = {}
    gave_up: set[int] = set()
    start_starving = Lifecycle.start_starving
    add_starving = ShareQueue.add_starving
    run_cycle = QuotaScheduler.run_cycle

    def starving_since(self: Lifecycle, job: Any, now: float) -> None:
        started.setdefault(job.seq, now)
        start_starving(self, job, now)

    def add_unless_gave_up(self: ShareQueue, job: Any) -> None:
        if job.seq not in gave_up:
            add_starving(self, job)

    def cycle_with_cap(self: QuotaScheduler, now: float) -> Any:
        state = self.state
        for queue in state.queues.values():
            while queue.starving:
                holder = state.jobs[queue.starving[0][2]]
                if now - started.get(holder.seq, now) <= cap_seconds:
                    break
                gave_up.add(holder.seq)
                queue.remove_starving(holder)
                state.changes.improved |= holder.instance_types
        return run_cycle(self, now)

    Lifecycle.start_starving = starving_since  # type: ignore[method-assign]
    ShareQueue.add_starving = add_unless_gave_up  # type: ignore[method-assign]
    QuotaScheduler.run_cycle = cycle_with_cap  # type: ignore[method-assign]


def _hold_after_own_count() -> None:
    """A starving job's reservation starts only once the placements that overtook it since it
    started starving (section 8's overtaking: later jobs of its share on a type of its list, or
    later borrowers of one, in any share) add up to at least its own count of instances on that
    type; the alert is raised as before, when it starts starving."""
    from airflow_quota.core.lifecycle import Lifecycle, queued
    from airflow_quota.core.queues import ShareQueue

    pending: dict[int, dict[str, int]] = {}
    """seq → instances still to be overtaken by, per type of its list."""
    start_starving = Lifecycle.start_starving
    add_starving = ShareQueue.add_starving
    overtake = Lifecycle.overtake

    def add_unless_pending(self: ShareQueue, job: Any) -> None:
        if job.seq not in pending:
            add_starving(self, job)

    def starving_later(self: Lifecycle, job: Any, now: float) -> None:
        if not job.starving:
            pending[job.seq] = {e.instance_type: e.count for e in job.entries}
        start_starving(self, job, now)

    def overtake_counting(self: Lifecycle, job: Any, entry: Any, borrowed: int, now: float) -> None:
        overtake(self, job, entry, borrowed, now)
        name = entry.instance_type
        for seq in list(pending):
            other = self.state.jobs.get(seq)
            if other is None or not queued(other) or not other.starving:
                if other is None or not queued(other):
                    pending.pop(seq)
                continue
            left = pending[seq]
            if seq >= job.seq or name not in left or (job.share != other.share and borrowed <= 0):
                continue
            left[name] -= entry.count
            if left[name] <= 0:
                del pending[seq]
                self.state.queues[other.share].add_starving(other)
                self.state.changes.improved |= other.instance_types

    ShareQueue.add_starving = add_unless_pending  # type: ignore[method-assign]
    Lifecycle.start_starving = starving_later  # type: ignore[method-assign]
    Lifecycle.overtake = overtake_counting  # type: ignore[method-assign]


def _hold_log() -> None:
    """On stderr at exit: the reservations that held borrowing pool-wide (entries larger than
    the share's limit), how long each lasted (from starting to starve to being placed) and the
    hold-hours in all."""
    import atexit

    from airflow_quota.core.lifecycle import Lifecycle

    begun: dict[int, tuple[float, int, str]] = {}
    spans: list[float] = []
    start_starving = Lifecycle.start_starving
    place = Lifecycle.place

    def starving_logged(self: Lifecycle, job: Any, now: float) -> None:
        if job.seq not in begun and any(
            e.count > self.state.types[e.instance_type].limit_of(job.share) for e in job.entries
        ):
            begun[job.seq] = (now, job.entries[0].count, job.share)
        start_starving(self, job, now)

    def place_logged(self: Lifecycle, job: Any, entry: Any, borrowed: int, now: float, why: str) -> None:
        if job.seq in begun:
            spans.append(now - begun.pop(job.seq)[0])
        place(self, job, entry, borrowed, now, why)

    def report() -> None:
        ordered = sorted(spans)
        if not ordered:
            print("hold-log: no pool-wide holder", file=sys.stderr)
            return
        print(
            f"hold-log: {len(ordered)} jobs starving with an entry above their share's limit; from "
            f"starving to placed: p50 {ordered[len(ordered) // 2] / 3600:.1f} h, max {ordered[-1] / 3600:.1f} h, "
            f"{sum(ordered) / 3600:,.0f} h in all; {len(begun)} never placed",
            file=sys.stderr,
        )

    Lifecycle.start_starving = starving_logged  # type: ignore[method-assign]
    Lifecycle.place = place_logged  # type: ignore[method-assign]
    atexit.register(report)


class IdleWhileWaiting:
    """GPU-seconds left idle while a RUNNABLE job that would fit in them waits (the open pool,
    first fit, leaves none): after every cycle, the idle count and whether the smallest job
    waiting fits in it, integrated until the next cycle."""

    def __init__(self, simulator: Any) -> None:
        self.simulator = simulator
        self.last = 0.0
        self.idle = 0
        self.fits = False
        self.gpu_seconds = 0.0

    def __call__(self, now: float, _cycles: int, _finished: int) -> None:
        if self.fits:
            self.gpu_seconds += self.idle * (now - self.last)
        state = self.simulator.scheduler.state
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
    from airflow_quota.sim.traces import Trace, read_trace, trace_scenario

    started = time.perf_counter()
    full = read_trace(f"itp:{TRACE}")
    trace = Trace(full.spec, full.rows[:jobs], [], full.start)
    config = load_config(quota_path)
    scenario = trace_scenario(trace, config).scenario
    loaded = time.perf_counter()
    simulator = Simulator(scenario)
    idle = IdleWhileWaiting(simulator) if measure_idle else None
    simulator._progress = idle
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


def scaling(sizes: list[int], quota_path: Path, mode: str = "") -> list[dict[str, Any]]:
    rows = []
    for size in sizes:
        done = subprocess.run(
            [sys.executable, __file__, "--worker", str(size), "--quota", str(quota_path), "--what-if", mode],
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
        "--what-if",
        default="",
        metavar="MODES",
        help="also replay the whole trace with rules of the quota model switched off, to see what each "
        "costs: no-lender-protection, no-preemption; or measure-idle (GPU-hours idle while a job that "
        "fits waits); ',' joins them in one run, ';' separates runs. A diagnostic, not an option",
    )
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--quota", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        what_if(args.what_if)
        print(json.dumps(worker(args.worker, args.quota, "measure-idle" in args.what_if)))
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
        scaling([1000, 10000] if args.quick else [1000, 10000, 69351], quota_path)
    if not args.quick:
        print("2. airflow-quota compare --policy shares --policy static --policy open, whole trace")
        comparison(quota_path)
    if args.what_if:
        for mode in args.what_if.split(";"):
            print(f"3. what if: {mode} (the quota above)")
            scaling([69351], quota_path, mode)


if __name__ == "__main__":
    main()
