"""``airflow-quota compare`` (issue 6) on a small excerpt of the ITP trace: the three policies,
the report's JSON figures against the simulator's own output, the HTML report, policy files,
and the open pool against an independent FIFO replay."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from airflow_quota.core.config import load_config
from airflow_quota.core.measures import percentile
from airflow_quota.sim.compare import open_pool, static_partition
from airflow_quota.sim.report import build_report
from airflow_quota.sim.simulator import Simulator
from airflow_quota.sim.traces import read_trace, trace_scenario
from benchmarks.itp_replay import bare_fifo
from tests.conftest import cli

DATA = Path(__file__).resolve().parent / "data"
TRACE = f"itp:{DATA / 'itp'}"
QUOTA = DATA / "itp-quota.yaml"
TENANTS = ["cluster02", "cluster04", "cluster07", "cluster08"]


@pytest.fixture(scope="module")
def compared(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    """``compare --json --report`` once for the module: the document and the report's folder."""
    out = tmp_path_factory.mktemp("report")
    run = cli("compare", "--trace", TRACE, "--quota", str(QUOTA), "--json", "--report", str(out / "itp.html"))
    assert run.code == 0, run.stderr
    assert "Traceback" not in run.stderr
    document: dict[str, Any] = run.json()
    return document, out


def simulate(tmp_path: Path, config: dict[str, Any]) -> dict[str, Any]:
    """``simulate --trace --json`` of the excerpt on a configuration written to a file."""
    path = tmp_path / "quota.yaml"
    path.write_text(yaml.safe_dump(config))
    run = cli("simulate", "--trace", TRACE, "--quota", str(path), "--json")
    assert run.code == 0, run.stderr
    report: dict[str, Any] = run.json()
    return report


def as_raw(config: Any) -> dict[str, Any]:
    raw: dict[str, Any] = json.loads(config.model_dump_json(exclude_none=True))
    return raw


def test_compare_runs_the_three_policies_by_default(compared: tuple[dict[str, Any], Path]) -> None:
    document, _ = compared
    assert document["compared"] == ["shares", "static", "open"]
    policies = document["policies"]
    # cluster02's 32-GPU job can never fit in its static partition of 8 GPUs: rejected
    assert policies["static"]["pool"]["rejected"] == 1
    assert policies["static"]["shares"]["cluster02"]["rejected"] == 1
    assert policies["shares"]["pool"]["rejected"] == policies["open"]["pool"]["rejected"] == 0
    assert policies["shares"]["pool"]["jobs"] == policies["open"]["pool"]["jobs"] == 43
    # nobody lends or borrows in a static partition, and the open pool has nothing to reclaim
    assert all(s["borrowed_gpu_hours"] == s["lent_gpu_hours"] == 0 for s in policies["static"]["shares"].values())
    assert policies["open"]["pool"]["preemptions"] == 0
    assert all(p["alerts"]["GUARANTEE_VIOLATED"] == 0 for p in policies.values())
    # the open pool is the utilisation bound while jobs arrive, and the static partition waits longest
    during = {name: p["pool"]["utilization_during_trace"] for name, p in policies.items()}
    assert during["open"] >= during["shares"] > during["static"]
    assert policies["open"]["pool"]["wait_mean"] < policies["static"]["pool"]["wait_mean"]


def test_figures_are_the_simulators_own_figures(compared: tuple[dict[str, Any], Path], tmp_path: Path) -> None:
    """For the quota policies, every per-share figure of the report is what ``simulate --json``
    says for that configuration; for the open pool, what its jobs say, grouped by tenant."""
    document, _ = compared
    figures = document["figures"]
    config = load_config(QUOTA)
    for name, quota in (("shares", config), ("static", static_partition(config))):
        report = simulate(tmp_path, as_raw(quota))
        for tenant in TENANTS:
            share = report["shares"][tenant]
            for key in ("wait_mean", "wait_p50", "wait_p95", "wait_max"):
                assert figures["wait_table"][name][tenant][key] == share[key], (name, tenant, key)
            for key in ("borrowed_gpu_hours", "lent_gpu_hours"):
                assert figures["borrowed_lent"][name][tenant][key] == share[key], (name, tenant, key)
            for key in ("preemptions", "lost_gpu_hours"):
                assert figures["preemptions"][name][tenant][key] == share[key], (name, tenant, key)
            assert figures["cost"][name][tenant]["cost"] == share["cost"]
            assert document["policies"][name]["shares"][tenant]["utilization"] == share["utilization"]
        assert document["policies"][name]["pool"]["utilization"] == report["pool"]["utilization"]
        assert document["policies"][name]["pool"]["gpu_hours"] == report["pool"]["gpu_hours"]

    # the command line replays a trace on its tenants' shares; the open pool maps them all to one
    trace = read_trace(TRACE)
    scenario = trace_scenario(trace, open_pool(config), share_of=lambda _tenant: "open").scenario
    report = build_report(Simulator(scenario).run())
    assert set(report["shares"]) == {"open"}
    tenant_of = {row.name: row.tenant for row in trace.rows}
    for tenant in TENANTS:
        waits = sorted(j["wait_seconds"] for n, j in report["jobs"].items() if tenant_of[n] == tenant)
        row = figures["wait_table"]["open"][tenant]
        assert row["jobs"] == len(waits)
        assert row["wait_mean"] == pytest.approx(sum(waits) / len(waits), abs=1e-3)
        assert row["wait_p95"] == percentile(waits, 0.95)
        assert row["wait_max"] == waits[-1]
        quantiles = figures["wait_distribution"]["policies"]["open"][tenant]
        assert quantiles[0] == waits[0] and quantiles[100] == waits[-1]


def test_utilisation_over_time_integrates_to_the_gpu_hours(compared: tuple[dict[str, Any], Path]) -> None:
    """The timeline is exact: its area is each share's GPU-hours, and it never exceeds capacity."""
    document, _ = compared
    data = document["figures"]["utilisation"]
    width = data["bin_seconds"]
    for name, series in data["policies"].items():
        for tenant in TENANTS:
            area = sum(series["shares"][tenant]) * width / 3600
            expected = document["policies"][name]["shares"][tenant]["gpu_hours"]
            assert area == pytest.approx(expected, rel=1e-4, abs=0.01), (name, tenant)
        assert max(series["pool"]) <= series["capacity_gpus"] + 1e-6
        assert series["capacity_gpus"] == 64
    assert data["policies"]["shares"]["limit_gpus"]["cluster04"] == 32
    assert data["policies"]["open"]["limit_gpus"]["cluster04"] is None


def test_the_open_pool_is_a_plain_fifo_replay(compared: tuple[dict[str, Any], Path]) -> None:
    """The open pool makes the decisions of a bare FIFO event loop written without the quota
    code (benchmarks/itp_replay.py): every job waits exactly as long."""
    document, _ = compared
    rows = read_trace(TRACE).rows
    waits, _ = bare_fifo([(r.submit, r.duration, r.gpus) for r in rows], 64)
    by_tenant: dict[str, list[float]] = {}
    for row, wait in zip(rows, waits, strict=True):
        by_tenant.setdefault(row.tenant, []).append(wait)
    for tenant, tenant_waits in by_tenant.items():
        expected = sum(tenant_waits) / len(tenant_waits)
        assert document["figures"]["wait_table"]["open"][tenant]["wait_mean"] == pytest.approx(expected, abs=1e-3)


def test_protection_compares_the_same_jobs_with_the_open_pool(
    compared: tuple[dict[str, Any], Path], tmp_path: Path
) -> None:
    """Jobs "under the limit" are those whose share, when they were submitted, held few enough
    GPUs for them to fit under its limit: recounted here from the simulator's event stream."""
    document, _ = compared
    protection = document["figures"]["protection"]
    assert set(protection) == {"shares", "static"}
    report = simulate(tmp_path, as_raw(load_config(QUOTA)))
    limits = {s.name: s.capacity_limits["ml.p3.2xlarge"] for s in load_config(QUOTA).shares}
    counts = {r.name: r.gpus for r in read_trace(TRACE).rows}
    held = dict.fromkeys(TENANTS, 0)
    under: dict[str, list[str]] = {t: [] for t in TENANTS}
    holding: dict[str, int] = {}
    for event in report["events"]:
        job, share = event["job"], event["share"]
        if event["type"] == "SUBMITTED" and held[share] + counts[job] <= limits[share]:
            under[share].append(job)
        elif event["type"] == "PLACED":
            holding[job] = event["count"]
            held[share] += event["count"]
        elif event["type"] in ("SUCCEEDED", "PREEMPTED", "FAILED", "REQUEUED") and job in holding:
            held[share] -= holding.pop(job)
    for tenant in TENANTS:
        row = protection["shares"][tenant]
        assert row["jobs_under_limit"] == len(under[tenant]), tenant
        mine = [report["jobs"][n]["wait_seconds"] for n in under[tenant]]
        assert row["wait_mean"] == pytest.approx(sum(mine) / len(mine) if mine else 0, abs=1e-3)
    assert sum(len(v) for v in under.values()) > 0
    assert 0 < len(under["cluster08"]) < 14  # some of cluster08's jobs came while it was full


def test_the_html_report_is_self_contained(compared: tuple[dict[str, Any], Path]) -> None:
    document, out = compared
    page = (out / "itp.html").read_text()
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(images) == 6
    assert all(base64.b64decode(data).startswith(b"\x89PNG\r\n\x1a\n") for data in images)
    assert "http://" not in page and "https://" not in page
    embedded = re.search(r'<script id="figures" type="application/json">(.*?)</script>', page, re.S)
    assert embedded is not None
    assert json.loads(embedded.group(1).replace("<\\/", "</")) == document
    assert json.loads((out / "itp.json").read_text()) == document
    for tenant in TENANTS:
        assert f"<td>{tenant}</td>" in page


def test_compare_a_quota_file_with_another(tmp_path: Path) -> None:
    """A policy may be the path of another quota file: here one with cluster04 lending only."""
    raw = as_raw(load_config(QUOTA))
    raw["shares"][1]["strategy"] = "LEND"
    other = tmp_path / "cluster04-lends.yaml"
    other.write_text(yaml.safe_dump(raw))
    run = cli(
        "compare", "--trace", TRACE, "--quota", str(QUOTA), "--policy", "shares", "--policy", str(other), "--json"
    )
    assert run.code == 0, run.stderr
    document = run.json()
    assert document["compared"] == ["shares", "cluster04-lends"]
    assert document["figures"]["borrowed_lent"]["cluster04-lends"]["cluster04"]["borrowed_gpu_hours"] == 0
    assert document["figures"]["protection"] == {}  # no open pool to compare with
    assert "[1/2] shares" in run.stderr and "[2/2] cluster04-lends" in run.stderr


def test_text_summary_and_progress(tmp_path: Path) -> None:
    run = cli("compare", "--trace", TRACE, "--quota", str(QUOTA), "--progress", "--plots", str(tmp_path / "png"))
    assert run.code == 0, run.stderr
    assert "Wait per share" in run.stdout
    assert re.search(r"^static\s+42\s+1\s", run.stdout, re.M), run.stdout
    assert "[3/3] open: 43 jobs replayed" in run.stderr
    assert sorted(p.name for p in (tmp_path / "png").iterdir()) == [
        "borrowed_lent.png",
        "cost.png",
        "preemptions.png",
        "share_utilisation.png",
        "utilisation.png",
        "waits.png",
    ]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--policy", "fair"], "--policy: 'fair' is not a policy (shares, static, open) nor a quota file"),
        (["--policy", "open", "--policy", "open"], "--policy: 'open': a policy named 'open' is already compared"),
        (["--policy", "missing.yaml"], "missing.yaml: cannot read the file"),
        (["--until", "-1"], "--until: -1 must be ≥ 0"),
        (["--checkpoint-interval", "0"], "--checkpoint-interval: 0 must be > 0 seconds"),
    ],
    ids=["an unknown policy", "a policy twice", "a missing policy file", "a negative --until", "a zero checkpoint"],
)
def test_compare_refuses_bad_arguments(args: list[str], expected: str) -> None:
    run = cli("compare", "--trace", TRACE, "--quota", str(QUOTA), *args)
    assert run.code == 2
    assert "Traceback" not in run.stderr
    assert expected in run.stderr
    assert run.stdout == ""


def test_a_policy_file_that_cannot_take_the_trace_is_refused_before_any_run(tmp_path: Path) -> None:
    raw = as_raw(load_config(QUOTA))
    raw["shares"] = [s for s in raw["shares"] if s["name"] != "cluster02"]
    other = tmp_path / "three.yaml"
    other.write_text(yaml.safe_dump(raw))
    run = cli("compare", "--trace", TRACE, "--quota", str(QUOTA), "--policy", "shares", "--policy", str(other))
    assert run.code == 2
    assert "replayed" not in run.stderr  # no policy ran
    assert "tenant='cluster02': no share named 'cluster02' in the quota (policy three)" in run.stderr
