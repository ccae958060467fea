"""The synthetic workloads under quota model v1 and under this checkout: mean and p99 wait,
preemptions and alerts, for issue 13's "no worse than v1" target.

    git worktree add /tmp/v1 e9399f3         # the last commit before model v2
    python benchmarks/synthetic_vs_v1.py --v1 /tmp/v1
    python benchmarks/synthetic_vs_v1.py --only full-load --set preemption_protection_seconds=3600
    python benchmarks/synthetic_vs_v1.py --only full-load --set preemption_protection_seconds=3600 \
        --what-if in-share-protection
    python benchmarks/synthetic_vs_v1.py --only full-load --set in_share_preemption_after_seconds=0

Workloads: ``benchmarks/workload.py``'s 20,000-job full load, and ``gen_congested.py 2000 SEED``
for seeds 1-3 (``../shared/tools``). Each runs through ``airflow-quota simulate --json`` in a
subprocess whose ``PYTHONPATH`` is the checkout's root, so the same workload file meets each
model's own code. ``--set FIELD=VALUE`` changes a field on every share of every workload (this
checkout only). One JSON line per run on stdout; the files go to ``benchmarks/results/``.

``--what-if in-share-protection`` (this checkout only; a diagnostic, not an option of the model):
``preemption_protection_seconds`` protects a job from in-share preemption only, never from a
reclaim by a lender (the simulation runs in a child process that patches the core). The guarantee
watchdog still excuses a job waiting for a protected reclaim victim, so its GUARANTEE_VIOLATED
count may read low under this switch; the decisions do not depend on it.

The wait before in-share preemption (``in_share_preemption_after_seconds``, default 600 s) is a
field like any other: ``--set in_share_preemption_after_seconds=0`` runs quota-model v2's
preemption at once (the diagnostic ``--what-if in-share-patience`` of the tenth session became
this field).
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

from benchmarks import workload  # noqa: E402
from benchmarks.section8_whatif import parse_sets  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
GENERATOR = ROOT.parent / "shared" / "tools" / "gen_congested.py"


def workloads(only: str | None) -> dict[str, dict[str, Any]]:
    """Name → scenario document."""
    RESULTS.mkdir(exist_ok=True)
    found: dict[str, dict[str, Any]] = {}
    if only in (None, "full-load"):
        found["full-load-20k"] = workload.scenario(20000)
    if only in (None, "congested"):
        for seed in (1, 2, 3):
            out = RESULTS / f"congested-2000-{seed}.yaml"
            subprocess.run([sys.executable, str(GENERATOR), "2000", str(seed), str(out)], check=True)
            found[f"congested-2000-seed{seed}"] = yaml.safe_load(out.read_text())
    return found


def in_share_protection_only() -> None:
    """Patch this process's core: a victim of the preemptor's own share (in-share) is protected
    as quota-model.md 4 says; a victim of another share (a reclaim) never is."""
    from airflow_quota.core import phases, preempt

    protected, find_victims = preempt._protected, preempt.find_victims
    preemptor_share: list[str] = [""]

    def _protected(state: Any, victim: Any, now: float) -> bool:
        return victim.share == preemptor_share[0] and protected(state, victim, now)

    def _find_victims(state: Any, job: Any, entry: Any, now: float) -> Any:
        preemptor_share[0] = job.share
        return find_victims(state, job, entry, now)

    preempt._protected = _protected
    phases.find_victims = _find_victims  # type: ignore[attr-defined]


def run(root: Path, path: Path, what_if: str | None = None) -> dict[str, Any]:
    """``simulate --json`` of the scenario file with the model at ``root``."""
    env = dict(os.environ, PYTHONPATH=str(root))
    command = [sys.executable, "-m", "airflow_quota.cli"]
    if what_if:
        command = [sys.executable, __file__, "--child", what_if]
    done = subprocess.run(
        [*command, "simulate", str(path), "--json"],
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
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")
    parser.add_argument("--what-if", help="a rule changed, this checkout only: in-share-protection")
    args, rest = parser.parse_known_args()
    if args.child:
        if args.child == "in-share-protection":
            in_share_protection_only()
        else:
            raise SystemExit(f"--what-if: unknown rule {args.child!r}")
        from airflow_quota.cli import main as cli

        raise SystemExit(cli(rest))
    fields = parse_sets(args.set)
    models = [("v1", args.v1)] if args.v1 else []
    models.append(("this checkout", ROOT))
    for name, document in workloads(args.only).items():
        for label, root in models:
            changed = json.loads(json.dumps(document))
            if root == ROOT:
                for share in changed["quota"]["shares"]:
                    share.update(fields)
            path = RESULTS / f"{name}-{label.replace(' ', '-')}.json"
            path.write_text(json.dumps(changed))
            row = {"workload": name, "model": label, **({"set": args.set} if root == ROOT and args.set else {})}
            what_if = args.what_if if root == ROOT else None
            if what_if:
                row["what_if"] = what_if
            in_share = {share["name"] for share in changed["quota"]["shares"] if share.get("in_share_preemption")}
            print(json.dumps({**row, **figures(run(root.resolve(), path, what_if), in_share)}), flush=True)


if __name__ == "__main__":
    main()
