"""``QuotaTrainingOperator``: run a training job through the quota scheduler.

Modelled on the amazon provider's ``SageMakerTrainingOperator``: ``execute`` submits (once,
idempotently), returns at once if the job is already final, and otherwise defers to
``QuotaJobTrigger`` so the task waits in the triggerer without a worker slot;
``execute_complete`` turns the final state into success (a summary in XCom) or failure with
the quota's reason code.
"""

from __future__ import annotations

import hashlib
import re
import time
import warnings
from collections.abc import Mapping, Sequence
from datetime import timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar

from airflow.exceptions import AirflowProviderDeprecationWarning
from airflow.sdk import BaseOperator, Context
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_quota.core.access import Actor
from airflow_quota.core.human_time import duration_words
from airflow_quota.core.model import FINAL_STATES, LIVE_STATES, FailureReason, JobRequest, JobState
from airflow_quota.exceptions import ChangeRefused, InvalidInput, Problem, SubmissionRejected
from airflow_quota.hooks.quota import QuotaHook, describe_job, describe_pending_deadline, state_key, task_actor
from airflow_quota.hooks.sagemaker import TrainingJobs, placed_request_problems, with_integers
from airflow_quota.operators.arguments import (
    SUBMISSION_ARGUMENTS,
    expected_runtime_seconds,
    has_template,
    job_request,
    read_rendered,
    rendered_as,
    request_problems,
)
from airflow_quota.operators.deferral import default_deferrable
from airflow_quota.operators.outcome import outside_the_training, unfollowed
from airflow_quota.operators.priority import QUOTA_PRIORITY_PARAM, priority_override
from airflow_quota.plugins.links import XCOM_JOB_ID, QuotaJobLink, SageMakerTrainingJobLink, TrainingLogsLink
from airflow_quota.store.backend_names import REAL_BACKENDS
from airflow_quota.store.models import AttemptState, JobRow
from airflow_quota.triggers.quota import QuotaJobEvent, QuotaJobTrigger, Status, settled_after_deferral

if TYPE_CHECKING:
    from airflow.providers.openlineage.extractors import OperatorLineage

JOB_NAME_LENGTH = 128
DEFAULT_CHECK_INTERVAL = 5.0
"""Seconds between two looks at a waiting job: in the triggerer all waiting tasks share one read
of the quota database per interval, so a short interval costs little (the amazon provider's 30 s
pays for an AWS call per look)."""

PLACEMENT_FIELDS = ("InstanceType", "InstanceCount", "TrainingPlanArn", "InstanceGroups", "InstancePreferences")
"""``ResourceConfig`` fields of a SageMaker request that the placement decides."""

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


def derived_job_name(dag_id: str, task_id: str, run_id: str, map_index: int, generation: int = 1) -> str:
    """A job name for a task instance that fits ``[A-Za-z0-9_-]{1,128}``: the readable parts,
    then a hash of the exact ones (two runs whose ids differ only in ``:`` or ``+`` differ
    here too), then ``-rN`` for the N-th submission of a task cleared or retried after failing."""
    raw = f"{dag_id}/{task_id}/{run_id}" + (f"/{map_index}" if map_index >= 0 else "")
    digest = hashlib.sha256(raw.encode()).hexdigest()[:8]
    suffix = f"-{digest}" + (f"-r{generation}" if generation > 1 else "")
    readable = _UNSAFE.sub("-", raw.replace("/", "-")).strip("-")
    return readable[: JOB_NAME_LENGTH - len(suffix)] + suffix


def client_token(dag_id: str, task_id: str, run_id: str, map_index: int, generation: int = 1) -> str:
    """The submission's idempotency token: the task instance (not its try), and which
    submission of it (a new one only after the previous job failed or was cancelled)."""
    base = f"airflow/{dag_id}/{task_id}/{run_id}/{map_index}"
    if len(base) > 200:
        base = "airflow/" + hashlib.sha256(base.encode()).hexdigest()
    return base if generation == 1 else f"{base}#{generation}"


def job_summary(job: JobRow, borrowed: int) -> dict[str, Any]:
    """What the task returns to XCom: small, plain values."""
    return {
        "job_id": job.id,
        "job_name": job.name,
        "share": job.share,
        "state": job.state,
        "instance_type": job.instance_type,
        "instance_count": job.count,
        "training_plan": job.training_plan,
        "borrowed": borrowed,
        "attempts": job.attempts,
        "preemptions": job.preemptions,
        "lost_gpu_hours": round(job.lost_gpu_hours, 6),
        "gpu_hours": round(job.gpu_hours, 6),
        "cost": round(job.cost, 6),
        "wait_seconds": round(job.wait_seconds, 3),
    }


class QuotaTrainingOperator(BaseOperator):
    """Run a training job in a quota share: submit it to the quota scheduler, wait (deferred, in
    the triggerer) while it is queued, placed, preempted and resumed, and finish with its outcome.

    The task log tells the job's story: its position while it waits, where it is placed
    (borrowing or not), preemptions with the work they lost, resumptions, the end. The task
    returns a summary (instance type and count, attempts, preemptions, lost and used GPU-hours,
    cost, seconds waited); with the sagemaker backend ``{"Training": <DescribeTrainingJob of the
    successful attempt>, "quota": <the summary>}``, as ``SageMakerTrainingOperator`` returns
    ``{"Training": ...}``. It fails with the quota's reason code: ``PENDING_TIMEOUT``,
    ``CAPACITY_ERROR``, ``PREEMPTION_LIMIT``, ``ATTEMPTS_EXHAUSTED`` or ``CANCELLED``. Marking
    the task failed or clearing it cancels its quota job. A run's conf may override the
    priority (``quota_priority``, see ``airflow_quota.operators.priority``).

    A retried task finds the job its earlier try submitted (the submission is keyed by DAG,
    task, run and map index, not by try): it never runs the same training twice at once. When
    that job failed or was cancelled, the retry (or the cleared task) submits a new one, named
    with a ``-rN`` suffix.

    Each task instance has a "Quota job" button (``operator_extra_links``) to its job's page on
    the Quotas page of the Airflow UI (``airflow_quota.plugins``); with the sagemaker backend,
    once the task ends, "SageMaker training job" and "Training logs" buttons to its last
    attempt's training job in the SageMaker console and its CloudWatch logs.

    With the sagemaker backend the request is prepared as ``SageMakerTrainingOperator`` does,
    before anything is submitted: integer fields rendered as text are cast, a ``RoleArn`` that
    is a role name is expanded to its ARN (IAM, through ``aws_conn_id``), and the request, with
    the first preference filled in as the placement, is checked against botocore's SageMaker
    model: every field it refuses is named and the task fails without submitting.

    Every templated argument may be Jinja or a TaskFlow output (an ``XComArg``): such values
    are checked once rendered, in ``execute``, with the messages of the parse-time check, and a
    rendered string holding a JSON list or object, or an integer, counts as that value where
    one is expected (``count: "2"``; no ``render_template_as_native_obj`` needed).

    :param share: the quota share the job runs in. (templated)
    :param instance_preferences: up to 5 entries tried in order, each
        ``{"instance_type": "ml.g5.xlarge", "count": 2}`` with an optional ``"training_plan"``;
        each type at most once. (templated)
    :param priority: 0-9999, higher first within the share; at most the share's
        ``max_priority``. A run's ``quota_priority`` overrides it. (templated)
    :param max_pending_time: how long the job may wait to be placed each time it waits (after
        its submission, a preemption or a failed attempt; a capacity error does not restart the
        clock, and a list of plan entries only starts it at the plans' window), in seconds or a
        ``timedelta``; it then fails with ``PENDING_TIMEOUT``, and the task log says when that
        falls due as each wait begins. None: no limit. (templated)
    :param expected_runtime: how long the training is expected to run once placed, in seconds
        or a ``timedelta`` (more than 0): the forecast's best runtime estimate for this job,
        before the task's own history (``docs/forecast.md``). Advice only: no scheduling
        decision reads it. None: the forecast estimates from history. (templated)
    :param checkpoint_uri: where the training saves and finds checkpoints (``s3://`` for
        SageMaker; a directory or ``file://`` URI for the local backend). (templated)
    :param checkpoint_interval: seconds of work between two checkpoints; estimates the work a
        preemption loses. None: every preemption loses the whole attempt. (templated)
    :param preemption_retries: how many preemptions the job accepts before it fails with
        ``PREEMPTION_LIMIT``; None: unlimited. (templated)
    :param retry_attempts: attempts (1-10) for genuine failures before ``ATTEMPTS_EXHAUSTED``.
        (templated)
    :param retry_on: failure reasons worth another attempt (``["ExitCode:137"]``); None: all.
        (templated)
    :param wait_for_capacity: a CPU-only list waits for provider capacity instead of failing at
        once with ``CAPACITY_ERROR``.
    :param backend: ``"local"`` (a subprocess on the quota scheduler's host) or ``"sagemaker"``.
    :param command: local backend: the command, a string for ``/bin/sh -c`` or a list. (templated)
    :param env: local backend: extra environment variables. (templated)
    :param cwd: local backend: the working directory. (templated)
    :param training_request: SageMaker backend: a CreateTrainingJob request without what the
        placement fills in (``TrainingJobName``, ``ResourceConfig.InstanceType``/``InstanceCount``/
        ``TrainingPlanArn``, ``CheckpointConfig.S3Uri``). (templated)
    :param aws_conn_id: SageMaker backend: the Airflow AWS connection whose credentials the
        job's training jobs run with (the quota scheduler reads it through Airflow's connections
        and secrets backends) and the task uses to expand the role and describe the result.
        None: the share's ``aws_conn_id`` in quota.yaml; without one the quota scheduler's own
        credentials, and ``aws_default`` for the task's calls.
    :param job_name: the quota job's name (``[A-Za-z0-9_-]{1,128}``); by default derived from
        the DAG, task, run and map index. (templated)
    :param quota_conn_id: the Airflow connection of the quota database.
    :param wait_for_completion: wait for the job to end (True, the default). False: submit the
        job and succeed at once, returning the job's summary as it stands after the submission
        (``{"job_id": 7, "state": "SUBMITTED", ...}``, the same keys as at the end, for both
        backends: no SageMaker training job exists yet); ``QuotaJobSensor(job_id=train.output)``
        then waits for it. As with ``SageMakerTrainingOperator``, ``deferrable`` then has no effect.
    :param check_interval: seconds between two looks at the job while waiting (default 5, the
        provider's name; its default 30 pays an AWS call per look). In the triggerer all
        waiting tasks share one read of the quota database per interval, so a short interval
        costs little and a placement is noticed within seconds.
    :param max_attempts: how many looks, ``check_interval`` apart, the task waits for the job to
        end before it gives up and fails: after ``check_interval x max_attempts`` seconds, deferred
        or not. The job is left as it is (the provider leaves its training job running too): a
        retry of the task finds the same job and waits on it again; ``airflow-quota jobs cancel``
        stops it. None (the default, where the provider's operator takes 60): no limit, since a
        job may rightly wait for quota for hours; ``max_pending_time`` bounds that wait, and
        ``execution_timeout`` the whole task.
    :param poll_interval: deprecated: the old name of ``check_interval``, still honoured with a
        warning (an ``AirflowProviderDeprecationWarning`` naming ``check_interval``).
    :param print_log: show the training's own output in the task log while it runs (the local
        backend's log file, a SageMaker job's CloudWatch streams), read by the trigger in the
        triggerer, as ``SageMakerTrainingOperator``'s ``print_log``; the training's last lines
        come before the quota's closing lines.
    :param deferrable: wait in the triggerer rather than in a worker slot. By default
        ``[operators] default_deferrable`` when the deployment sets it in the environment
        (``AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE``), else True: unlike the amazon provider's
        operators (which fall back to False), because a training waiting hours for quota must
        not hold a worker slot; a ``false`` in ``airflow.cfg`` does not count, since Airflow
        writes that line into every ``airflow.cfg`` it generates
        (``airflow_quota.operators.deferral``).

    The OpenLineage provider, when installed, gets the training's lineage from
    ``get_openlineage_facets_on_start/complete/failure`` (``airflow_quota.operators.lineage``):
    for the sagemaker backend the request's S3 inputs and the model artifacts, for both a
    ``quotaJob`` run facet with the job's share, placement, attempts, preemptions and GPU-hours.
    """

    template_fields: Sequence[str] = (
        "share",
        "instance_preferences",
        "priority",
        "max_pending_time",
        "expected_runtime",
        "preemption_retries",
        "retry_attempts",
        "retry_on",
        "checkpoint_interval",
        "checkpoint_uri",
        "command",
        "env",
        "cwd",
        "training_request",
        "job_name",
    )
    template_fields_renderers: ClassVar[dict[str, str]] = {
        "instance_preferences": "json",
        "env": "json",
        "training_request": "json",
    }
    ui_color = "#f0e4ff"
    operator_extra_links = (QuotaJobLink(), SageMakerTrainingJobLink(), TrainingLogsLink())
    """A "Quota job" button on each task instance, to its job's page on the Quotas page; the
    training job's console page and logs for the sagemaker backend."""

    def __init__(
        self,
        *,
        share: str,
        instance_preferences: list[dict[str, Any]] | str,
        priority: int = 0,
        max_pending_time: float | timedelta | None = None,
        expected_runtime: float | timedelta | None = None,
        checkpoint_uri: str | None = None,
        checkpoint_interval: float | None = None,
        preemption_retries: int | None = None,
        retry_attempts: int = 1,
        retry_on: list[str] | None = None,
        wait_for_capacity: bool = False,
        backend: str = "local",
        command: str | list[str] | None = None,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        training_request: dict[str, Any] | None = None,
        job_name: str | None = None,
        quota_conn_id: str = QuotaHook.default_conn_name,
        aws_conn_id: str | None = None,
        wait_for_completion: bool = True,
        check_interval: float | None = None,
        max_attempts: int | None = None,
        poll_interval: float | None = None,
        print_log: bool = True,
        deferrable: bool | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.share = share
        self.instance_preferences = instance_preferences
        self.priority = priority
        self.max_pending_time = max_pending_time
        self.expected_runtime = expected_runtime
        self.checkpoint_uri = checkpoint_uri
        self.checkpoint_interval = checkpoint_interval
        self.preemption_retries = preemption_retries
        self.retry_attempts = retry_attempts
        self.retry_on = retry_on
        self.wait_for_capacity = wait_for_capacity
        self.backend = backend
        self.command = command
        self.env = env
        self.cwd = cwd
        self.training_request = training_request
        self.job_name = job_name
        self.quota_conn_id = quota_conn_id
        self.aws_conn_id = aws_conn_id
        self.wait_for_completion = wait_for_completion
        self.check_interval = DEFAULT_CHECK_INTERVAL if check_interval is None else check_interval
        self.max_attempts = max_attempts
        self.print_log = print_log
        self.deferrable = default_deferrable() if deferrable is None else deferrable
        self.job_id: int | None = None
        self.outcome: dict[str, Any] | None = None
        """The job's summary once the task saw it final (or submitted, not waiting), with its
        ``reason`` and last ``training_job``: what the lineage facets report."""
        self.training_description: dict[str, Any] | None = None
        """The successful SageMaker training job's DescribeTrainingJob (sagemaker backend)."""
        problems = self._interval_problems(check_interval, poll_interval) + self.argument_problems(parse_time=True)
        if problems:
            raise InvalidInput(problems)

    @property
    def poll_interval(self) -> float:
        """The deprecated name of ``check_interval``, for DAGs and code written before it."""
        return self.check_interval

    @poll_interval.setter
    def poll_interval(self, seconds: float) -> None:
        self.check_interval = seconds

    def _interval_problems(self, check_interval: float | None, poll_interval: float | None) -> list[Problem]:
        """Take the deprecated ``poll_interval`` as ``check_interval``, with a warning; both at
        once is a mistake unless they agree."""
        if poll_interval is None:
            return []
        warnings.warn(
            f"task {self.task_id!r}: poll_interval is deprecated, use check_interval (the amazon provider's name)",
            AirflowProviderDeprecationWarning,
            stacklevel=3,
        )
        if check_interval is not None and check_interval != poll_interval:
            return [Problem("poll_interval", "is the old name of check_interval; give only check_interval")]
        self.check_interval = poll_interval
        return []

    @cached_property
    def hook(self) -> QuotaHook:
        return QuotaHook(self.quota_conn_id)

    # -- arguments ---------------------------------------------------------------------------

    def argument_problems(self, parse_time: bool = False, priority: int | None = None) -> list[Problem]:
        """Every broken rule among the arguments, as ``parameter: message``. At parse time a
        field still holding Jinja is checked only once rendered, in ``execute``."""
        problems: list[Problem] = []

        def unknown(value: Any) -> bool:
            return parse_time and has_template(value)

        if self.backend not in REAL_BACKENDS:
            problems.append(Problem("backend", f"{self.backend!r} is not one of {', '.join(REAL_BACKENDS)}"))
        if (
            isinstance(self.check_interval, bool)
            or not isinstance(self.check_interval, (int, float))
            or self.check_interval <= 0
        ):
            problems.append(
                Problem("check_interval", f"must be a positive number of seconds, got {self.check_interval!r}")
            )
        if self.max_attempts is not None and (
            isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int) or self.max_attempts < 1
        ):
            problems.append(
                Problem(
                    "max_attempts", f"must be a whole number of looks (1 or more) or None, got {self.max_attempts!r}"
                )
            )
        if self.backend == "local":
            if not unknown(self.command) and not _is_command(self.command):
                problems.append(
                    Problem(
                        "command",
                        f"the local backend needs a non-empty string or list of strings, got {self.command!r}",
                    )
                )
            if self.training_request is not None:
                problems.append(
                    Problem("training_request", "is for the sagemaker backend; the local backend runs command")
                )
            if self.env is not None and not unknown(self.env) and not isinstance(self.env, Mapping):
                problems.append(Problem("env", f"must be a mapping of names to values, got {self.env!r}"))
        elif self.backend == "sagemaker":
            for name in ("command", "env", "cwd"):
                if getattr(self, name) is not None:
                    problems.append(
                        Problem(name, "is for the local backend; the sagemaker backend runs training_request")
                    )
            if not unknown(self.training_request):
                problems.extend(_training_request_problems(self.training_request))
            if self.checkpoint_uri and not unknown(self.checkpoint_uri) and not self.checkpoint_uri.startswith("s3://"):
                problems.append(
                    Problem("checkpoint_uri", f"SageMaker saves checkpoints only to S3, got {self.checkpoint_uri!r}")
                )
        problems.extend(request_problems(self._request_arguments(), parse_time, priority))
        return problems

    def _request_arguments(self) -> dict[str, Any]:
        """The arguments that make the job's submission (``operators/arguments.py``): its
        request's and its expected runtime."""
        return {name: getattr(self, name) for name in SUBMISSION_ARGUMENTS}

    def _job_request(self, default_name: str, priority: int | None) -> JobRequest:
        """The ``JobRequest`` built from the rendered arguments; they are never changed."""
        return job_request(self._request_arguments(), default_name, priority)

    def _read_rendered(self) -> None:
        """Once rendered: strings that hold a list, an object or a number become that value
        where the parameter expects one (Jinja renders to text; TaskFlow outputs arrive as
        they are)."""
        for name, value in read_rendered(self._request_arguments()).items():
            setattr(self, name, value)
        self.env = rendered_as(self.env, dict)
        self.training_request = rendered_as(self.training_request, dict)
        if isinstance(self.training_request, Mapping):
            self.training_request = with_integers(self.training_request)
        if isinstance(self.command, str) and self.command.strip().startswith("["):
            self.command = rendered_as(self.command, list)

    def _training(self) -> dict[str, Any]:
        """What the backend runs, copied from the rendered arguments."""
        if self.backend == "sagemaker":
            return dict(self.training_request or {})
        training: dict[str, Any] = {"command": list(self.command) if isinstance(self.command, list) else self.command}
        if self.env:
            training["env"] = {str(k): str(v) for k, v in self.env.items()}
        if self.cwd:
            training["cwd"] = self.cwd
        return training

    def _prepare_training_request(self) -> None:
        """SageMaker only, before submitting: the role name expanded, then every field
        botocore's model refuses once placed named in the task's failure."""
        assert isinstance(self.training_request, Mapping)
        jobs = TrainingJobs(self._calls_aws_conn_id())
        try:
            self.training_request = jobs.expand_role(self.training_request)
        except Exception as exc:  # IAM refused or could not be reached: say so, not a traceback
            raise AirflowFailException(
                f"task {self.task_id!r}: training_request.RoleArn: cannot expand the role name"
                f" {self.training_request.get('RoleArn')!r} to its ARN through aws_conn_id"
                f" {jobs.aws_conn_id!r}: {exc}"
            ) from exc
        assert isinstance(self.instance_preferences, list)
        problems = placed_request_problems(
            self.training_request, self.share, self.instance_preferences, self.checkpoint_uri
        )
        if problems:
            raise AirflowFailException(
                f"task {self.task_id!r}: the training request is not a valid CreateTrainingJob request"
                f" (checked before submitting): {InvalidInput(problems)}"
            )

    def _calls_aws_conn_id(self) -> str:
        """The AWS connection of the task's own SageMaker and IAM calls: its ``aws_conn_id``,
        else its share's in the quota configuration, else the provider's ``aws_default``."""
        if self.aws_conn_id:
            return self.aws_conn_id
        latest = self.hook.store.latest_config()
        share = latest[1].share(self.share) if latest is not None else None
        return (share.aws_conn_id if share is not None else None) or "aws_default"

    # -- execution ---------------------------------------------------------------------------

    def execute(self, context: Context) -> dict[str, Any] | None:
        ti = context["ti"]
        dag_id, task_id, run_id = ti.dag_id, ti.task_id, ti.run_id
        map_index = ti.map_index if ti.map_index is not None else -1
        try:
            override = priority_override(context)
        except ValueError as exc:
            raise AirflowFailException(f"cannot use the run's priority override: {exc}") from exc
        self._read_rendered()
        problems = self.argument_problems(priority=override)
        if problems:
            raise AirflowFailException(f"task {task_id!r}: invalid arguments once rendered: {InvalidInput(problems)}")
        if self.backend == "sagemaker":
            self._prepare_training_request()

        job = self._submitted_job(dag_id, task_id, run_id, map_index, override, task_actor(context))
        self.job_id = job.id
        ti.xcom_push(key=XCOM_JOB_ID, value=job.id)
        if job.state in FINAL_STATES:
            self.log.info("quota job %s is already %s", job.id, job.state)
            return self._finish(context, job.id, QuotaJobEvent.from_payload(_final_payload(job)))
        if not self.wait_for_completion:
            self.log.info(
                "quota job %s is %s; not waiting for it (wait_for_completion=False): a QuotaJobSensor with"
                " job_id=%s waits for its end",
                job.id,
                job.state,
                job.id,
            )
            self.outcome = {**job_summary(job, 0), "reason": job.reason, "training_job": None}
            return job_summary(job, 0)
        give_up_at = self._give_up_at()
        if self.deferrable:
            self.defer(
                trigger=QuotaJobTrigger(
                    job_id=job.id,
                    quota_conn_id=self.quota_conn_id,
                    poll_interval=self.check_interval,
                    cancel_on_kill=True,
                    print_log=self.print_log,
                    aws_conn_id=self._calls_aws_conn_id() if self.backend == "sagemaker" else None,
                    give_up_at=give_up_at,
                    fire_not_before=settled_after_deferral(),
                ),
                method_name="execute_complete",
                timeout=self.execution_timeout,  # as the amazon provider's deferrable operators
            )
        return self._finish(context, job.id, self._wait_in_worker(job, give_up_at))

    def _give_up_at(self) -> float | None:
        """When the wait ends if the job is still live: ``max_attempts`` looks from now."""
        return None if self.max_attempts is None else time.time() + self.check_interval * self.max_attempts

    def _submitted_job(
        self, dag_id: str, task_id: str, run_id: str, map_index: int, override: int | None, actor: Actor
    ) -> JobRow:
        """This task instance's job: the one an earlier try submitted if it is still live (and
        not being cancelled) or succeeded; else a new submission."""
        generation, found = 1, None
        while (
            job := self.hook.get_job_by_token(client_token(dag_id, task_id, run_id, map_index, generation))
        ) is not None:
            found = job
            generation += 1
        if found is not None:
            reusable = found.state == JobState.SUCCEEDED.value or (
                found.state in LIVE_STATES and not self.hook.cancel_requested(found.id)
            )
            if reusable:
                self.log.info("found quota job %s (%s) of an earlier try: %s", found.id, found.name, found.state)
                return found
            self.log.info(
                "quota job %s of an earlier try is %s %s: submitting a new one",
                found.id,
                found.state,
                found.reason or "(cancellation requested)",
            )
        else:
            generation = 1
        if self.job_name:
            name = self.job_name if generation == 1 else f"{self.job_name[: JOB_NAME_LENGTH - 6]}-r{generation}"
        else:
            name = derived_job_name(dag_id, task_id, run_id, map_index, generation)
        request = self._job_request(name, override)
        try:
            job = self.hook.submit(
                request,
                self.backend,
                self._training(),
                client_token=client_token(dag_id, task_id, run_id, map_index, generation),
                dag_id=dag_id,
                task_id=task_id,
                run_id=run_id,
                aws_conn_id=self.aws_conn_id if self.backend == "sagemaker" else None,
                actor=actor,
                priority_overridden=override is not None,
                map_index=map_index,
                expected_runtime_seconds=expected_runtime_seconds(self.expected_runtime),
            )
        except (SubmissionRejected, ChangeRefused, InvalidInput) as exc:
            source = f" ({QUOTA_PRIORITY_PARAM}={override} from the run's conf)" if override is not None else ""
            raise AirflowFailException(f"quota job {name!r} was not submitted{source}: {exc}") from exc
        priority = f", priority {request.priority}" + (" (run conf override)" if override is not None else "")
        self.log.info("submitted as quota job %s to share %s (%s%s)", job.id, job.share, job.name, priority)
        return job

    def _wait_in_worker(self, job: JobRow, give_up_at: float | None) -> QuotaJobEvent:
        """Not deferrable: poll in the worker, logging each change, until the job is final (or
        the time to give up, ``max_attempts``, came)."""
        last: tuple[Any, ...] | None = None
        announced: float | None = None  # the max_pending deadline last said in the log
        while True:
            current = self.hook.get_job(job.id)
            if current is None:
                refusal = self.hook.submission_refusal(job.id)
                message = (
                    f"the quota scheduler refused quota job {job.id}: {refusal}"
                    if refusal
                    else f"no quota job {job.id}"
                )
                return QuotaJobEvent("error", job.id, None, None, message)
            if state_key(current) != last:
                self.log.info("%s", self.hook.describe(current))  # borrowing as it is now
                last = state_key(current)
            if current.pending_deadline != announced and (due := describe_pending_deadline(current, time.time())):
                self.log.info("%s", due)
                announced = current.pending_deadline
            if current.state in FINAL_STATES:
                return QuotaJobEvent.from_payload(_final_payload(current))
            if give_up_at is not None and time.time() >= give_up_at:
                return QuotaJobEvent("timeout", job.id, current.state, None, "gave up waiting (give_up_at)")
            time.sleep(self.check_interval)

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> dict[str, Any]:
        """Resume after ``QuotaJobTrigger`` fired: success returns the summary; anything else
        fails the task with the quota's reason."""
        try:
            payload = QuotaJobEvent.from_payload(event)
        except ValueError as exc:
            raise AirflowException(f"unexpected event from the quota trigger: {exc}") from exc
        self.job_id = payload.job_id
        return self._finish(context, payload.job_id, payload)

    def _finish(self, context: Context, job_id: int, event: QuotaJobEvent) -> dict[str, Any]:
        """The task's end once the wait is over: the summary, or one line saying why the task
        fails (when the cause is outside the training, or the wait was given up), then the
        exception."""
        if event.status == "error":
            self.log.error("%s", unfollowed(job_id, event.message))
            raise AirflowException(f"quota job {job_id}: {event.message}")
        if event.status == "timeout":
            looks = f"{self.max_attempts} looks {self.check_interval:g} s apart (max_attempts)"
            self.log.error(
                "gave up waiting for quota job %s after %s: it is %s and is left as it is; a retry of this task"
                " waits on it again, `airflow-quota jobs cancel %s` stops it",
                job_id,
                looks,
                event.state,
                job_id,
            )
            raise AirflowException(f"quota job {job_id} was still {event.state} after {looks}")
        job = self.hook.get_job(job_id)
        if job is None:
            raise AirflowException(f"quota job {job_id} is no longer in the quota database")
        story = self.hook.job_story(job_id)
        if story:
            self.log.info("the story of quota job %s (%s):\n  %s", job.id, job.name, "\n  ".join(story))
        attempts = self.hook.get_attempts(job_id)
        training_job = self._last_training_job(context, attempts)
        borrowed = max((a.borrowed for a in attempts), default=0)
        self.outcome = {**job_summary(job, borrowed), "reason": job.reason, "training_job": training_job}
        if event.status == "success" and job.state == JobState.SUCCEEDED.value:
            summary = job_summary(job, borrowed)
            self.log.info(
                "quota job %s SUCCEEDED on %sx %s: %s attempt(s), %s preemption(s), %.3f GPU-hours (%.3f lost), "
                "cost $%.2f, waited %s",
                job.id,
                job.count,
                job.instance_type,
                job.attempts,
                job.preemptions,
                job.gpu_hours,
                job.lost_gpu_hours,
                job.cost,
                duration_words(job.wait_seconds),
            )
            if self.backend == "sagemaker" and training_job is not None:
                self.training_description = TrainingJobs(self._calls_aws_conn_id()).describe(training_job)
                return {"Training": self.training_description, "quota": summary}
            return summary
        reason = job.reason or event.reason or "UNKNOWN"
        if (line := outside_the_training(job, attempts)) is not None:
            self.log.error("%s", line)
        message = f"quota job {job.id} ({job.name}) failed: {reason}: {job.detail or event.message}"
        if reason == FailureReason.CANCELLED.value:
            raise AirflowFailException(message)  # someone meant it: no Airflow retry
        raise AirflowException(message)

    def _last_training_job(self, context: Context, attempts: Sequence[Any]) -> str | None:
        """The training job of the last attempt SageMaker ran (the successful one, if any), its
        console and log links stored for the task's buttons."""
        if self.backend != "sagemaker":
            return None
        started = [a for a in attempts if a.external_name]
        succeeded = [a for a in started if a.status == AttemptState.SUCCEEDED.value]
        chosen = (succeeded or started or [None])[-1]
        if chosen is None:
            return None
        name = str(chosen.external_name)
        jobs = TrainingJobs(self._calls_aws_conn_id())
        for link in (SageMakerTrainingJobLink, TrainingLogsLink):
            link.persist(context, self, region_name=jobs.region_name, aws_partition=jobs.partition, job_name=name)
        return name

    # -- lineage (the OpenLineage provider calls these; imported only then) ----------------------

    def get_openlineage_facets_on_start(self) -> OperatorLineage[Any, Any]:
        """Before the job is submitted: the request's S3 inputs (sagemaker backend)."""
        from airflow_quota.operators.lineage import lineage_at_start

        return lineage_at_start(self.backend, self.training_request)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> OperatorLineage[Any, Any]:
        """The training's lineage once the task succeeded: inputs, the model written
        (sagemaker), and the ``quotaJob`` run facet."""
        from airflow_quota.operators.lineage import lineage_at_end

        return lineage_at_end(
            self.backend, self.training_request, self.checkpoint_uri, self.outcome, self.training_description
        )

    def get_openlineage_facets_on_failure(self, task_instance: Any) -> OperatorLineage[Any, Any]:
        """The same once the task failed: the ``quotaJob`` facet carries the reason code."""
        return self.get_openlineage_facets_on_complete(task_instance)

    def on_kill(self) -> None:
        """The task was killed while running in a worker (not deferred): cancel its job. A
        deferred task is cancelled by ``QuotaJobTrigger.on_kill`` in the triggerer instead."""
        if self.job_id is None:
            return
        if self.hook.cancel(self.job_id):
            self.log.info("quota job %s: cancellation requested (the task was killed)", self.job_id)


def _final_payload(job: JobRow) -> dict[str, Any]:
    status: Status = "success" if job.state == JobState.SUCCEEDED.value else "failed"
    return QuotaJobEvent(status, job.id, job.state, job.reason, describe_job(job)).payload()


def _is_command(command: Any) -> bool:
    if isinstance(command, str):
        return bool(command.strip())
    return isinstance(command, list) and bool(command) and all(isinstance(a, (str, int, float)) for a in command)


def _training_request_problems(request: Any) -> list[Problem]:
    """A SageMaker request must leave the placement's fields to the quota scheduler."""
    if not isinstance(request, Mapping) or not request:
        return [
            Problem("training_request", f"the sagemaker backend needs a CreateTrainingJob request, got {request!r}")
        ]
    problems = []
    if "TrainingJobName" in request:
        problems.append(Problem("training_request.TrainingJobName", "is chosen by the sagemaker backend per attempt"))
    resource = request.get("ResourceConfig") or {}
    for field in PLACEMENT_FIELDS:
        if isinstance(resource, Mapping) and field in resource:
            problems.append(
                Problem(
                    f"training_request.ResourceConfig.{field}",
                    "is chosen by the quota scheduler from instance_preferences; leave it out",
                )
            )
    checkpoint = request.get("CheckpointConfig") or {}
    if isinstance(checkpoint, Mapping) and "S3Uri" in checkpoint:
        problems.append(Problem("training_request.CheckpointConfig.S3Uri", "comes from checkpoint_uri; leave it out"))
    return problems
