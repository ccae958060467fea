"""How often the placing steps ask their questions, per job, on ``benchmarks/workload.py``'s
full load: a count that does not depend on the machine's load (issue 15: what grows with the
queue). Each counted function is wrapped with a counter, by name and by caller.

    python benchmarks/step_calls.py                 # 1k and 10k jobs
    python benchmarks/step_calls.py --sizes 1000,10000,100000,300000

Also, per cycle: how many jobs wait and in how many non-empty (share, type, count) buckets, and
how many jobs the walks pop: the full load's backlog grows with the number of jobs, and the
walks' work follows the buckets, not the jobs.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from airflow_quota.core import phases  # noqa: E402
from airflow_quota.core.cycle import QuotaScheduler  # noqa: E402
from airflow_quota.core.queues import MergedStreams  # noqa: E402
from airflow_quota.sim.scenario import parse_scenario  # noqa: E402
from airflow_quota.sim.simulator import Simulator  # noqa: E402
from benchmarks import workload  # noqa: E402

COUNTED = ("may_preempt", "room_or_reclaim", "reclaim_bound", "find_victims", "_try_place")
POLICY_METHODS = ("most", "admits", "keeps", "keeps_waited", "attempt")
"""Each walk policy's own methods, counted as Policy.method."""


def counting(calls: Counter[str], name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[name] += 1
        calls[f"{name} < {sys._getframe(1).f_code.co_name}"] += 1
        return function(*args, **kwargs)

    return counted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument(
        "--load", type=float, default=1.0, help="demand over capacity (workload.py's load; 1.0: the full load)"
    )
    args = parser.parse_args()
    calls: Counter[str] = Counter()
    for name in COUNTED:
        setattr(phases, name, counting(calls, name, getattr(phases, name)))
    for policy in (phases._WithinQuota, phases._Borrowing, phases._Preemption):
        for method in POLICY_METHODS:
            if method in vars(policy):
                counted = counting(calls, f"{policy.__name__}.{method}", getattr(policy, method))
                setattr(policy, method, counted)
    pop = MergedStreams.pop
    MergedStreams.pop = counting(calls, "walk pops", pop)  # type: ignore[method-assign]
    backlog: Counter[str] = Counter()
    run_cycle = QuotaScheduler.run_cycle

    def measured_cycle(scheduler: QuotaScheduler, now: float) -> Any:
        queues = scheduler.state.queues.values()
        backlog["queued"] += sum(len(queue.runnable) for queue in queues)
        backlog["buckets"] += sum(len(counts) for queue in queues for counts in queue.counts.values())
        return run_cycle(scheduler, now)

    QuotaScheduler.run_cycle = measured_cycle  # type: ignore[method-assign]
    for size in (int(text) for text in args.sizes.split(",")):
        calls.clear()
        backlog.clear()
        simulator = Simulator(parse_scenario(workload.scenario(size, args.load), Path(".")))
        simulator.run()
        cycles = simulator.scheduler.cycles
        print(
            f"{size:,} jobs: {cycles / size:.2f} cycles a job; at a cycle, on average: "
            f"{backlog['queued'] / cycles:,.0f} jobs waiting in {backlog['buckets'] / cycles:.0f} non-empty buckets, "
            f"{calls['walk pops'] / cycles:.2f} walk pops; calls a job:"
        )
        for name, count in sorted(calls.items()):
            print(f"  {name:40} {count / size:8.1f}")


if __name__ == "__main__":
    main()
