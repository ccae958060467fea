"""What bounds the longest wait of the ITP replay under quota shares (issue 13).

    python benchmarks/tail_bound.py                 # the trace's bursts, then one replay (about 1 minute)
    python benchmarks/tail_bound.py --trace-only    # the bursts only (seconds)
    python benchmarks/tail_bound.py --open          # and what the open pool gave each share

Two measures, printed as markdown tables:

1. **Bursts, from the trace alone** (no policy): for each share, the GPU-hours its jobs asked
   for in a window of days, as hours of its own limit (``work / limit``), beside the window's
   length. A share that asks for more hours of its limit than the window has can only finish
   that work in time by running above its limit; ``needs above limit`` is the GPU-hours it
   must borrow for its last job of the window to start within ``--max-wait`` hours (the open
   pool's longest wait): its work minus what its limit gives from the window's start to the
   window's end plus ``--max-wait``.
2. **Lendable capacity in the replay** (the ITP quota, model defaults): the GPU-hours a
   borrower could have taken in that window (free instances that no lender protects,
   integrated over time, at the end of every cycle), and what the share actually borrowed.
   A rule that keeps every share's guarantee cannot give the share more than what is
   lendable plus what it borrows already; when that is below what it needs, the longest wait
   cannot reach the open pool's without a share losing capacity its own waiting jobs are
   guaranteed.
3. **What the open pool gave each share** (``--open``: one more replay, on the open FIFO pool):
   each share's peak GPUs in use over the window and after it (to the window's end plus
   ``--max-wait``), as a multiple of its limit: how far above its guarantee the open pool let
   a share run to reach its longest wait.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from airflow_quota.core.config import parse_config
from airflow_quota.core.cycle import QuotaScheduler
from airflow_quota.core.rules.placement import protected_idle
from airflow_quota.sim.compare import open_pool
from airflow_quota.sim.report import build_report
from airflow_quota.sim.simulator import Simulator
from airflow_quota.sim.traces import Trace, TraceRow, read_trace, trace_scenario
from benchmarks.itp_replay import INSTANCE_TYPE, TRACE, itp_quota

DAY = 86400.0
HOUR = 3600.0


def bursts(
    rows: list[TraceRow], limits: dict[str, int], start: float, end: float, max_wait_h: float
) -> list[dict[str, Any]]:
    """Per share: the work its jobs submitted in [start, end) asked for, against its limit."""
    out = []
    for share, limit in sorted(limits.items()):
        work = sum(r.gpus * r.duration for r in rows if r.tenant == share and start <= r.submit < end) / HOUR
        window_h = (end - start) / HOUR
        needs = max(0.0, work - limit * (window_h + max_wait_h))
        out.append(
            {
                "share": share,
                "limit": limit,
                "work": work,
                "hours_of_limit": work / limit,
                "window_h": window_h,
                "needs": needs,
            }
        )
    return out


class LendableMeter:
    """After every cycle (``Simulator.after_each_cycle``): free instances no lender protects
    (what a borrower could take), and what each share holds above its limit, integrated over
    ``[start, end)``."""

    def __init__(self, start: float, end: float) -> None:
        self.start, self.end = start, end
        self.last = 0.0
        self.lendable = 0
        self.borrowed: dict[str, int] = {}
        self.lendable_hours = 0.0
        self.borrowed_hours: dict[str, float] = {}

    def __call__(self, scheduler: QuotaScheduler, now: float) -> None:
        low, high = max(self.last, self.start), min(now, self.end)
        if high > low:
            span = (high - low) / HOUR
            self.lendable_hours += self.lendable * span
            for share, over in self.borrowed.items():
                self.borrowed_hours[share] = self.borrowed_hours.get(share, 0.0) + over * span
        state = scheduler.state
        ledger = state.types[INSTANCE_TYPE]
        free = ledger.capacity - ledger.used - ledger.draining
        self.lendable = max(0, free - protected_idle(state, ledger, now))
        self.borrowed = {s: max(0, u - ledger.limit_of(s)) for s, u in ledger.usage.items()}
        self.last = now


def open_pool_peaks(trace: Trace, raw: dict[str, Any], start: float, end: float) -> dict[str, int]:
    """Each tenant's peak GPUs in use during [start, end) when the trace runs on the open pool
    (one share, no quotas: a job runs from submit + wait for its duration, never preempted)."""
    config = parse_config(raw)
    jobs = trace_scenario(trace, open_pool(config), share_of=lambda _tenant: "open", types_from=config)
    report = build_report(Simulator(jobs.scenario).run())["jobs"]
    changes: list[tuple[float, int, str]] = []
    for row in trace.rows:
        began = row.submit + report[row.name]["wait_seconds"]
        changes += [(began, row.gpus, row.tenant), (began + row.duration, -row.gpus, row.tenant)]
    in_use: dict[str, int] = {}
    peaks: dict[str, int] = {}
    for at, gpus, tenant in sorted(changes):
        in_use[tenant] = in_use.get(tenant, 0) + gpus
        if start <= at < end:
            peaks[tenant] = max(peaks.get(tenant, 0), in_use[tenant])
    return peaks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--from-day", type=float, default=25.0)
    parser.add_argument("--to-day", type=float, default=40.0)
    parser.add_argument("--max-wait", type=float, default=158.05, help="hours (the open pool's longest wait)")
    parser.add_argument("--trace-only", action="store_true")
    parser.add_argument("--open", action="store_true", help="also replay the open pool: each share's peak use")
    args = parser.parse_args()
    trace = read_trace(f"itp:{TRACE}")
    raw = itp_quota()
    limits = {s["name"]: s["capacity_limits"][INSTANCE_TYPE] for s in raw["shares"]}
    start, end = args.from_day * DAY, args.to_day * DAY
    rows = bursts(trace.rows, limits, start, end, args.max_wait)
    window_end = end + args.max_wait * HOUR
    measured: LendableMeter | None = None
    if not args.trace_only:
        config = parse_config(raw)
        simulator = Simulator(trace_scenario(trace, config).scenario)
        measured = LendableMeter(start, window_end)
        simulator.after_each_cycle(measured)
        simulator.run()
    print(
        f"Jobs submitted in days {args.from_day:g}-{args.to_day:g}; needs above limit: for the last of them to start "
        f"within {args.max_wait:g} h (by day {window_end / DAY:.1f})\n"
    )
    head = "| share | limit | GPU-h asked | hours of its limit | window h | needs above limit, GPU-h |"
    rule = "|---|--:|--:|--:|--:|--:|"
    if measured is not None:
        head += " borrowed in the replay, GPU-h |"
        rule += "--:|"
    print(head)
    print(rule)
    for row in rows:
        line = (
            f"| {row['share']} | {row['limit']} | {row['work']:,.0f} | {row['hours_of_limit']:,.0f} | "
            f"{row['window_h']:,.0f} | {row['needs']:,.0f} |"
        )
        if measured is not None:
            line += f" {measured.borrowed_hours.get(row['share'], 0.0):,.0f} |"
        print(line)
    if measured is not None:
        print(
            f"\nLendable in the replay (free, not protected), days {args.from_day:g}-{window_end / DAY:.1f}: "
            f"{measured.lendable_hours:,.0f} GPU-h"
        )
    if args.open:
        peaks = open_pool_peaks(trace, raw, start, window_end)
        print(f"\nThe open pool, days {args.from_day:g}-{window_end / DAY:.1f}: each share's peak GPUs in use\n")
        print("| share | limit | peak GPUs in use | x limit |")
        print("|---|--:|--:|--:|")
        for share, limit in sorted(limits.items()):
            peak = peaks.get(share, 0)
            print(f"| {share} | {limit} | {peak} | {peak / limit:.1f} |")


if __name__ == "__main__":
    main()
