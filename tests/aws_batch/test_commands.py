"""``airflow-quota aws-batch plan | apply | import``, in-process, on the amazon provider's hook
with its client answered by botocore's Stubber (every request checked against
``expected_params`` and botocore's Batch model; a call the test did not expect fails it)."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest
from botocore.stub import Stubber

from airflow_quota.aws_batch import commands
from airflow_quota.cli import main
from airflow_quota.core.config import load_config
from airflow_quota.hooks.aws_batch import AwsBatchQuotaHook
from tests.aws_batch.aws import (
    G5,
    QUEUE,
    QUEUE_ARN,
    REGION,
    batch_client,
    expect_reads,
    share_arn,
    share_detail,
    shares_of,
)
from tests.conftest import ROOT

WALKTHROUGH = ROOT / "examples" / "quota.yaml"
INEXPRESSIBLE = Path(__file__).parent / "inexpressible-quota.yaml"
P4D = "ml.p4d.24xlarge"


@pytest.fixture
def client() -> Any:
    return batch_client()


@pytest.fixture
def hooks(client: Any, monkeypatch: pytest.MonkeyPatch) -> list[AwsBatchQuotaHook]:
    """The hooks the commands make, through the provider's connection handling (an
    ``aws_default`` connection in the environment), their client the stubbed one."""
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps({"conn_type": "aws", "extra": {"region_name": REGION}}))
    monkeypatch.setattr(AwsBatchQuotaHook, "get_client_type", lambda self, region_name=None, **_: client)
    made: list[AwsBatchQuotaHook] = []
    make_hook = commands.make_hook

    def recording(args: Any) -> AwsBatchQuotaHook:
        hook = make_hook(args)
        hook.sleep = lambda seconds: None  # the back-off's waits are the hook tests' business
        made.append(hook)
        return hook

    monkeypatch.setattr(commands, "make_hook", recording)
    return made


@pytest.fixture
def stub(client: Any) -> Iterator[Stubber]:
    with Stubber(client) as stubber:
        yield stubber
        stubber.assert_no_pending_responses()


def run(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["aws-batch", *args])
    return code, out.getvalue(), err.getvalue()


WALKTHROUGH_PLAN = f"""\
Job queue {QUEUE} (service environment quota-se, quota-share scheduling policy quota-policy)

+ quota share qs1 (CreateQuotaShare)
    capacityLimits.ml.g5.xlarge: 1
    resourceSharingConfiguration.strategy: LEND_AND_BORROW
    resourceSharingConfiguration.borrowLimit: 200
    preemptionConfiguration.inSharePreemption: ENABLED
    state: ENABLED
+ quota share qs2 (CreateQuotaShare)
    capacityLimits.ml.g5.xlarge: 1
    resourceSharingConfiguration.strategy: LEND
    preemptionConfiguration.inSharePreemption: DISABLED
    state: ENABLED
+ quota share qs3 (CreateQuotaShare)
    capacityLimits.ml.g5.xlarge: 1
    resourceSharingConfiguration.strategy: RESERVE
    preemptionConfiguration.inSharePreemption: DISABLED
    state: ENABLED

Plan: 3 to create, 0 to update, 0 not managed here, 0 kept by airflow-quota only, 0 refused.
"""


def test_plan_of_the_walkthrough_on_an_empty_queue(hooks: list[AwsBatchQuotaHook], stub: Stubber) -> None:
    expect_reads(stub, {G5: 3}, [])
    code, out, err = run("plan", str(WALKTHROUGH), "--job-queue", QUEUE)
    assert (code, err) == (0, "")
    assert out == WALKTHROUGH_PLAN
    assert [(h.aws_conn_id, h.client_type) for h in hooks] == [("aws_default", "batch")]


def test_plan_as_json(hooks: list[AwsBatchQuotaHook], stub: Stubber) -> None:
    expect_reads(stub, {G5: 2}, [share_detail("qs2", {G5: 1}, "LEND")])
    code, out, _ = run("plan", str(WALKTHROUGH), "--job-queue", QUEUE, "--json")
    document = json.loads(out)
    assert code == 0
    assert [(c["action"], c["name"]) for c in document["changes"]] == [
        ("update", "quota-se"),
        ("create", "qs1"),
        ("create", "qs3"),
    ]
    assert document["changes"][0]["fields"] == [{"name": f"capacityLimits.{G5}", "old": 2, "new": 3}]
    assert document["refused"] == [] and document["kept"] == []


INEXPRESSIBLE_LINES = [
    "= shares[0].max_priority = 5000: kept by airflow-quota only (airflow-quota refuses a higher priority at "
    "submission and at a priority change; AWS takes any schedulingPriority from 0 to 9999 in any share)",
    "= shares[1].require_checkpoint = true: kept by airflow-quota only (airflow-quota checks it at submission; "
    "AWS has no such rule)",
    "= instance_types.ml.g5.xlarge: kept by airflow-quota only (GPUs and prices for airflow-quota's pages and costs)",
    "! shares[0].in_share_preemption_after_seconds = 600 (the default): refused (AWS Batch preempts in a share at "
    "once, with no wait; set it to 0 to accept that)",
    "! shares[0].preemption_protection_seconds = 300: refused (AWS Batch chooses preemption victims by a heuristic "
    "it does not publish and has no protection time; set it to 0 to accept that)",
    "! shares[0].starvation_reservation = true: refused (AWS Batch reserves no capacity for a starving job; set it "
    "to false to accept that)",
    "! shares[1].max_running_jobs = 4: refused (AWS Batch has no limit on a quota share's number of running jobs; "
    "leave it out)",
    "! pool.training_plans[0].arn: refused (plan 'december' has no ARN: SageMaker knows a training plan only by "
    "its ARN (arn:aws:sagemaker:REGION:ACCOUNT:training-plan/NAME))",
    "Plan: 2 to create, 0 to update, 0 not managed here, 3 kept by airflow-quota only, 5 refused. "
    "AWS Batch cannot express the file: nothing to apply.",
]


@pytest.mark.parametrize("command", ["plan", "apply"])
def test_a_file_aws_cannot_express_is_planned_with_its_refusals_exit_2_and_nothing_applied(
    command: str, hooks: list[AwsBatchQuotaHook], stub: Stubber
) -> None:
    expect_reads(stub, {G5: 4, P4D: 2}, [])  # and no other call: the Stubber fails any
    code, out, err = run(command, str(INEXPRESSIBLE), "--job-queue", QUEUE)
    assert code == 2
    lines = out.splitlines()
    for line in INEXPRESSIBLE_LINES:
        assert line in lines, out
    assert err == f"{INEXPRESSIBLE}: AWS Batch cannot express 5 settings (the ! lines): nothing is applied\n"


def test_apply_creates_then_a_second_apply_does_nothing(hooks: list[AwsBatchQuotaHook], stub: Stubber) -> None:
    walkthrough = load_config(WALKTHROUGH)
    expect_reads(stub, {G5: 3}, [])
    for share in shares_of(walkthrough):
        request = {k: v for k, v in share.items() if k not in ("quotaShareArn", "jobQueueArn", "status")}
        stub.add_response(
            "create_quota_share",
            {"quotaShareName": share["quotaShareName"], "quotaShareArn": share["quotaShareArn"]},
            {**request, "jobQueue": QUEUE_ARN},
        )
    code, out, err = run("apply", str(WALKTHROUGH), "--job-queue", QUEUE)
    assert (code, err) == (0, "")
    assert out.startswith(WALKTHROUGH_PLAN)
    assert out.endswith(
        f"created quota share qs1 ({share_arn('qs1')})\ncreated quota share qs2 ({share_arn('qs2')})\n"
        f"created quota share qs3 ({share_arn('qs3')})\nApply complete: 3 calls made.\n"
    )
    expect_reads(stub, {G5: 3}, shares_of(walkthrough))  # AWS now has them: nothing else is called
    code, out, _ = run("apply", str(WALKTHROUGH), "--job-queue", QUEUE)
    assert code == 0
    assert "No changes: the job queue matches the file." in out and out.endswith("Nothing to apply.\n")


def test_an_aws_refusal_during_apply_names_the_share_and_exits_2(hooks: list[AwsBatchQuotaHook], stub: Stubber) -> None:
    expect_reads(stub, {G5: 3}, [share_detail("qs1", {G5: 1}, "LEND_AND_BORROW", 200, True)])
    stub.add_client_error(
        "create_quota_share",
        service_error_code="ClientException",
        service_message="A quota share named qs2 is being deleted",
        http_status_code=400,
    )
    code, _, err = run("apply", str(WALKTHROUGH), "--job-queue", QUEUE)
    assert code == 2 and "Traceback" not in err
    assert err.splitlines()[-1] + "\n" == (
        f"CreateQuotaShare of quota share qs2 (job queue {QUEUE}): AWS Batch refused it: ClientException: "
        "A quota share named qs2 is being deleted\n"
    )


def test_a_throttled_read_is_retried_and_the_plan_made(hooks: list[AwsBatchQuotaHook], stub: Stubber) -> None:
    stub.add_client_error(
        "describe_job_queues",
        service_error_code="TooManyRequestsException",
        http_status_code=429,
        expected_params={"jobQueues": [QUEUE]},
    )
    expect_reads(stub, {G5: 3}, [])
    code, out, err = run("plan", str(WALKTHROUGH), "--job-queue", QUEUE)
    assert (code, out) == (0, WALKTHROUGH_PLAN)  # the log of the retry is on standard error
    assert "DescribeJobQueues of job queue quota-queue: TooManyRequestsException, retrying (attempt 2)" in err


def test_aws_throttling_after_every_retry_exits_1_naming_the_call(
    hooks: list[AwsBatchQuotaHook], stub: Stubber
) -> None:
    for _ in range(6):
        stub.add_client_error(
            "describe_job_queues", service_error_code="TooManyRequestsException", http_status_code=429
        )
    code, out, err = run("import", "--job-queue", QUEUE)
    assert (code, out) == (1, "")
    lines = err.splitlines()
    assert lines[-1] == (
        f"DescribeJobQueues of job queue {QUEUE}: AWS Batch answered TooManyRequestsException 6 times in a row; "
        "try again later"
    )
    assert sum("retrying" in line for line in lines) == 5  # each retry logged, on standard error


def test_an_unknown_job_queue_is_named(hooks: list[AwsBatchQuotaHook], stub: Stubber) -> None:
    stub.add_response("describe_job_queues", {"jobQueues": []}, {"jobQueues": ["nope"]})
    code, out, err = run("plan", str(WALKTHROUGH), "--job-queue", "nope")
    assert (code, out) == (2, "")
    assert err == f"--job-queue: no job queue 'nope' in {REGION} (AWS connection 'aws_default')\n"


def test_a_broken_quota_file_is_refused_before_aws_is_called(hooks: list[AwsBatchQuotaHook], stub: Stubber) -> None:
    broken = ROOT / "examples" / "broken-quota.yaml"
    code, out, err = run("plan", str(broken), "--job-queue", QUEUE)
    assert (code, out) == (2, "")
    assert err.startswith(f"{broken}:\n  shares[1].borrow_limit: borrow_limit is allowed only with strategy")
    assert hooks == []


def test_import_writes_a_quota_file_that_validate_accepts_and_plan_finds_unchanged(
    hooks: list[AwsBatchQuotaHook], stub: Stubber, tmp_path: Path
) -> None:
    on_aws = [
        share_detail("research", {G5: 2, P4D: 1}, "LEND_AND_BORROW", 50, True),
        share_detail("prod", {G5: 1, P4D: 1}, "LEND"),
        share_detail("batch", {G5: 1}, "RESERVE", state="DISABLED"),
    ]
    expect_reads(stub, {G5: 4, P4D: 2}, on_aws, page_size=2)
    code, out, err = run("import", "--job-queue", QUEUE)
    assert (code, err) == (0, "")
    path = tmp_path / "quota.yaml"
    path.write_text(out)
    validated = io.StringIO()
    with redirect_stdout(validated), redirect_stderr(validated):
        assert main(["validate", str(path)]) == 0
    assert f"{path}: valid" in validated.getvalue()
    imported = load_config(path)
    assert [(s.name, s.state.value, s.in_share_preemption_after_seconds) for s in imported.shares] == [
        ("research", "ENABLED", 0),
        ("prod", "ENABLED", 600),
        ("batch", "DISABLED", 600),
    ]
    expect_reads(stub, {G5: 4, P4D: 2}, on_aws)
    code, out, _ = run("plan", str(path), "--job-queue", QUEUE)
    assert code == 0 and "No changes: the job queue matches the file." in out


def test_import_of_a_fair_share_queue_is_refused_naming_it(hooks: list[AwsBatchQuotaHook], stub: Stubber) -> None:
    from tests.aws_batch.aws import POLICY_ARN, SE_ARN, environment_detail, policy_detail, queue_detail

    stub.add_response("describe_job_queues", {"jobQueues": [queue_detail()]}, {"jobQueues": [QUEUE]})
    stub.add_response(
        "describe_scheduling_policies", {"schedulingPolicies": [policy_detail(fair_share=True)]}, {"arns": [POLICY_ARN]}
    )
    stub.add_response(
        "describe_service_environments",
        {"serviceEnvironments": [environment_detail({G5: 3})]},
        {"serviceEnvironments": [SE_ARN]},
    )
    code, out, err = run("import", "--job-queue", QUEUE)
    assert (code, out) == (2, "")
    assert err == (
        f"--job-queue: job queue '{QUEUE}' has the fair-share scheduling policy 'quota-policy': quota shares need a "
        "quotaSharePolicy, and AWS does not change a policy's type\n"
    )


def test_an_unknown_connection_is_named_before_aws_is_called(hooks: list[AwsBatchQuotaHook], stub: Stubber) -> None:
    code, out, err = run("import", "--job-queue", QUEUE, "--conn-id", "team_aws")
    assert (code, out) == (2, "")
    assert err.splitlines()[-1] == (
        "--conn-id: no Airflow connection 'team_aws' (AIRFLOW_CONN_TEAM_AWS, airflow connections add, "
        "or a secrets backend)"
    )
    assert hooks == []


def test_a_named_connection_is_the_hooks(
    hooks: list[AwsBatchQuotaHook], stub: Stubber, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_TEAM_AWS", json.dumps({"conn_type": "aws", "extra": {"region_name": REGION}}))
    expect_reads(stub, {G5: 3}, [])
    code, _, _ = run("plan", str(WALKTHROUGH), "--job-queue", QUEUE, "--conn-id", "team_aws", "--region", REGION)
    assert code == 0
    assert [(h.aws_conn_id, h.region_name) for h in hooks] == [("team_aws", REGION)]


def test_the_page_shows_the_plans_these_tests_print() -> None:
    """docs/aws-batch.md's plan outputs are the ones above, line for line."""
    page = (ROOT / "docs" / "aws-batch.md").read_text()
    assert WALKTHROUGH_PLAN in page
    for line in INEXPRESSIBLE_LINES:
        assert f"\n{line}\n" in page, line
