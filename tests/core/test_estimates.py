"""Runtime estimates (``core/estimates.py``): the sources in order, a running job's history
cut at what it has run, the request's maximum as a cap only, and no estimate said as such."""

from __future__ import annotations

import random

from airflow_quota.core.estimates import MIN_RUNS, EstimateSource, RuntimeEstimate, RuntimeHistory


def history_of(task: list[float], share: list[float], pool: list[float]) -> RuntimeHistory:
    history = RuntimeHistory()
    for duration in task:
        history.add("research", duration, task="dag.train")
    for duration in share:
        history.add("research", duration)
    for duration in pool:
        history.add("vision", duration)
    return history


def test_the_authors_runtime_comes_first() -> None:
    estimate = history_of([100.0] * 5, [], []).estimate("research", "dag.train", expected_runtime=900.0)
    assert (estimate.source, estimate.runs) == (EstimateSource.AUTHOR, (900.0,))


def test_then_the_task_then_the_share_then_the_pool() -> None:
    history = history_of([100.0, 110.0, 120.0], [500.0], [900.0])
    assert history.estimate("research", "dag.train").source is EstimateSource.TASK
    assert history.estimate("research", "dag.other").source is EstimateSource.SHARE
    assert history.estimate("ml", "dag.other").source is EstimateSource.POOL
    sparse = history_of([100.0] * (MIN_RUNS - 1), [500.0], [])
    assert sparse.estimate("research", "dag.train").source is EstimateSource.SHARE


def test_a_running_job_counts_only_longer_runs() -> None:
    history = history_of([100.0, 200.0, 300.0, 400.0, 500.0], [], [])
    estimate = history.estimate("research", "dag.train", elapsed=250.0)
    assert estimate.source is EstimateSource.TASK and estimate.runs == (300.0, 400.0, 500.0)
    longer = history.estimate("research", "dag.train", elapsed=450.0)
    assert longer.source is EstimateSource.POOL and longer.runs == (500.0,)
    beyond = history.estimate("research", "dag.train", elapsed=600.0)
    assert beyond.source is EstimateSource.NONE and not beyond.known and beyond.median is None


def test_the_requests_maximum_only_caps() -> None:
    history = history_of([100.0, 5_000.0, 9_000.0], [], [])
    estimate = history.estimate("research", "dag.train", max_runtime=3_600.0)
    assert estimate.source is EstimateSource.TASK
    assert {estimate.draw(random.Random(seed)) for seed in range(50)} == {100.0, 3_600.0}
    alone = RuntimeHistory().estimate("research", max_runtime=3_600.0)
    assert alone.source is EstimateSource.NONE, "a maximum is not an estimate"


def test_the_history_keeps_the_most_recent_runs() -> None:
    history = RuntimeHistory(keep=3)
    for duration in (1.0, 2.0, 3.0, 4.0, 5.0):
        history.add("research", duration)
    assert history.estimate("research").runs == (3.0, 4.0, 5.0)


def test_a_sliced_draw_stays_in_its_slice() -> None:
    """A forecast's stratified draws: the slice (0.25, 0.5) of 100 runtimes is the second quarter."""
    estimate = RuntimeEstimate(EstimateSource.TASK, tuple(float(s) for s in range(100)))
    rng = random.Random(3)
    drawn = {estimate.draw(rng, 0.25, 0.5) for _ in range(500)}
    assert drawn == {float(s) for s in range(25, 50)}
