"""Every decision names the input that caused it (``quota_events.input_id``), through the store to
a job's story on the Quotas page and in the API (``dashboard.job_detail``).

Scenarios with submissions, priority changes, cancels, preemptions and retries are replayed
through the quota service; then every decision but a refusal names a logged input of the same
instant, of a kind that can cause it, and each job's story says which input each line came from.
"""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, select

from airflow_quota.sim.scenario import load_scenario
from airflow_quota.store.dashboard import job_detail
from airflow_quota.store.models import EventRow, Input, JobRow
from benchmarks.service_replay import ServiceReplay
from tests.conftest import SCENARIOS

CAUSES = {
    "SUBMITTED": {"submit"},
    "PRIORITY_CHANGED": {"set_priority"},
    "SUCCEEDED": {"finished"},
    "REQUEUED": {"finished"},
    "PLACED": {"cycle", "stopped", "finished", "running", "capacity_error", "config", "provider", "cancel"},
    "PREEMPTED": {"cycle"},
}
"""The kinds of input each decision type may come from; a type not here may come from any."""

WORKLOADS = [
    "s01_reject_disabled_share",
    "s15_preemption_retries",
    "s16_retry_on",
    "s21_priority_changes",
    "s40_aws_walkthrough",
]


@pytest.mark.parametrize("name", WORKLOADS)
def test_every_decision_names_the_input_that_caused_it(name: str, engine: Engine) -> None:
    replay = ServiceReplay(load_scenario(next(p for p in SCENARIOS if p.stem == name)), engine)
    assert replay.run(max_steps=100_000), "the replay did not end"
    with replay.store.sessions() as session:
        events = session.execute(
            select(EventRow.type, EventRow.at, EventRow.job, EventRow.input_id, Input.kind, Input.at)
            .outerjoin(Input, Input.id == EventRow.input_id)
            .order_by(EventRow.id)
        ).all()
        job_ids = list(session.scalars(select(JobRow.id)))
    assert job_ids, "no job was stored"
    assert events, "nothing was decided"
    for kind, at, job, input_id, input_kind, input_at in events:
        if kind == "REJECTED":
            assert input_id is None, f"a refusal names input {input_id}: a refused input is not logged"
            continue
        assert input_id is not None, f"{kind} of {job} at {at} names no input"
        assert input_kind is not None, f"{kind} of {job} names input {input_id}, which is not in the log"
        assert input_at == at, f"{kind} of {job} at {at} names an input of another instant ({input_at})"
        assert input_kind in CAUSES.get(kind, {input_kind}), f"{kind} of {job} caused by a {input_kind!r} input"
    for job_id in job_ids:
        detail = job_detail(replay.store, job_id)
        assert detail is not None and detail.story
        assert all("[input #" in line for line in detail.story if "refused" not in line), detail.story
