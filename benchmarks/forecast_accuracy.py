"""The forecast's accuracy on the whole ITP trace (issue 41): ``forecast-accuracy``'s document,
and a plot of each forecast job's forecast wait against its actual wait (log-log, with the
10-90% range), written to ``docs/img/forecast-itp.png``.

    python benchmarks/forecast_accuracy.py --every 25       # about 9 minutes on one core
    python benchmarks/forecast_accuracy.py --every 100      # about 2 minutes, 4x fewer jobs

Two bounds beside it, to tell what the band's share is made of (no plot is written with them):

    python benchmarks/forecast_accuracy.py --policy open    # one open FIFO pool, no shares (a task: tenant and size)
    python benchmarks/forecast_accuracy.py --known-runtimes # every job's own duration as its estimate
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from airflow_quota.core.config import load_config  # noqa: E402
from airflow_quota.core.model import Job  # noqa: E402
from airflow_quota.sim.compare import OPEN_SHARE, open_pool  # noqa: E402
from airflow_quota.sim.forecast import RUNS  # noqa: E402
from airflow_quota.sim.forecast_accuracy import Prediction, measure, summary, task_of  # noqa: E402
from airflow_quota.sim.traces import read_trace, trace_scenario  # noqa: E402

TRACE = ROOT / "data" / "traces" / "itp-2021"
QUOTA = ROOT / "examples" / "itp-quota.yaml"
PLOT = ROOT / "docs" / "img" / "forecast-itp.png"


def plot(predictions: list[Prediction], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hour = 3600.0
    shown = [p for p in predictions if p.waited and p.waited >= 60 and p.forecast is not None]
    actual = [p.waited / hour for p in shown if p.waited]
    forecast = [max((p.forecast or 0) - p.submitted, 60) / hour for p in shown]
    low = [max((p.low or p.submitted) - p.submitted, 60) / hour for p in shown]
    high = [((p.high - p.submitted) if p.high is not None else 30 * 86400) / hour for p in shown]
    figure, axis = plt.subplots(figsize=(6.5, 6))
    axis.vlines(actual, low, high, colors="#bbbbbb", linewidth=0.4, alpha=0.5, label="10-90% range")
    axis.scatter(actual, forecast, s=6, color="#1f6fb2", zorder=3, label="forecast at submission")
    bound = [1 / 60, max(actual + forecast) * 1.2]
    axis.plot(bound, bound, color="black", linewidth=0.8, label="exact")
    axis.fill_between(
        bound, [b * 0.75 for b in bound], [b * 1.25 for b in bound], color="#1f6fb2", alpha=0.08, label="±25%"
    )
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xlabel("actual wait (hours)")
    axis.set_ylabel("forecast wait (hours)")
    axis.set_title(f"ITP, forecast at submission, {len(shown)} jobs that waited a minute or more")
    axis.legend(loc="upper left", fontsize=8)
    figure.savefig(path, format="png", dpi=110, bbox_inches="tight")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--every", type=int, default=25)
    parser.add_argument("--runs", type=int, default=RUNS)
    parser.add_argument("--policy", choices=("shares", "open"), default="shares")
    parser.add_argument("--known-runtimes", action="store_true")
    args = parser.parse_args()
    config = load_config(QUOTA)
    task: Callable[[Job], str] = task_of
    if args.policy == "open":
        jobs = trace_scenario(
            read_trace(f"itp:{TRACE}"), open_pool(config), share_of=lambda _tenant: OPEN_SHARE, types_from=config
        )
        tenant_of = jobs.tenant_of

        def task(job: Job) -> str:  # every job's share is the open pool: its tenant tells them apart
            return f"{tenant_of[job.name]}:{task_of(job)}"

    else:
        jobs = trace_scenario(read_trace(f"itp:{TRACE}"), config)
    started = time.process_time()
    known = args.known_runtimes
    predictions = measure(jobs.scenario, every=args.every, runs=args.runs, task=task, known_runtimes=known)
    seconds = time.process_time() - started
    default = args.policy == "shares" and not args.known_runtimes and args.runs == RUNS
    if default:
        plot(predictions, PLOT)
    document = summary(predictions)
    print(json.dumps(document, indent=2))
    shown = f"; plot: {PLOT.relative_to(ROOT)}" if default else ""
    print(f"{len(predictions):,} forecasts in {seconds:.0f} s of CPU{shown}", file=sys.stderr)


if __name__ == "__main__":
    main()
