"""``AwsBatchQuotaHook`` against botocore's Stubber: every request checked against
``expected_params`` and botocore's Batch model; ListQuotaShares followed over its pages; a
throttled call retried with back-off (the hook's own retry: the Stubber bypasses botocore's);
an AWS refusal named with the object and AWS's message."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from botocore.stub import Stubber

from airflow_quota.aws_batch.policy import plan
from airflow_quota.core.config import load_config
from airflow_quota.hooks.aws_batch import MAX_ATTEMPTS, AwsBatchQuotaHook, AwsBatchRefused, AwsBatchUnavailable
from tests.aws_batch.aws import G5, QUEUE, QUEUE_ARN, SE_ARN, batch_client, expect_reads, share_arn, share_detail
from tests.conftest import ROOT


@pytest.fixture
def client() -> Any:
    return batch_client()


@pytest.fixture
def hook(client: Any) -> AwsBatchQuotaHook:
    hook = AwsBatchQuotaHook(aws_conn_id=None, region_name="us-east-1")
    hook.conn = client  # the provider's cached client, here the stubbed one
    hook.waits: list[float] = []  # type: ignore[misc]
    hook.sleep = hook.waits.append  # type: ignore[attr-defined]
    return hook


@pytest.fixture
def stub(client: Any) -> Iterator[Stubber]:
    with Stubber(client) as stubber:
        yield stubber
        stubber.assert_no_pending_responses()


def test_it_is_the_amazon_providers_batch_hook() -> None:
    from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook

    hook = AwsBatchQuotaHook(aws_conn_id="team_aws", region_name="eu-west-1")
    assert isinstance(hook, AwsBaseHook)
    assert (hook.client_type, hook.aws_conn_id) == ("batch", "team_aws")


def test_quota_shares_are_read_over_every_page(hook: AwsBatchQuotaHook, stub: Stubber) -> None:
    shares = [share_detail(f"s{i}", {G5: 1}) for i in range(5)]
    expect_reads(stub, {G5: 5}, shares, page_size=2)  # three pages: tokens 1 and 2
    state = hook.queue_state(QUEUE)
    assert state is not None
    assert [s["quotaShareName"] for s in state.quota_shares] == ["s0", "s1", "s2", "s3", "s4"]
    assert state.service_environment["serviceEnvironmentArn"] == SE_ARN


def test_an_unknown_queue_is_none(hook: AwsBatchQuotaHook, stub: Stubber) -> None:
    stub.add_response("describe_job_queues", {"jobQueues": []}, {"jobQueues": ["nope"]})
    assert hook.queue_state("nope") is None


def test_a_throttled_call_is_retried_after_a_back_off_and_then_succeeds(hook: AwsBatchQuotaHook, stub: Stubber) -> None:
    params = {"jobQueue": QUEUE_ARN, "maxResults": 100}
    for _ in range(2):
        stub.add_client_error(
            "list_quota_shares",
            service_error_code="TooManyRequestsException",
            service_message="Too Many Requests",
            http_status_code=429,
            expected_params=params,
        )
    stub.add_response("list_quota_shares", {"quotaShares": [share_detail("a", {G5: 1})]}, params)
    assert [s["quotaShareName"] for s in hook.list_quota_shares(QUEUE_ARN)] == ["a"]
    waits = hook.waits  # type: ignore[attr-defined]
    assert len(waits) == 2
    assert 0.5 <= waits[0] <= 1.0 and 1.0 <= waits[1] <= 2.0  # exponential, with jitter


def test_a_call_throttled_every_time_gives_up_saying_so(hook: AwsBatchQuotaHook, stub: Stubber) -> None:
    for _ in range(MAX_ATTEMPTS):
        stub.add_client_error(
            "describe_job_queues",
            service_error_code="TooManyRequestsException",
            http_status_code=429,
            expected_params={"jobQueues": [QUEUE]},
        )
    with pytest.raises(AwsBatchUnavailable, match=f"DescribeJobQueues of job queue {QUEUE}: .* {MAX_ATTEMPTS} times"):
        hook.queue_state(QUEUE)
    assert len(hook.waits) == MAX_ATTEMPTS - 1  # type: ignore[attr-defined]


def test_an_aws_refusal_names_the_share_and_awss_message_and_is_not_retried(
    hook: AwsBatchQuotaHook, stub: Stubber
) -> None:
    walkthrough = load_config(ROOT / "examples" / "quota.yaml")
    expect_reads(stub, {G5: 3}, [])
    the_plan = plan(walkthrough, hook.queue_state(QUEUE))  # type: ignore[arg-type]
    first = the_plan.calls[0]
    stub.add_client_error(
        "create_quota_share",
        service_error_code="ClientException",
        service_message="Quota share capacity limits exceed the service environment's",
        http_status_code=400,
        expected_params=dict(first.request or {}),
    )
    with pytest.raises(AwsBatchRefused) as refused:
        hook.apply(the_plan)
    assert str(refused.value) == (
        f"CreateQuotaShare of quota share qs1 (job queue {QUEUE}): AWS Batch refused it: ClientException: "
        "Quota share capacity limits exceed the service environment's"
    )
    assert hook.waits == []  # type: ignore[attr-defined]


def test_apply_makes_each_call_with_the_plans_request(hook: AwsBatchQuotaHook, stub: Stubber) -> None:
    walkthrough = load_config(ROOT / "examples" / "quota.yaml")
    on_aws = [share_detail("qs2", {G5: 2}, "LEND")]
    expect_reads(stub, {G5: 2}, on_aws)
    the_plan = plan(walkthrough, hook.queue_state(QUEUE))  # type: ignore[arg-type]
    stub.add_response(
        "update_service_environment",
        {"serviceEnvironmentName": "quota-se", "serviceEnvironmentArn": SE_ARN},
        {"serviceEnvironment": SE_ARN, "capacityLimits": [{"maxCapacity": 3, "capacityUnit": G5}]},
    )
    stub.add_response(
        "update_quota_share",
        {"quotaShareName": "qs2", "quotaShareArn": share_arn("qs2")},
        {"quotaShareArn": share_arn("qs2"), "capacityLimits": [{"maxCapacity": 1, "capacityUnit": G5}]},
    )
    for name, sharing, preemption in (
        ("qs1", {"strategy": "LEND_AND_BORROW", "borrowLimit": 200}, "ENABLED"),
        ("qs3", {"strategy": "RESERVE"}, "DISABLED"),
    ):
        stub.add_response(
            "create_quota_share",
            {"quotaShareName": name, "quotaShareArn": share_arn(name)},
            {
                "quotaShareName": name,
                "jobQueue": QUEUE_ARN,
                "capacityLimits": [{"maxCapacity": 1, "capacityUnit": G5}],
                "resourceSharingConfiguration": sharing,
                "preemptionConfiguration": {"inSharePreemption": preemption},
                "state": "ENABLED",
            },
        )
    done: list[str] = []
    assert hook.apply(the_plan, on_done=lambda change, answer: done.append(change.name)) == 4
    assert done == ["quota-se", "qs2", "qs1", "qs3"]
