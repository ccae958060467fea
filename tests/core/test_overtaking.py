"""The overtaking log forgets the placements no job that can still wait would count
(``core/overtaking.py``): the decisions stay those of a log that keeps every placement, and what
it holds follows the jobs not yet final, not the length of the run (a leader runs for months)."""

from __future__ import annotations

from unittest import mock

from hypothesis import HealthCheck, given, settings

from airflow_quota.core import overtaking
from airflow_quota.core.cycle import QuotaScheduler
from airflow_quota.core.model import Placed
from airflow_quota.sim.scenario import LoadedScenario
from airflow_quota.sim.simulator import Simulator
from tests.builders import job, quota, scenario, share
from tests.core.properties import TYPES, one_busy_type, run_checked, scenarios, v2_scenarios

NEVER = 10**12
"""A pruning threshold no test run reaches: the log keeps every placement."""


def decisions(loaded: LoadedScenario, prune_after: int) -> list[str]:
    with mock.patch.object(overtaking, "PRUNE_AFTER", prune_after):
        return [repr(d) for d in run_checked(loaded)]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_pruning_after_every_placement_decides_as_keeping_every_placement(loaded: LoadedScenario) -> None:
    assert decisions(loaded, 1) == decisions(loaded, NEVER)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(v2_scenarios())
def test_pruning_decides_as_keeping_every_placement_with_reservations(loaded: LoadedScenario) -> None:
    assert decisions(loaded, 1) == decisions(loaded, NEVER)


def run_with_peak(loaded: LoadedScenario, prune_after: int) -> tuple[list[str], int, int]:
    """The run's decisions, its placements, and the most placements the log held after a cycle."""
    peak = 0
    with mock.patch.object(overtaking, "PRUNE_AFTER", prune_after):
        simulator = Simulator(loaded)

        def look(scheduler: QuotaScheduler, now: float) -> None:
            nonlocal peak
            peak = max(peak, scheduler.state.overtakes.held())

        simulator.after_each_cycle(look)
        out = simulator.run().decisions
    return [repr(d) for d in out], sum(isinstance(d, Placed) for d in out), peak


def test_pruning_decides_as_keeping_every_placement_on_one_busy_type() -> None:
    kept, placed, kept_peak = run_with_peak(one_busy_type(), NEVER)
    pruned, _, _ = run_with_peak(one_busy_type(), 16)
    assert pruned == kept
    assert kept_peak == placed > 400, "a log that never prunes holds every placement"


def test_the_log_holds_the_live_window_not_the_history() -> None:
    """2,000 jobs that never wait long: pruning every 16 placements, the log holds a few dozen
    placements at most, while a log that never prunes ends holding all 2,000."""
    t = TYPES[0]
    loaded = scenario(
        quota({t: 16}, share("a", {t: 8}), share("b", {t: 8})),
        *(job(f"j{i}", "ab"[i % 2], (t, 1), at=i * 60, duration=600) for i in range(2000)),
    )
    kept, placed, kept_peak = run_with_peak(loaded, NEVER)
    pruned, _, pruned_peak = run_with_peak(loaded, 16)
    assert pruned == kept
    assert kept_peak == placed == 2000
    assert pruned_peak <= 48, f"held {pruned_peak} of {placed} placements"
