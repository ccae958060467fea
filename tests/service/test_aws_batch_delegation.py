"""A quota scheduler that lets AWS Batch place (``service/delegation.py``), against botocore's
Stubber answering as AWS documents (every request checked against ``expected_params`` and the
Batch model), on SQLite and PostgreSQL.

The walkthrough is AWS's own (the SageMaker SDK's quota-management notebook, reference 1.4):
three shares of one ``ml.g5.xlarge`` each; qs1's high job runs on its own, its medium one borrows
qs2's idle instance, its low one waits (qs3 reserves); a job of qs2 takes the lent instance back
(qs1-med preempted across shares); qs1-low raised above qs1-high preempts it in its share."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.stub import Stubber
from sqlalchemy import Engine, select

from airflow_quota.aws_batch.calls import BatchCalls
from airflow_quota.aws_batch.service_jobs import CANCEL_REASON, client_token
from airflow_quota.core.model import JobRequest
from airflow_quota.service.clock import ManualClock
from airflow_quota.service.delegation import AwsBatchDelegation
from airflow_quota.service.metrics import QuotaMetrics
from airflow_quota.store.models import Attempt, EventRow, JobRow, Preemption, Request
from airflow_quota.store.repository import QuotaStore
from airflow_quota.store.views import read_view
from tests.aws_batch.aws import G5, QUEUE, TRAINING, batch_client
from tests.conftest import ROOT, cli
from tests.service.stats_recording import Recording

WALKTHROUGH = {
    "pool": {"capacity": {G5: 3}},
    "shares": [
        {"name": "qs1", "capacity_limits": {G5: 1}, "strategy": "LEND_AND_BORROW", "borrow_limit": 200,
         "in_share_preemption": True},
        {"name": "qs2", "capacity_limits": {G5: 1}, "strategy": "LEND"},
        {"name": "qs3", "capacity_limits": {G5: 1}, "strategy": "RESERVE"},
    ],
}  # fmt: skip
START = 1_765_000_000.0
Page = tuple[str, list[dict[str, Any]], list[tuple[str, str, dict[str, Any]]]]
"""One share's page in a round: its status, the jobs AWS lists, the descriptions it then asks
(job, AWS status, further fields)."""
ROUND = 10.0


class Aws:
    """The stubbed Batch client's answers, and the quota scheduler that calls it."""

    def __init__(self, engine: Engine, stub: Stubber, client: Any) -> None:
        self.clock = ManualClock(START)
        self.store = QuotaStore(engine, clock=self.clock.now)
        self.stub = stub
        self.calls = BatchCalls(client)
        self.stats = Recording()
        metrics = QuotaMetrics(self.stats, tagged=True, gauge_seconds=0)
        self.service = AwsBatchDelegation(
            engine, self.calls, QUEUE, clock=self.clock, mirror_seconds=ROUND, metrics=metrics, submit_workers=1
        )  # one submission at a time: the Stubber answers calls in the order it was given them
        self.service.recover()
        self.ids: dict[str, str] = {}

    def submit(self, name: str, share: str, priority: int, backend: str = "sagemaker") -> JobRow:
        checkpoints = {"checkpoint_interval": 300} if share == "qs1" else {}  # as examples/walkthrough.yaml
        request = JobRequest(
            name=name, share=share, priority=priority, preferences=[{"instance_type": G5, "count": 1}], **checkpoints
        )
        row = self.store.submit(request, backend, training=TRAINING)
        if backend == "sagemaker":
            self.expect_submit(row)
        return row

    def expect_submit(self, row: JobRow) -> None:
        aws_id = f"svc-{row.name}"
        self.ids[row.name] = aws_id
        payload = {**TRAINING, "TrainingJobName": f"aq-{row.id}-{row.name}"}
        payload["ResourceConfig"] = {
            "VolumeSizeInGB": 50,
            "InstancePreferences": [{"InstanceType": G5, "InstanceCount": 1}],
        }
        self.stub.add_response(
            "submit_service_job",
            {
                "jobId": aws_id,
                "jobName": f"aq-{row.id}-{row.name}",
                "jobArn": f"arn:aws:batch:us-east-1:1:service-job/{aws_id}",
            },
            {
                "jobName": f"aq-{row.id}-{row.name}",
                "jobQueue": QUEUE,
                "serviceJobType": "SAGEMAKER_TRAINING",
                "serviceRequestPayload": json.dumps(payload, sort_keys=True),
                "quotaShareName": row.share,
                "schedulingPriority": row.priority,
                "retryStrategy": {"attempts": 1},
                "clientToken": client_token(row.id, row.name, row.submitted_at),
                "tags": {"airflow-quota:job-id": str(row.id), "airflow-quota:share": row.share},
            },
        )

    def summary(self, name: str, status: str, at: float | None = None, **fields: Any) -> dict[str, Any]:
        """A ListServiceJobs item; a job holding capacity was scheduled ``at`` (seconds after START)."""
        item = {"jobId": self.ids[name], "jobName": name, "serviceJobType": "SAGEMAKER_TRAINING", "status": status}
        if at is not None:
            item.update(capacityUsage=[{"capacityUnit": G5, "quantity": 1.0}], scheduledAt=int((START + at) * 1000))
        return {**item, **fields}

    def at(self, seconds: float) -> None:
        """The clock to ``seconds`` after START."""
        self.clock.advance_to(START + seconds)

    def sweep_on(
        self,
        scheduled: dict[str, list[dict[str, Any]]],
        starting: dict[str, list[dict[str, Any]]],
        running: dict[str, list[dict[str, Any]]],
        use: dict[str, int],
    ) -> None:
        """The rest of a sweep begun with RUNNABLE: a round for each other live status."""
        for status, pages in (("SCHEDULED", scheduled), ("STARTING", starting), ("RUNNING", running)):
            self.round({share: (status, jobs, []) for share, jobs in pages.items()}, use)

    def mirrored_events(self) -> list[dict[str, Any]]:
        """The events the delegating scheduler wrote, their times from START."""
        with self.store.sessions() as session:
            records = session.scalars(select(EventRow.record).order_by(EventRow.id)).all()
        return [{**record, "t": record["t"] - START} for record in records]

    def expect_page(self, share: str, status: str, jobs: list[dict[str, Any]]) -> None:
        params = {
            "jobQueue": QUEUE,
            "jobStatus": status,
            "maxResults": 100,
            "filters": [{"name": "QUOTA_SHARE_NAME", "values": [share]}],
        }
        self.stub.add_response("list_service_jobs", {"jobSummaryList": jobs}, params)

    def expect_description(self, name: str, status: str, **fields: Any) -> None:
        answer = {**self.summary(name, status), "jobQueue": QUEUE, "startedAt": int(START * 1000), **fields}
        self.stub.add_response("describe_service_job", answer, {"jobId": self.ids[name]})

    def expect_snapshot(self, use: dict[str, int]) -> None:
        answer = {
            "queueUtilization": {
                "quotaShareUtilization": {
                    "topCapacityUtilization": [
                        {"quotaShareName": share, "capacityUsage": [{"capacityUnit": G5, "quantity": float(n)}]}
                        for share, n in use.items()
                    ]
                }
            }
        }
        self.stub.add_response("get_job_queue_snapshot", answer, {"jobQueue": QUEUE})

    def round(self, pages: dict[str, Page], use: dict[str, int]) -> None:
        """One round of the mirror: for each share (in name order) one page of its sweep and the
        descriptions it calls for, then the snapshot; then the step, and the clock moves on."""
        for share, (status, jobs, described) in sorted(pages.items()):
            self.expect_page(share, status, jobs)
            for name, aws_status, fields in described:
                self.expect_description(name, aws_status, **fields)
        self.expect_snapshot(use)
        self.step()

    def step(self) -> None:
        self.service.step()
        self.stub.assert_no_pending_responses()
        self.clock.advance_to(self.clock.now() + ROUND)

    def job(self, name: str) -> JobRow:
        row = self.store.job_by_name(name)
        assert row is not None
        return row


@pytest.fixture
def aws(engine: Engine) -> Iterator[Aws]:
    client = batch_client()
    with Stubber(client) as stub:
        world = Aws(engine, stub, client)
        world.store.apply_config(WALKTHROUGH)
        yield world


def test_the_aws_walkthrough_mirrored_as_simulate_plays_it(aws: Aws, engine: Engine) -> None:
    """The events of ``examples/walkthrough.yaml`` at its times, AWS answering as its notebook
    shows; at t=1800 what the user sees (each job's events, state, attempts, preemptions)
    is what ``airflow-quota simulate`` of that scenario says, but who preempted (AWS does not
    say) and the reasons' words."""
    for name, priority in (("qs1-high", 3), ("qs1-med", 2), ("qs1-low", 1)):
        aws.submit(name, "qs1", priority)
    # AWS places high on qs1's own instance and med on qs2's idle one; low waits (qs3 reserves)
    aws.round({"qs1": ("RUNNABLE", [aws.summary("qs1-low", "RUNNABLE")], [])}, {"qs1": 2})
    assert {aws.job(n).state for n in ("qs1-high", "qs1-med", "qs1-low")} == {"RUNNABLE"}
    assert aws.job("qs1-high").service_job_id == "svc-qs1-high"
    placed = [aws.summary("qs1-high", "SCHEDULED", at=0), aws.summary("qs1-med", "SCHEDULED", at=0)]
    aws.round({"qs1": ("SCHEDULED", placed, [])}, {"qs1": 2})
    aws.round({"qs1": ("STARTING", [], [])}, {"qs1": 2})
    aws.round({"qs1": ("RUNNING", [aws.summary(n, "RUNNING", at=0) for n in ("qs1-high", "qs1-med")], [])}, {"qs1": 2})
    high, med, low = aws.job("qs1-high"), aws.job("qs1-med"), aws.job("qs1-low")
    assert (high.state, high.borrowed, med.state, med.borrowed, low.state) == ("RUNNING", 0, "RUNNING", 1, "RUNNABLE")
    assert [(t.used, t.borrowed, t.runnable) for t in _view(engine)["qs1"].types] == [(2, 1, 1)]

    # t=600: qs2's job takes its lent instance back, med is preempted across shares (a summary
    # cannot tell a preemption from a requeue: the description asked in the same round can)
    aws.at(600)
    aws.submit("qs2-job", "qs2", 1)
    reclaimed = {"preemptedAttemptCount": 1, "recentPreemptedAttempts": [_stopped(0, 600)]}
    back = [aws.summary("qs1-low", "RUNNABLE"), aws.summary("qs1-med", "RUNNABLE")]
    aws.round(
        {"qs1": ("RUNNABLE", back, [("qs1-med", "RUNNABLE", {"preemptionSummary": reclaimed})]),
         "qs2": ("RUNNABLE", [], [])},
        {"qs1": 1, "qs2": 1},
    )  # fmt: skip
    assert (aws.job("qs1-med").state, aws.job("qs1-med").preemptions) == ("RUNNABLE", 1)
    aws.sweep_on(
        {"qs1": [], "qs2": [aws.summary("qs2-job", "SCHEDULED", at=600, latestAttempt=TRAINING_JOB)]},
        {"qs1": [], "qs2": []},
        {"qs1": [aws.summary("qs1-high", "RUNNING", at=0)], "qs2": [aws.summary("qs2-job", "RUNNING", at=600)]},
        {"qs1": 1, "qs2": 1},
    )

    # t=900: qs3's job on its reserved instance
    aws.at(900)
    aws.submit("qs3-job", "qs3", 1)
    aws.round({"qs1": ("RUNNABLE", back, []), "qs2": ("RUNNABLE", [], []), "qs3": ("RUNNABLE", [], [])}, USE_900)
    aws.sweep_on(
        {"qs1": [], "qs2": [], "qs3": [aws.summary("qs3-job", "SCHEDULED", at=900)]},
        {"qs1": [], "qs2": [], "qs3": []},
        {"qs1": [aws.summary("qs1-high", "RUNNING", at=0)], "qs2": [aws.summary("qs2-job", "RUNNING", at=600)],
         "qs3": [aws.summary("qs3-job", "RUNNING", at=900)]},
        USE_900,
    )  # fmt: skip

    # t=1200: low raised above high: UpdateServiceJob, and AWS preempts high in its share
    aws.at(1200)
    aws.store.set_priority(aws.job("qs1-low").id, 4)
    aws.stub.add_response(
        "update_service_job", {"jobId": aws.ids["qs1-low"]}, {"jobId": aws.ids["qs1-low"], "schedulingPriority": 4}
    )
    in_share = {"preemptedAttemptCount": 1, "recentPreemptedAttempts": [_stopped(0, 1200)]}
    back = [aws.summary("qs1-high", "RUNNABLE"), aws.summary("qs1-med", "RUNNABLE")]
    aws.round(
        {"qs1": ("RUNNABLE", back, [("qs1-high", "RUNNABLE", {"preemptionSummary": in_share})]),
         "qs2": ("RUNNABLE", [], []), "qs3": ("RUNNABLE", [], [])},
        USE_900,
    )  # fmt: skip
    aws.sweep_on(
        {"qs1": [aws.summary("qs1-low", "SCHEDULED", at=1200)], "qs2": [], "qs3": []},
        {"qs1": [], "qs2": [], "qs3": []},
        {"qs1": [aws.summary("qs1-low", "RUNNING", at=1200)], "qs2": [aws.summary("qs2-job", "RUNNING", at=600)],
         "qs3": [aws.summary("qs3-job", "RUNNING", at=900)]},
        USE_900,
    )  # fmt: skip

    simulated = cli("simulate", str(ROOT / "examples" / "walkthrough.yaml"), "--until", "1800", "--json").json()
    assert _seen(aws.mirrored_events()) == _seen(simulated["events"])
    for name, job in simulated["jobs"].items():
        row = aws.job(name)
        assert (row.state, row.priority, row.attempts, row.preemptions) == (
            job["state"], job["priority"], job["attempts"], job["preemptions"]
        ), name  # fmt: skip

    # t=1800: med cancelled (TerminateServiceJob) and qs2's job done: both missing from a whole
    # sweep, so each is described once, and that says how it ended
    aws.at(1800)
    aws.store.cancel(aws.job("qs1-med").id)
    aws.stub.add_response("terminate_service_job", {}, {"jobId": aws.ids["qs1-med"], "reason": CANCEL_REASON})
    aws.round(
        {"qs1": ("RUNNABLE", [aws.summary("qs1-high", "RUNNABLE")], []), "qs2": ("RUNNABLE", [], []),
         "qs3": ("RUNNABLE", [], [])},
        USE_900,
    )  # fmt: skip
    for status in ("SCHEDULED", "STARTING"):
        aws.round({share: (status, [], []) for share in ("qs1", "qs2", "qs3")}, USE_900)
    cancelled = {"statusReason": f"Terminated by user: {CANCEL_REASON}", "isTerminated": True}
    aws.round(
        {"qs1": ("RUNNING", [aws.summary("qs1-low", "RUNNING", at=1200)],
                 [("qs1-med", "FAILED", {**cancelled, "preemptionSummary": reclaimed})]),
         "qs2": ("RUNNING", [], [("qs2-job", "SUCCEEDED", {"stoppedAt": int((START + 1830) * 1000)})]),
         "qs3": ("RUNNING", [aws.summary("qs3-job", "RUNNING", at=900)], [])},
        {"qs1": 1, "qs3": 1},
    )  # fmt: skip
    states = {n: (aws.job(n).state, aws.job(n).reason) for n in ("qs1-high", "qs1-med", "qs1-low", "qs2-job")}
    assert states == {
        "qs1-high": ("RUNNABLE", None),
        "qs1-med": ("FAILED", "CANCELLED"),
        "qs1-low": ("RUNNING", None),
        "qs2-job": ("SUCCEEDED", None),
    }
    with engine.connect() as connection:
        preemptions = connection.execute(
            select(JobRow.name, Preemption.kind, Preemption.by_job, Preemption.lost_seconds)
            .join(JobRow, JobRow.id == Preemption.job_id)
            .order_by(Preemption.id)
        ).all()
        attempts = connection.execute(
            select(JobRow.name, Attempt.number, Attempt.backend, Attempt.status, Attempt.external_name)
            .join(JobRow, JobRow.id == Attempt.job_id)
            .order_by(JobRow.name, Attempt.number)
        ).all()
    assert [tuple(p) for p in preemptions] == [
        ("qs1-med", "CROSS_SHARE", "AWS Batch", 0.0),  # 600 s run, a checkpoint each 300 s: nothing lost
        ("qs1-high", "IN_SHARE", "AWS Batch", 0.0),
    ]
    assert [tuple(a) for a in attempts] == [
        ("qs1-high", 1, "aws_batch", "STOPPED", None),
        ("qs1-low", 1, "aws_batch", "RUNNING", None),
        ("qs1-med", 1, "aws_batch", "STOPPED", None),
        ("qs2-job", 1, "aws_batch", "SUCCEEDED", "aq-4-qs2-job-a1b2"),  # the task's result describes it
        ("qs3-job", 1, "aws_batch", "RUNNING", None),
    ]
    shares = _view(engine)
    assert [(t.used, t.runnable) for t in shares["qs1"].types] == [(1, 1)]
    assert [(t.used, t.runnable) for t in shares["qs2"].types] == [(0, 0)]


USE_900 = {"qs1": 1, "qs2": 1, "qs3": 1}
TRAINING_JOB = {
    "serviceResourceId": {
        "name": "TrainingJobArn",
        "value": "arn:aws:sagemaker:us-east-1:123456789012:training-job/aq-4-qs2-job-a1b2",
    }
}
"""A service job's ``latestAttempt``: the SageMaker training job AWS runs for it."""


def _stopped(started: float, stopped: float) -> dict[str, Any]:
    """A preempted attempt as ``preemptionSummary.recentPreemptedAttempts`` lists it."""
    return {"startedAt": int((START + started) * 1000), "stoppedAt": int((START + stopped) * 1000)}


def _seen(events: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """What a user reads of each event: when, what, of which job, and how it was placed or
    preempted; not who preempted (AWS does not say) nor the reasons' words."""
    seen = []
    for event in events:
        kept: tuple[Any, ...] = (round(float(event["t"])), event["type"], event["job"], event["share"])
        if event["type"] == "PLACED":
            kept += (event["instance_type"], event["count"], event["borrowed"], event["attempt"])
        elif event["type"] == "PREEMPTED":
            kept += (event["kind"], event["lost_seconds"])
        elif event["type"] == "PRIORITY_CHANGED":
            kept += (event.get("old"), event.get("new"))
        seen.append(kept)
    return sorted(seen)


def _view(engine: Engine) -> dict[str, Any]:
    from sqlalchemy.orm import Session

    with Session(engine) as session:
        view = read_view(session)
    return {share.share: share for share in view.shares}


def _outcome(engine: Engine) -> list[tuple[str, bool, str | None, str | None]]:
    with engine.connect() as connection:
        rows = connection.execute(
            select(Request.kind, Request.handled, Request.outcome, Request.error).order_by(Request.id)
        ).all()
    return [tuple(row) for row in rows]  # type: ignore[misc]


def test_a_submission_aws_refuses_is_refused_with_awss_words_and_nothing_kept(aws: Aws, engine: Engine) -> None:
    row = aws.submit("too-big", "qs1", 1, backend="local")  # no call: refused before any
    job = aws.store.submit(
        JobRequest(name="refused", share="qs1", preferences=[{"instance_type": G5, "count": 1}]),
        "sagemaker",
        training=TRAINING,
    )
    aws.stub.add_client_error(
        "submit_service_job",
        service_error_code="ClientException",
        service_message="quotaShareName qs1 does not exist on quota-queue",
        http_status_code=400,
    )
    aws.step()
    assert aws.store.job(row.id) is None and aws.store.job(job.id) is None
    [_, local, refused] = _outcome(engine)
    assert local[:3] == ("submit", True, "refused")
    assert "backend: 'local' jobs cannot run on AWS Batch" in str(local[3])
    assert refused[:3] == ("submit", True, "refused")
    assert "SubmitServiceJob of job aq-" in str(refused[3])
    assert "ClientException: quotaShareName qs1 does not exist on quota-queue" in str(refused[3])


def test_aws_throttling_pauses_every_call_and_the_submission_is_made_again_with_its_token(
    aws: Aws, engine: Engine
) -> None:
    row = aws.store.submit(
        JobRequest(name="again", share="qs1", preferences=[{"instance_type": G5, "count": 1}]),
        "sagemaker",
        training=TRAINING,
    )
    aws.stub.add_client_error("submit_service_job", service_error_code="TooManyRequestsException", http_status_code=429)
    aws.service.step()
    aws.stub.assert_no_pending_responses()
    paused = aws.service.paused_until - aws.clock.now()
    assert 0.5 <= paused <= 1.0  # the first back-off: 1 s, less up to half of it at random
    assert aws.store.job(row.id).state == "SUBMITTED"  # type: ignore[union-attr]
    assert _outcome(engine)[-1][1] is False  # still in the inbox
    aws.service.step()  # still paused: no call (the Stubber has no answer to give)
    aws.clock.advance_to(aws.service.paused_until)
    aws.expect_submit(row)  # the same request, the same client token: AWS returns the job it has
    aws.expect_page("qs1", "RUNNABLE", [])
    aws.expect_snapshot({})
    aws.step()
    assert aws.job("again").state == "RUNNABLE"
    assert _outcome(engine)[-1][:3] == ("submit", True, "accepted")


def test_a_job_aws_leaves_waiting_while_later_ones_are_placed_raises_starving_once(aws: Aws, engine: Engine) -> None:
    """AWS raises no starvation alert; the delegating scheduler does (docs/model.md rule 8), from
    what it mirrors: here a fixed threshold of 600 s in qs1."""
    shares = [dict(s, starvation_after_seconds=600) if s["name"] == "qs1" else s for s in WALKTHROUGH["shares"]]
    aws.store.apply_config({**WALKTHROUGH, "shares": shares})
    aws.submit("qs1-a", "qs1", 1)
    aws.submit("qs1-b", "qs1", 5)
    both = [aws.summary("qs1-a", "RUNNABLE"), aws.summary("qs1-b", "RUNNABLE")]
    aws.round({"qs1": ("RUNNABLE", both, [])}, {})
    aws.round({"qs1": ("SCHEDULED", [aws.summary("qs1-b", "SCHEDULED", at=5)], [])}, {"qs1": 1})
    aws.round({"qs1": ("STARTING", [], [])}, {"qs1": 1})
    aws.round({"qs1": ("RUNNING", [aws.summary("qs1-b", "RUNNING", at=5)], [])}, {"qs1": 1})
    aws.at(590)  # not yet past 600 s
    aws.round({"qs1": ("RUNNABLE", [aws.summary("qs1-a", "RUNNABLE")], [])}, {"qs1": 1})
    assert aws.store.alerts(aws.job("qs1-a").id) == []
    aws.at(700)
    aws.round({"qs1": ("SCHEDULED", [], [])}, {"qs1": 1})
    aws.round({"qs1": ("STARTING", [], [])}, {"qs1": 1})
    [alert] = aws.store.alerts(aws.job("qs1-a").id)
    assert (alert.kind, alert.age_seconds, alert.notified) == ("STARVING", 700.0, True)  # the log notifier
    assert alert.reason == (
        "RUNNABLE for 700 s, past its threshold of 600 s (starvation_after_seconds);"
        " overtaken by 1 later placement, latest qs1-b (qs1)"
    )
    assert aws.store.alerts(aws.job("qs1-b").id) == []
    counted = [(stat, tags) for call, stat, _, tags in aws.stats.calls if call == "incr"]
    assert ("quota.placements", {"share": "qs1", "instance_type": G5}) in counted
    assert ("quota.alerts", {"share": "qs1", "kind": "STARVING"}) in counted
    assert any(call == "gauge" and stat == "quota.share.used" for call, stat, _, _ in aws.stats.calls)


def test_a_configuration_aws_cannot_express_is_taken_in_and_what_aws_ignores_is_logged(
    aws: Aws, caplog: pytest.LogCaptureFixture
) -> None:
    shares = [dict(s, preemption_protection_seconds=300) if s["name"] == "qs2" else s for s in WALKTHROUGH["shares"]]
    aws.store.apply_config({**WALKTHROUGH, "shares": shares})
    with caplog.at_level("WARNING", logger="airflow_quota.scheduler"):
        aws.step()
    assert aws.service.config is not None and aws.service.config.share("qs2").preemption_protection_seconds == 300  # type: ignore[union-attr]
    assert (
        "configuration version 2: shares[1].preemption_protection_seconds = 300: ignored, AWS Batch places"
        in caplog.text
    )


def test_a_job_aws_no_longer_knows_fails_as_lost_and_a_refused_read_only_pauses(aws: Aws) -> None:
    aws.submit("gone", "qs1", 1)
    for status in ("RUNNABLE", "SCHEDULED", "STARTING", "RUNNING"):  # a sweep begun as it was submitted
        aws.round({"qs1": (status, [], [])}, {})
    aws.stub.add_client_error(
        "list_service_jobs", service_error_code="ClientException", service_message="no such queue", http_status_code=400
    )
    aws.step()  # a read AWS refuses: the mirror waits, nothing changes
    assert aws.job("gone").state == "RUNNABLE" and aws.service.paused_until > aws.clock.now() - ROUND
    aws.clock.advance_to(aws.service.paused_until + ROUND)
    for status in ("RUNNABLE", "SCHEDULED", "STARTING"):
        aws.round({"qs1": (status, [], [])}, {})
    aws.expect_page("qs1", "RUNNING", [])
    aws.stub.add_client_error(
        "describe_service_job", service_error_code="ClientException", service_message="Job svc-gone not found"
    )
    aws.expect_snapshot({})
    aws.step()  # the whole second sweep missed it, and AWS does not know it
    gone = aws.job("gone")
    assert (gone.state, gone.reason) == ("FAILED", "ATTEMPTS_EXHAUSTED")
    assert "BackendLost: AWS Batch no longer knows service job svc-gone" in str(gone.detail)


def test_a_share_listed_over_several_pages_is_read_a_page_a_round(aws: Aws) -> None:
    for name in ("p1", "p2"):
        aws.submit(name, "qs1", 1)
    params = {"jobQueue": QUEUE, "jobStatus": "RUNNABLE", "maxResults": 100,
              "filters": [{"name": "QUOTA_SHARE_NAME", "values": ["qs1"]}]}  # fmt: skip
    aws.stub.add_response(
        "list_service_jobs", {"jobSummaryList": [aws.summary("p1", "RUNNABLE")], "nextToken": "t2"}, params
    )
    aws.expect_snapshot({})
    aws.step()
    aws.stub.add_response(
        "list_service_jobs", {"jobSummaryList": [aws.summary("p2", "RUNNABLE")]}, {**params, "nextToken": "t2"}
    )
    aws.expect_snapshot({})
    aws.step()  # the second page, then SCHEDULED: the sweep moved on only once the pages ran out
    aws.round({"qs1": ("SCHEDULED", [aws.summary("p2", "SCHEDULED", at=25)], [])}, {"qs1": 1})
    assert (aws.job("p1").state, aws.job("p2").state) == ("RUNNABLE", "SCHEDULED")


def test_a_leader_lost_after_aws_took_the_job_leaves_one_job_the_next_leader_finds(aws: Aws, engine: Engine) -> None:
    """A leader that submitted and could not commit (its lease gone) leaves the request in the
    inbox; the next leader submits it again with the same client token, and AWS answers with the
    job it already has: one service job, one quota job."""
    from airflow_quota.store.lock import LeadershipLost

    row = aws.submit("once", "qs1", 1)
    first = aws.service
    fenced = first._fence

    def lost(session: Any) -> None:
        if session.get(Request, 1).handled:  # the configuration taken in, then the lease gone
            raise LeadershipLost("another scheduler took the leader lease")
        fenced(session)

    first._fence = lost  # type: ignore[method-assign]
    with pytest.raises(LeadershipLost):
        first.step()
    aws.stub.assert_no_pending_responses()  # AWS took the submission
    assert aws.job("once").service_job_id is None and _outcome(engine)[-1][1] is False

    second = AwsBatchDelegation(engine, aws.calls, QUEUE, clock=aws.clock, mirror_seconds=ROUND, submit_workers=1)
    second.recover()
    aws.expect_submit(row)  # the same request, the same token: AWS's answer names the same job
    aws.expect_page("qs1", "RUNNABLE", [aws.summary("once", "RUNNABLE")])
    aws.expect_snapshot({})
    second.step()
    aws.stub.assert_no_pending_responses()
    assert aws.job("once").service_job_id == "svc-once"
    assert [kind for kind, *_ in _outcome(engine)] == ["config", "submit"]


def test_a_cancel_in_the_step_that_submits_terminates_the_job_aws_just_took(aws: Aws, engine: Engine) -> None:
    row = aws.submit("short-lived", "qs1", 1)
    aws.store.cancel(row.id)  # both in the inbox: the step submits, then cancels
    aws.stub.add_response("terminate_service_job", {}, {"jobId": "svc-short-lived", "reason": CANCEL_REASON})
    aws.expect_page("qs1", "RUNNABLE", [])
    aws.expect_snapshot({})
    aws.step()
    assert [(kind, outcome) for kind, _, outcome, _ in _outcome(engine)] == [
        ("config", "accepted"), ("submit", "accepted"), ("cancel", "accepted")
    ]  # fmt: skip
