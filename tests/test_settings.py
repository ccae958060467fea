"""The ``[quota] sql_alchemy_conn`` setting in all of Airflow's forms (``store/settings.py``):
a plain value without Airflow, a command (``_CMD``, ``sql_alchemy_conn_cmd``) run by Airflow's
``conf``, and clear refusals naming the setting when the command fails or Airflow is missing."""

from __future__ import annotations

import importlib.util
import os
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_quota.core.model import JobRequest
from airflow_quota.exceptions import InvalidInput
from airflow_quota.store.engine import make_engine, migrate
from airflow_quota.store.repository import QuotaStore
from airflow_quota.store.settings import ENV_URL, configured_url, database_url
from tests.conftest import cli

QUOTA: dict[str, Any] = {
    "pool": {"capacity": {"ml.g5.xlarge": 1}},
    "shares": [{"name": "q", "capacity_limits": {"ml.g5.xlarge": 1}}],
}


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty AIRFLOW_HOME, and none of the settings in the environment."""
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    for name in (ENV_URL, f"{ENV_URL}_CMD", f"{ENV_URL}_SECRET", "AIRFLOW_CONFIG", "AIRFLOW_CONN_QUOTA_DEFAULT"):
        monkeypatch.delenv(name, raising=False)
    yield tmp_path


def quota_db(path: Path) -> str:
    url = f"sqlite:///{path}"
    engine = make_engine(url)
    migrate(engine)
    store = QuotaStore(engine)
    store.apply_config(QUOTA)
    request = JobRequest(name="found-it", share="q", preferences=[{"instance_type": "ml.g5.xlarge", "count": 1}])
    store.submit(request, "fake")
    engine.dispose()
    return url


def test_a_cmd_setting_is_the_output_of_its_command(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(f"{ENV_URL}_CMD", "echo postgresql://quota@db:5432/quota")
    assert database_url() == "postgresql+psycopg://quota@db:5432/quota"
    monkeypatch.setenv(ENV_URL, "sqlite:////plain/wins.db")  # as in Airflow: the plain variable first
    assert database_url() == "sqlite:////plain/wins.db"


def test_the_cli_finds_its_database_through_a_cmd_setting(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = quota_db(home / "quota.db")
    monkeypatch.setenv(f"{ENV_URL}_CMD", f"echo {shlex.quote(url)}")
    run = cli("jobs", "list")
    assert run.code == 0 and "found-it" in run.stdout, run


def test_a_cmd_in_airflow_cfg_is_run_too(home: Path) -> None:
    url = quota_db(home / "quota.db")
    (home / "airflow.cfg").write_text(f"[quota]\nsql_alchemy_conn_cmd = echo {url}\n")
    run = cli("jobs", "list")
    assert run.code == 0 and "found-it" in run.stdout, run


def test_a_failing_command_is_refused_naming_the_setting(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(f"{ENV_URL}_CMD", "false")
    run = cli("jobs", "list")
    assert run.code == 2 and "Traceback" not in run.stderr, run
    assert run.stderr.startswith(f"{ENV_URL}_CMD: Airflow could not read it: "), run


def test_without_airflow_a_plain_value_is_read_and_a_command_refused(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "airflow" else real(name, *a))
    monkeypatch.setenv("QUOTA_DB_HOST", "db.internal")
    (home / "airflow.cfg").write_text("[quota]\nsql_alchemy_conn = postgresql://q@$QUOTA_DB_HOST/quota\n")
    assert configured_url() == "postgresql+psycopg://q@db.internal/quota"  # $VARS expanded, as Airflow does
    (home / "airflow.cfg").write_text("[quota]\nsql_alchemy_conn_cmd = cat /run/secrets/quota-url\n")
    with pytest.raises(InvalidInput) as refused:
        configured_url()
    assert str(refused.value) == (
        "[quota] sql_alchemy_conn_cmd: a command or secret is read by Airflow, which is not installed here: "
        f"set {ENV_URL} (or [quota] sql_alchemy_conn) to the URL itself"
    )
    assert os.environ.get(f"{ENV_URL}_CMD") is None
