"""The administration command line against a real database, as a user runs it: bad input that
changes nothing, an unreachable database, and the happy paths with a quota scheduler running."""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path

import pytest
import yaml
from sqlalchemy import Engine, func, select

from airflow_quota.core.human_time import clock_time, duration_words
from airflow_quota.store.engine import make_engine
from airflow_quota.store.models import ConfigVersion, EventRow, JobRow, Request
from airflow_quota.store.settings import normalize
from tests.conftest import CLI, ROOT, Run, cli
from tests.service.chaos import Env, Scheduler, cli_json
from tests.waiting import wait_for

UNREACHABLE = "postgresql://postgres@127.0.0.1:1/x"
PROBLEM = re.compile(r"^[\w./:\[\]-]+: .+")  # a field path, or file:line:column for YAML

QUOTA = {
    "pool": {"capacity": {"ml.g5.xlarge": 3}},
    "shares": [
        {
            "name": "qs1",
            "capacity_limits": {"ml.g5.xlarge": 1},
            "strategy": "LEND_AND_BORROW",
            "borrow_limit": 100,
            "in_share_preemption": True,
            "in_share_preemption_after_seconds": 0,  # preempts at once: these tests are about preemption
            "max_priority": 10,
            "preempted_alert_after": 1,
        },
        {"name": "qs2", "capacity_limits": {"ml.g5.xlarge": 1}, "strategy": "LEND"},
        {"name": "qs3", "capacity_limits": {"ml.g5.xlarge": 1}, "strategy": "RESERVE"},
    ],
}


def rows(engine: Engine) -> dict[str, int]:
    with engine.connect() as c:
        return {
            "configs": int(c.scalar(select(func.count()).select_from(ConfigVersion)) or 0),
            "requests": int(c.scalar(select(func.count()).select_from(Request)) or 0),
            "jobs": int(c.scalar(select(func.count()).select_from(JobRow)) or 0),
        }


def write(path: Path, document: object) -> str:
    path.write_text(yaml.safe_dump(document) if not isinstance(document, str) else document)
    return str(path)


def assert_problems(run: Run, file: str, *paths: str) -> list[str]:
    """Exit 2, no traceback, and on stderr ``file`` named once, first: ``FILE: message`` for the
    file as a whole, else a ``FILE:`` line and under it a ``path: message`` line per problem,
    each of ``paths`` named. Returns the problem lines."""
    assert run.code == 2, (run.code, run.stdout, run.stderr)
    assert "Traceback" not in run.stderr
    lines = run.stderr.strip().splitlines()
    assert lines[0].startswith(f"{file}:"), (file, lines)
    if lines[0] == f"{file}:":
        assert all(line.startswith("  ") for line in lines[1:]), lines
        problems = [line.strip() for line in lines[1:]]
    else:
        problems = lines
    assert problems and all(PROBLEM.match(line) for line in problems), lines
    for path in paths:
        assert any(line.startswith(f"{path}: ") for line in problems), (path, lines)
    return problems


@pytest.fixture
def migrated(postgres_url: str) -> tuple[str, Engine]:
    run = cli("db", "migrate", "--db", postgres_url)
    assert run.code == 0 and "migrated from nothing to revision" in run.stdout, run
    return postgres_url, make_engine(normalize(postgres_url))


# -- bad input ------------------------------------------------------------------------------


def test_apply_of_an_invalid_configuration_changes_nothing(migrated: tuple[str, Engine], tmp_path: Path) -> None:
    url, engine = migrated
    assert cli("apply", str(ROOT / "examples" / "quota.yaml"), "--db", url).code == 0
    before = rows(engine)
    assert before == {"configs": 1, "requests": 1, "jobs": 0}

    broken_quota = str(ROOT / "examples" / "broken-quota.yaml")
    broken = assert_problems(
        cli("apply", broken_quota, "--db", url),
        broken_quota,
        "shares[1].borrow_limit",
        "pool.capacity.ml.g5.xlarge",
    )
    assert len(broken) == 2
    many = {
        "pool": {"capacity": {"ml.g5.xlarge": 2, "ml.nope.huge": 1}},
        "shares": [
            {"name": "a", "capacity_limits": {"ml.g5.xlarge": 0}, "strategy": "HOARD"},
            {"name": "a", "capacity_limits": {"ml.g5.xlarge": 1}, "strategy": "RESERVE", "borrow_limit": 5},
        ],
    }
    many_file = write(tmp_path / "many.yaml", many)
    lines = assert_problems(
        cli("apply", many_file, "--db", url),
        many_file,
        "pool.capacity.ml.nope.huge",
        "shares[0].capacity_limits.ml.g5.xlarge",
        "shares[0].strategy",
        "shares[1].borrow_limit",  # the second share's mistake, named by its own index
    )
    assert len(lines) >= 4, lines  # every mistake, not only the first
    syntax = write(tmp_path / "syntax.yaml", "pool: [unclosed\n")
    assert_problems(cli("apply", syntax, "--db", url), f"{syntax}:2:1")
    listed = write(tmp_path / "list.yaml", [QUOTA])
    assert_problems(cli("apply", listed, "--db", url), listed)
    assert rows(engine) == before
    engine.dispose()


def test_an_invalid_job_submission_stores_nothing(migrated: tuple[str, Engine], tmp_path: Path) -> None:
    url, engine = migrated
    assert cli("apply", write(tmp_path / "quota.yaml", QUOTA), "--db", url).code == 0
    before = rows(engine)
    bad = {
        "name": "has spaces!",
        "share": "qs1",
        "priority": -1,
        "preferences": [{"instance_type": "ml.g5.xlarge", "count": 0}],
        "retry_attempts": 99,
        "backend": "fake",
    }
    bad_file = write(tmp_path / "bad.yaml", bad)
    lines = assert_problems(
        cli("jobs", "submit", bad_file, "--db", url),
        bad_file,
        "name",
        "priority",
        "retry_attempts",
    )
    assert any(line.startswith("preferences[0].count") or "count" in line for line in lines), lines
    # well-formed, but the quota refuses it: more instances than the share could ever hold
    refused = {"name": "too-big", "share": "qs3", "preferences": [{"instance_type": "ml.g5.xlarge", "count": 3}]}
    run = cli("jobs", "submit", write(tmp_path / "big.yaml", {**refused, "backend": "fake"}), "--db", url)
    assert run.code == 2 and run.stderr.strip() and "Traceback" not in run.stderr, run
    unknown = {"name": "nowhere", "share": "qs9", "preferences": [{"instance_type": "ml.g5.xlarge", "count": 1}]}
    run = cli("jobs", "submit", write(tmp_path / "unknown.yaml", {**unknown, "backend": "fake"}), "--db", url)
    assert run.code == 2 and "qs9" in run.stderr and "Traceback" not in run.stderr, run
    assert rows(engine) == before
    engine.dispose()


@pytest.mark.parametrize(
    "command",
    [
        ["db", "migrate"],
        ["shares", "--json"],
        ["jobs", "list"],
        ["jobs", "show", "x"],
        ["alerts"],
        ["apply", str(ROOT / "examples" / "quota.yaml")],
    ],
    ids=["db-migrate", "shares", "jobs-list", "jobs-show", "alerts", "apply"],
)
def test_an_unreachable_database_is_one_clear_line(command: list[str]) -> None:
    run = cli(*command, "--db", UNREACHABLE)
    assert run.code == 1, run
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert "Traceback" not in run.stderr and not run.stdout
    assert "127.0.0.1:1/x" in lines[0] and "unreachable" in lines[0], lines


def test_the_scheduler_keeps_retrying_an_unreachable_database(tmp_path: Path) -> None:
    """It logs one line per try, backs off, and is still running; SIGTERM then stops it."""
    log = tmp_path / "scheduler.log"
    with log.open("w") as out:
        command = [*CLI, "scheduler", "--db", UNREACHABLE, "--state-dir", str(tmp_path), "--poll-seconds", "0.05"]
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_for(  # Airflow's imports take seconds on a loaded machine
                lambda: proc.poll() is not None or log.read_text().count("unreachable") >= 3,
                60,
                lambda: f"three tries (or an exit) in the log:\n{log.read_text()}",
                interval=0.1,
            )
            alive = proc.poll() is None
            text = log.read_text()
            assert alive, f"the scheduler exited with {proc.returncode} instead of retrying:\n{text}"
            tries = [line for line in text.splitlines() if "unreachable" in line]
            assert len(tries) >= 2, text  # tried, waited, tried again
            assert all("127.0.0.1:1/x" in line and "retrying in" in line for line in tries), tries
            assert "Traceback" not in text
            delays = [float(m) for m in re.findall(r"retrying in ([\d.]+) s", text)]
            assert delays == sorted(delays) and delays[-1] > delays[0], f"no back-off: {delays}"
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=35) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


# -- happy paths ----------------------------------------------------------------------------


def test_the_admin_commands_with_a_scheduler_running(
    migrated: tuple[str, Engine], tmp_path: Path, schedulers: list[Scheduler]
) -> None:
    url, engine = migrated
    again = cli("db", "migrate", "--db", url)
    assert again.code == 0 and "is up to date (revision" in again.stdout, again
    applied = cli("apply", write(tmp_path / "quota.yaml", QUOTA), "--db", url)
    assert applied.code == 0 and "configuration version 1" in applied.stdout, applied
    scheduler = Scheduler(Env(url, tmp_path / "run"))
    schedulers.append(scheduler)
    scheduler.wait_for_log("leads the quota scheduler")

    def job(name: str, priority: int, duration: float) -> str:
        document = {
            "name": name,
            "share": "qs1",
            "priority": priority,
            "preferences": [{"instance_type": "ml.g5.xlarge", "count": 1}],
            "backend": "fake",
            "training": {"duration": duration},
        }
        return write(tmp_path / f"{name}.yaml", document)

    # the low jobs run far longer than the test (they are cancelled at its end), so a loaded
    # machine cannot let them finish before their priority changes
    submitted = cli_json(url, "jobs", "submit", job("low-a", 1, 600))
    assert isinstance(submitted, dict) and submitted["name"] == "low-a" and submitted["state"] == "SUBMITTED"
    cli_json(url, "jobs", "submit", job("low-b", 2, 600))

    def attempt_status(name: str) -> list[str]:
        shown = cli_json(url, "jobs", "show", name)
        assert isinstance(shown, dict)
        return [a["status"] for a in shown["attempts_detail"]]

    wait_for(lambda: attempt_status("low-a") == ["RUNNING"] and attempt_status("low-b") == ["RUNNING"], 20, "runs")
    shares = cli_json(url, "shares")
    assert isinstance(shares, dict)
    qs1 = next(s for s in shares["shares"] if s["share"] == "qs1")["types"]["ml.g5.xlarge"]
    assert (qs1["limit"], qs1["used"], qs1["borrowed"]) == (1, 2, 1), qs1
    qs2 = next(s for s in shares["shares"] if s["share"] == "qs2")["types"]["ml.g5.xlarge"]
    assert qs2["used"] == 0 and qs2["lent"] == 1.0, qs2

    # a higher priority preempts the lowest, most recently placed job of the share (in-share)
    cli_json(url, "jobs", "submit", job("high", 5, 1))
    wait_for(lambda: "STOPPED" in attempt_status("low-a"), 20, "low-a to be preempted")
    shown = cli_json(url, "jobs", "show", "low-a")
    assert isinstance(shown, dict)
    assert shown["preemptions"] == 1
    assert [(p["kind"], p["by"], p["attempt"]) for p in shown["preemptions_detail"]] == [("IN_SHARE", "high", 1)]
    assert any("PREEMPTED low-a" in line for line in shown["events"]), shown["events"]
    alerts = cli_json(url, "alerts")
    assert isinstance(alerts, dict)
    assert [(a["kind"], a["job"]) for a in alerts["alerts"]] == [("PREEMPTED_REPEATEDLY", "low-a")], alerts

    # the same for people: instants on a UTC clock, durations in words (core.human_time)
    preemption = shown["preemptions_detail"][0]
    text = cli("jobs", "show", "low-a", "--db", url)
    line = next(row for row in text.stdout.splitlines() if "IN_SHARE" in row)
    assert clock_time(preemption["at"], now=preemption["at"]) in line, text.stdout  # "14:20 UTC"
    assert line.rstrip().endswith(duration_words(preemption["lost_seconds"])), text.stdout
    assert f"waited {duration_words(shown['wait_seconds'])}" in text.stdout
    text = cli("alerts", "--db", url)
    assert clock_time(alerts["alerts"][0]["at"], now=alerts["alerts"][0]["at"]) in text.stdout, text.stdout

    listed = cli_json(url, "jobs", "list", "--share", "qs1")
    assert isinstance(listed, dict)
    assert {j["name"] for j in listed["jobs"]} == {"low-a", "low-b", "high"}
    assert cli_json(url, "jobs", "list", "--share", "qs2") == {"jobs": []}
    wait_for(lambda: attempt_status("high") == ["SUCCEEDED"], 20, "high to succeed")
    # low-a runs again (attempt 2) once high is done
    wait_for(lambda: attempt_status("low-a") == ["STOPPED", "RUNNING"], 20, "low-a's second attempt")

    # priorities: within max_priority it is taken in; above it, refused with exit 2
    ok = cli("jobs", "set-priority", "low-b", "7", "--db", url)
    assert ok.code == 0 and "priority 7" in ok.stdout, ok
    refused = cli("jobs", "set-priority", "low-b", "50", "--db", url)
    assert refused.code == 2 and "max_priority" in refused.stderr and "Traceback" not in refused.stderr, refused
    wait_for(lambda: _priority(engine, "low-b") == 7, 10, "the new priority to be taken in")
    with engine.connect() as c:
        changes = c.scalars(select(EventRow.type).where(EventRow.job == "low-b")).all()
    assert "PRIORITY_CHANGED" in changes

    for name in ("low-a", "low-b"):
        done = cli("jobs", "cancel", name, "--db", url)
        assert done.code == 0 and "cancel asked" in done.stdout, done
    wait_for(lambda: _states(url) == {"low-a": "FAILED", "low-b": "FAILED", "high": "SUCCEEDED"}, 20, "cancels")
    final = cli_json(url, "jobs", "list", "--state", "FAILED")
    assert isinstance(final, dict)
    assert {(j["name"], j["reason"]) for j in final["jobs"]} == {("low-a", "CANCELLED"), ("low-b", "CANCELLED")}
    again_cancel = cli("jobs", "cancel", "low-a", "--db", url)
    assert again_cancel.code == 2 and "already FAILED" in again_cancel.stderr, again_cancel
    wait_for(lambda: _used(url) == 0, 10, "the capacity to be given back")
    missing = cli("jobs", "show", "nobody", "--db", url, "--json")
    assert missing.code == 2 and missing.stderr.startswith("job: "), missing
    engine.dispose()


def _priority(engine: Engine, name: str) -> int | None:
    with engine.connect() as c:
        return c.scalar(select(JobRow.priority).where(JobRow.name == name))


def _states(url: str) -> dict[str, str]:
    listed = cli_json(url, "jobs", "list")
    assert isinstance(listed, dict)
    return {j["name"]: j["state"] for j in listed["jobs"]}


def _used(url: str) -> int:
    shares = cli_json(url, "shares")
    assert isinstance(shares, dict)
    return sum(t["used"] for s in shares["shares"] for t in s["types"].values())
