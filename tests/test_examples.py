"""The examples shipped in the repository are the acceptance walkthrough, unchanged."""

from __future__ import annotations

from tests.conftest import ROOT, SHARED, cli


def test_example_walkthrough_replays_the_acceptance_walkthrough() -> None:
    example = cli("simulate", str(ROOT / "examples" / "walkthrough.yaml"), "--json")
    acceptance = cli("simulate", str(SHARED / "scenarios" / "aws-walkthrough.yaml"), "--json")
    assert example.code == acceptance.code == 0
    assert example.json()["events"] == acceptance.json()["events"]
    assert example.json()["jobs"] == acceptance.json()["jobs"]
