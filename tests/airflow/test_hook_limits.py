"""The hook refuses what the CLI refuses (issue 14, finding 5): a stored field beyond its
limit is InvalidInput naming the field and the limit, through the same core validation
(``core.submission.job_fields``), and nothing is stored."""

from __future__ import annotations

import pytest

from airflow_quota.exceptions import InvalidInput
from airflow_quota.hooks.quota import QuotaHook
from tests.airflow.conftest import QuotaWorld, request


def test_the_hook_refuses_fields_beyond_their_limits_and_stores_nothing(world: QuotaWorld) -> None:
    hook = QuotaHook()
    with pytest.raises(InvalidInput) as refused:
        hook.submit(
            request("too-big"),
            "fake",
            {"blob": "x" * 100_000},
            client_token="c" * 300,
            dag_id="d" * 300_000,
            task_id="task",
            run_id="r" * 251,
        )
    assert refused.value.lines() == [
        "training: at most 65536 bytes as JSON (got 100012)",
        "client_token: at most 256 characters (got 300)",
        "dag_id: at most 250 characters (got 300000)",
        "run_id: at most 250 characters (got 251)",
    ]
    assert world.store.jobs() == []
    job = hook.submit(request("fits"), "fake", {"duration": 1}, client_token="c" * 256, dag_id="d" * 250)
    assert [j.name for j in world.store.jobs()] == [job.name] == ["fits"]


@pytest.mark.parametrize(
    ("given", "problem"),
    [
        (0, "Input should be greater than 0"),
        (float("nan"), "Input should be a finite number"),
        (11 * 366 * 86400.0, "Input should be less than or equal to 316224000"),
    ],
    ids=["zero", "not a number", "beyond ten years"],
)
def test_the_hook_refuses_an_expected_runtime_that_is_no_duration_and_stores_nothing(
    world: QuotaWorld, given: float, problem: str
) -> None:
    hook = QuotaHook()
    with pytest.raises(InvalidInput) as refused:
        hook.submit(request("timed"), "fake", {"duration": 1}, expected_runtime_seconds=given)
    assert refused.value.lines() == [f"expected_runtime_seconds: {problem}"]
    assert world.store.jobs() == []
    job = hook.submit(request("timed"), "fake", {"duration": 1}, expected_runtime_seconds=3600)
    assert world.job(job.id).expected_runtime_seconds == 3600.0
