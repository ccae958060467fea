"""What the quota scheduler imports before it can lead (issue 39): only what leading needs.

A new leader's start is part of every failover: with Airflow's configuration imported to settle
metrics, and botocore with the SageMaker backend, a start on a loaded machine took tens of
seconds before the first decision (``benchmarks/scheduler_start.py``, BENCHMARKS.md). Here a
real ``airflow-quota scheduler`` runs under ``python -X importtime`` on a fresh database with one
job waiting, until it has placed it; every module it imported up to then is read from
importtime's lines. The control run with metrics on in Airflow's ``[metrics]`` shows the same
reading does see Airflow when the scheduler imports it.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_quota.service.metrics import metrics_may_be_on
from airflow_quota.store.backend_names import TEST_BACKENDS_VARIABLE
from tests.builders import request
from tests.conftest import missing
from tests.service.chaos import POOL, prepared
from tests.waiting import wait_for

NOT_BEFORE_THE_FIRST_DECISION = (
    "airflow",  # Airflow's configuration: only when [metrics] may turn metrics on
    "boto3",  # the SageMaker backend's SDK: only once a SageMaker job is started or followed
    "botocore",
    "matplotlib",  # the simulator's plots
    "numpy",
    "airflow_quota.sim.simulator",
    "airflow_quota.sim.traces",
    "airflow_quota.plugins",
    "airflow_quota.hooks",
    "airflow_quota.operators",
    "airflow_quota.executors",
)
"""Packages and modules the scheduler's command must not import before its first decision."""
MAIN = "import sys; from airflow_quota.cli import main; sys.exit(main())"
"""``airflow-quota``'s console script (``pyproject.toml``: ``airflow_quota.cli:main``)."""


def imported_until_first_decision(tmp_path: Path, extra_env: dict[str, str]) -> list[str]:
    """The modules a real ``airflow-quota scheduler`` imported until it placed the one job
    waiting on a fresh SQLite database, in a fresh ``AIRFLOW_HOME`` (no ``airflow.cfg``)."""
    url = f"sqlite:///{tmp_path / 'quota.db'}"
    engine, store = prepared(url, POOL)
    store.submit(request("first", "research", ("ml.g5.xlarge", 1)), "fake", {"duration": 3600})
    engine.dispose()
    (tmp_path / "home").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env |= {"AIRFLOW_HOME": str(tmp_path / "home"), TEST_BACKENDS_VARIABLE: "fake", "PYTHONUNBUFFERED": "1"}
    env |= extra_env
    log_path = tmp_path / "scheduler.log"
    command = [sys.executable, "-X", "importtime", "-c", MAIN, "scheduler", "--db", url]
    command += ["--state-dir", str(tmp_path / "state"), "--poll-seconds", "0.05"]
    with log_path.open("w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
        try:
            wait_for(
                lambda: " PLACED first " in log_path.read_text() or proc.poll() is not None,
                timeout=120,
                what=lambda: f"the first decision in the scheduler's log:\n{log_path.read_text()[-3000:]}",
            )
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    text = log_path.read_text()
    assert " PLACED first " in text, f"the scheduler exited ({proc.returncode}) before placing the job:\n{text}"
    until = text.split(" PLACED first ")[0]
    lines = [line.split("|", 2)[2].strip() for line in until.splitlines() if line.startswith("import time:")]
    return [name for name in lines if name != "imported package"]  # importtime's header names its columns


def forbidden(modules: list[str]) -> list[str]:
    return sorted({m for m in modules for f in NOT_BEFORE_THE_FIRST_DECISION if m == f or m.startswith(f"{f}.")})


def test_the_scheduler_leads_and_decides_without_airflow_botocore_or_the_simulator(tmp_path: Path) -> None:
    modules = imported_until_first_decision(tmp_path, {})
    assert "airflow_quota.service.scheduler" in modules  # the reading sees the scheduler's own imports
    assert "sqlalchemy" in modules
    assert forbidden(modules) == []


def test_with_metrics_on_in_airflow_the_scheduler_does_import_airflow(tmp_path: Path) -> None:
    """The control: the same reading finds Airflow when the scheduler needs it for metrics."""
    if importlib.util.find_spec("airflow") is None:
        missing("Airflow is not installed: the control needs the scheduler to import it")
    modules = imported_until_first_decision(
        tmp_path, {"AIRFLOW__METRICS__STATSD_ON": "True", "AIRFLOW__METRICS__STATSD_PORT": "9"}
    )
    assert "airflow.sdk.configuration" in modules
    assert "airflow" in forbidden(modules)


@pytest.mark.parametrize(
    ("environment", "config_file", "may_be_on"),
    [
        ({}, None, False),  # Airflow's defaults: every switch False
        ({"AIRFLOW__METRICS__STATSD_ON": "False", "AIRFLOW__METRICS__OTEL_ON": "0"}, None, False),
        ({"AIRFLOW__METRICS__STATSD_ON": " F  # off for now"}, None, False),  # as Airflow's getboolean reads it
        ({"AIRFLOW__METRICS__STATSD_ON": "True"}, None, True),
        ({"AIRFLOW__METRICS__OTEL_ON": "1"}, None, True),
        ({"AIRFLOW__METRICS__STATSD_DATADOG_ENABLED": "t"}, None, True),
        ({"AIRFLOW__METRICS__STATSD_ON": "maybe"}, None, True),  # Airflow refuses it: left to Airflow to say so
        ({"AIRFLOW__METRICS__STATSD_ON_CMD": "echo True"}, None, True),  # only Airflow runs a command
        ({}, "[metrics]\nstatsd_on = True\n", True),
        ({}, "[metrics]\notel_on = False\nstatsd_on = false\n", False),
        ({}, "[metrics]\nstatsd_on_secret = metrics-switch\n", True),
        ({"AIRFLOW__METRICS__STATSD_ON": "False"}, "[metrics]\nstatsd_on = True\n", False),  # the variable wins
        ({"SWITCH": "True"}, "[metrics]\nstatsd_on = $SWITCH\n", True),  # $VARS expanded, as Airflow does
    ],
)
def test_whether_metrics_may_be_on_is_read_as_airflow_reads_it_without_importing_it(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    environment: dict[str, str],
    config_file: str | None,
    may_be_on: bool,
) -> None:
    for name in list(os.environ):
        if name.startswith("AIRFLOW"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    if config_file is not None:
        (tmp_path / "airflow.cfg").write_text(config_file)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert metrics_may_be_on() is may_be_on
