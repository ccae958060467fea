"""Proof that a change to the core decides nothing differently: the sha256 of
``airflow-quota simulate --json`` on the whole ITP trace, on ``benchmarks/workload.py``'s 20k full
load and on every scenario of ``tests/scenarios`` and ``examples/`` (the files with events).

    python benchmarks/same_decisions.py > before.txt      # on the commit before the change
    python benchmarks/same_decisions.py > after.txt       # with the change
    diff before.txt after.txt                             # no output: byte-identical

    python benchmarks/same_decisions.py --quick           # scenarios only (seconds, not minutes)

Each case runs in its own process, as a user runs it; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import workload  # noqa: E402

TRACE = ROOT / "data" / "traces" / "itp-2021"


def is_scenario(path: Path) -> bool:
    """A YAML file of ``examples/`` that is a scenario (it has events), not a quota file."""
    import yaml

    document = yaml.safe_load(path.read_text())
    return isinstance(document, dict) and "events" in document


def digest(arguments: list[str]) -> str:
    """The sha256 of ``simulate --json``'s output for these arguments."""
    run = subprocess.run(
        [sys.executable, "-m", "airflow_quota.cli", "simulate", *arguments, "--json"],
        capture_output=True,
        check=False,
        cwd=ROOT,
    )
    if run.returncode != 0:
        raise SystemExit(f"simulate {' '.join(arguments)} failed ({run.returncode}): {run.stderr.decode()[-2000:]}")
    return hashlib.sha256(run.stdout).hexdigest()


def cases(quick: bool, scratch: Path) -> list[tuple[str, list[str]]]:
    """(label, simulate arguments) for every case, scenarios first."""
    ours = sorted((ROOT / "tests" / "scenarios").glob("*.yaml"))
    ours += [path for path in sorted((ROOT / "examples").glob("*.yaml")) if is_scenario(path)]
    listed = [(str(path.relative_to(ROOT)), [str(path)]) for path in ours]
    if quick:
        return listed
    full_load = scratch / "full-load-20k.json"
    full_load.write_text(json.dumps(workload.scenario(20_000)))
    return [
        *listed,
        ("benchmarks/workload.py 20k full load", [str(full_load)]),
        (
            "ITP whole trace, examples/itp-quota.yaml",
            ["--trace", f"itp:{TRACE}", "--quota", str(ROOT / "examples" / "itp-quota.yaml")],
        ),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the scenarios only")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        for label, arguments in cases(args.quick, Path(scratch)):
            started = time.perf_counter()
            print(f"{digest(arguments)}  {label}", flush=True)
            print(f"  {label}: {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
