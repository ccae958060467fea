"""Quota arithmetic per instance type (docs/model.md rule 4.0.1, the invariant), in whole instances.

The invariant ``borrowed(T) <= lendable(T)`` rewrites, for limits that fit in the capacity, as

    pressure(T) = Σ_s term_s(T) <= capacity(T),   term_s = U_s if s lends else max(U_s, L_s)

because a lending share takes out of the pool exactly what it uses, while a share that does not
lend (RESERVE, or a lender protecting its own demand) also keeps its idle capacity out of reach.
Keeping one running sum per type makes every placement check O(shares touched).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from airflow_quota.core.config import QuotaConfig, Share, Strategy


class Block(str, Enum):
    """Why an entry cannot be placed now; the basis of pending reasons and explanations."""

    SHARE_LIMIT = "over the share's limit"
    BORROW_LIMIT = "over the share's borrow limit"
    NOT_LENDABLE = "no lendable capacity"
    POOL_FULL = "pool capacity in use"
    PLAN_NOT_ACTIVE = "training plan window not open"
    PLAN_FULL = "training plan fully used"
    NO_PROVIDER_CAPACITY = "provider has no capacity"
    HELD_FOR_STARVING_JOB = "held for a starving job"
    BORROWING_HELD = "borrowing held for a starving job of another share"
    BACKING_OFF = "entry backing off after a capacity error"
    MAX_RUNNING_JOBS = "the share holds its max_running_jobs"


def share_term(usage: int, limit: int, lends: bool) -> int:
    """What share ``s`` takes out of capacity(T): its usage if it lends, otherwise also its idle
    limit, since capacity that is not lent stays reserved for its owner."""
    return usage if lends else max(usage, limit)


def holding_cap(share: Share, limit: int) -> int | None:
    """The most instances of a type ``share`` may hold; None when unbounded.

    RESERVE and LEND hold at most their limit; LEND_AND_BORROW at most
    ``limit * (1 + borrow_limit/100)`` (rounded down), or without bound when borrow_limit is -1.
    """
    if share.strategy is not Strategy.LEND_AND_BORROW:
        return limit
    if share.effective_borrow_limit < 0:
        return None
    return limit * (100 + share.effective_borrow_limit) // 100


def holding_caps(config: QuotaConfig, instance_type: str) -> dict[str, int | None]:
    """Every share's ``holding_cap`` of the type under ``config``."""
    return {s.name: holding_cap(s, s.capacity_limits.get(instance_type, 0)) for s in config.shares}


@dataclass(slots=True)
class Plan:
    """A training plan's window and use, on the scheduler's clock."""

    name: str
    instance_type: str
    count: int
    starts_at: float
    ends_at: float
    hourly_price: float
    used: int = 0

    def active(self, now: float) -> bool:
        return self.starts_at <= now < self.ends_at


@dataclass(slots=True)
class TypeLedger:
    """Capacity, limits and usage of one instance type."""

    name: str
    capacity: int
    gpus: int
    price: float
    limits: dict[str, int]
    lends: dict[str, bool]
    caps: dict[str, int | None] = field(default_factory=dict)
    """Each share's ``holding_cap`` of the type, worked out when the configuration loads."""
    usage: dict[str, int] = field(default_factory=dict)
    pressure: int = 0
    used: int = 0
    borrowed_total: int = 0
    """Σ_s max(0, U_s − L_s), kept up to date like ``pressure``."""
    below_limit: set[str] = field(default_factory=set)
    """The shares using less of the type than their limit, kept up to date like ``pressure``:
    only they leave any of their limit idle (to lend or to protect)."""
    draining: int = 0
    """Instances of stopping victims beyond what their preemptor holds: busy, owned by no share."""
    on_demand_used: int = 0
    available: int | None = None
    """On-demand instances the provider can give (None: unlimited)."""

    @classmethod
    def of(cls, config: QuotaConfig, name: str, usage: dict[str, int]) -> TypeLedger:
        """The ledger of one type under ``config`` with the given usage per share."""
        ledger = cls(
            name=name,
            capacity=config.pool.capacity.get(name, 0),
            gpus=0,
            price=0.0,
            limits={s.name: s.capacity_limits[name] for s in config.shares if name in s.capacity_limits},
            lends={s.name: s.lends for s in config.shares},
            caps=holding_caps(config, name),
            usage=dict(usage),
        )
        ledger.recompute()
        return ledger

    def usage_of(self, share: str) -> int:
        return self.usage.get(share, 0)

    def full(self) -> bool:
        """Whether every instance of the type is in use or stopping."""
        return self.used + self.draining >= self.capacity

    def limit_of(self, share: str) -> int:
        return self.limits.get(share, 0)

    def cap_of(self, share: str) -> int | None:
        """The most instances of the type ``share`` may hold (``holding_cap``); None: unbounded."""
        return self.caps[share]

    def term(self, share: str, usage: int, protected: bool = False) -> int:
        lends = self.lends.get(share, True) and not protected
        return share_term(usage, self.limits.get(share, 0), lends)

    def recompute(self) -> None:
        """Rebuild the running sums (after a configuration change)."""
        self.used = sum(self.usage.values())
        self.borrowed_total = self.borrowed()
        self.below_limit = {s for s, limit in self.limits.items() if self.usage_of(s) < limit}
        shares = set(self.limits) | set(self.usage)
        self.pressure = sum(self.term(s, self.usage_of(s)) for s in shares)

    def change_usage(self, share: str, delta: int) -> None:
        before = self.usage_of(share)
        after = before + delta
        limit = self.limits.get(share, 0)
        self.pressure += self.term(share, after) - self.term(share, before)
        self.borrowed_total += max(0, after - limit) - max(0, before - limit)
        self.used += delta
        self.usage[share] = after
        if after < limit:
            self.below_limit.add(share)
        else:
            self.below_limit.discard(share)

    def borrowed(self) -> int:
        """Σ_s max(0, U_s − L_s)."""
        return sum(max(0, u - self.limit_of(s)) for s, u in self.usage.items())

    def lendable(self) -> int:
        """(capacity − Σ L) + Σ over lending shares of max(0, L_s − U_s)."""
        unassigned = self.capacity - sum(self.limits.values())
        idle = sum(max(0, lim - self.usage_of(s)) for s, lim in self.limits.items() if self.lends.get(s, True))
        return unassigned + idle


def lent_by(ledger: TypeLedger) -> dict[str, float]:
    """How much of the type each lending share lends now. Borrowing draws first on capacity no
    share is guaranteed, then on lenders' idle capacity, shared in proportion to what each
    leaves idle (a convention: the spec fixes the totals, not who lends what)."""
    unassigned = max(0, ledger.capacity - sum(ledger.limits.values()))
    from_lenders = ledger.borrowed_total - unassigned
    if from_lenders <= 0:
        return {}
    idle: dict[str, int] = {}
    for share in ledger.below_limit:
        if ledger.lends.get(share, True):
            idle[share] = ledger.limits[share] - ledger.usage.get(share, 0)
    total_idle = sum(idle.values())
    if total_idle <= 0:
        return {}
    drawn = min(from_lenders, total_idle)
    return {share: drawn * amount / total_idle for share, amount in idle.items()}
