"""The synthetic workloads under quota model v1 and under this checkout: mean and p99 wait,
preemptions and alerts, for issue 13's "no worse than v1" target.

    git worktree add /tmp/v1 e9399f3         # the last commit before model v2
    python benchmarks/synthetic_vs_v1.py --v1 /tmp/v1
    python benchmarks/synthetic_vs_v1.py --only full-load --set preemption_protection_seconds=3600
    python benchmarks/synthetic_vs_v1.py --only full-load --set in_share_preemption_after_seconds=0
    python benchmarks/synthetic_vs_v1.py --only congested --jobs 200      # a quick look

Workloads: ``benchmarks/workload.py``'s 20,000-job full load, and ``benchmarks/congested.py``'s
congested workload of 2,000 jobs for seeds 1-3. Each runs through ``airflow-quota simulate
--json`` in a subprocess whose ``PYTHONPATH`` is the checkout's root, so the same workload file
meets each model's own code. ``--set FIELD=VALUE`` changes a field on every share of every
workload (this checkout only; VALUE is read as a YAML scalar): ``--set
in_share_preemption_after_seconds=0`` runs quota-model v2's in-share preemption at once. One
JSON line per run on stdout; the files go to ``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import congested, workload  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def parse_sets(items: list[str]) -> dict[str, Any]:
    """``FIELD=VALUE`` pairs, each VALUE a YAML scalar (``86400``, ``true``, ``LEND``)."""
    fields: dict[str, Any] = {}
    for item in items:
        field, sep, text = item.partition("=")
        if not sep or not field.strip():
            raise SystemExit(f"--set {item!r}: must be FIELD=VALUE (e.g. starvation_after_seconds=86400)")
        value = yaml.safe_load(text)
        if isinstance(value, dict | list):
            raise SystemExit(f"--set {item!r}: the value must be a scalar")
        fields[field.strip()] = value
    return fields


def workloads(only: str | None, full_load_jobs: int, congested_jobs: int) -> dict[str, dict[str, Any]]:
    """Name → scenario document."""
    found: dict[str, dict[str, Any]] = {}
    if only in (None, "full-load"):
        found[f"full-load-{full_load_jobs}"] = workload.scenario(full_load_jobs)
    if only in (None, "congested"):
        for seed in (1, 2, 3):
            found[f"congested-{congested_jobs}-seed{seed}"] = yaml.safe_load(congested.scenario(congested_jobs, seed))
    return found


def run(root: Path, path: Path) -> dict[str, Any]:
    """``simulate --json`` of the scenario file with the model at ``root``."""
    env = dict(os.environ, PYTHONPATH=str(root))
    done = subprocess.run(
        [sys.executable, "-m", "airflow_quota.cli", "simulate", str(path), "--json"],
        capture_output=True,
        text=True,
        cwd=root,
        env=env,
    )
    if done.returncode not in (0, 1):
        raise SystemExit(f"{root}: simulate {path} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def figures(report: dict[str, Any], in_share: set[str]) -> dict[str, Any]:
    """The run's waits, preemptions and alerts; ``in_share``: the shares with in-share
    preemption, whose mean wait by priority shows what that preemption buys."""
    waits = sorted(float(j["wait_seconds"]) for j in report["jobs"].values())
    by_priority: dict[int, list[float]] = {}
    for job in report["jobs"].values():
        if job["share"] in in_share:
            by_priority.setdefault(job["priority"], []).append(float(job["wait_seconds"]))
    alerts: dict[str, int] = {}
    for alert in report["alerts"]:
        alerts[alert["kind"]] = alerts.get(alert["kind"], 0) + 1
    return {
        "jobs": len(waits),
        "mean_wait_s": round(sum(waits) / len(waits), 1),
        "p99_wait_s": waits[max(0, -(-99 * len(waits) // 100) - 1)],
        "max_wait_s": waits[-1],
        "preemptions": sum(1 for e in report["events"] if e["type"] == "PREEMPTED"),
        "alerts": alerts,
        "gpu_hours": report["pool"]["gpu_hours"],
        "end_s": report["pool"]["end"],
        "in_share_mean_wait_by_priority": {
            p: round(sum(w) / len(w), 1) for p, w in sorted(by_priority.items(), reverse=True)
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--v1", type=Path, help="a checkout of model v1 (e.g. a worktree of e9399f3)")
    parser.add_argument("--only", choices=["full-load", "congested"])
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")
    parser.add_argument("--jobs", type=int, metavar="N", help="N jobs in every workload (default 20,000 and 2,000)")
    args = parser.parse_args()
    fields = parse_sets(args.set)
    models = [("v1", args.v1)] if args.v1 else []
    models.append(("this checkout", ROOT))
    RESULTS.mkdir(exist_ok=True)
    found = workloads(args.only, args.jobs or 20_000, args.jobs or 2_000)
    for name, document in found.items():
        for label, root in models:
            changed = json.loads(json.dumps(document))
            if root == ROOT:
                for share in changed["quota"]["shares"]:
                    share.update(fields)
            path = RESULTS / f"{name}-{label.replace(' ', '-')}.json"
            path.write_text(json.dumps(changed))
            row = {"workload": name, "model": label, **({"set": args.set} if root == ROOT and args.set else {})}
            in_share = {share["name"] for share in changed["quota"]["shares"] if share.get("in_share_preemption")}
            print(json.dumps({**row, **figures(run(root.resolve(), path), in_share)}), flush=True)


if __name__ == "__main__":
    main()
