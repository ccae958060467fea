"""Alert delivery: each new alert goes to every notifier of ``alerts.notifiers``, at most once
per alert and notifier, even across a crash or a restart of the quota scheduler.

The core raises an alert once per job and condition; the scheduler records it in
``quota_alerts`` in the cycle's transaction. After that transaction has committed, a delivery
pass:

1. claims, in one transaction, each (alert, notifier) pair due: never tried, or failed and
   its retry time has come; the claim (``SENDING``) is written before anything is sent;
2. sends each claimed pair, outside any transaction; a notifier that raises is caught;
3. records, in one transaction, ``SENT``, or ``FAILED`` with the next try after an
   exponential back-off (``retry_seconds`` · 2^(attempt-1)), or ``GAVE_UP`` after
   ``attempts`` tries; an alert is done (``notified_at``) when every notifier it is meant for
   is done with it.

A scheduler that dies between 1 and 3 leaves ``SENDING`` claims; the next pass turns them into
``UNKNOWN`` (perhaps sent, perhaps not) and does not send them again: at most once, never twice.
Each alert sent is one line in the log, each failure one line with the alert, the notifier and
the error.

Passes run only when there may be work (an alert was just recorded, a retry fell due, the
scheduler started), so an idle scheduler does not query for alerts at every step. With
``background`` the passes run in a thread of their own, so a slow notifier (a network timeout)
never holds up the scheduler's cycles nor the renewal of its leader lease.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from airflow_quota.core.config import AlertsConfig
from airflow_quota.notifications.base import alert_message
from airflow_quota.notifications.loader import Notifier, build_notifiers, default_notifiers
from airflow_quota.service.metrics import QuotaMetrics
from airflow_quota.store.models import AlertRow, JobRow

log = logging.getLogger("airflow_quota.alerts")

SENDING, SENT, FAILED, GAVE_UP, UNKNOWN = "SENDING", "SENT", "FAILED", "GAVE_UP", "UNKNOWN"
DONE = frozenset({SENT, GAVE_UP, UNKNOWN})


def alert_context(alert: AlertRow, job: JobRow | None) -> dict[str, Any]:
    """What a notifier is given about one alert (``notifications.base`` documents it)."""
    return {
        "alert": {
            "id": alert.id,
            "kind": alert.kind,
            "job_id": alert.job_id,
            "job_name": alert.job,
            "share": alert.share,
            "reason": alert.reason,
            "age_seconds": alert.age_seconds,
            "position": alert.position,
            "at": datetime.fromtimestamp(alert.at, tz=timezone.utc).isoformat(timespec="seconds"),
            "timestamp": alert.at,
            "message": alert_message(alert.kind, alert.job_id, alert.job, alert.share, alert.reason, alert.position),
            "dag_id": job.dag_id if job else None,
            "task_id": job.task_id if job else None,
            "run_id": job.run_id if job else None,
        }
    }


@dataclass
class _Claim:
    """One (alert, notifier) pair claimed for sending in this pass."""

    alert_id: int
    title: str
    notifier: Notifier
    attempt: int
    context: dict[str, Any]
    error: str | None = None


class AlertDelivery:
    """Sends recorded alerts to the configured notifiers (see the module docstring).

    :param sessions: sessions on the quota database.
    :param metrics: counts notifications sent and failed.
    :param attempts: tries per alert and notifier before giving up.
    :param retry_seconds: the first retry's delay; each further one doubles it.
    :param batch: alerts looked at per pass (more wait for the next pass, due at once).
    """

    def __init__(
        self,
        sessions: sessionmaker[Session],
        metrics: QuotaMetrics,
        attempts: int = 5,
        retry_seconds: float = 5.0,
        batch: int = 100,
    ) -> None:
        self.sessions = sessions
        self.metrics = metrics
        self.attempts = attempts
        self.retry_seconds = retry_seconds
        self.batch = batch
        self.notifiers: list[Notifier] = default_notifiers()
        self._config: AlertsConfig | None = None
        self._due: float | None = float("-inf")
        """When the next pass may have work; None when nothing waits."""
        self._woken = False
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._running: Future[None] | None = None

    # -- configuration and timing ----------------------------------------------------------

    def configure(self, alerts: AlertsConfig) -> None:
        """Build the notifiers of a configuration the scheduler took in (when it changed). An
        entry that cannot be built is logged, naming it and the rule, and left out; with none
        left, alerts go to the log notifier."""
        if alerts is self._config or alerts == self._config:
            self._config = alerts
            return
        self._config = alerts
        notifiers, problems = build_notifiers(alerts)
        for problem in problems:
            log.error("%s: this notifier gets no alerts until the configuration is fixed", problem)
        self.notifiers = notifiers
        log.info("alerts go to %s", ", ".join(f"{n.name} ({n.class_path})" for n in notifiers))
        self.wake()

    def wake(self) -> None:
        """New alerts were recorded (or the notifiers changed): the next pass looks."""
        with self._lock:
            self._woken = True
            self._due = float("-inf")

    def in_background(self) -> None:
        """Run the passes in a thread of their own from now on (the scheduler process)."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="quota-alerts")

    def close(self) -> None:
        """Let a pass under way finish (its claims get their outcome), then stop the thread."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def deliver(self, now: float) -> None:
        """Run a pass when one may have work; in the background thread when there is one (and
        it is not busy with the previous pass)."""
        if self._due is None or now < self._due:
            return
        if self._executor is None:
            self.run_pass(now)
            return
        if self._running is not None and not self._running.done():
            return
        self._running = self._executor.submit(self._pass_in_background, now)

    def _pass_in_background(self, now: float) -> None:
        try:
            self.run_pass(now)
        except Exception as exc:  # the database went away: the next step's pass tries again
            log.error("alert delivery failed: %s: %s; retrying at the next step", type(exc).__name__, exc)
            with self._lock:
                self._due = float("-inf")

    # -- one pass --------------------------------------------------------------------------

    def run_pass(self, now: float) -> None:
        """Claim, send, record (see the module docstring)."""
        with self._lock:
            self._woken = False
        claims, next_due, full = self._claim(now)
        for claim in claims:
            try:
                claim.notifier.send(claim.context)
            except Exception as exc:
                claim.error = f"{type(exc).__name__}: {exc}".strip()
        if claims:
            next_due = _earliest(next_due, self._record(claims, now))
        with self._lock:
            if self._woken or full:
                self._due = float("-inf")
            else:
                self._due = next_due

    def _claim(self, now: float) -> tuple[list[_Claim], float | None, bool]:
        """Step 1: the pairs due, claimed. Also ends alerts that need nothing more and turns
        claims left by a scheduler that stopped while sending into UNKNOWN. Returns the claims,
        the earliest retry still to come, and whether the batch was full."""
        claims: list[_Claim] = []
        next_due: float | None = None
        with self.sessions() as session, session.begin():
            query = (
                select(AlertRow, JobRow)
                .outerjoin(JobRow, JobRow.id == AlertRow.job_id)
                .where(AlertRow.notified_at.is_(None))
                .order_by(AlertRow.id)
                .limit(self.batch)
                .with_for_update(of=AlertRow, skip_locked=True)
            )
            rows = session.execute(query).all()
            for alert, job in rows:
                title = _title(alert)
                deliveries = {name: dict(state) for name, state in (alert.deliveries or {}).items()}
                context: dict[str, Any] | None = None
                for notifier in self.notifiers:
                    if not notifier.accepts(alert.kind):
                        continue
                    state = deliveries.get(notifier.name)
                    if state is not None and state["state"] == SENDING:
                        log.warning(
                            "%s: the scheduler stopped while sending it to %s; it may or may not have "
                            "arrived, and is not sent again (at most once)",
                            title,
                            notifier.name,
                        )
                        state.update(state=UNKNOWN, at=now)
                        continue
                    if state is not None and state["state"] in DONE:
                        continue
                    if state is not None and state["next_at"] > now:
                        next_due = _earliest(next_due, state["next_at"])
                        continue
                    attempt = (state["attempts"] if state else 0) + 1
                    deliveries[notifier.name] = {
                        "state": SENDING,
                        "attempts": attempt,
                        "next_at": None,
                        "error": state["error"] if state else None,
                        "at": now,
                    }
                    context = context or alert_context(alert, job)
                    claims.append(_Claim(alert.id, title, notifier, attempt, context))
                alert.deliveries = deliveries
                self._finish_if_done(alert, deliveries, now)
        return claims, next_due, len(rows) >= self.batch

    def _record(self, claims: list[_Claim], now: float) -> float | None:
        """Step 3: each claim's outcome, one line per alert sent and per failure. Returns the
        earliest retry to come."""
        next_due: float | None = None
        sent_to: dict[int, list[str]] = {}
        with self.sessions() as session, session.begin():
            for claim in claims:
                alert = session.get(AlertRow, claim.alert_id)
                if alert is None:
                    continue
                deliveries = {name: dict(state) for name, state in (alert.deliveries or {}).items()}
                name = claim.notifier.name
                state = deliveries.setdefault(name, {"attempts": claim.attempt})
                self.metrics.notification(name, claim.error is None)
                if claim.error is None:
                    state.update(state=SENT, next_at=None, error=None, at=now)
                    sent_to.setdefault(claim.alert_id, []).append(name)
                elif claim.attempt >= self.attempts:
                    state.update(state=GAVE_UP, next_at=None, error=claim.error, at=now)
                    log.error(
                        "%s: notifier %s failed %d times, giving up: %s", claim.title, name, claim.attempt, claim.error
                    )
                else:
                    retry_at = now + self.retry_seconds * 2 ** (claim.attempt - 1)
                    state.update(state=FAILED, next_at=retry_at, error=claim.error, at=now)
                    next_due = _earliest(next_due, retry_at)
                    log.warning(
                        "%s: notifier %s failed (try %d of %d, next in %g s): %s",
                        claim.title,
                        name,
                        claim.attempt,
                        self.attempts,
                        retry_at - now,
                        claim.error,
                    )
                alert.deliveries = deliveries
                self._finish_if_done(alert, deliveries, now)
        for claim in claims:
            names = sent_to.pop(claim.alert_id, None)
            if names:
                log.info("%s: sent to %s", claim.title, ", ".join(names))
        return next_due

    def _finish_if_done(self, alert: AlertRow, deliveries: dict[str, Any], now: float) -> None:
        """An alert is done when every notifier it is meant for is done with it."""
        meant = [n.name for n in self.notifiers if n.accepts(alert.kind)]
        if all(deliveries.get(name, {}).get("state") in DONE for name in meant):
            alert.notified_at = now
            alert.notified = all(deliveries[name]["state"] == SENT for name in meant)


def _title(alert: AlertRow) -> str:
    return f"alert {alert.id} {alert.kind} for job {alert.job_id} ({alert.job}) [{alert.share}]"


def _earliest(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)
