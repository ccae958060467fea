"""The AWS walkthrough (``examples/walkthrough.yaml``) played into a quota database through the
real quota service, so the Quotas page has something true to show: running jobs, a queue with
pending reasons, preemptions and an alert.

The service is ``QuotaService`` with the fake backend on a manual clock, as in
``tests/service/test_equivalence.py``; the clock starts ``until`` seconds before the wall clock,
so once played the state is "now" for the api-server (which reads with the wall clock) and the
test can keep stepping the same service on the wall clock (a priority change asked through the
page is applied by ``World.settle``). Each job carries the walkthrough DAG's id and the task id
that submits it there, so the DAG-level permission checks have a DAG to look at.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_quota.core.config import read_yaml
from airflow_quota.service.backends.base import AttemptSpec
from airflow_quota.service.backends.fake import FakeBackend
from airflow_quota.service.clock import ManualClock
from airflow_quota.service.scheduler import QuotaService
from airflow_quota.sim.scenario import Event, load_scenario
from airflow_quota.store.engine import make_engine, migrate
from airflow_quota.store.repository import QuotaStore
from airflow_quota.store.settings import normalize
from tests.conftest import ROOT

SCENARIO = ROOT / "examples" / "walkthrough.yaml"
QUOTA = ROOT / "examples" / "quota.yaml"
DAG_ID = "quota_walkthrough"
RUN_ID = "manual__walkthrough"
MAPPED = {"qs3-job": 2}
"""Jobs submitted by a mapped task instance, with its map index (the page links to it)."""


@dataclass
class World:
    """A quota database with the walkthrough played into it, and the service that played it."""

    store: QuotaStore
    service: QuotaService
    clock: ManualClock
    fake: FakeBackend
    origin: float
    ids: dict[str, int] = field(default_factory=dict)

    def step(self, at: float | None = None) -> None:
        """One pass of the quota scheduler at ``at`` (default: a moment after the last one)."""
        self.clock.advance_to(self.clock.now() + 0.5 if at is None else at)
        self.service.step()

    def settle(self, steps: int = 3) -> None:
        """Take in what clients asked (priority changes, cancels) and let its effects play out:
        a few passes half a second apart, so victims stop and preemptors are placed. Time
        moves only by these half seconds: no training finishes meanwhile, whatever the time
        the test took."""
        for _ in range(steps):
            self.step()

    def job_id(self, name: str) -> int:
        return self.ids[name]


def starving_in_an_hour(document: dict[str, Any]) -> dict[str, Any]:
    """The walkthrough's quota with model v2's 3,600 s starvation threshold on every share
    (the default is 48 h): qs1-med and qs1-high, overtaken by qs1-low's raised priority, starve
    within the walkthrough's two hours, so the page has alerts to show."""
    shares = [{**share, "starvation_after_seconds": 3600} for share in document["shares"]]
    return {**document, "shares": shares}


def play(
    url: str,
    until: float,
    quota: dict[str, Any] | None = None,
    state_dir: Path | None = None,
    events: list[Event] | None = None,
) -> World:
    """Migrate the database at ``url``, apply the walkthrough's quota (or ``quota``), and play the
    walkthrough's events (or ``events``: submissions and priority changes) up to ``until``
    seconds after its start, which is ``until`` seconds before now on the wall clock."""
    engine = make_engine(normalize(url))
    migrate(engine)
    origin = time.time() - until
    clock = ManualClock(origin)
    store = QuotaStore(engine, clock.now)
    scenario = load_scenario(SCENARIO)
    durations: dict[str, float] = {}
    service: QuotaService

    def remaining(spec: AttemptSpec) -> float:
        assert service.scheduler is not None
        return durations[spec.job_name] - service.scheduler.by_ref(spec.job_id).progress

    fake = FakeBackend(clock.now, state_dir=state_dir, remaining=remaining)
    service = QuotaService(
        engine,
        {"fake": fake},
        clock=clock,
        cycle_seconds=float("inf"),
        refresh_views_seconds=0.0,
        forecast_interval=0.0,
        forecast_inline=True,
    )
    service.wall_clock = True  # the manual clock runs on wall time: log instants as ISO, as a real service does
    store.apply_config(quota if quota is not None else starving_in_an_hour(read_yaml(QUOTA)), source=str(QUOTA))
    world = World(store, service, clock, fake, origin)
    events = scenario.events if events is None else events
    index = 0
    now = origin
    service.step()
    while True:
        candidates = []
        if index < len(events):
            candidates.append(origin + events[index].at)
        change = fake.next_change(now)
        if change is not None:
            candidates.append(change)
        timer = service.scheduler.next_timer() if service.scheduler else None
        if timer is not None:
            candidates.append(max(timer, now))
        if not candidates or min(candidates) > origin + until:
            break
        now = min(candidates)
        clock.advance_to(now)
        while index < len(events) and origin + events[index].at == now:
            event = events[index]
            index += 1
            if event.submit is not None:
                durations[event.submit.name] = event.submit.duration
                task_id = event.submit.name.replace("-", "_")
                job = store.submit(
                    event.submit.request(),
                    "fake",
                    {"startup": event.submit.startup_seconds},
                    dag_id=DAG_ID,
                    task_id=task_id,
                    run_id=RUN_ID,
                    map_index=MAPPED.get(event.submit.name),
                )
                world.ids[job.name] = job.id
            elif event.set_priority is not None:
                store.set_priority(world.ids[event.set_priority.job], event.set_priority.priority)
        service.step()
    clock.advance_to(origin + until)
    service.step()
    return world
