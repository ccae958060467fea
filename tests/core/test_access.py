"""A share's ``access`` rules (``core.access``): glob matching, the refusals' wording, and
the configuration's validation of them."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_quota.core.access import (
    AccessRule,
    Actor,
    ShareAccess,
    access_refusal,
    check_priority_access,
    check_submit_access,
)
from airflow_quota.core.config import QuotaConfig, parse_config
from airflow_quota.exceptions import InvalidInput, PriorityChangeDenied, SubmissionDenied

TRAIN_A = Actor.of_dag("team_a_train", tags=["team-a", "nightly"], bundle="team-a-repo")
TRAIN_B = Actor.of_dag("team_b_train", tags=["team-b"], bundle="dags-folder")
ALICE = Actor(user="alice")


@pytest.mark.parametrize(
    ("rule", "actor", "allowed"),
    [
        ({"dags": ["team_a_*"]}, TRAIN_A, True),
        ({"dags": ["team_a_*"]}, TRAIN_B, False),
        ({"dags": ["team_?_train"]}, TRAIN_B, True),
        ({"dags": ["team_[ab]_train"]}, TRAIN_B, True),
        ({"dags": ["team_[!b]_train"]}, TRAIN_B, False),
        ({"dags": ["TEAM_A_*"]}, TRAIN_A, False),
        ({"dags": ["team_a"]}, TRAIN_A, False),
        ({"tags": ["nightly"]}, TRAIN_A, True),
        ({"tags": ["team-*"]}, TRAIN_B, True),
        ({"tags": ["team-a"]}, TRAIN_B, False),
        ({"bundles": ["team-a-*"]}, TRAIN_A, True),
        ({"bundles": ["team-a-*"]}, TRAIN_B, False),
        ({"dags": ["nobody"], "tags": ["nothing"], "bundles": ["dags-folder"]}, TRAIN_B, True),
        ({"users": ["ali*"]}, ALICE, True),
        ({"users": ["alice"]}, Actor(user="alice2"), False),
        ({"users": ["alice"]}, Actor.of_dag("other", user="alice"), True),
        ({"dags": ["*"]}, ALICE, False),
        ({"users": ["*"]}, TRAIN_A, False),
        ({"dags": ["*"], "users": ["*"]}, Actor(), False),
    ],
    ids=[
        "a DAG id matching the glob",
        "a DAG id not matching it",
        "? matches one character",
        "[ab] matches one of them",
        "[!b] excludes one",
        "matching is case-sensitive",
        "a glob without * matches the whole id only",
        "any one of the DAG's tags is enough",
        "a tag glob",
        "a tag the DAG does not have",
        "a bundle glob",
        "another bundle",
        "the lists are alternatives: a bundle match is enough",
        "a user glob",
        "a user name must match whole",
        "a run triggered by a listed user passes as that user",
        "a user is no DAG",
        "a DAG is no user",
        "nobody known passes no rule, not even *",
    ],
)
def test_a_rule_allows_an_actor_when_any_name_matches_its_list(
    rule: dict[str, Any], actor: Actor, allowed: bool
) -> None:
    assert AccessRule.model_validate(rule).allows(actor) is allowed


def test_a_share_without_a_rule_is_open_to_everyone() -> None:
    submit_only = ShareAccess.model_validate({"submit": {"dags": ["team_a_*"]}})
    for access in (None, ShareAccess(), submit_only):
        assert access_refusal("team-a", access, "set_priority", Actor()) is None
    assert access_refusal("team-a", None, "submit", Actor()) is None
    assert access_refusal("team-a", submit_only, "submit", TRAIN_A) is None


def test_a_refused_submission_names_the_share_its_rule_and_who_asked() -> None:
    access = ShareAccess.model_validate({"submit": {"dags": ["team_a_*"], "tags": ["team-a"], "bundles": ["a-*"]}})
    with pytest.raises(SubmissionDenied) as denied:
        check_submit_access("team-a", access, TRAIN_B)
    assert str(denied.value) == (
        "access.submit: share 'team-a' takes submissions only from DAGs 'team_a_*', DAGs tagged 'team-a' "
        "or DAGs of bundles 'a-*'; asked by DAG 'team_b_train' (tags 'team-b'; bundle 'dags-folder'): "
        "no pattern matches"
    )


@pytest.mark.parametrize(
    ("actor", "who"),
    [
        (Actor(user="bob"), "user 'bob'"),
        (Actor.of_dag("nightly", user="bob"), "DAG 'nightly' (no tags) and user 'bob'"),
        (Actor(), "no DAG and no known user"),
    ],
    ids=["a user", "a run's override: its DAG and who triggered it", "nobody known"],
)
def test_a_refused_priority_change_names_the_share_its_rule_and_who_asked(actor: Actor, who: str) -> None:
    access = ShareAccess.model_validate({"set_priority": {"users": ["alice", "oncall-*"]}})
    with pytest.raises(PriorityChangeDenied) as denied:
        check_priority_access("team-a", access, actor)
    assert str(denied.value) == (
        f"access.set_priority: share 'team-a' lets only users 'alice', 'oncall-*' change its jobs' priorities; "
        f"asked by {who}: no pattern matches"
    )


# -- in quota.yaml -----------------------------------------------------------------------------


def config_with(access: Any) -> dict[str, Any]:
    return {
        "pool": {"capacity": {"ml.g5.xlarge": 2}},
        "shares": [
            {"name": "team-a", "capacity_limits": {"ml.g5.xlarge": 1}, "access": access},
            {"name": "open", "capacity_limits": {"ml.g5.xlarge": 1}},
        ],
    }


def test_access_rules_survive_the_stored_form_of_a_configuration() -> None:
    access = {"submit": {"dags": ["team_a_*"], "bundles": ["team-a-repo"]}, "set_priority": {"users": ["alice"]}}
    config = parse_config(config_with(access))
    stored = config.model_dump(mode="json", exclude_defaults=True)  # what QuotaStore.apply_config keeps
    assert stored["shares"][0]["access"] == access
    assert "access" not in stored["shares"][1]
    again = QuotaConfig.model_validate(stored)
    assert again == config and again.shares[1].access is None


@pytest.mark.parametrize(
    ("access", "problems"),
    [
        (
            {"submit": {}},
            [
                "shares[0].access.submit: list at least one pattern in dags, tags, bundles or users (leave the "
                "rule out to allow everyone; set the share's state to DISABLED to allow nobody)"
            ],
        ),
        (
            {"submit": {"dags": "team_a_*"}},
            ["shares[0].access.submit.dags: a list of glob patterns: write ['team_a_*'], not 'team_a_*'"],
        ),
        ({"submit": {"dag": ["team_a_*"]}}, ["shares[0].access.submit.dag: unknown key"]),
        ({"sumbit": {"dags": ["a"]}}, ["shares[0].access.sumbit: unknown key"]),
        (
            {"set_priority": {"users": ["", "ok", "a\nb", 7]}},
            [
                "shares[0].access.set_priority.users[0]: a pattern must not be empty or blank",
                "shares[0].access.set_priority.users[2]: a pattern is one line of printable characters, got 'a\\nb'",
                "shares[0].access.set_priority.users[3]: Input should be a valid string",
            ],
        ),
        (
            {"submit": {"tags": ["t" * 300_000]}},
            ["shares[0].access.submit.tags[0]: at most 250 characters (got 300000)"],
        ),
        (
            {"submit": {"bundles": ["b"] * 101}},
            ["shares[0].access.submit.bundles: at most 100 patterns (got 101)"],
        ),
        (["submit"], ["shares[0].access: Input should be a valid dictionary or instance of ShareAccess"]),
    ],
    ids=[
        "an empty rule",
        "a lone string where a list belongs",
        "a misspelt list",
        "a misspelt rule",
        "blank, multi-line and non-text patterns, each named",
        "a pattern beyond its limit, not echoed",
        "too many patterns",
        "access is not a mapping",
    ],
)
def test_bad_access_rules_are_refused_naming_the_field(access: Any, problems: list[str]) -> None:
    with pytest.raises(InvalidInput) as refused:
        parse_config(config_with(access))
    assert [str(p) for p in refused.value.problems] == problems
