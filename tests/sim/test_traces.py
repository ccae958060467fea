"""Trace importers (issue 6): the ITP format and the generic CSV format with a column mapping,
on small excerpts of the real trace (tests/sim/data/), through the library and the command
line: good rows, bad rows (refused, or skipped with --skip-bad-rows), an empty file."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest

from airflow_quota.core.config import load_config, parse_config
from airflow_quota.exceptions import InvalidInput
from airflow_quota.sim.traces import ColumnMap, parse_columns, parse_spec, read_trace, trace_scenario
from tests.conftest import ROOT, cli

DATA = Path(__file__).resolve().parent / "data"
ITP = DATA / "itp"
QUOTA = DATA / "itp-quota.yaml"
GENERIC_QUOTA = DATA / "generic-quota.yaml"
EXCERPT_FILES = sorted(ITP.glob("*.csv"))


def csv_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def all_excerpt_rows() -> list[dict[str, str]]:
    return [dict(row, tenant=path.stem) for path in EXCERPT_FILES for row in csv_rows(path)]


# --------------------------------------------------------------------------- the itp format


def test_itp_directory_reads_every_row_of_every_cluster_file() -> None:
    trace = read_trace(f"itp:{ITP}")
    expected = all_excerpt_rows()
    assert trace.problems == []
    assert len(trace.rows) == len(expected) == 43
    origin = min(float(r["submission_time"]) for r in expected)
    by_name = {row.name: row for row in trace.rows}
    for raw in expected:
        row = by_name[raw["job_id"]]
        assert (row.tenant, row.submit, row.duration, row.gpus) == (
            raw["tenant"],
            float(raw["submission_time"]) - origin,
            float(raw["duration"]),
            int(raw["num_gpu"]),
        )
    # one timeline across the files, in submission order, starting at 0
    submits = [row.submit for row in trace.rows]
    assert submits == sorted(submits)
    assert submits[0] == 0
    assert {row.tenant for row in trace.rows} == {"cluster02", "cluster04", "cluster07", "cluster08"}


def test_itp_single_file_is_one_tenant() -> None:
    trace = read_trace(f"itp:{ITP / 'cluster07.csv'}")
    assert len(trace.rows) == len(csv_rows(ITP / "cluster07.csv"))
    assert {row.tenant for row in trace.rows} == {"cluster07"}


def test_itp_jobs_become_instances_of_the_pool_type() -> None:
    """The pool's type has one GPU: a job asking 16 GPUs asks 16 instances; with 8-GPU
    instances it asks ceil(16 / 8) = 2, and a 1-GPU job still takes a whole instance."""
    trace = read_trace(f"itp:{ITP}")
    gpus = {row.name: row.gpus for row in trace.rows}
    one_gpu = trace_scenario(trace, load_config(QUOTA)).scenario
    counts = {e.submit.name: e.submit.preferences[0].count for e in one_gpu.events if e.submit}
    assert counts == gpus
    raw = load_config(QUOTA).model_dump(mode="python", exclude_none=True)
    raw["pool"]["capacity"] = {"ml.p3.16xlarge": 8}
    for share in raw["shares"]:
        share["capacity_limits"] = {"ml.p3.16xlarge": 2}
    eight_gpu = trace_scenario(trace, parse_config(raw)).scenario
    counts = {e.submit.name: e.submit.preferences[0].count for e in eight_gpu.events if e.submit}
    assert counts == {name: -(-g // 8) for name, g in gpus.items()}
    assert {e.submit.preferences[0].instance_type for e in eight_gpu.events if e.submit} == {"ml.p3.16xlarge"}


def test_simulate_replays_an_itp_trace() -> None:
    run = cli("simulate", "--trace", f"itp:{ITP}", "--quota", str(QUOTA), "--json")
    assert run.code == 0, run.stderr
    report = run.json()
    assert len(report["jobs"]) == 43
    assert {j["state"] for j in report["jobs"].values()} == {"SUCCEEDED"}
    assert set(report["shares"]) == {"cluster02", "cluster04", "cluster07", "cluster08"}
    # every job's GPU-hours are its trace duration times its GPUs: no job was preempted here
    rows = {r["job_id"]: r for r in all_excerpt_rows()}
    for name, job in report["jobs"].items():
        if job["preemptions"] == 0:
            expected = float(rows[name]["duration"]) * int(rows[name]["num_gpu"]) / 3600
            assert job["gpu_hours"] == pytest.approx(expected, abs=1e-5)


# --------------------------------------------------------------------------- bad rows, empty file

BAD = DATA / "itp-bad" / "cluster08.csv"
BAD_LINES = [
    (f"{BAD}:4", "duration='two hours': must be a number of seconds > 0"),
    (f"{BAD}:5", "3 fields where the header has 4"),
    (f"{BAD}:6", "num_gpu='0': must be an integer ≥ 1"),
]


def test_bad_rows_refuse_the_trace_naming_file_line_field_and_rule() -> None:
    run = cli("simulate", "--trace", f"itp:{BAD.parent}", "--quota", str(QUOTA), "--json")
    assert run.code == 2
    assert run.stdout == ""
    assert "Traceback" not in run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == len(BAD_LINES)
    for line, (where, message) in zip(lines, BAD_LINES, strict=True):
        assert line.startswith(f"{where}: {message}"), line


def test_skip_bad_rows_replays_the_good_ones_and_lists_the_skipped() -> None:
    run = cli("simulate", "--trace", f"itp:{BAD.parent}", "--quota", str(QUOTA), "--json", "--skip-bad-rows")
    assert run.code == 0, run.stderr
    assert len(run.json()["jobs"]) == 5
    assert "skipped 3 bad rows" in run.stderr
    for where, message in BAD_LINES:
        assert f"{where}: {message}" in run.stderr


@pytest.mark.parametrize(
    ("trace", "expected"),
    [
        (
            f"itp:{DATA / 'empty'}",
            "empty/cluster09.csv:1: the file is empty: expected a header with the columns job_id",
        ),
        (f"itp:{DATA / 'nowhere'}", "nowhere: no such file or directory"),
        (f"itp:{DATA / 'generic.csv'}", "generic.csv:1: no column submission_time (submit)"),
        ("parquet:x", "--trace: 'parquet:x' must be FORMAT:PATH with FORMAT one of itp, csv"),
        (f"csv:{DATA / 'generic.csv'}", "--columns: the csv format needs a column mapping"),
    ],
    ids=[
        "an empty file",
        "a missing path",
        "a file without the itp header",
        "an unknown format",
        "csv without mapping",
    ],
)
def test_unreadable_traces_are_refused_even_with_skip_bad_rows(trace: str, expected: str) -> None:
    """A file-level problem is not a bad row: nothing of the file can be read."""
    run = cli("simulate", "--trace", trace, "--quota", str(QUOTA), "--skip-bad-rows")
    assert run.code == 2
    assert "Traceback" not in run.stderr
    assert expected in run.stderr


def test_a_tenant_without_a_share_is_a_bad_row() -> None:
    raw = load_config(QUOTA).model_dump(mode="python", exclude_none=True)
    raw["shares"] = [s for s in raw["shares"] if s["name"] != "cluster02"]
    raw["shares"][0]["capacity_limits"] = {"ml.p3.2xlarge": 16}
    trace = read_trace(f"itp:{ITP}")
    with pytest.raises(InvalidInput) as refused:
        trace_scenario(trace, parse_config(raw))
    assert len(refused.value.problems) == 3
    assert all(p.path.startswith(f"{ITP / 'cluster02.csv'}:") for p in refused.value.problems)
    assert "tenant='cluster02': no share named 'cluster02' in the quota" in refused.value.problems[0].message
    skipped = trace_scenario(trace, parse_config(raw), skip_bad_rows=True)
    assert len(skipped.skipped) == 3
    assert len(skipped.scenario.events) == 40


# --------------------------------------------------------------------------- the generic csv format

GENERIC = DATA / "generic.csv"
INLINE = "submit=submitted,duration=runtime_s,gpus=gpu_count,tenant=team,priority=prio,instance_type=type,name=id"


@pytest.mark.parametrize("columns", [INLINE, f"@{DATA / 'generic-columns.yaml'}"], ids=["inline", "mapping file"])
def test_generic_csv_with_a_column_mapping(columns: str) -> None:
    run = cli("simulate", "--trace", f"csv:{GENERIC}", "--columns", columns, "--quota", str(GENERIC_QUOTA), "--json")
    assert run.code == 0, run.stderr
    report = run.json()
    placed = {e["job"]: (e["t"], e["instance_type"], e["count"]) for e in report["events"] if e["type"] == "PLACED"}
    # timestamps become seconds from the first submission; 12 GPUs on 4-GPU instances are 3;
    # a row without a type takes its share's only type
    assert placed == {
        "train-a1": (0, "ml.p3.2xlarge", 4),
        "train-a2": (0, "ml.p3.8xlarge", 3),
        "train-b1": (600, "ml.p3.2xlarge", 1),
        "train-b2": (1800, "ml.p3.2xlarge", 3),
    }
    priorities = {name: job["priority"] for name, job in report["jobs"].items()}
    assert priorities == {"train-a1": 5, "train-a2": 1, "train-b1": 0, "train-b2": 9}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("submit=a,duration=b,gpus=c,tenant=d", ColumnMap("a", "b", "c", "d")),
        (" submit = a , duration=b,gpus=c,tenant=d,priority=p, ", ColumnMap("a", "b", "c", "d", priority="p")),
    ],
    ids=["the four required fields", "spaces and an optional field"],
)
def test_parse_columns(text: str, expected: ColumnMap) -> None:
    assert parse_columns(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("submit=a,duration=b,gpus=c", ["--columns.tenant: required field is missing"]),
        (
            "submit=a,duration=b,gpus=c,tenant=d,user=e",
            ["--columns.user: unknown field; the fields are submit, duration, gpus, tenant, priority"],
        ),
        ("submit=a,duration", ["--columns: 'duration' must be field=column"]),
    ],
    ids=["a required field missing", "an unknown field", "no '='"],
)
def test_bad_column_mappings(text: str, expected: list[str]) -> None:
    with pytest.raises(InvalidInput) as refused:
        parse_columns(text)
    shown = [str(p) for p in refused.value.problems]
    assert len(shown) == len(expected)
    for line, start in zip(shown, expected, strict=True):
        assert line.startswith(start), line


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        (["j1,t,0,60,1"], []),
        (["j1,t,-5,60,1"], ["submit='-5': must be ≥ 0 seconds"]),
        (["j1,t,yesterday,60,1"], ["submit='yesterday': must be seconds (a number) or an ISO 8601 timestamp"]),
        (["j1,t,0,0,1"], ["duration='0': must be a number of seconds > 0"]),
        (["j1,t,0,60,1.5"], ["gpus='1.5': must be an integer ≥ 1"]),
        (["j1,,0,60,1"], ["tenant='': must not be empty"]),
        (["j 1,t,0,60,1"], ["name='j 1': a job name is 1-128 letters, digits"]),
        (["j1,t,0,60,1", "j1,t,5,60,1"], ["name='j1': job names must be unique"]),
        (["j1,t,0,60,1", "j2,t,2026-12-01T00:00:00,60,1"], ["submit times mix timestamps and seconds"]),
    ],
    ids=[
        "a good row",
        "a negative time",
        "a time that is no time",
        "a zero duration",
        "a fractional GPU count",
        "no tenant",
        "a name with a space",
        "a duplicate name",
        "mixed timestamps and seconds",
    ],
)
def test_generic_row_rules(tmp_path: Path, rows: list[str], expected: list[str]) -> None:
    path = tmp_path / "jobs.csv"
    path.write_text("name,tenant,submit,duration,gpus\n" + "\n".join(rows) + "\n")
    columns = parse_columns("submit=submit,duration=duration,gpus=gpus,tenant=tenant,name=name")
    try:
        problems = [str(p) for p in read_trace(f"csv:{path}", columns).problems]
    except InvalidInput as exc:
        problems = [str(p) for p in exc.problems]
    assert len(problems) == len(expected), problems
    for line, message in zip(problems, expected, strict=True):
        assert message in line, line


def test_parse_spec() -> None:
    assert parse_spec("itp:data/traces/itp-2021") == ("itp", Path("data/traces/itp-2021"))
    with pytest.raises(InvalidInput):
        parse_spec("itp")


def test_the_shipped_excerpt_is_unchanged_rows_of_the_trace() -> None:
    """examples/traces/itp-excerpt holds rows of the whole trace (data/traces/itp-2021), unchanged."""
    trace = ROOT / "data" / "traces" / "itp-2021"
    excerpt = ROOT / "examples" / "traces" / "itp-excerpt"
    files = sorted(excerpt.glob("*.csv"))
    assert files
    for path in files:
        original: set[tuple[Any, ...]] = {tuple(r.values()) for r in csv_rows(trace / path.name)}
        rows = {tuple(r.values()) for r in csv_rows(path)}
        assert rows <= original


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--trace", f"itp:{ITP}"], "--quota: --trace needs the quota configuration to replay it on"),
        (["--quota", str(QUOTA)], "--quota: only goes with --trace"),
        ([], "simulate: give a scenario file, or --trace FORMAT:PATH with --quota"),
        (
            [str(ROOT / "examples" / "walkthrough.yaml"), "--trace", f"itp:{ITP}", "--quota", str(QUOTA)],
            "simulate: give a scenario file or --trace, not both",
        ),
        (
            ["--trace", f"itp:{ITP}", "--quota", str(QUOTA), "--columns", "submit=a"],
            "--columns: the itp format has fixed columns; --columns is for csv",
        ),
        (["--trace", f"itp:{ITP}", "--quota", str(DATA / "missing.yaml")], "missing.yaml: cannot read the file"),
    ],
    ids=[
        "a trace without a quota",
        "a quota without a trace",
        "neither scenario nor trace",
        "both scenario and trace",
        "columns for the itp format",
        "a missing quota file",
    ],
)
def test_simulate_refuses_bad_trace_arguments(args: list[str], expected: str) -> None:
    run = cli("simulate", *args)
    assert run.code == 2
    assert run.stdout == ""
    assert "Traceback" not in run.stderr
    assert expected in run.stderr
