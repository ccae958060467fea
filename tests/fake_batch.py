"""An AWS Batch endpoint for the service-job calls moto lacks (moto answers every one of them 404
"Not yet implemented": ``reference/aws-quota-and-preferences.md``), for tests that run the
delegating quota scheduler as a process (``--aws-batch-job-queue``), where botocore's Stubber
cannot reach.

It speaks Batch's rest-json over HTTP, so the scheduler's real botocore client serializes every
request and parses every answer; each request is checked against botocore's Batch model (input
shape) and each answer too (output shape), so a field AWS does not have fails the test. Its jobs
move by the wall clock: RUNNABLE for ``wait_seconds``, then RUNNING for ``run_seconds``, then
SUCCEEDED; a terminated job is FAILED at once with ``isTerminated``. It places without quotas: a
stand-in for AWS's scheduler, not a model of it (the quota rules are checked against AWS's own
walkthrough in ``tests/service/test_aws_batch_delegation.py``).

A helper module, not a test module.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import botocore.session
from botocore.validate import ParamValidator

REGION = "us-east-1"
_MODEL = botocore.session.get_session().get_service_model("batch")
_OPERATIONS = {
    _MODEL.operation_model(name).http["requestUri"]: name
    for name in (
        "SubmitServiceJob",
        "ListServiceJobs",
        "DescribeServiceJob",
        "UpdateServiceJob",
        "TerminateServiceJob",
        "GetJobQueueSnapshot",
    )
}


@dataclass
class _Job:
    job_id: str
    request: dict[str, Any]
    created: float
    terminated: str | None = None
    priority: int = 0


@dataclass
class FakeBatch:
    """The endpoint; ``calls`` holds every request it took, as (operation, parameters)."""

    wait_seconds: float = 0.5
    run_seconds: float = 2.0
    latency_seconds: float = 0.0
    """How long each answer takes, as AWS's do over the network (benchmarks: tens of milliseconds)."""
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    jobs: dict[str, _Job] = field(default_factory=dict)
    tokens: dict[str, str] = field(default_factory=dict)
    url: str = ""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # -- the jobs as AWS shows them --------------------------------------------------------------

    def _status(self, job: _Job, now: float) -> tuple[str, float | None, float | None]:
        """Its status, when it was scheduled and when it stopped."""
        scheduled = job.created + self.wait_seconds
        if job.terminated is not None:
            return "FAILED", None, job.created
        if now < scheduled:
            return "RUNNABLE", None, None
        if now < scheduled + self.run_seconds:
            return "RUNNING", scheduled, None
        return "SUCCEEDED", scheduled, scheduled + self.run_seconds

    def _summary(self, job: _Job, now: float) -> dict[str, Any]:
        status, scheduled, stopped = self._status(job, now)
        payload = json.loads(job.request["serviceRequestPayload"])
        first = payload["ResourceConfig"]["InstancePreferences"][0]
        item: dict[str, Any] = {
            "jobId": job.job_id,
            "jobName": job.request["jobName"],
            "jobArn": f"arn:aws:batch:{REGION}:123456789012:service-job/{job.job_id}",
            "serviceJobType": "SAGEMAKER_TRAINING",
            "quotaShareName": job.request["quotaShareName"],
            "status": status,
            "createdAt": int(job.created * 1000),
            "isTerminated": job.terminated is not None,
        }
        if scheduled is not None:
            item["scheduledAt"] = int(scheduled * 1000)
            item["startedAt"] = int(scheduled * 1000)
            item["capacityUsage"] = [{"capacityUnit": first["InstanceType"], "quantity": float(first["InstanceCount"])}]
        if stopped is not None:
            item["stoppedAt"] = int(stopped * 1000)
        if job.terminated is not None:
            item["statusReason"] = f"Terminated by user: {job.terminated}"
        return item

    # -- the calls ------------------------------------------------------------------------------

    def answer(self, operation: str, params: dict[str, Any]) -> dict[str, Any]:
        now = time.time()
        with self._lock:
            self.calls.append((operation, params))
            if operation == "SubmitServiceJob":
                token = params.get("clientToken")
                if token in self.tokens:
                    job = self.jobs[self.tokens[token]]
                else:
                    job = _Job(str(uuid.uuid4()), params, now, priority=params.get("schedulingPriority", 0))
                    self.jobs[job.job_id] = job
                    if token:
                        self.tokens[token] = job.job_id
                return {"jobId": job.job_id, "jobName": params["jobName"], "jobArn": self._summary(job, now)["jobArn"]}
            if operation == "ListServiceJobs":
                share = next(iter(f["values"][0] for f in params.get("filters", ()) if f["name"] == "QUOTA_SHARE_NAME"))
                listed = [
                    self._summary(job, now)
                    for job in sorted(self.jobs.values(), key=lambda job: -job.created)  # newest first, as AWS
                    if job.request["quotaShareName"] == share and self._status(job, now)[0] == params.get("jobStatus")
                ]
                start = int(params.get("nextToken") or 0)
                size = int(params.get("maxResults") or 100)
                page: dict[str, Any] = {"jobSummaryList": listed[start : start + size]}
                if start + size < len(listed):
                    page["nextToken"] = str(start + size)
                return page
            if operation == "DescribeServiceJob":
                job = self.jobs[params["jobId"]]
                described = {**self._summary(job, now), "jobQueue": job.request["jobQueue"]}
                described.setdefault("startedAt", described["createdAt"])  # required in a description
                return {**described, "schedulingPriority": job.priority}
            if operation == "UpdateServiceJob":
                self.jobs[params["jobId"]].priority = params["schedulingPriority"]
                return {"jobId": params["jobId"]}
            if operation == "TerminateServiceJob":
                self.jobs[params["jobId"]].terminated = params["reason"]
                return {}
            return {}

    def asked(self, operation: str) -> list[dict[str, Any]]:
        with self._lock:
            return [params for name, params in self.calls if name == operation]


def _handler(batch: FakeBatch) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            operation = _OPERATIONS.get(self.path)
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            if operation is None:
                return self._send(404, {"__type": "ClientException", "message": f"not here: {self.path}"})
            model = _MODEL.operation_model(operation)
            problems = ParamValidator().validate(body, model.input_shape)
            if problems.has_errors():
                return self._send(400, {"__type": "ClientException", "message": problems.generate_report()})
            if batch.latency_seconds:
                time.sleep(batch.latency_seconds)  # the network's and AWS's time, modelled
            answer = batch.answer(operation, body)
            checked = ParamValidator().validate(answer, model.output_shape)
            assert not checked.has_errors(), checked.generate_report()
            self._send(200, answer)

        def _send(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@contextmanager
def fake_batch(
    wait_seconds: float = 0.5, run_seconds: float = 2.0, latency_seconds: float = 0.0
) -> Iterator[FakeBatch]:
    """A ``FakeBatch`` serving on a free local port while the block runs."""
    batch = FakeBatch(wait_seconds, run_seconds, latency_seconds)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(batch))
    batch.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield batch
    finally:
        server.shutdown()
        server.server_close()
