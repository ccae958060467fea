"""The measures of docs/model.md section 9: time integrals of use, borrowing and lending per share and
type, and per-job GPU-hours, lost work and cost. Everything is integrated exactly at the
moments usage changes, so the figures do not depend on how often anyone looks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from airflow_quota.core.model import Entry, Job, UsageLine
from airflow_quota.core.quota import TypeLedger, lent_by

ON_DEMAND = "on-demand"


def charge(job: Job, entry: Entry, seconds: float, gpus: int, hourly_price: float) -> None:
    """Charge a job for holding ``entry`` for ``seconds``: instance- and GPU-time by type and
    source, and cost; on-demand cost of a job whose list has a plan entry is a fallback cost."""
    source = entry.training_plan or ON_DEMAND
    line = job.usage.get((entry.instance_type, source))
    if line is None:
        line = job.usage[(entry.instance_type, source)] = UsageLine()
    instance_seconds = seconds * entry.count
    cost = instance_seconds / 3600 * hourly_price
    line.instance_seconds += instance_seconds
    line.gpu_seconds += instance_seconds * gpus
    line.cost += cost
    job.gpu_seconds += instance_seconds * gpus
    job.cost += cost
    if entry.training_plan is None and any(e.training_plan for e in job.entries):
        job.fallback_cost += cost


@dataclass(slots=True)
class ShareTotals:
    gpu_seconds: float = 0.0
    borrowed_gpu_seconds: float = 0.0
    lent_gpu_seconds: float = 0.0
    limit_gpu_seconds: float = 0.0


@dataclass(slots=True)
class Meter:
    """Integrates usage over time; ``touch`` a type before anything about it changes."""

    shares: dict[str, ShareTotals] = field(default_factory=dict)
    pool_gpu_seconds: float = 0.0
    capacity_gpu_seconds: float = 0.0
    _last: dict[str, float] = field(default_factory=dict)
    _limits: dict[str, tuple[dict[str, int], int, list[tuple[ShareTotals, int]]]] = field(default_factory=dict)

    def totals(self, share: str) -> ShareTotals:
        totals = self.shares.get(share)
        if totals is None:
            totals = self.shares[share] = ShareTotals()
        return totals

    def touch(self, ledger: TypeLedger, now: float) -> None:
        last = self._last.get(ledger.name)
        self._last[ledger.name] = now
        if last is None or now <= last:
            return
        dt = now - last
        gpus = ledger.gpus
        self.capacity_gpu_seconds += ledger.capacity * gpus * dt
        for totals, limit_gpus in self._limits_of(ledger):
            totals.limit_gpu_seconds += limit_gpus * dt
        if gpus == 0 or (ledger.used == 0):
            return
        self.pool_gpu_seconds += ledger.used * gpus * dt
        borrowed = 0
        shares, limits = self.shares, ledger.limits
        for share, usage in ledger.usage.items():
            if usage:
                totals = shares.get(share) or self.totals(share)
                totals.gpu_seconds += usage * gpus * dt
                over = usage - limits.get(share, 0)
                if over > 0:
                    totals.borrowed_gpu_seconds += over * gpus * dt
                    borrowed += over
        if borrowed:
            self._credit_lenders(ledger, gpus * dt)

    def _limits_of(self, ledger: TypeLedger) -> list[tuple[ShareTotals, int]]:
        """Each share's totals with its limit of the type in GPUs, kept until the type's limits
        or GPUs change (a configuration loads new ``limits``): ``touch`` adds them up each time."""
        kept = self._limits.get(ledger.name)
        if kept is None or kept[0] is not ledger.limits or kept[1] != ledger.gpus:
            rows = [(self.totals(share), limit * ledger.gpus) for share, limit in ledger.limits.items()]
            kept = self._limits[ledger.name] = (ledger.limits, ledger.gpus, rows)
        return kept[2]

    def _credit_lenders(self, ledger: TypeLedger, weight: float) -> None:
        shares = self.shares
        for share, amount in lent_by(ledger).items():
            (shares.get(share) or self.totals(share)).lent_gpu_seconds += amount * weight


def percentile(sorted_values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of an already sorted list (0 for an empty one)."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]
