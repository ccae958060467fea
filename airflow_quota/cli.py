"""The ``airflow-quota`` command line.

Bad input prints every problem as ``path: message`` on standard error and exits with status 2,
never with a traceback.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from airflow_quota.core.explain import describe
from airflow_quota.exceptions import DatabaseUnavailable, InvalidInput, Refused

if TYPE_CHECKING:
    from airflow_quota.core.model import Decision
    from airflow_quota.sim.scenario import LoadedScenario

EXIT_INVALID = 2
EXIT_UNAVAILABLE = 1


def _validate(args: argparse.Namespace) -> int:
    from airflow_quota.core.config import load_config, read_yaml
    from airflow_quota.core.summary import config_summary

    path = Path(args.file)
    raw = read_yaml(path)
    if isinstance(raw, dict) and "events" in raw and ("quota" in raw or "quota_file" in raw):
        from airflow_quota.sim.scenario import parse_scenario

        scenario = parse_scenario(raw, path.parent)
        print(f"{path}: a valid scenario with {len(scenario.events)} events")
        print(config_summary(scenario.config))
        return 0
    config = load_config(path)
    print(f"{path}: valid")
    print(config_summary(config))
    return 0


def _simulate(args: argparse.Namespace) -> int:
    from airflow_quota.sim.report import build_report, to_json, to_text
    from airflow_quota.sim.scenario import load_scenario
    from airflow_quota.sim.simulator import Simulator

    if args.until is not None and args.until < 0:
        raise InvalidInput.single("--until", f"{args.until:g} must be ≥ 0")
    scenario = load_scenario(Path(args.scenario))
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="airflow-quota",
        description="Quota shares, borrowing and preemption for GPU training from Apache Airflow.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    validate = commands.add_parser("validate", help="check a quota.yaml (or a scenario) and summarise it")
    validate.add_argument("file", help="quota.yaml, or a scenario file")
    validate.set_defaults(run=_validate)

    simulate = commands.add_parser("simulate", help="replay a scenario through the quota scheduler")
    simulate.add_argument("scenario", help="scenario YAML (see spec/simulate.md)")
    simulate.add_argument("--json", action="store_true", help="print one JSON document")
    simulate.add_argument("--until", type=float, default=None, metavar="SECONDS", help="stop the run at this time")
    simulate.add_argument("--log", action="store_true", help="log every decision with its reason on stderr")
    simulate.add_argument("--progress", action="store_true", help="show progress on stderr (default on a terminal)")
    simulate.set_defaults(run=_simulate)

    from airflow_quota.admin import add_commands

    add_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.run(args)
    except InvalidInput as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
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
