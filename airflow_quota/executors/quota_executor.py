"""``QuotaExecutor``: any Airflow task under the quota shares.

A LocalExecutor whose tasks wait for the quota scheduler before they run. Each queued workload
becomes a quota job of the ``airflow`` backend (``executors/jobs.py``), and the task stays QUEUED,
*held* in this executor (not in ``queued_tasks``: it uses none of the executor's
``parallelism``, which is about running tasks), for as long as the job is RUNNABLE. Three facts
of Airflow 3.3.2 make the hold safe (``reference/airflow-3.3-extension-points.md`` 2.3):

1. the scheduler's stuck-in-queued check calls ``revoke_task`` and skips executors that leave
   it unimplemented, so ``revoke_task`` raises ``NotImplementedError`` and a task may stay
   QUEUED past ``[scheduler] task_queued_timeout``;
2. the workload's token was minted at queue time and lives ``task_queued_timeout``: at release
   the executor mints a fresh one (``ExecuteTask.generate_token``);
3. that skipped check is silent, so the executor watches its own held tasks: every minute it
   logs how many it holds and the longest wait, and a job the quota scheduler refused or failed
   fails its task with the quota's message.

Each ``sync`` (one per scheduler loop):

1. submit the held tasks that have no job yet; a broken ``executor_config`` or a refused
   submission fails the task, naming the field;
2. read the held and released tasks' jobs and latest attempts (one query each);
3. release each held task whose job is placed: a fresh token, the placement in its environment
   (``executors/placement.py``), then LocalExecutor's worker processes (``executors/worker.py``),
   or with ``[quota] executor_delegate = celery`` the Celery queue named after the placed
   instance type (``executors/celery_delegate.py``); report it RUNNING;
4. stop each released task whose attempt the quota scheduler asked the ``airflow`` backend to
   stop (preemption or cancel; a held one is reported stopped before it started):
   SIGTERM to the task's process, then after the share's ``preemption_grace_seconds`` clear it,
   Airflow's RESTARTING route (its supervisor kills it, the scheduler queues the next try, which
   is held again and resumes from the checkpoint); a task on a Celery worker runs on another host,
   so the SIGTERM is a broadcast the worker running it acts on (``_stop``);
5. report each try that ended (from the executor's events, with the task instance's state in
   Airflow's database; a Celery-run task's events come from the Celery result backend) as
   SUCCEEDED, FAILED or STOPPED.

A scheduler restart: ``try_adopt_task_instances`` takes back the QUEUED tasks (held again, their
jobs found by key) and the RUNNING ones (followed in Airflow's database until they end, then
reported), so nothing is reset, submitted twice or lost.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from airflow.exceptions import AirflowConfigException
from airflow.executors.local_executor import LocalExecutor
from airflow.executors.workloads import ExecuteTask
from airflow.models.dag import DagTag
from airflow.models.dagrun import DagRun
from airflow.models.taskinstance import TaskInstance, clear_task_instances
from airflow.utils.net import get_hostname
from airflow.utils.session import create_session
from airflow.utils.state import TaskInstanceState
from sqlalchemy import select
from sqlalchemy.orm import object_session

from airflow_quota.core.access import Actor
from airflow_quota.core.human_time import duration_words
from airflow_quota.core.model import HOLDING_STATES, WAITING_STATES, JobState
from airflow_quota.exceptions import InvalidInput
from airflow_quota.executors.config import config_problems, quota_arguments
from airflow_quota.executors.forking import close_pooled_connections
from airflow_quota.executors.jobs import ExecutorJobs, JobProgress, TaskIdentity, TaskRefused
from airflow_quota.executors.placement import Placement
from airflow_quota.executors.story import WaitLog, waiting_line
from airflow_quota.executors.task_log import append_to_task_log, one_line
from airflow_quota.executors.worker import run_worker
from airflow_quota.hooks.quota import describe_job, pending_deadline_line
from airflow_quota.operators.arguments import seconds
from airflow_quota.operators.priority import priority_override
from airflow_quota.service.backends.base import STOPPED_BEFORE_START
from airflow_quota.store.forecast_words import forecast_moved, forecast_words
from airflow_quota.store.models import AttemptState, ForecastRow, JobRow

if TYPE_CHECKING:
    from airflow.models.taskinstancekey import TaskInstanceKey
    from sqlalchemy.orm import Session

    from airflow_quota.executors.celery_delegate import CeleryDelegate

# Every read and write of Airflow's database here opens its own session (scoped=False): the
# scoped one is the scheduler's, and closing it would detach the scheduler's task instances.
FOLLOW_SECONDS = 1.0
"""The quota database is read at most this often (the scheduler's loop may run faster)."""
SUMMARY_SECONDS = 60.0
"""How often the executor logs what it holds."""
RELEASABLE = (AttemptState.PENDING.value, AttemptState.RUNNING.value)
"""An attempt the quota scheduler has placed and told its backend to start."""
SIGNAL_REPEAT_SECONDS = 5.0
"""A preempted Celery-run try's SIGTERM is broadcast at each follow for this long (a worker signals
a try once): a worker may miss a broadcast (a reconnection), and the task's process gets the title
the worker finds it by a moment after Airflow has it RUNNING."""
DELEGATES = ("local", "celery")
"""Where released tasks run (``[quota] executor_delegate``): LocalExecutor's worker processes, or
the Celery queue named after the placed instance type."""


def executor_delegate(conf: Any) -> str:
    """``[quota] executor_delegate`` (``local`` when unset); an unknown value is an error naming
    the setting and the values it takes, raised when the scheduler loads the executor."""
    value = (conf.get("quota", "executor_delegate", fallback="local") or "local").strip().lower()
    if value not in DELEGATES:
        raise AirflowConfigException(
            f"[quota] executor_delegate = {value!r}: choose one of {', '.join(DELEGATES)} "
            "(where QuotaExecutor runs the tasks the quota scheduler places)"
        )
    return value


@dataclass
class Held:
    """A task QUEUED in Airflow whose job waits for a placement."""

    workload: ExecuteTask
    arguments: dict[str, Any]
    priority: int | None
    since: float
    actor: Actor = field(default_factory=Actor)
    """Who submits (``core.access``): the task's DAG (id, tags, bundle) and its run's triggering user."""
    job_id: int | None = None
    problem: str | None = None
    """Why the task cannot run (it fails at the next sync)."""
    announced: float | None = None
    """The max_pending deadline of its job's wait last said in the log (one line per wait)."""
    job_name: str = ""
    share: str = ""
    waits: WaitLog = field(default_factory=WaitLog)
    """Why its job waited, each change once: the try's log tells it (``executors/story.py``)."""
    wait_read: tuple[Any, ...] | None = None
    foreseen: ForecastRow | None = None
    """The forecast last kept in ``waits`` (a line again only when it moves, ``forecast_moved``)."""
    """What the narrow read last said of the wait: a line is worded only when that changes."""


@dataclass
class Released:
    """A task running (or about to) on a placement of its job."""

    workload: ExecuteTask | None
    """None for a task adopted while running (another scheduler's worker runs it)."""
    ti_id: str
    identity: TaskIdentity
    job_id: int
    attempt: int
    environment: dict[str, str]
    stop_at: float | None = None
    stop_deadline: float | None = None
    signal_until: float | None = None
    """On a Celery worker: the SIGTERM is broadcast at each follow until then (``_stop``)."""
    cleared: bool = False


def identity_of(ti: Any) -> TaskIdentity:
    """The task instance and try of a workload's ``TaskInstanceDTO`` or an ORM task instance."""
    map_index = ti.map_index if ti.map_index is not None else -1
    return TaskIdentity(ti.dag_id, ti.task_id, ti.run_id, map_index, ti.try_number)


class QuotaExecutor(LocalExecutor):
    """Hold each task until its quota share places it, then run it as LocalExecutor does.

    Configure it beside Airflow's default executor, ``[core] executor =
    LocalExecutor,quota:airflow_quota.executors.QuotaExecutor``, and opt tasks in with
    ``executor="quota"`` and ``executor_config=quota_config(...)`` (``executors/config.py``).
    ``[quota] quota_conn_id`` names the quota database's connection (``quota_default``), and
    ``[quota] executor_delegate`` where placed tasks run: ``local`` (this executor's worker
    processes) or ``celery`` (the Celery queue named after the placed instance type).
    """

    supports_ad_hoc_ti_run: bool = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]
        self.held: dict[TaskInstanceKey, Held] = {}
        self.released: dict[TaskInstanceKey, Released] = {}
        self.watched: dict[TaskInstanceKey, Released] = {}
        """Tasks adopted while running: their process belongs to a scheduler that died."""
        conn_id = self.conf.get("quota", "quota_conn_id", fallback="quota_default")
        self.jobs = ExecutorJobs(conn_id or "quota_default")
        self.celery: CeleryDelegate | None = None
        if executor_delegate(self.conf) == "celery":
            from airflow_quota.executors.celery_delegate import CeleryDelegate  # the provider loads late

            self.celery = CeleryDelegate(self.conf)
            # the scheduler gives each queued try an external_executor_id, the Celery task id it is
            # sent with: a try sent again after a restart keeps its id (``CeleryDelegate.send``)
            self.pre_assigns_external_executor_id = True  # type: ignore[misc]  # the scheduler reads it per instance
        self._followed_at = float("-inf")
        self._summarised_at = time.monotonic()

    # -- Airflow's interface ---------------------------------------------------------------

    def queue_workload(self, workload: Any, session: Session) -> None:
        """Hold a task (callbacks and connection tests go to LocalExecutor as they are)."""
        if not isinstance(workload, ExecuteTask):
            super().queue_workload(workload, session)
            return
        self._hold(workload, session)

    def has_task(self, task_instance: TaskInstance) -> bool:
        return (
            super().has_task(task_instance)
            or task_instance.key in self.held
            or task_instance.key in self.released
            or task_instance.key in self.watched
        )

    def revoke_task(self, *, ti: TaskInstance) -> None:
        """Left unimplemented on purpose: the scheduler's stuck-in-queued check skips an
        executor whose ``revoke_task`` raises ``NotImplementedError``, so a task held for its
        share stays QUEUED past ``task_queued_timeout`` (module docstring, fact 1)."""
        raise NotImplementedError("QuotaExecutor holds queued tasks until their quota share places them")

    def sync(self) -> None:
        now = time.time()
        if time.monotonic() - self._followed_at >= FOLLOW_SECONDS:
            self._followed_at = time.monotonic()
            try:
                self._submit_held()
                self._follow(now)
                self._watch_adopted()
            except Exception:  # the quota database may be down: Airflow's loop must go on
                self.log.exception("QuotaExecutor could not reach the quota database; retrying")
            self._relay_celery_ends()
        self._summarise()
        super().sync()

    def change_state(self, key: Any, state: Any, info: Any = None, remove_running: bool = True) -> None:
        """A try ended (LocalExecutor's event): tell the quota scheduler how, then Airflow.
        ``info`` is why a try failed outside the task, when a worker could say (``worker.py``)."""
        if state in (TaskInstanceState.SUCCESS, TaskInstanceState.FAILED):
            released = self.released.pop(key, None)
            if released is not None:
                self._report_end(released, one_line(info) if isinstance(info, str) else None)
        super().change_state(key, state, info, remove_running)

    def _read_results(self) -> None:
        """LocalExecutor's, with the worker's cause of a failed try passed on as the event's info
        (LocalExecutor drops it)."""
        while not self.result_queue.empty():
            key, state, cause = self.result_queue.get()
            self.change_state(key, state, cause)

    def try_adopt_task_instances(self, tis: Sequence[TaskInstance]) -> Sequence[TaskInstance]:
        """Take back a dead scheduler's quota tasks: QUEUED ones are held again (their jobs
        found by key, never submitted twice), RUNNING ones followed until they end."""
        unadopted: list[TaskInstance] = []
        for ti in tis:
            try:
                if ti.state == TaskInstanceState.QUEUED:
                    workload = ExecuteTask.make(ti, generator=self.jwt_generator)
                    self._hold(workload, object_session(ti))
                elif ti.state == TaskInstanceState.RUNNING and self._adopt_running(ti):
                    pass
                else:
                    unadopted.append(ti)
            except Exception:
                self.log.exception("QuotaExecutor could not adopt %s", ti)
                unadopted.append(ti)
        if len(unadopted) < len(tis):
            self.log.info("QuotaExecutor adopted %d task(s)", len(tis) - len(unadopted))
        return unadopted

    # -- worker processes ------------------------------------------------------------------

    def _spawn_worker(self) -> None:
        """LocalExecutor's, forking only once this process's pooled database connections are
        closed: a worker outliving a killed scheduler holds none of them (``forking.py``)."""
        if self.is_mp_using_fork:
            close_pooled_connections()
        process = multiprocessing.Process(
            target=run_worker,
            kwargs={
                "logger_name": self.log.name,
                "input": self.activity_queue,
                "output": self.result_queue,
                "unread_messages": self._unread_messages,
                "team_conf": self.conf,
            },
        )
        process.start()
        assert process.pid is not None
        self.workers[process.pid] = process

    def _process_workloads(self, workload_list: Sequence[Any]) -> None:
        """LocalExecutor's, with each task's placement travelling with it to the worker."""
        for workload in workload_list:
            released = self.released.get(workload.key)
            item = (workload, released.environment if released else {})
            self.activity_queue.put(item)  # type: ignore[arg-type]  # run_worker reads work items
            removed = (
                self.queued_tasks.pop(workload.key, None)
                or self.queued_callbacks.pop(workload.key, None)
                or self.queued_connection_tests.pop(workload.key, None)
            )
            if not removed:
                raise KeyError(f"Workload {workload.key} was not found in any queue")
        with self._unread_messages:
            self._unread_messages.value += len(workload_list)
        self._check_workers()  # type: ignore[no-untyped-call]

    # -- holding -----------------------------------------------------------------------------

    def _hold(self, workload: ExecuteTask, session: Session | None) -> None:
        ti = workload.ti
        held = Held(workload, {}, None, time.time())
        try:
            held.arguments = quota_arguments(ti.executor_config, ti.queue)
            conf, user, tags = self._run_facts(ti, session)
            held.actor = Actor.of_dag(ti.dag_id, tags, workload.bundle_info.name, user)
            held.priority = priority_override({"dag_run": SimpleNamespace(conf=conf)})
            problems = config_problems(ti.executor_config, ti.queue, priority=held.priority)
            if problems:
                raise InvalidInput(problems)
        except (InvalidInput, ValueError) as exc:
            held.problem = f"task {ti.task_id!r}: invalid quota executor_config: {exc}"
        self.held[ti.key] = held

    @staticmethod
    def _run_facts(ti: Any, session: Session | None) -> tuple[dict[str, Any], str | None, list[str]]:
        """The run's conf and triggering user, and the DAG's tags, from Airflow's database."""
        run = select(DagRun.conf, DagRun.triggering_user_name).where(
            DagRun.dag_id == ti.dag_id, DagRun.run_id == ti.run_id
        )
        tags = select(DagTag.name).where(DagTag.dag_id == ti.dag_id)
        with contextlib.nullcontext(session) if session is not None else create_session(scoped=False) as own:
            row = own.execute(run).first()
            return (row.conf or {}) if row else {}, row.triggering_user_name if row else None, list(own.scalars(tags))

    def _submit_held(self) -> None:
        for key, held in list(self.held.items()):
            if held.job_id is not None or held.problem is not None:
                continue
            try:
                job = self.jobs.job_for(identity_of(held.workload.ti), held.arguments, held.priority, held.actor)
            except TaskRefused as exc:
                held.problem = str(exc)
                continue
            held.job_id, held.job_name, held.share = job.id, job.name, job.share
            self.log.info("%s held: %s", key, describe_job(job))
        for key, held in list(self.held.items()):
            if held.problem is not None:
                self._fail_held(key, held.problem)

    def _fail_held(self, key: TaskInstanceKey, message: str) -> None:
        """Fail a held task with a message naming what is wrong (never a silent hold), in the
        executor's log, the task instance's audit log and the try's own log (it never ran: the
        line is all its log says)."""
        held = self.held.pop(key)
        self.log.error("%s fails: %s", key, message)
        self.log_task_event(event="quota executor", extra=message, ti_key=key)
        append_to_task_log(held.workload.log_path, f"the quota did not run this try: {message}")
        self.fail(key, info=message)

    # -- following the quota scheduler -------------------------------------------------------

    def _follow(self, now: float) -> None:
        held_ids = {h.job_id for h in self.held.values() if h.job_id is not None}
        released_ids = {r.job_id for r in self.released.values()}
        if not held_ids and not released_ids:
            return
        # a narrow read of every held job; whole rows and attempts only for the jobs that moved
        # (placed, ended, or placed once before): a held job still waiting for its first
        # placement needs nothing more, so a thousand held tasks cost one light query a sync
        states = self.jobs.states(held_ids)
        moved = {job_id for job_id, job in states.items() if job.state not in WAITING_STATES or job.attempts > 0}
        jobs = self.jobs.jobs(moved)
        attempts = self.jobs.attempts(moved | released_ids)
        keys = {(r.job_id, r.attempt) for r in self.released.values()}
        keys |= {(a.job_id, a.number) for a in attempts.values() if not a.ended}
        reports = self.jobs.reports(keys)
        waiting = [job_id for job_id, job in states.items() if job.state == JobState.RUNNABLE.value]
        forecasts = self.jobs.forecasts(waiting) if waiting else {}
        for key, held in list(self.held.items()):
            if held.job_id is None:
                continue
            if held.job_id not in states:
                self._fail_held(key, self.jobs.refusal(held.job_id))
                continue
            self._announce_deadline(key, held, states[held.job_id].pending_deadline, now)
            job = jobs.get(held.job_id)
            self._note_wait(held, states[held.job_id], job, now)
            self._note_forecast(held, forecasts.get(held.job_id), now)
            if job is None:  # still waiting, never placed (or gone since: the next sync sees it)
                continue
            attempt = attempts.get(job.id)
            report = reports.get((job.id, attempt.number)) if attempt is not None else None
            if attempt is not None and not attempt.ended and report is not None and report.stop_requested_at:
                # preempted or cancelled before it was released: it never ran
                if report.status == "PENDING":
                    try_number = held.workload.ti.try_number
                    self.jobs.report(job.id, attempt.number, "STOPPED", STOPPED_BEFORE_START, try_number)
            elif job.state in HOLDING_STATES:
                if attempt is not None and not attempt.ended and attempt.status in RELEASABLE:
                    self._release(key, held, job.share, job.request.get("checkpoint_uri"), job.preemptions, attempt)
            elif job.state not in ("SUBMITTED", "RUNNABLE"):
                self._fail_held(key, describe_job(job))
        for released in self.released.values():
            report = reports.get((released.job_id, released.attempt))
            if report is not None and report.stop_requested_at is not None:
                self._stop(released, report.stop_grace or 0.0, now)
            if released.signal_until is not None and now <= released.signal_until and not released.cleared:
                self._signal_celery(released)
            if released.stop_deadline is not None and not released.cleared and now >= released.stop_deadline:
                self._clear(released)

    @staticmethod
    def _note_wait(held: Held, progress: JobProgress, job: JobRow | None, now: float) -> None:
        """Keep why a held task's job waits when that changes (``WaitLog``): from its whole row
        when read (a job placed before), else from the narrow read."""
        if progress.state != JobState.RUNNABLE.value or held.job_id is None:
            return
        read = (progress.attempts, *progress[4:])  # a thousand held tasks: word only what changed
        if read == held.wait_read:
            return
        held.wait_read = read
        if job is not None:
            line = describe_job(job)
        else:
            line = waiting_line(
                held.job_id,
                held.job_name,
                held.share,
                progress.state,
                progress.pending_reason,
                progress.waiting_for,
                progress.position_in_share,
                progress.position_in_queue,
            )
        held.waits.note(now, line)

    @staticmethod
    def _note_forecast(held: Held, forecast: ForecastRow | None, now: float) -> None:
        """Keep the job's forecast among its wait's lines when it first comes and when it moves
        by more than 10% of the wait it had left (the try's log shows them when it starts)."""
        if forecast is None or held.job_id is None or not forecast_moved(held.foreseen, forecast, now):
            return
        held.foreseen = forecast
        held.waits.note(now, f"quota job {held.job_id}: {forecast_words(forecast, now)}")

    def _announce_deadline(self, key: TaskInstanceKey, held: Held, deadline: float | None, now: float) -> None:
        """Say once per wait when a held task's ``max_pending_time`` falls due, in the
        executor's log and the task instance's audit log (the task has no log of its own yet)."""
        if deadline is None or deadline == held.announced or held.job_id is None:
            return
        limit = seconds(held.arguments.get("max_pending_time"))  # valid: the job was submitted with it
        if limit is None:
            return
        held.announced = deadline
        line = pending_deadline_line(held.job_id, limit, deadline, now)
        self.log.info("%s held: %s", key, line)
        self.log_task_event(event="quota executor", extra=line, ti_key=key)

    def _release(
        self,
        key: TaskInstanceKey,
        held: Held,
        share: str,
        checkpoint_uri: str | None,
        preemptions: int,
        attempt: Any,
    ) -> None:
        """Run a placed task: a fresh token (the one minted at queue time may have expired),
        the placement in its environment, LocalExecutor's queue (a worker takes it when one is
        free) or the Celery queue of the placed instance type (a worker on a host of that type
        takes it). A broker that cannot be reached leaves the task held, sent again next time."""
        assert held.job_id is not None
        placement = Placement(
            share,
            held.job_id,
            attempt.number,
            attempt.instance_type,
            attempt.count,
            attempt.training_plan,
            checkpoint_uri,
            preemptions,
        )
        environment = placement.environment() | held.waits.environment()
        token = ExecuteTask.generate_token(str(held.workload.ti.id), self.jwt_generator)
        workload = held.workload.model_copy(update={"token": token})
        identity = identity_of(workload.ti)
        if self.celery is None:
            self.queued_tasks[key] = workload
        else:
            try:
                celery_id = self.celery.send(key, workload, attempt.instance_type, environment)
            except Exception:
                self.log.exception("%s could not be sent to Celery queue %s; sent again", key, attempt.instance_type)
                return
            self.running.add(key)  # a running task as for CeleryExecutor: it counts in this executor's slots
            # Airflow records the Celery task id as the task instance's external_executor_id
            self.event_buffer[key] = (TaskInstanceState.QUEUED, celery_id)
        del self.held[key]
        self.released[key] = Released(workload, str(workload.ti.id), identity, held.job_id, attempt.number, environment)
        self.jobs.report(held.job_id, attempt.number, "RUNNING", None, identity.try_number)
        self.log.info(
            "%s released after %s: quota job %s attempt %s on %sx %s in share %s, to %s",
            key,
            duration_words(max(0.0, time.time() - held.since)),
            held.job_id,
            attempt.number,
            attempt.count,
            attempt.instance_type,
            share,
            "LocalExecutor's workers" if self.celery is None else f"Celery queue {attempt.instance_type}",
        )

    def _stop(self, released: Released, grace: float, now: float) -> None:
        """The quota scheduler stops the attempt: SIGTERM now, the RESTARTING route at the end
        of the grace (``_clear``).

        A task on a Celery worker runs on another host, out of this process's reach: the SIGTERM
        is a broadcast the worker running the try acts on (``CeleryDelegate.signal``), repeated
        for ``SIGNAL_REPEAT_SECONDS``. A try not running yet (its message waits in the broker) has
        nothing to save: it is cleared as soon as it runs."""
        if released.stop_at is not None:
            return
        if self.celery is not None:
            running = self._try_state(released) == TaskInstanceState.RUNNING
            released.stop_at = now
            released.stop_deadline = now + max(grace, 0.0) if running else now
            if running:
                released.signal_until = min(now + SIGNAL_REPEAT_SECONDS, released.stop_deadline)
            self.log.info(
                "quota job %s attempt %s is being stopped: %s on a Celery worker, %s",
                released.job_id,
                released.attempt,
                released.identity,
                f"SIGTERM through the workers, cleared in {duration_words(max(grace, 0.0))}"
                if running
                else "not running yet, cleared once it runs",
            )
            return
        released.stop_at, released.stop_deadline = now, now + max(grace, 0.0)
        pid = self._task_pid(released.ti_id)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGTERM)
        self.log.info(
            "quota job %s attempt %s is being stopped: SIGTERM to %s (pid %s), cleared in %s",
            released.job_id,
            released.attempt,
            released.identity,
            pid,
            duration_words(max(grace, 0.0)),
        )

    def _signal_celery(self, released: Released) -> None:
        """Broadcast the SIGTERM of a preempted try to the Celery workers (``_stop``); a broker
        that cannot be reached is logged, and the next follow tries again."""
        assert self.celery is not None
        try:
            self.celery.signal(released.ti_id)
        except Exception:
            self.log.exception("the SIGTERM for %s could not be broadcast to the Celery workers", released.identity)

    @staticmethod
    def _task_pid(ti_id: str) -> int | None:
        """The task's process, when it runs on this host."""
        with create_session(scoped=False) as session:
            query = select(TaskInstance.pid, TaskInstance.hostname).where(TaskInstance.id == ti_id)
            row = session.execute(query).first()
        if row is None or row.pid is None or row.hostname != get_hostname():  # type: ignore[no-untyped-call]
            return None
        return int(row.pid)

    def _clear(self, released: Released) -> None:
        """Airflow's own way to stop a running task for another try: clear it (RESTARTING); its
        supervisor kills it, and the scheduler queues the next try without using a retry. A task
        not started yet (QUEUED: waiting for a free worker, or in the Celery broker) is cleared at
        a later sync, once it runs."""
        with create_session(scoped=False) as session:
            ti = session.scalars(select(TaskInstance).where(TaskInstance.id == released.ti_id)).one_or_none()
            if ti is not None and ti.state == TaskInstanceState.QUEUED:
                return
            released.cleared = True
            if ti is not None and ti.state == TaskInstanceState.RUNNING:
                clear_task_instances([ti], session, dag_run_state=False)
                self.log.info("%s cleared (RESTARTING) for quota job %s", released.identity, released.job_id)

    # -- reporting ---------------------------------------------------------------------------

    def _relay_celery_ends(self) -> None:
        """Celery-run tries that ended become this executor's events: ``change_state`` reports
        them to the quota scheduler, then to Airflow, as LocalExecutor's events are.

        A try sent twice (again after a scheduler restart, ``CeleryDelegate.send``) may end as a
        Celery FAILURE after it succeeded: its second message, taken once the run was over, was
        refused by Airflow. Airflow's database has the run's state, so that one counts."""
        if self.celery is None:
            return
        try:
            ends = self.celery.ended()
        except Exception:  # the result backend may be down: Airflow's loop must go on
            self.log.exception("QuotaExecutor could not read the Celery result backend; retrying")
            return
        for end in ends:
            released = self.released.get(end.key)
            refused_after_success = (
                end.state == TaskInstanceState.FAILED
                and released is not None
                and self._try_state(released) == TaskInstanceState.SUCCESS
            )
            self.change_state(end.key, TaskInstanceState.SUCCESS if refused_after_success else end.state, end.info)

    def _report_end(self, released: Released, cause: str | None = None) -> None:
        """How the try ended, from the task instance's state in Airflow's database, with the
        worker's ``cause`` of a failure outside the task (the quota job's failure detail names it)."""
        state = self._try_state(released)
        try_number = released.identity.try_number
        try:
            if state == TaskInstanceState.SUCCESS:
                self.jobs.report(released.job_id, released.attempt, "SUCCEEDED", None, try_number)
                if released.stop_at is not None:  # it finished during its grace: nothing to resume
                    self.jobs.cancel(released.job_id)
            elif released.stop_at is not None:
                self.jobs.report(released.job_id, released.attempt, "STOPPED", "Preempted", try_number)
            else:
                reason = f"AirflowTask:{state}" + (f": {cause}" if cause else "")
                self.jobs.report(released.job_id, released.attempt, "FAILED", reason, try_number)
        except Exception:
            self.log.exception("could not report quota job %s attempt %s", released.job_id, released.attempt)

    @staticmethod
    def _try_state(released: Released) -> str | None:
        identity = released.identity
        with create_session(scoped=False) as session:
            row = session.execute(
                select(TaskInstance.state, TaskInstance.try_number).where(
                    TaskInstance.dag_id == identity.dag_id,
                    TaskInstance.task_id == identity.task_id,
                    TaskInstance.run_id == identity.run_id,
                    TaskInstance.map_index == identity.map_index,
                )
            ).first()
        if row is None or row.try_number != identity.try_number:
            return None
        return None if row.state is None else str(row.state)

    # -- adoption ----------------------------------------------------------------------------

    def _adopt_running(self, ti: TaskInstance) -> bool:
        identity = identity_of(ti)
        generation, found = 1, None
        while (job := self.jobs.hook.get_job_by_token(identity.token(generation))) is not None:
            found, generation = job, generation + 1
        if found is None or found.attempts < 1:
            return False
        self.watched[ti.key] = Released(None, str(ti.id), identity, found.id, found.attempts, {})
        return True

    def _watch_adopted(self) -> None:
        """Adopted running tasks: report them once Airflow's database says they ended."""
        for key, watched in list(self.watched.items()):
            state = self._try_state(watched)
            if state in (TaskInstanceState.RUNNING, TaskInstanceState.QUEUED):
                continue
            del self.watched[key]
            self._report_end(watched)

    def _summarise(self) -> None:
        if time.monotonic() - self._summarised_at < SUMMARY_SECONDS:
            return
        self._summarised_at = time.monotonic()
        if self.held:
            oldest = min(h.since for h in self.held.values())
            self.log.info(
                "QuotaExecutor holds %d task(s) for their quota shares (longest %.0f s), runs %d",
                len(self.held),
                time.time() - oldest,
                len(self.released),
            )
