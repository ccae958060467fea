"""The core's typed inputs: ``handle`` reports every refusal as one Rejected decision, and each
input survives the service's input log unchanged (``to_row`` then ``from_row``)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_quota.core.config import parse_config
from airflow_quota.core.cycle import QuotaScheduler
from airflow_quota.core.inputs import (
    AttemptFailed,
    AttemptRunning,
    AttemptStopped,
    AttemptSucceeded,
    CapacityErrorReported,
    ConfigurationApplied,
    CycleDue,
    Input,
    JobCancelled,
    JobSubmitted,
    PrioritySet,
    ProviderAvailability,
    handle,
)
from airflow_quota.core.model import JobRequest, Placed, Rejected, Submitted
from airflow_quota.service.inputs import apply, from_row, refusal, replay, to_row
from tests.builders import quota, share

CONFIG = parse_config(quota({"ml.g5.xlarge": 4}, share("team", {"ml.g5.xlarge": 2}, max_priority=10)))


def request(name: str = "j1", count: int = 1, share_name: str = "team") -> JobRequest:
    return JobRequest.model_validate(
        {"name": name, "share": share_name, "preferences": [{"instance_type": "ml.g5.xlarge", "count": count}]}
    )


def test_a_submission_is_taken_in_and_placed_by_the_next_cycle() -> None:
    scheduler = QuotaScheduler(CONFIG)
    assert [type(d) for d in handle(scheduler, JobSubmitted(7, request()), 0.0)] == [Submitted]
    placed = handle(scheduler, CycleDue(), 0.0)
    assert [type(d) for d in placed] == [Placed]
    assert scheduler.by_ref(7).name == "j1"


def test_a_refused_submission_is_one_rejected_decision_and_changes_nothing() -> None:
    scheduler = QuotaScheduler(CONFIG)
    decisions = handle(scheduler, JobSubmitted(1, request(share_name="nobody")), 0.0)
    rejected = refusal(decisions)
    assert rejected is not None and rejected.job == "j1" and rejected.request == "submit"
    assert "nobody" in rejected.error
    assert not scheduler.state.jobs


@pytest.mark.parametrize(
    ("change", "request_name"),
    [(PrioritySet(1, 11), "set_priority"), (JobCancelled(1), "cancel")],
)
def test_a_refused_change_names_the_request(change: Input, request_name: str) -> None:
    scheduler = QuotaScheduler(CONFIG)
    handle(scheduler, JobSubmitted(1, request()), 0.0)
    if isinstance(change, JobCancelled):
        handle(scheduler, JobCancelled(1), 1.0)  # a second cancel is refused: already FAILED
    decisions = handle(scheduler, change, 2.0)
    assert len(decisions) == 1 and isinstance(decisions[0], Rejected)
    assert decisions[0].request == request_name and decisions[0].job == "j1"


def test_inputs_before_the_first_configuration_are_refused_loudly() -> None:
    with pytest.raises(LookupError, match="no quota configuration"):
        apply(None, CycleDue(), 0.0)
    scheduler, decisions = apply(None, ConfigurationApplied(CONFIG, 1), 0.0)
    assert scheduler is not None and decisions == []


def test_unknown_log_kinds_name_the_field() -> None:
    with pytest.raises(ValueError, match="kind: unknown input kind 'launch'"):
        from_row("launch", {"job_id": 1})


refs = st.integers(min_value=1, max_value=10**9)
attempts = st.integers(min_value=1, max_value=50)
instants = st.floats(min_value=0, max_value=1e10, allow_nan=False)
reasons = st.text(max_size=40)
INPUTS = st.one_of(
    st.builds(CycleDue),
    st.builds(ConfigurationApplied, st.just(CONFIG), st.one_of(st.none(), refs)),
    st.builds(JobSubmitted, refs, st.sampled_from([request("a"), request("b", 2)])),
    st.builds(PrioritySet, refs, st.integers(min_value=0, max_value=9999)),
    st.builds(JobCancelled, refs),
    st.builds(AttemptRunning, refs, attempts, instants),
    st.builds(AttemptSucceeded, refs, attempts),
    st.builds(AttemptFailed, refs, attempts, reasons),
    st.builds(AttemptStopped, refs, attempts),
    st.builds(CapacityErrorReported, refs, attempts, st.floats(min_value=0, max_value=1e6)),
    st.builds(ProviderAvailability, st.sampled_from(["ml.g5.xlarge", "ml.p5.48xlarge"]), st.none() | attempts),
)


@given(INPUTS)
def test_every_input_survives_the_log(item: Input) -> None:
    assert from_row(*to_row(item)) == item


def test_a_replayed_log_rebuilds_the_same_state() -> None:
    rows = [
        (*to_row(ConfigurationApplied(CONFIG, 1)), 0.0),
        (*to_row(JobSubmitted(1, request("a", 2))), 0.0),
        (*to_row(JobSubmitted(2, request("b", 2))), 0.0),
        (*to_row(CycleDue()), 0.0),
        (*to_row(AttemptRunning(1, 1, 5.0)), 5.0),
        (*to_row(AttemptSucceeded(1, 1)), 60.0),
        (*to_row(CycleDue()), 60.0),
    ]
    scheduler = replay(rows)
    assert scheduler is not None
    states = {job.name: job.state.value for job in scheduler.state.jobs.values()}
    assert states == {"a": "SUCCEEDED", "b": "SCHEDULED"}
