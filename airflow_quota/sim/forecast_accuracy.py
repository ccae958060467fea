"""How good is the forecast? ``measure`` replays a scenario (a trace, usually), forecasts each
job's start at its submission from what was known then, and compares it with the start the
replay gave it; ``summary`` is the ``airflow-quota forecast-accuracy --json`` document.

What was known then: the quota state at the submission's instant, after its cycle, and the
runtimes of the jobs that had finished by then (``core/estimates.py``'s history: a trace job's
task is its share and its size; never the job's own duration). Beside the forecast, two naive
predictors computed in the same run:

- ``naive_share_wait``: the job will wait as long as the job at the head of its share's queue
  has waited so far (no wait when none is ahead of it);
- ``naive_position``: its place in its share's queue times the pool's mean finished runtime,
  over the share's running jobs (one at least): the queue drained at the share's pace.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from airflow_quota.core.cycle import QuotaScheduler
from airflow_quota.core.estimates import EstimateSource, RuntimeEstimate, RuntimeHistory
from airflow_quota.core.lifecycle import queued
from airflow_quota.core.model import Decision, Job, Placed, Submitted, Succeeded
from airflow_quota.sim.forecast import RUNS, Calibration, forecast
from airflow_quota.sim.scenario import LoadedScenario
from airflow_quota.sim.simulator import Simulator

HOUR = 3600.0
BUCKETS = (
    ("under_10m", 0.0, 600.0),
    ("10m_to_1h", 600.0, HOUR),
    ("1h_to_6h", HOUR, 6 * HOUR),
    ("over_6h", 6 * HOUR, None),
)
"""The wait buckets of the summary: (name, from, to) in seconds of the actual wait."""
PREDICTORS = ("forecast", "naive_share_wait", "naive_position")


@dataclass
class Prediction:
    """One job's forecast made at its submission, the naive predictors', and what happened."""

    job: str
    share: str
    submitted: float
    forecast: float | None
    """The forecast's median start; None when it gave none (then it counts as wrong by the
    whole wait and more: an infinite error)."""
    low: float | None
    high: float | None
    naive_share_wait: float
    naive_position: float
    started: float | None = None
    """The start the replay gave it (its first placement); None if it never started."""

    @property
    def waited(self) -> float | None:
        return None if self.started is None else self.started - self.submitted

    def error(self, predictor: str) -> float:
        """Absolute error of a predictor's start, in seconds (infinite for no start)."""
        assert self.started is not None
        predicted = getattr(self, predictor)
        return float("inf") if predicted is None else abs(predicted - self.started)


def task_of(job: Job) -> str:
    """A trace job's task, for its history: its share and its size (what a trace tells of it)."""
    entry = job.entries[0]
    return f"{job.share}:{entry.count}x{entry.instance_type}"


def measure(
    loaded: LoadedScenario,
    every: int = 1,
    runs: int = RUNS,
    progress: Callable[[int, int], None] | None = None,
    task: Callable[[Job], str] = task_of,
    known_runtimes: bool = False,
) -> list[Prediction]:
    """Replay ``loaded``, forecasting every ``every``-th submission at its instant (all of them
    with 1); the predictions, each with the start the replay gave it. ``task`` names a job's
    task for the history. ``known_runtimes`` gives every job its own duration as its author's
    estimate instead: not a forecast (nobody knows that) but what knowing the runtimes would
    be worth, the bound of any runtime estimate."""
    simulator = Simulator(loaded)
    history = RuntimeHistory()
    calibration = Calibration()
    raw: dict[str, float] = {}
    """Each forecast job's forecast wait before calibration, learned from once it starts."""
    predictions: dict[str, Prediction] = {}
    submitted: list[str] = []
    submissions = 0

    def decided(decision: Decision) -> None:
        nonlocal submissions
        if isinstance(decision, Submitted):
            submissions += 1
            if (submissions - 1) % every == 0:
                submitted.append(decision.job)
        elif isinstance(decision, Placed):
            prediction = predictions.get(decision.job)
            if prediction is not None and prediction.started is None:
                prediction.started = decision.at
                if decision.job in raw:
                    calibration.learn(prediction.share, raw.pop(decision.job), decision.at - prediction.submitted)
        elif isinstance(decision, Succeeded):
            job = simulator.scheduler.job(decision.job)
            history.add(job.share, simulator.played(job).duration, task(job))

    def after_cycle(scheduler: QuotaScheduler, now: float) -> None:
        if not submitted:
            return
        names = list(submitted)
        submitted.clear()
        jobs = [scheduler.job(name) for name in names]
        waiting = [job for job in jobs if queued(job)]
        for job in jobs:
            if not queued(job):  # placed in its submission's cycle: it waited nothing
                predictions[job.name] = _known_at_once(job, now)
        if waiting:
            scheduler.forget_finished()  # as the quota service does: the forecast copies live jobs only
            if known_runtimes:
                estimates = {
                    seq: RuntimeEstimate(EstimateSource.AUTHOR, (simulator.played(job).duration,))
                    for seq, job in scheduler.state.jobs.items()
                    if not job.state.is_final
                }
            else:
                estimates = _estimates(scheduler, now, history, task)
            _forecast_each(scheduler, now, waiting, estimates, history, runs, calibration, predictions, raw)
        if progress is not None:
            progress(len(predictions), submissions)

    simulator.on_decision = decided
    simulator.after_each_cycle(after_cycle)
    simulator.run()
    return list(predictions.values())


def _known_at_once(job: Job, now: float) -> Prediction:
    return Prediction(job.name, job.share, now, now, now, now, now, now, started=now)


def _forecast_each(
    scheduler: QuotaScheduler,
    now: float,
    waiting: list[Job],
    estimates: dict[int, RuntimeEstimate],
    history: RuntimeHistory,
    runs: int,
    calibration: Calibration,
    predictions: dict[str, Prediction],
    raw: dict[str, float],
) -> None:
    """Forecast the jobs just submitted and still waiting (calibrated by the forecasts' record
    so far), and the naive predictors for them."""
    result = forecast(scheduler, now, estimates, runs=runs, jobs={job.seq for job in waiting})
    mean_runtime = history.pool_mean()
    for job in waiting:
        uncalibrated = result.starts[job.name]
        if uncalibrated.start is not None:
            raw[job.name] = uncalibrated.start - now
        expected = calibration.apply(uncalibrated, now)
        predictions[job.name] = Prediction(
            job.name,
            job.share,
            now,
            expected.start,
            expected.low,
            expected.high,
            now + _head_of_line_wait(scheduler, job, now),
            now + _drained_at_share_pace(scheduler, job, mean_runtime),
        )


def _estimates(
    scheduler: QuotaScheduler, now: float, history: RuntimeHistory, task: Callable[[Job], str]
) -> dict[int, RuntimeEstimate]:
    """Each live job's runtime estimate from the history as it stands (a running job's cut at
    what it has run)."""
    estimates: dict[int, RuntimeEstimate] = {}
    cache: dict[tuple[str, str, float], RuntimeEstimate] = {}
    for seq, job in scheduler.state.jobs.items():
        if job.state.is_final:
            continue
        elapsed = job.progress + (now - job.running_since if job.running_since is not None else 0.0)
        key = (job.share, task(job), elapsed)
        estimate = cache.get(key)
        if estimate is None:
            estimate = cache[key] = history.estimate(job.share, key[1], elapsed=elapsed)
        estimates[seq] = estimate
    return estimates


def _ahead(scheduler: QuotaScheduler, job: Job) -> list[Job]:
    """The queued jobs of its share ahead of it in queue order."""
    state = scheduler.state
    ahead = []
    for key in state.queues[job.share].runnable:
        other = state.jobs[key[2]]
        if other is job:
            break
        if queued(other):
            ahead.append(other)
    return ahead


def _head_of_line_wait(scheduler: QuotaScheduler, job: Job, now: float) -> float:
    ahead = _ahead(scheduler, job)
    return max((now - other.submitted_at for other in ahead), default=0.0)


def _drained_at_share_pace(scheduler: QuotaScheduler, job: Job, mean: float | None) -> float:
    if mean is None:
        return 0.0
    running = sum(
        1 for other in scheduler.state.jobs.values() if other.share == job.share and other.state.holds_capacity
    )
    return len(_ahead(scheduler, job)) * mean / max(1, running)


# -- the summary --------------------------------------------------------------------------------


def summary(predictions: Iterable[Prediction]) -> dict[str, Any]:
    """The ``--json`` document: the jobs that waited an hour or more, then each wait bucket."""
    started = [p for p in predictions if p.started is not None]
    document: dict[str, Any] = {
        "jobs": len(started),
        "waited_1h_plus": _group([p for p in started if p.waited is not None and p.waited >= HOUR]),
        "buckets": {},
    }
    for name, low, high in BUCKETS:
        members = [p for p in started if p.waited is not None and p.waited >= low and (high is None or p.waited < high)]
        document["buckets"][name] = _group(members)
    return document


def _group(members: list[Prediction]) -> dict[str, Any]:
    group: dict[str, Any] = {"jobs": len(members), "without_forecast": sum(p.forecast is None for p in members)}
    for predictor in PREDICTORS:
        errors = sorted(p.error(predictor) for p in members)
        relative = sorted(p.error(predictor) / p.waited for p in members if p.waited)
        group[predictor] = {
            "median_abs_error_s": _rounded(_quantile(errors, 0.5)),
            "p90_abs_error_s": _rounded(_quantile(errors, 0.9)),
            "median_rel_error": _rounded(_quantile(relative, 0.5), 3),
        }
    if members:
        group["within_band"] = round(sum(_within_band(p) for p in members) / len(members), 3)
        group["range_coverage"] = round(sum(_in_range(p) for p in members) / len(members), 3)
    else:
        group["within_band"] = group["range_coverage"] = None
    return group


def _within_band(p: Prediction) -> bool:
    """Started within ±max(10 min, 25% of its wait) of the forecast."""
    assert p.waited is not None
    return p.forecast is not None and p.error("forecast") <= max(600.0, 0.25 * p.waited)


def _in_range(p: Prediction) -> bool:
    assert p.started is not None
    return p.low is not None and p.low <= p.started and (p.high is None or p.started <= p.high)


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return values[min(len(values) - 1, int(q * len(values)))]


def _rounded(value: float | None, digits: int = 1) -> float | None:
    """Rounded; None for none, or for an infinite error (a job given no forecast: counted in
    ``without_forecast``), which JSON cannot hold."""
    if value is None or value == float("inf"):
        return None
    return round(value, digits)


def summary_text(document: dict[str, Any]) -> str:
    """The summary as a table a person reads: one row per wait bucket and predictor."""
    lines = [f"{document['jobs']:,} jobs forecast at their submission", ""]
    header = f"{'wait':<16}{'jobs':>7}  {'predictor':<18}{'median error':>14}{'p90 error':>12}{'median rel':>12}"
    lines += [header, "-" * len(header)]
    groups = [("waited 1 h+", document["waited_1h_plus"]), *document["buckets"].items()]
    for name, group in groups:
        for i, predictor in enumerate(PREDICTORS):
            figures = group[predictor]
            lines.append(
                f"{name if i == 0 else '':<16}{group['jobs'] if i == 0 else '':>7}  {predictor:<18}"
                f"{_duration(figures['median_abs_error_s']):>14}{_duration(figures['p90_abs_error_s']):>12}"
                f"{_ratio(figures['median_rel_error']):>12}"
            )
        if group["within_band"] is not None:
            lines.append(
                f"{'':<25}within ±max(10 min, 25%): {group['within_band']:.0%}; "
                f"inside the 10-90% range: {group['range_coverage']:.0%}"
            )
    return "\n".join(lines) + "\n"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds / 3600:.2f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"
