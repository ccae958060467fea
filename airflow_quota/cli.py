"""The ``airflow-quota`` command line.

Bad input prints every problem as ``path: message`` on standard error and exits with status 2,
never with a traceback. The problems of an input file come under the file's name, once:
``FILE: message`` for the file as a whole, else a ``FILE:`` line and the problems indented.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_quota.core.explain import describe
from airflow_quota.exceptions import DatabaseUnavailable, InvalidInput, Problem, Refused
from airflow_quota.sim.gc_tuning import fewer_collections

if TYPE_CHECKING:
    from airflow_quota.core.model import Decision
    from airflow_quota.sim.compare import PolicyRun
    from airflow_quota.sim.scenario import LoadedScenario
    from airflow_quota.sim.traces import Trace

EXIT_INVALID = 2
EXIT_UNAVAILABLE = 1


def _validate(args: argparse.Namespace) -> int:
    from airflow_quota.admin import warn
    from airflow_quota.core.config import QUOTA_SECTIONS, load_file
    from airflow_quota.sim.scenario import SCENARIO_KEYS

    path = Path(args.file)
    lines, warnings = load_file(path, f"{QUOTA_SECTIONS} or of {SCENARIO_KEYS}", lambda raw: _validated(raw, path))
    warn(warnings, str(path))
    for text in lines:
        print(text)
    return 0


def _validated(raw: dict[str, Any], path: Path) -> tuple[list[str], list[Problem]]:
    """What ``validate`` prints of a valid scenario (it has events) or quota configuration,
    and its warnings (notifiers that cannot be imported here)."""
    from airflow_quota.core.config import parse_config
    from airflow_quota.core.summary import config_summary

    if "events" in raw and ("quota" in raw or "quota_file" in raw):
        from airflow_quota.sim.scenario import parse_scenario

        scenario = parse_scenario(raw, path.parent)
        return [f"{path}: a valid scenario with {len(scenario.events)} events", config_summary(scenario.config)], []
    config = parse_config(raw)
    warnings: list[Problem] = []
    if config.alerts.notifiers:
        from airflow_quota.notifications.loader import check_notifiers

        warnings = check_notifiers(config)
    return [f"{path}: valid", config_summary(config)], warnings


@fewer_collections()
def _simulate(args: argparse.Namespace) -> int:
    from airflow_quota.sim.report import build_report, to_json, to_text
    from airflow_quota.sim.simulator import Simulator

    if args.until is not None and not args.until >= 0:  # NaN too
        raise InvalidInput.single("--until", f"{args.until:g} must be ≥ 0")
    scenario = _load_simulation(args)
    show_progress = args.progress or (sys.stderr.isatty() and not args.log)
    simulator = Simulator(scenario, until=args.until, progress=_progress_printer(scenario) if show_progress else None)
    if args.log:
        simulator.on_decision = _log_decision
    result = simulator.run()
    if show_progress:
        print(file=sys.stderr)
    report = build_report(result)
    sys.stdout.write(to_json(report) if args.json else to_text(report))
    return 0


def _load_simulation(args: argparse.Namespace) -> LoadedScenario:
    """A scenario file, or a trace (``--trace FORMAT:PATH``) replayed on ``--quota``."""
    from airflow_quota.sim.scenario import load_scenario

    if args.trace is None:
        for flag in ("quota", "columns", "checkpoint_interval"):
            if getattr(args, flag) is not None:
                raise InvalidInput.single(f"--{flag.replace('_', '-')}", "only goes with --trace")
        if args.scenario is None:
            raise InvalidInput.single("simulate", "give a scenario file, or --trace FORMAT:PATH with --quota")
        return load_scenario(Path(args.scenario))
    if args.scenario is not None:
        raise InvalidInput.single("simulate", "give a scenario file or --trace, not both")
    from airflow_quota.core.config import load_config
    from airflow_quota.sim.traces import trace_scenario

    trace = _read_trace(args)
    config = load_config(Path(args.quota))
    jobs = trace_scenario(trace, config, skip_bad_rows=args.skip_bad_rows, checkpoint_interval=args.checkpoint_interval)
    _report_skipped(jobs.skipped)
    return jobs.scenario


def _read_trace(args: argparse.Namespace) -> Trace:
    """The trace of ``--trace`` (with ``--columns``), after checking the flags that go with it."""
    from airflow_quota.sim.traces import parse_columns, parse_spec, read_trace

    if parse_spec(args.trace)[0] == "itp" and args.columns is not None:
        raise InvalidInput.single("--columns", "the itp format has fixed columns; --columns is for csv")
    if args.quota is None:
        raise InvalidInput.single("--quota", "--trace needs the quota configuration to replay it on")
    if args.checkpoint_interval is not None and not args.checkpoint_interval > 0:
        raise InvalidInput.single("--checkpoint-interval", f"{args.checkpoint_interval:g} must be > 0 seconds")
    columns = parse_columns(args.columns) if args.columns is not None else None
    return read_trace(args.trace, columns)


def _report_skipped(skipped: list[Problem]) -> None:
    """Rows left out under --skip-bad-rows, on standard error (the first ones, then a count)."""
    from airflow_quota.sim.traces import listed

    if not skipped:
        return
    print(f"skipped {len(skipped):,} bad rows (--skip-bad-rows):", file=sys.stderr)
    for problem in listed(skipped):
        print(f"  {problem}", file=sys.stderr)


def _compare(args: argparse.Namespace) -> int:
    from airflow_quota.core.config import load_config
    from airflow_quota.sim.compare import (
        DEFAULT_POLICIES,
        compare,
        comparison_document,
        resolve_policies,
        what_if_changes,
        what_if_policy,
    )
    from airflow_quota.sim.report import to_json

    if args.until is not None and not args.until >= 0:  # NaN too
        raise InvalidInput.single("--until", f"{args.until:g} must be ≥ 0")
    changes = what_if_changes(args.what_if) if args.what_if else None
    trace = _read_trace(args)
    config = load_config(Path(args.quota))
    policies = resolve_policies(args.policy or list(DEFAULT_POLICIES), config)
    if changes is not None:
        what_if = what_if_policy(config, changes)
        if any(policy.name == what_if.name for policy in policies):
            raise InvalidInput.single("--policy", f"a policy named {what_if.name!r} is already compared")
        policies.append(what_if)
    _prepare_outputs(args.report, args.plots)
    ticker = args.progress or sys.stderr.isatty()
    printer = _CompareProgress(len(policies), ticker)
    runs = compare(
        trace,
        policies,
        skip_bad_rows=args.skip_bad_rows,
        checkpoint_interval=args.checkpoint_interval,
        until=args.until,
        progress=printer.tick if ticker else None,
        on_done=printer.done,
    )
    if runs:
        _report_skipped(runs[0].skipped)
    document = comparison_document(trace, runs)
    if args.report is not None or args.plots is not None:
        _write_report(document, args.report, args.plots)
    if args.json:
        sys.stdout.write(to_json(document))
    else:
        from airflow_quota.sim.html_report import to_text

        sys.stdout.write(to_text(document))
    return 0


def _forecast_accuracy(args: argparse.Namespace) -> int:
    from airflow_quota.core.config import load_config
    from airflow_quota.sim.forecast import RUNS
    from airflow_quota.sim.forecast_accuracy import measure, summary, summary_text
    from airflow_quota.sim.traces import trace_scenario

    if args.every < 1:
        raise InvalidInput.single("--every", f"{args.every} must be ≥ 1")
    if args.runs is not None and args.runs < 1:
        raise InvalidInput.single("--runs", f"{args.runs} must be ≥ 1")
    trace = _read_trace(args)
    config = load_config(Path(args.quota))
    jobs = trace_scenario(trace, config, skip_bad_rows=args.skip_bad_rows, checkpoint_interval=args.checkpoint_interval)
    _report_skipped(jobs.skipped)
    show_progress = args.progress or sys.stderr.isatty()

    def progress(forecast: int, submitted: int) -> None:
        print(f"\r{submitted:,} jobs submitted, {forecast:,} forecast", end="", file=sys.stderr, flush=True)

    predictions = measure(
        jobs.scenario,
        every=args.every,
        runs=RUNS if args.runs is None else args.runs,
        progress=progress if show_progress else None,
    )
    if show_progress:
        print(file=sys.stderr)
    document = summary(predictions)
    sys.stdout.write(json.dumps(document, indent=2) + "\n" if args.json else summary_text(document))
    return 0


def _prepare_outputs(report: str | None, plots: str | None) -> None:
    """Make the report's and the plots' folders before a long run, not after it."""
    for flag, folder in (("--report", Path(report).parent if report else None), ("--plots", plots)):
        if folder is None:
            continue
        try:
            Path(folder).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InvalidInput.single(flag, f"cannot create the folder {folder}: {exc.strerror}") from None


def _write_report(document: dict[str, Any], report: str | None, plots: str | None) -> None:
    """The HTML report (and its figures as JSON next to it), and/or the PNG files of the figures."""
    from airflow_quota.sim.html_report import to_html
    from airflow_quota.sim.plots import render
    from airflow_quota.sim.report import to_json

    images = render(document)
    try:
        if plots is not None:
            folder = Path(plots)
            for name, data in images.items():
                (folder / f"{name}.png").write_bytes(data)
            print(f"wrote {len(images)} figures to {folder}/", file=sys.stderr)
        if report is not None:
            path = Path(report)
            path.write_text(to_html(document, images), encoding="utf-8")
            path.with_suffix(".json").write_text(to_json(document), encoding="utf-8")
            print(f"wrote {path} and {path.with_suffix('.json')}", file=sys.stderr)
    except OSError as exc:
        raise InvalidInput.single(str(exc.filename), f"cannot write the file: {exc.strerror}") from None


class _CompareProgress:
    """On standard error: a line per policy when it is done, and with ``ticker`` a line that
    updates every second while it runs."""

    def __init__(self, policies: int, ticker: bool) -> None:
        self.policies = policies
        self.index = 1
        self.ticker = ticker
        self.started = time.monotonic()
        self.last = 0.0

    def tick(self, policy: str, now: float, finished: int, total: int) -> None:
        if time.monotonic() - self.last < 1:
            return
        self.last = time.monotonic()
        print(
            f"\r[{self.index}/{self.policies}] {policy}: simulated day {now / 86400:,.1f}, "
            f"{finished:,} of {total:,} jobs finished, {time.monotonic() - self.started:,.0f} s",
            end="",
            file=sys.stderr,
            flush=True,
        )

    def done(self, run: PolicyRun) -> None:
        end = "\n" if not self.ticker else "\x1b[K\n"
        prefix = "\r" if self.ticker else ""
        print(
            f"{prefix}[{self.index}/{self.policies}] {run.policy.name}: {run.pool['jobs']:,} jobs replayed in "
            f"{run.wall_seconds:,.1f} s",
            end=end,
            file=sys.stderr,
            flush=True,
        )
        self.index += 1
        self.started = time.monotonic()


def _log_decision(decision: Decision) -> None:
    print(describe(decision), file=sys.stderr)


def _progress_printer(scenario: LoadedScenario) -> Callable[[float, int, int], None]:
    """Every two seconds of wall time: how far the simulated clock and the jobs have come."""
    total = sum(1 for e in scenario.events if e.submit is not None)
    last = [time.monotonic()]

    def show(now: float, cycles: int, finished: int) -> None:
        if time.monotonic() - last[0] < 2:
            return
        last[0] = time.monotonic()
        print(
            f"\rsimulated t={now:,.0f} s, {cycles:,} cycles, {finished:,} of {total:,} jobs finished",
            end="",
            file=sys.stderr,
            flush=True,
        )

    return show


def _trace_arguments(parser: argparse.ArgumentParser, required: bool) -> None:
    parser.add_argument(
        "--trace",
        required=required,
        metavar="FORMAT:PATH",
        help="a job trace: itp:DIR_OR_CSV (Microsoft ITP, a share per cluster file) or csv:FILE_OR_DIR with --columns",
    )
    parser.add_argument("--quota", required=required, metavar="QUOTA.yaml", help="the quota configuration to replay on")
    parser.add_argument(
        "--columns",
        metavar="MAPPING",
        help="csv format: field=column pairs, e.g. submit=t,duration=secs,gpus=n,tenant=team[,priority=p]"
        "[,instance_type=type][,name=id]; or @mapping.yaml",
    )
    parser.add_argument(
        "--skip-bad-rows",
        action="store_true",
        help="skip (and list) trace rows that cannot be read or mapped, instead of refusing the trace",
    )
    parser.add_argument(
        "--checkpoint-interval",
        type=float,
        metavar="SECONDS",
        help="every trace job checkpoints after this much work (default: none, a preempted job restarts)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="airflow-quota",
        description="Quota shares, borrowing and preemption for GPU training from Apache Airflow.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    validate = commands.add_parser("validate", help="check a quota.yaml (or a scenario) and summarise it")
    validate.add_argument("file", help="quota.yaml, or a scenario file")
    validate.set_defaults(run=_validate)

    simulate = commands.add_parser(
        "simulate",
        help="replay a scenario, or a cluster trace, through the quota scheduler",
        description="Replay a scenario file, or a job trace (--trace FORMAT:PATH) on a quota file (--quota).",
    )
    simulate.add_argument("scenario", nargs="?", help="scenario YAML (see docs/simulate.md); or use --trace")
    simulate.add_argument("--json", action="store_true", help="print one JSON document")
    simulate.add_argument("--until", type=float, default=None, metavar="SECONDS", help="stop the run at this time")
    simulate.add_argument("--log", action="store_true", help="log every decision with its reason on stderr")
    simulate.add_argument("--progress", action="store_true", help="show progress on stderr (default on a terminal)")
    _trace_arguments(simulate, required=False)
    simulate.set_defaults(run=_simulate)

    compare = commands.add_parser(
        "compare",
        help="replay one trace under several quota policies and compare them",
        description="Replay one job trace under several policies: shares (the quota file as given), static "
        "(every share RESERVE at the same limits), open (one FIFO pool, no quotas) or the path of another "
        "quota file; --what-if adds the quota file with share fields changed. Prints a summary, or the JSON "
        "document with --json; --report writes an HTML report.",
    )
    _trace_arguments(compare, required=True)
    compare.add_argument(
        "--policy",
        action="append",
        metavar="POLICY",
        help="shares, static, open or a quota file; repeat to compare several (default: shares, static, open)",
    )
    compare.add_argument(
        "--what-if",
        action="append",
        metavar="FIELD=VALUE",
        help="also replay the quota file with this share field set on every share, as the policy 'what-if' "
        "(repeat for several fields), e.g. starvation_after_seconds=86400",
    )
    compare.add_argument("--json", action="store_true", help="print the comparison as one JSON document")
    compare.add_argument("--report", metavar="OUT.html", help="write a self-contained HTML report (and OUT.json)")
    compare.add_argument("--plots", metavar="DIR", help="write each figure of the report as a PNG file in DIR")
    compare.add_argument("--until", type=float, default=None, metavar="SECONDS", help="stop every run at this time")
    compare.add_argument("--progress", action="store_true", help="update progress every second (default on a terminal)")
    compare.set_defaults(run=_compare)

    accuracy = commands.add_parser(
        "forecast-accuracy",
        help="replay a trace, forecast each job's start at its submission, and compare with its start",
        description="Replay a job trace on a quota file; at each submission, forecast the job's start from what "
        "was known then (the state, the runtimes of jobs finished by then), and compare with the start the "
        "replay gave it, beside two naive predictors: errors by wait bucket, the share started within the "
        "band, the share inside the 10-90%% range (docs/forecast.md).",
    )
    _trace_arguments(accuracy, required=True)
    accuracy.add_argument("--every", type=int, default=1, metavar="N", help="forecast every Nth submission (default 1)")
    accuracy.add_argument("--runs", type=int, metavar="N", help="forward runs a forecast (default: the scheduler's, 3)")
    accuracy.add_argument("--json", action="store_true", help="print one JSON document")
    accuracy.add_argument("--progress", action="store_true", help="show progress on stderr (default on a terminal)")
    accuracy.set_defaults(run=_forecast_accuracy)

    from airflow_quota.admin import add_commands
    from airflow_quota.aws_batch.commands import add_commands as add_aws_batch_commands

    add_commands(commands)
    add_aws_batch_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.run(args)
    except InvalidInput as exc:
        for line in exc.lines():
            print(line, file=sys.stderr)
        return EXIT_INVALID
    except Refused as exc:
        print(exc, file=sys.stderr)
        return EXIT_INVALID
    except DatabaseUnavailable as exc:
        print(exc, file=sys.stderr)
        return EXIT_UNAVAILABLE
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
