"""Polling the backends off the leader's step, each on its own interval and within a budget.

The leader's step (``service/scheduler.py``) runs every 0.2 s; asking SageMaker about every open
attempt in every step would be about five DescribeTrainingJob calls per running job per second,
in series, and AWS throttles long before a real platform's size. So the step only *tells* the
:class:`Poller` which attempts are open (:meth:`Poller.track`) and *reads* the latest reports it
has gathered (:meth:`Poller.reports`); both take a lock for a dictionary copy, never a backend
call. The poller asks each backend about each of its open attempts once per that backend's
``poll_interval_seconds`` (SageMaker 30 s, as the amazon provider's ``check_interval``; local
1 s; the fake backend on every step unless told otherwise), so a change is noticed within one
interval (plus one call's latency).

How the polls are spread and capped:

- attempts first seen together (a leader taking over 1,000 running jobs, a cycle placing a
  batch) get their first polls spread evenly over one interval, so the calls per second stay
  near ``attempts / interval`` instead of coming in bursts;
- each backend has its own pool of at most ``workers`` threads: its polls run concurrently up
  to that cap, and a slow or throttled backend never delays another's polls;
- a backend with a rate (``poll_calls_per_second``: SageMaker 35) never gets more polls than a
  token bucket of that rate allows, with a burst of an eighth of it: at most 1.125 x the rate
  in any one second (SageMaker: 39.4 calls), whatever the step and the threads do; polls it
  holds back stay due and go first when tokens come back;
- a poll refused for throttling (:class:`~airflow_quota.service.backends.base.BackendThrottled`)
  pauses every poll of that backend: 1 s, doubling up to 60 s while the throttling lasts, reset
  by the first poll that succeeds after a pause; each pause and the recovery are one log line.
  The attempts it skipped stay due and are asked about after the pause.

One code path, two drivers: :meth:`Poller.poll_due` asks about every attempt that is due and
waits for the answers. Tests (and ``QuotaService.step`` when nobody started the poller) call it
inline with a manual clock, so a finish is noticed in the very next step; ``QuotaService.run``
calls :meth:`Poller.start`, which runs the same ``poll_due`` in one background thread per
backend, sleeping until its next poll falls due or new attempts are tracked.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_for

from airflow_quota.service.backends.base import AttemptReport, AttemptSpec, Backend, BackendError, BackendThrottled

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


class BackendPoller:
    """Polls one backend's open attempts, each once per ``interval`` seconds, at most
    ``workers`` at once, pausing with exponential back-off when the backend throttles.

    :param backend: the backend asked (``backend.poll``).
    :param clock: the service's clock (epoch seconds, or a test's manual clock).
    :param interval: seconds between two polls of one attempt; 0 polls at every ``poll_due``.
    :param workers: the cap on this backend's polls in flight at once (its thread pool's size).
    :param rate: the most polls a second (a token bucket with a burst of ``BURST_SECONDS`` of
        them); None: no cap.
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
        self._paused_until = float("-inf")
        self._backoff = 0.0
        """The current throttling pause (0: not throttled)."""
        self.rate = rate
        self._burst = 0.0 if rate is None else max(1.0, rate * BURST_SECONDS)
        self._tokens = self._burst
        self._tokens_at: float | None = None
        """When the bucket was last refilled (None: full, never used)."""
        self._pool: ThreadPoolExecutor | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def name(self) -> str:
        return self.backend.name

    # -- what the step calls (a lock and a dictionary copy each, never a backend call) -------

    def track(self, open_attempts: Mapping[AttemptKey, AttemptSpec | None], now: float) -> None:
        """The attempts of this backend open now (None for the spec of one already tracked: the
        step need not load what the poller has): new ones get their first poll spread evenly
        over one interval from ``now``; the ones no longer open are forgotten with their report."""
        with self._lock:
            new = sorted(key for key, spec in open_attempts.items() if key not in self._specs and spec is not None)
            for key in [key for key in self._specs if key not in open_attempts]:
                del self._specs[key], self._due[key]
                self._reports.pop(key, None)
            for index, key in enumerate(new):
                self._due[key] = now + self.interval * index / len(new)
                spec = open_attempts[key]
                assert spec is not None
                self._specs[key] = spec
        if new:
            self._wake.set()

    def tracking(self) -> set[AttemptKey]:
        """The attempts tracked now."""
        with self._lock:
            return set(self._specs)

    def reports(self) -> dict[AttemptKey, AttemptReport]:
        """The latest report of every tracked attempt polled at least once."""
        with self._lock:
            return dict(self._reports)

    # -- polling ------------------------------------------------------------------------------

    def poll_due(self, now: float) -> int:
        """Ask the backend about every tracked attempt due by ``now`` (none while throttled),
        concurrently up to the cap, and wait for the answers; the number of polls asked for."""
        with self._lock:
            if now < self._paused_until:
                return 0
            due = sorted((self._due[key], key) for key in self._specs if self._due[key] <= now)
            due = due[: self._spend_tokens(len(due), now)]
            specs = [self._specs[key] for _, key in due]
        if not specs:
            return 0
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix=f"poll-{self.name}")
        wait_for([self._pool.submit(self._poll_one, spec, now) for spec in specs])
        return len(specs)

    def _spend_tokens(self, wanted: int, now: float) -> int:
        """How many of ``wanted`` polls the rate allows at ``now`` (all without a rate); the
        tokens are spent. Called with the lock held."""
        if self.rate is None:
            return wanted
        if self._tokens_at is not None:
            self._tokens = min(self._burst, self._tokens + (now - self._tokens_at) * self.rate)
        self._tokens_at = now
        allowed = min(wanted, int(self._tokens + 1e-9))  # refills of 0.1 s x rate add up in floats
        self._tokens -= allowed
        return allowed

    def _poll_one(self, spec: AttemptSpec, now: float) -> None:
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
        with self._lock:
            if key in self._specs:
                # its own cadence, whenever this round began; one interval from now after a pause
                following = self._due[key] + self.interval
                self._due[key] = following if following > now else now + self.interval
                if report is not None:
                    self._reports[key] = report
            recovered = report is not None and self._backoff > 0
            if recovered:
                self._backoff = 0.0
        if recovered:
            log.info("%s answers polls again after throttling: polls resume every %g s", self.name, self.interval)

    def _throttled(self, exc: BackendThrottled, now: float) -> None:
        """Pause this backend's polls; polls of the same round throttled too do not pause longer.

        Not a tenacity retry (as ``QuotaService._retrying`` is): nothing is called again here.
        The pause is shared state that every worker thread of the backend reads, on the service's
        clock (a test's manual one too), and the throttled attempt just stays due; a per-call
        retry would sleep in one thread while the others went on calling the throttled API."""
        with self._lock:
            if now < self._paused_until:
                return
            self._backoff = min(max(THROTTLE_FIRST_SECONDS, self._backoff * 2), THROTTLE_MAX_SECONDS)
            self._paused_until = now + self._backoff
            pause = self._backoff
        log.warning(
            "%s throttles polls (%s): its polls pause %g s (doubling up to %g s while throttled)",
            self.name,
            exc,
            pause,
            THROTTLE_MAX_SECONDS,
        )

    def next_due(self) -> float | None:
        """When the next poll falls due (after any throttling pause); None with nothing tracked."""
        with self._lock:
            soonest = min(self._due.values(), default=None)
            if soonest is None:
                return None
            if self.rate is not None and self._tokens_at is not None and self._tokens < 1:
                soonest = max(soonest, self._tokens_at + (1 - self._tokens) / self.rate)  # a token back
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
                self.poll_due(self.clock())
            except Exception:  # a bug must not stop polling for good: logged, retried next round
                log.exception("polling %s failed", self.name)
            soonest = self.next_due()
            pause = IDLE_WAKE_SECONDS if soonest is None else soonest - self.clock()
            self._wake.wait(max(pause, MIN_ROUND_SECONDS))

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the background thread (after the round in flight) and the pool."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
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

    def track(self, open_attempts: Mapping[str, Mapping[AttemptKey, AttemptSpec | None]], now: float) -> None:
        """The open attempts of every backend (by backend name; None for the spec of an attempt
        already tracked); a backend absent has none."""
        for name, poller in self.pollers.items():
            poller.track(open_attempts.get(name, {}), now)

    def tracking(self) -> dict[str, set[AttemptKey]]:
        """The attempts tracked now, by backend name."""
        return {name: poller.tracking() for name, poller in self.pollers.items()}

    def forget(self) -> None:
        """Track nothing (a leader stepping down): no more polls until the next ``track``."""
        for poller in self.pollers.values():
            poller.track({}, float("-inf"))

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
