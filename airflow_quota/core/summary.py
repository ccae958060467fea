"""A readable summary of a configuration: per instance type, capacity, limits and lendable."""

from __future__ import annotations

from airflow_quota.core.config import QuotaConfig


def config_summary(config: QuotaConfig) -> str:
    catalogue = config.catalogue()
    lines = [f"{'instance type':<22} {'capacity':>8} {'limits':>7} {'lendable':>8}  shares"]
    for name, capacity in sorted(config.pool.capacity.items()):
        limits = {s.name: s.capacity_limits[name] for s in config.shares if name in s.capacity_limits}
        lendable = (
            capacity
            - sum(limits.values())
            + sum(lim for s, lim in limits.items() if (share := config.share(s)) is not None and share.lends)
        )
        detail = ", ".join(
            f"{s} {lim} ({share.strategy.value})" for s, lim in limits.items() if (share := config.share(s)) is not None
        )
        gpus = catalogue[name].gpus
        lines.append(f"{name:<22} {capacity:>8} {sum(limits.values()):>7} {lendable:>8}  {detail}  [{gpus} GPU each]")
    for plan in config.pool.training_plans:
        lines.append(f"plan {plan.name}: {plan.count}x {plan.instance_type} from {plan.starts_at} to {plan.ends_at}")
    lines.append(
        f"{len(config.shares)} shares: "
        + ", ".join(
            f"{s.name} ({s.strategy.value}{', DISABLED' if s.state.value == 'DISABLED' else ''})" for s in config.shares
        )
    )
    return "\n".join(lines)
