"""The forecast of every live job (``sim/forecast.py``), kept fresh by the quota scheduler's
leader off its scheduling path: ``ForecastRefresh``.

After a step that changed something, once ``interval`` seconds have passed since the last
refresh began and none is in flight, the leader asks a process of its own for a refresh, and
hands it nothing but the instant. That process follows the input log as a standby does: it
keeps its own core, rebuilt once from the newest snapshot and the inputs after it, then fed
the inputs committed since its last refresh (``_Follower``): the core is deterministic, so
that is the leader's state as of its last commit. It reads the runtime history from the quota
database (finished attempts: the same Airflow task's runs, the share's, the pool's) and the
runtime each live job's author expects (``quota_jobs.expected_runtime_seconds``, the best
estimate when given), forecasts, and rewrites ``quota_forecasts``. The leader neither copies
its state nor runs anything of the forecast, and while it runs a step the worker waits
(``leader_first``): on a machine with few cores the two would otherwise share them
(BENCHMARKS.md, "The forecast", has the cycles side by side). A refresh that fails is logged
and the next one tries again: a forecast is advice, never a decision.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NamedTuple

from sqlalchemy import Engine, delete, func, select

from airflow_quota.core.cycle import QuotaScheduler
from airflow_quota.core.estimates import RuntimeEstimate, RuntimeHistory
from airflow_quota.service.snapshots import inputs_pruned, recover, replay_after
from airflow_quota.store.bulk import insert_rows
from airflow_quota.store.engine import make_engine, session_factory
from airflow_quota.store.models import Attempt, AttemptState, ForecastRow, JobRow
from airflow_quota.store.models import Input as InputRow

if TYPE_CHECKING:  # the simulator loads in the worker process only, never in the leader
    from airflow_quota.sim.forecast import Calibration, Forecast

log = logging.getLogger("airflow_quota.scheduler")

FORECAST_INTERVAL = 30.0
"""Seconds between two refreshes at most (``airflow-quota scheduler --forecast-interval``)."""
HISTORY_RUNS = 5_000
"""The most recent finished runs a refresh reads for its runtime estimates."""


class ForecastRefresh:
    """Refreshes ``quota_forecasts`` after changes, at most every ``interval`` seconds of the
    scheduler's clock, in a worker process (``inline``: in this one, for tests that step a
    manual clock and read the forecast at once)."""

    def __init__(
        self, url: str, interval: float = FORECAST_INTERVAL, runs: int | None = None, inline: bool = False
    ) -> None:
        self.url = url
        self.interval = interval
        self.runs = runs
        self.inline = inline
        self._pool: ProcessPoolExecutor | None = None
        self._running: Future[int] | None = None
        self._last: float | None = None
        self._changed = False
        self._follower = _Follower()
        """The inline refreshes' follower (a worker process keeps its own)."""
        self._leader_busy: ctypes.c_byte | None = None
        """Up while the leader runs a step: the worker, sharing this byte, waits meanwhile."""
        self.refreshed = 0
        """Refreshes written so far."""

    def after_step(self, scheduler: QuotaScheduler | None, now: float, changed: bool) -> None:
        """Take in a refresh that ended; start one when something changed since the last
        began, ``interval`` has passed, and none is in flight."""
        self._changed = self._changed or changed
        self._collect()
        if scheduler is None or not self._changed or self._running is not None:
            return
        if self._last is not None and now - self._last < self.interval:
            return
        self._last, self._changed = now, False
        if self.inline:
            refresh(self.url, now, self.runs, self._follower)
            self.refreshed += 1
            return
        self._start_worker()
        assert self._pool is not None
        self._running = self._pool.submit(refresh, self.url, now, self.runs)

    def _start_worker(self) -> None:
        if self._pool is None:
            context = multiprocessing.get_context("spawn")
            self._leader_busy = context.RawValue("b", 0)
            self._pool = ProcessPoolExecutor(
                max_workers=1,
                mp_context=context,
                initializer=_yield_to_the_leader,
                initargs=(self._leader_busy,),
            )

    @contextmanager
    def leader_first(self) -> Iterator[None]:
        """The worker waits while the leader runs this block (its step): it ends the input of a
        forward run it is in and takes the next once the block is over. A byte of memory the
        two processes share, so the leader makes no system call for it (signals to stop and
        resume the worker cost a cycle more than the worker's company: BENCHMARKS.md)."""
        busy = self._leader_busy
        if busy is None:
            yield
            return
        busy.value = 1
        try:
            yield
        finally:
            busy.value = 0

    def _collect(self) -> None:
        running = self._running
        if running is None or not running.done():
            return
        self._running = None
        try:
            running.result()
            self.refreshed += 1
        except Exception as exc:
            log.warning("the forecast refresh failed (%s: %s); the next one tries again", type(exc).__name__, exc)

    def close(self) -> None:
        """Stop the worker process (a refresh in flight is abandoned)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        self._running = None


# -- in the worker process ----------------------------------------------------------------------

WORKER_NICENESS = 10
"""How much lower the worker's CPU priority is than the leader's: on a machine with few cores,
the leader's cycles and its database come first."""


PR_SET_PDEATHSIG = 1
"""Linux's ``prctl`` option: a signal the process gets when its parent dies."""


GIVE_WAY_POLL_SECONDS = 0.0002
"""How often a worker waiting for the leader looks again (a leader's step takes a few ms)."""

_LEADER_BUSY: ctypes.c_byte | None = None
"""In the worker: the byte the leader raises while it runs a step (``leader_first``)."""


def _yield_to_the_leader(leader_busy: ctypes.c_byte | None = None) -> None:
    """The worker's start: a lower CPU priority, the leader's byte to wait on while it runs a
    step, and on Linux death with the leader (SIGKILL when it exits), so that a leader killed
    (``kill -9``, the OOM killer) leaves no worker behind."""
    global _LEADER_BUSY
    _LEADER_BUSY = leader_busy
    os.nice(WORKER_NICENESS)
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _give_way() -> None:
    """Wait while the leader runs a step (``ForecastRefresh.leader_first``)."""
    busy = _LEADER_BUSY
    while busy is not None and busy.value:
        time.sleep(GIVE_WAY_POLL_SECONDS)


_ENGINES: dict[str, Engine] = {}
_FOLLOWERS: dict[str, _Follower] = {}
"""Each quota database's follower in this process."""


def refresh(url: str, now: float, runs: int | None = None, follower: _Follower | None = None) -> int:
    """Forecast from the core as of the newest committed input, at ``now``, with ``runs``
    forward runs (``sim.forecast.RUNS`` by default), and rewrite the forecasts; how many rows
    were written (0 before the first configuration). ``follower``: the one to catch up, else
    this process's for ``url`` (a worker process serves one quota service)."""
    from airflow_quota.sim.forecast import RUNS, forecast

    engine = _ENGINES.get(url)
    if engine is None:
        engine = _ENGINES[url] = make_engine(url)
    sessions = session_factory(engine)
    with sessions() as session, session.begin():
        if follower is None:
            follower = _FOLLOWERS.setdefault(url, _Follower())
        scheduler = follower.catch_up(session)
        if scheduler is None:
            return 0
        scheduler.forget_finished()
        history, jobs = _history(session, scheduler)
    estimates = _estimates(scheduler, now, history, jobs)
    result = forecast(scheduler, now, estimates, runs=RUNS if runs is None else runs, give_way=_give_way)
    rows = _rows(scheduler, result, now, follower.record)
    with sessions() as session, session.begin():
        session.execute(delete(ForecastRow))
        insert_rows(session, ForecastRow, rows)
    return len(rows)


class _Record:
    """What the forecasts made from one input log say of themselves: each waiting job's first
    forecast, and once it starts the calibration learned from it (``sim.forecast.Calibration``).
    It belongs to the log: a job id of another log is another job."""

    def __init__(self) -> None:
        from airflow_quota.sim.forecast import Calibration

        self.calibration: Calibration = Calibration()
        self.first: dict[int, tuple[float, float]] = {}
        """Each waiting job's first forecast: (made at, forecast wait), by job id."""

    def note_first(self, ref: int, now: float, wait: float) -> None:
        """The job's first forecast (later ones are not learned from)."""
        self.first.setdefault(ref, (now, wait))

    def learn_from_started(self, scheduler: QuotaScheduler) -> None:
        """The jobs first forecast while waiting that have started since: their actual wait
        against the forecast's."""
        state = scheduler.state
        for ref in list(self.first):
            seq = state.refs.get(ref)
            job = state.jobs.get(seq) if seq is not None else None
            if job is None:
                del self.first[ref]
            elif job.placement is not None:
                made_at, wait = self.first.pop(ref)
                self.calibration.learn(job.share, wait, job.placement.placed_at - made_at)


class _Follower:
    """The core as the input log makes it, kept up with the log between refreshes, and the
    record of the forecasts made from it."""

    def __init__(self) -> None:
        self.scheduler: QuotaScheduler | None = None
        self.last_input = 0
        self._last_row: tuple[str, float] | None = None
        """(kind, instant) of the last input taken in: the log is the same one while it is there."""
        self._record: _Record | None = None

    @property
    def record(self) -> _Record:
        """The record of the forecasts made from the log followed (a new one with each log)."""
        if self._record is None:
            self._record = _Record()
        return self._record

    def catch_up(self, session: Any) -> QuotaScheduler | None:
        """The core as of the newest committed input: fed the inputs since the last call, or
        rebuilt (as a new leader recovers) on the first call or when the log is no longer the
        one followed (another database at the same address, inputs pruned past ours)."""
        if self.scheduler is None or not self._same_log(session):
            recovered = recover(session, inputs_pruned(session))
            self.scheduler, self.last_input = recovered.scheduler, recovered.last_input
            self._record = None
        else:
            _, self.last_input = replay_after(session, self.scheduler, self.last_input, forgotten_ok=True)
        row = session.get(InputRow, self.last_input) if self.last_input else None
        self._last_row = (row.kind, row.at) if row is not None else None
        return self.scheduler

    def _same_log(self, session: Any) -> bool:
        if not self.last_input:
            return False
        row = session.get(InputRow, self.last_input)
        return row is not None and (row.kind, row.at) == self._last_row


class _Known(NamedTuple):
    """What the store says of a live job's runtime, beside the core's state."""

    task: str | None
    """Its Airflow task, ``dag_id.task_id``."""
    max_runtime: float | None
    """The most its training may run (SageMaker's ``MaxRuntimeInSeconds``)."""
    expected_runtime: float | None
    """How long its author expects it to run (``expected_runtime``)."""


_UNKNOWN = _Known(None, None, None)
"""A live job the store does not show (none, as the snapshot comes from the store's jobs)."""


def _history(session: Any, scheduler: QuotaScheduler) -> tuple[RuntimeHistory, dict[int, _Known]]:
    """The runtime history (the most recent finished runs, oldest first: from the training's
    start, or its placement when no start was reported before its end), and what the store
    says of each live job's runtime (``_Known``), by job id."""
    finished = session.execute(
        select(
            JobRow.share,
            JobRow.dag_id,
            JobRow.task_id,
            func.coalesce(Attempt.running_since, Attempt.placed_at),
            Attempt.ended_at,
        )
        .join(JobRow, JobRow.id == Attempt.job_id)
        .where(Attempt.status == AttemptState.SUCCEEDED.value, Attempt.ended_at.is_not(None))
        .order_by(Attempt.ended_at.desc())
        .limit(HISTORY_RUNS)
    ).all()
    history = RuntimeHistory()
    for share, dag_id, task_id, started, ended in reversed(finished):
        history.add(share, max(0.0, ended - started), _task(dag_id, task_id))
    refs = [job.ref for job in scheduler.state.jobs.values() if job.ref is not None]
    jobs: dict[int, _Known] = {}
    for job_id, dag_id, task_id, training, expected in session.execute(
        select(JobRow.id, JobRow.dag_id, JobRow.task_id, JobRow.training, JobRow.expected_runtime_seconds).where(
            JobRow.id.in_(refs)
        )
    ):
        jobs[job_id] = _Known(_task(dag_id, task_id), _max_runtime(training), expected)
    return history, jobs


def _task(dag_id: str | None, task_id: str | None) -> str | None:
    return f"{dag_id}.{task_id}" if dag_id and task_id else None


def _max_runtime(training: Mapping[str, Any] | None) -> float | None:
    """SageMaker's ``StoppingCondition.MaxRuntimeInSeconds`` of the job's training request."""
    condition = (training or {}).get("StoppingCondition") or {}
    seconds = condition.get("MaxRuntimeInSeconds") if isinstance(condition, Mapping) else None
    return float(seconds) if isinstance(seconds, (int, float)) else None


def _estimates(
    scheduler: QuotaScheduler,
    now: float,
    history: RuntimeHistory,
    jobs: Mapping[int, _Known],
) -> dict[int, RuntimeEstimate]:
    estimates: dict[int, RuntimeEstimate] = {}
    for seq, job in scheduler.state.jobs.items():
        if job.state.is_final or job.ref is None:
            continue
        known = jobs.get(job.ref, _UNKNOWN)
        elapsed = job.progress + (now - job.running_since if job.running_since is not None else 0.0)
        estimates[seq] = history.estimate(
            job.share,
            known.task,
            expected_runtime=known.expected_runtime,
            max_runtime=known.max_runtime,
            elapsed=elapsed,
        )
    return estimates


def _rows(scheduler: QuotaScheduler, result: Forecast, now: float, record: _Record) -> list[dict[str, Any]]:
    """The rows of the forecast, a waiting job's calibrated by the record of earlier forecasts."""
    state = scheduler.state
    by_name = {job.name: job for job in state.jobs.values() if not job.state.is_final}
    record.learn_from_started(scheduler)
    rows: list[dict[str, Any]] = []
    for name, expected in result.starts.items():
        job = by_name[name]
        assert job.ref is not None
        if expected.start is not None:
            record.note_first(job.ref, now, expected.start - now)
        shown = record.calibration.apply(expected, now)
        entry = shown.entry
        rows.append(
            {
                "job_id": job.ref,
                "made_at": now,
                "start": shown.start,
                "low": shown.low,
                "high": shown.high,
                "end": None,
                "instance_type": entry.instance_type if entry else None,
                "count": entry.count if entry else None,
                "borrowed": shown.borrowed,
                "preempts": shown.preempts,
                "must_borrow": shown.must_borrow,
                "source": shown.runtime.value,
                "reason": shown.reason,
            }
        )
    for name, ending in result.ends.items():
        job = by_name[name]
        assert job.ref is not None
        rows.append(
            {
                "job_id": job.ref,
                "made_at": now,
                "start": None,
                "low": ending.low,
                "high": ending.high,
                "end": ending.end,
                "instance_type": None,
                "count": None,
                "borrowed": 0,
                "preempts": False,
                "must_borrow": 0,
                "source": ending.runtime.value,
                "reason": None if ending.end is not None else "no runtime estimate for this job",
            }
        )
    return rows
