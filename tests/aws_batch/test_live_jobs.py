"""The live delegated jobs a leader keeps between rounds, and the attempt rows a look writes
(``aws_batch/live_jobs.py``); pure."""

from __future__ import annotations

from typing import Any

from airflow_quota.aws_batch.live_jobs import LiveJobs, after_look, attempt_rows
from airflow_quota.aws_batch.service_jobs import KnownJob, follow, service_job
from airflow_quota.core.model import Entry, JobState

G5 = "ml.g5.xlarge"


def job(job_id: int = 7, state: JobState = JobState.RUNNABLE, **fields: Any) -> KnownJob:
    values: dict[str, Any] = {
        "job_id": job_id, "name": f"j{job_id}", "share": "a", "state": state, "attempts": 0, "preemptions": 0,
        "runnable_since": 0.0, "wait_seconds": 0.0, "types": (G5,), **fields,
    }  # fmt: skip
    return KnownJob(**values)


def test_each_shares_use_follows_its_jobs_and_an_ended_job_leaves() -> None:
    live = LiveJobs([("s1", job(1, JobState.RUNNING, entry=Entry(G5, 2)), 10.0), ("s2", job(2), 10.0)])
    assert (live.use("a", G5), len(live)) == (2, 2)
    live.put("s2", job(2, JobState.SCHEDULED, entry=Entry(G5, 3)), 20.0)
    assert live.use("a", G5) == 5
    live.put("s1", job(1, JobState.SUCCEEDED, entry=Entry(G5, 2)), 30.0)
    assert (live.use("a", G5), len(live), "s1" in live) == (3, 1, False)
    assert [sid for sid, _ in live.unchanged_since("a", 25.0)] == ["s2"]
    assert list(live.unchanged_since("a", 20.0)) == []


def summary(status: str, **fields: Any) -> dict[str, Any]:
    return {"jobId": "s", "jobName": "j", "serviceJobType": "SAGEMAKER_TRAINING", "status": status, **fields}


def test_a_placement_seen_running_is_one_row_inserted_running_with_its_training_job() -> None:
    arn = "arn:aws:sagemaker:us-east-1:123456789012:training-job/aq-7-j-x"
    seen = service_job(
        summary("RUNNING", capacityUsage=[{"capacityUnit": G5, "quantity": 1}], scheduledAt=5_000, startedAt=6_000,
                latestAttempt={"serviceResourceId": {"name": "TrainingJobArn", "value": arn}})
    )  # fmt: skip
    followed = follow(job(), seen, now=10.0)
    inserted, changed = attempt_rows(job(), followed)
    assert changed == []
    [row] = inserted
    assert (row["number"], row["backend"], row["status"], row["running_since"], row["external_name"]) == (
        1, "aws_batch", "RUNNING", 6.0, "aq-7-j-x"
    )  # fmt: skip
    placed = after_look(job(), followed)
    assert (placed.state, placed.entry, placed.attempts, placed.running_since) == (
        JobState.RUNNING,
        Entry(G5, 1),
        1,
        6.0,
    )


def test_preempted_and_placed_again_between_looks_ends_one_attempt_and_inserts_the_next() -> None:
    running = job(state=JobState.RUNNING, attempts=1, entry=Entry(G5, 1))
    seen = service_job(
        {**summary("RUNNING", capacityUsage=[{"capacityUnit": G5, "quantity": 1}], scheduledAt=9_000),
         "jobQueue": "q", "startedAt": 0, "preemptionSummary": {"preemptedAttemptCount": 1}}
    )  # fmt: skip
    inserted, changed = attempt_rows(running, follow(running, seen, now=10.0))
    assert [(c["number"], c["status"]) for c in changed] == [(1, "STOPPED")]
    assert [(r["number"], r["status"]) for r in inserted] == [(2, "RUNNING")]  # placed again, and running


def test_a_job_that_never_held_capacity_ends_no_attempt() -> None:
    seen = service_job({**summary("FAILED", statusReason="Terminated"), "jobQueue": "q", "startedAt": 0})
    failed = follow(job(cancel_asked=True), seen, now=10.0)
    assert attempt_rows(job(cancel_asked=True), failed) == ([], [])
