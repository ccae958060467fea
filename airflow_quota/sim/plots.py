"""The comparison's figures as PNG images (matplotlib, Agg backend), drawn only from the JSON
document of ``compare.comparison_document``, so every picture has its numbers next to it.

matplotlib is imported inside ``render``: ``simulate`` and ``compare`` without a report never
pay for it.
"""

from __future__ import annotations

import io
from typing import Any

FIGURES = {
    "utilisation": "GPUs in use in the pool over time, per policy, against capacity",
    "share_utilisation": "GPUs in use per share over time, per policy, against the share's limit",
    "waits": "Waiting-time distribution per share and policy",
    "borrowed_lent": "Borrowed and lent GPU-hours per share",
    "preemptions": "Preemptions and lost GPU-hours per share",
    "cost": "Cost per share",
}
"""Figure name → caption, in report order."""

DAY = 86400.0


def render(document: dict[str, Any]) -> dict[str, bytes]:
    """Every figure of the report as PNG bytes, by name (see ``FIGURES``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures = document["figures"]
    drawers = {
        "utilisation": _utilisation,
        "share_utilisation": _share_utilisation,
        "waits": _waits,
        "borrowed_lent": _borrowed_lent,
        "preemptions": _preemptions,
        "cost": _cost,
    }
    out: dict[str, bytes] = {}
    for name, draw in drawers.items():
        figure = draw(plt, figures)
        if figure is None:
            continue
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
        plt.close(figure)
        out[name] = buffer.getvalue()
    return out


def _time_axis(figures: dict[str, Any]) -> tuple[list[float], str]:
    """Bin centres in days, or hours for runs shorter than three days."""
    data = figures["utilisation"]
    width = float(data["bin_seconds"])
    span = width * len(data["t"])
    unit, label = (DAY, "days") if span >= 3 * DAY else (3600.0, "hours")
    return [(float(t) + width / 2) / unit for t in data["t"]], label


def _utilisation(plt: Any, figures: dict[str, Any]) -> Any:
    data = figures["utilisation"]
    x, label = _time_axis(figures)
    figure, axis = plt.subplots(figsize=(10, 4.2))
    capacity = 0
    for name, series in data["policies"].items():
        axis.plot(x, series["pool"], label=name, linewidth=1.2)
        capacity = max(capacity, series["capacity_gpus"])
    axis.axhline(capacity, color="black", linestyle="--", linewidth=1, label=f"capacity ({capacity:,} GPUs)")
    first, last = data["trace_window"]
    unit = DAY if label == "days" else 3600.0
    axis.axvspan(first / unit, last / unit, color="0.93", zorder=0, label="submissions arrive")
    axis.set_xlabel(f"simulated time ({label})")
    axis.set_ylabel("GPUs in use (mean per bin)")
    axis.set_title("Pool utilisation over time")
    axis.set_ylim(bottom=0, top=capacity * 1.08 if capacity else None)
    axis.legend(loc="lower center", ncol=5, fontsize=8)
    axis.grid(alpha=0.3)
    return figure


def _grid(plt: Any, count: int, height: float = 2.2) -> tuple[Any, list[Any]]:
    columns = min(count, 5)
    rows = -(-count // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(3.2 * columns, height * rows + 0.6), squeeze=False)
    flat = [axis for row in axes for axis in row]
    for axis in flat[count:]:
        axis.set_visible(False)
    return figure, flat[:count]


def _share_utilisation(plt: Any, figures: dict[str, Any]) -> Any:
    data = figures["utilisation"]
    policies = data["policies"]
    tenants = sorted({t for series in policies.values() for t in series["shares"]})
    if not tenants:
        return None
    x, label = _time_axis(figures)
    figure, axes = _grid(plt, len(tenants))
    for axis, tenant in zip(axes, tenants, strict=True):
        limit = None
        for name, series in policies.items():
            axis.plot(x, series["shares"].get(tenant, []), label=name, linewidth=0.9)
            limit = limit or series["limit_gpus"].get(tenant)
        if limit:
            axis.axhline(limit, color="black", linestyle="--", linewidth=0.8, label="limit")
        axis.set_title(tenant, fontsize=9)
        axis.tick_params(labelsize=7)
        axis.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    figure.suptitle(f"GPUs in use per share (x: {label}; dashed: the share's limit)", fontsize=10)
    figure.tight_layout()
    return figure


def _waits(plt: Any, figures: dict[str, Any]) -> Any:
    data = figures["wait_distribution"]
    quantiles = [q / 100 for q in data["quantiles"]]
    policies = data["policies"]
    tenants = sorted({t for per in policies.values() for t in per})
    if not tenants:
        return None
    figure, axes = _grid(plt, len(tenants))
    for axis, tenant in zip(axes, tenants, strict=True):
        for name, per in policies.items():
            values = per.get(tenant)
            if values:
                # a wait of 0 has no place on a log axis: drawn at one second
                axis.step([max(v / 3600, 1 / 3600) for v in values], quantiles, where="post", label=name, linewidth=1)
        axis.set_xscale("log")
        axis.set_title(tenant, fontsize=9)
        axis.tick_params(labelsize=7)
        axis.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    figure.suptitle("Waiting time: fraction of jobs that waited at most x hours (log x)", fontsize=10)
    figure.tight_layout()
    return figure


def _bars(plt: Any, per_policy: dict[str, dict[str, dict[str, Any]]], keys: list[tuple[str, str]], title: str) -> Any:
    """Grouped bars: one panel per key, one group per share, one bar per policy."""
    tenants = sorted({t for per in per_policy.values() for t in per})
    if not tenants:
        return None
    figure, axes = plt.subplots(len(keys), 1, figsize=(10, 2.8 * len(keys) + 0.4), squeeze=False)
    width = 0.8 / max(1, len(per_policy))
    for axis, (key, label) in zip((row[0] for row in axes), keys, strict=True):
        for i, (name, per) in enumerate(per_policy.items()):
            values = [per.get(t, {}).get(key) or 0 for t in tenants]
            axis.bar([j + i * width for j in range(len(tenants))], values, width, label=name)
        axis.set_xticks([j + width * (len(per_policy) - 1) / 2 for j in range(len(tenants))], tenants, fontsize=8)
        axis.set_ylabel(label, fontsize=8)
        axis.grid(axis="y", alpha=0.3)
        axis.legend(fontsize=7)
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    return figure


def _borrowed_lent(plt: Any, figures: dict[str, Any]) -> Any:
    per_policy = figures["borrowed_lent"]
    if not per_policy:
        return None
    keys = [("borrowed_gpu_hours", "borrowed GPU-hours"), ("lent_gpu_hours", "lent GPU-hours")]
    return _bars(plt, per_policy, keys, "Borrowed and lent GPU-hours per share")


def _preemptions(plt: Any, figures: dict[str, Any]) -> Any:
    keys = [("preemptions", "preemptions"), ("lost_gpu_hours", "lost GPU-hours")]
    return _bars(plt, figures["preemptions"], keys, "Preemptions and the work they lost")


def _cost(plt: Any, figures: dict[str, Any]) -> Any:
    keys = [("cost", "cost (USD)"), ("cost_per_job", "cost per training run (USD)")]
    return _bars(plt, figures["cost"], keys, "Cost per share, at the catalogue's on-demand prices")
