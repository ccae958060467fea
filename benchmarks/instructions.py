"""The ITP replay's cost per policy in instructions, not seconds: each policy's ``run_policy``
(mapping, simulation, report) on the trace under ``examples/itp-quota.yaml``, run under
valgrind's cachegrind, less a run that only loads the trace.

    python benchmarks/instructions.py                  # whole trace: about 10 minutes on 2 cores
    python benchmarks/instructions.py --jobs 20000     # a prefix: about a minute

Why: on a shared 2-core machine the CPU time of the same replay moves by up to 20% between runs,
more than most changes to the cycle; an instruction count moves by about 0.2% (the hash seed is
fixed, so only memory addresses differ between runs). It is a proxy: it counts no cache miss
nor stall, and the shares replay runs more instructions per second than the open pool's (its
instruction ratio is higher than its time ratio), so the issue's target is still measured in
time (``shares_vs_open.py``); this tells whether a change saved work. Needs valgrind
(Debian: ``apt-get install valgrind``).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

NOTHING = "nothing"
"""The run that loads the trace and runs no policy: what every count has in common."""


def replay(policy_name: str, jobs: int | None) -> None:
    """The measured work, in this process: load, then one policy's replay (or none)."""
    from airflow_quota.core.config import load_config
    from airflow_quota.sim.compare import resolve_policies, run_policy
    from benchmarks.itp_replay import first_jobs

    config = load_config(ROOT / "examples" / "itp-quota.yaml")
    policies = {policy.name: policy for policy in resolve_policies(["shares", "open"], config)}
    trace = first_jobs(jobs)
    if policy_name != NOTHING:
        run_policy(policies[policy_name], trace)


def instructions_of(command: list[str], what: str) -> int:
    """Instructions a child process running ``command`` executes, counted by cachegrind with
    the hash seed fixed (so two runs differ only by memory addresses)."""
    valgrind = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null"]
    run = subprocess.run(
        valgrind + command,
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONHASHSEED": "0"},
        check=False,
    )
    found = re.search(r"I\s+refs:\s+([\d,]+)", run.stderr)
    if run.returncode != 0 or found is None:
        raise SystemExit(f"the {what} run failed:\n{run.stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


def count(policy_name: str, jobs: int | None) -> int:
    """Instructions of a child process replaying one policy under cachegrind."""
    command = [sys.executable, __file__, "--child", policy_name]
    if jobs is not None:
        command += ["--jobs", str(jobs)]
    return instructions_of(command, policy_name)


def need_valgrind() -> None:
    """Exit with status 2 and the package to install when valgrind is missing."""
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (Debian: apt-get install valgrind)", file=sys.stderr)
        raise SystemExit(2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, help="the first N jobs of the trace (default: all)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        replay(args.child, args.jobs)
        return
    need_valgrind()
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=2) as pool:
        shares, open_pool = pool.map(lambda name: count(name, args.jobs), ["shares", "open"])
    common = count(NOTHING, args.jobs)
    shares_net, open_net = shares - common, open_pool - common
    print(f"loading the trace alone: {common / 1e9:.2f} G instructions")
    print(f"shares: {shares_net / 1e9:.2f} G, open: {open_net / 1e9:.2f} G instructions beyond it")
    print(f"shares / open: {shares_net / open_net:.3f}x ({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
