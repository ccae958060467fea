"""Synthetic full-load workloads for the benchmarks: 20 shares × 5 GPU instance types, jobs of
1–4 instances with 1–3 preferences, about as much demand as capacity. Seeded: the same
arguments give the same workload."""

from __future__ import annotations

import random
from typing import Any

TYPES = ["ml.g5.xlarge", "ml.g5.12xlarge", "ml.g6.xlarge", "ml.p4d.24xlarge", "ml.p5.48xlarge"]
STRATEGIES = ["LEND_AND_BORROW"] * 3 + ["LEND", "RESERVE"]


def quota(shares: int = 20, capacity_per_type: int = 200, seed: int = 7) -> dict[str, Any]:
    rng = random.Random(seed)
    left = dict.fromkeys(TYPES, capacity_per_type)
    share_list = []
    for i in range(shares):
        types = rng.sample(TYPES, rng.randint(2, 5))
        limits = {t: max(1, min(left[t], rng.randint(4, 2 * capacity_per_type // shares))) for t in types}
        limits = {t: n for t, n in limits.items() if left[t] >= n}
        for t, n in limits.items():
            left[t] -= n
        if not limits:
            continue
        strategy = STRATEGIES[i % len(STRATEGIES)]
        share: dict[str, Any] = {
            "name": f"team{i:02d}",
            "capacity_limits": limits,
            "strategy": strategy,
            "in_share_preemption": i % 2 == 0,
            "starvation_after_seconds": 6 * 3600,
        }
        if strategy == "LEND_AND_BORROW":
            share["borrow_limit"] = [-1, 100, 200][i % 3]
        share_list.append(share)
    return {"pool": {"capacity": dict.fromkeys(TYPES, capacity_per_type)}, "shares": share_list}


def jobs(count: int, config: dict[str, Any], load: float = 1.0, seed: int = 11) -> list[dict[str, Any]]:
    """``count`` submissions arriving so that demand is about ``load`` × capacity; each share
    gets work in proportion to its limits."""
    rng = random.Random(seed)
    capacity = sum(config["pool"]["capacity"].values())
    mean_duration, mean_count = 3600.0, 2.5
    rate = load * capacity / (mean_duration * mean_count)
    at = 0.0
    events = []
    shares = config["shares"]
    weights = [sum(s["capacity_limits"].values()) for s in shares]
    for i in range(count):
        at += rng.expovariate(rate)
        share = rng.choices(shares, weights)[0]
        own = list(share["capacity_limits"])
        others = [t for t in TYPES if t not in own]
        prefs = rng.sample(own, min(len(own), rng.randint(1, 3)))
        if len(prefs) < 3 and others and rng.random() < 0.3:
            prefs.append(rng.choice(others))
        cap = _max_count(share, config)
        entries = []
        for t in prefs:
            n = min(rng.randint(1, 4), cap(t))
            if n >= 1:
                entries.append({"instance_type": t, "count": n})
        if not entries:
            continue
        events.append(
            {
                "at": round(at, 1),
                "submit": {
                    "name": f"job{i:06d}",
                    "share": share["name"],
                    "priority": rng.choice([1, 1, 1, 5, 5, 9]),
                    "preferences": entries,
                    "duration": round(rng.uniform(0.2, 1.8) * mean_duration),
                    "checkpoint_interval": 600,
                },
            }
        )
    return events


def _max_count(share: dict[str, Any], config: dict[str, Any]) -> Any:
    def cap(instance_type: str) -> int:
        limit: int = share["capacity_limits"].get(instance_type, 0)
        if share["strategy"] != "LEND_AND_BORROW":
            return limit
        borrow: int = share.get("borrow_limit", -1)
        if borrow >= 0:
            return limit * (100 + borrow) // 100
        total: int = sum(
            s["capacity_limits"].get(instance_type, 0) for s in config["shares"] if s["strategy"] != "RESERVE"
        )
        unassigned: int = config["pool"]["capacity"][instance_type] - sum(
            s["capacity_limits"].get(instance_type, 0) for s in config["shares"]
        )
        return total + unassigned

    return cap


def scenario(count: int, load: float = 1.0) -> dict[str, Any]:
    config = quota()
    return {"quota": config, "events": jobs(count, config, load)}
