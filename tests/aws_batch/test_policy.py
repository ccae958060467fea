"""The translation of a quota configuration into AWS Batch quota-management objects and back
(``airflow_quota.aws_batch.policy``, pure): the objects, the diff, what is kept by
airflow-quota only and what is refused, and the round trip AWS → quota.yaml → AWS."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_quota.aws_batch.policy import (
    MAX_QUOTA_SHARES,
    JobQueueState,
    desired,
    expressibility,
    import_config,
    import_yaml,
    plan,
    plan_text,
    quota_mapping,
)
from airflow_quota.core.catalogue import builtin_catalogue
from airflow_quota.core.config import QuotaConfig, Share, load_config, parse_config
from airflow_quota.exceptions import InvalidInput
from tests.aws_batch.aws import (
    G5,
    QUEUE,
    QUEUE_ARN,
    SE_ARN,
    environment_detail,
    policy_detail,
    queue_detail,
    share_arn,
    share_detail,
    shares_of,
    state_of,
)
from tests.conftest import ROOT

WALKTHROUGH = ROOT / "examples" / "quota.yaml"
INEXPRESSIBLE = Path(__file__).parent / "inexpressible-quota.yaml"
P4D = "ml.p4d.24xlarge"


def queue(capacity: dict[str, int], shares: list[dict[str, Any]]) -> JobQueueState:
    return JobQueueState(queue_detail(), policy_detail(), [environment_detail(capacity)], shares)


def config(shares: list[dict[str, Any]], capacity: dict[str, int] | None = None, **more: Any) -> QuotaConfig:
    return parse_config({"pool": {"capacity": capacity or {G5: 8}}, "shares": shares, **more})


# -- configuration → AWS ------------------------------------------------------------------------


def test_the_walkthrough_is_three_quota_shares_on_a_service_environment_of_three() -> None:
    want = desired(load_config(WALKTHROUGH))
    assert want.capacity == {G5: 3}
    assert want.quota_shares == (
        {
            "quotaShareName": "qs1",
            "capacityLimits": [{"maxCapacity": 1, "capacityUnit": G5}],
            "resourceSharingConfiguration": {"strategy": "LEND_AND_BORROW", "borrowLimit": 200},
            "preemptionConfiguration": {"inSharePreemption": "ENABLED"},
            "state": "ENABLED",
        },
        {
            "quotaShareName": "qs2",
            "capacityLimits": [{"maxCapacity": 1, "capacityUnit": G5}],
            "resourceSharingConfiguration": {"strategy": "LEND"},
            "preemptionConfiguration": {"inSharePreemption": "DISABLED"},
            "state": "ENABLED",
        },
        {
            "quotaShareName": "qs3",
            "capacityLimits": [{"maxCapacity": 1, "capacityUnit": G5}],
            "resourceSharingConfiguration": {"strategy": "RESERVE"},
            "preemptionConfiguration": {"inSharePreemption": "DISABLED"},
            "state": "ENABLED",
        },
    )
    assert want.kept == () and want.refused == ()


def test_a_borrowing_share_without_a_borrow_limit_borrows_without_limit_as_aws_defaults() -> None:
    share = desired(config([{"name": "a", "capacity_limits": {G5: 1}, "strategy": "LEND_AND_BORROW"}])).quota_shares[0]
    assert share["resourceSharingConfiguration"] == {"strategy": "LEND_AND_BORROW", "borrowLimit": -1}


NON_DEFAULT: dict[str, tuple[dict[str, Any], str]] = {
    # share field: (the share's fields setting it to something else than its default, kept | refused)
    "in_share_preemption_after_seconds": (
        {"in_share_preemption": True, "in_share_preemption_after_seconds": 5},
        "refused",
    ),
    "preemption_protection_seconds": ({"preemption_protection_seconds": 60}, "refused"),
    "preemption_grace_seconds": ({"preemption_grace_seconds": 30}, "refused"),
    "starvation_reservation": ({"starvation_reservation": True}, "refused"),
    "max_running_jobs": ({"max_running_jobs": 3}, "refused"),
    "starvation_after_seconds": ({"starvation_after_seconds": 3600}, "kept"),
    "starvation_multiple": ({"starvation_multiple": 4}, "kept"),
    "starvation_min_seconds": ({"starvation_min_seconds": 60}, "kept"),
    "max_priority": ({"max_priority": 10}, "kept"),
    "require_checkpoint": ({"require_checkpoint": True}, "kept"),
    "preempted_alert_after": ({"preempted_alert_after": 9}, "kept"),
    "aws_conn_id": ({"aws_conn_id": "team_a"}, "kept"),
    "access": ({"access": {"submit": {"dags": ["team_a_*"]}}}, "kept"),
}
TRANSLATED = {"name", "capacity_limits", "strategy", "borrow_limit", "in_share_preemption", "state"}
"""Share fields AWS expresses (a quota share's fields)."""


def test_every_share_field_is_translated_kept_or_refused() -> None:
    """A share field added later without a decision here fails this test: nothing is dropped silently."""
    assert set(Share.model_fields) == TRANSLATED | set(NON_DEFAULT)


@pytest.mark.parametrize("field", sorted(NON_DEFAULT))
def test_a_setting_aws_cannot_express_is_kept_or_refused_under_its_path(field: str) -> None:
    fields, verdict = NON_DEFAULT[field]
    kept, refused = expressibility(
        config([{"name": "a", "capacity_limits": {G5: 1}}, {"name": "b", "capacity_limits": {G5: 1}, **fields}])
    )
    listed = {"kept": kept, "refused": refused}
    assert [n.path for n in listed[verdict]] == [f"shares[1].{field}"]
    assert not listed["refused" if verdict == "kept" else "kept"]


def test_a_default_in_share_wait_is_refused_when_the_share_preempts_and_says_it_is_the_default() -> None:
    _, refused = expressibility(config([{"name": "a", "capacity_limits": {G5: 1}, "in_share_preemption": True}]))
    assert [(n.path, n.value) for n in refused] == [
        ("shares[0].in_share_preemption_after_seconds", "600 (the default)")
    ]
    _, none = expressibility(
        config([{"name": "a", "capacity_limits": {G5: 1}, "in_share_preemption_after_seconds": 60}])
    )
    assert none == []  # no in-share preemption: the wait changes nothing


def test_more_than_20_shares_and_more_than_5_pool_types_are_refused() -> None:
    shares = [{"name": f"s{i}", "capacity_limits": {G5: 1}} for i in range(MAX_QUOTA_SHARES + 1)]
    _, refused = expressibility(config(shares, {G5: 30}))
    assert [(n.path, n.value) for n in refused] == [("shares", "21")]
    assert expressibility(config(shares[:MAX_QUOTA_SHARES], {G5: 30}))[1] == []
    types = sorted(t for t in builtin_catalogue() if t.startswith("ml.g5."))[:6]
    assert len(types) == 6
    _, refused = expressibility(config([{"name": "a", "capacity_limits": {types[0]: 1}}], {t: 1 for t in types}))
    assert [(n.path, n.value) for n in refused] == [("pool.capacity", "6 instance types")]


def test_more_than_5_instance_types_in_a_share_is_already_refused_by_validate() -> None:
    types = sorted(t for t in builtin_catalogue() if t.startswith("ml.g5."))[:6]
    with pytest.raises(InvalidInput) as refused:
        config([{"name": "a", "capacity_limits": {t: 1 for t in types}}], {t: 1 for t in types})
    assert any(p.path == "shares[0].capacity_limits" for p in refused.value.problems)


def test_training_plans_are_kept_with_an_arn_and_refused_without_one_or_with_a_bad_one() -> None:
    arn = "arn:aws:sagemaker:us-east-1:123456789012:training-plan/december"
    window = {"starts_at": "2026-12-01T00:00:00Z", "ends_at": "2026-12-15T00:00:00Z"}
    plans = [
        {"name": "good", "instance_type": P4D, "count": 1, "arn": arn, **window},
        {"name": "none", "instance_type": P4D, "count": 1, **window},
        {"name": "bad", "instance_type": P4D, "count": 1, "arn": "arn:aws:s3:::bucket", **window},
    ]
    raw = {
        "pool": {"capacity": {P4D: 3}, "training_plans": plans},
        "shares": [{"name": "a", "capacity_limits": {P4D: 1}}],
    }
    kept, refused = expressibility(parse_config(raw))
    assert [n.path for n in kept] == ["pool.training_plans[0]"]
    assert [n.path for n in refused] == ["pool.training_plans[1].arn", "pool.training_plans[2].arn"]


def test_instance_types_and_notifiers_are_kept_by_airflow_quota() -> None:
    kept, refused = expressibility(
        config(
            [{"name": "a", "capacity_limits": {G5: 1}}],
            instance_types={G5: {"gpus": 1, "hourly_price": 2.0}},
            alerts={"notifiers": [{"class": "airflow_quota.notifications.log.LogNotifier"}]},
        )
    )
    assert [n.path for n in kept] == [f"instance_types.{G5}", "alerts.notifiers"] and refused == []


# -- the diff -----------------------------------------------------------------------------------


def test_nothing_changes_when_aws_already_has_the_configuration() -> None:
    walkthrough = load_config(WALKTHROUGH)
    the_plan = plan(walkthrough, state_of(walkthrough))
    assert the_plan.changes == () and the_plan.calls == ()
    assert "No changes: the job queue matches the file." in plan_text(the_plan)


def test_the_diff_creates_updates_field_by_field_and_leaves_other_shares_alone() -> None:
    walkthrough = load_config(WALKTHROUGH)
    on_aws = [
        share_detail("qs1", {G5: 1}, "LEND", preemption=False),
        share_detail("qs2", {G5: 2, P4D: 1}, "LEND", state="DISABLED"),
        share_detail("old", {G5: 1}),
    ]
    the_plan = plan(walkthrough, queue({G5: 2, P4D: 1}, on_aws))
    changes = [(c.action, c.kind, c.name, c.operation) for c in the_plan.changes]
    assert changes == [
        ("update", "service environment", "quota-se", "UpdateServiceEnvironment"),
        ("update", "quota share", "qs1", "UpdateQuotaShare"),
        ("update", "quota share", "qs2", "UpdateQuotaShare"),
        ("create", "quota share", "qs3", "CreateQuotaShare"),
        ("unmanaged", "quota share", "old", None),
    ]
    environment, qs1, qs2, qs3, _ = the_plan.changes
    assert [str(f) for f in environment.fields] == [
        "capacityLimits.ml.g5.xlarge: 2 → 3",
        "capacityLimits.ml.p4d.24xlarge: 1 → (none)",
    ]
    assert environment.request == {
        "serviceEnvironment": SE_ARN,
        "capacityLimits": [{"maxCapacity": 3, "capacityUnit": G5}],
    }
    assert [str(f) for f in qs1.fields] == [
        "resourceSharingConfiguration.strategy: LEND → LEND_AND_BORROW",
        "resourceSharingConfiguration.borrowLimit: (none) → 200",
        "preemptionConfiguration.inSharePreemption: DISABLED → ENABLED",
    ]
    assert qs1.request == {
        "quotaShareArn": share_arn("qs1"),
        "resourceSharingConfiguration": {"strategy": "LEND_AND_BORROW", "borrowLimit": 200},
        "preemptionConfiguration": {"inSharePreemption": "ENABLED"},
    }
    assert [str(f) for f in qs2.fields] == [
        "capacityLimits.ml.g5.xlarge: 2 → 1",
        "state: DISABLED → ENABLED",
        "capacityLimits.ml.p4d.24xlarge: 1 → (none)",
    ]
    assert qs2.request == {
        "quotaShareArn": share_arn("qs2"),
        "capacityLimits": [{"maxCapacity": 1, "capacityUnit": G5}],
        "state": "ENABLED",
    }
    assert qs3.request is not None and qs3.request["jobQueue"] == QUEUE_ARN
    # 'old' (1 instance) would take the limits to 4 on a capacity of 3: refused, named
    assert [(n.path, n.value) for n in the_plan.refused] == [(f"pool.capacity.{G5}", "3")]
    assert "old 1" in the_plan.refused[0].why


def test_a_share_left_alone_that_fits_is_only_listed() -> None:
    the_plan = plan(
        config([{"name": "a", "capacity_limits": {G5: 1}}], {G5: 3}), queue({G5: 3}, [share_detail("b", {G5: 2})])
    )
    assert [(c.action, c.name) for c in the_plan.changes] == [("create", "a"), ("unmanaged", "b")]
    assert the_plan.refused == ()
    assert "? quota share b: on AWS, not in the file: left as it is" in plan_text(the_plan)


def test_shares_left_alone_count_towards_the_20() -> None:
    shares = [{"name": f"s{i}", "capacity_limits": {G5: 1}} for i in range(MAX_QUOTA_SHARES)]
    the_plan = plan(config(shares, {G5: 40}), queue({G5: 40}, [share_detail("extra", {G5: 1})]))
    assert [n.path for n in the_plan.refused] == ["shares"]
    assert "21 quota shares" in the_plan.refused[0].why


def test_shares_being_deleted_on_aws_are_listed_not_counted_and_not_reused() -> None:
    shares = [{"name": f"s{i}", "capacity_limits": {G5: 1}} for i in range(MAX_QUOTA_SHARES)]
    going = share_detail("going", {G5: 1}, state="DISABLED", status="DELETING")
    the_plan = plan(config(shares, {G5: 40}), queue({G5: 40}, [going]))
    assert the_plan.refused == ()  # 20 in the file, the 21st on its way out
    assert ("unmanaged", "going") in [(c.action, c.name) for c in the_plan.changes]
    assert "being deleted on AWS: not counted" in plan_text(the_plan)
    again = plan(config([{"name": "going", "capacity_limits": {G5: 1}}], {G5: 40}), queue({G5: 40}, [going]))
    assert [(n.path, n.value) for n in again.refused] == [("shares", "going")]
    assert "being deleted on AWS: plan again once it is gone" in again.refused[0].why


@pytest.mark.parametrize(
    ("aws", "named"),
    [
        (queue_detail(jobQueueType="ECS"), "of type ECS"),
        (queue_detail(schedulingPolicyArn=None), "has no scheduling policy"),
        (queue_detail(serviceEnvironmentOrder=[]), "has 0 service environments"),
    ],
)
def test_a_queue_that_cannot_hold_quota_shares_is_refused_naming_why(aws: dict[str, Any], named: str) -> None:
    environments = [environment_detail({G5: 3})] if aws.get("serviceEnvironmentOrder") else []
    policy = policy_detail() if aws.get("schedulingPolicyArn") else None
    with pytest.raises(InvalidInput) as refused:
        plan(load_config(WALKTHROUGH), JobQueueState(aws, policy, environments, []))
    assert refused.value.problems[0].path == "--job-queue" and named in refused.value.problems[0].message


def test_a_fair_share_queue_and_a_num_instances_environment_are_refused() -> None:
    se = environment_detail({})
    se["capacityLimits"] = [{"maxCapacity": 3, "capacityUnit": "NUM_INSTANCES"}]
    with pytest.raises(InvalidInput) as refused:
        quota_mapping(JobQueueState(queue_detail(), policy_detail(fair_share=True), [se], []))
    messages = [p.message for p in refused.value.problems]
    assert "fair-share scheduling policy 'quota-policy'" in messages[0] and "NUM_INSTANCES" in messages[1]


# -- AWS → configuration ------------------------------------------------------------------------


def test_import_writes_a_file_validate_accepts_with_aws_in_share_preemption_at_once(tmp_path: Path) -> None:
    walkthrough = load_config(WALKTHROUGH)
    text = import_yaml(state_of(walkthrough))
    assert text.startswith(f"# Imported from AWS Batch job queue {QUEUE} ")
    path = tmp_path / "quota.yaml"
    path.write_text(text)
    imported = load_config(path)
    assert imported == walkthrough  # the walkthrough is all AWS can express, its wait 0 included


def test_import_leaves_out_shares_being_deleted() -> None:
    shares = [share_detail("a", {G5: 1}), share_detail("gone", {G5: 1}, state="DISABLED", status="DELETING")]
    assert [s["name"] for s in quota_mapping(queue({G5: 2}, shares))["shares"]] == ["a"]


def test_import_refuses_aws_objects_that_break_the_rules_naming_the_job_queue() -> None:
    shares = [share_detail("a", {G5: 2}), share_detail("b", {G5: 2}), share_detail("c", {"ml.unknown.type": 1})]
    with pytest.raises(InvalidInput) as refused:
        import_config(queue({G5: 3}, shares))
    lines = refused.value.lines()
    assert lines[0] == f"job queue {QUEUE}:"
    assert any("limits sum to 4 (a 2 + b 2) but capacity is 3" in line for line in lines)
    assert any("shares[2].capacity_limits.ml.unknown.type: unknown instance type" in line for line in lines)


TYPES = ["ml.g5.xlarge", "ml.g5.2xlarge", "ml.p4d.24xlarge", "ml.g4dn.xlarge", "ml.m5.large", "ml.p5.48xlarge"]


@st.composite
def expressible(draw: st.DrawFn) -> dict[str, Any]:
    """A configuration AWS Batch expresses whole: up to 5 types, up to 20 shares, a preempting
    share's wait 0; any strategy, borrow limit and state."""
    types = draw(st.lists(st.sampled_from(TYPES[:5]), min_size=1, max_size=5, unique=True))
    shares = []
    used = dict.fromkeys(types, 0)
    for i in range(draw(st.integers(1, MAX_QUOTA_SHARES))):
        limits = {t: draw(st.integers(1, 50)) for t in draw(st.lists(st.sampled_from(types), min_size=1, unique=True))}
        for t, n in limits.items():
            used[t] += n
        strategy = draw(st.sampled_from(["RESERVE", "LEND", "LEND_AND_BORROW"]))
        share: dict[str, Any] = {"name": f"s-{i}", "capacity_limits": limits, "strategy": strategy}
        if strategy == "LEND_AND_BORROW" and draw(st.booleans()):
            share["borrow_limit"] = draw(st.integers(-1, 1000))
        if draw(st.booleans()):
            share.update(in_share_preemption=True, in_share_preemption_after_seconds=0)
        share["state"] = draw(st.sampled_from(["ENABLED", "DISABLED"]))
        shares.append(share)
    capacity = {t: max(1, used[t]) + draw(st.integers(0, 5)) for t in types}
    return {"pool": {"capacity": capacity}, "shares": shares}


def aws_fields(config: QuotaConfig) -> Any:
    """What AWS can express of a configuration."""
    return (
        dict(config.pool.capacity),
        [
            (
                s.name,
                dict(s.capacity_limits),
                s.strategy,
                s.effective_borrow_limit if s.borrows else None,
                s.in_share_preemption,
                s.in_share_preemption_after_seconds if s.in_share_preemption else None,
                s.state,
            )
            for s in config.shares
        ],
    )


@settings(max_examples=150, deadline=None)
@given(raw=expressible())
def test_import_of_what_plan_applies_keeps_every_field_aws_can_express(raw: dict[str, Any]) -> None:
    original = parse_config(raw)
    want = desired(original)
    assert want.kept == () and want.refused == ()
    on_aws = state_of(original)  # what AWS returns once the plan's calls are made
    assert plan(original, on_aws).changes == ()
    _, imported = import_config(on_aws)
    assert aws_fields(imported) == aws_fields(original)
    assert plan(imported, on_aws).changes == ()
    # and from nothing: the plan's creations carry exactly the shares AWS then returns
    empty = queue(dict(original.pool.capacity), [])
    created = [dict(c.request or {}) for c in plan(original, empty).calls]
    assert [{k: v for k, v in r.items() if k != "jobQueue"} for r in created] == [
        {k: v for k, v in s.items() if k not in ("quotaShareArn", "jobQueueArn", "status")} for s in shares_of(original)
    ]


def test_the_inexpressible_example_lists_each_setting_once() -> None:
    kept, refused = expressibility(load_config(INEXPRESSIBLE))
    assert [n.path for n in kept] == ["shares[0].max_priority", "shares[1].require_checkpoint", f"instance_types.{G5}"]
    assert [n.path for n in refused] == [
        "shares[0].in_share_preemption_after_seconds",
        "shares[0].preemption_protection_seconds",
        "shares[0].starvation_reservation",
        "shares[1].max_running_jobs",
        "pool.training_plans[0].arn",
    ]
