"""The comparison for people: a text summary for the terminal, and a self-contained HTML report
(PNG figures inlined as data URIs, the figures' numbers embedded as JSON) to keep or mail.
"""

from __future__ import annotations

import base64
import html
import json
from typing import Any

from airflow_quota.core.human_time import duration_words
from airflow_quota.sim.plots import FIGURES
from airflow_quota.sim.report import table


def duration(seconds: float | None) -> str:
    """A wait in a table cell: in words (``core.human_time``), "-" when there is none."""
    return "-" if seconds is None else duration_words(seconds)


def _ratio(mine: float, theirs: float) -> str:
    if theirs == 0:
        return "-" if mine == 0 else "∞"
    return f"{mine / theirs:.2f}x"


def policy_rows(document: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
    headers = [
        "policy",
        "jobs",
        "rejected",
        "util",
        "util while submitting",
        "GPU-h",
        "wait mean",
        "p50",
        "p95",
        "max",
        "preemptions",
        "lost GPU-h",
        "cost $",
        "GUARANTEE_VIOLATED",
        "wall s",
    ]
    rows = []
    for name, policy in document["policies"].items():
        pool = policy["pool"]
        rows.append(
            [
                name,
                f"{pool['jobs']:,}",
                f"{pool['rejected']:,}",
                f"{pool['utilization']:.1%}",
                f"{pool['utilization_during_trace']:.1%}",
                f"{pool['gpu_hours']:,.0f}",
                duration(pool["wait_mean"]),
                duration(pool["wait_p50"]),
                duration(pool["wait_p95"]),
                duration(pool["wait_max"]),
                f"{pool['preemptions']:,}",
                f"{pool['lost_gpu_hours']:,.0f}",
                f"{pool['cost']:,.0f}",
                policy["alerts"]["GUARANTEE_VIOLATED"],
                policy["wall_seconds"],
            ]
        )
    return headers, rows


def wait_rows(document: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
    """Per share, mean / p50 / p95 / max wait under every policy."""
    table_data = document["figures"]["wait_table"]
    names = list(table_data)
    tenants = sorted({t for per in table_data.values() for t in per})
    headers = ["share", *(f"{n}: mean / p50 / p95 / max" for n in names)]
    rows = []
    for tenant in tenants:
        row: list[Any] = [tenant]
        for name in names:
            w = table_data[name].get(tenant)
            if w is None:
                row.append("-")
                continue
            cells = " / ".join(duration(w[k]) for k in ("wait_mean", "wait_p50", "wait_p95", "wait_max"))
            rejected = f" ({w['rejected']} rejected)" if w["rejected"] else ""
            row.append(cells + rejected)
        rows.append(row)
    return headers, rows


def protection_rows(document: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
    """Per policy and share: jobs submitted under the share's limit, their wait and the open
    pool's wait for the same jobs."""
    headers = ["policy", "share", "jobs under limit", "their wait", "same jobs in the open pool", "ratio"]
    rows = []
    for name, per in document["figures"]["protection"].items():
        for tenant, p in per.items():
            rows.append(
                [
                    name,
                    tenant,
                    f"{p['jobs_under_limit']:,}",
                    duration(p["wait_mean"]),
                    duration(p["open_wait_mean"]),
                    _ratio(p["wait_mean"], p["open_wait_mean"]),
                ]
            )
    return headers, rows


def share_rows(document: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
    headers = [
        "policy",
        "share",
        "GPU-h",
        "util",
        "borrowed GPU-h",
        "lent GPU-h",
        "preemptions",
        "lost GPU-h",
        "cost $",
    ]
    rows = []
    for name, policy in document["policies"].items():
        for tenant, s in policy["shares"].items():
            rows.append(
                [
                    name,
                    tenant,
                    f"{s['gpu_hours']:,.0f}",
                    "-" if s["utilization"] is None else f"{s['utilization']:.0%}",
                    "-" if s["borrowed_gpu_hours"] is None else f"{s['borrowed_gpu_hours']:,.0f}",
                    "-" if s["lent_gpu_hours"] is None else f"{s['lent_gpu_hours']:,.0f}",
                    f"{s['preemptions']:,}",
                    f"{s['lost_gpu_hours']:,.0f}",
                    f"{s['cost']:,.0f}",
                ]
            )
    return headers, rows


def _heading(document: dict[str, Any]) -> str:
    trace = document["trace"]
    return (
        f"Trace {trace['spec']}: {trace['jobs']:,} jobs ({trace['bad_rows']} bad rows), "
        f"submitted from t={trace['first_submit']:,} s to t={trace['last_submit']:,} s"
    )


def to_text(document: dict[str, Any]) -> str:
    """The terminal summary: policies, per-share waits, protection of jobs under their limit."""
    parts = [_heading(document), "", "Policies", table(*policy_rows(document)), ""]
    parts += ["Wait per share", table(*wait_rows(document)), ""]
    protection = protection_rows(document)
    if protection[1]:
        parts += ["Jobs submitted while their share was under its limit (mean wait)", table(*protection), ""]
    parts += ["Shares", table(*share_rows(document))]
    return "\n".join(parts) + "\n"


def _html_table(headers: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


_STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 12px; }
th, td { border: 1px solid #ccc; padding: 3px 7px; text-align: right; }
th:first-child, td:first-child, td:nth-child(2) { text-align: left; }
th { background: #f3f3f3; }
img { max-width: 100%; border: 1px solid #eee; }
figure { margin: 1em 0 2em; }
figcaption { color: #555; }
"""


def to_html(document: dict[str, Any], images: dict[str, bytes]) -> str:
    """One self-contained HTML page: tables, the PNG figures inlined, and the document itself as
    JSON in ``<script id="figures" type="application/json">`` (the numbers behind every figure)."""
    sections = [
        f"<h1>airflow-quota: policy comparison</h1><p>{html.escape(_heading(document))}</p>",
        "<h2>Policies</h2>",
        "<ul>"
        + "".join(
            f"<li><b>{html.escape(n)}</b>: {html.escape(p['description'])}</li>"
            for n, p in document["policies"].items()
        )
        + "</ul>",
        _html_table(*policy_rows(document)),
        "<p>util: GPU-hours used over capacity for the whole run (the simulator's pool utilisation); "
        "util while submitting: the same between the first and the last submission.</p>",
    ]
    for name, caption in FIGURES.items():
        if name in images:
            data = base64.b64encode(images[name]).decode("ascii")
            sections.append(
                f'<figure id="{name}"><img alt="{html.escape(caption)}" src="data:image/png;base64,{data}">'
                f"<figcaption>{html.escape(caption)}</figcaption></figure>"
            )
        if name == "waits":
            sections += ["<h2>Wait per share</h2>", _html_table(*wait_rows(document))]
            protection = protection_rows(document)
            if protection[1]:
                sections += [
                    "<h2>Jobs submitted while their share was under its limit</h2>",
                    _html_table(*protection),
                ]
    sections += ["<h2>Shares</h2>", _html_table(*share_rows(document))]
    payload = json.dumps(document, ensure_ascii=False, separators=(",", ":")).replace("</", "<\\/")
    sections.append(f'<script id="figures" type="application/json">{payload}</script>')
    body = "\n".join(sections)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>airflow-quota policy comparison</title><style>{_STYLE}</style></head>\n"
        f"<body>\n{body}\n</body></html>\n"
    )
