"""The walkthrough shipped in examples/ (``walkthrough.yaml`` on ``quota.yaml``, what a user
runs first) is the AWS walkthrough the scenario tests check (tests/scenarios/
s40_aws_walkthrough.yaml, with its ``expect`` block): both make the same decisions."""

from __future__ import annotations

from tests.conftest import ROOT, cli

WALKTHROUGH = ROOT / "tests" / "scenarios" / "s40_aws_walkthrough.yaml"


def test_example_walkthrough_replays_the_checked_walkthrough() -> None:
    example = cli("simulate", str(ROOT / "examples" / "walkthrough.yaml"), "--json")
    checked = cli("simulate", str(WALKTHROUGH), "--json")
    assert example.code == checked.code == 0, example.stderr + checked.stderr
    assert example.json()["events"] == checked.json()["events"]
    assert example.json()["jobs"] == checked.json()["jobs"]
