"""A batch run collects garbage less often (``sim/gc_tuning.py``), which is sound only because
the simulation makes no reference cycles: a collection after a whole run with the collector off
must find nothing to free. The caller's thresholds come back afterwards, even on an error."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from airflow_quota.sim.gc_tuning import BATCH_THRESHOLDS, fewer_collections
from airflow_quota.sim.scenario import load_scenario, parse_scenario
from airflow_quota.sim.simulator import Simulator
from benchmarks import workload
from tests.conftest import SCENARIOS


def _garbage_after(run: Simulator) -> int:
    """Objects in reference cycles that ``run`` left behind, found by a collection."""
    gc.collect()
    gc.disable()
    try:
        result = run.run()
        found = gc.collect()
    finally:
        gc.enable()
    assert result.decisions
    return found


def test_the_full_load_leaves_no_reference_cycles() -> None:
    run = Simulator(parse_scenario(workload.scenario(2_000), Path(".")))
    assert _garbage_after(run) == 0


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda path: path.stem)
def test_a_scenario_leaves_no_reference_cycles(path: Path) -> None:
    assert _garbage_after(Simulator(load_scenario(path))) == 0


def test_thresholds_are_raised_inside_and_restored_after_an_error() -> None:
    before = gc.get_threshold()
    assert before != BATCH_THRESHOLDS
    with pytest.raises(RuntimeError), fewer_collections():
        assert gc.get_threshold() == BATCH_THRESHOLDS
        raise RuntimeError("the run failed")
    assert gc.get_threshold() == before
