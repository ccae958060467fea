"""A scenario replayed through the real quota service, and its decisions set beside the
simulator's.

The scenario is a scenario file (``tests/service/test_equivalence.py``) or a cluster trace
mapped onto a quota (``benchmarks/service_trace.py``, ``benchmarks/trace_chaos.py``). It goes
through what production runs: the store's client calls (submit, set priority, cancel, apply a
configuration), the leader's ``QuotaService.step`` on a real database, the fake backend, a
manual clock moved from one instant where something happens to the next, as the simulator's
clock is (``sim/simulator.py``): the next submission, the next change of an attempt, the core's
next timer. One step runs at each such instant, as the simulator runs one cycle.

``simulated_decisions`` and ``comparable`` give the two sides in the same form; ``first_difference``
says where they part.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from sqlalchemy import Engine

from airflow_quota.core.config import QuotaConfig
from airflow_quota.core.explain import event_record
from airflow_quota.exceptions import Refused
from airflow_quota.service.backends.base import AttemptSpec, AttemptStatus, ChangePage, ListedChange
from airflow_quota.service.backends.fake import FakeBackend, _timeline
from airflow_quota.service.clock import ManualClock
from airflow_quota.service.scheduler import QuotaService
from airflow_quota.sim.scenario import LoadedScenario, apply_pool_update, apply_share_update
from airflow_quota.sim.simulator import Simulator
from airflow_quota.store.repository import QuotaStore

COMPARED = ("PLACED", "PREEMPTED", "REQUEUED", "SUCCEEDED", "FAILED", "PRIORITY_CHANGED", "ALERT")
"""The decisions compared: placements, preemptions, requeues, ends (failures too), priority
changes, alerts (a submission's acceptance is the store's, not a decision to compare)."""
KEYS = ("t", "type", "job", "share", "instance_type", "count", "borrowed", "training_plan", "kind", "by", "reason")
"""The fields of a decision compared."""


def comparable(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The compared decisions of a decision log (the simulator's report's ``events``, or the
    service's ``quota_events`` records with ``t`` from the scenario's start), in order, each
    with only the compared fields and ``t`` rounded to the microsecond."""
    out = []
    for event in events:
        if event["type"] not in COMPARED:
            continue
        item = {k: event[k] for k in KEYS if k in event}
        item["t"] = round(float(item["t"]), 6)
        out.append(item)
    return out


def simulated_decisions(loaded: LoadedScenario) -> list[dict[str, Any]]:
    """What ``airflow-quota simulate`` decides on the scenario, as ``comparable`` gives it (the
    decisions of its ``--json`` report's ``events``, without building the rest of the report)."""
    result = Simulator(loaded).run()
    return comparable([event_record(decision) for decision in result.decisions])


def first_difference(expected: list[dict[str, Any]], served: list[dict[str, Any]]) -> str:
    """Where the service's decisions first leave the simulator's, with what led there."""
    index = first_difference_at(expected, served)
    before = "\n".join(f"  {e}" for e in expected[max(0, index - 3) : index])
    simulated = expected[index] if index < len(expected) else "(nothing: the simulator ends here)"
    service = served[index] if index < len(served) else "(nothing: the service ends here)"
    return (
        f"first difference at decision {index} of {len(expected)} (simulator) / {len(served)} (service)\n"
        f"after:\n{before}\nsimulator: {simulated}\nservice:   {service}"
    )


def first_difference_at(expected: list[dict[str, Any]], served: list[dict[str, Any]], start: int = 0) -> int:
    """The index of the first decision (from ``start``) where the two lists differ; the shorter
    one's length when one is the other's beginning."""
    for index in range(start, min(len(expected), len(served))):
        if expected[index] != served[index]:
            return index
    return min(len(expected), len(served))


class ReplayBackend(FakeBackend):
    """The fake backend, in memory, telling its next change without a scan of every attempt it
    ever ran: the moments its attempts change (start running, end, stop) are kept in a heap, and
    one made moot (a stop that comes before the end planned) is dropped when it comes up. A
    replay of tens of thousands of jobs asks for the next change at every instant."""

    def __init__(self, clock: Callable[[], float], remaining: Callable[[AttemptSpec], float] | None = None) -> None:
        super().__init__(clock, remaining=remaining)
        self._moments: list[tuple[float, str]] = []

    def start(self, attempt: AttemptSpec) -> None:
        known = attempt.key in self._memory
        super().start(attempt)
        if not known:
            self._plan(attempt.key)

    def stop(self, attempt: AttemptSpec, grace_seconds: float) -> None:
        super().stop(attempt, grace_seconds)
        if attempt.key in self._memory:
            self._plan(attempt.key)

    def _plan(self, key: str) -> None:
        running_since, ends, _, _ = _timeline(self._memory[key])
        heapq.heappush(self._moments, (running_since, key))
        heapq.heappush(self._moments, (ends, key))

    def _is_change(self, moment: float, key: str) -> bool:
        """Whether the attempt still changes at ``moment`` (a stop may have made it moot)."""
        running_since, ends, _, _ = _timeline(self._memory[key])
        return moment in (running_since, ends)

    def _pass_time(self, now: float) -> None:
        """The changes up to ``now`` have happened: out of the heap, into ``_happened``."""
        moments = self._moments
        while moments and moments[0][0] <= now:
            moment, key = heapq.heappop(moments)
            if self._is_change(moment, key):
                self._happened(moment, key)

    def _happened(self, moment: float, key: str) -> None:
        """A change that came to pass (the listing variant keeps them)."""

    def next_change(self, after: float) -> float | None:
        self._pass_time(after)
        moments = self._moments
        while moments and not self._is_change(*moments[0]):
            heapq.heappop(moments)
        return moments[0][0] if moments else None


class ListingReplayBackend(ReplayBackend):
    """The replay's fake backend, listing its changes as SageMaker does (``ListsChanges``): the
    poller lists once a step what changed since the previous listing and asks only about those
    attempts, instead of polling each open attempt at every step (the fake backend's interval
    0). A replay with a thousand attempts open thus makes a call or two a step, not a thousand.
    The safety net's polls (ten intervals) never fall due in a replay's span."""

    list_interval_seconds = 0.0
    SAFETY_POLL_SECONDS = 1e12

    def __init__(self, clock: Callable[[], float], remaining: Callable[[AttemptSpec], float] | None = None) -> None:
        super().__init__(clock, remaining)
        # an instance attribute: FakeBackend's own (0, a poll at every step) would hide a class one
        self.poll_interval_seconds = self.SAFETY_POLL_SECONDS
        self._past: list[tuple[float, str]] = []
        """Every change that has happened, in time order."""

    def _happened(self, moment: float, key: str) -> None:
        self._past.append((moment, key))

    def changed_since(self, attempts: Sequence[AttemptSpec], since: float, page: object | None) -> ChangePage:
        """The attempts among ``attempts`` that changed after ``since`` (one page: all of them),
        with what each shows now; one the backend never heard of (never started, a start
        refused) is listed as changed now, so that the poller asks about it."""
        now = self.clock()
        self._pass_time(now)
        first = bisect.bisect_right(self._past, (since, "\uffff"))
        recent = {key for _, key in self._past[first:]}
        changed: dict[tuple[int, int], ListedChange] = {}
        for spec in attempts:
            state = self._memory.get(spec.key)
            if state is None:
                changed[spec.job_id, spec.attempt] = ListedChange(now)
            elif spec.key in recent:
                running_since, ends, _, _ = _timeline(state)
                if now >= ends:
                    changed[spec.job_id, spec.attempt] = ListedChange(ends)  # its outcome: a full poll
                elif now >= running_since:
                    changed[spec.job_id, spec.attempt] = ListedChange(running_since, AttemptStatus.RUNNING)
        return ChangePage(changed)


def _absolute_plans(document: dict[str, Any], loaded: LoadedScenario) -> dict[str, Any]:
    """Plan instants given as seconds from the scenario's start, as datetimes (the service's
    clock is absolute)."""
    for plan in document.get("pool", {}).get("training_plans", []):
        for key in ("starts_at", "ends_at"):
            if isinstance(plan[key], (int, float)):
                plan[key] = (loaded.start + timedelta(seconds=plan[key])).isoformat()
    return document


def _document(config: QuotaConfig, loaded: LoadedScenario) -> dict[str, Any]:
    return _absolute_plans(config.model_dump(mode="json", exclude_none=True), loaded)


class ServiceReplay:
    """One scenario through one ``QuotaService`` on ``engine`` (migrated, empty): ``advance``
    moves to the next instant where something happens and steps the leader there; ``run`` does
    so to the end. The clock starts at the scenario's start (``origin``, epoch seconds).

    :param poll_workers: the service's cap on backend calls at once; every start of an instant
        must be made in that instant's step (the fake attempt starts at the clock's time), so
        it is at least the most placements one cycle makes.
    :param service_options: more keyword arguments for ``QuotaService``.
    :param listing: the fake backend lists its changes (``ListingReplayBackend``) instead of
        being polled about every open attempt at every step.
    """

    def __init__(
        self,
        loaded: LoadedScenario,
        engine: Engine,
        poll_workers: int = 8,
        service_options: dict[str, Any] | None = None,
        listing: bool = False,
    ) -> None:
        self.loaded = loaded
        self.origin = loaded.start.timestamp()
        self.clock = ManualClock(self.origin)
        self.store = QuotaStore(engine, self.clock.now)
        self.durations: dict[str, float] = {}
        backend = ListingReplayBackend if listing else ReplayBackend
        self.backend = backend(self.clock.now, remaining=self._remaining)
        self.service = QuotaService(
            engine,
            {"fake": self.backend},
            clock=self.clock,
            cycle_seconds=float("inf"),
            refresh_views_seconds=float("inf"),
            poll_workers=poll_workers,
            requests_announced=True,
            **(service_options or {}),
        )
        self.config = loaded.config
        self.ids: dict[str, int] = {}
        """Job name → its id in the store."""
        self.rejected: list[dict[str, Any]] = []
        """The client calls the store refused: when, and why."""
        self.next_event = 0
        """The scenario's events taken so far."""
        self.now = self.origin
        self.steps = 0
        self.store.apply_config(_document(self.config, loaded))
        for instance_type, available in loaded.provider.available.items():
            self.store.set_provider_available(instance_type, available)

    def _remaining(self, spec: AttemptSpec) -> float:
        """The work an attempt has left: the job's duration less the progress the core counts
        (a checkpointed job resumes)."""
        scheduler = self.service.scheduler
        assert scheduler is not None
        return self.durations[spec.job_name] - scheduler.by_ref(spec.job_id).progress

    @property
    def simulated_seconds(self) -> float:
        """How far the replay's clock has gone from the scenario's start."""
        return self.now - self.origin

    def _next_instant(self) -> float | None:
        """The next instant where something happens, as the simulator finds it; None at the end."""
        events = self.loaded.events
        candidates = []
        if self.next_event < len(events):
            candidates.append(self.origin + events[self.next_event].at)
        change = self.backend.next_change(self.now)
        if change is not None:
            candidates.append(change)
        scheduler = self.service.scheduler
        timer = scheduler.next_timer() if scheduler is not None else None
        if timer is not None and (self.next_event < len(events) or (scheduler and scheduler.state.live_names)):
            candidates.append(max(timer, self.now))
        return min(candidates) if candidates else None

    def advance(self) -> bool:
        """Move to the next instant, make the client calls of the scenario's events there, and
        step the leader once; False when nothing is left to happen (the replay has ended)."""
        at = self._next_instant()
        if at is None:
            return False
        self.now = at
        self.clock.advance_to(at)
        events = self.loaded.events
        while self.next_event < len(events) and self.origin + events[self.next_event].at == at:
            self._client_call(events[self.next_event])
            self.next_event += 1
            self.service.request_added()  # as the listener hears it from another process
        self.service.step()
        self.steps += 1
        return True

    def run(self, max_steps: int | None = None) -> bool:
        """Advance to the end; False when ``max_steps`` steps did not get there."""
        while max_steps is None or self.steps < max_steps:
            if not self.advance():
                return True
        return False

    def _client_call(self, event: Any) -> None:
        store = self.store
        try:
            if event.submit is not None:
                sim = event.submit
                self.durations[sim.name] = sim.duration
                training = {"startup": sim.startup_seconds, "failures": [f.model_dump() for f in sim.failures]}
                self.ids[sim.name] = store.submit(sim.request(), "fake", training).id
            elif event.set_priority is not None:
                store.set_priority(self.ids[event.set_priority.job], event.set_priority.priority)
            elif event.cancel is not None:
                store.cancel(self.ids[event.cancel.job])
            elif event.update_share is not None:
                self.config = QuotaConfig.model_validate(apply_share_update(self.config, event.update_share))
                store.apply_config(_document(self.config, self.loaded))
            elif event.update_pool is not None:
                self.config = QuotaConfig.model_validate(apply_pool_update(self.config, event.update_pool))
                store.apply_config(_document(self.config, self.loaded))
            elif event.provider is not None:
                for instance_type, available in event.provider.available.items():
                    store.set_provider_available(instance_type, available)
        except (Refused, KeyError) as exc:
            self.rejected.append({"t": self.simulated_seconds, "error": str(exc)})

    def records(self, after: int = 0) -> tuple[list[dict[str, Any]], int]:
        """The decision log's records after the row of id ``after``, with ``t`` in seconds from
        the scenario's start, and the last row's id (``after`` when there is none)."""
        records = []
        last = after
        for row in self.store.events(after=after):
            record = dict(row.record)
            record["t"] = round(row.at - self.origin, 6)
            records.append(record)
            last = row.id
        return records, last
