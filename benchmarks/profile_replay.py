"""Where the ITP replay's time goes: the shares policy of ``examples/itp-quota.yaml`` (the model's
defaults) on the trace under cProfile, the top functions by own time and by cumulative time.

    python benchmarks/profile_replay.py            # whole trace, about 100 s under the profiler
    python benchmarks/profile_replay.py 20000      # the first 20,000 jobs
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from airflow_quota.core.config import load_config  # noqa: E402
from airflow_quota.sim.compare import resolve_policies, run_policy  # noqa: E402
from benchmarks.itp_replay import first_jobs  # noqa: E402


def main() -> None:
    jobs = int(sys.argv[1]) if len(sys.argv) > 1 else None
    (shares,) = resolve_policies(["shares"], load_config(ROOT / "examples" / "itp-quota.yaml"))
    trace = first_jobs(jobs)
    profile = cProfile.Profile()
    profile.enable()
    run_policy(shares, trace)
    profile.disable()
    for order, lines in (("tottime", 18), ("cumulative", 25)):
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats(order).print_stats(lines)
        print(out.getvalue())


if __name__ == "__main__":
    main()
