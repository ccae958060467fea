"""``airflow-quota aws-batch plan | apply | import``: a quota configuration onto an AWS Batch
job queue's quota-management objects, and back (docs/aws-batch.md).

- ``plan QUOTA.yaml --job-queue Q`` prints what ``apply`` would change, as ``terraform plan``
  does: exit 0 (changes or none); exit 2 when AWS cannot express a setting of the file (its
  ``!`` lines), as for any input that breaks a rule.
- ``apply`` prints the same plan, then makes its calls; applying twice, the second does nothing.
- ``import --job-queue Q`` prints the job queue's objects as a quota.yaml.

Bad input (the file, the job queue) is ``InvalidInput``, which the command line prints as
every command's (exit 2); AWS refusing a call is ``AwsBatchRefused`` (exit 2, naming the
object and AWS's message); AWS out of reach or throttling after every retry, exit 1.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, redirect_stdout
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from airflow_quota.aws_batch.policy import Change, JobQueueState, Plan, import_yaml, plan, plan_document, plan_text
from airflow_quota.exceptions import InvalidInput, Problem

if TYPE_CHECKING:
    from airflow_quota.hooks.aws_batch import AwsBatchQuotaHook

EXIT_UNAVAILABLE = 1


def add_commands(commands: Any) -> None:
    """Register ``aws-batch`` and its commands on the CLI's subparsers."""
    aws = commands.add_parser(
        "aws-batch",
        help="the quota policy on AWS Batch quota management itself: plan, apply, import",
        description="Translate a quota configuration into an AWS Batch job queue's quota-management objects "
        "(the service environment's capacity, one quota share per share) and back (docs/aws-batch.md).",
    )
    aws_commands = aws.add_subparsers(dest="aws_batch_command", required=True, metavar="COMMAND")
    planning = aws_commands.add_parser(
        "plan",
        help="show what apply would change on the job queue: + create, ~ update, ? left alone, "
        "= kept by airflow-quota only, ! refused (exit 2)",
    )
    planning.add_argument("file", metavar="QUOTA.yaml")
    _queue_options(planning)
    planning.set_defaults(run=_unavailable_is_1(plan_command))
    applying = aws_commands.add_parser("apply", help="show the plan, then make its AWS Batch calls")
    applying.add_argument("file", metavar="QUOTA.yaml")
    _queue_options(applying)
    applying.set_defaults(run=_unavailable_is_1(apply_command))
    importing = aws_commands.add_parser(
        "import", help="print the job queue's quota shares and capacity as a quota.yaml (> quota.yaml)"
    )
    _queue_options(importing, json_option=False)
    importing.set_defaults(run=_unavailable_is_1(import_command))


def _queue_options(parser: argparse.ArgumentParser, json_option: bool = True) -> None:
    parser.add_argument("--job-queue", required=True, metavar="Q", help="the job queue's name or ARN")
    parser.add_argument("--conn-id", default="aws_default", help="the Airflow AWS connection (default %(default)s)")
    parser.add_argument("--region", default=None, help="the AWS region (default: the connection's)")
    if json_option:
        parser.add_argument("--json", action="store_true", help="print one JSON document")


def _unavailable_is_1(run: Callable[[argparse.Namespace, TextIO], int]) -> Callable[[argparse.Namespace], int]:
    """The command, its output on standard output and every log line on standard error; AWS
    out of reach, or throttling after every retry: one line on standard error, exit 1."""

    def wrapped(args: argparse.Namespace) -> int:
        from airflow_quota.hooks.aws_batch import AwsBatchUnavailable

        out = sys.stdout
        try:
            with _logs_on_stderr():
                return run(args, out)
        except AwsBatchUnavailable as exc:
            print(exc, file=sys.stderr)
            return EXIT_UNAVAILABLE

    return wrapped


@contextmanager
def _logs_on_stderr() -> Iterator[None]:
    """Airflow logs on standard output (its root handler, and structlog on whatever
    ``sys.stdout`` is): while the hook runs, both go to standard error, so that
    ``aws-batch import > quota.yaml`` writes the file only."""
    import airflow_quota.hooks.aws_batch  # noqa: F401  (Airflow configures its logging on import)

    moved = [
        handler
        for handler in logging.root.handlers
        if isinstance(handler, logging.StreamHandler) and handler.stream in (sys.stdout, sys.__stdout__)
    ]
    streams = [handler.setStream(sys.stderr) for handler in moved]
    try:
        with redirect_stdout(sys.stderr):
            yield
    finally:
        for handler, stream in zip(moved, streams, strict=True):
            handler.setStream(stream)


def make_hook(args: argparse.Namespace) -> AwsBatchQuotaHook:
    """The hook of ``--conn-id``. As the amazon provider does, a missing ``aws_default`` means
    boto3's own credentials (environment, profile, instance role); any other connection that
    does not exist is refused naming it, rather than calling AWS as someone else."""
    from airflow.sdk.exceptions import AirflowNotFoundException

    from airflow_quota.hooks.aws_batch import AwsBatchQuotaHook

    if args.conn_id and args.conn_id != AwsBatchQuotaHook.default_conn_name:
        try:
            AwsBatchQuotaHook.get_connection(args.conn_id)
        except AirflowNotFoundException:
            raise InvalidInput.single(
                "--conn-id",
                f"no Airflow connection {args.conn_id!r} (AIRFLOW_CONN_{args.conn_id.upper()}, "
                "airflow connections add, or a secrets backend)",
            ) from None
    return AwsBatchQuotaHook(aws_conn_id=args.conn_id or None, region_name=args.region)


def read_queue(hook: AwsBatchQuotaHook, args: argparse.Namespace) -> JobQueueState:
    """The job queue's objects; an unknown queue is bad input naming it."""
    queue = hook.queue_state(args.job_queue)
    if queue is None:
        region = hook.conn.meta.region_name
        raise InvalidInput.single(
            "--job-queue", f"no job queue {args.job_queue!r} in {region} (AWS connection {args.conn_id!r})"
        )
    return queue


def _planned(args: argparse.Namespace) -> tuple[AwsBatchQuotaHook, Plan]:
    """The file read (its problems refused before AWS is called), the queue read, the plan."""
    from airflow_quota.core.config import load_config

    config = load_config(Path(args.file))
    hook = make_hook(args)
    return hook, plan(config, read_queue(hook, args))


def _refuse(the_plan: Plan, file: str) -> None:
    if the_plan.refused:
        count = len(the_plan.refused)
        raise InvalidInput(
            [
                Problem(
                    "",
                    f"AWS Batch cannot express {count} setting{'s' if count > 1 else ''} (the ! lines): "
                    "nothing is applied",
                )
            ],
            file,
        )


def plan_command(args: argparse.Namespace, out: TextIO) -> int:
    _, the_plan = _planned(args)
    if args.json:
        print(json.dumps(plan_document(the_plan), indent=2), file=out)
    else:
        out.write(plan_text(the_plan))
    _refuse(the_plan, args.file)
    return 0


def apply_command(args: argparse.Namespace, out: TextIO) -> int:
    hook, the_plan = _planned(args)
    if not args.json:
        out.write(plan_text(the_plan))
    if the_plan.refused:
        if args.json:
            print(json.dumps({"plan": plan_document(the_plan), "applied": []}, indent=2), file=out)
        _refuse(the_plan, args.file)
    applied: list[dict[str, Any]] = []

    def done(change: Change, answer: Mapping[str, Any]) -> None:
        arn = answer.get("quotaShareArn") or answer.get("serviceEnvironmentArn")
        applied.append({"operation": change.operation, "kind": change.kind, "name": change.name, "arn": arn})
        if not args.json:
            verb = "created" if change.action == "create" else "updated"
            print(f"{verb} {change.kind} {change.name}" + (f" ({arn})" if arn else ""), file=out, flush=True)

    try:
        hook.apply(the_plan, on_done=done)
    finally:
        if args.json:
            print(json.dumps({"plan": plan_document(the_plan), "applied": applied}, indent=2), file=out)
    if not args.json:
        print(
            f"Apply complete: {len(applied)} call{'s' if len(applied) != 1 else ''} made."
            if applied
            else "Nothing to apply.",
            file=out,
        )
    return 0


def import_command(args: argparse.Namespace, out: TextIO) -> int:
    hook = make_hook(args)
    out.write(import_yaml(read_queue(hook, args)))
    return 0
