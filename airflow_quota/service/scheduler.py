"""``airflow-quota scheduler``: the long-running quota scheduler.

One step of the leader:

1. take in the inbox (submissions, priority changes, cancels, configuration versions) in order;
2. read what the poller (``service/polling.py``) last heard from the backends about the attempts
   they run (running, finished, stopped): the backends are asked in the poller's own threads,
   each on its own interval, so the step never waits on a backend's API;
3. run a cycle when anything came in, a timer of the core fell due, or a second has passed;
4. commit, in one transaction: the inputs (the log that rebuilds the state), the decisions, the
   jobs as they now stand, the backend actions still to do (start, stop), and the shares' view
   when it changed (the read model every reader shows, ``store/views.py``);
5. mark done the backend actions whose outcomes the poller's threads have brought back, and ask
   them for the actions still to do: the starts and stops run there, charged to the same
   per-backend rate as the polls, so the step never waits on a backend's API. Marking done is
   a compare-and-set in a fenced transaction: an outcome is written only while this process
   leads (the lease's epoch) and the attempt still has that action. A placement committed in
   this step and preempted in the same step was never asked of the backend ("not started");
   once committed it is STARTING (its start may be in flight), and a preemption or cancel then
   turns its START into a STOP, carried out after the start returns;
6. send the alerts just recorded to the notifiers (``service/alerts.py``), and the step's
   metrics (``service/metrics.py``).

A scheduler killed at any point recovers on restart: it replays the input log into a fresh core
(the same state the last leader had), then asks again for the backend actions it finds pending
(starting an attempt is idempotent by its key: SageMaker's training job name is derived from it,
stopping one twice is harmless) and asks the backends about the rest.

Leadership is a fenced lease (``store/lock.py``): the leader renews it every step, and every
transaction that commits decisions or marks a backend action done first checks that the lease
is still its own (same epoch); when it is not, the transaction rolls back and the process steps
down. The poller's threads check it too, just before each start or stop. Any database error (a
dropped connection, a server restart, a failover) is logged in one line; the process forgets
its in-memory state (it may be ahead of what was committed), waits (0.5 s, doubling to 5 s) and
starts again from the committed log. Decision lines are logged once their transaction has
committed, so a decision is never logged by two leaders.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, delete, select
from sqlalchemy.orm import Session, sessionmaker

from airflow_quota.core.cycle import QuotaScheduler
from airflow_quota.core.explain import describe
from airflow_quota.core.inputs import (
    CycleDue,
    Input,
)
from airflow_quota.core.model import (
    Decision,
    Job,
    Placed,
    Rejected,
)
from airflow_quota.service import snapshots
from airflow_quota.service.actions import LeaseGuards, attempt_spec, mark_starting_since_upgrade, write_outcomes
from airflow_quota.service.alerts import AlertDelivery
from airflow_quota.service.backends.base import (
    AttemptReport,
    AttemptSpec,
    Backend,
)
from airflow_quota.service.clock import Clock, WallClock
from airflow_quota.service.forecasts import ForecastRefresh
from airflow_quota.service.inputs import apply, from_row, refusal, to_row
from airflow_quota.service.intake import (
    INBOX,
    REQUESTS_PER_STEP,
    is_news,
    known_of,
    refusal_of_forgotten,
    report_order,
    request_payload,
    take_report,
)
from airflow_quota.service.leader import DATABASE_ERRORS, LeaderLoop
from airflow_quota.service.metrics import QuotaMetrics
from airflow_quota.service.open_attempts import (
    OpenAttempts,
    attempt_changes,
    attempt_row,
    attempt_values,
    keyed,
)
from airflow_quota.service.polling import (
    DEFAULT_POLL_WORKERS,
    ActionKind,
    ActionOutcome,
    AttemptKey,
    BackendAction,
    Known,
    Poller,
)
from airflow_quota.service.pruning import LeaderPruning
from airflow_quota.service.read_model import ReadModel
from airflow_quota.service.records import DecisionRows, add_rows, event_row, stops_an_attempt
from airflow_quota.sim.gc_tuning import freeze_long_lived
from airflow_quota.store.bulk import insert_returning_ids, insert_rows, pipelined, update_by_key
from airflow_quota.store.engine import reachable, session_factory
from airflow_quota.store.lock import LeadershipLost, leader_lock
from airflow_quota.store.models import (
    Attempt,
    AttemptState,
    ConfigVersion,
    JobRow,
    Request,
)
from airflow_quota.store.models import Input as InputRow
from airflow_quota.store.settings import DEFAULT_RETENTION_DAYS

log = logging.getLogger("airflow_quota.scheduler")

VIEW_SECONDS = 1.0
"""How far behind its commits the scheduler process lets the shares' view fall while busy
(``QuotaService``'s ``view_seconds``): readers (the Quotas page, ``airflow-quota shares``, the
gauges) see it at most a second old, and exact once the leader has nothing to do."""
SUBMITTED_ROWS_SLACK = 10_000
"""Job rows a leader keeps beyond twice the jobs its core holds before it forgets those of
jobs the core no longer holds (``QuotaService._keep_submitted``)."""


@dataclass
class _Step:
    """What one step gathered before it commits."""

    inputs: list[tuple[str, dict[str, Any], float]] = field(default_factory=list)
    """The log rows of the inputs taken in (``service.inputs.to_row``), with their instants."""
    decisions: list[Decision] = field(default_factory=list)
    causes: list[int | None] = field(default_factory=list)
    """For each decision, the index in ``inputs`` of the input that caused it (None: a refusal)."""
    handled: list[tuple[int, str, str | None]] = field(default_factory=list)
    rejected_jobs: list[int] = field(default_factory=list)
    rejected_ids: dict[str, int] = field(default_factory=dict)
    touched: set[int] = field(default_factory=set)
    ended: list[tuple[int, int, AttemptReport]] = field(default_factory=list)
    running: list[tuple[int, int, float]] = field(default_factory=list)
    placed: list[Attempt] = field(default_factory=list)
    """The attempts this step placed: STARTING once the commit asks their backends to start them."""
    alerts: int = 0
    """Alerts recorded: the delivery looks for them once the step has committed."""
    cycle_seconds: float | None = None
    """How long the step's cycle took (wall time), when it ran one."""


class QuotaService(LeaderLoop):
    """The quota scheduler process. ``step`` is one pass of the leader (tests call it directly
    with a manual clock); ``run`` (``LeaderLoop``, service/leader.py) takes the lease and loops
    until stopped.

    :param metrics: where the step's metrics go; by default none from ``step`` alone, and
        Airflow's metrics as ``[metrics]`` configures them once ``run`` starts the process.
    :param alert_attempts: tries per alert and notifier before delivery gives up.
    :param alert_retry_seconds: the first retry's delay (doubling after each failure).
    :param lease_seconds: how long the leader's lease lasts without a heartbeat; a standby
        takes over a leader that stopped beating this long (``--lease-seconds``).
    :param leader_lease_seconds: deprecated: ``lease_seconds`` under an older name; it still
        works, with a ``DeprecationWarning``, until 1.0.
    :param poll_workers: the cap on one backend's polls in flight at once (``--poll-workers``);
        how often each attempt is polled is its backend's ``poll_interval_seconds``.
    :param snapshot_every: a snapshot of the core every this many inputs, and at a clean stop,
        so that recovery replays only the inputs after it (``service/snapshots.py``); 0: none.
    :param retention_days: finished jobs and covered inputs are pruned this long after they
        ended, a batch at a time in idle steps (``service/pruning.py``); 0 keeps everything.
    :param view_seconds: while steps follow one another, the shares' view (``store/views.py``)
        is rewritten at most this often, in wall-clock seconds, and by the first step that finds
        nothing to do when it is behind; 0 (the default here, what tests drive): in every commit
        that changes it. The scheduler process runs with ``VIEW_SECONDS``: readers poll every few
        seconds, and computing the view in every commit was a quarter of a busy leader's step.
    :param forecast_interval: refresh every live job's forecast (``quota_forecasts``) after
        changes, at most this often in seconds, in a process of its own (``--forecast-interval``);
        None (the default here): no forecast. ``forecast_inline`` runs it in this process, for
        tests that step a manual clock.
    :param requests_announced: every client says when it has added a request
        (``request_added``: the replays, whose client runs in this process), so ``step`` reads
        the inbox only then and every ``INBOX_SAFETY_SECONDS``, as ``run`` does on PostgreSQL
        after a notification (``service/inbox.py``). Otherwise a ``step`` outside ``run`` reads it
        every time.
    """

    _freezes_heap = False
    """Whether this is the scheduler process (``run``), whose long-lived objects are frozen."""
    _step_sessions: sessionmaker[Session] | None = None
    """Sessions on the step's one connection while a step runs (``_one_connection``)."""

    def __init__(
        self,
        engine: Engine,
        backends: Mapping[str, Backend],
        clock: Clock | None = None,
        holder: str | None = None,
        cycle_seconds: float = 1.0,
        poll_seconds: float = 0.2,
        lease_seconds: float = 10.0,
        capacity_backoff_seconds: float = 600.0,
        refresh_views_seconds: float = 5.0,
        metrics: QuotaMetrics | None = None,
        alert_attempts: int = 5,
        alert_retry_seconds: float = 5.0,
        leader_lease_seconds: float | None = None,
        poll_workers: int = DEFAULT_POLL_WORKERS,
        retention_days: float = DEFAULT_RETENTION_DAYS,
        snapshot_every: int = snapshots.DEFAULT_SNAPSHOT_EVERY,
        view_seconds: float = 0.0,
        requests_announced: bool = False,
        forecast_interval: float | None = None,
        forecast_inline: bool = False,
    ) -> None:
        self.read_model = ReadModel(view_seconds, refresh_views_seconds)
        """What readers see: the shares' view and the scheduler's columns of the job rows."""
        self.backends = dict(backends)
        holder = holder or f"{socket.gethostname()}:{os.getpid()}"
        if leader_lease_seconds is not None:
            warnings.warn(
                "QuotaService(leader_lease_seconds=...) is deprecated: use lease_seconds",
                DeprecationWarning,
                stacklevel=2,
            )
            lease_seconds = leader_lease_seconds
        lock = leader_lock(engine, holder, lease_seconds, backends=list(self.backends))
        super().__init__(engine, holder, lock, poll_seconds, requests_announced)
        self.clock = clock or WallClock()
        self.wall_clock = isinstance(self.clock, WallClock)
        self.cycle_seconds = cycle_seconds
        self.capacity_backoff_seconds = capacity_backoff_seconds
        self.sessions = session_factory(engine)
        self.scheduler: QuotaScheduler | None = None
        self._last_cycle = float("-inf")
        self._beats_reported = 0
        self.recovered = False
        self.snapshot_every = snapshot_every
        self._inputs_since_snapshot = 0
        """Inputs committed since the last snapshot (or replayed after it at recovery)."""
        self._metrics_given = metrics is not None
        self.metrics = metrics or QuotaMetrics.off()
        self.alerts = AlertDelivery(self.sessions, self.metrics, alert_attempts, alert_retry_seconds)
        self.poller = Poller(self.backends, self.clock.now, poll_workers)
        """Starts, stops and polls attempts: inline in ``step`` until ``run`` starts its threads."""
        self.guards = LeaseGuards(self.sessions, self.lock, lambda: self._fencing)
        """What the poller's threads check around each backend call once ``run`` leads."""
        self.poller.set_still_wanted(self.guards.still_wanted)
        self.poller.set_undo_of_start(self.guards.undo_of_late_start)
        self.poller.set_on_news(self._news.set)  # a finish is taken in (and placed) at once
        self.pruning = LeaderPruning(self.sessions, retention_days)
        """Retention: a short batch in a step that had nothing else to do."""
        self.open_attempts = OpenAttempts()
        """The attempts not ended, as this leader last committed them (``service/open_attempts.py``)."""
        self.forecasts = (
            None
            if forecast_interval is None
            else ForecastRefresh(
                engine.url.render_as_string(hide_password=False), forecast_interval, inline=forecast_inline
            )
        )
        """Every live job's forecast, refreshed after changes (``service/forecasts.py``); None: off."""
        self._submitted: dict[int, JobRow] = {}
        """Job rows as read by this leader, for what their submission fixed and nothing changes
        (``_submitted_rows``)."""

    # -- what starts and stops with the process and the leadership (``LeaderLoop``) ---------

    def _starting(self) -> None:
        if not self._metrics_given:
            self.metrics = self.alerts.metrics = QuotaMetrics.from_airflow()
        self.alerts.in_background()  # a slow notifier must not hold up cycles or the lease
        self.poller.start()  # nor a slow or throttled backend API
        self._freezes_heap = True

    def _stopping(self, leading: bool) -> None:
        self.alerts.close()
        if self.forecasts is not None:
            self.forecasts.close()
        self.poller.stop()
        if leading and self._inputs_since_snapshot:  # the next leader replays nothing
            try:
                self.snapshot(self.clock.now())
            except (*DATABASE_ERRORS, LeadershipLost) as exc:
                log.warning("%s could not write its last snapshot (%s)", self.holder, exc)

    def _forget(self) -> None:
        self.scheduler = None
        self.poller.forget()  # a standby asks the backends about nothing

    def _took_the_lease(self) -> None:
        self.recover()
        self._freeze_heap()

    # -- recovery ------------------------------------------------------------------------

    def recover(self) -> None:
        """Rebuild the core from the newest snapshot that loads and the inputs after it
        (``service/snapshots.py``), then finish what the last leader left undone."""
        started = time.perf_counter()
        with reachable(str(self.engine.url)), self.sessions() as session:
            recovered = snapshots.recover(session, inputs_pruned=snapshots.inputs_pruned(session))
        self.scheduler = recovered.scheduler
        self.open_attempts.forget()  # read again: the last leader's commits are not this process's
        self._inputs_since_snapshot = recovered.replayed
        self._last_cycle = float("-inf")
        if recovered.snapshot_id is None:
            log.info("recovered from %d inputs in %.2f s", recovered.replayed, time.perf_counter() - started)
        else:
            log.info(
                "recovered from snapshot %d (after input %d) and the %d inputs after it in %.2f s",
                recovered.snapshot_id,
                recovered.after_input,
                recovered.replayed,
                time.perf_counter() - started,
            )
        if self.poller.background:  # the poller starts on the open attempts while the rest recovers
            self._track_open_attempts(self.clock.now())
        self.read_model.committed(None)
        self._rewrite_view(self.clock.now())
        self._starting_since_upgrade()
        self.open_attempts.forget()  # an upgrade's starts just changed status
        self._act(self.clock.now())
        self.alerts.wake()  # alerts the last leader recorded and did not finish delivering
        self.recovered = True

    def snapshot(self, now: float) -> None:
        """Write a snapshot of the core as of the inputs committed so far, fenced like the
        decisions (``service/snapshots.py``); every ``snapshot_every`` inputs and at a clean stop."""
        if self.scheduler is None:
            return
        started = time.perf_counter()
        with self._session() as session, session.begin():
            self._fence(session)
            row = snapshots.write_snapshot(session, self.scheduler, now, self.lock.epoch if self._fencing else None)
            snapshot_id, after, jobs, size = row.id, row.last_input_id, row.jobs, row.size
        self._inputs_since_snapshot = 0
        self._forget_submitted()
        self._freeze_heap()
        log.info(
            "snapshot %d written after input %d: %d jobs, %.1f MB, in %.2f s",
            snapshot_id,
            after,
            jobs,
            size / 1e6,
            time.perf_counter() - started,
        )

    def _freeze_heap(self) -> None:
        """In the scheduler process (``run``), after recovery and each snapshot: what lives now
        lives long, and no garbage collection walks it again (``freeze_long_lived``), so none
        holds a step or a prune batch for the whole heap's walk."""
        if self._freezes_heap:
            freeze_long_lived()

    # -- one step ------------------------------------------------------------------------

    def step(self) -> bool:
        """One pass of the leader; True when anything came in, was decided or was marked done.
        The forecast's worker waits meanwhile (``ForecastRefresh.leader_first``)."""
        try:
            with self.forecasts.leader_first() if self.forecasts is not None else nullcontext():
                return self._step()
        except BaseException:
            self.open_attempts.forget()  # what it took in and did not commit is looked at again, all of it
            self._request_added = True  # and the inbox read again
            raise

    def _step(self) -> bool:
        now = self.clock.now()
        gathered = _Step()
        with reachable(str(self.engine.url)), self._one_connection():
            self._take_in_reports(gathered, now)  # what finished at this instant releases first
            self._take_in_requests(gathered, now)
            due = self.scheduler is not None and (
                gathered.inputs
                or now - self._last_cycle >= self.cycle_seconds
                or ((timer := self.scheduler.next_timer()) is not None and timer <= now)
            )
            if due:
                self._cycle(gathered, now)
            if gathered.inputs or gathered.handled or gathered.ended or gathered.running:
                self._commit(gathered, now)
                self._inputs_since_snapshot += len(gathered.inputs)
                if self.snapshot_every and self._inputs_since_snapshot >= self.snapshot_every:
                    self.snapshot(now)
            if self.read_model.due(now):
                self._rewrite_view(now)
            for decision in gathered.decisions:  # committed: never logged by two leaders
                log.info(describe(decision, wall_clock=self.wall_clock))
            acted = self._act(now)
            self._report(gathered, now)
        # a start marked done opens an attempt the next step hands to the poller at once
        worked = bool(gathered.decisions or gathered.handled or acted)
        if self.forecasts is not None:
            self.forecasts.after_step(self.scheduler, now, bool(gathered.decisions or gathered.ended))
        if not worked:
            with reachable(str(self.engine.url)):
                if self.read_model.behind:  # the burst is over: readers see where it left the shares
                    self._rewrite_view(now)
                self.pruning.when_idle(now, self._fence)
        return worked

    @contextmanager
    def _one_connection(self) -> Iterator[None]:
        """Run the step's transactions on one connection: checked out of the pool once, so
        pinged once (``pool_pre_ping``), not once a session. A connection the server dropped
        meanwhile fails the step's next statement, which ``run`` retries like any database error."""
        with self.engine.connect() as connection:
            self._step_sessions = sessionmaker(connection, expire_on_commit=False)
            try:
                yield
            finally:
                self._step_sessions = None

    def _session(self) -> Session:
        """A session of the leader's own thread: on the step's connection inside ``step``
        (``_one_connection``), from the pool otherwise (recovery, the last snapshot). Even a
        read ends in a COMMIT (``session.begin()``), not in the ROLLBACK of a session closed
        inside its transaction: psycopg forgets every statement it has prepared on a
        connection at each ROLLBACK, and the step's statements would be parsed and planned
        again at every step."""
        return (self._step_sessions or self.sessions)()

    def _cycle(self, gathered: _Step, now: float) -> None:
        """Run a cycle. One that decided nothing and left the guarantee watchdog idle changed
        nothing a replay needs, so it is not logged (an idle leader runs one a second); one the
        watchdog counts is, so that a new leader counts the same cycles."""
        assert self.scheduler is not None
        started = time.perf_counter()
        watched = self.scheduler.guarantee_watched()
        decided = self._feed(gathered, CycleDue(), now)
        if not decided and not watched and not self.scheduler.guarantee_watched():
            gathered.inputs.pop()
            log.debug("cycle at %.3f: nothing to decide", now)
        gathered.cycle_seconds = time.perf_counter() - started
        self._last_cycle = now

    def _report(self, gathered: _Step, now: float) -> None:
        """Step 6, after the commit: the alerts to the notifiers (a pass runs only when one
        may have work), the step's counters and the time of a cycle that had work, and the
        gauges every few seconds."""
        if self.scheduler is None:
            return
        self.alerts.configure(self.scheduler.state.config.alerts)
        if gathered.alerts:
            self.alerts.wake()
        self.alerts.deliver(now)
        if self.metrics.enabled:
            self.metrics.heartbeats(self.lock.beats - self._beats_reported)
            self._beats_reported = self.lock.beats
            self.metrics.decisions(gathered.decisions)
            if gathered.cycle_seconds is not None and (gathered.decisions or gathered.handled or gathered.ended):
                self.metrics.cycle(gathered.cycle_seconds)  # idle cycles (one a second) are not timed
            self.metrics.gauges(self.read_model.view, now)

    def _feed(
        self, gathered: _Step, item: Input, now: float, row: tuple[str, dict[str, Any]] | None = None
    ) -> list[Decision]:
        """Apply one input to the core and keep it for the log, as ``row`` when it came from
        one; a refused input is not kept (it changed nothing) and yields one ``Rejected``."""
        self.scheduler, decisions = apply(self.scheduler, item, now)
        gathered.decisions.extend(decisions)  # logged by ``step`` once committed
        cause = None
        if refusal(decisions) is None:
            kind, payload = row or to_row(item)
            cause = len(gathered.inputs)
            gathered.inputs.append((kind, payload, now))
        gathered.causes.extend([cause] * len(decisions))
        return decisions

    def _take_in_requests(self, gathered: _Step, now: float) -> None:
        if not self._inbox_due():
            return
        self._inbox_read_at = time.monotonic()
        with self._session() as session, session.begin():
            taken = session.execute(INBOX).all()
            requests = [request for request, _ in taken]
            if len(requests) == REQUESTS_PER_STEP:
                self._request_added = True  # more wait: read on at the next step
            jobs = {request.job_id: row for request, row in taken if request.job_id is not None}
            self._keep_submitted(row for request, row in taken if row is not None and request.kind == "submit")
            documents = {}
            for request in requests:
                if request.kind == "config":
                    version = session.get(ConfigVersion, request.payload["version"])
                    documents[request.id] = version.document if version else None
        for request in requests:
            payload = request_payload(request, jobs, documents)
            if self.scheduler is None and request.kind != "config":
                self._request_added = True  # read again once there is one
                break  # nothing can be taken in before the first configuration
            refused: Rejected | None
            if request.job_id is not None and self._forgotten(request.job_id) and request.kind != "submit":
                refused = refusal_of_forgotten(request, jobs.get(request.job_id), now)
                gathered.decisions.append(refused)
                gathered.causes.append(None)
            else:
                refused = refusal(self._feed(gathered, from_row(request.kind, payload), now, (request.kind, payload)))
            if refused is None:
                gathered.handled.append((request.id, "accepted", None))
            else:
                gathered.handled.append((request.id, "refused", refused.error))
                if request.job_id is not None:
                    gathered.rejected_ids[refused.job] = request.job_id
                if request.kind == "submit" and request.job_id is not None:
                    gathered.rejected_jobs.append(request.job_id)
            if request.job_id is not None:
                gathered.touched.add(request.job_id)

    def _take_in_reports(self, gathered: _Step, now: float) -> None:
        """Tell the poller which attempts to follow, read what it last heard of them (without
        waiting: when its threads run, the backends are asked there, each on its own interval;
        when nobody started them, the polls due now run here), and turn what changed into
        inputs.

        Only what changed is looked at: the attempts the leader changed and the ones whose
        report changed (``Poller.take_news``), not every open attempt at every step. Just after
        the open attempts are loaded, all of them are (``_reports_walked``, the reference a test
        holds the incremental way to)."""
        if self.scheduler is None:
            return
        kept = self._open_attempts()
        polled = self._reports_walked(now) if kept.to_recheck is None else self._reports_changed(now)
        polled.sort(key=report_order(kept.placement_order))  # the simulator's order of one instant
        kept.to_recheck = {(attempt.job_id, attempt.number) for attempt, _ in polled}  # until resolved
        for attempt, report in polled:
            self._ingest(gathered, attempt, report, now)

    def _reports_walked(self, now: float) -> list[tuple[Attempt, AttemptReport]]:
        """Every open attempt told to the poller, and each one's report that is news."""
        open_attempts = self._track_open_attempts(now)
        self.poller.take_news()  # every report is looked at below
        if not self.poller.background:
            self.poller.poll_due(now)
        reports = self.poller.reports()
        polled: list[tuple[Attempt, AttemptReport]] = []
        for attempt in open_attempts:
            report = reports.get(attempt.backend, {}).get((attempt.job_id, attempt.number))
            if report is not None and is_news(attempt, report):
                polled.append((attempt, report))
        return polled

    def _reports_changed(self, now: float) -> list[tuple[Attempt, AttemptReport]]:
        """The attempts the leader changed since the last step followed or unfollowed, then the
        reports that are news among theirs and the ones the poller has news of."""
        kept = self.open_attempts
        changed = kept.take_to_recheck()
        self._follow_changed(changed, now)
        if not self.poller.background:
            self.poller.poll_due(now)
        wanted: dict[str, list[Attempt]] = {}
        for key in changed | self.poller.take_news():
            attempt = kept.get(key)
            if attempt is not None and attempt.action is None:
                wanted.setdefault(attempt.backend, []).append(attempt)
        reports = self.poller.reports_of(
            {backend: [(a.job_id, a.number) for a in attempts] for backend, attempts in wanted.items()}
        )
        polled: list[tuple[Attempt, AttemptReport]] = []
        for backend, attempts in wanted.items():
            for attempt in attempts:
                report = reports.get(backend, {}).get((attempt.job_id, attempt.number))
                if report is not None and is_news(attempt, report):
                    polled.append((attempt, report))
        return polled

    def _follow_changed(self, changed: set[AttemptKey], now: float) -> None:
        """Have the poller follow the changed attempts that are open with no action pending and
        unfollow the others (ended, or with a start or stop in hand)."""
        follow = [
            attempt
            for key in sorted(changed)
            if (attempt := self.open_attempts.get(key)) is not None
            and attempt.action is None
            and attempt.backend in self.backends
        ]
        self.poller.unfollow(changed - {(a.job_id, a.number) for a in follow})
        if not follow:
            return
        rows = self._submitted_rows({a.job_id for a in follow})
        added: dict[str, dict[AttemptKey, AttemptSpec]] = {}
        known: dict[str, dict[AttemptKey, Known]] = {}
        for attempt in follow:
            row = rows.get(attempt.job_id)
            if row is None:
                continue
            added.setdefault(attempt.backend, {})[attempt.job_id, attempt.number] = self._spec(row, attempt)
            seen = known_of(attempt)
            if seen is not None:
                known.setdefault(attempt.backend, {})[attempt.job_id, attempt.number] = seen
        self.poller.follow(added, now, known)

    def _track_open_attempts(self, now: float) -> list[Attempt]:
        """The attempts started and not ended, in the order they were placed (the step, then
        the PLACED decision's place in its log); the poller is told to follow them, and them
        only (the job rows are loaded only for the attempts it does not follow yet)."""
        tracking = self.poller.tracking()
        open_attempts = self._open_attempts().in_order()
        new = [a for a in open_attempts if (a.job_id, a.number) not in tracking.get(a.backend, ())]
        rows: dict[int, JobRow | None] = {}
        if new:
            rows = self._submitted_rows({a.job_id for a in new})
        tracked: dict[str, dict[AttemptKey, AttemptSpec | None]] = {}
        known: dict[str, dict[AttemptKey, Known]] = {}
        for attempt in open_attempts:
            if attempt.backend not in self.backends:
                continue
            row = rows.get(attempt.job_id)
            spec = None if row is None else self._spec(row, attempt)
            tracked.setdefault(attempt.backend, {})[attempt.job_id, attempt.number] = spec
            seen = known_of(attempt) if spec is not None else None
            if seen is not None:
                known.setdefault(attempt.backend, {})[attempt.job_id, attempt.number] = seen
        self.poller.track(tracked, now, known)
        return open_attempts

    def _open_attempts(self) -> OpenAttempts:
        """The open attempts kept, read first when they are not (``OpenAttempts.load``)."""
        if not self.open_attempts.loaded:
            with self._session() as session, session.begin():
                self.open_attempts.load(session)
        return self.open_attempts

    def _ingest(self, gathered: _Step, attempt: Attempt, report: AttemptReport, now: float) -> None:
        """Take in a report that is news (``intake.take_report`` says what it means): the
        attempt's row changes at the commit, the core is told what its job's current attempt did."""
        assert self.scheduler is not None
        job = self._job(attempt.job_id)
        taken = take_report(attempt, report, job, now, self.capacity_backoff_seconds)
        if taken.running_since is not None:
            gathered.running.append((attempt.job_id, attempt.number, taken.running_since))
            gathered.touched.add(attempt.job_id)
        if taken.ended is not None:
            gathered.ended.append((attempt.job_id, attempt.number, taken.ended))
            gathered.touched.add(attempt.job_id)
        for item in taken.inputs:
            self._feed(gathered, item, now)

    def _forgotten(self, job_id: int | None) -> bool:
        """Whether the core has forgotten the job (finished, ``QuotaScheduler.forget_finished``)."""
        return job_id is not None and self.scheduler is not None and job_id not in self.scheduler.state.refs

    def _job(self, job_id: int) -> Job | None:
        assert self.scheduler is not None
        seq = self.scheduler.state.refs.get(job_id)
        return None if seq is None else self.scheduler.state.jobs[seq]

    # -- committing ----------------------------------------------------------------------

    def _commit(self, gathered: _Step, now: float) -> None:
        assert self.scheduler is not None or not gathered.decisions
        kept = self._open_attempts()
        with self._session() as session, session.begin():
            self._fence(session)
            attempts = self._attempts_of(gathered)
            before = {key: attempt_values(attempt) for key, attempt in keyed(attempts)}
            for job_id, number, running_since in gathered.running:
                attempt = attempts.get(job_id, {}).get(number)
                if attempt is not None and attempt.ended_at is None:
                    attempt.status, attempt.running_since = AttemptState.RUNNING.value, running_since
            for job_id, number, report in gathered.ended:
                attempt = attempts.get(job_id, {}).get(number)
                if attempt is not None:
                    attempt.status, attempt.reason = AttemptState(report.status.value).value, report.reason
                    attempt.ended_at = now if report.ended_at is None else report.ended_at
            inputs = [{"at": at, "kind": kind, "payload": payload} for kind, payload, at in gathered.inputs]
            input_ids = insert_returning_ids(session, InputRow, inputs)
            rows = DecisionRows(gathered.placed, attempts, self._backends_of_placed(session, gathered.decisions))
            for decision, cause in zip(gathered.decisions, gathered.causes, strict=True):
                self._record(decision, None if cause is None else input_ids[cause], gathered, rows)
            gathered.alerts += len(rows.alerts)
            for attempt in gathered.placed:
                if attempt.action == ActionKind.START.value:  # not preempted in this same step
                    attempt.status = AttemptState.STARTING.value
            with pipelined(session):
                insert_rows(session, Attempt, [attempt_row(attempt) for attempt in gathered.placed])
                update_by_key(session, Attempt, attempt_changes(attempts, before))
                if gathered.handled:  # one executemany, not a load and a flush a request
                    update_by_key(
                        session,
                        Request,
                        [
                            {"id": request_id, "handled": True, "outcome": outcome, "error": error}
                            for request_id, outcome, error in gathered.handled
                        ],
                    )
                rows.insert(session)
                if gathered.rejected_jobs:
                    for job_id in gathered.rejected_jobs:
                        self._submitted.pop(job_id, None)
                    session.execute(delete(JobRow).where(JobRow.id.in_(gathered.rejected_jobs)))
                state = self.scheduler.state if self.scheduler is not None else None
                if state is not None:
                    self.read_model.write_jobs(session, state, gathered.touched - set(gathered.rejected_jobs), now)
            view, behind = self.read_model.in_commit(session, state, now)
        self.read_model.committed(view, behind)
        kept.committed(attempts, gathered.placed)

    def _rewrite_view(self, now: float) -> None:
        """Write the view of the core's state now, in a transaction of its own: after recovery
        whatever is stored (a database just upgraded has none, and what could be placed may have
        changed with time while no leader ran), and after a burst of steps that left it behind
        (``view_seconds``)."""
        if self.scheduler is None:
            return
        with self._session() as session, session.begin():
            self._fence(session)
            view = self.read_model.write_view(session, self.scheduler.state, now)
        self.read_model.committed(view)

    def _attempts_of(self, gathered: _Step) -> dict[int, dict[int, Attempt]]:
        """The open attempts of the jobs whose attempts this step changes (reported running or
        ended, preempted, cancelled), by job id and number: copies of the ones the leader keeps
        (``OpenAttempts.copies_of``), for ``_commit`` to change and write; the kept ones are
        replaced by them once committed. An attempt that ended is never changed again."""
        job_ids = {job_id for job_id, _, _ in gathered.running} | {job_id for job_id, _, _ in gathered.ended}
        for decision in gathered.decisions:
            if stops_an_attempt(decision) and (job := self._job_of(decision)) is not None and job.ref is not None:
                job_ids.add(job.ref)
        return self.open_attempts.copies_of(job_ids)

    def _backends_of_placed(self, session: Session, decisions: list[Decision]) -> dict[int, str]:
        """The backend of each job placed by ``decisions``, by job id, read in one query."""
        refs = {
            ref
            for decision in decisions
            if isinstance(decision, Placed) and (job := self._job_of(decision)) and (ref := job.ref) is not None
        }
        return {job_id: row.backend for job_id, row in self._submitted_rows(refs, session).items() if row is not None}

    def _submitted_rows(self, ids: set[int], session: Session | None = None) -> dict[int, JobRow | None]:
        """The rows of these jobs, for what their submission fixed (name, share, backend, request,
        training, connection), never for what the leader writes later (state, positions): kept
        from the step that took the submission in, or read (in ``session``, else a session of its
        own) and kept. A job the core no longer holds is forgotten at the next snapshot."""
        missing = {job_id for job_id in ids if job_id not in self._submitted}
        if missing:
            if session is None:
                with self._session() as own, own.begin():
                    read = _rows_by_id(own, missing)
            else:
                read = _rows_by_id(session, missing)
            self._keep_submitted(row for row in read.values() if row is not None)
        return {job_id: self._submitted.get(job_id) for job_id in ids}

    def _keep_submitted(self, rows: Iterable[JobRow]) -> None:
        """Keep these rows for ``_submitted_rows``; past a bound (the jobs the core holds, and
        more), the rows of jobs it no longer holds are forgotten."""
        self._submitted.update((row.id, row) for row in rows)
        held = len(self.scheduler.state.refs) if self.scheduler is not None else 0
        if len(self._submitted) > 2 * held + SUBMITTED_ROWS_SLACK:
            self._forget_submitted()

    def _forget_submitted(self) -> None:
        """Forget the rows kept of jobs the core no longer holds."""
        refs = self.scheduler.state.refs if self.scheduler is not None else {}
        self._submitted = {job_id: row for job_id, row in self._submitted.items() if job_id in refs}

    def _job_of(self, decision: Decision) -> Job | None:
        """The job a decision is about, as the core now holds it; None for a refusal."""
        assert self.scheduler is not None
        return None if isinstance(decision, Rejected) else self.scheduler.job(decision.job)

    def _record(self, decision: Decision, input_id: int | None, gathered: _Step, rows: DecisionRows) -> None:
        """Write one committed decision: its event, naming the input that caused it, and the
        rows its type makes (``records.ROWS_OF``: an attempt placed or stopped, a preemption, an
        alert)."""
        job = self._job_of(decision)
        job_id = job.ref if job is not None else gathered.rejected_ids.get(decision.job)
        epoch = self.lock.epoch if self._fencing else None
        rows.events.append(event_row(decision, job_id, self.wall_clock, epoch, input_id))
        if job is None or job_id is None:
            return
        gathered.touched.add(job_id)
        add_rows(decision, job, job_id, rows)

    # -- backend actions -----------------------------------------------------------------

    def _act(self, now: float) -> bool:
        """Step 5: mark done the starts and stops the poller has carried out, and ask it for the
        ones the log holds and it does not have yet. When nobody started its threads (tests
        stepping a manual clock), it carries them out here and they are marked done at once.
        True when any was marked done."""
        outcomes = self.poller.take_outcomes()
        if outcomes:
            self._mark_done(outcomes)
        self._dispatch()
        if not self.poller.background:
            self.poller.act_due(now)
            inline = self.poller.take_outcomes()
            if inline:
                self._mark_done(inline)
            outcomes += inline
        return bool(outcomes)

    def _dispatch(self) -> None:
        """Ask the poller for every backend action recorded and not yet done, in the order they
        were placed, except the ones it has already (waiting, in flight, or done and not taken).
        They are read from the open attempts the leader keeps (``OpenAttempts``): an
        attempt with an action pending is open (its reports wait until the action is done), and
        the leader is the only writer of both."""
        requested = self.poller.requested()
        pending = self._open_attempts().with_action_in_order()
        new = [
            a for a in pending if ((a.job_id, a.number), ActionKind(a.action)) not in requested.get(a.backend, set())
        ]
        if not new:
            return
        rows = self._submitted_rows({a.job_id for a in new})
        actions: dict[str, list[BackendAction]] = {}
        unconfigured: list[ActionOutcome] = []
        for attempt in new:
            row = rows[attempt.job_id]
            assert row is not None
            kind = ActionKind(attempt.action)
            if attempt.backend not in self.backends:
                error = f"no backend {attempt.backend!r} is configured in this scheduler"
                unconfigured.append(ActionOutcome(kind, (attempt.job_id, attempt.number), row.name, error=error))
                continue
            action = BackendAction(kind, self._spec(row, attempt), attempt.stop_grace)
            actions.setdefault(attempt.backend, []).append(action)
        if unconfigured:
            self._mark_done(unconfigured, retry_stops=False)
        self.poller.request(actions)

    def _mark_done(self, outcomes: list[ActionOutcome], retry_stops: bool = True) -> None:
        """Write what came of starts and stops, in one fenced transaction (``actions.write_outcomes``:
        compare-and-sets, a refused stop asked again when ``retry_stops``), then follow them in the
        attempts this leader keeps. Errors are logged once committed."""
        done = [outcome for outcome in outcomes if outcome.error is None]
        with self._session() as session, session.begin():
            self._fence(session)
            written, failed = write_outcomes(session, outcomes, retry_stops)
        for outcome in done:  # committed
            kept = self.open_attempts.get(outcome.key) if self.open_attempts.loaded else None
            if kept is not None and outcome.started is not None:
                kept.external_name, kept.external_arn = outcome.started.name, outcome.started.arn
        for outcome, values in written:
            self.open_attempts.marked_done(outcome, values)
        for outcome in failed:
            again = "; the stop is asked again" if outcome.kind is ActionKind.STOP and retry_stops else ""
            log.error("attempt %s of job %s: %s%s", outcome.key[1], outcome.job_name, outcome.error, again)

    def _spec(self, row: JobRow, attempt: Attempt) -> AttemptSpec:
        """What a backend is given for the attempt (``actions.attempt_spec``), under the
        configuration the scheduler runs."""
        return attempt_spec(row, attempt, self.scheduler.state if self.scheduler is not None else None)

    def _starting_since_upgrade(self) -> None:
        """Starts an older version left PLACED are STARTING (``actions.mark_starting_since_upgrade``)."""
        with self._session() as session, session.begin():
            self._fence(session)
            mark_starting_since_upgrade(session)


def _rows_by_id(session: Session, ids: set[int]) -> dict[int, JobRow | None]:
    """The job rows with these ids, in one query."""
    found: dict[int, JobRow | None] = dict.fromkeys(ids)
    if ids:
        for row in session.scalars(select(JobRow).where(JobRow.id.in_(sorted(ids)))):
            found[row.id] = row
    return found
