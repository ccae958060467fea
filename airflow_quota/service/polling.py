"""Calling the backends off the leader's step, each on its own interval and within one budget.

The leader's step (``service/scheduler.py``) runs every 0.2 s; asking SageMaker about every open
attempt in every step would be about five DescribeTrainingJob calls per running job per second,
in series, and AWS throttles long before a real platform's size. So the step only *tells* the
:class:`Poller` which attempts to follow (:meth:`Poller.track` the whole set, after a leader
loads its open attempts; :meth:`Poller.follow` and :meth:`Poller.unfollow` what changed, at
every other step) and *reads* the latest reports of the attempts whose report changed
(:meth:`Poller.take_news`, :meth:`Poller.reports_of`); each takes a lock for a few dictionary
operations, never a backend call, and none walks every open attempt. The poller asks each
backend about each of its open attempts once per that backend's ``poll_interval_seconds``
(SageMaker 30 s, as the amazon provider's ``check_interval``; local 1 s; the fake backend on
every step unless told otherwise), so a change is noticed within one
interval (plus one call's latency) -- unless the backend can list its changes.

Change detection by listing (an optional capability, :class:`~airflow_quota.service.backends.base.ListsChanges`;
SageMaker's ListTrainingJobs with LastModifiedTimeAfter, 100 jobs a page): describing 1,000 jobs
every 30 s takes 33.3 calls a second, nearly the whole budget, so polls fall behind their due
times. A listing backend is instead *listed* every ``list_interval_seconds`` (SageMaker 5 s) for
the jobs modified since the previous listing began, less ``LIST_OVERLAP_SECONDS`` (60 s: clock
skew, eventual consistency), a page a call; an attempt listed is described (for its full
outcome: reason, start and end times) when its change is one its known status does not account
for -- a RUNNING job listed as RUNNING is not, a job listed as ended always is, and the same
change listed again in the overlap is described once. Each attempt is still described at least
once per ``SAFETY_INTERVALS`` x interval (SageMaker 300 s), in case a listing missed it, and
while listings fail every attempt is described once per interval again, as without listing (one
log line when it starts failing, one when it lists again). A new leader needs no burst of
describes: the step tells the poller what its log knows of each attempt (:class:`Known`: RUNNING
or PENDING, since it was placed), the first listing covers the oldest of those moments, and only
the attempts that changed while no leader ran are described, within one list period.

How the calls are spread and capped:

- attempts first seen together (a leader taking over 1,000 running jobs, a cycle placing a
  batch) get their first polls spread evenly over one interval, so the calls per second stay
  near ``attempts / interval`` instead of coming in bursts;
- each backend has its own pool of at most ``workers`` threads: its polls run concurrently up
  to that cap, and a slow or throttled backend never delays another's polls;
- a backend with a rate (``poll_calls_per_second``: SageMaker 35) never gets more calls than a
  token bucket of that rate allows, with a burst of an eighth of it (at least one start's
  calls): at most 1.125 x the rate in any one second (SageMaker: 39.4 calls), whatever the step
  and the threads do. The bucket counts *every* call the scheduler makes to that backend: listing
  pages, polls, and the starts and stops below (a SageMaker start is two calls, ``calls_per_start``); what it
  holds back stays due and goes first when tokens come back;
- a call refused for throttling (:class:`~airflow_quota.service.backends.base.BackendThrottled`)
  pauses every call to that backend: 1 s, doubling up to 60 s while the throttling lasts, reset
  by the first call that succeeds after a pause; each pause and the recovery are one log line.
  The polls, starts and stops it held back are made after the pause.

Starts and stops go the same way (step 5 of the leader's step): the step *asks* for them
(:meth:`Poller.request`, a :class:`BackendAction` each) and, at a later step, *reads* what came of
them (:meth:`Poller.take_outcomes`, an :class:`ActionOutcome` each) and marks them done in a
fenced transaction. The same threads carry them out, before the polls due in the same round
(placing or freeing capacity matters more than noticing a change a little sooner). One attempt
has at most one action in flight: a stop asked for while its start is in flight waits for the
start to return, and replaces a start not yet begun. A job's new attempt starts only once the
stops of its earlier attempts have returned: a victim placed again in the cycle that preempted
it (step 4b) is stopped before it starts again. Just before each call the worker asks
``still_wanted`` (the service: this process still leads under its epoch and the attempt still has
that action), so a deposed leader does not act on what it was asked before the takeover.

That check and the call are not one atomic step: a leader frozen between them (SIGSTOP, a long
GC pause, a stalled VM) makes the call after another leader took over. What that can do:

- a late *stop* does nothing the log does not already hold: a stop is asked for only once it is
  committed, no leader takes a committed stop back, and a job placed again runs a new attempt
  under a new key, which the late stop does not touch;
- a late *start* of an attempt the next leader stopped before anything ran (cancelled, preempted:
  its stop found nothing to stop) or gave up (its own start failed) would run a training nobody
  follows, holding capacity outside the books. Two guards close it. The backends keep a
  tombstone for an attempt stopped before it started, and a start of a key they have does
  nothing (fake, local; ``backends/base.py``). And after each start returns, the worker asks
  ``undo_of_start`` (the service: has this process lost the lease, and does the log no longer
  want the attempt running: stopped, ended, or gone?); if so it stops the attempt again with
  the log's grace and reports nothing. A start the log still wants is kept: the next leader
  asks for it under the same key (a no-op) and follows it. SageMaker has no tombstone (a name
  is taken only by creating the job), so there the check after the call is the guard; a leader
  killed between its late call and that check leaves a training that ends at its own
  ``MaxRuntimeInSeconds``.

One code path, two drivers: :meth:`Poller.act_due` carries out the actions asked for and
:meth:`Poller.poll_due` makes the listing page due (if any) and asks about every attempt that is
due, each waiting for the answers. Tests
(and ``QuotaService.step`` when nobody started the poller) call them inline with a manual clock,
so a start is done in its own step and a finish noticed in the very next one;
``QuotaService.run`` calls :meth:`Poller.start`, which runs the same two in one background thread
per backend without waiting for the answers (each call wakes it when it returns, and it never
has more calls in flight than the threads), sleeping until its next call falls due or new work
is asked for.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from dataclasses import dataclass
from enum import Enum
from typing import Any

from airflow_quota.service.backends.base import (
    AttemptReport,
    AttemptSpec,
    AttemptStatus,
    Backend,
    BackendError,
    BackendThrottled,
    ChangePage,
    ListsChanges,
    StartedAttempt,
)

log = logging.getLogger("airflow_quota.scheduler")

AttemptKey = tuple[int, int]
"""An attempt's job id and attempt number."""

DEFAULT_POLL_WORKERS = 8
"""Polls of one backend in flight at once, by default (``--poll-workers``)."""
THROTTLE_FIRST_SECONDS = 1.0
THROTTLE_MAX_SECONDS = 60.0
"""A backend that throttles its polls pauses them 1 s, doubling up to 60 s while it lasts."""
IDLE_WAKE_SECONDS = 1.0
"""A background poller with nothing tracked looks again this often (and when woken)."""
BURST_SECONDS = 0.125
"""A rate-capped backend may spend at once the tokens of this many seconds (at least one)."""
MIN_ROUND_SECONDS = 0.05
"""A background poller of a backend polled on every step (interval 0) starts a round at most
this often, so it does not spin."""

SAFETY_INTERVALS = 10.0
"""A backend that lists its changes still describes each attempt at least once per this many
``poll_interval_seconds`` (SageMaker: 300 s), in case a listing missed one."""
LIST_OVERLAP_SECONDS = 60.0
"""Each listing asks for the changes since the previous one began minus this much, for clock skew
between this host and the provider and for a listing's eventual consistency."""


@dataclass(frozen=True, slots=True)
class Known:
    """What the leader's log holds of an attempt when the poller begins to follow it (a new
    leader taking over, an attempt just started): a backend that lists its changes describes it
    only when a listing shows a change after ``since`` that this status does not account for.

    :param status: PENDING or RUNNING, as the log has it.
    :param since: a moment before any change of the attempt the log has not taken in (when it was
        placed): the first listing covers the changes from then on.
    """

    status: AttemptStatus
    since: float


@dataclass(slots=True)
class _ListPass:
    """A listing of changes in progress: from ``since``, begun at ``began``, at page ``page``;
    ``uncovered`` is the earliest ``Known.since`` it took over (given back if it fails)."""

    since: float
    began: float
    uncovered: float | None
    page: object | None = None


class ActionKind(str, Enum):
    """What the scheduler asks a backend to do to an attempt (``quota_attempts.action``)."""

    START = "START"
    STOP = "STOP"


@dataclass(frozen=True, slots=True)
class BackendAction:
    """A start or stop the step asks for: carried out in the backend's worker threads.

    :param kind: start or stop.
    :param spec: the attempt, as the backend needs it.
    :param grace_seconds: a stop's time to checkpoint before the attempt is killed.
    """

    kind: ActionKind
    spec: AttemptSpec
    grace_seconds: float = 0.0

    @property
    def key(self) -> AttemptKey:
        return (self.spec.job_id, self.spec.attempt)


@dataclass(frozen=True, slots=True)
class ActionOutcome:
    """What came of a :class:`BackendAction`, for the step to mark done.

    :param started: where a start runs, when the backend names it (a SageMaker training job).
    :param error: why the backend refused (a start that failed; a stop that failed and was given up).
    """

    kind: ActionKind
    key: AttemptKey
    job_name: str
    started: StartedAttempt | None = None
    error: str | None = None


class BackendPoller:
    """Calls one backend off the step: starts and stops the attempts asked for, and polls its
    open attempts, each once per ``interval`` seconds; at most ``workers`` calls at once, within
    one rate, pausing with exponential back-off when the backend throttles.

    :param backend: the backend called (``start``, ``stop``, ``poll``).
    :param clock: the service's clock (epoch seconds, or a test's manual clock).
    :param interval: seconds between two polls of one attempt; 0 polls at every ``poll_due``.
    :param workers: the cap on this backend's calls in flight at once (its thread pool's size).
    :param rate: the most calls a second, polls, starts and stops together (a token bucket with
        a burst of ``BURST_SECONDS`` of them, at least one start's or stop's); None: no cap.
    """

    def __init__(
        self, backend: Backend, clock: Callable[[], float], interval: float, workers: int, rate: float | None = None
    ) -> None:
        if rate is not None and rate <= 0:
            raise ValueError(f"{backend.name}: poll_calls_per_second must be > 0, not {rate}")
        if interval < 0:
            raise ValueError(f"{backend.name}: poll_interval_seconds must be ≥ 0, not {interval}")
        if workers < 1:
            raise ValueError(f"poll_workers must be ≥ 1, not {workers}")
        self.backend = backend
        self.clock = clock
        self.interval = interval
        self.workers = workers
        self._lock = threading.Lock()
        self._specs: dict[AttemptKey, AttemptSpec] = {}
        self._due: dict[AttemptKey, float] = {}
        self._reports: dict[AttemptKey, AttemptReport] = {}
        self._changed: set[AttemptKey] = set()
        """The followed attempts whose report changed since the step last took them (``take_news``)."""
        self._paused_until = float("-inf")
        self._backoff = 0.0
        """The current throttling pause (0: not throttled)."""
        self.rate = rate
        self._burst = 0.0 if rate is None else max(1.0, rate * BURST_SECONDS)
        self._tokens = self._burst
        self._tokens_at: float | None = None
        """When the bucket was last refilled (None: full, never used)."""
        self.calls_per_start = int(getattr(backend, "calls_per_start", 1))
        self.calls_per_stop = int(getattr(backend, "calls_per_stop", 1))
        """What a start and a stop cost in the bucket: the backend's API calls for each."""
        if rate is not None:
            self._burst = max(self._burst, float(self.calls_per_start), float(self.calls_per_stop))
            self._tokens = self._burst
        self._waiting: dict[AttemptKey, BackendAction] = {}
        """Actions asked for and not begun, in the order asked."""
        self._acting: dict[AttemptKey, ActionKind] = {}
        """Actions in flight, by attempt."""
        self._polling: set[AttemptKey] = set()
        """Polls in flight."""
        self._outcomes: list[ActionOutcome] = []
        """Outcomes the step has not taken yet."""
        self.still_wanted: Callable[[BackendAction], bool] | None = None
        """Asked just before each action's call (the service's fenced check); None: always."""
        self.undo_of_start: Callable[[BackendAction], BackendAction | None] | None = None
        """Asked just after each start returns: the stop that undoes it when its leader lost the
        lease meanwhile and the log no longer wants the attempt running; None: keep it."""
        self.on_news: Callable[[], None] | None = None
        """Called (from a worker thread) when there is news for the step: an attempt's report
        changed, or a start or stop came back. The service wakes its idle wait with it."""
        self.lister: ListsChanges | None = backend if isinstance(backend, ListsChanges) else None
        """The backend, when it can list its changes (``ListsChanges``): each attempt is then
        described when a listing shows it changed, and otherwise once per ``safety_interval``."""
        self.list_interval = float(self.lister.list_interval_seconds) if self.lister is not None else 0.0
        self.safety_interval = interval * SAFETY_INTERVALS if self.lister is not None else interval
        self._known: dict[AttemptKey, AttemptStatus] = {}
        """What the log or the last description says of each attempt (listing backends)."""
        self._described: dict[AttemptKey, float] = {}
        """The modification time of the last listed change that had an attempt described."""
        self._uncovered: float | None = None
        """The earliest ``Known.since`` of the attempts no complete listing has covered yet."""
        self._listed_to: float | None = None
        """When the last complete listing began: changes before it (less the overlap) are seen."""
        self._pass: _ListPass | None = None
        self._listing = False
        """A listing page in flight."""
        self._list_due = float("-inf")
        self._list_failing = False
        """The last listing failed: every attempt is described once per ``interval`` meanwhile."""
        self._pool: ThreadPoolExecutor | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def name(self) -> str:
        return self.backend.name

    # -- what the step calls (a lock and a dictionary copy each, never a backend call) -------

    def track(
        self,
        open_attempts: Mapping[AttemptKey, AttemptSpec | None],
        now: float,
        known: Mapping[AttemptKey, Known] | None = None,
    ) -> None:
        """The attempts of this backend open now (None for the spec of one already tracked: the
        step need not load what the poller has): new ones get their first poll spread evenly
        over one interval from ``now``; the ones no longer open are forgotten with their report.

        With a backend that lists its changes, a new attempt with a ``known`` state is described
        only when a listing shows it changed (the first listing covers it from ``Known.since``)
        or, at the latest, on the safety net's spread (``safety_interval``): a new leader taking
        over 1,000 running jobs lists what changed while no leader ran instead of describing them
        all. One without (a start refused, an attempt never started) is spread over one interval."""
        with self._lock:
            self._drop([key for key in self._specs if key not in open_attempts])
            new = self._add(open_attempts, now, known or {})
        if new:
            self._wake.set()

    def follow(
        self, attempts: Mapping[AttemptKey, AttemptSpec], now: float, known: Mapping[AttemptKey, Known] | None = None
    ) -> None:
        """Follow these attempts too, as :meth:`track` follows new ones (the ones followed
        already are left as they are): the step tells only what changed, not every open attempt."""
        with self._lock:
            new = self._add(attempts, now, known or {})
        if new:
            self._wake.set()

    def unfollow(self, keys: Iterable[AttemptKey]) -> None:
        """Stop following these attempts (ended, or with a start or stop in hand), with their
        report; keys not followed are ignored."""
        with self._lock:
            self._drop([key for key in keys if key in self._specs])

    def _drop(self, keys: list[AttemptKey]) -> None:
        """Forget these followed attempts. Lock held."""
        for key in keys:
            del self._specs[key], self._due[key]
            self._reports.pop(key, None)
            self._changed.discard(key)
            self._known.pop(key, None)
            self._described.pop(key, None)
        if not self._specs:  # nothing followed: the next listing starts afresh
            self._uncovered = self._listed_to = self._pass = None

    def _add(
        self, open_attempts: Mapping[AttemptKey, AttemptSpec | None], now: float, known: Mapping[AttemptKey, Known]
    ) -> list[AttemptKey]:
        """Begin to follow the attempts of ``open_attempts`` not followed yet (see :meth:`track`);
        the ones added. Lock held."""
        new = sorted(key for key, spec in open_attempts.items() if key not in self._specs and spec is not None)
        seeded = [key for key in new if self.lister is not None and key in known]
        unseeded = [key for key in new if key not in seeded]
        for index, key in enumerate(seeded):
            self._due[key] = now + self.safety_interval * index / len(seeded)
            self._known[key] = known[key].status
            self._uncover(known[key].since)
        for index, key in enumerate(unseeded):
            self._due[key] = now + self.interval * index / len(unseeded)
            self._uncover(now)  # changes after its first description are the listing's
        for key in new:
            spec = open_attempts[key]
            assert spec is not None
            self._specs[key] = spec
        return new

    def _uncover(self, since: float) -> None:
        """Changes from ``since`` on are still to be listed. Lock held."""
        if self.lister is not None:
            self._uncovered = since if self._uncovered is None else min(self._uncovered, since)

    def tracking(self) -> set[AttemptKey]:
        """The attempts tracked now."""
        with self._lock:
            return set(self._specs)

    def reports(self) -> dict[AttemptKey, AttemptReport]:
        """The latest report of every tracked attempt polled at least once."""
        with self._lock:
            return dict(self._reports)

    def reports_of(self, keys: Iterable[AttemptKey]) -> dict[AttemptKey, AttemptReport]:
        """The latest report of each of these attempts that is followed and was polled."""
        with self._lock:
            return {key: report for key in keys if (report := self._reports.get(key)) is not None}

    def take_news(self) -> set[AttemptKey]:
        """The followed attempts whose report changed since the last call."""
        with self._lock:
            news, self._changed = self._changed, set()
            return news

    def request(self, actions: Iterable[BackendAction]) -> None:
        """Ask for these starts and stops. One already waiting, in flight, or done and not yet
        taken is not asked for twice; a stop replaces a start of the same attempt not begun."""
        added = False
        with self._lock:
            done = {(outcome.key, outcome.kind) for outcome in self._outcomes}
            for action in actions:
                key = action.key
                if self._acting.get(key) is action.kind or (key, action.kind) in done:
                    continue
                waiting = self._waiting.get(key)
                if waiting is None or (waiting.kind is ActionKind.START and action.kind is ActionKind.STOP):
                    self._waiting[key] = action
                    added = True
        if added:
            self._wake.set()

    def requested(self) -> set[tuple[AttemptKey, ActionKind]]:
        """The actions waiting, in flight, or done and not yet taken, by attempt and kind."""
        with self._lock:
            return (
                {(key, action.kind) for key, action in self._waiting.items()}
                | set(self._acting.items())
                | {(outcome.key, outcome.kind) for outcome in self._outcomes}
            )

    def take_outcomes(self) -> list[ActionOutcome]:
        """What came of the actions done since the last call, in the order they ended."""
        with self._lock:
            taken, self._outcomes = self._outcomes, []
            return taken

    def forget_actions(self) -> None:
        """Drop the actions not begun and the outcomes not taken (a leader stepping down: the
        next leader asks again for what its log still holds)."""
        with self._lock:
            self._waiting.clear()
            self._outcomes.clear()

    # -- starts and stops -------------------------------------------------------------------

    def act_due(self, now: float, wait: bool = True) -> int:
        """Begin the actions waiting (none while throttled; as many as the rate allows, in the
        order asked, at most ``workers`` in flight) and, with ``wait``, wait for them; the
        number begun. The background loop does not wait: each action wakes it when it returns,
        so starts keep flowing at the rate while some are slow to answer."""
        total = 0
        while True:
            chosen, held = self._choose_actions(now)
            if not chosen:
                return total
            self._call([(self._act_one, (action, now)) for action in chosen], wait)
            total += len(chosen)
            if not wait:
                return total
            if not held:
                return total  # else the starts that waited for these stops, in the same call

    def _choose_actions(self, now: float) -> tuple[list[BackendAction], bool]:
        """The waiting actions to begin now, marked in flight, and whether a start was held
        back for a stop. A stop waits for its attempt's start to return; a job's new attempt
        starts only once every stop of its earlier attempts asked for has returned (a victim
        placed again in the cycle that preempted it, step 4b), so the old attempt is stopped
        before the new one starts."""
        held = False
        with self._lock:
            if now < self._paused_until:
                return [], held
            chosen: list[BackendAction] = []
            room = self.workers - len(self._acting)
            stopping = {key[0] for key, kind in self._acting.items() if kind is ActionKind.STOP}
            stopping |= {key[0] for key, action in self._waiting.items() if action.kind is ActionKind.STOP}
            for key, action in list(self._waiting.items()):
                if len(chosen) >= room:
                    break
                if key in self._acting:
                    continue  # a stop waits for its attempt's start to return
                if action.kind is ActionKind.START and key[0] in stopping:
                    held = True
                    continue
                if not self._take_tokens(self._cost(action), now):
                    break
                del self._waiting[key]
                self._acting[key] = action.kind
                chosen.append(action)
            return chosen, held

    def _cost(self, action: BackendAction) -> int:
        return self.calls_per_start if action.kind is ActionKind.START else self.calls_per_stop

    def _act_one(self, action: BackendAction, now: float) -> None:
        spec = action.spec
        outcome: ActionOutcome | None = None
        try:
            if self.still_wanted is not None and not self._wanted(action):
                return
            if action.kind is ActionKind.START:
                outcome = ActionOutcome(action.kind, action.key, spec.job_name, started=self.backend.start(spec))
                if self.undo_of_start is not None and self._undone(action):
                    outcome = None  # made late by a deposed leader: nothing of it is reported
            else:
                self.backend.stop(spec, action.grace_seconds)
                outcome = ActionOutcome(action.kind, action.key, spec.job_name)
        except BackendThrottled as exc:
            with self._lock:  # first again after the pause, unless a stop replaced it meanwhile
                if action.key not in self._waiting:
                    self._waiting = {action.key: action, **self._waiting}
            self._throttled(exc, now)
        except BackendError as exc:
            outcome = ActionOutcome(action.kind, action.key, spec.job_name, error=str(exc))
        except Exception as exc:  # a bug in a backend: the action fails, the worker goes on
            log.exception("%s of attempt %s-%s on %s failed", action.kind.value.lower(), *action.key, self.name)
            outcome = ActionOutcome(action.kind, action.key, spec.job_name, error=f"{type(exc).__name__}: {exc}")
        finally:
            with self._lock:
                self._acting.pop(action.key, None)
                if outcome is not None:
                    self._outcomes.append(outcome)
                recovered = outcome is not None and outcome.error is None and self._backoff > 0
                if recovered:
                    self._backoff = 0.0
            self._wake.set()  # a stop may have waited for this start
        if outcome is not None:
            self._news()
        if recovered:
            log.info("%s answers again after throttling: calls resume", self.name)

    def _undone(self, action: BackendAction) -> bool:
        """The check after a start (the call itself is not fenced: a leader frozen between
        ``still_wanted`` and the call makes it after a takeover). Asks ``undo_of_start`` and,
        when the start came too late, makes the stop it gives, with the log's grace; whether it
        did. A start still wanted by the log is kept: the next leader asks for it again under the
        same key, which does nothing, and follows the attempt. A failure here is logged and left
        to the backend's tombstone (fake, local) or to the training's own time limit."""
        assert self.undo_of_start is not None
        try:
            undo = self.undo_of_start(action)
            if undo is None:
                return False
            self.backend.stop(undo.spec, undo.grace_seconds)
        except Exception as exc:
            log.warning(
                "attempt %s-%s on %s: could not check or undo a start made after the lease may have been lost: %s: %s",
                *action.key,
                self.name,
                type(exc).__name__,
                exc,
            )
            return False
        log.warning(
            "attempt %s-%s on %s: started after this scheduler lost the lease, and the log no longer wants it"
            " running: stopped again (grace %g s)",
            *action.key,
            self.name,
            undo.grace_seconds,
        )
        return True

    def _wanted(self, action: BackendAction) -> bool:
        """The service's check, where an error (the database, a lost lease) means "not now": the
        action is dropped, and the step asks for it again while its log still holds it."""
        assert self.still_wanted is not None
        try:
            return self.still_wanted(action)
        except Exception as exc:
            log.warning(
                "%s of attempt %s-%s on %s not made: %s: %s",
                action.kind.value.lower(),
                *action.key,
                self.name,
                type(exc).__name__,
                exc,
            )
            return False

    # -- polling ------------------------------------------------------------------------------

    def poll_due(self, now: float, wait: bool = True) -> int:
        """Ask the backend about every tracked attempt due by ``now`` (none while throttled, as
        many as the rate allows), concurrently up to the cap, and with ``wait`` wait for the
        answers; the number of polls asked for. The background loop does not wait: it asks for
        no more than the threads free (each poll wakes it when it returns), so the polls keep
        flowing at the rate while some answers are slow."""
        if self.lister is not None:
            self.list_due(now, wait)
        with self._lock:
            if now < self._paused_until:
                return 0
            due = sorted(
                (self._due[key], key) for key in self._specs if self._due[key] <= now and key not in self._polling
            )
            if not wait:
                due = due[: max(0, self.workers - len(self._acting) - len(self._polling) - int(self._listing))]
            due = due[: self._spend_tokens(len(due), now)]
            specs = [self._specs[key] for _, key in due]
            self._polling.update(key for _, key in due)
        if not specs:
            return 0
        self._call([(self._poll_one, (spec, now)) for spec in specs], wait)
        return len(specs)

    # -- listing the changes (backends with ``ListsChanges``) -------------------------------

    def _list_at(self) -> float | None:
        """When the next listing page falls due (None: none to make now). Lock held."""
        if self.lister is None or not self._specs or self._listing:
            return None
        if self._pass is not None:
            return float("-inf")  # the next page of a listing in progress
        return self._list_due

    def list_due(self, now: float, wait: bool = True) -> bool:
        """Make the next listing page if one is due (one at a time, one call of the rate; none
        while throttled), and mark due now every listed attempt whose change its known status
        does not account for; with ``wait``, the page's answer is awaited. Whether a page was
        asked for. Polls due in the same round are asked for after it, so inline (tests, the
        step without threads) a change listed is described in the same round."""
        with self._lock:
            at = self._list_at()
            if at is None or at > now or now < self._paused_until:
                return False
            if not wait and self.workers - len(self._acting) - len(self._polling) < 1:
                return False
            if not self._take_tokens(1, now):
                return False
            if self._pass is None:
                floors = [x for x in (self._listed_to, self._uncovered) if x is not None]
                since = (min(floors) if floors else now) - LIST_OVERLAP_SECONDS
                self._pass = _ListPass(since, now, self._uncovered)
                self._uncovered = None
                self._list_due = now + self.list_interval
            listing = self._pass
            specs = list(self._specs.values())
            self._listing = True
        self._call([(self._list_one, (listing, specs, now))], wait)
        return True

    def _list_one(self, listing: _ListPass, specs: list[AttemptSpec], now: float) -> None:
        assert self.lister is not None
        try:
            page = self.lister.changed_since(specs, listing.since, listing.page)
        except BackendThrottled as exc:
            with self._lock:
                listing.page = None  # the listing starts again after the pause
            self._throttled(exc, now)
        except Exception as exc:  # an API error, or a bug: per-attempt polls stand in until it lists again
            self._list_failed(listing, exc, now)
        else:
            self._listed(listing, page, now)
        finally:
            with self._lock:
                self._listing = False
            self._wake.set()

    def _listed(self, listing: _ListPass, page: ChangePage, now: float) -> None:
        """Take one page in: the listed attempts to describe now, and the listing's end."""
        with self._lock:
            if self._pass is not listing:
                return  # nothing followed any more since the page was asked for
            to_describe = []
            for key, change in page.changed.items():
                if key not in self._specs or change.modified_at <= self._described.get(key, float("-inf")):
                    continue  # not followed, or this change was described already
                if change.status is not None and change.status is self._known.get(key):
                    continue  # a change that does not matter here (a RUNNING job's new secondary status)
                self._described[key] = change.modified_at
                self._due[key] = min(self._due[key], now)
                to_describe.append(key)
            listing.page = page.next_page
            complete = page.next_page is None
            if complete:
                self._pass = None
                self._listed_to = listing.began
            recovered = complete and self._list_failing
            if recovered:
                self._list_failing = False
            unthrottled = self._backoff > 0
            if unthrottled:
                self._backoff = 0.0
        if to_describe:
            log.info(
                "%s lists %d change(s) since %.0f: describing attempt(s) %s",
                self.name,
                len(to_describe),
                listing.since,
                ", ".join(f"{job}-{number}" for job, number in sorted(to_describe)),
            )
        if unthrottled:
            log.info("%s answers again after throttling: its listing resumes", self.name)
        if recovered:
            log.info("%s lists its changes again: each attempt described every %g s", self.name, self.safety_interval)

    def _list_failed(self, listing: _ListPass, exc: Exception, now: float) -> None:
        """A listing failed: it is made again from the same moment at the next list interval, and
        until one completes, every attempt is described once per ``interval`` (the first ones
        spread over one interval from now)."""
        with self._lock:
            if self._pass is listing:
                self._pass = None
                if listing.uncovered is not None:  # the next listing starts as far back
                    self._uncover(listing.uncovered)
            first = not self._list_failing
            self._list_failing = True
            if first:
                keys = sorted(self._specs)
                for index, key in enumerate(keys):
                    self._due[key] = min(self._due[key], now + self.interval * index / len(keys))
        log.warning(
            "%s could not list its changes (%s: %s): %s",
            self.name,
            type(exc).__name__,
            exc,
            f"each attempt described every {self.interval:g} s until it lists again" if first else "still failing",
        )

    def _call(self, calls: list[tuple[Callable[..., None], tuple[Any, ...]]], wait: bool) -> None:
        """Make the backend calls on the poller's threads, with ``wait`` waiting for them all.
        A single call waited for is made on this thread: handing it to a thread and waiting
        costs more than many a call (a replay's step makes one listing call, and one start).
        An error the call did not handle itself (a bug) is logged either way."""
        if wait and len(calls) == 1:
            function, args = calls[0]
            try:
                function(*args)
            except Exception:
                log.exception("%s: a call to the backend failed", self.name)
            return
        begun = [self._executor().submit(function, *args) for function, args in calls]
        for future in begun:
            future.add_done_callback(self._log_error)
        if wait:
            wait_for(begun)

    def _log_error(self, call: Future[None]) -> None:
        if not call.cancelled() and (error := call.exception()) is not None:
            log.error("%s: a call to the backend failed", self.name, exc_info=error)

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix=f"call-{self.name}")
        return self._pool

    def _refill(self, now: float) -> None:
        """Add the tokens earned since the last refill (up to the burst). Lock held; rate set."""
        assert self.rate is not None
        if self._tokens_at is not None:
            self._tokens = min(self._burst, self._tokens + (now - self._tokens_at) * self.rate)
        self._tokens_at = now

    def _spend_tokens(self, wanted: int, now: float) -> int:
        """How many of ``wanted`` one-call polls the rate allows at ``now`` (all without a
        rate); the tokens are spent. Called with the lock held."""
        if self.rate is None:
            return wanted
        self._refill(now)
        allowed = min(wanted, int(self._tokens + 1e-9))  # refills of 0.1 s x rate add up in floats
        self._tokens -= allowed
        return allowed

    def _take_tokens(self, calls: int, now: float) -> bool:
        """Spend the tokens of one action of ``calls`` calls if the rate allows it now (always
        without a rate). Called with the lock held."""
        if self.rate is None:
            return True
        self._refill(now)
        if self._tokens + 1e-9 < calls:
            return False
        self._tokens -= calls
        return True

    def _poll_one(self, spec: AttemptSpec, now: float) -> None:
        try:
            self._ask(spec, now)
        finally:
            with self._lock:
                self._polling.discard((spec.job_id, spec.attempt))
            self._wake.set()

    def _ask(self, spec: AttemptSpec, now: float) -> None:
        key = (spec.job_id, spec.attempt)
        with self._lock:
            if now < self._paused_until or key not in self._specs:
                return  # throttled since the round began (it stays due), or no longer open
        try:
            report = self.backend.poll(spec)
        except BackendThrottled as exc:
            self._throttled(exc, now)
            return
        except BackendError as exc:
            log.warning("could not poll attempt %s-%s on %s: %s", spec.job_id, spec.attempt, self.name, exc)
            report = None
        changed = False
        with self._lock:
            if key in self._specs:
                # its own cadence, whenever this round began; one interval from now after a pause
                cadence = self.interval if self._list_failing else self.safety_interval
                following = self._due[key] + cadence
                self._due[key] = following if following > now else now + cadence
                if report is not None:
                    changed = self._reports.get(key) != report
                    self._reports[key] = report
                    if changed:
                        self._changed.add(key)
                    self._known[key] = report.status
                else:  # the change listed was not described: the next listing asks again
                    self._described.pop(key, None)
            recovered = report is not None and self._backoff > 0
            if recovered:
                self._backoff = 0.0
        if changed:
            self._news()
        if recovered:
            log.info("%s answers again after throttling: polls resume every %g s", self.name, self.interval)

    def _news(self) -> None:
        if self.on_news is not None:
            self.on_news()

    def _throttled(self, exc: BackendThrottled, now: float) -> None:
        """Pause this backend's calls; calls of the same round throttled too do not pause longer.

        Not a tenacity retry (as ``QuotaService._retrying`` is): nothing is called again here.
        The pause is shared state that every worker thread of the backend reads, on the service's
        clock (a test's manual one too), and the throttled call just stays due; a per-call
        retry would sleep in one thread while the others went on calling the throttled API."""
        with self._lock:
            if now < self._paused_until:
                return
            self._backoff = min(max(THROTTLE_FIRST_SECONDS, self._backoff * 2), THROTTLE_MAX_SECONDS)
            self._paused_until = now + self._backoff
            pause = self._backoff
        log.warning(
            "%s throttles calls (%s): its calls pause %g s (doubling up to %g s while throttled)",
            self.name,
            exc,
            pause,
            THROTTLE_MAX_SECONDS,
        )

    def next_due(self) -> float | None:
        """When the next call falls due (after any throttling pause): an action waiting is due
        now, a poll at its time; None with nothing tracked or waiting."""
        with self._lock:
            soonest = min((due for key, due in self._due.items() if key not in self._polling), default=None)
            listing = self._list_at()
            if listing is not None:
                soonest = listing if soonest is None else min(soonest, listing)
            needed = 1.0
            if len(self._acting) < self.workers and any(key not in self._acting for key in self._waiting):
                soonest = float("-inf")
                needed = float(min(self._cost(action) for action in self._waiting.values()))
            if soonest is None:
                return None
            if self.rate is not None and self._tokens_at is not None and self._tokens < needed:
                soonest = max(soonest, self._tokens_at + (needed - self._tokens) / self.rate)  # tokens back
            return max(soonest, self._paused_until)

    # -- in the background -----------------------------------------------------------------

    def start(self) -> None:
        """Run :meth:`poll_due` in a background thread until :meth:`stop`."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=f"poller-{self.name}", daemon=True)
        self._thread.start()

    @property
    def background(self) -> bool:
        return self._thread is not None

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            try:
                self.act_due(self.clock(), wait=False)
                self.poll_due(self.clock(), wait=False)
            except Exception:  # a bug must not stop calling for good: logged, retried next round
                log.exception("calling %s failed", self.name)
            soonest = self.next_due()
            pause = IDLE_WAKE_SECONDS if soonest is None else soonest - self.clock()
            self._wake.wait(max(pause, MIN_ROUND_SECONDS))

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the background thread (after the round in flight) and the pool, once the
        starts and stops in flight have returned (their outcomes are kept for the step)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


class Poller:
    """The backends' pollers, one per backend (see the module docstring).

    :param backends: by name, as the scheduler holds them; each one's ``poll_interval_seconds``
        (0 when it has none) is its interval, its ``poll_calls_per_second`` (none: no cap) its rate.
    :param clock: the service's clock.
    :param workers: the cap on one backend's polls in flight at once.
    """

    def __init__(
        self, backends: Mapping[str, Backend], clock: Callable[[], float], workers: int = DEFAULT_POLL_WORKERS
    ) -> None:
        self.pollers = {
            name: BackendPoller(
                backend,
                clock,
                float(getattr(backend, "poll_interval_seconds", 0.0)),
                workers,
                getattr(backend, "poll_calls_per_second", None),
            )
            for name, backend in backends.items()
        }

    def track(
        self,
        open_attempts: Mapping[str, Mapping[AttemptKey, AttemptSpec | None]],
        now: float,
        known: Mapping[str, Mapping[AttemptKey, Known]] | None = None,
    ) -> None:
        """The open attempts of every backend (by backend name; None for the spec of an attempt
        already tracked), with what the log knows of the new ones (see
        :meth:`BackendPoller.track`); a backend absent has none."""
        for name, poller in self.pollers.items():
            poller.track(open_attempts.get(name, {}), now, (known or {}).get(name))

    def follow(
        self,
        attempts: Mapping[str, Mapping[AttemptKey, AttemptSpec]],
        now: float,
        known: Mapping[str, Mapping[AttemptKey, Known]] | None = None,
    ) -> None:
        """Follow these attempts too, by backend name (see :meth:`BackendPoller.follow`)."""
        for name, added in attempts.items():
            self.pollers[name].follow(added, now, (known or {}).get(name))

    def unfollow(self, keys: Iterable[AttemptKey]) -> None:
        """Stop following these attempts, whichever backend follows them."""
        keys = list(keys)
        if keys:
            for poller in self.pollers.values():
                poller.unfollow(keys)

    def take_news(self) -> set[AttemptKey]:
        """The attempts whose report changed since the last call, every backend's."""
        return set().union(*(poller.take_news() for poller in self.pollers.values()))

    def reports_of(self, keys: Mapping[str, Iterable[AttemptKey]]) -> dict[str, dict[AttemptKey, AttemptReport]]:
        """The latest report of each of these attempts, by backend name (see ``reports``)."""
        return {name: self.pollers[name].reports_of(wanted) for name, wanted in keys.items() if name in self.pollers}

    def tracking(self) -> dict[str, set[AttemptKey]]:
        """The attempts tracked now, by backend name."""
        return {name: poller.tracking() for name, poller in self.pollers.items()}

    def forget(self) -> None:
        """Track nothing and drop the actions not begun (a leader stepping down): no more calls
        until the next ``track`` or ``request``."""
        for poller in self.pollers.values():
            poller.track({}, float("-inf"))
            poller.forget_actions()

    def request(self, actions: Mapping[str, Iterable[BackendAction]]) -> None:
        """Ask for starts and stops, by backend name (see :meth:`BackendPoller.request`)."""
        for name, wanted in actions.items():
            self.pollers[name].request(wanted)

    def requested(self) -> dict[str, set[tuple[AttemptKey, ActionKind]]]:
        """The actions each backend has already (see :meth:`BackendPoller.requested`)."""
        return {name: poller.requested() for name, poller in self.pollers.items()}

    def take_outcomes(self) -> list[ActionOutcome]:
        """What came of the actions done since the last call, every backend's."""
        return [outcome for poller in self.pollers.values() for outcome in poller.take_outcomes()]

    def set_on_news(self, callback: Callable[[], None] | None) -> None:
        """What every backend's poller calls when it has news for the step (see ``on_news``)."""
        for poller in self.pollers.values():
            poller.on_news = callback

    def set_still_wanted(self, check: Callable[[BackendAction], bool] | None) -> None:
        """The check each worker makes just before an action's call (see the module docstring)."""
        for poller in self.pollers.values():
            poller.still_wanted = check

    def set_undo_of_start(self, check: Callable[[BackendAction], BackendAction | None] | None) -> None:
        """The check each worker makes just after a start returns (see the module docstring)."""
        for poller in self.pollers.values():
            poller.undo_of_start = check

    def act_due(self, now: float) -> None:
        """Inline: every backend's actions waiting, carried out and awaited."""
        for poller in self.pollers.values():
            poller.act_due(now)

    def reports(self) -> dict[str, dict[AttemptKey, AttemptReport]]:
        """The latest report of every tracked attempt, by backend name."""
        return {name: poller.reports() for name, poller in self.pollers.items()}

    @property
    def background(self) -> bool:
        """Whether :meth:`start` runs the polls in background threads."""
        return any(poller.background for poller in self.pollers.values())

    def poll_due(self, now: float) -> None:
        """Inline: every backend's due polls (each backend's concurrently), answers awaited."""
        for poller in self.pollers.values():
            poller.poll_due(now)

    def start(self) -> None:
        for poller in self.pollers.values():
            poller.start()

    def stop(self) -> None:
        for poller in self.pollers.values():
            poller.stop()
