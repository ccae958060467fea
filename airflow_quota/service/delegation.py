"""``airflow-quota scheduler --aws-batch-job-queue Q``: a quota scheduler that lets AWS Batch place.

AWS Batch's quota management decides for the job queue's pool: which job runs, on which entry of
its preference list, which is preempted. This leader does what is left, in the quota database
every reader already reads, so the operator's trigger, the sensors, the Quotas page, alerts and
metrics work unchanged (docs/aws-batch.md, "Who decides"):

1. **the inbox**: a submission becomes ``SubmitServiceJob`` (``aws_batch/service_jobs.py``), a
   priority change ``UpdateServiceJob``, a cancel ``TerminateServiceJob``, a configuration is
   taken in (``airflow-quota aws-batch apply`` is what changes AWS's quota shares). AWS refusing
   a request refuses it here, with AWS's words, and nothing is stored of it; AWS out of reach or
   throttling leaves it in the inbox for a later step (the client token makes a second
   submission find the first);
2. **the mirror**, every ``mirror_seconds``: for each share with live jobs, one
   ``ListServiceJobs`` page (``ShareSweep``: the live statuses in turn), and
   ``DescribeServiceJob`` only for a job a listing cannot settle: back in the queue after holding
   capacity (preempted, or requeued for capacity), or missing from a whole sweep (ended). What
   changed is written as the core's own decisions (placed, preempted, requeued, succeeded,
   failed), their events and rows, and the jobs' columns;
3. **the view**, after each mirror: each share's limits, what its mirrored jobs use, borrow and
   wait for, the use ``GetJobQueueSnapshot`` reports when it reports one.

Calls AWS throttles or fails (``AwsBatchUnavailable``) pause every call for a back-off (1 s
doubling to 20 s, with jitter) without holding up the lease: the step returns and the next one
after the pause goes on where it stopped. Every transaction that writes checks the lease first.
Starvation alerts, forecasts and reservations are the quota scheduler's own and are not made
here (docs/aws-batch.md says what is lost).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import socket
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sqlalchemy import Engine, delete, func, select
from sqlalchemy.orm import Session

from airflow_quota.aws_batch.calls import AwsBatchRefused, AwsBatchUnavailable, BatchCalls, backoff
from airflow_quota.aws_batch.live_jobs import DELEGATED_BACKEND, LiveJobs, after_look, attempt_rows
from airflow_quota.aws_batch.policy import expressibility
from airflow_quota.aws_batch.service_jobs import (
    CANCEL_REASON,
    DelegatedJob,
    DelegationRefused,
    Followed,
    KnownJob,
    ServiceJob,
    ShareSweep,
    borrowed_by,
    follow,
    service_job,
    submit_request,
)
from airflow_quota.aws_batch.starvation import DelegatedStarvation
from airflow_quota.core.config import QuotaConfig, stored_config
from airflow_quota.core.cycle import EPOCH
from airflow_quota.core.explain import describe
from airflow_quota.core.model import (
    LIVE_STATES,
    Alert,
    AlertKind,
    Decision,
    Entry,
    JobRequest,
    JobState,
    Placed,
    Preempted,
    PriorityChanged,
    Rejected,
    Requeued,
    Submitted,
)
from airflow_quota.core.normal_wait import KEEP_WAITS
from airflow_quota.core.state import QuotaState
from airflow_quota.service.alerts import AlertDelivery
from airflow_quota.service.clock import Clock, WallClock
from airflow_quota.service.intake import INBOX
from airflow_quota.service.leader import LeaderLoop
from airflow_quota.service.metrics import QuotaMetrics
from airflow_quota.service.records import alert_row, event_row
from airflow_quota.store.bulk import insert_rows, update_by_key
from airflow_quota.store.engine import reachable, session_factory
from airflow_quota.store.lock import leader_lock
from airflow_quota.store.models import AlertRow, Attempt, ConfigVersion, EventRow, JobRow, Preemption, Request
from airflow_quota.store.views import QuotaView, ViewBuilder, write_view

log = logging.getLogger("airflow_quota.scheduler")

RUNS_ON_AWS_BATCH = ("sagemaker",)
"""The job backends a delegating scheduler takes: AWS Batch runs SageMaker training jobs."""
SUBMIT_WORKERS = 8
"""SubmitServiceJob calls in flight at once: each waits on AWS (tens of milliseconds), so a burst
of submissions goes at several times the rate of one call after another."""
NOT_FOUND = re.compile(r"not\s+found|does\s+not\s+exist|could\s+not\s+find|unknown\s+job", re.IGNORECASE)
"""What AWS says of a service job it does not know."""


class AwsBatchDelegation(LeaderLoop):
    """The leader of a quota database whose pool AWS Batch places (see the module docstring).

    :param hook: the AWS Batch calls (its retries are this loop's: ``hook.max_attempts`` is 1).
    :param job_queue: the quota-management job queue (name or ARN).
    :param mirror_seconds: how often each share's next ``ListServiceJobs`` page is read.
    """

    def __init__(
        self,
        engine: Engine,
        hook: BatchCalls,
        job_queue: str,
        clock: Clock | None = None,
        holder: str | None = None,
        poll_seconds: float = 0.5,
        lease_seconds: float = 10.0,
        mirror_seconds: float = 30.0,
        requests_announced: bool = False,
        metrics: QuotaMetrics | None = None,
        submit_workers: int = SUBMIT_WORKERS,
    ) -> None:
        holder = holder or f"{socket.gethostname()}:{os.getpid()}"
        super().__init__(
            engine,
            holder,
            leader_lock(engine, holder, lease_seconds, backends=[DELEGATED_BACKEND]),
            poll_seconds,
            requests_announced,
        )
        self.hook = hook
        hook.max_attempts = 1  # a throttled call pauses the loop, not the lease's renewal
        self.job_queue = job_queue
        self.clock = clock or WallClock()
        self.wall_clock = isinstance(self.clock, WallClock)
        self.mirror_seconds = mirror_seconds
        self.sessions = session_factory(engine)
        self.config: QuotaConfig | None = None
        self._sweeps: dict[str, ShareSweep] = {}
        self._next_mirror = float("-inf")
        self._refused_in_a_row = 0
        self.paused_until = float("-inf")
        """Calls to AWS wait until then (the clock's seconds): AWS throttled or was out of reach."""
        self._cancel_asked: set[int] = set()
        self._live: LiveJobs | None = None
        """The live delegated jobs as this leader holds them (``_live_jobs``); None: not read yet."""
        self.submit_workers = submit_workers
        self._submit_pool: ThreadPoolExecutor | None = None
        self.starvation = DelegatedStarvation()
        """Rule 8 for AWS's placements: AWS raises no starvation alert (``aws_batch/starvation.py``)."""
        self._metrics_given = metrics is not None
        self.metrics = metrics or QuotaMetrics.off()
        self.alerts = AlertDelivery(self.sessions, self.metrics)
        """The recorded alerts to the configuration's notifiers, as the self-placing scheduler sends them."""
        self._decided: list[Decision] = []
        """The decisions this step wrote, for the metrics."""
        self._view: QuotaView | None = None
        self._beats_reported = 0

    # -- LeaderLoop ------------------------------------------------------------------------------

    def recover(self) -> None:
        """The configuration in force is the latest one taken in; the jobs' state is AWS's; the
        shares' recent waits and the STARVING alerts raised, from the stored jobs."""
        self.starvation = DelegatedStarvation()
        self._live = None
        with self.sessions() as session, session.begin():
            version = session.scalar(select(func.max(ConfigVersion.id)))
            row = session.get(ConfigVersion, version) if version is not None else None
            self.config = stored_config(row.document) if row is not None else None
            for share in self.config.shares if self.config is not None else ():
                placed = select(JobRow.wait_seconds).where(JobRow.share == share.name, JobRow.attempts > 0)
                for wait in reversed(session.scalars(placed.order_by(JobRow.id.desc()).limit(KEEP_WAITS)).all()):
                    self.starvation.learn(share.name, wait)
            alerted = select(AlertRow.job_id).join(JobRow, JobRow.id == AlertRow.job_id)
            alerted = alerted.where(AlertRow.kind == AlertKind.STARVING.value, JobRow.state.in_(LIVE_STATES))
            for job_id in session.scalars(alerted):
                self.starvation.alerted(job_id)

    def _starting(self) -> None:
        if not self._metrics_given:
            self.metrics = self.alerts.metrics = QuotaMetrics.from_airflow()
        self.alerts.in_background()  # a slow notifier must not hold up the mirror or the lease

    def _stopping(self, leading: bool) -> None:
        self.alerts.close()
        if self._submit_pool is not None:
            self._submit_pool.shutdown(wait=True)
            self._submit_pool = None

    def _forget(self) -> None:
        self.config = None
        self._live = None
        self._sweeps.clear()
        self._next_mirror = float("-inf")

    def _took_the_lease(self) -> None:
        self.recover()
        self._sweeps.clear()
        log.info("%s delegates placing to AWS Batch job queue %s", self.holder, self.job_queue)

    def step(self) -> bool:
        """Take in the inbox, then mirror when due; True when anything changed."""
        now = self.clock.now()
        if now < self.paused_until:
            return False
        worked = False
        try:
            with reachable(str(self.engine.url)):
                worked = self._take_in_requests(now)
                if now >= self._next_mirror:
                    worked = self._mirror(now) or worked
                    self._next_mirror = now + self.mirror_seconds
            self._refused_in_a_row = 0
        except (AwsBatchUnavailable, AwsBatchRefused) as exc:
            # out of reach, throttling, or refusing a read (a queue gone, a permission taken
            # away): the mirror waits and reads again; requests are refused one by one instead
            self._refused_in_a_row += 1
            pause = backoff(self._refused_in_a_row)
            self.paused_until = now + pause
            log.warning("%s; every AWS Batch call waits %.1f s", exc, pause)
        self._report(now)
        return worked

    def _report(self, now: float) -> None:
        """After the step's commits: the alerts to the notifiers, the metrics."""
        decided, self._decided = self._decided, []
        if self.config is None:
            return
        self.alerts.configure(self.config.alerts)
        if any(isinstance(decision, Alert) for decision in decided):
            self.alerts.wake()
        self.alerts.deliver(now)
        if self.metrics.enabled:
            self.metrics.heartbeats(self.lock.beats - self._beats_reported)
            self._beats_reported = self.lock.beats
            self.metrics.decisions(decided)
            self.metrics.gauges(self._view, now)

    # -- the inbox -------------------------------------------------------------------------------

    def _take_in_requests(self, now: float) -> bool:
        with self.sessions() as session, session.begin():
            pending = [(request, row) for request, row in session.execute(INBOX)]
        index = 0
        while index < len(pending):
            request, row = pending[index]
            if request.kind == "submit" and row is not None:  # a run of submissions: made together
                end = index
                while end < len(pending) and pending[end][0].kind == "submit" and pending[end][1] is not None:
                    end += 1
                self._submit_all([(r.id, job) for r, job in pending[index:end] if job is not None], now)
                index = end
                continue
            index += 1
            if request.kind == "config":
                self._take_config(request.id, request.payload, now)
            elif row is None or row.state not in LIVE_STATES:
                self._refuse(request.id, row, request.kind, f"job {request.job_id} is not live", now)
            elif request.kind == "set_priority":
                self._set_priority(request.id, row, int(request.payload["priority"]), now)
            elif request.kind == "cancel":
                self._cancel(request.id, row, now)
            else:
                why = (
                    f"{request.kind}: AWS Batch keeps its own capacity; a delegating scheduler takes no {request.kind}"
                )
                self._refuse(request.id, row, request.kind, why, now)
        return bool(pending)

    def _take_config(self, request_id: int, payload: Mapping[str, Any], now: float) -> None:
        with self.sessions() as session, session.begin():
            self._fence(session)
            row = session.get(ConfigVersion, payload["version"])
            if row is not None:
                self.config = stored_config(row.document)
            _handled(session, request_id, "accepted")
            if self.config is not None:
                self._view = self._shares_view(now, None)
                write_view(session, self._view)
        log.info("configuration version %s taken in", payload.get("version"))
        if self.config is not None:
            for note in expressibility(self.config)[1]:
                log.warning(
                    "configuration version %s: %s", payload.get("version"), note.shown("ignored, AWS Batch places")
                )

    def _submit_all(self, submissions: list[tuple[int, JobRow]], now: float) -> None:
        """Submit each job to AWS Batch, ``submit_workers`` calls at a time (each waits on AWS),
        then commit the ones AWS took in one transaction. A job refused (here or by AWS) is
        refused with why; one AWS did not answer (throttled, out of reach) stays in the inbox for
        a later step, its client token making that second submission find the first."""
        plans = {plan.name: plan.arn for plan in self.config.pool.training_plans if plan.arn} if self.config else {}
        asked: list[tuple[int, JobRow, dict[str, Any]]] = []
        for request_id, row in submissions:
            if row.backend not in RUNS_ON_AWS_BATCH:
                why = (
                    f"backend: {row.backend!r} jobs cannot run on AWS Batch; this quota scheduler delegates to job"
                    f" queue {self.job_queue}, which runs SageMaker training jobs (backend 'sagemaker')"
                )  # QuotaExecutor's tasks (backend 'airflow') included: Airflow's workers run them
                self._refuse(request_id, row, "submit", why, now, delete_job=True)
                continue
            job = DelegatedJob(
                row.id, row.name, row.share, row.priority, JobRequest.model_validate(row.request), row.training,
                row.submitted_at, plans,
            )  # fmt: skip
            try:
                asked.append((request_id, row, submit_request(job, self.job_queue)))
            except DelegationRefused as exc:
                self._refuse(request_id, row, "submit", str(exc).replace("\n", "; "), now, delete_job=True)
        answers = list(self._submitter().map(self._answer_to, [request for _, _, request in asked]))
        taken: list[tuple[int, JobRow, str]] = []
        unanswered: AwsBatchUnavailable | None = None
        for (request_id, row, _), answer in zip(asked, answers, strict=True):
            if isinstance(answer, AwsBatchRefused):
                self._refuse(request_id, row, "submit", str(answer), now, delete_job=True)
            elif isinstance(answer, AwsBatchUnavailable):
                unanswered = unanswered or answer
            else:
                taken.append((request_id, row, str(answer["jobId"])))
        if taken:
            self._submitted(taken, now)
        if unanswered is not None:
            raise unanswered  # the step pauses every call; the rest waits in the inbox

    def _answer_to(self, request: dict[str, Any]) -> dict[str, Any] | AwsBatchRefused | AwsBatchUnavailable:
        try:
            return self.hook.submit_service_job(request)
        except (AwsBatchRefused, AwsBatchUnavailable) as exc:
            return exc

    def _submitter(self) -> ThreadPoolExecutor:
        if self._submit_pool is None:
            self._submit_pool = ThreadPoolExecutor(self.submit_workers, thread_name_prefix="aws-batch-submit")
        return self._submit_pool

    def _submitted(self, taken: list[tuple[int, JobRow, str]], now: float) -> None:
        """The jobs AWS took: RUNNABLE in its queue, their requests done, one transaction."""
        columns = {"state": JobState.RUNNABLE.value, "runnable_since": now, "updated_at": now}
        columns["pending_reason"] = "AWS_BATCH_QUEUE"
        with self.sessions() as session, session.begin():
            self._fence(session)
            update_by_key(session, JobRow, [{"id": row.id, "service_job_id": sid, **columns} for _, row, sid in taken])
            update_by_key(
                session,
                Request,
                [
                    {"id": request_id, "handled": True, "outcome": "accepted", "error": None}
                    for request_id, _, _ in taken
                ],
            )
            self._events(session, [(row.id, Submitted(now, row.name, row.share)) for _, row, _ in taken])
        for _, row, service_job_id in taken:
            known = dataclasses.replace(_known(row, False), state=JobState.RUNNABLE, runnable_since=now)
            if self._live is not None:
                self._live.put(service_job_id, known, now)
            log.info(
                "%s as AWS Batch service job %s",
                describe(Submitted(now, row.name, row.share), self.wall_clock),
                service_job_id,
            )

    def _service_job_of(self, row: JobRow) -> str | None:
        """The job's service job as now stored: the inbox's row may predate its submission, made
        earlier in the same step."""
        with self.sessions() as session, session.begin():
            return session.scalar(select(JobRow.service_job_id).where(JobRow.id == row.id))

    def _set_priority(self, request_id: int, row: JobRow, priority: int, now: float) -> None:
        row.service_job_id = self._service_job_of(row)
        if row.service_job_id is None:
            self._refuse(request_id, row, "set_priority", "not yet submitted to AWS Batch", now)
            return
        try:
            self.hook.update_service_job(row.service_job_id, priority)
        except AwsBatchRefused as exc:
            self._refuse(request_id, row, "set_priority", str(exc), now)
            return
        changed = PriorityChanged(now, row.name, row.share, row.priority, priority)
        with self.sessions() as session, session.begin():
            self._fence(session)
            stored = session.get(JobRow, row.id)
            assert stored is not None
            stored.priority, stored.updated_at = priority, now
            _handled(session, request_id, "accepted")
            self._events(session, [(row.id, changed)])
        log.info(describe(changed, self.wall_clock))

    def _cancel(self, request_id: int, row: JobRow, now: float) -> None:
        row.service_job_id = self._service_job_of(row)
        if row.service_job_id is not None:
            try:
                self.hook.terminate_service_job(row.service_job_id, CANCEL_REASON)
            except AwsBatchRefused as exc:
                self._refuse(request_id, row, "cancel", str(exc), now)
                return
        self._cancel_asked.add(row.id)
        with self.sessions() as session, session.begin():
            self._fence(session)
            _handled(session, request_id, "accepted")
        self._next_mirror = now  # AWS says FAILED at once: mirror it at the next step
        log.info("cancel of %s [%s] asked of AWS Batch (service job %s)", row.name, row.share, row.service_job_id)

    def _refuse(
        self, request_id: int, row: JobRow | None, kind: str, why: str, now: float, delete_job: bool = False
    ) -> None:
        name, share = (row.name, row.share) if row is not None else ("", "")
        refused = Rejected(now, name, share, why, request=kind)
        with self.sessions() as session, session.begin():
            self._fence(session)
            _handled(session, request_id, "refused", why)
            self._events(session, [(None if delete_job or row is None else row.id, refused)])
            if delete_job and row is not None:
                session.execute(delete(JobRow).where(JobRow.id == row.id))
        log.info(describe(refused, self.wall_clock))

    # -- the mirror ------------------------------------------------------------------------------

    def _live_jobs(self) -> LiveJobs:
        """The live delegated jobs, read from the quota database once a leadership, then kept."""
        if self._live is None:
            with self.sessions() as session, session.begin():
                rows = session.scalars(
                    select(JobRow).where(JobRow.service_job_id.is_not(None), JobRow.state.in_(LIVE_STATES))
                ).all()
                self._live = LiveJobs(
                    (row.service_job_id or "", _known(row, row.id in self._cancel_asked), row.updated_at)
                    for row in rows
                )
        return self._live

    def _mirror(self, now: float) -> bool:
        """One round: a page of each share with live jobs, the descriptions it calls for, one
        commit of what changed. True when anything did."""
        live = self._live_jobs()
        watched = len(live) > 0
        changes: list[tuple[KnownJob, Followed]] = []
        for share in live.shares():
            sweep = self._sweeps.setdefault(share, ShareSweep(share, now))
            for seen in sweep.take(self.hook.list_service_jobs(sweep.request(self.job_queue))):
                if seen.job_id in live:
                    self._look(live, seen, now, changes)
            if sweep.complete:
                del self._sweeps[share]
                unseen = [(sid, job) for sid, job in live.unchanged_since(share, sweep.began) if sid not in sweep.seen]
                for service_job_id, job in unseen:
                    self._look(live, self._describe(service_job_id, job, now), now, changes)
        waiting = [job for job in live if job.state is JobState.RUNNABLE]
        alerts = self.starvation.alerts(self.config, waiting, now) if self.config is not None else []
        snapshot = self.hook.job_queue_snapshot(self.job_queue) if self.config is not None and watched else None
        if changes or alerts or snapshot is not None:
            self._write(changes, now, snapshot, alerts)
        return bool(changes or alerts)

    def _look(self, live: LiveJobs, seen: ServiceJob, now: float, changes: list[tuple[KnownJob, Followed]]) -> None:
        """What one look at a job means; the job as the look left it kept, its change noted."""
        job = live[seen.job_id]
        followed = follow(job, seen, now, self._borrowed(live, job, seen), self.job_queue)
        if followed.needs_description:
            seen = self._describe(seen.job_id, job, now)
            followed = follow(job, seen, now, self._borrowed(live, job, seen), self.job_queue)
        if not followed.columns and not followed.decisions:
            return
        changes.append((job, followed))
        since = job.runnable_since
        for decision in followed.decisions:
            if isinstance(decision, Placed):
                wait = max(0.0, decision.at - (since if since is not None else decision.at))
                self.starvation.placed(job, decision.entry.instance_type, decision.at, wait, decision.borrowed)
            elif isinstance(decision, (Preempted, Requeued)):
                self.starvation.requeued(job.job_id)
                since = decision.at
        live.put(seen.job_id, after_look(job, followed), now)

    def _describe(self, service_job_id: str, job: KnownJob, now: float) -> ServiceJob:
        """``DescribeServiceJob``; a job AWS no longer knows (purged, or deleted outside
        airflow-quota) is FAILED as lost, as a backend that lost an attempt is."""
        try:
            return service_job(self.hook.describe_service_job(service_job_id))
        except AwsBatchRefused as exc:
            if not NOT_FOUND.search(str(exc)):
                raise
            lost = f"BackendLost: AWS Batch no longer knows service job {service_job_id}: {exc}"
            log.error("%s [%s]: %s", job.name, job.share, lost)
            return ServiceJob(service_job_id, "FAILED", reason=lost, stopped_at=now, preemptions=job.preemptions)

    def _borrowed(self, live: LiveJobs, job: KnownJob, seen: ServiceJob) -> int:
        """Instances above its share's limit the job borrows if this look places it."""
        entry = seen.entry
        if entry is None or self.config is None or job.state.holds_capacity:
            return job.borrowed
        share = self.config.share(job.share)
        limit = share.capacity_limits.get(entry.instance_type, 0) if share is not None else 0
        return borrowed_by(limit, [live.use(job.share, entry.instance_type)], entry.count)

    def _write(
        self,
        changes: list[tuple[KnownJob, Followed]],
        now: float,
        snapshot: Mapping[str, Any] | None,
        alerts: list[tuple[int, Alert]],
    ) -> None:
        """One transaction: the jobs' columns, their attempts, preemptions, events and alerts, and
        the shares' view; each table in one executemany."""
        jobs: list[dict[str, Any]] = []
        attempts: list[dict[str, Any]] = []
        attempt_changes: list[dict[str, Any]] = []
        preemptions: list[dict[str, Any]] = []
        events: list[tuple[int | None, Decision]] = list(alerts)
        for job, followed in changes:
            columns = {name: value for name, value in followed.columns.items() if name != "running_since"}
            jobs.append({"id": job.job_id, **columns, "updated_at": now})
            inserted, changed = attempt_rows(job, followed)
            attempts += inserted
            attempt_changes += changed
            preemptions += [
                {
                    "job_id": job.job_id,
                    "attempt": attempt,
                    "at": preempted.at,
                    "kind": preempted.kind.value,
                    "by_job": preempted.by,
                    "lost_seconds": preempted.lost_seconds,
                }
                for attempt, preempted in followed.preemptions
            ]
            events += [(job.job_id, decision) for decision in followed.decisions]
            events += self._alerts(job, followed, now)
            if followed.columns.get("state") in (JobState.SUCCEEDED.value, JobState.FAILED.value):
                self._cancel_asked.discard(job.job_id)
        with self.sessions() as session, session.begin():
            self._fence(session)
            update_by_key(session, JobRow, jobs)
            insert_rows(session, Attempt, attempts)
            update_by_key(session, Attempt, attempt_changes)
            insert_rows(session, Preemption, preemptions)
            self._events(session, events)
            if self.config is not None:
                self._view = self._shares_view(now, snapshot)
                write_view(session, self._view)
        for _, followed in changes:
            for decision in followed.decisions:
                log.info(describe(decision, self.wall_clock))
        for _, alert in alerts:
            log.info(describe(alert, self.wall_clock))

    def _alerts(self, job: KnownJob, followed: Followed, now: float) -> list[tuple[int | None, Decision]]:
        """PREEMPTED_REPEATEDLY when AWS's preemptions of the job reach its share's
        ``preempted_alert_after`` (AWS sends no alert of its own)."""
        share = self.config.share(job.share) if self.config is not None else None
        count = followed.columns.get("preemptions")
        if share is None or count is None or not job.preemptions < share.preempted_alert_after <= count:
            return []
        reason = (
            f"preempted {count} times by AWS Batch (the share's preempted_alert_after is {share.preempted_alert_after})"
        )
        alert = Alert(now, job.name, job.share, AlertKind.PREEMPTED_REPEATEDLY, reason, None, None)
        return [(job.job_id, alert)]

    def _events(self, session: Session, decisions: Iterable[tuple[int | None, Decision]]) -> None:
        """Each decision's event, as the quota scheduler's own leader writes it, and its alert."""
        events, alerts = [], []
        epoch = self.lock.epoch if self._fencing else None
        for job_id, decision in decisions:
            self._decided.append(decision)
            events.append(event_row(decision, job_id, self.wall_clock, epoch))
            if isinstance(decision, Alert) and job_id is not None:
                alerts.append(alert_row(decision, job_id))
        insert_rows(session, EventRow, events)
        insert_rows(session, AlertRow, alerts)

    # -- the view --------------------------------------------------------------------------------

    def _shares_view(self, now: float, snapshot: Mapping[str, Any] | None) -> QuotaView:
        """The shares as AWS places them: each share's limits (the configuration), what its
        mirrored jobs hold, borrow and wait for; a share's use as ``GetJobQueueSnapshot``
        reports it, where it reports one (its top 20 shares)."""
        assert self.config is not None
        live = self._live_jobs()
        base = QuotaView(ViewBuilder().shares_of(QuotaState(self.config, EPOCH)), computed_at=now)
        reported = _reported_use(snapshot)
        by_share: dict[str, list[KnownJob]] = {}
        for job in live:
            by_share.setdefault(job.share, []).append(job)
        shares = []
        for view in base.shares:
            jobs = by_share.get(view.share, [])
            waiting = [job for job in jobs if job.state is JobState.RUNNABLE]
            types = []
            for type_view in view.types:
                name = type_view.instance_type
                used = reported.get((view.share, name), live.use(view.share, name))
                asking = [job.runnable_since for job in waiting if name in job.types]
                types.append(
                    dataclasses.replace(
                        type_view,
                        used=used,
                        borrowed=max(0, used - type_view.limit),
                        idle=max(0, type_view.limit - used),
                        runnable=len(asking),
                        oldest_runnable_since=min((t for t in asking if t is not None), default=None),
                    )
                )
            shares.append(
                dataclasses.replace(
                    view,
                    running=len(jobs) - len(waiting),
                    runnable=len(waiting),
                    oldest_runnable_since=min(
                        (job.runnable_since for job in waiting if job.runnable_since is not None), default=None
                    ),
                    types=tuple(types),
                )
            )
        return QuotaView(tuple(shares), computed_at=now)


def _reported_use(snapshot: Mapping[str, Any] | None) -> dict[tuple[str, str], int]:
    """Each share's use of each type as ``GetJobQueueSnapshot`` reports it."""
    utilization = ((snapshot or {}).get("queueUtilization") or {}).get("quotaShareUtilization") or {}
    return {
        (str(share["quotaShareName"]), str(usage["capacityUnit"])): round(float(usage.get("quantity", 0)))
        for share in utilization.get("topCapacityUtilization") or ()
        for usage in share.get("capacityUsage") or ()
    }


def _known(row: JobRow, cancel_asked: bool) -> KnownJob:
    request = row.request
    entry = Entry(row.instance_type, row.count) if row.instance_type and row.count else None
    return KnownJob(
        job_id=row.id,
        name=row.name,
        share=row.share,
        state=JobState(row.state),
        attempts=row.attempts,
        preemptions=row.preemptions,
        runnable_since=row.runnable_since,
        wait_seconds=row.wait_seconds,
        entry=entry,
        borrowed=row.borrowed,
        preemption_retries=request.get("preemption_retries"),
        cancel_asked=cancel_asked,
        detail=row.detail,
        checkpoint_interval=request.get("checkpoint_interval"),
        types=tuple(str(p["instance_type"]) for p in request.get("preferences", ())),
    )


def _handled(session: Session, request_id: int, outcome: str, error: str | None = None) -> None:
    request = session.get(Request, request_id)
    assert request is not None
    request.handled, request.outcome, request.error = True, outcome, error
