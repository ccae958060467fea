"""``airflow-quota compare --what-if FIELD=VALUE``: the quota file replayed with share fields
changed on every share, as one more policy (``what-if``) beside the others, and bad input
refused under ``--what-if`` with exit status 2."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from airflow_quota.core.config import Strategy, load_config
from airflow_quota.exceptions import InvalidInput
from airflow_quota.sim.compare import WHAT_IF, what_if_changes, what_if_policy
from tests.conftest import cli

DATA = Path(__file__).resolve().parent / "data"
TRACE = f"itp:{DATA / 'itp'}"
QUOTA = DATA / "itp-quota.yaml"


def test_the_changes_go_on_every_share_and_leave_the_quota_file_as_it_was() -> None:
    config = load_config(QUOTA)
    changes = what_if_changes(["starvation_after_seconds=86400", "starvation_reservation=true", "strategy=LEND"])
    assert changes == {"starvation_after_seconds": 86400, "starvation_reservation": True, "strategy": "LEND"}
    policy = what_if_policy(config, changes)
    assert policy.name == WHAT_IF
    assert not policy.open_pool
    for share in policy.config.shares:
        assert (share.starvation_after_seconds, share.starvation_reservation) == (86400, True)
        assert share.strategy is Strategy.LEND
    assert [s.capacity_limits for s in policy.config.shares] == [s.capacity_limits for s in config.shares]
    assert all(s.strategy is Strategy.LEND_AND_BORROW for s in config.shares)  # the original is untouched
    assert policy.description == (
        "the quota configuration with starvation_after_seconds=86400, starvation_reservation=True, "
        "strategy=LEND on every share"
    )


def test_a_field_given_twice_keeps_its_last_value() -> None:
    assert what_if_changes(["max_priority=5", "max_priority=7"]) == {"max_priority": 7}


def test_every_share_reserve_replays_exactly_as_the_static_partition() -> None:
    """``strategy=RESERVE`` on every share is what the built-in static policy is: the what-if
    must give its figures to the last digit (the same simulator on the same configuration)."""
    run = cli(
        "compare",
        "--trace",
        TRACE,
        "--quota",
        str(QUOTA),
        "--policy",
        "static",
        "--what-if",
        "strategy=RESERVE",
        "--json",
    )
    assert run.code == 0, run.stderr
    document = run.json()
    assert document["compared"] == ["static", WHAT_IF]
    static, what_if = document["policies"]["static"], document["policies"][WHAT_IF]
    assert what_if["description"] == "the quota configuration with strategy=RESERVE on every share"
    assert what_if["pool"] == static["pool"]
    assert what_if["shares"] == static["shares"]
    assert what_if["alerts"] == static["alerts"]
    assert all(share["borrowed_gpu_hours"] == 0 for share in what_if["shares"].values())
    assert what_if["pool"]["rejected"] == 1  # a job larger than its RESERVE share's limit, as under static
    assert "[2/2] what-if: 42 jobs replayed" in run.stderr


def test_the_what_if_joins_the_default_policies_and_changes_what_it_says() -> None:
    """Every share lending only: nobody borrows, where the quota file as given borrows."""
    run = cli("compare", "--trace", TRACE, "--quota", str(QUOTA), "--what-if", "strategy=LEND", "--json")
    assert run.code == 0, run.stderr
    document = run.json()
    assert document["compared"] == ["shares", "static", "open", WHAT_IF]
    borrowed = document["figures"]["borrowed_lent"]
    assert sum(s["borrowed_gpu_hours"] for s in borrowed["shares"].values()) > 0
    assert sum(s["borrowed_gpu_hours"] for s in borrowed[WHAT_IF].values()) == 0
    assert set(document["figures"]["protection"]) == {"shares", "static", WHAT_IF}  # against the open pool


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--what-if", "starvation_after_seconds"], "--what-if: 'starvation_after_seconds' must be FIELD=VALUE"),
        (["--what-if", "=5"], "--what-if: '=5' must be FIELD=VALUE"),
        (["--what-if", "colour=blue"], "--what-if: 'colour' is not a share field it can change (strategy, "),
        (["--what-if", "capacity_limits=4"], "--what-if: 'capacity_limits' is not a share field it can change"),
        (["--what-if", "starvation_after_seconds=-1"], "--what-if: starvation_after_seconds=-1: "),
        (["--what-if", "strategy=SOMETIMES"], "--what-if: strategy='SOMETIMES': Input should be 'RESERVE'"),
        (["--what-if", "max_priority=[1, 2]"], "--what-if: 'max_priority=[1, 2]': the value must be a single value"),
    ],
    ids=["no value", "no field", "an unknown field", "the limits", "a value out of range", "a bad choice", "a list"],
)
def test_bad_what_ifs_are_refused_before_any_run(args: list[str], expected: str) -> None:
    run = cli("compare", "--trace", TRACE, "--quota", str(QUOTA), *args)
    assert run.code == 2
    assert "Traceback" not in run.stderr
    assert expected in run.stderr, run.stderr
    assert "replayed" not in run.stderr
    assert run.stdout == ""


def test_a_value_refused_by_every_share_is_one_problem_not_one_per_share() -> None:
    with pytest.raises(InvalidInput) as refused:
        what_if_policy(load_config(QUOTA), {"preemption_grace_seconds": -5})
    assert [str(p) for p in refused.value.problems] == [
        "--what-if: preemption_grace_seconds=-5: Input should be greater than or equal to 0"
    ]


def test_a_policy_file_named_what_if_cannot_be_compared_with_the_what_if(tmp_path: Path) -> None:
    other = tmp_path / "what-if.yaml"
    other.write_text(yaml.safe_dump(yaml.safe_load(QUOTA.read_text())))
    run = cli("compare", "--trace", TRACE, "--quota", str(QUOTA), "--policy", str(other), "--what-if", "max_priority=5")
    assert run.code == 2
    assert "--policy: a policy named 'what-if' is already compared" in run.stderr
    assert "Traceback" not in run.stderr
