"""The training's own log lines in the task log while it runs, as the amazon provider's
``print_log`` does, but from the triggerer: the waiting task holds no worker slot.

Where the lines are is what the backend said when it started the attempt (``Attempt.external_name``):
the local backend's ``training.log`` file (readable where the triggerer runs on the quota
scheduler's host, as in the demo and a one-host setup), or the SageMaker training job, whose
streams in CloudWatch's ``/aws/sagemaker/TrainingJobs`` are named after it. Each tail keeps
where it stopped, so every line is logged once.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

SAGEMAKER_LOG_GROUP = "/aws/sagemaker/TrainingJobs"
CLOUDWATCH_INTERVAL_SECONDS = 30.0
"""How often a SageMaker training's logs are read (the provider's ``check_interval``):
CloudWatch allows 25 GetLogEvents calls a second per account and region."""
MAX_LINES_PER_READ = 1000
"""At most this many lines logged per read; the rest come at the next one."""


class TrainingLog(Protocol):
    """New lines of one attempt's training log."""

    attempt: int
    interval: float

    def read_new(self) -> list[str]:
        """The lines written since the last call (blocking: run it in a thread)."""


@dataclass
class LocalTrainingLog:
    """The local backend's ``training.log`` of one attempt."""

    attempt: int
    path: Path
    interval: float
    _offset: int = 0

    def read_new(self) -> list[str]:
        try:
            with self.path.open("rb") as handle:
                handle.seek(self._offset)
                chunk = handle.read()
        except FileNotFoundError:
            return []  # not written yet
        complete = chunk[: chunk.rfind(b"\n") + 1]  # a line still being written waits for its end
        lines = complete.splitlines(keepends=True)[:MAX_LINES_PER_READ]
        self._offset += sum(len(line) for line in lines)
        return [line.decode(errors="replace").rstrip("\r\n") for line in lines]


@dataclass
class CloudWatchTrainingLog:
    """The CloudWatch streams of one SageMaker training job, through the amazon provider's
    ``AwsLogsHook`` on the task's AWS connection."""

    attempt: int
    job_name: str
    aws_conn_id: str | None
    interval: float = CLOUDWATCH_INTERVAL_SECONDS
    _tokens: dict[str, str] = field(default_factory=dict)
    _client: Any = None

    def read_new(self) -> list[str]:
        if self._client is None:
            from airflow.providers.amazon.aws.hooks.logs import AwsLogsHook

            self._client = AwsLogsHook(aws_conn_id=self.aws_conn_id).conn
        client = self._client
        try:
            streams = client.describe_log_streams(
                logGroupName=SAGEMAKER_LOG_GROUP, logStreamNamePrefix=f"{self.job_name}/"
            )["logStreams"]
        except client.exceptions.ResourceNotFoundException:
            return []  # the job has written no log yet
        lines: list[str] = []
        for stream in sorted(s["logStreamName"] for s in streams):
            lines.extend(self._read_stream(client, stream, MAX_LINES_PER_READ - len(lines)))
            if len(lines) >= MAX_LINES_PER_READ:
                break
        return lines

    def _read_stream(self, client: Any, stream: str, room: int) -> list[str]:
        lines: list[str] = []
        while room > len(lines):
            asked: dict[str, Any] = {"logGroupName": SAGEMAKER_LOG_GROUP, "logStreamName": stream}
            if stream in self._tokens:
                asked["nextToken"] = self._tokens[stream]
            else:
                asked["startFromHead"] = True
            answer = client.get_log_events(**asked, limit=room - len(lines))
            events = answer.get("events", [])
            token = answer.get("nextForwardToken")
            if token:
                self._tokens[stream] = token
            lines.extend(f"{stream.split('/', 1)[-1]}: {event['message']}" for event in events)
            if not events:
                break
        return lines


@dataclass
class LogTail:
    """Follows the current attempt's training log for one trigger; a new attempt (a retry or a
    resume after preemption) gets a new tail."""

    log: TrainingLog | None = None
    failed: bool = False

    async def print_new(self, logger: logging.Logger | Any) -> None:
        """Log the lines written since the last look; a log that cannot be read is said once."""
        if self.log is None or self.failed:
            return
        try:
            lines = await asyncio.to_thread(self.log.read_new)
        except Exception as exc:
            self.failed = True
            logger.warning("the training log of attempt %s cannot be read here: %s", self.log.attempt, exc)
            return
        for line in lines:
            logger.info("[training, attempt %s] %s", self.log.attempt, line)


def training_log(
    backend: str, attempt: int, where: str | None, aws_conn_id: str | None, interval: float
) -> TrainingLog | None:
    """The log of an attempt that ``where`` (its ``external_name``) locates, or None."""
    if not where:
        return None
    if backend == "sagemaker":
        return CloudWatchTrainingLog(attempt, where, aws_conn_id)
    if backend == "local":
        return LocalTrainingLog(attempt, Path(where), interval)
    return None
