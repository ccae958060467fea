"""The Quotas JSON API: shares, jobs, one job, preemptions, alerts, utilisation history, and
the two changes a person may make (a job's priority, cancelling a job).

Every route needs an Airflow login with the right to read DAGs (``security.py``); jobs and
what names them are filtered to the DAGs the user may read, and changes need the right to edit
the job's DAG. Times are epoch seconds on the quota scheduler's clock; every answer carries
``now`` on that clock so ages can be computed without trusting the browser's. Beside each
duration and instant, a ``*_text`` field says it for people, from ``core.human_time`` (as the
CLI and the task log do): the page shows those and formats no time itself.

Refusals: an unknown job is 404, and so are an id outside the database's integer range
(1..2^63-1) and a job of a DAG the user may not read (the same answer byte for byte,
``security.no_such_job``: it names no DAG and does not tell that the id exists); a change to a
job that is already final is 409; a priority outside 0-9999 or above the share's
``max_priority``, and a number that is not finite (``NaN``, ``Infinity``), are 422, in
FastAPI's validation-error shape (``detail[].loc`` names the field, ``detail[].msg`` the
rule). Changes are requests to the quota scheduler (202): they take
effect at its next cycle.

A change is checked in this order, so a request nobody may make costs the api-server nothing:
a login with the right to read DAGs (401/403, ``app.py``), a same-origin JSON request (403,
``security.same_origin_json``), the job, readable to the user (404), and the right to edit
its DAG (403), and only then the body: read up to ``MAX_BODY_BYTES`` (413 beyond, without reading the rest), parsed,
validated (422); then the job's state (409) and, for a priority, the share's
``access.set_priority`` rule for the logged-in user (403, ``core.access``). The body is therefore not a FastAPI body
parameter (FastAPI reads and validates those before any dependency runs); its schema is
given to OpenAPI by hand.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Iterable
from typing import Annotated, Any, Literal, TypeVar
from urllib.parse import quote

from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response, status
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from airflow_quota.core.human_time import clock_time
from airflow_quota.core.model import HOLDING_STATES, LIVE_STATES, JobState
from airflow_quota.core.visibility import pending_seconds
from airflow_quota.exceptions import ChangeRefused, PriorityChangeDenied
from airflow_quota.plugins import URL_PREFIX
from airflow_quota.plugins.security import ANOTHER_JOB, DagAccess, DagAccessDep, SameOriginJson, no_such_job
from airflow_quota.store import dashboard
from airflow_quota.store.forecast_words import forecast_record, forecast_short, forecast_words
from airflow_quota.store.models import ForecastRow, JobRow
from airflow_quota.store.repository import QuotaStore

MAX_HISTORY_HOURS = 24 * 31
MAX_JOB_ID = 2**63 - 1
"""The largest id the quota database can hold (a signed 64-bit integer); larger ids are 404."""
MAX_BODY_BYTES = 4096
"""The largest request body a change may carry; a priority needs a dozen bytes."""

ModelT = TypeVar("ModelT", bound=BaseModel)

StateName = Literal["SUBMITTED", "RUNNABLE", "SCHEDULED", "STARTING", "RUNNING", "SUCCEEDED", "FAILED"]


def get_store(request: Request) -> QuotaStore:
    """FastAPI dependency: the quota database, as the app was told to find it (``app.py``)."""
    provider = request.app.state.quota_store
    store: QuotaStore = provider()
    return store


StoreDep = Annotated[QuotaStore, Depends(get_store)]


# -- response models -----------------------------------------------------------------------------


class _Model(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class SchedulerStatus(BaseModel):
    running: bool = Field(description="False when no quota scheduler has beaten for 3x its heartbeat interval")
    leader: str | None = Field(description="the scheduler that leads, or last led")
    silent_seconds: float | None = Field(description="seconds since its last heartbeat (None: never led)")
    silent_text: str | None = Field(description="silent_seconds in words (core.human_time)")
    heartbeat_seconds: float | None = Field(description="how often it beats")


class SharesResponse(BaseModel):
    now: float
    now_text: str = Field(description="now on a UTC clock (core.human_time), as the page's header says it")
    scheduler: SchedulerStatus
    config_version: int | None
    config_taken_in: bool = Field(
        description="whether a quota scheduler has taken in config_version; before any has run, the shares are "
        "that configuration's limits with nothing used, borrowed or lent"
    )
    computed_at: float | None = Field(
        description="when the leading quota scheduler computed this view, at the commit that last changed it "
        "(None before its first commit); it stays exact until the next commit, ages are as of now"
    )
    shares: list[dashboard.ShareSummary]


class PreferenceModel(BaseModel):
    instance_type: str
    count: int
    training_plan: str | None = None


class JobModel(_Model):
    """A job as the quota scheduler last wrote it, with where it stands and what the user may do."""

    id: int
    name: str
    share: str
    priority: int
    state: str
    reason: str | None = Field(description="failure reason code when FAILED")
    detail: str | None
    backend: str
    instance_type: str | None = Field(description="where the current or last attempt was placed")
    count: int | None
    training_plan: str | None
    borrowed: int = Field(
        description="of the instances it holds, how many are above its share's limit now (0 when it holds none): "
        "docs/model.md rule 4.3.3's count with the placements still held taken in the order they were made "
        "(dashboard.borrowed_now); it falls when jobs of the share placed before it leave"
    )
    borrowed_when_placed: int = Field(description="instances above the share's limit at its last placement")
    attempts: int
    preemptions: int
    wait_seconds: float = Field(description="time waited before its placements (the current wait not included)")
    wait_text: str = Field(description="wait_seconds in words (core.human_time)")
    waited_seconds: float = Field(description="time waited in all: wait_seconds and, while RUNNABLE, the current wait")
    waited_text: str = Field(description="waited_seconds in words (core.human_time)")
    gpu_hours: float = Field(description="GPU-hours used, the running attempt so far included")
    lost_gpu_hours: float
    cost: float = Field(description="USD, the running attempt so far included")
    pending_reason: str | None = Field(description="why a RUNNABLE job waits (docs/model.md rule 3.3)")
    waiting_for: str | None = Field(description="the preference entry it waits for")
    position_in_share: int | None
    position_in_queue: int | None
    waiting_since: float | None = Field(description="when a RUNNABLE job last became RUNNABLE")
    waiting_since_text: str | None = Field(description="waiting_since on a UTC clock (core.human_time)")
    pending_seconds: float | None = Field(description="how long a RUNNABLE job has waited since then, now")
    pending_text: str | None = Field(description="pending_seconds in words (core.human_time)")
    preferences: list[PreferenceModel]
    dag_id: str | None
    task_id: str | None
    run_id: str | None
    map_index: int | None = Field(description="the mapped task instance's index; null: not mapped")
    submitted_at: float
    submitted_at_text: str = Field(description="submitted_at on a UTC clock (core.human_time)")
    updated_at: float
    can_edit: bool = Field(description="whether the requesting user may change this job")
    can_set_priority: bool = Field(
        description="whether the user may also change its priority: can_edit, and the share's "
        "access.set_priority rule (if any) lists the user"
    )
    page_url: str = Field(description="the job's page")
    task_url: str | None = Field(description="the Airflow task instance that submitted it")
    forecast: ForecastModel | None = Field(
        default=None, description="a live job's latest forecast (docs/forecast.md); null when none was made yet"
    )
    forecast_words: str | None = Field(
        default=None, description="the forecast in words: 'expected to start around 14:20 UTC, likely ...'"
    )
    forecast_short: str | None = Field(
        default=None, description="the forecast as the queue shows it: 'around 14:20 UTC (...)'"
    )


class ForecastModel(_Model):
    """When a waiting job is expected to start, or a running job to end (``quota_forecasts``)."""

    made_at: float
    start: float | None = Field(description="the median expected start; null: none can be given (see reason)")
    low: float | None = Field(description="the early end of the 10-90% range (of the start, or of the end)")
    high: float | None = Field(description="the late end of the 10-90% range; null: beyond the forecast's horizon")
    end: float | None = Field(description="a job holding capacity: its expected end")
    instance_type: str | None = Field(description="the entry it is expected to start on")
    count: int | None
    borrowed: int = Field(description="instances above its share's limit it is expected to start with")
    preempts: bool = Field(description="whether it is expected to preempt to start")
    must_borrow: int = Field(description="instances its expected entry asks above its share's limit, lent at once")
    estimate_source: str = Field(description="where its runtime estimate came from")
    reason: str | None


class JobsResponse(BaseModel):
    now: float
    jobs: list[JobModel]


class AttemptModel(_Model):
    """One placement of the job."""

    number: int
    instance_type: str
    count: int
    training_plan: str | None
    borrowed: int
    status: str
    placed_at: float
    placed_at_text: str | None = Field(default=None, description="placed_at on a UTC clock (core.human_time)")
    running_since: float | None
    running_since_text: str | None = Field(default=None, description="running_since on a UTC clock (core.human_time)")
    ended_at: float | None
    ended_at_text: str | None = Field(default=None, description="ended_at on a UTC clock (core.human_time)")
    reason: str | None = Field(description="the backend's reason as it gave it (ExitCode:-15, a FailureReason)")
    why_ended: str | None = Field(
        default=None,
        description='why it ended, for people: "stopped by SIGTERM: preempted" (dashboard.attempt_reason_text)',
    )

    @classmethod
    def of(cls, attempt: Any, now: float, preempted: bool = False, cancelled: bool = False) -> AttemptModel:
        """An attempt row with its instants and its end for people as of ``now``; ``preempted``
        and ``cancelled`` say what stopped it."""
        return cls.model_validate(attempt).model_copy(
            update={
                "placed_at_text": dashboard.clock(attempt.placed_at, now),
                "running_since_text": dashboard.clock(attempt.running_since, now),
                "ended_at_text": dashboard.clock(attempt.ended_at, now),
                "why_ended": dashboard.attempt_reason_text(attempt.status, attempt.reason, preempted, cancelled),
            }
        )


class JobDetailResponse(BaseModel):
    now: float
    now_text: str = Field(description="now on a UTC clock (core.human_time), as the page's header says it")
    job: JobModel
    attempts: list[AttemptModel]
    preemptions: list[dashboard.PreemptionRecord] = Field(description="preemptions this job suffered")
    caused: list[dashboard.PreemptionRecord] = Field(description="preemptions this job caused")
    alerts: list[dashboard.AlertRecord]
    story: list[str] = Field(description="the quota scheduler's decisions about the job, in order")


class PreemptionsResponse(BaseModel):
    now: float
    preemptions: list[dashboard.PreemptionRecord]


class AlertsResponse(BaseModel):
    now: float
    alerts: list[dashboard.AlertRecord]


class UtilisationResponse(_Model):
    share: str
    start: float
    end: float
    gpu_hours: float
    borrowed_gpu_hours: float
    limit_gpu_hours: float
    utilisation: float | None = Field(description="used over guaranteed GPU-hours in the window")
    points: list[dashboard.UtilisationPoint] = Field(description="a step function: each point holds until the next")


class PriorityBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    priority: int = Field(ge=0, le=9999, strict=True, description="0-9999, at most the share's max_priority")


class CancelBody(BaseModel):
    """A cancellation carries nothing: an empty body or ``{}``."""

    model_config = ConfigDict(extra="forbid")


class ChangeResponse(BaseModel):
    job_id: int
    name: str
    change: Literal["priority", "cancel"]
    priority: int | None = None
    status: Literal["requested"] = "requested"
    message: str


# -- routes --------------------------------------------------------------------------------------

router = APIRouter(prefix="/api", tags=["quotas"])


@router.get("/shares", response_model=SharesResponse, summary="Shares with per-type use, lending and queue")
def get_shares(store: StoreDep) -> SharesResponse:
    """The leader's view of every share (``store/views.py``), with GPU-hours and cost; before a
    quota scheduler has taken in any configuration, the latest one's limits with nothing used."""
    now = store.clock()
    computed_at, shares, latest = dashboard.share_summaries(store, now)
    health = store.scheduler_health()
    return SharesResponse(
        now=now,
        now_text=clock_time(now, now),
        scheduler=SchedulerStatus(
            running=not health.down,
            leader=health.leader,
            silent_seconds=health.silent_seconds,
            silent_text=dashboard.words(health.silent_seconds),
            heartbeat_seconds=health.heartbeat_seconds,
        ),
        config_version=latest.version,
        config_taken_in=latest.taken_in,
        computed_at=computed_at,
        shares=shares,
    )


@router.get("/jobs", response_model=JobsResponse, summary="Jobs by share, state and DAG, queue order first")
def get_jobs(
    request: Request,
    store: StoreDep,
    access: DagAccessDep,
    share: str | None = None,
    state: Annotated[list[StateName] | None, Query(description="repeat for several states")] = None,
    dag_id: str | None = None,
    limit: Annotated[int, Query(ge=1, le=5000)] = 500,
) -> JobsResponse:
    jobs = dashboard.list_jobs(store, share=share, states=state, dag_id=dag_id, limit=limit)
    readable = access.readable(jobs, lambda job: job.dag_id)
    charges = dashboard.running_charges(store, readable)
    borrowing = dashboard.current_borrowing(store, readable)
    forecasts = store.forecasts([job.id for job in readable if job.state in LIVE_STATES])
    now = store.clock()
    return JobsResponse(
        now=now,
        jobs=[
            job_model(request, job, access, now, charges.get(job.id), borrowing.get(job.id, 0), forecasts.get(job.id))
            for job in readable
        ],
    )


@router.get("/jobs/{job_id}", response_model=JobDetailResponse, summary="One job: attempts, preemptions, cost, story")
def get_job(request: Request, job_id: int, store: StoreDep, access: DagAccessDep) -> JobDetailResponse:
    now = store.clock()
    detail = dashboard.job_detail(store, bounded_id(job_id), now)
    if detail is None:
        raise no_such_job(job_id)
    access.require_read(detail.job)
    preemptions = hide_preemptors(store, access, detail.preemptions)
    caused = access.readable(detail.caused, lambda p: p.dag_id)
    preempted = {p.attempt for p in detail.preemptions}
    cancelled = detail.job.reason == "CANCELLED"
    last = max((a.number for a in detail.attempts), default=None)
    return JobDetailResponse(
        now=now,
        now_text=clock_time(now, now),
        job=job_model(
            request,
            detail.job,
            access,
            now,
            dashboard.running_charges(store, [detail.job]).get(job_id),
            dashboard.current_borrowing(store, [detail.job]).get(job_id, 0),
            store.forecasts([detail.job.id]).get(detail.job.id),
        ),
        attempts=[
            AttemptModel.of(a, now, preempted=a.number in preempted, cancelled=cancelled and a.number == last)
            for a in detail.attempts
        ],
        preemptions=preemptions,
        caused=caused,
        alerts=list(detail.alerts),
        story=hide_in_story(detail.story, detail.job.name, detail.preemptions, preemptions, detail.caused, caused),
    )


def changeable_job(job_id: int, store: StoreDep, access: DagAccessDep) -> JobRow:
    """FastAPI dependency of the change routes: the job, once it is known and readable to the
    user (404 otherwise, as for no job) and the user may edit its DAG (403); the body is read
    only after this."""
    job = store.job(bounded_id(job_id))
    if job is None:
        raise no_such_job(job_id)
    access.require_read(job)
    access.require_edit(job)
    return job


ChangeableJob = Annotated[JobRow, Depends(changeable_job)]


async def priority_body(request: Request, job: ChangeableJob) -> PriorityBody:
    """The priority route's body, read after the edit right is checked (``job``)."""
    return validated(PriorityBody, await read_json(request))


async def cancel_body(request: Request, job: ChangeableJob) -> CancelBody:
    """The cancel route's body (nothing, or ``{}``), read after the edit right is checked."""
    raw = await read_json(request, required=False)
    return validated(CancelBody, {} if raw is None else raw)


CHANGE_RESPONSES: dict[int | str, dict[str, Any]] = {
    403: {
        "description": "a cross-site request, no edit access to the DAG of a job the user may read, or "
        "(a priority) a user the share's access.set_priority rule leaves out"
    },
    404: {"description": "no such job, or a job of a DAG the user may not read (the same answer)"},
    409: {"description": "the job is already final"},
    413: {"description": f"a body larger than {MAX_BODY_BYTES} bytes"},
    422: {"description": "a body that is not JSON, or breaks a rule of a field"},
}


def json_body_schema(model: type[BaseModel], required: bool) -> dict[str, Any]:
    """The OpenAPI ``requestBody`` of a body read by hand (see the module's docstring)."""
    return {
        "requestBody": {
            "required": required,
            "content": {"application/json": {"schema": model.model_json_schema()}},
        }
    }


@router.put(
    "/jobs/{job_id}/priority",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=ChangeResponse,
    summary="Ask for a new priority (AWS UpdateServiceJob)",
    dependencies=[SameOriginJson],
    responses=CHANGE_RESPONSES,
    openapi_extra=json_body_schema(PriorityBody, required=True),
)
def put_priority(
    job: ChangeableJob,
    body: Annotated[PriorityBody, Depends(priority_body)],
    store: StoreDep,
    access: DagAccessDep,
) -> ChangeResponse:
    require_live(job)
    try:
        store.set_priority(job.id, body.priority, access.actor())
    except PriorityChangeDenied as exc:  # the share's access.set_priority rule leaves this user out
        raise HTTPException(status.HTTP_403_FORBIDDEN, str(exc)) from exc
    except ChangeRefused as exc:
        raise _refusal(exc, field="priority") from exc
    return ChangeResponse(
        job_id=job.id,
        name=job.name,
        change="priority",
        priority=body.priority,
        message=f"priority {job.priority} -> {body.priority} asked; it applies at the quota scheduler's next cycle",
    )


@router.post(
    "/jobs/{job_id}/cancel",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=ChangeResponse,
    summary="Cancel a job (it ends FAILED with CANCELLED)",
    dependencies=[SameOriginJson],
    responses=CHANGE_RESPONSES,
    openapi_extra=json_body_schema(CancelBody, required=False),
)
def post_cancel(
    job: ChangeableJob, body: Annotated[CancelBody, Depends(cancel_body)], store: StoreDep
) -> ChangeResponse:
    require_live(job)
    try:
        store.cancel(job.id)
    except ChangeRefused as exc:
        raise _refusal(exc, field=None) from exc
    return ChangeResponse(
        job_id=job.id, name=job.name, change="cancel", message="cancellation asked; the quota scheduler stops the job"
    )


@router.get("/preemptions", response_model=PreemptionsResponse, summary="Preemption history, newest first")
def get_preemptions(
    store: StoreDep,
    access: DagAccessDep,
    share: Annotated[str | None, Query(description="victim's or preemptor's share")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
) -> PreemptionsResponse:
    now = store.clock()
    records = dashboard.preemption_history(store, share=share, limit=limit, now=now)
    return PreemptionsResponse(
        now=now,
        preemptions=hide_preemptors(store, access, access.readable(records, lambda p: p.dag_id)),
    )


@router.get("/alerts", response_model=AlertsResponse, summary="Starvation and preemption alerts, newest first")
def get_alerts(
    store: StoreDep,
    access: DagAccessDep,
    share: str | None = None,
    open: Annotated[bool, Query(description="only alerts still open")] = False,
) -> AlertsResponse:
    now = store.clock()
    records = dashboard.alert_records(store, share=share, only_open=open, now=now)
    return AlertsResponse(
        now=now,
        alerts=access.readable(records, lambda a: a.dag_id),
    )


def _history(store: QuotaStore, share: str, hours: float) -> dashboard.UtilisationHistory:
    latest = store.latest_config()
    if latest is None or latest[1].share(share) is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no share {share!r} in the current configuration")
    end = store.clock()
    first = dashboard.first_activity(store)
    start = end - hours * 3600
    if first is not None and start < first < end:
        start = first  # a young quota: the chart starts at the first placement
    return dashboard.utilisation_history(store, share, start, end)


HoursQuery = Annotated[float, Query(gt=0, le=MAX_HISTORY_HOURS, description="window, hours back from now")]


@router.get(
    "/shares/{share}/utilisation",
    response_model=UtilisationResponse,
    summary="GPUs held over time by a share (own use, borrowed, limit)",
)
def get_utilisation(share: str, store: StoreDep, hours: HoursQuery = 24.0) -> UtilisationResponse:
    history = _history(store, share, hours)
    return UtilisationResponse(
        share=history.share,
        start=history.start,
        end=history.end,
        gpu_hours=history.gpu_hours,
        borrowed_gpu_hours=history.borrowed_gpu_hours,
        limit_gpu_hours=history.limit_gpu_hours,
        utilisation=history.utilisation,
        points=history.points,
    )


@router.get(
    "/shares/{share}/utilisation.svg",
    response_class=Response,
    responses={200: {"content": {"image/svg+xml": {}}, "description": "the utilisation chart"}},
    summary="The utilisation chart of a share (SVG, drawn by matplotlib)",
)
def get_utilisation_chart(share: str, store: StoreDep, hours: HoursQuery = 24.0) -> Response:
    from airflow_quota.plugins.charts import utilisation_svg

    svg = utilisation_svg(_history(store, share, hours))
    return Response(svg, media_type="image/svg+xml", headers={"Cache-Control": "private, max-age=10"})


# -- helpers -------------------------------------------------------------------------------------


COMPUTED_COLUMNS = (
    "preferences",
    "can_edit",
    "can_set_priority",
    "page_url",
    "task_url",
    "waiting_since",
    "waiting_since_text",
    "pending_seconds",
    "pending_text",
    "wait_text",
    "waited_seconds",
    "waited_text",
    "borrowed",
    "borrowed_when_placed",
    "submitted_at_text",
    "forecast",
    "forecast_words",
    "forecast_short",
)
"""``JobModel`` fields that ``job_model`` computes rather than copies from the row."""


def job_model(
    request: Request,
    job: JobRow,
    access: DagAccess,
    now: float,
    running: dashboard.Charge | None = None,
    borrowed: int = 0,
    forecast: ForecastRow | None = None,
) -> JobModel:
    """A job row with its links, what its running attempt has cost so far, how many of its
    instances are above its share's limit now (``borrowed``, ``dashboard.current_borrowing``),
    how long it has waited at ``now`` (from the ``runnable_since`` the scheduler wrote), and
    whether this user may change it."""
    root = request.scope.get("root_path", "") or URL_PREFIX
    airflow_root = root[: -len(URL_PREFIX)] if root.endswith(URL_PREFIX) else ""
    task_url = None
    if job.dag_id and job.run_id and job.task_id:
        parts = [job.dag_id, "runs", job.run_id, "tasks", job.task_id]
        if job.map_index is not None:
            parts += ["mapped", str(job.map_index)]
        task_url = f"{airflow_root}/dags/" + "/".join(quote(part, safe="") for part in parts)
    values: dict[str, Any] = {
        column: getattr(job, column) for column in JobModel.model_fields if column not in COMPUTED_COLUMNS
    }
    if running is not None:
        values["gpu_hours"] = job.gpu_hours + running.gpu_hours
        values["cost"] = job.cost + running.cost
    pending = None if job.runnable_since is None else pending_seconds(job.runnable_since, now)
    values.update(
        waiting_since=job.runnable_since,
        waiting_since_text=dashboard.clock(job.runnable_since, now),
        pending_seconds=pending,
        pending_text=dashboard.words(pending),
        wait_text=dashboard.words(job.wait_seconds),
        waited_seconds=(waited := job.wait_seconds + (pending or 0.0)),
        waited_text=dashboard.words(waited),
        borrowed=borrowed if job.state in HOLDING_STATES else 0,
        borrowed_when_placed=job.borrowed,
        submitted_at_text=dashboard.clock(job.submitted_at, now),
        preferences=[PreferenceModel.model_validate(p) for p in job.request.get("preferences", [])],
        can_edit=(can_edit := job.state in LIVE_STATES and access.allows("PUT", job.dag_id)),
        can_set_priority=can_edit and access.may_set_priority(job.share, get_store(request)),
        page_url=f"{root}/jobs/{job.id}",
        task_url=task_url,
    )
    if forecast is not None and job.state in LIVE_STATES:
        values.update(
            forecast=forecast_record(forecast),
            forecast_words=forecast_words(forecast, now),
            forecast_short=forecast_short(forecast, now),
        )
    return JobModel(**values)


def bounded_id(job_id: int) -> int:
    """``job_id`` if the database can hold it; 404 otherwise (never an overflow, never a 500)."""
    if not 1 <= job_id <= MAX_JOB_ID:
        raise no_such_job(job_id)
    return job_id


def require_live(job: JobRow) -> None:
    """409 for a job that is already final: there is nothing left to change."""
    if JobState(job.state).is_final:
        raise HTTPException(status.HTTP_409_CONFLICT, f"quota job {job.id} ({job.name}) is already {job.state}")


def _invalid(loc: list[str | int], msg: str, kind: str) -> RequestValidationError:
    return RequestValidationError([{"loc": ["body", *loc], "msg": msg, "type": kind}])


async def read_json(request: Request, required: bool = True, limit: int = MAX_BODY_BYTES) -> Any:
    """The request's JSON body, read at most ``limit`` bytes far: 413 as soon as it is larger
    (by its ``Content-Length`` before reading anything, else while streaming); 422 for a body
    that is missing (when ``required``), not JSON, or holds a number that is not finite.
    ``None`` for an empty body that is not required."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.strip().isdigit() and int(declared) > limit:
        raise HTTPException(status.HTTP_413_REQUEST_ENTITY_TOO_LARGE, f"the body is larger than {limit} bytes")
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > limit:
            raise HTTPException(status.HTTP_413_REQUEST_ENTITY_TOO_LARGE, f"the body is larger than {limit} bytes")
    if not raw.strip():
        if required:
            raise _invalid([], "body: a JSON object is required", "missing")
        return None
    try:
        value = json.loads(bytes(raw))
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, too many digits
        raise _invalid([], f"body: not JSON ({str(exc)[:200]})", "json_invalid") from exc
    where = _non_finite(value)
    if where is not None:
        field = ".".join(str(part) for part in where) or "body"
        raise _invalid(where, f"{field}: must be a finite number, not NaN or Infinity", "finite_number")
    return value


def _non_finite(value: Any) -> list[str | int] | None:
    """The path to the first NaN or infinite number in parsed JSON, if any (walked without
    recursion: nesting is bounded only by the body's size)."""
    stack: list[tuple[list[str | int], Any]] = [([], value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return path
        if isinstance(item, dict):
            stack.extend(([*path, key], child) for key, child in item.items())
        elif isinstance(item, list):
            stack.extend(([*path, index], child) for index, child in enumerate(item))
    return None


def validated(model: type[ModelT], value: Any) -> ModelT:
    """``value`` as ``model``, or 422 in FastAPI's shape with ``loc`` starting at ``body``."""
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        errors = [
            {"loc": ["body", *error["loc"]], "msg": error["msg"], "type": error["type"], "input": error.get("input")}
            for error in exc.errors(include_url=False)
        ]
        raise RequestValidationError(errors) from exc


# -- other jobs' names -------------------------------------------------------------------------


def hide_preemptors(
    store: QuotaStore, access: DagAccess, records: Iterable[dashboard.PreemptionRecord]
) -> list[dashboard.PreemptionRecord]:
    """The preemption records with each preemptor the user may not read (its DAG, or no job
    known by that name at that instant) shown as ``ANOTHER_JOB``, without its id."""
    known: dict[int, JobRow | None] = {}
    shown = []
    for record in records:
        preemptor = None
        if record.preemptor_id is not None:
            if record.preemptor_id not in known:
                known[record.preemptor_id] = store.job(record.preemptor_id)
            preemptor = known[record.preemptor_id]
        if preemptor is None or not access.allows("GET", preemptor.dag_id):
            record = dataclasses.replace(record, preemptor=ANOTHER_JOB, preemptor_id=None)
        shown.append(record)
    return shown


def hide_in_story(
    story: list[str],
    own_name: str,
    preemptions: list[dashboard.PreemptionRecord],
    shown_preemptions: list[dashboard.PreemptionRecord],
    caused: list[dashboard.PreemptionRecord],
    shown_caused: list[dashboard.PreemptionRecord],
) -> list[str]:
    """The job's story with the names of the other jobs it mentions (its preemptors, its
    victims) replaced by ``ANOTHER_JOB`` where the user may not read them. A hidden name that
    is also the job's own or a readable job's (names are reused once a job is final) stays."""
    hidden = {p.preemptor for p in preemptions} - {p.preemptor for p in shown_preemptions}
    hidden |= {p.job for p in caused} - {p.job for p in shown_caused}
    hidden -= {own_name, ANOTHER_JOB}
    if not hidden:
        return story
    names = "|".join(re.escape(name) for name in sorted(hidden, key=len, reverse=True))
    pattern = re.compile(rf"(?<![\w.-])(?:{names})(?![\w.-])")
    return [pattern.sub(ANOTHER_JOB, line) for line in story]


def _refusal(exc: ChangeRefused, field: str | None) -> HTTPException:
    """A refused change as the API answers it: 422 naming the field for a broken rule of a
    field, 409 for a job that changed state meanwhile."""
    message = str(exc)
    if field is not None and message.startswith(f"{field}:"):
        return HTTPException(
            422,
            [{"loc": ["body", field], "msg": message, "type": "quota_rule"}],
        )
    return HTTPException(status.HTTP_409_CONFLICT, message)
