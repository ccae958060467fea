"""Sensors on the quota state: a job reaching a final state, a share able to place a list.

Both poke through ``QuotaHook`` and, deferrable (the default, as for the operator:
``operators/deferral.py``), wait in the triggerer instead: ``QuotaJobSensor`` with
``QuotaJobTrigger`` (which never cancels the job it watches), ``QuotaCapacitySensor`` with
``QuotaCapacityTrigger``. Both take the amazon sensors' ``max_attempts`` beside Airflow's
``poke_interval``, as ``EmrJobFlowSensor`` does: the sensor times out after
``poke_interval x max_attempts`` seconds, in every mode.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from functools import cached_property
from typing import Any, ClassVar

from airflow.sdk import BaseSensorOperator, Context
from airflow.sdk.exceptions import AirflowException
from pydantic import ValidationError

from airflow_quota.core.config import pydantic_problems
from airflow_quota.core.model import FINAL_STATES, JobRequest, JobState
from airflow_quota.exceptions import InvalidInput, Problem
from airflow_quota.hooks.quota import QuotaHook
from airflow_quota.operators.arguments import has_template
from airflow_quota.operators.deferral import default_deferrable
from airflow_quota.triggers.quota import QuotaCapacityTrigger, QuotaJobEvent, QuotaJobTrigger, settled_after_deferral


def max_attempts_problems(max_attempts: Any) -> list[Problem]:
    """``max_attempts`` is None or a whole number of looks, 1 or more."""
    if max_attempts is None or (
        isinstance(max_attempts, int) and not isinstance(max_attempts, bool) and max_attempts >= 1
    ):
        return []
    return [Problem("max_attempts", f"must be a whole number of looks (1 or more) or None, got {max_attempts!r}")]


def bounded_timeout(timeout: float, poke_interval: float, max_attempts: int | None) -> float:
    """The sensor's timeout once ``max_attempts`` looks ``poke_interval`` apart bound it too."""
    return timeout if max_attempts is None else min(timeout, poke_interval * max_attempts)


class QuotaJobSensor(BaseSensorOperator):
    """Wait until a quota job is final; succeed when it SUCCEEDED, fail with its reason code
    when it FAILED (unless ``fail_on_job_failure`` is False). Never changes the job.

    The pair for ``QuotaTrainingOperator(wait_for_completion=False)``, as
    ``SageMakerTrainingSensor`` is for ``SageMakerTrainingOperator``: the operator submits and
    returns the job's summary at once, the sensor waits for the job's end::

        train = QuotaTrainingOperator(task_id="train", wait_for_completion=False, ...)
        wait = QuotaJobSensor(task_id="wait", job_id=train.output)  # or "{{ ti.xcom_pull('train')['job_id'] }}"

    :param job_id: the quota job's id (an integer, or text holding one), or the return value of a
        ``QuotaTrainingOperator`` (its summary, ``{"job_id": ...}``, or the sagemaker backend's
        ``{"quota": {"job_id": ...}}``); Jinja and TaskFlow outputs are resolved first, e.g.
        ``train.output`` or ``"{{ ti.xcom_pull(task_ids='train', key='quota_job_id') }}"``.
        (templated)
    :param fail_on_job_failure: fail the sensor when the job FAILED (True) or succeed as soon as
        the job is final, whatever its outcome (False).
    :param quota_conn_id: the Airflow connection of the quota database.
    :param max_attempts: how many looks, ``poke_interval`` apart, before the sensor times out:
        its ``timeout`` becomes at most ``poke_interval x max_attempts`` seconds, deferred or not
        (as the amazon provider's ``EmrJobFlowSensor``). None: Airflow's ``timeout`` alone.
    :param deferrable: wait in the triggerer, polling every ``poke_interval`` seconds. By
        default ``[operators] default_deferrable`` when ``AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE``
        sets it, else True (``airflow_quota.operators.deferral``).
    """

    template_fields: Sequence[str] = ("job_id",)

    def __init__(
        self,
        *,
        job_id: int | str | Mapping[str, Any],
        fail_on_job_failure: bool = True,
        quota_conn_id: str = QuotaHook.default_conn_name,
        max_attempts: int | None = None,
        deferrable: bool | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if problems := max_attempts_problems(max_attempts):
            raise InvalidInput(problems)
        self.job_id = job_id
        self.fail_on_job_failure = fail_on_job_failure
        self.quota_conn_id = quota_conn_id
        self.max_attempts = max_attempts
        self.timeout = bounded_timeout(self.timeout, self.poke_interval, max_attempts)
        self.deferrable = default_deferrable() if deferrable is None else deferrable

    @cached_property
    def hook(self) -> QuotaHook:
        return QuotaHook(self.quota_conn_id)

    def _job_id(self) -> int:
        """The job's id, from an id, text holding one, or an operator's summary."""
        value: Any = self.job_id
        if isinstance(value, Mapping) and isinstance(value.get("quota"), Mapping):
            value = value["quota"]  # the sagemaker backend's {"Training": ..., "quota": summary}
        if isinstance(value, Mapping):
            value = value.get("job_id")
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise AirflowException(
            f"job_id must be a quota job's id (an integer) or a QuotaTrainingOperator's return value"
            f" holding one, got {self.job_id!r}"
        )

    def poke(self, context: Context) -> bool:
        job_id = self._job_id()
        job = self.hook.get_job(job_id)
        if job is None:
            raise AirflowException(f"there is no quota job {job_id} in the quota database")
        self.log.info("%s", self.hook.describe(job))
        if job.state not in FINAL_STATES:
            return False
        if job.state == JobState.FAILED.value and self.fail_on_job_failure:
            raise AirflowException(f"quota job {job.id} ({job.name}) failed: {job.reason}: {job.detail}")
        return True

    def execute(self, context: Context) -> None:
        if not self.deferrable:
            super().execute(context)
            return
        if self.poke(context):
            return
        self.defer(
            trigger=QuotaJobTrigger(
                job_id=self._job_id(),
                quota_conn_id=self.quota_conn_id,
                poll_interval=self.poke_interval,
                fire_not_before=settled_after_deferral(),
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout),
        )

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> None:
        try:
            payload = QuotaJobEvent.from_payload(event)
        except ValueError as exc:
            raise AirflowException(f"unexpected event from the quota trigger: {exc}") from exc
        if payload.status == "error":
            raise AirflowException(payload.message)
        if payload.status == "failed" and self.fail_on_job_failure:
            raise AirflowException(f"quota job {payload.job_id} failed: {payload.reason}: {payload.message}")
        if payload.status == "timeout":  # the sensor sets no give_up_at; its timeout ends the deferral
            raise AirflowException(f"quota job {payload.job_id}: still {payload.state}: {payload.message}")
        self.log.info("%s", payload.message)


class QuotaCapacitySensor(BaseSensorOperator):
    """Wait until a share could place a preference list now (``QuotaHook.can_place_now``: the
    quota scheduler's own placement check as of its last commit, no preemption). Useful to
    start expensive preparation only when training could start.

    :param share: the quota share. (templated)
    :param instance_preferences: the list to place, as for ``QuotaTrainingOperator``. (templated)
    :param quota_conn_id: the Airflow connection of the quota database.
    :param max_attempts: how many checks, ``poke_interval`` apart, before the sensor times out:
        its ``timeout`` becomes at most ``poke_interval x max_attempts`` seconds. None:
        Airflow's ``timeout`` alone.
    :param deferrable: wait in the triggerer, checking every ``poke_interval`` seconds. By
        default ``[operators] default_deferrable`` when ``AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE``
        sets it, else True (``airflow_quota.operators.deferral``).
    """

    template_fields: Sequence[str] = ("share", "instance_preferences")
    template_fields_renderers: ClassVar[dict[str, str]] = {"instance_preferences": "json"}

    def __init__(
        self,
        *,
        share: str,
        instance_preferences: list[dict[str, Any]] | str,
        quota_conn_id: str = QuotaHook.default_conn_name,
        max_attempts: int | None = None,
        deferrable: bool | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if problems := max_attempts_problems(max_attempts):
            raise InvalidInput(problems)
        self.share = share
        self.instance_preferences = instance_preferences
        self.quota_conn_id = quota_conn_id
        self.max_attempts = max_attempts
        self.timeout = bounded_timeout(self.timeout, self.poke_interval, max_attempts)
        self.deferrable = default_deferrable() if deferrable is None else deferrable
        if not has_template(instance_preferences):
            self._preferences()

    @cached_property
    def hook(self) -> QuotaHook:
        return QuotaHook(self.quota_conn_id)

    def _preferences(self) -> list[dict[str, Any]]:
        """The list, checked by the rules of a job's list (1-5 entries, counts >= 1, each type
        once); ``InvalidInput`` names the entry and the rule."""
        try:
            request = JobRequest(name="capacity-check", share="share", preferences=self.instance_preferences)
        except ValidationError as exc:
            raise InvalidInput(
                Problem(p.path.replace("preferences", "instance_preferences", 1), p.message)
                for p in pydantic_problems(exc)
            ) from None
        return [entry.model_dump(exclude_none=True) for entry in request.preferences]

    def poke(self, context: Context) -> bool:
        check = self.hook.can_place_now(self.share, self._preferences())
        self.log.info("share %s: %s", self.share, check.reason)
        return check.placeable

    def execute(self, context: Context) -> None:
        preferences = self._preferences()
        if not self.deferrable:
            super().execute(context)
            return
        if self.poke(context):
            return
        self.defer(
            trigger=QuotaCapacityTrigger(
                share=self.share,
                instance_preferences=preferences,
                quota_conn_id=self.quota_conn_id,
                poll_interval=self.poke_interval,
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout),
        )

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> None:
        if not isinstance(event, dict) or event.get("status") != "success":
            message = event.get("message") if isinstance(event, dict) else event
            raise AirflowException(f"share {self.share}: capacity check failed: {message}")
        self.log.info("share %s: %s", self.share, event.get("message"))
