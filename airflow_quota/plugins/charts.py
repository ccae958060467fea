"""A share's GPU use over time as an SVG chart, drawn by matplotlib on the server.

Drawn with the object-oriented API (a ``Figure`` of its own per chart, no ``pyplot`` state),
so concurrent requests in the api-server's threads never share a figure. Output is
deterministic for the same data (fixed hash salt, no dates in the metadata), so a browser's
cache and the tests can compare charts. Nothing is fetched from the network: the page shows the
SVG as an image.
"""

from __future__ import annotations

import io
from datetime import datetime, timezone
from typing import Any

from airflow_quota.store.dashboard import UtilisationHistory

COLOURS = {"used": "#3b73b9", "borrowed": "#e8871e", "limit": "#2d3748"}
"""The page's colours for own use, borrowed capacity and the limit line (see quotas.css)."""


def utilisation_svg(history: UtilisationHistory, width: float = 6.4, height: float = 2.2) -> str:
    """The share's GPUs held over the window as a step chart: own use, the borrowed part on top
    of it, and the limit as a dashed line; an empty chart says so."""
    import matplotlib
    from matplotlib import dates
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    mdates: Any = dates  # its locators and formatters carry no annotations

    with matplotlib.rc_context({"svg.hashsalt": "airflow-quota", "svg.fonttype": "none", "font.size": 8}):
        figure = Figure(figsize=(width, height), layout="constrained")
        axes = figure.add_subplot()
        if history.points:
            _draw(axes, history)
            locator = mdates.AutoDateLocator(minticks=3, maxticks=6, tz=timezone.utc)
            axes.xaxis.set_major_locator(locator)
            axes.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, tz=timezone.utc))
            axes.yaxis.set_major_locator(MaxNLocator(integer=True))
            axes.legend(loc="upper left", fontsize=7, frameon=False, ncols=3)
        else:
            axes.text(0.5, 0.5, "no placements in this window", ha="center", va="center", transform=axes.transAxes)
            axes.set_xticks([])
        axes.set_ylabel("GPUs")
        axes.spines[["top", "right"]].set_visible(False)
        axes.grid(axis="y", linewidth=0.3, alpha=0.6)
        axes.set_title(_title(history), fontsize=8, loc="left")
        buffer = io.StringIO()
        figure.savefig(buffer, format="svg", metadata={"Date": None, "Creator": "airflow-quota"})
    return buffer.getvalue()


def _draw(axes: Any, history: UtilisationHistory) -> None:
    """Steps that hold from each point to the next, up to the end of the window."""
    points = history.points
    times = [_instant(p.at) for p in points] + [_instant(history.end)]
    used = [p.used_gpus for p in points] + [points[-1].used_gpus]
    own = [p.used_gpus - p.borrowed_gpus for p in points] + [points[-1].used_gpus - points[-1].borrowed_gpus]
    limit = [p.limit_gpus for p in points] + [points[-1].limit_gpus]
    axes.fill_between(times, 0, own, step="post", color=COLOURS["used"], alpha=0.55, linewidth=0, label="own use")
    axes.fill_between(
        times, own, used, step="post", color=COLOURS["borrowed"], alpha=0.7, linewidth=0, label="borrowed"
    )
    axes.step(times, limit, where="post", color=COLOURS["limit"], linestyle="--", linewidth=1, label="limit")
    top = max(max(used), max(limit), 1)
    axes.set_ylim(0, top * 1.25)
    axes.set_xlim(times[0], times[-1])


def _title(history: UtilisationHistory) -> str:
    ratio = history.utilisation
    share = f"{history.share} (times in UTC): " if history.share else ""
    if ratio is None:
        return f"{share}{history.gpu_hours:.2f} GPU-hours"
    return (
        f"{share}{ratio:.0%} of its limit, {history.gpu_hours:.2f} GPU-hours "
        f"({history.borrowed_gpu_hours:.2f} borrowed)"
    )


def _instant(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=timezone.utc)
