"""Seeded congested workloads: N jobs over 6 shares x 2 instance types in a pool of 18 each, so
that queues, borrowing, reclaim, in-share preemption, overtaking, starvation and reservations all
happen (``workload.py``'s large pool rarely congests). The property tests, the equivalence test
and ``synthetic_vs_v1.py`` use them; the same ``(jobs, seed)`` gives the same scenario text.

usage: python -m benchmarks.congested N SEED OUT.yaml
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

TYPES = ["ml.g5.xlarge", "ml.p4d.24xlarge"]
LIMITS = [2, 3, 4, 2, 3, 2]
"""Each share's limit on both types: 16 of the 18 instances of each type, 2 left unassigned."""
STRATEGIES = ["LEND_AND_BORROW", "LEND_AND_BORROW", "LEND", "RESERVE", "LEND_AND_BORROW", "LEND_AND_BORROW"]
CAPPED = 4
"""The share with a borrow limit of 100% and 300 s of preemption protection."""


def _share_line(index: int, limit: int, strategy: str, extra_settings: str) -> str:
    settings = ", in_share_preemption: true" if index % 2 == 0 else ""
    settings += ", starvation_after_seconds: 1800, preempted_alert_after: 2"
    if index == CAPPED:
        settings += ", borrow_limit: 100, preemption_protection_seconds: 300"
    settings += extra_settings
    limits = ", ".join(f"{name}: {limit}" for name in TYPES)
    return f"    - {{name: s{index}, capacity_limits: {{{limits}}}, strategy: {strategy}{settings}}}"


def scenario(jobs: int, seed: int, reservations: bool = False) -> str:
    """The scenario's YAML text. ``reservations`` switches section 8's reservations on in every
    share (``starvation_reservation: true``, ``in_share_preemption_after_seconds: 0``)."""
    rng = random.Random(seed)
    extra = ", starvation_reservation: true, in_share_preemption_after_seconds: 0" if reservations else ""
    lines = ["quota:", "  pool:", "    capacity: {" + ", ".join(f"{name}: 18" for name in TYPES) + "}", "  shares:"]
    lines += [_share_line(i, lim, st, extra) for i, (lim, st) in enumerate(zip(LIMITS, STRATEGIES, strict=True))]
    lines.append("events:")
    at = 0
    names: list[str] = []
    for j in range(jobs):
        at += rng.choice([0, 0, 10, 30, 60, 120, 240])
        share = rng.randrange(6)
        strategy, limit = STRATEGIES[share], LIMITS[share]
        # larger than the share's limit: only borrowing can serve it
        big = strategy == "LEND_AND_BORROW" and share != CAPPED and rng.random() < 0.15
        kinds = rng.choice([1, 1, 2])
        preferred = rng.sample(TYPES, kinds)
        counts = [rng.choice([limit + 1, limit + 3]) if big else rng.choice([1, 1, 2, limit]) for _ in preferred]
        if share == CAPPED:
            counts = [min(c, 2 * limit) for c in counts]
        entries = ", ".join(f"{{instance_type: {p}, count: {c}}}" for p, c in zip(preferred, counts, strict=True))
        duration = rng.choice([300, 600, 1200, 2400, 4800])
        interval = rng.choice([0, 300])
        checkpoint = f", checkpoint_interval: {interval}" if interval else ""
        name = f"j{j}"
        names.append(name)
        lines.append(
            f"  - {{at: {at}, submit: {{name: {name}, share: s{share}, priority: {rng.randint(0, 9)}, "
            f"duration: {duration}{checkpoint}, preferences: [{entries}]}}}}"
        )
        if j > 5 and rng.random() < 0.05:
            job, priority = rng.choice(names[:-1]), rng.randint(0, 9)
            lines.append(f"  - {{at: {at}, set_priority: {{job: {job}, priority: {priority}}}}}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__.splitlines()[-1])
    Path(sys.argv[3]).write_text(scenario(int(sys.argv[1]), int(sys.argv[2])))
