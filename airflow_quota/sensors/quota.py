"""Sensors on the quota state: a job reaching a final state, a share able to place a list.

Both poke through ``QuotaHook`` and, deferrable (the default), wait in the triggerer instead:
``QuotaJobSensor`` with ``QuotaJobTrigger`` (which never cancels the job it watches),
``QuotaCapacitySensor`` with ``QuotaCapacityTrigger``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from functools import cached_property
from typing import Any, ClassVar

from airflow.sdk import BaseSensorOperator, Context
from airflow.sdk.exceptions import AirflowException
from pydantic import ValidationError

from airflow_quota.core.config import pydantic_problems
from airflow_quota.core.model import FINAL_STATES, JobRequest, JobState
from airflow_quota.exceptions import InvalidInput, Problem
from airflow_quota.hooks.quota import QuotaHook, describe_job
from airflow_quota.operators.arguments import has_template
from airflow_quota.triggers.quota import QuotaCapacityTrigger, QuotaJobEvent, QuotaJobTrigger


class QuotaJobSensor(BaseSensorOperator):
    """Wait until a quota job is final; succeed when it SUCCEEDED, fail with its reason code
    when it FAILED (unless ``fail_on_job_failure`` is False). Never changes the job.

    :param job_id: the quota job's id, e.g. ``"{{ ti.xcom_pull('train', key='quota_job_id') }}"``.
        (templated)
    :param fail_on_job_failure: fail the sensor when the job FAILED (True) or succeed as soon as
        the job is final, whatever its outcome (False).
    :param quota_conn_id: the Airflow connection of the quota database.
    :param deferrable: wait in the triggerer, polling every ``poke_interval`` seconds.
    """

    template_fields: Sequence[str] = ("job_id",)

    def __init__(
        self,
        *,
        job_id: int | str,
        fail_on_job_failure: bool = True,
        quota_conn_id: str = QuotaHook.default_conn_name,
        deferrable: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.job_id = job_id
        self.fail_on_job_failure = fail_on_job_failure
        self.quota_conn_id = quota_conn_id
        self.deferrable = deferrable

    @cached_property
    def hook(self) -> QuotaHook:
        return QuotaHook(self.quota_conn_id)

    def _job_id(self) -> int:
        try:
            return int(self.job_id)
        except (TypeError, ValueError):
            raise AirflowException(f"job_id must be a quota job's id (an integer), got {self.job_id!r}") from None

    def poke(self, context: Context) -> bool:
        job_id = self._job_id()
        job = self.hook.get_job(job_id)
        if job is None:
            raise AirflowException(f"there is no quota job {job_id} in the quota database")
        self.log.info("%s", describe_job(job))
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
                job_id=self._job_id(), quota_conn_id=self.quota_conn_id, poll_interval=self.poke_interval
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
        self.log.info("%s", payload.message)


class QuotaCapacitySensor(BaseSensorOperator):
    """Wait until a share could place a preference list now (``QuotaHook.can_place_now``: the
    quota scheduler's own placement check as of its last commit, no preemption). Useful to
    start expensive preparation only when training could start.

    :param share: the quota share. (templated)
    :param instance_preferences: the list to place, as for ``QuotaTrainingOperator``. (templated)
    :param quota_conn_id: the Airflow connection of the quota database.
    :param deferrable: wait in the triggerer, checking every ``poke_interval`` seconds.
    """

    template_fields: Sequence[str] = ("share", "instance_preferences")
    template_fields_renderers: ClassVar[dict[str, str]] = {"instance_preferences": "json"}

    def __init__(
        self,
        *,
        share: str,
        instance_preferences: list[dict[str, Any]] | str,
        quota_conn_id: str = QuotaHook.default_conn_name,
        deferrable: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.share = share
        self.instance_preferences = instance_preferences
        self.quota_conn_id = quota_conn_id
        self.deferrable = deferrable
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
