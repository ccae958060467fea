"""``airflow-quota doctor`` against a real Airflow 3.3 (scheduler, dag-processor, triggerer,
api-server) and a quota scheduler, on PostgreSQL, with DAGs whose tasks use ``executor="quota"``.

Doctor runs as a subprocess in the stack's environment, as an operator would run it beside an
Airflow component. First every line holds (exit 0, the same checks in ``--json``); then each
wire is broken and its line fails with the fix (exit 1): the cheap breaks through doctor's own
environment (a connection to a missing database, a connection and a setting naming different
databases, an empty quota database, one without a configuration, an executor setting without
QuotaExecutor, a base URL where the api-server serves no Quotas page), then the real ones by
stopping processes, last, so one stack serves every test: the triggerer, the quota scheduler,
the api-server.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from airflow_quota.devtools.stack import BIN, AirflowStack
from tests.airflow.stacks import ADMIN_URL, EXECUTOR_DAGS, airflow_on_postgres
from tests.postgres import fresh_database
from tests.waiting import wait_for

# Airflow's start (about a minute on two cores) and a dozen doctor runs of a few seconds each.
pytestmark = pytest.mark.timeout(600)

CHECKS = (
    "quota database",
    "configuration",
    "quota scheduler",
    "executor",
    "connection",
    "plugin",
    "triggerer",
    "execution API",
)


@dataclass
class Diagnosis:
    """One doctor run: its exit status, its checks by name, and what it printed."""

    code: int
    checks: dict[str, dict[str, Any]]
    output: str

    def failed(self) -> set[str]:
        return {name for name, check in self.checks.items() if not check["ok"]}


@pytest.fixture(scope="module")
def airflow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AirflowStack]:
    with airflow_on_postgres(
        "doctor",
        tmp_path_factory.mktemp("airflow-doctor"),
        dags=[EXECUTOR_DAGS / "quota_exec_training.py", EXECUTOR_DAGS / "quota_exec_shares.py"],
        quota_config=EXECUTOR_DAGS / "quota.yaml",
        wait_for_dags=("quota_exec_blocker", "quota_exec_shares"),
        start_timeout=300.0,
    ) as stack:
        health = stack.store.scheduler_health
        wait_for(lambda: health().leader is not None and not health().down, 60, "the quota scheduler leading")
        yield stack


def doctor(af: AirflowStack, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``airflow-quota doctor ARGS`` in the stack's environment with ``env`` on top."""
    return subprocess.run(
        [str(BIN / "airflow-quota"), "doctor", *args],
        env=af.env | env,
        capture_output=True,
        text=True,
        timeout=180,
    )


def diagnose(af: AirflowStack, **env: str) -> Diagnosis:
    """A ``--json`` run, its document parsed (only the JSON on standard output)."""
    done = doctor(af, "--json", **env)
    document = json.loads(done.stdout)
    assert document["ok"] is (done.returncode == 0), done.stdout
    assert [check["name"] for check in document["checks"]] == list(CHECKS), done.stdout
    return Diagnosis(done.returncode, {c["name"]: c for c in document["checks"]}, done.stdout + done.stderr)


def failing(af: AirflowStack, name: str, timeout: float) -> Diagnosis:
    """Run doctor until the check ``name`` fails (a process stopped: its heartbeat goes stale)."""
    runs: list[Diagnosis] = []

    def fails() -> bool:
        runs.append(diagnose(af))
        return name in runs[-1].failed()

    wait_for(fails, timeout, lambda: f"the {name} line failing; last run:\n{runs[-1].output}", interval=1.0)
    return runs[-1]


@pytest.fixture
def other_database() -> Iterator[str]:
    """A fresh, empty PostgreSQL database's URL, dropped afterwards."""
    with fresh_database(ADMIN_URL) as url:
        yield url


def test_every_line_holds_on_a_wired_installation(airflow: AirflowStack) -> None:
    done = doctor(airflow)
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout + done.stderr
    assert [line[:4] for line in lines] == ["ok  "] * len(CHECKS), done.stdout
    assert [line[5:20].strip() for line in lines] == list(CHECKS), done.stdout
    assert "Traceback" not in done.stderr

    checks = diagnose(airflow).checks
    assert all(check["ok"] and check["fix"] is None for check in checks.values()), checks
    database = checks["quota database"]["detail"]
    assert database.endswith("(head)") and airflow.quota_url.rsplit("/", 1)[1] in database
    assert "version 1 (4 shares)" in checks["configuration"]["detail"]
    scheduler = checks["quota scheduler"]["detail"]
    assert " leads, heartbeat " in scheduler and "airflow, local" in scheduler, scheduler
    assert "QuotaExecutor as 'quota', used by 2 DAGs" in checks["executor"]["detail"]
    assert "AIRFLOW_CONN_QUOTA_DEFAULT" in checks["connection"]["detail"]
    assert airflow.api_url in checks["plugin"]["detail"]
    assert "TriggererJob" in checks["triggerer"]["detail"]
    assert '{"status":"healthy"}' in checks["execution API"]["detail"]


def test_a_connection_to_a_missing_database_fails_the_database_line(airflow: AirflowStack) -> None:
    missing = f"{ADMIN_URL.rsplit('/', 1)[0]}/no_such_quota_db"
    found = diagnose(airflow, AIRFLOW_CONN_QUOTA_DEFAULT=missing)
    assert found.code == 1
    assert found.failed() == {"quota database", "configuration", "quota scheduler"}, found.output
    database = found.checks["quota database"]
    assert "no_such_quota_db" in database["detail"] and "does not exist" in database["detail"]
    assert database["fix"] == "start that database, or correct AIRFLOW_CONN_QUOTA_DEFAULT"
    assert "not checked" in found.checks["configuration"]["detail"]


def test_a_connection_and_a_setting_naming_two_databases_fail_the_connection_line(airflow: AirflowStack) -> None:
    missing = f"{ADMIN_URL.rsplit('/', 1)[0]}/no_such_quota_db"
    found = diagnose(airflow, AIRFLOW_CONN_QUOTA_DEFAULT=missing, AIRFLOW__QUOTA__SQL_ALCHEMY_CONN=airflow.quota_url)
    assert found.code == 1
    assert found.failed() == {"connection"}, found.output
    connection = found.checks["connection"]
    assert "no_such_quota_db" in connection["detail"] and "another database" in connection["detail"]
    assert connection["fix"] == "make the connection and the setting name the same database"


def test_an_empty_quota_database_then_one_without_a_configuration(airflow: AirflowStack, other_database: str) -> None:
    empty = diagnose(airflow, AIRFLOW_CONN_QUOTA_DEFAULT=other_database)
    assert empty.code == 1
    assert "has no quota tables" in empty.checks["quota database"]["detail"]
    assert empty.checks["quota database"]["fix"].startswith('run "airflow-quota db migrate" here')

    migrated = subprocess.run(
        [str(BIN / "airflow-quota"), "db", "migrate"],
        env=airflow.env | {"AIRFLOW_CONN_QUOTA_DEFAULT": other_database},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert migrated.returncode == 0, migrated.stderr
    unconfigured = diagnose(airflow, AIRFLOW_CONN_QUOTA_DEFAULT=other_database)
    assert unconfigured.failed() == {"configuration", "quota scheduler"}, unconfigured.output
    assert unconfigured.checks["configuration"]["detail"] == "none applied"
    assert unconfigured.checks["configuration"]["fix"] == 'run "airflow-quota apply quota.yaml"'
    assert "no quota scheduler has ever led" in unconfigured.checks["quota scheduler"]["detail"]


def test_an_executor_setting_without_quota_executor_fails_the_executor_line(airflow: AirflowStack) -> None:
    done = doctor(airflow, AIRFLOW__CORE__EXECUTOR="LocalExecutor")
    assert done.returncode == 1
    line = next(line for line in done.stdout.splitlines() if line[5:20].strip() == "executor")
    assert line.startswith("FAIL executor ")
    assert 'tasks use executor="quota" in quota_exec_blocker, quota_exec_shares' in line
    assert "[core] executor = 'LocalExecutor' does not configure" in line
    assert line.endswith(
        "set [core] executor (AIRFLOW__CORE__EXECUTOR) to 'LocalExecutor,quota:airflow_quota.executors.QuotaExecutor'"
        ", where the scheduler runs too, and restart the scheduler"
    )


def test_a_base_url_where_the_api_server_serves_no_quotas_page_fails_the_plugin_line(airflow: AirflowStack) -> None:
    """What doctor sees where the plugin is not loaded: the Airflow UI's HTML, which the
    api-server answers for any path it does not know, here one under another prefix."""
    found = diagnose(airflow, AIRFLOW__API__BASE_URL=f"{airflow.api_url}/elsewhere")
    assert found.failed() == {"plugin"}, found.output
    plugin = found.checks["plugin"]
    assert plugin["detail"] == (
        f"the api-server at {airflow.api_url}/elsewhere does not serve the Quotas page "
        "(GET /quota/openapi.json: HTTP 200 text/html; charset=utf-8)"
    )
    assert plugin["fix"].startswith("install airflow-quota in the api-server's environment and restart it")


def test_a_stopped_triggerer_fails_the_triggerer_line(airflow: AirflowStack) -> None:
    airflow.stop(["triggerer"])
    found = failing(airflow, "triggerer", 90)
    assert found.code == 1 and found.failed() == {"triggerer"}, found.output
    assert found.checks["triggerer"]["detail"].startswith("no live TriggererJob")
    assert found.checks["triggerer"]["fix"].startswith('start "airflow triggerer"')


def test_a_stopped_quota_scheduler_fails_the_scheduler_line(airflow: AirflowStack) -> None:
    airflow.stop(["quota-scheduler"])
    found = failing(airflow, "quota scheduler", 60)
    assert found.failed() == {"triggerer", "quota scheduler"}, found.output
    assert found.checks["quota scheduler"]["detail"].startswith("none leads")
    assert found.checks["quota scheduler"]["fix"].startswith('start one: "airflow-quota scheduler"')


def test_a_stopped_api_server_fails_the_plugin_and_execution_api_lines(airflow: AirflowStack) -> None:
    airflow.stop(["api-server"])
    found = failing(airflow, "plugin", 60)
    assert {"plugin", "execution API"} <= found.failed(), found.output
    assert found.checks["plugin"]["detail"].startswith(f"the api-server does not answer at {airflow.api_url}")
    assert found.checks["plugin"]["fix"] == 'start "airflow api-server"'
    assert found.checks["execution API"]["detail"].startswith(f"nothing answers at {airflow.api_url}/execution/health")
