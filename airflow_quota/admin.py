"""The administration commands of ``airflow-quota``: ``db migrate``, ``apply``, ``scheduler``,
``shares``, ``jobs list|show|submit|set-priority|cancel``, ``alerts`` and ``doctor``. Each reading command
prints a table, or one JSON document with ``--json``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_quota.core.access import local_user
from airflow_quota.core.config import NAME_PATTERN, QUOTA_SECTIONS, load_file, parse_config
from airflow_quota.core.human_time import clock_time, duration_words
from airflow_quota.exceptions import ChangeRefused, InvalidInput, Problem
from airflow_quota.store.backend_names import enabled_backends
from airflow_quota.store.settings import DEFAULT_SNAPSHOT_EVERY, airflow_home, database_url, redacted, retention_days

if TYPE_CHECKING:  # the store (SQLAlchemy, alembic) loads only for the commands that use it
    from airflow_quota.store.models import ForecastRow, JobRow
    from airflow_quota.store.repository import QuotaStore
    from airflow_quota.store.views import LatestConfiguration, ShareView


def add_commands(commands: Any) -> None:
    """Register the administration commands on the CLI's subparsers."""
    db = commands.add_parser("db", help="the quota database")
    db_commands = db.add_subparsers(dest="db_command", required=True, metavar="COMMAND")
    migrate_parser = db_commands.add_parser("migrate", help="create or upgrade the quota database")
    _db_option(migrate_parser)
    migrate_parser.set_defaults(run=db_migrate)
    prune = db_commands.add_parser(
        "prune",
        help="remove finished jobs and covered inputs older than retention_days now (what the leader does in batches)",
    )
    prune.add_argument("--dry-run", action="store_true", help="only count what would go, per table; write nothing")
    _retention_option(prune)
    _db_option(prune)
    _json_option(prune)
    prune.set_defaults(run=db_prune)

    apply = commands.add_parser("apply", help="validate and store a quota configuration as a new version")
    apply.add_argument("file")
    _db_option(apply)
    apply.set_defaults(run=apply_config)

    scheduler = commands.add_parser("scheduler", help="run the quota scheduler (one leads, others wait)")
    _db_option(scheduler)
    scheduler.add_argument("--state-dir", default=None, help="where local and fake attempts keep their state")
    scheduler.add_argument("--gpu-indices", default=None, help='JSON: {"instance type": [GPU indices]} for local')
    scheduler.add_argument("--region", default=None, help="AWS region of the SageMaker backend")
    scheduler.add_argument(
        "--cycle-seconds",
        type=float,
        default=1.0,
        help="a cycle at least this often, also when nothing happened (it decides nothing then)",
    )
    scheduler.add_argument(
        "--poll-seconds",
        type=float,
        default=0.2,
        help="the leader's step at least this often (sooner when woken); backends are polled on their own intervals",
    )
    scheduler.add_argument(
        "--sagemaker-poll-seconds",
        type=_at_least(0.0),
        default=30.0,
        help="each SageMaker training job is described at least every ten times this (a safety net), and as soon as"
        " a listing shows it changed; without listing, this often (default %(default)g, the provider's check_interval)",
    )
    scheduler.add_argument(
        "--sagemaker-list-seconds",
        type=_at_least(0.01),
        default=5.0,
        help="the SageMaker training jobs changed are listed this often (ListTrainingJobs with LastModifiedTimeAfter;"
        " default %(default)g): a change is noticed within about this long",
    )
    scheduler.add_argument(
        "--sagemaker-poll-rate",
        type=_at_least(0.01),
        default=35.0,
        help="at most this many SageMaker calls a second, listings, polls, starts and stops together"
        " (default %(default)g)",
    )
    scheduler.add_argument(
        "--local-poll-seconds",
        type=_at_least(0.0),
        default=1.0,
        help="each local attempt is looked at this often (default %(default)g)",
    )
    scheduler.add_argument(
        "--poll-workers",
        type=_at_least(1, whole=True),
        default=8,
        help="at most this many polls of one backend at once (default %(default)d)",
    )
    scheduler.add_argument(
        "--lease-seconds",
        type=float,
        default=10.0,
        help="a leader that has not renewed its lease this long is replaced (default %(default)g)",
    )
    scheduler.add_argument(
        "--forecast-interval",
        type=_at_least(0),
        default=30.0,
        metavar="SECONDS",
        help="refresh every live job's forecast after changes, at most this often, in a process of its own; "
        "0: never (default %(default)g)",
    )
    _retention_option(scheduler)
    scheduler.add_argument(
        "--snapshot-every",
        type=_at_least(0, whole=True),
        default=DEFAULT_SNAPSHOT_EVERY,
        help="a snapshot of the scheduler's state every this many inputs and at a clean stop, so a new leader"
        " replays only the inputs after it (default %(default)d; 0: none, recovery replays the whole log)",
    )
    scheduler.add_argument(
        "--aws-batch-job-queue",
        default=None,
        metavar="QUEUE",
        help="let AWS Batch place: every submission goes to this quota-management job queue as a service job,"
        " and what AWS does is mirrored into the quota database (docs/aws-batch.md)",
    )
    scheduler.add_argument(
        "--aws-conn-id",
        default=None,
        help="with --aws-batch-job-queue: the Airflow AWS connection of the Batch calls (default: boto3's own"
        " credentials, and --region)",
    )
    scheduler.add_argument(
        "--aws-batch-mirror-seconds",
        type=_at_least(0.01),
        default=10.0,
        help="with --aws-batch-job-queue: each share's next ListServiceJobs page this often (default %(default)g)",
    )
    scheduler.set_defaults(run=run_scheduler)

    shares = commands.add_parser("shares", help="per share and type: limit, used, borrowed, lent, RUNNABLE")
    _db_option(shares)
    _json_option(shares)
    shares.set_defaults(run=show_shares)

    jobs = commands.add_parser("jobs", help="list, show, submit, re-prioritise and cancel jobs")
    job_commands = jobs.add_subparsers(dest="jobs_command", required=True, metavar="COMMAND")
    listing = job_commands.add_parser("list", help="jobs, with position and pending reason when waiting")
    listing.add_argument("--share")
    listing.add_argument("--state", action="append", help="repeat for several states")
    listing.add_argument("--dag")
    _db_option(listing)
    _json_option(listing)
    listing.set_defaults(run=list_jobs)
    show = job_commands.add_parser("show", help="one job: attempts, placements, preemptions, cost")
    show.add_argument("job", help="job id or name")
    _db_option(show)
    _json_option(show)
    show.set_defaults(run=show_job)
    submit = job_commands.add_parser("submit", help="submit a job described in a YAML file")
    submit.add_argument("file")
    _db_option(submit)
    _json_option(submit)
    submit.set_defaults(run=submit_job)
    priority = job_commands.add_parser("set-priority", help="change a job's priority")
    priority.add_argument("job", help="job id or name")
    priority.add_argument("priority", type=int)
    priority.add_argument(
        "--wait",
        type=float,
        default=PRIORITY_WAIT_SECONDS,
        metavar="SECONDS",
        help="wait this long for the scheduler to take the change in (default %(default)g; 0: only ask)",
    )
    _db_option(priority)
    _json_option(priority)
    priority.set_defaults(run=set_priority)
    cancel = job_commands.add_parser("cancel", help="cancel a job (FAILED with CANCELLED)")
    cancel.add_argument("job", help="job id or name")
    _db_option(cancel)
    _json_option(cancel)
    cancel.set_defaults(run=cancel_job)

    provider = commands.add_parser(
        "provider", help="how many on-demand instances of a type the provider can give now (a capacity cap)"
    )
    provider.add_argument("instance_type", help="an instance type of the pool")
    provider.add_argument("available", type=_available, help="0 or more, or 'unlimited' to lift the cap")
    _db_option(provider)
    provider.set_defaults(run=set_provider_available)

    alerts = commands.add_parser("alerts", help="STARVING, PREEMPTED_REPEATEDLY and GUARANTEE_VIOLATED alerts")
    _db_option(alerts)
    _json_option(alerts)
    alerts.set_defaults(run=show_alerts)

    doctor = commands.add_parser(
        "doctor",
        help="check every wire of the installation, one line each (run it where Airflow runs)",
        description="Check, from an Airflow component's environment, the quota database and its migrations, the "
        'configuration applied, the leading quota scheduler, [core] executor against the DAGs\' executor="quota", '
        "the quota_default connection, the Quotas page plugin, the triggerer and the execution API. One line per "
        "check with the fix when it fails; exit 0 when all hold, 1 when one fails.",
    )
    _json_option(doctor)
    doctor.add_argument(
        "--timeout",
        type=_at_least(0.1),
        default=DOCTOR_TIMEOUT,
        metavar="SECONDS",
        help="each check fails when it has no answer in this long (default %(default)g)",
    )
    doctor.set_defaults(run=run_doctor)


DOCTOR_TIMEOUT = 15.0
"""How long each check of ``doctor`` may take by default: a dead server fails its line instead."""


def run_doctor(args: argparse.Namespace) -> int:
    """``doctor``: every check's line (or one JSON document); 0 when all hold, else 1."""
    from airflow_quota.doctor import report, run_checks

    checks = run_checks(args.timeout)
    print(report(checks, args.json))
    return 0 if all(check.ok for check in checks) else 1


def _at_least(least: float, whole: bool = False) -> Callable[[str], float]:
    """An argparse type: a number (a whole one when ``whole``) not below ``least``."""

    def parse(text: str) -> float:
        try:
            value = int(text) if whole else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {'whole ' if whole else ''}number") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"must be ≥ {least:g}, not {text}")
        return value

    return parse


def _db_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", default=None, metavar="URL", help="quota database URL (default: docs/operations.md)")


def _retention_option(parser: argparse.ArgumentParser) -> None:
    """``--retention-days``: read as text and checked when the command runs (``retention_days``),
    so a bad value in Airflow's configuration is refused by the commands that use it only."""
    parser.add_argument(
        "--retention-days",
        default=None,
        metavar="DAYS",
        help="prune finished jobs this many days after they ended; 0 keeps everything (default: "
        "AIRFLOW__QUOTA__RETENTION_DAYS, else [quota] retention_days, else 90)",
    )


def _json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON document")


def _store(args: argparse.Namespace) -> QuotaStore:
    from airflow_quota.store.engine import make_engine
    from airflow_quota.store.repository import QuotaStore

    return QuotaStore(make_engine(database_url(args.db)))


def db_migrate(args: argparse.Namespace) -> int:
    from airflow_quota.store.engine import make_engine, migrate

    url = database_url(args.db)
    before, after = migrate(make_engine(url))
    if before == after:
        print(f"quota database {redacted(url)} is up to date (revision {after})")
    else:
        print(f"quota database {redacted(url)} migrated from {before or 'nothing'} to revision {after}")
    return 0


def db_prune(args: argparse.Namespace) -> int:
    """``db prune``: what retention would remove now, per table, with the cutoff and the oldest
    kept; without ``--dry-run``, prune it now in the leader's batches (``store/retention.py``)."""
    from airflow_quota.store.engine import make_engine
    from airflow_quota.store.prune_report import prune_now

    days = retention_days(args.retention_days)
    url = database_url(args.db)
    document, text = prune_now(make_engine(url), days, dry_run=args.dry_run)
    if args.json:
        _print_json({"database": redacted(url), **document})
    else:
        print(text)
    return 0


def apply_config(args: argparse.Namespace) -> int:
    """Store a configuration; a notifier whose package cannot be imported here is stored (the
    scheduler's host may have it) with a warning on standard error."""
    from airflow_quota.notifications.loader import check_notifiers

    store = _store(args)

    def stored(raw: dict[str, Any]) -> tuple[int, list[Problem]]:
        warnings = check_notifiers(parse_config(raw))
        return store.apply_config(raw, source=str(args.file)), warnings

    version, warnings = load_file(Path(args.file), QUOTA_SECTIONS, stored)
    warn(warnings, args.file)
    print(f"{args.file}: stored as configuration version {version}; it takes effect at the next cycle")
    return 0


def warn(problems: list[Problem], file: str) -> None:
    """Print warnings on standard error, as problems are printed (``FILE: warning: path: message``)."""
    for problem in problems:
        print(f"{file}: warning: {problem}", file=sys.stderr)


def run_scheduler(args: argparse.Namespace) -> int:
    from airflow_quota.service.clock import WallClock
    from airflow_quota.service.leader import run_forever
    from airflow_quota.service.scheduler import VIEW_SECONDS, QuotaService
    from airflow_quota.store.engine import make_engine

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    url = database_url(args.db)
    days = retention_days(args.retention_days)  # a bad setting exits 2 before anything starts
    if args.aws_batch_job_queue is not None:
        return run_delegating_scheduler(args, url)
    if args.aws_conn_id is not None:
        raise InvalidInput.single("--aws-conn-id", "is for --aws-batch-job-queue (SageMaker jobs name their own)")
    engine = make_engine(url)
    state = Path(args.state_dir) if args.state_dir else airflow_home() / "quota"
    clock = WallClock()
    backends: dict[str, Any] = {}
    if "fake" in enabled_backends():  # only where a test enables it (store/backend_names.py)
        from airflow_quota.service.backends.fake import FakeBackend

        backends["fake"] = FakeBackend(clock.now, state / "fake")
    from airflow_quota.service.backends.executor import ExecutorBackend

    backends["airflow"] = ExecutorBackend(engine)  # QuotaExecutor's tasks: Airflow runs them
    try:
        from airflow_quota.service.backends.local import LocalBackend

        indices = gpu_indices(args.gpu_indices) if args.gpu_indices else None
        backends["local"] = LocalBackend(
            state / "local", gpu_indices=indices, poll_interval_seconds=args.local_poll_seconds
        )
    except ImportError:  # pragma: no cover - the local backend ships with the package
        pass
    if importlib.util.find_spec("boto3") is not None and importlib.util.find_spec("botocore") is not None:
        from airflow_quota.service.backends.sagemaker import SageMakerBackend  # boto3 only once a job needs it

        backends["sagemaker"] = SageMakerBackend(
            region_name=args.region,
            poll_interval_seconds=args.sagemaker_poll_seconds,
            poll_calls_per_second=args.sagemaker_poll_rate,
            list_interval_seconds=args.sagemaker_list_seconds,
        )
    else:
        logging.getLogger("airflow_quota.scheduler").info("the sagemaker backend needs boto3: not enabled")
    service = QuotaService(
        engine,
        backends,
        clock=clock,
        cycle_seconds=args.cycle_seconds,
        poll_seconds=args.poll_seconds,
        lease_seconds=args.lease_seconds,
        forecast_interval=args.forecast_interval or None,
        poll_workers=int(args.poll_workers),
        retention_days=days,
        snapshot_every=int(args.snapshot_every),
        view_seconds=VIEW_SECONDS,
    )
    logging.getLogger("airflow_quota.scheduler").info(
        "quota scheduler %s on %s with backends %s", service.holder, redacted(url), ", ".join(sorted(backends))
    )
    return 0 if run_forever(service) else 1


def run_delegating_scheduler(args: argparse.Namespace, url: str) -> int:
    """``scheduler --aws-batch-job-queue Q``: AWS Batch places (``service/delegation.py``)."""
    from airflow_quota.aws_batch.calls import BatchCalls
    from airflow_quota.service.delegation import AwsBatchDelegation
    from airflow_quota.service.leader import run_forever
    from airflow_quota.store.engine import make_engine

    calls = BatchCalls(batch_client(args.aws_conn_id, args.region))
    service = AwsBatchDelegation(
        make_engine(url),
        calls,
        args.aws_batch_job_queue,
        poll_seconds=args.poll_seconds,
        lease_seconds=args.lease_seconds,
        mirror_seconds=args.aws_batch_mirror_seconds,
    )
    logging.getLogger("airflow_quota.scheduler").info(
        "quota scheduler %s on %s: AWS Batch job queue %s places",
        service.holder,
        redacted(url),
        args.aws_batch_job_queue,
    )
    return 0 if run_forever(service) else 1


def batch_client(aws_conn_id: str | None, region: str | None) -> Any:
    """A Batch client: of the Airflow connection when one is named, else boto3's own (its
    credentials chain, ``region`` or the environment's, ``AWS_ENDPOINT_URL_BATCH``)."""
    from botocore.exceptions import BotoCoreError

    try:
        if aws_conn_id is not None:
            from airflow_quota.hooks.aws_batch import AwsBatchQuotaHook

            return AwsBatchQuotaHook(aws_conn_id=aws_conn_id, region_name=region).conn
        import boto3

        return boto3.client("batch", region_name=region)
    except BotoCoreError as exc:
        where = "--region" if aws_conn_id is None else "--aws-conn-id"
        raise InvalidInput.single(
            where, f"cannot make an AWS Batch client: {exc} (--region, or AWS_DEFAULT_REGION)"
        ) from None


def gpu_indices(text: str) -> dict[str, list[int]]:
    """``--gpu-indices``: a JSON mapping of instance type to GPU indices, else InvalidInput."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise InvalidInput.single("--gpu-indices", f"not JSON: {exc}") from None
    valid = isinstance(value, dict) and all(
        isinstance(v, list) and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in v)
        for v in value.values()
    )
    if not valid:
        raise InvalidInput.single("--gpu-indices", 'must map instance types to GPU indices: {"ml.g5.xlarge": [0]}')
    return {str(name): [int(i) for i in listed] for name, listed in value.items()}


def show_shares(args: argparse.Namespace) -> int:
    """The shares' view as the leading quota scheduler last committed it (``store/views.py``),
    waits as of now on the database's clock. Until a quota scheduler has taken in the latest
    configuration, a line (``config_taken_in`` false in JSON) says so: before any has run, the
    shares are that configuration's limits with nothing used, borrowed or lent."""
    store = _store(args)
    (view, latest), now = store.shown_view(), store.clock()
    if args.json:
        shares = [_share_record(share, now) for share in view.shares]
        _print_json(
            {
                "now": now,
                "computed_at": view.computed_at,
                "config_version": latest.version,
                "config_taken_in": latest.taken_in,
                "shares": shares,
            }
        )
        return 0
    rows = [
        [
            share.share,
            share.strategy,
            t.instance_type,
            t.limit,
            t.used,
            t.borrowed,
            round(t.lent, 3),
            t.idle,
            t.runnable,
            duration_words(t.oldest_pending_seconds(now)) if t.runnable else None,
        ]
        for share in view.shares
        for t in share.types
    ]
    headers = ["share", "strategy", "instance type", "limit", "used", "borrowed", "lent", "idle", "RUNNABLE"]
    print(_table([*headers, "oldest wait"], rows))
    if view.shares:
        print()
        print(_table(["share", "starving after"], [[share.share, share.starvation_words()] for share in view.shares]))
    note = configuration_note(latest, view.computed_at)
    if note:
        print(note)
    return 0


def configuration_note(latest: LatestConfiguration, computed_at: float | None) -> str | None:
    """The line ``shares`` adds while no quota scheduler has taken in the latest configuration
    (``computed_at``: when the leader computed the view shown, None when none has)."""
    if latest.version is None:
        return "no quota configuration is applied yet (airflow-quota apply quota.yaml)"
    if latest.taken_in:
        return None
    since = f"no quota scheduler has run since configuration version {latest.version} was stored"
    if computed_at is None:
        return f"{since}: its limits, nothing used, borrowed or lent yet (start one: airflow-quota scheduler)"
    return f"{since}: these figures are of the version before it"


def _share_record(share: ShareView, now: float) -> dict[str, Any]:
    return {
        "share": share.share,
        "strategy": share.strategy,
        "state": share.state,
        "running": share.running,
        "runnable": share.runnable,
        "oldest_pending_seconds": share.oldest_pending_seconds(now),
        "starvation_threshold_seconds": share.starvation_threshold_seconds,
        "starvation_fixed": share.starvation_fixed,
        "normal_wait_seconds": share.normal_wait_seconds,
        "starvation_multiple": share.starvation_multiple,
        "types": {
            t.instance_type: {
                "limit": t.limit,
                "used": t.used,
                "borrowed": t.borrowed,
                "lent": t.lent,
                "idle": t.idle,
                "runnable": t.runnable,
                "oldest_pending_seconds": t.oldest_pending_seconds(now),
            }
            for t in share.types
        },
    }


def _job_record(job: JobRow, borrowed_now: int, forecast: ForecastRow | None = None) -> dict[str, Any]:
    """A job as ``--json`` prints it. ``borrowed`` is how many of its instances are above its
    share's limit now (``dashboard.current_borrowing``, as the Quotas page and its API say it);
    ``borrowed_when_placed`` the count at its last placement, which jobs of the share placed
    before it may since have made smaller; ``forecast`` its latest forecast, if any
    (``store/forecast_words.py``)."""
    from airflow_quota.core.model import LIVE_STATES
    from airflow_quota.store.forecast_words import forecast_record

    return {
        "id": job.id,
        "name": job.name,
        "share": job.share,
        "priority": job.priority,
        "state": job.state,
        "reason": job.reason,
        "detail": job.detail,
        "backend": job.backend,
        "instance_type": job.instance_type,
        "count": job.count,
        "training_plan": job.training_plan,
        "borrowed": borrowed_now,
        "borrowed_when_placed": job.borrowed,
        "attempts": job.attempts,
        "preemptions": job.preemptions,
        "wait_seconds": round(job.wait_seconds, 3),
        "gpu_hours": round(job.gpu_hours, 6),
        "lost_gpu_hours": round(job.lost_gpu_hours, 6),
        "cost": round(job.cost, 4),
        "pending_reason": job.pending_reason,
        "waiting_for": job.waiting_for,
        "position_in_share": job.position_in_share,
        "position_in_queue": job.position_in_queue,
        "dag_id": job.dag_id,
        "task_id": job.task_id,
        "run_id": job.run_id,
        "submitted_at": job.submitted_at,
        "forecast": forecast_record(forecast) if job.state in LIVE_STATES else None,
    }


def list_jobs(args: argparse.Namespace) -> int:
    from airflow_quota.core.model import LIVE_STATES
    from airflow_quota.store.dashboard import current_borrowing

    store = _store(args)
    jobs = store.jobs(share=args.share, states=args.state, dag_id=args.dag)
    borrowing = current_borrowing(store, jobs)
    forecasts = store.forecasts([j.id for j in jobs if j.state in LIVE_STATES])
    if args.json:
        _print_json({"jobs": [_job_record(j, borrowing.get(j.id, 0), forecasts.get(j.id)) for j in jobs]})
        return 0
    now = store.clock()
    print(
        _table(
            [
                "id",
                "name",
                "share",
                "prio",
                "state",
                "reason / pending",
                "placed on",
                "pos",
                "attempts",
                "preempted",
                "expected",
            ],
            [
                [
                    j.id,
                    j.name,
                    j.share,
                    j.priority,
                    j.state,
                    j.reason or j.pending_reason,
                    _placed_on(j, borrowing.get(j.id, 0)),
                    j.position_in_share,
                    j.attempts,
                    j.preemptions,
                    _expected(forecasts.get(j.id), now),
                ]
                for j in jobs
            ],
        )
    )
    return 0


def _expected(forecast: ForecastRow | None, now: float) -> str | None:
    """The list's short form of a forecast (``forecast_words.forecast_short``)."""
    from airflow_quota.store.forecast_words import forecast_short

    return None if forecast is None else forecast_short(forecast, now)


def _placed_on(job: JobRow, borrowed_now: int) -> str | None:
    """``2x ml.g5.xlarge``, with ``(borrowing 1 now)`` while some of it is above the share's limit."""
    if not job.instance_type:
        return None
    borrowing = f" (borrowing {borrowed_now} now)" if borrowed_now else ""
    return f"{job.count}x {job.instance_type}{borrowing}"


JOB_ID_MAX = 2**63 - 1
"""The largest job id the quota database holds (a signed 64-bit integer)."""


def _find(store: QuotaStore, key: str) -> JobRow:
    """The job ``key`` names: an id, else a name (the live job of that name, else the latest)."""
    job_id = job_id_of(key)
    job = store.job(job_id) if job_id is not None else store.job_by_name(key)
    if job is None:
        raise InvalidInput.single("job", f"no job {key!r}")
    return job


def job_id_of(key: str) -> int | None:
    """The job id ``key`` is (ASCII digits), None when it is a job name; InvalidInput when it is
    neither (an id out of 1 to ``JOB_ID_MAX``, or text that breaks the name rule)."""
    if key.isascii() and key.isdigit():
        digits = key.lstrip("0") or "0"
        if len(digits) > len(str(JOB_ID_MAX)) or not 1 <= int(digits) <= JOB_ID_MAX:
            shown = digits if len(digits) <= 30 else f"a {len(digits)}-digit number"
            raise InvalidInput.single("job", f"a job id is 1 to {JOB_ID_MAX} (got {shown})")
        return int(digits)
    if not re.match(NAME_PATTERN, key):
        raise InvalidInput.single("job", f"neither a job id (1 to {JOB_ID_MAX}) nor a job name ({NAME_PATTERN})")
    return None


def show_job(args: argparse.Namespace) -> int:
    from airflow_quota.core.model import LIVE_STATES
    from airflow_quota.store.dashboard import current_borrowing
    from airflow_quota.store.forecast_words import forecast_words

    store = _store(args)
    job = _find(store, args.job)
    forecast = store.forecasts([job.id]).get(job.id)
    record = _job_record(job, current_borrowing(store, [job]).get(job.id, 0), forecast)
    record["attempts_detail"] = [
        {
            "number": a.number,
            "instance_type": a.instance_type,
            "count": a.count,
            "training_plan": a.training_plan,
            "borrowed": a.borrowed,
            "status": a.status,
            "placed_at": a.placed_at,
            "running_since": a.running_since,
            "ended_at": a.ended_at,
            "reason": a.reason,
        }
        for a in store.attempts(job.id)
    ]
    record["preemptions_detail"] = [
        {"attempt": p.attempt, "at": p.at, "kind": p.kind, "by": p.by_job, "lost_seconds": p.lost_seconds}
        for p in store.preemptions(job.id)
    ]
    record["alerts"] = [{"at": a.at, "kind": a.kind, "reason": a.reason} for a in store.alerts(job.id)]
    record["events"] = [e.line for e in store.events(job_id=job.id)]
    if args.json:
        _print_json(record)
        return 0
    for key in (
        "id",
        "name",
        "share",
        "priority",
        "state",
        "reason",
        "detail",
        "backend",
        "attempts",
        "preemptions",
        "gpu_hours",
        "lost_gpu_hours",
        "cost",
        "pending_reason",
        "position_in_share",
        "position_in_queue",
    ):
        if record[key] is not None:
            print(f"{key:>18}: {record[key]}")
    if job.instance_type:  # placed at least once
        print(f"{'borrowing':>18}: {record['borrowed']} now, {record['borrowed_when_placed']} when last placed")
    now = store.clock()
    submitted = clock_time(record["submitted_at"], now)
    print(f"{'submitted':>18}: {submitted}, waited {duration_words(record['wait_seconds'])}")
    if forecast is not None and job.state in LIVE_STATES:
        print(f"{'forecast':>18}: {forecast_words(forecast, now)}")
    if record["attempts_detail"]:
        print("\nattempts")
        print(
            _table(
                ["#", "placed on", "plan", "borrowed when placed", "status", "reason"],
                [
                    [
                        a["number"],
                        f"{a['count']}x {a['instance_type']}",
                        a["training_plan"],
                        a["borrowed"],
                        a["status"],
                        a["reason"],
                    ]
                    for a in record["attempts_detail"]
                ],
            )
        )
    if record["preemptions_detail"]:
        print("\npreemptions")
        print(
            _table(
                ["attempt", "at", "kind", "by", "work lost"],
                [
                    [p["attempt"], clock_time(p["at"], now), p["kind"], p["by"], duration_words(p["lost_seconds"])]
                    for p in record["preemptions_detail"]
                ],
            )
        )
    if record["events"]:
        print("\nstory")
        print("\n".join(record["events"]))
    return 0


def submit_job(args: argparse.Namespace) -> int:
    """Submit a job file as the operating-system user (``core.access.local_user``): a share
    with an ``access.submit`` rule takes it only when the rule lists that user. The file's
    problems name the listed types that are not in the pool applied now, beside any other."""
    from airflow_quota.core.submission import parse_submission

    store = _store(args)
    latest = store.latest_config()
    pool_types = set(latest[1].pool.capacity) if latest is not None else None
    request, fields = load_file(Path(args.file), "job fields", lambda raw: parse_submission(raw, pool_types))
    job = store.submit(
        request,
        fields.backend,
        fields.training or {},
        fields.client_token,
        fields.dag_id,
        fields.task_id,
        fields.run_id,
        aws_conn_id=fields.aws_conn_id,
        actor=local_user(),
        expected_runtime_seconds=fields.expected_runtime_seconds,
    )
    if args.json:
        _print_json(_job_record(job, 0))  # just submitted: it holds nothing
    else:
        print(f"submitted job {job.id} ({job.name}) to share {job.share}")
    return 0


PRIORITY_WAIT_SECONDS = 5.0
"""How long ``jobs set-priority`` waits for the scheduler by default: a few of its cycles."""


def set_priority(args: argparse.Namespace) -> int:
    """Ask for a new priority, then wait (``--wait``) until the scheduler has taken it in: a
    job that ends first is refused (exit 2), not answered "requested" for a change that never
    happens. Without a scheduler answering in time it stays "requested" (exit 0). Asked as the
    operating-system user: a share's ``access.set_priority`` rule must list it (exit 2)."""
    if not 0 <= args.priority <= 9999:
        raise InvalidInput.single("priority", f"0 to 9999 (got {args.priority})")
    if not 0 <= args.wait <= 3600:
        raise InvalidInput.single("--wait", f"0 to 3600 seconds (got {args.wait:g})")
    store = _store(args)
    job = _find(store, args.job)
    store.set_priority(job.id, args.priority, local_user())
    status = _priority_outcome(store, job, args.priority, args.wait)
    if args.json:
        _print_json({"job": job.id, "name": job.name, "priority": args.priority, "status": status})
    elif status == "set":
        print(f"job {job.id} ({job.name}): priority {args.priority} set")
    else:
        print(f"job {job.id} ({job.name}): priority {args.priority} asked; it takes effect at the next cycle")
    return 0


def _priority_outcome(store: QuotaStore, job: JobRow, priority: int, wait: float) -> str:
    """``set`` once the job's row shows the priority, ``requested`` when ``wait`` runs out
    first; ChangeRefused when the job ends before the change was taken in."""
    from airflow_quota.core.model import LIVE_STATES

    deadline = time.monotonic() + wait
    while True:
        row = store.job(job.id)
        if row is not None and row.priority == priority:
            return "set"
        if row is None or row.state not in LIVE_STATES:
            state = row.state if row is not None else "gone"
            raise ChangeRefused(
                f"job: {job.name!r} ended ({state}) before its new priority was taken in; nothing changed"
            )
        if time.monotonic() >= deadline:
            return "requested"
        time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))


def cancel_job(args: argparse.Namespace) -> int:
    store = _store(args)
    job = _find(store, args.job)
    store.cancel(job.id)
    if args.json:
        _print_json({"job": job.id, "name": job.name, "cancel": "requested"})
    else:
        print(f"job {job.id} ({job.name}): cancel asked")
    return 0


def _available(text: str) -> int | None:
    if text == "unlimited":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"available: {text!r} is not a whole number or 'unlimited'") from None


def set_provider_available(args: argparse.Namespace) -> int:
    _store(args).set_provider_available(args.instance_type, args.available)
    shown = "unlimited" if args.available is None else args.available
    print(f"provider capacity of {args.instance_type}: {shown} (from the scheduler's next cycle)")
    return 0


def show_alerts(args: argparse.Namespace) -> int:
    store = _store(args)
    alerts, now = store.alerts(), store.clock()
    records = [
        {"at": a.at, "kind": a.kind, "job": a.job, "share": a.share, "reason": a.reason, "position": a.position}
        for a in alerts
    ]
    if args.json:
        _print_json({"alerts": records})
        return 0
    print(
        _table(
            ["at", "kind", "job", "share", "reason"],
            [[clock_time(a.at, now), a.kind, a.job, a.share, a.reason] for a in alerts],
        )
    )
    return 0


def _print_json(document: Any) -> None:
    print(json.dumps(document, ensure_ascii=False))


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    from airflow_quota.sim.report import table

    return table(headers, rows)
