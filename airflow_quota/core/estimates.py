"""How long a job will run, for the forecast (``sim/forecast.py``): ``RuntimeHistory`` and its
``estimate``.

Sources, best first: the runtime the author gives (``expected_runtime``); otherwise the
finished runs of the same task (an Airflow task's ``dag_id.task_id``, or whatever the caller
names a task), then of its share, then of the pool. For a job already running, only runs longer
than it has run so far count. A request's most allowed runtime (SageMaker's
``StoppingCondition.MaxRuntimeInSeconds``) only caps what is drawn. Pure: the history is
passed in; nothing here reads a clock or a store. Every estimate says its source, and when
there is none it says so (``EstimateSource.NONE``), never a made-up figure.
"""

from __future__ import annotations

import random
from bisect import bisect_right, insort
from collections import deque
from dataclasses import dataclass
from enum import Enum

MIN_RUNS = 3
"""The finished runs a task's or a share's history needs before it is used; fewer, and the next
source is asked. The pool's history is used from its first run."""
KEEP_RUNS = 500
"""The most recent finished runs kept for each task, each share and the pool."""


class EstimateSource(str, Enum):
    """Where a runtime estimate came from, best first."""

    AUTHOR = "expected_runtime"
    """The runtime the task's author gave."""
    TASK = "task history"
    """Finished runs of the same task."""
    SHARE = "share history"
    """Finished runs of the job's share."""
    POOL = "pool history"
    """Finished runs of every share."""
    NONE = "none"
    """No estimate: nothing gave a runtime, or the job has run longer than every run seen."""


@dataclass(frozen=True, slots=True)
class RuntimeEstimate:
    """A job's runtime as a set of plausible values to draw from (one, for the author's)."""

    source: EstimateSource
    runs: tuple[float, ...] = ()
    """Plausible total runtimes in seconds, sorted; empty for ``NONE``."""
    cap: float | None = None
    """The most the job may run (the request's maximum runtime): no draw goes beyond it."""

    @property
    def known(self) -> bool:
        return bool(self.runs)

    @property
    def median(self) -> float | None:
        """The middle plausible runtime, capped; None without an estimate."""
        if not self.runs:
            return None
        return self._capped(self.runs[len(self.runs) // 2])

    def draw(self, rng: random.Random, low: float = 0.0, high: float = 1.0) -> float | None:
        """One plausible total runtime, capped; None without an estimate. With ``low`` and
        ``high``, from that slice of the plausible runtimes by rank (0.5 to 0.75: the third
        quarter): a forecast's stratified draws."""
        if not self.runs:
            return None
        count = len(self.runs)
        return self._capped(self.runs[min(count - 1, int((low + rng.random() * (high - low)) * count))])

    def _capped(self, runtime: float) -> float:
        return runtime if self.cap is None else min(runtime, self.cap)


class RuntimeHistory:
    """The durations of finished runs, the most recent ``keep`` of each task, share and the pool."""

    def __init__(self, keep: int = KEEP_RUNS) -> None:
        self.keep = keep
        self._task: dict[str, _Runs] = {}
        self._share: dict[str, _Runs] = {}
        self._pool = _Runs(keep)

    def add(self, share: str, duration: float, task: str | None = None) -> None:
        """A run that finished after ``duration`` seconds of training."""
        if task is not None:
            self._task.setdefault(task, _Runs(self.keep)).add(duration)
        self._share.setdefault(share, _Runs(self.keep)).add(duration)
        self._pool.add(duration)

    def estimate(
        self,
        share: str,
        task: str | None = None,
        expected_runtime: float | None = None,
        max_runtime: float | None = None,
        elapsed: float = 0.0,
    ) -> RuntimeEstimate:
        """The best estimate of a job's total runtime (see the module's docstring); for a job
        that has run ``elapsed`` seconds, only runtimes longer than that."""
        if expected_runtime is not None and expected_runtime > elapsed:
            return RuntimeEstimate(EstimateSource.AUTHOR, (float(expected_runtime),), max_runtime)
        levels = (
            (EstimateSource.TASK, self._task.get(task) if task is not None else None, MIN_RUNS),
            (EstimateSource.SHARE, self._share.get(share), MIN_RUNS),
            (EstimateSource.POOL, self._pool, 1),
        )
        for source, runs, needed in levels:
            if runs is None:
                continue
            longer = runs.longer_than(elapsed)
            if len(longer) >= needed:
                return RuntimeEstimate(source, longer, max_runtime)
        return RuntimeEstimate(EstimateSource.NONE, cap=max_runtime)

    def pool_mean(self) -> float | None:
        """The mean runtime of the pool's recent finished runs; None before the first."""
        return self._pool.mean()


class _Runs:
    """The most recent ``keep`` durations, also kept sorted."""

    def __init__(self, keep: int) -> None:
        self._recent: deque[float] = deque()
        self._sorted: list[float] = []
        self._keep = keep

    def add(self, duration: float) -> None:
        self._recent.append(duration)
        insort(self._sorted, duration)
        if len(self._recent) > self._keep:
            oldest = self._recent.popleft()
            del self._sorted[bisect_right(self._sorted, oldest) - 1]

    def longer_than(self, elapsed: float) -> tuple[float, ...]:
        return tuple(self._sorted[bisect_right(self._sorted, elapsed) :])

    def mean(self) -> float | None:
        return sum(self._recent) / len(self._recent) if self._recent else None

    def __len__(self) -> int:
        return len(self._recent)
