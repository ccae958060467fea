"""One reader of the quota database for all the ``QuotaJobTrigger``s of a triggerer.

A trigger that polled its job on its own cost two queries and two thread hops per waiting task
and interval: a triggerer holding a thousand waiting training tasks spent its time polling, and
the interval could not be made short. A ``JobWatch`` reads every watched job in one query
(``QuotaStore.jobs_by_ids``) and their new alerts in another (``QuotaStore.alerts_for``), once
per interval, in a thread, and hands a trigger a ``Reading`` only when its job changed: the cost
of an interval no longer grows with the number of waiting tasks, so the interval can be short.

There is one watch per event loop and database URL. Airflow's triggerer runs the triggers of a
subprocess in one loop, and asyncio's queues, events and tasks belong to one loop, so tests that
run several loops get a watch each. A watch's task starts when its first trigger joins and stops
when its last one leaves. The watch only reads and hands over; each trigger logs and fires in its
own task, so its lines still reach its own task's log.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from airflow_quota.core.model import HOLDING_STATES, JobState
from airflow_quota.hooks.quota import state_key, store_for
from airflow_quota.store.dashboard import current_borrowing
from airflow_quota.store.lock import SchedulerHealth
from airflow_quota.store.models import AlertRow, ForecastRow, JobRow
from airflow_quota.store.repository import QuotaStore

__all__ = ["JobWatch", "Reading", "Subscription"]


@dataclass(frozen=True, slots=True)
class Reading:
    """What one read of the quota database says about a watched job."""

    job: JobRow | None
    """The job as stored; None when there is no such job (the scheduler refused it, or it never was)."""
    alerts: tuple[AlertRow, ...] = ()
    """Every alert about the job read so far, in id order."""
    error: Exception | None = None
    """Why the read failed; ``job`` and ``alerts`` then say nothing."""
    scheduler: SchedulerHealth | None = None
    """Whether a quota scheduler leads, as of this read (a waiting task warns when none does)."""
    borrowed: int | None = None
    """Of the instances the job holds, how many are above its share's limit as of this read
    (``dashboard.current_borrowing``, as the Quotas page says it); None when not read."""
    forecast: ForecastRow | None = None
    """A waiting job's latest forecast (``quota_forecasts``); None when it has none."""


_UNSEEN: tuple[Any, ...] = ("unseen",)
"""The fingerprint of a subscription that must get the next reading whatever it says."""


class Subscription:
    """A trigger's place in a watch: the readings of its job that it has yet to take, in order."""

    def __init__(self, watch: JobWatch, job_id: int, interval: float) -> None:
        self.watch = watch
        self.job_id = job_id
        self.interval = interval
        self._readings: asyncio.Queue[Reading] = asyncio.Queue()
        self._fingerprint = _UNSEEN
        self._alerts_handed = 0

    async def next(self) -> Reading:
        """The next reading of the job: the first read after joining, then each change."""
        self.watch._ensure_running()
        return await self._readings.get()

    def leave(self) -> None:
        """Stop following the job (idempotent); the watch stops once nobody follows anything."""
        self.watch.leave(self)

    def _offer(
        self,
        job: JobRow | None,
        fingerprint: tuple[Any, ...],
        alerts: dict[int, AlertRow],
        scheduler: SchedulerHealth | None,
        borrowed: int | None = None,
        forecast: ForecastRow | None = None,
    ) -> None:
        """Hand over a successful read if it says something new to this subscription: the first
        read, a changed row, a new alert, the quota scheduler stopped or back, or a job still
        missing (the trigger then looks for why, and a failed look must be retried at the next
        read)."""
        fingerprint = (*fingerprint, scheduler is not None and scheduler.down)
        if job is not None and fingerprint == self._fingerprint and len(alerts) == self._alerts_handed:
            return
        self._fingerprint = fingerprint
        self._alerts_handed = len(alerts)
        self._readings.put_nowait(
            Reading(
                job,
                tuple(alerts[key] for key in sorted(alerts)),
                scheduler=scheduler,
                borrowed=borrowed,
                forecast=forecast,
            )
        )

    def _fail(self, error: Exception) -> None:
        """Hand over a failed read; the next successful one is handed over whatever it says (it
        ends the trigger's run of consecutive failures)."""
        self._fingerprint = _UNSEEN
        self._readings.put_nowait(Reading(None, (), error))


class JobWatch:
    """Follow the watched jobs of one quota database for the triggers of one event loop.

    Every interval (the smallest ``poll_interval`` of the subscriptions, at least
    ``min_interval``) it reads all watched jobs and their new alerts in one round of two queries;
    a subscription that just joined gets a read of its job at once, without waiting for the
    next round. A job's row counts as changed when its ``updated_at`` or what a follower logs
    (``state_key``) differs: the scheduler's clock can stand still between two writes.
    """

    min_interval: ClassVar[float] = 0.01
    """The shortest interval: a zero or negative ``poll_interval`` must not make the watch spin."""

    _watches: ClassVar[dict[tuple[asyncio.AbstractEventLoop, str], JobWatch]] = {}
    _watches_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, url: str, store: QuotaStore, loop: asyncio.AbstractEventLoop) -> None:
        self.url = url
        self.store = store
        self.loop = loop
        self.rounds = 0
        """Reads done so far (a full round or a first read of newcomers), failed ones included."""
        self._subscriptions: dict[int, list[Subscription]] = {}
        self._newcomers: set[Subscription] = set()
        self._alerts: dict[int, dict[int, AlertRow]] = {}
        self._alerts_read_to: dict[int, int] = {}
        """Per job: every alert about it with an id up to this one has been read."""
        self._alerts_top = 0
        """The highest alert id this watch has read."""
        self._last_round = float("-inf")
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # -- one watch per loop and database -----------------------------------------------------

    @classmethod
    def for_url(cls, url: str) -> JobWatch:
        """The running loop's watch of the database at ``url`` (created on first use)."""
        loop = asyncio.get_running_loop()
        with cls._watches_lock:
            watch = cls._watches.get((loop, url))
            if watch is None:
                watch = cls._watches[(loop, url)] = cls(url, store_for(url), loop)
            return watch

    @classmethod
    def running(cls) -> list[JobWatch]:
        """The watches of the running loop."""
        loop = asyncio.get_running_loop()
        with cls._watches_lock:
            return [watch for (owner, _), watch in cls._watches.items() if owner is loop]

    # -- subscriptions -----------------------------------------------------------------------

    def join(self, job_id: int, interval: float) -> Subscription:
        """Follow ``job_id``, read at least every ``interval`` seconds; the first read comes at once."""
        subscription = Subscription(self, job_id, interval)
        self._subscriptions.setdefault(job_id, []).append(subscription)
        self._newcomers.add(subscription)
        self._wake.set()
        self._ensure_running()
        return subscription

    def leave(self, subscription: Subscription) -> None:
        """Forget a subscription (idempotent); the last one to leave stops the watch's task."""
        followers = self._subscriptions.get(subscription.job_id, [])
        if subscription not in followers:
            return
        followers.remove(subscription)
        self._newcomers.discard(subscription)
        if not followers:
            del self._subscriptions[subscription.job_id]
            self._alerts.pop(subscription.job_id, None)
            self._alerts_read_to.pop(subscription.job_id, None)
        if not self._subscriptions:
            with self._watches_lock:
                if self._watches.get((self.loop, self.url)) is self:
                    del self._watches[(self.loop, self.url)]
            if self._task is not None:
                self._task.cancel()
                self._task = None

    @property
    def watching(self) -> int:
        """How many subscriptions follow a job here."""
        return sum(len(followers) for followers in self._subscriptions.values())

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The task that reads, while anyone follows a job here."""
        return self._task

    def interval(self) -> float:
        """Seconds between two rounds: the smallest interval asked for, at least ``min_interval``."""
        asked = min(
            (s.interval for followers in self._subscriptions.values() for s in followers), default=self.min_interval
        )
        return max(self.min_interval, asked)

    def _ensure_running(self) -> None:
        """Start the reading task if it is not running while someone follows a job. It runs in a
        fresh context: not in the log context of whichever trigger happened to start it."""
        if not self._subscriptions:
            return
        if self._task is None or self._task.done():
            self._task = contextvars.Context().run(
                self.loop.create_task, self._run(), name=f"quota-job-watch-{id(self):x}"
            )
        with self._watches_lock:  # a watch someone follows is the one the next trigger finds
            self._watches.setdefault((self.loop, self.url), self)

    # -- reading -----------------------------------------------------------------------------

    async def _run(self) -> None:
        while self._subscriptions:
            now = self.loop.time()
            due = self._last_round + self.interval()
            if now < due and not self._newcomers:
                self._wake.clear()
                with contextlib.suppress(asyncio.TimeoutError):  # woken by a newcomer, or the round is due
                    await asyncio.wait_for(self._wake.wait(), due - now)
                continue
            if now >= due:
                self._last_round = now
                ids = sorted(self._subscriptions)
            else:
                ids = sorted({s.job_id for s in self._newcomers})
            await self._read(ids)

    async def _read(self, ids: Sequence[int]) -> None:
        """One read of ``ids`` in a thread, handed to the subscriptions that were there when it
        began and are still there (one that joined meanwhile gets a read of its own next)."""
        after = min((self._alerts_read_to.get(job_id, 0) for job_id in ids), default=0)
        present = {s for job_id in ids for s in self._subscriptions.get(job_id, ())}
        self.rounds += 1
        try:
            jobs, alerts, health, borrowing, forecasts = await asyncio.to_thread(self._fetch, ids, after)
            self._hand_over(ids, jobs, alerts, after, present, health, borrowing, forecasts)
        except Exception as exc:  # a broken database: every follower counts a failed read
            for job_id in ids:
                for subscription in self._subscriptions.get(job_id, []):
                    if subscription in present:
                        self._newcomers.discard(subscription)
                        subscription._fail(exc)

    def _fetch(
        self, ids: Sequence[int], after: int
    ) -> tuple[list[JobRow], list[AlertRow], SchedulerHealth, dict[int, int], dict[int, ForecastRow]]:
        """The blocking part, in a thread: the jobs, the alerts above ``after`` of those found,
        the quota scheduler's heartbeat, what the jobs holding instances borrow now, and the
        waiting jobs' forecasts (a few queries each, whatever the number of jobs; the last two
        only while one holds instances, or waits)."""
        jobs = self.store.jobs_by_ids(ids)
        alerts = self.store.alerts_for([job.id for job in jobs], after) if jobs else []
        waiting = [job.id for job in jobs if job.state == JobState.RUNNABLE.value]
        forecasts = self.store.forecasts(waiting) if waiting else {}
        return jobs, alerts, self.store.scheduler_health(), current_borrowing(self.store, jobs), forecasts

    def _hand_over(
        self,
        ids: Sequence[int],
        jobs: list[JobRow],
        alerts: list[AlertRow],
        after: int,
        present: set[Subscription],
        health: SchedulerHealth,
        borrowing: dict[int, int],
        forecasts: dict[int, ForecastRow] | None = None,
    ) -> None:
        # Alert ids grow with time (one quota scheduler writes them) and reads run one after the
        # other: an alert written after this read has an id above every id read so far, so a job
        # found here needs no alert up to ``_alerts_top`` read again. Unless everyone left it and
        # someone came back during the read: its alerts up to ``after`` are forgotten, and its
        # newcomer's own read (from the first alert) comes next.
        self._alerts_top = max([self._alerts_top, *(alert.id for alert in alerts)])
        for alert in alerts:
            if alert.job_id in self._subscriptions:
                self._alerts.setdefault(alert.job_id, {})[alert.id] = alert
        rows = {job.id: job for job in jobs}
        for job_id in ids:
            followers = self._subscriptions.get(job_id)
            if not followers:
                continue  # everyone left during the read
            job = rows.get(job_id)
            fingerprint = _UNSEEN
            known: dict[int, AlertRow] = {}
            if job is not None:
                if self._alerts_read_to.get(job_id, 0) >= after:
                    self._alerts_read_to[job_id] = self._alerts_top
                forecast = (forecasts or {}).get(job_id)
                fingerprint = (job.updated_at, *state_key(job), forecast.start if forecast else None)
                known = self._alerts.get(job_id, {})
            for subscription in followers:
                if subscription in present:
                    self._newcomers.discard(subscription)
                    borrowed = borrowing.get(job_id, 0) if job is not None and job.state in HOLDING_STATES else None
                    subscription._offer(job, fingerprint, known, health, borrowed, (forecasts or {}).get(job_id))
