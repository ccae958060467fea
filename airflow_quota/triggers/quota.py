"""Triggers that wait for the quota scheduler in Airflow's triggerer, without a worker slot.

Both follow the rules of Airflow 3 triggers: constructor arguments are plain JSON values and
``serialize()`` returns them with the class path; ``run()`` only reads (a trigger may run twice,
on two triggerers), never raises (every error becomes an ``"error"`` event after a few tries of
a broken database), and yields exactly one event. Reads run in threads, so the triggerer's
event loop never blocks on the database: ``QuotaJobTrigger``s share one ``JobWatch`` per
database (``triggers/watch.py``), which reads all their jobs in one query per interval;
``QuotaCapacityTrigger`` reads through ``QuotaHook``'s async methods.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal, cast

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_quota.core.human_time import about, clock_time
from airflow_quota.core.model import FINAL_STATES, JobState
from airflow_quota.hooks.quota import QuotaHook, describe_alert, describe_job, describe_pending_deadline, state_key
from airflow_quota.store.forecast_words import forecast_moved, forecast_words
from airflow_quota.store.lock import SchedulerHealth
from airflow_quota.store.models import ForecastRow, JobRow
from airflow_quota.triggers.training_log import LogTail, training_log
from airflow_quota.triggers.watch import JobWatch, Reading, Subscription

DEFER_SETTLE_SECONDS = 10.0
"""Seconds after a task defers before its job trigger fires. Airflow 3.3's scheduler fails a
resumed task when it drains the deferring try's own exit (a SUCCESS for the same try) only once
the resumed try is QUEUED or RUNNING: "state mismatch", then FAILED (apache/airflow#72716 and
#71580; #66431 fixed only the SCHEDULED case). On two cores with three busy processes beside it, the
task of a one-second training (``tests/airflow/test_lineage.py``) failed so in 2 runs of 2
without this hold and in none of 2 with it. Only a job that ends this soon after the deferral
waits, and never longer than this."""

Status = Literal["success", "failed", "error", "timeout"]
STATUSES: tuple[Status, ...] = ("success", "failed", "error", "timeout")


@dataclass(frozen=True, slots=True)
class QuotaJobEvent:
    """The payload of ``QuotaJobTrigger``'s one event, as the operator and sensor read it.

    ``status`` is ``success`` (the job SUCCEEDED), ``failed`` (the job FAILED: ``reason`` is
    its code of docs/model.md rule 3.2, PENDING_TIMEOUT, CAPACITY_ERROR, PREEMPTION_LIMIT,
    ATTEMPTS_EXHAUSTED or CANCELLED), ``error`` (the job could not be followed: the database
    stayed unreachable, or the job does not exist) or ``timeout`` (the waiting task gave up at
    its ``give_up_at`` while the job was still live: ``state`` is the job's state then).
    """

    status: Status
    job_id: int
    state: str | None
    reason: str | None
    message: str

    def payload(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_payload(cls, payload: Any) -> QuotaJobEvent:
        """Validate an event payload; ``ValueError`` names what is wrong with it."""
        if not isinstance(payload, Mapping):
            raise ValueError(f"a quota job event is a mapping, got {payload!r}")
        status = payload.get("status")
        if status not in STATUSES:
            raise ValueError(f"a quota job event's status is one of {', '.join(STATUSES)}, got {status!r}")
        job_id = payload.get("job_id")
        if not isinstance(job_id, int) or isinstance(job_id, bool):
            raise ValueError(f"a quota job event's job_id is an integer, got {job_id!r}")
        state, reason, message = payload.get("state"), payload.get("reason"), payload.get("message", "")
        for key, value in (("state", state), ("reason", reason)):
            if value is not None and not isinstance(value, str):
                raise ValueError(f"a quota job event's {key} is a string or null, got {value!r}")
        return cls(cast(Status, status), job_id, state, reason, str(message))


def settled_after_deferral() -> float:
    """The ``fire_not_before`` of a trigger created now, as a task defers."""
    return time.time() + DEFER_SETTLE_SECONDS


def scheduler_silence(silent_seconds: float | None, now: float) -> str:
    """Why no quota scheduler counts as running, for the task log: "none has beaten for about
    13 minutes, since 14:07 UTC", or "none has ever run on this quota database"."""
    if silent_seconds is None:
        return "none has ever run on this quota database"
    return f"none has beaten for {about(silent_seconds)}, since {clock_time(now - silent_seconds, now)}"


def _fire(payload: dict[str, Any]) -> TriggerEvent:
    """A trigger event (``TriggerEvent`` is untyped in Airflow 3.3)."""
    return TriggerEvent(payload)  # type: ignore[no-untyped-call]


class QuotaJobTrigger(BaseTrigger):
    """Follow a quota job until it is final; fire one ``QuotaJobEvent``.

    Each change of the job's state, pending reason, position or placement is logged once (the
    triggerer's log lines go to the task's log), so the task log shows the job waiting, moving
    up the queue, placed, preempted and resumed; so is, for each wait under a
    ``max_pending_seconds``, when it falls due (``describe_pending_deadline``), and each alert
    the quota scheduler raises about the job (a warning: STARVING, PREEMPTED_REPEATEDLY,
    GUARANTEE_VIOLATED).

    The job is read by the ``JobWatch`` of its database that all job triggers of the triggerer
    share: one query per interval for all of them, and a trigger wakes only when its job
    changed, so a triggerer can follow thousands of jobs with a short interval.

    :param job_id: the quota job's id.
    :param quota_conn_id: the Airflow connection of the quota database.
    :param poll_interval: seconds between two reads of the job (default 5: the shared read costs
        the same for one job as for a thousand, so a placement is noticed within seconds). The
        watch reads every job at the shortest interval any of its triggers asked for.
    :param cancel_on_kill: cancel the quota job when a user kills the deferred task (marks it
        failed or success, or clears it). ``QuotaTrainingOperator`` owns its job and sets it;
        ``QuotaJobSensor`` only watches and leaves it unset.
    :param print_log: log the training's own output while it runs (``training_log.py``): the
        local backend's log file every ``poll_interval`` (at least 1 s), a SageMaker job's
        CloudWatch streams every 30 s, each line once, as the provider's ``print_log``.
    :param aws_conn_id: the AWS connection CloudWatch is read with (SageMaker jobs).
    :param fire_not_before: the earliest time (epoch seconds) to fire, for a job that ends at
        once: ``settled_after_deferral()`` when the task defers (``DEFER_SETTLE_SECONDS``).
    :param give_up_at: when (epoch seconds) to stop waiting with a ``timeout`` event if the job
        is still live: the operator's ``max_attempts`` looks, ``check_interval`` apart, from
        its deferral. An absolute time, so a trigger restarted on another triggerer keeps it.
        The job is left as it is. None: wait until the job is final.
    """

    read_attempts = 5
    """Consecutive failed reads of the database before the trigger gives up with an error event."""

    def __init__(
        self,
        job_id: int,
        quota_conn_id: str = "quota_default",
        poll_interval: float = 5.0,
        cancel_on_kill: bool = False,
        print_log: bool = False,
        aws_conn_id: str | None = None,
        give_up_at: float | None = None,
        fire_not_before: float | None = None,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.job_id = job_id
        self.quota_conn_id = quota_conn_id
        self.poll_interval = poll_interval
        self.cancel_on_kill = cancel_on_kill
        self.print_log = print_log
        self.aws_conn_id = aws_conn_id
        self.give_up_at = give_up_at
        self.fire_not_before = fire_not_before

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "job_id": self.job_id,
                "quota_conn_id": self.quota_conn_id,
                "poll_interval": self.poll_interval,
                "cancel_on_kill": self.cancel_on_kill,
                "print_log": self.print_log,
                "aws_conn_id": self.aws_conn_id,
                "give_up_at": self.give_up_at,
                "fire_not_before": self.fire_not_before,
            },
        )

    def _event(self, status: Status, message: str, state: str | None = None, reason: str | None = None) -> TriggerEvent:
        return _fire(QuotaJobEvent(status, self.job_id, state, reason, message).payload())

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Fire the job's one event: final, refused or missing, or the database unreadable."""
        event = await self._follow()
        if self.fire_not_before is not None and (hold := self.fire_not_before - time.time()) > 0:
            self.log.info("firing in %.0f s, once Airflow has taken in the task's deferral", hold)
            await asyncio.sleep(hold)
        yield event

    async def _follow(self) -> TriggerEvent:
        """Follow the job through the database's ``JobWatch`` until there is an event to fire.
        The trigger has left the watch before its event is fired (the watch reads for no one)."""
        hook = QuotaHook(self.quota_conn_id)
        failures = 0
        while True:
            try:
                watch = JobWatch.for_url(await hook.aget_url())
                break
            except Exception as exc:  # a connection that cannot be looked up counts as a failed read
                failures += 1
                if (given_up := self._failed_read(failures, exc)) is not None:
                    return given_up
                await asyncio.sleep(self.poll_interval)
        subscription = watch.join(self.job_id, self.poll_interval)
        try:
            return await self._follow_readings(subscription, hook, failures)
        finally:
            subscription.leave()

    async def _follow_readings(self, subscription: Subscription, hook: QuotaHook, failures: int) -> TriggerEvent:
        """Log each change the watch hands over, once; the event when the job is final or gone,
        or when ``read_attempts`` reads in a row failed (``failures`` so far)."""
        last: tuple[Any, ...] | None = None
        alerted: set[int] = set()
        announced: float | None = None  # the max_pending deadline last said in the log
        foreseen: ForecastRow | None = None  # the forecast last said in the log
        warned_down = False
        tail = LogTail()
        while True:
            reading = await self._next_reading(subscription, tail, seen=last is not None)
            if reading is None:  # the training log's interval or the time to give up came, no change
                await tail.print_new(self.log)
                if last is not None and self.give_up_at is not None and time.time() >= self.give_up_at:
                    return self._event("timeout", "gave up waiting (give_up_at)", state=str(last[0]))
                continue
            job, error, refusal = reading.job, reading.error, None
            if error is None and job is None:
                try:
                    refusal = await hook.asubmission_refusal(self.job_id)
                except Exception as exc:
                    error = exc
            if error is not None:  # never out of run(): a broken database becomes an event
                failures += 1
                if (given_up := self._failed_read(failures, error)) is not None:
                    return given_up
                continue
            failures = 0
            if job is None:
                message = (
                    f"the quota scheduler refused quota job {self.job_id}: {refusal}"
                    if refusal
                    else f"there is no quota job {self.job_id} in the quota database"
                )
                self.log.error("%s", message)
                return self._event("error", message)
            await tail.print_new(self.log)  # what the training wrote before this change, first
            final = job.state in FINAL_STATES
            if final:  # the training's last lines before the quota's closing ones
                tail = await self._tail_of(job, tail, hook)
                await tail.print_new(self.log)
            key = state_key(job)
            if key != last:
                self.log.info("%s", describe_job(job, reading.borrowed))  # borrowing as it is now
                last = key
            if job.pending_deadline != announced and (due := describe_pending_deadline(job, time.time())):
                self.log.info("%s", due)  # once per wait: a new wait has a new deadline
                announced = job.pending_deadline
            if reading.forecast is not None and forecast_moved(foreseen, reading.forecast, time.time()):
                self.log.info("quota job %s: %s", job.id, forecast_words(reading.forecast, time.time()))
                foreseen = reading.forecast
            for alert in reading.alerts:
                if alert.id not in alerted:
                    self.log.warning("%s", describe_alert(alert))
                    alerted.add(alert.id)
            warned_down = self._say_scheduler_health(reading.scheduler, warned_down, job)
            if final:
                succeeded = job.state == JobState.SUCCEEDED.value
                return self._event(
                    "success" if succeeded else "failed", describe_job(job), state=job.state, reason=job.reason
                )
            tail = await self._tail_of(job, tail, hook)  # a new attempt's lines after the line saying it runs
            await tail.print_new(self.log)
            if self.give_up_at is not None and time.time() >= self.give_up_at:
                return self._event("timeout", "gave up waiting (give_up_at)", state=job.state)

    async def _next_reading(self, subscription: Subscription, tail: LogTail, seen: bool) -> Reading | None:
        """The watch's next reading of the job; None when a followed training log is due first,
        or the time to give up comes first (once the job was ``seen``: its state is the event's)."""
        waits = [] if tail.log is None or tail.failed else [tail.log.interval]
        if self.give_up_at is not None and seen:
            waits.append(max(self.give_up_at - time.time(), 0.0))
        if not waits:
            return await subscription.next()
        try:
            return await asyncio.wait_for(subscription.next(), min(waits))
        except asyncio.TimeoutError:
            return None

    async def _tail_of(self, job: JobRow, tail: LogTail, hook: QuotaHook) -> LogTail:
        """The tail of the job's current attempt's training log: the same while the attempt is,
        a new one (after the last lines of the old) once the backend started a new attempt."""
        if not self.print_log or job.attempts == 0 or (tail.log is not None and tail.log.attempt == job.attempts):
            return tail
        attempts = await asyncio.to_thread(hook.get_attempts, self.job_id)
        current = next((a for a in attempts if a.number == job.attempts and a.external_name), None)
        if current is None:
            return tail  # placed, not started yet: the row changes again once it is
        await tail.print_new(self.log)
        interval = max(self.poll_interval, 1.0)
        return LogTail(training_log(current.backend, current.number, current.external_name, self.aws_conn_id, interval))

    def _say_scheduler_health(self, health: SchedulerHealth | None, warned: bool, job: JobRow) -> bool:
        """Warn once when no quota scheduler runs while this job waits on it, and say when one
        runs again; returns whether the warning stands."""
        if health is None or job.state in FINAL_STATES:
            return warned
        if health.down and not warned:
            since = scheduler_silence(health.silent_seconds, time.time())
            self.log.warning(
                "no quota scheduler is running (%s): quota job %s waits until one does (start `airflow-quota"
                " scheduler`; the Quotas page shows the same banner)",
                since,
                self.job_id,
            )
            return True
        if warned and not health.down:
            self.log.info(
                "a quota scheduler runs again (%s): quota job %s is scheduled again", health.leader, self.job_id
            )
            return False
        return warned

    def _failed_read(self, failures: int, exc: Exception) -> TriggerEvent | None:
        """Log a failed read; the error event once ``read_attempts`` reads in a row failed."""
        self.log.warning(
            "quota job %s: cannot read the quota database (%d of %d): %s",
            self.job_id,
            failures,
            self.read_attempts,
            exc,
        )
        if failures >= self.read_attempts:
            return self._event("error", f"quota job {self.job_id}: the quota database stayed unreadable: {exc}")
        return None

    async def on_kill(self) -> None:
        """The user killed the deferred task (mark failed or success, clear): cancel the job
        this task owns. Triggerer restarts and redistribution do not call this."""
        if not self.cancel_on_kill:
            return
        try:
            asked = await QuotaHook(self.quota_conn_id).acancel(self.job_id)
        except Exception as exc:
            self.log.warning("quota job %s: could not ask for its cancellation: %s", self.job_id, exc)
            return
        if asked:
            self.log.info("quota job %s: cancellation requested (its task was killed)", self.job_id)


class QuotaCapacityTrigger(BaseTrigger):
    """Wait until a share could place a preference list (``QuotaHook.can_place_now``).

    Fires ``{"status": "success", "share", "entry", "message"}`` once it could, or
    ``{"status": "error", "share", "entry": None, "message"}`` after ``read_attempts``
    consecutive failed reads.

    :param share: the quota share.
    :param instance_preferences: the preference list, ``[{"instance_type", "count",
        "training_plan"?}, ...]``.
    :param quota_conn_id: the Airflow connection of the quota database.
    :param poll_interval: seconds between two checks.
    """

    read_attempts = 5

    def __init__(
        self,
        share: str,
        instance_preferences: list[dict[str, Any]],
        quota_conn_id: str = "quota_default",
        poll_interval: float = 30.0,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.share = share
        self.instance_preferences = instance_preferences
        self.quota_conn_id = quota_conn_id
        self.poll_interval = poll_interval

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "share": self.share,
                "instance_preferences": self.instance_preferences,
                "quota_conn_id": self.quota_conn_id,
                "poll_interval": self.poll_interval,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        hook = QuotaHook(self.quota_conn_id)
        last_reason: str | None = None
        failures = 0
        while True:
            try:
                check = await hook.acan_place_now(self.share, self.instance_preferences)
            except Exception as exc:
                failures += 1
                self.log.warning(
                    "share %s: cannot check capacity (%d of %d): %s", self.share, failures, self.read_attempts, exc
                )
                if failures >= self.read_attempts:
                    message = f"share {self.share}: the quota database stayed unreadable: {exc}"
                    yield _fire({"status": "error", "share": self.share, "entry": None, "message": message})
                    return
                await asyncio.sleep(self.poll_interval)
                continue
            failures = 0
            if check.placeable:
                self.log.info("share %s: %s", self.share, check.reason)
                yield _fire({"status": "success", "share": self.share, "entry": check.entry, "message": check.reason})
                return
            if check.reason != last_reason:
                self.log.info("share %s cannot place the list yet: %s", self.share, check.reason)
                last_reason = check.reason
            await asyncio.sleep(self.poll_interval)
