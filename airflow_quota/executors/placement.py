"""What a task released by ``QuotaExecutor`` learns of its placement, and how it is preempted.

The executor runs the task with its placement in the environment (``AIRFLOW_QUOTA_*``, below);
``Placement.current()`` reads it back inside the task. A task chosen as a preemption victim gets
SIGTERM, then the share's ``preemption_grace_seconds``, then Airflow stops it (the task is cleared:
RESTARTING, and its supervisor kills it); the next try is held again and resumes from the
checkpoint. ``on_preemption(save)`` is the one call a training needs: on SIGTERM it runs ``save``
and then waits to be stopped, so that the try never ends by itself (a try that returned would
count as a success, one that raised as a failure).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import FrameType

SHARE = "AIRFLOW_QUOTA_SHARE"
JOB_ID = "AIRFLOW_QUOTA_JOB_ID"
ATTEMPT = "AIRFLOW_QUOTA_ATTEMPT"
INSTANCE_TYPE = "AIRFLOW_QUOTA_INSTANCE_TYPE"
INSTANCE_COUNT = "AIRFLOW_QUOTA_INSTANCE_COUNT"
TRAINING_PLAN = "AIRFLOW_QUOTA_TRAINING_PLAN"
CHECKPOINT_URI = "AIRFLOW_QUOTA_CHECKPOINT_URI"
PREEMPTIONS = "AIRFLOW_QUOTA_PREEMPTIONS"
WAITED = "AIRFLOW_QUOTA_WAITED"
"""Why the job waited before this placement, for the try's log (``executors/story.py``)."""
VARIABLES = (
    SHARE,
    JOB_ID,
    ATTEMPT,
    INSTANCE_TYPE,
    INSTANCE_COUNT,
    TRAINING_PLAN,
    CHECKPOINT_URI,
    PREEMPTIONS,
    WAITED,
)


@dataclass(frozen=True, slots=True)
class Placement:
    """Where the quota scheduler placed this try of the task."""

    share: str
    job_id: int
    attempt: int
    """The quota job's attempt (1 on the first placement, one more after each preemption)."""
    instance_type: str
    count: int
    training_plan: str | None
    checkpoint_uri: str | None
    preemptions: int
    """How many times the job was preempted before this attempt: > 0 means resume."""

    def environment(self) -> dict[str, str]:
        """The task's environment variables for this placement."""
        env = {
            SHARE: self.share,
            JOB_ID: str(self.job_id),
            ATTEMPT: str(self.attempt),
            INSTANCE_TYPE: self.instance_type,
            INSTANCE_COUNT: str(self.count),
            PREEMPTIONS: str(self.preemptions),
        }
        if self.training_plan:
            env[TRAINING_PLAN] = self.training_plan
        if self.checkpoint_uri:
            env[CHECKPOINT_URI] = self.checkpoint_uri
        return env

    @classmethod
    def current(cls, environ: Mapping[str, str] | None = None) -> Placement:
        """The placement of the running task; ``LookupError`` when it does not run under
        ``QuotaExecutor`` (no ``AIRFLOW_QUOTA_JOB_ID``)."""
        env = os.environ if environ is None else environ
        if JOB_ID not in env:
            raise LookupError(
                f"{JOB_ID} is not set: this task was not released by QuotaExecutor (on a Celery worker: "
                "the worker must load airflow_quota.executors.celery_worker, docs/executor.md)"
            )
        return cls(
            share=env[SHARE],
            job_id=int(env[JOB_ID]),
            attempt=int(env[ATTEMPT]),
            instance_type=env[INSTANCE_TYPE],
            count=int(env[INSTANCE_COUNT]),
            training_plan=env.get(TRAINING_PLAN),
            checkpoint_uri=env.get(CHECKPOINT_URI),
            preemptions=int(env.get(PREEMPTIONS, "0")),
        )


def on_preemption(save: Callable[[], None], wait: Callable[[float], None] = time.sleep) -> None:
    """On SIGTERM (a preemption), run ``save`` once, then wait until Airflow stops the try.

    Call it in the task, before the training loop. ``save`` should write the checkpoint quickly
    (within the share's ``preemption_grace_seconds``)."""
    saved = False

    def _preempted(signum: int, frame: FrameType | None) -> None:
        nonlocal saved
        if not saved:
            saved = True
            save()
        while True:  # stopped by Airflow: SIGKILL ends this
            wait(3600)

    signal.signal(signal.SIGTERM, _preempted)
