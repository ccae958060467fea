"""Where the ITP replay's time goes: the shares policy at the model's defaults under cProfile,
the top functions by own time and by cumulative time (issue 15).

    python benchmarks/profile_replay.py            # whole trace, about 100 s under the profiler
    python benchmarks/profile_replay.py 20000      # the first 20,000 jobs
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import section8_whatif as whatif


def main() -> None:
    jobs = int(sys.argv[1]) if len(sys.argv) > 1 else None
    config = whatif.quota({})
    trace = whatif.first_jobs(jobs)
    profile = cProfile.Profile()
    profile.enable()
    whatif.replay(config, trace, "shares")
    profile.disable()
    for order, lines in (("tottime", 18), ("cumulative", 25)):
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats(order).print_stats(lines)
        print(out.getvalue())


if __name__ == "__main__":
    main()
