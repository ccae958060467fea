"""airflow-quota registered as an Airflow provider (``airflow_quota/get_provider_info.py`` and
the ``apache_airflow_provider`` entry point): Airflow's ``ProvidersManager`` finds the package,
the quota connection type with its hook, the extra link and the notifier, and a connection of
that type reaches the quota database."""

from __future__ import annotations

import json
from pathlib import Path

import airflow
import jsonschema
import pytest
from airflow.sdk import Connection

from airflow_quota.get_provider_info import get_provider_info
from airflow_quota.hooks.quota import QuotaHook, connection_url
from airflow_quota.store.engine import make_engine, migrate
from airflow_quota.store.repository import QuotaStore
from tests.airflow.conftest import QUOTA


def test_the_provider_info_follows_airflows_schema() -> None:
    schema = json.loads((Path(airflow.__file__).parent / "provider_info.schema.json").read_text())
    jsonschema.validate(get_provider_info(), schema)


def test_providers_manager_lists_the_package_its_hook_link_and_notifier() -> None:
    from airflow.providers_manager import ProvidersManager
    from airflow.sdk.providers_manager_runtime import ProvidersManagerTaskRuntime

    manager = ProvidersManager()
    provider = manager.providers["airflow-quota"]
    assert provider.data["name"] == "Airflow Quota"
    hook = ProvidersManagerTaskRuntime().hooks["quota"]
    assert hook is not None
    assert (hook.hook_class_name, hook.connection_id_attribute_name, hook.hook_name, hook.package_name) == (
        "airflow_quota.hooks.quota.QuotaHook",
        "quota_conn_id",
        "Airflow Quota",
        "airflow-quota",
    )
    for link in ("QuotaJobLink", "SageMakerTrainingJobLink", "TrainingLogsLink"):
        assert f"airflow_quota.plugins.links.{link}" in manager.extra_links_class_names
    assert "airflow_quota.notifications.log.QuotaLogNotifier" in manager.notification
    assert "airflow_quota.executors.QuotaExecutor" in manager.executor_class_names
    assert manager.field_behaviours["quota"]["relabeling"] == {"schema": "Database"}


@pytest.mark.parametrize(
    ("connection", "url"),
    [
        (
            Connection(conn_id="q", conn_type="quota", host="db", schema="quota", login="u", password="p", port=5432),
            "postgresql+psycopg://u:p@db:5432/quota",
        ),
        (
            Connection(conn_id="q", conn_type="quota", extra=json.dumps({"sql_alchemy_conn": "sqlite:////x/quota.db"})),
            "sqlite:////x/quota.db",
        ),
    ],
    ids=["a PostgreSQL database by its fields", "any database by sql_alchemy_conn in the extra"],
)
def test_a_quota_connection_names_the_quota_database(connection: Connection, url: str) -> None:
    assert connection_url(connection) == url


def test_the_hook_reads_through_a_quota_connection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'quota.db'}"
    engine = make_engine(url)
    migrate(engine)
    QuotaStore(engine).apply_config(QUOTA)
    uri = Connection(conn_id="team_quota", conn_type="quota", extra=json.dumps({"sql_alchemy_conn": url})).get_uri()
    monkeypatch.setenv("AIRFLOW_CONN_TEAM_QUOTA", uri)
    ok, message = QuotaHook("team_quota").test_connection()
    assert ok and message.endswith("answers: configuration version 1"), message
    engine.dispose()


def test_airflows_own_commands_print_no_warning_ahead_of_their_json(tmp_path: Path) -> None:
    """Airflow 3.3 warns, on standard output, at every ``airflow`` command, about a provider
    that ships an executor without a ``cli`` section ("Please define the 'cli' section ..."):
    ``airflow plugins -o json`` would then not be JSON. The real command, in a fresh
    ``AIRFLOW_HOME``, prints JSON alone, which lists the provider's plugins."""
    import os
    import subprocess
    import sys

    # a user's environment: none of the tests' Airflow settings (unit test mode logs on stdout too)
    env = {name: value for name, value in os.environ.items() if not name.startswith("AIRFLOW")}
    env["AIRFLOW_HOME"] = str(tmp_path / "airflow")
    done = subprocess.run(
        [sys.executable, "-m", "airflow", "plugins", "-o", "json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "Please define the 'cli' section" not in done.stdout
    assert "Please define the 'cli' section" not in done.stderr
    plugins = json.loads(done.stdout)
    names = {plugin["name"] for plugin in plugins}
    assert {"airflow_quota", "airflow_quota_executor"} <= names, names  # the page; QuotaExecutor's task log
    assert get_provider_info()["cli"] == ["airflow_quota.get_provider_info.get_cli_commands"]
