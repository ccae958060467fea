"""What the core's property tests share (``test_properties.py``, ``test_properties_v2.py``,
``test_overtaking.py``, ``test_visibility.py``): the random configurations and scenarios
hypothesis draws, the invariants of docs/model.md section 4 checked after every cycle, the
busy and congested workloads of ``benchmarks/``, and switching section 8's reservations on.

A helper module, not a test module: test modules import it, never each other.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from hypothesis import strategies as st

from airflow_quota.core.config import Share
from airflow_quota.core.cycle import QuotaScheduler
from airflow_quota.core.model import Decision, FailureReason, JobState, PendingReason
from airflow_quota.core.quota import holding_cap
from airflow_quota.core.visibility import pending_reason
from airflow_quota.sim.scenario import LoadedScenario, parse_scenario
from airflow_quota.sim.simulator import Simulator
from benchmarks import congested, workload
from tests import builders

TYPES = ["ml.g5.xlarge", "ml.g5.2xlarge", "ml.p4d.24xlarge"]
STRATEGIES = ["RESERVE", "LEND", "LEND_AND_BORROW"]


@st.composite
def configurations(draw: st.DrawFn) -> dict[str, Any]:
    types = draw(st.lists(st.sampled_from(TYPES), min_size=1, max_size=3, unique=True))
    capacity = {t: draw(st.integers(2, 8)) for t in types}
    left = dict(capacity)
    shares = []
    for i in range(draw(st.integers(1, 4))):
        limits = {}
        for t in types:
            if left[t] > 0 and draw(st.booleans()):
                limits[t] = draw(st.integers(1, left[t]))
                left[t] -= limits[t]
        if not limits:
            spare = [t for t in types if left[t] > 0]
            if not spare:
                break
            limits[spare[0]] = 1
            left[spare[0]] -= 1
        strategy = draw(st.sampled_from(STRATEGIES))
        item: dict[str, Any] = {
            "name": f"s{i}",
            "capacity_limits": limits,
            "strategy": strategy,
            "in_share_preemption": draw(st.booleans()),
            "in_share_preemption_after_seconds": draw(st.sampled_from([0, 600, 600, 1000])),
            "preemption_grace_seconds": draw(st.sampled_from([0, 0, 60])),
            "preemption_protection_seconds": draw(st.sampled_from([0, 0, 300])),
            "starvation_after_seconds": draw(st.sampled_from([900, 3600])),
        }
        if strategy == "LEND_AND_BORROW":
            item["borrow_limit"] = draw(st.sampled_from([-1, 0, 100, 200]))
        shares.append(item)
    return {"pool": {"capacity": capacity}, "shares": shares}


@st.composite
def scenarios(draw: st.DrawFn) -> LoadedScenario:
    config = draw(configurations())
    shares = [s["name"] for s in config["shares"]]
    types = list(config["pool"]["capacity"])
    events: list[dict[str, Any]] = []
    names: list[str] = []
    at = 0
    for i in range(draw(st.integers(1, 24))):
        at += draw(st.sampled_from([0, 0, 60, 300, 1800]))
        kind = draw(st.sampled_from(["submit"] * 6 + ["priority", "cancel"]))
        if kind == "submit" or not names:
            prefs = draw(st.lists(st.sampled_from(types), min_size=1, max_size=len(types), unique=True))
            submit: dict[str, Any] = {
                "name": f"j{i}",
                "share": draw(st.sampled_from(shares)),
                "priority": draw(st.integers(0, 5)),
                "preferences": [{"instance_type": t, "count": draw(st.integers(1, 4))} for t in prefs],
                "duration": draw(st.sampled_from([600, 1800, 3600, 7200])),
            }
            if draw(st.booleans()):
                submit["checkpoint_interval"] = 300
            if draw(st.integers(0, 4)) == 0:
                submit["max_pending_seconds"] = 1200
            if draw(st.integers(0, 4)) == 0:
                submit["preemption_retries"] = draw(st.integers(0, 2))
            if draw(st.integers(0, 5)) == 0:
                submit["failures"] = [{"after": 100, "reason": "ExitCode:1"}]
                submit["retry_attempts"] = 2
            events.append({"at": at, "submit": submit})
            names.append(submit["name"])
        elif kind == "priority":
            events.append(
                {"at": at, "set_priority": {"job": draw(st.sampled_from(names)), "priority": draw(st.integers(0, 9))}}
            )
        else:
            events.append({"at": at, "cancel": {"job": draw(st.sampled_from(names))}})
    return builders.scenario(config, *events)


def check_invariants(scheduler: QuotaScheduler, now: float) -> None:
    state = scheduler.state
    for name, ledger in state.types.items():
        assert ledger.borrowed() <= ledger.lendable(), f"{name}: borrowed > lendable at t={now}"
        assert ledger.used + ledger.draining <= ledger.capacity, f"{name}: over capacity at t={now}"
        assert ledger.used == sum(ledger.usage.values())
        for share, usage in ledger.usage.items():
            cap = holding_cap(state.shares[share], ledger.limit_of(share))
            assert cap is None or usage <= cap, f"{share} holds {usage} {name} over its cap {cap}"
    holding: dict[tuple[str, str], int] = {}
    for job in state.jobs.values():
        if job.state is JobState.FAILED:
            assert isinstance(job.failure, FailureReason)
        elif job.state is JobState.SUCCEEDED:
            assert job.placement is None
        elif job.stopping:
            assert job.placement is None, "a victim in its grace period holds no quota"
        elif job.placement is not None:
            key = (job.share, job.placement.entry.instance_type)
            holding[key] = holding.get(key, 0) + job.placement.entry.count
        else:
            assert job.state is JobState.RUNNABLE
            assert isinstance(pending_reason(state, job, now)[0], PendingReason)
    for (share, name), count in holding.items():
        assert state.types[name].usage_of(share) == count, "usage does not match what jobs hold"


def run_checked(loaded: LoadedScenario, literal: bool = False) -> list[Decision]:
    simulator = Simulator(loaded)
    scheduler = simulator.scheduler
    if literal:
        original = scheduler.run_cycle

        def rescanning_cycle(now: float) -> list[Decision]:
            scheduler.rescan_next_cycle()
            return original(now)

        scheduler.run_cycle = rescanning_cycle  # type: ignore[method-assign]
    simulator.after_each_cycle(check_invariants)
    return simulator.run().decisions


def full_load(jobs: int) -> LoadedScenario:
    """The benchmark's busy pool (``benchmarks/workload.py``): 20 shares x 5 types, queues,
    borrowing and preemption all happening, some shares with in-share preemption."""
    return parse_scenario(workload.scenario(jobs), Path("."))


def congested_workload(jobs: int, seed: int) -> LoadedScenario:
    """The seeded congested workload of ``benchmarks/congested.py`` (6 shares x 2 types in a
    small pool): queues, borrowing, reclaim, in-share preemption and starvation all happen."""
    return parse_scenario(yaml.safe_load(congested.scenario(jobs, seed)), Path("."))


def after_every_cycle(loaded: LoadedScenario, look: Callable[[QuotaScheduler, float], None]) -> None:
    """Run the scenario in the simulator, calling ``look(scheduler, now)`` after every cycle."""
    simulator = Simulator(loaded)
    simulator.after_each_cycle(look)
    simulator.run()


def one_busy_type() -> LoadedScenario:
    """A congested pool of one type (as a GPU cluster trace is), full after most cycles: 400
    jobs of four shares on 16 instances, one share reserving with in-share preemption."""
    rng = random.Random(5)
    t = TYPES[0]
    config = builders.quota(
        {t: 16},
        builders.share("a", {t: 3}),
        builders.share("b", {t: 3}),
        builders.share("c", {t: 4}, strategy="LEND"),
        builders.share("d", {t: 6}, strategy="RESERVE", in_share_preemption=True),
    )
    events = [
        builders.job(
            f"j{i}",
            rng.choice("abcd"),
            (t, rng.randint(1, 4)),
            at=i * 120,
            duration=rng.choice([600, 1800, 5400]),
            priority=rng.randint(0, 3),
        )
        for i in range(400)
    ]
    return builders.scenario(config, *events)


def reserves(share: Share) -> bool:
    """Whether the share's starving jobs hold reservations (``starvation_reservation``, off by
    default: docs/model.md section 8)."""
    return share.starvation_reservation


def with_reservations(loaded: LoadedScenario, on: Callable[[int], bool] = lambda i: True) -> LoadedScenario:
    """The scenario with starving jobs holding reservations in the shares ``on`` picks (by
    index) and not in the others."""
    shares = [s.model_copy(update={"starvation_reservation": on(i)}) for i, s in enumerate(loaded.config.shares)]
    return loaded.model_copy(update={"config": loaded.config.model_copy(update={"shares": shares})})


@st.composite
def v2_scenarios(draw: st.DrawFn) -> LoadedScenario:
    """``scenarios()``, with starving jobs holding reservations in a random subset of the
    shares."""
    loaded = draw(scenarios())
    on = draw(st.lists(st.booleans(), min_size=len(loaded.config.shares), max_size=len(loaded.config.shares)))
    return with_reservations(loaded, lambda i: on[i])


def with_max_running_jobs(loaded: LoadedScenario, most: Callable[[int], int | None]) -> LoadedScenario:
    """The scenario with each share's ``max_running_jobs`` as ``most`` gives it (by index)."""
    shares = [s.model_copy(update={"max_running_jobs": most(i)}) for i, s in enumerate(loaded.config.shares)]
    return loaded.model_copy(update={"config": loaded.config.model_copy(update={"shares": shares})})


@st.composite
def limited_scenarios(draw: st.DrawFn) -> LoadedScenario:
    """``v2_scenarios()``, with ``max_running_jobs`` (1 to 3, or none) on each share."""
    loaded = draw(v2_scenarios())
    shares = len(loaded.config.shares)
    most = draw(st.lists(st.sampled_from([None, 1, 2, 3]), min_size=shares, max_size=shares))
    return with_max_running_jobs(loaded, lambda i: most[i])
