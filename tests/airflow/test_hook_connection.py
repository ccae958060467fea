"""A missing or mistyped ``quota_conn_id`` fails loudly (issue 16): no silent fallback to a
database the quota scheduler never reads. Only an explicit URL setting stands in for the
default connection."""

from __future__ import annotations

from pathlib import Path

import pytest
from airflow.exceptions import AirflowNotFoundException

from airflow_quota.hooks.quota import QuotaHook
from airflow_quota.store.settings import ENV_URL


@pytest.fixture
def no_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No connection and no URL setting at all (an empty AIRFLOW_HOME)."""
    monkeypatch.delenv("AIRFLOW_CONN_QUOTA_DEFAULT", raising=False)
    monkeypatch.delenv(ENV_URL, raising=False)
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))


@pytest.mark.usefixtures("no_settings")
def test_a_mistyped_connection_id_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(ENV_URL, f"sqlite:///{tmp_path / 'quota.db'}")  # not for another connection id
    with pytest.raises(AirflowNotFoundException) as missing:
        QuotaHook("quota_defualt").get_url()
    assert str(missing.value).startswith("quota_conn_id: the connection 'quota_defualt' is not defined")
    assert "AIRFLOW_CONN_QUOTA_DEFUALT" in str(missing.value)


@pytest.mark.usefixtures("no_settings")
def test_the_default_connection_with_no_setting_is_not_a_silent_sqlite_file(tmp_path: Path) -> None:
    with pytest.raises(AirflowNotFoundException, match=f"or set {ENV_URL}"):
        QuotaHook().get_url()
    assert not (tmp_path / "quota.db").exists()


@pytest.mark.usefixtures("no_settings")
def test_an_explicit_setting_stands_in_for_the_default_connection(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "airflow.cfg").write_text(f"[quota]\nsql_alchemy_conn = sqlite:///{tmp_path / 'from-cfg.db'}\n")
    assert QuotaHook().get_url() == f"sqlite:///{tmp_path / 'from-cfg.db'}"
    monkeypatch.setenv(ENV_URL, f"sqlite:///{tmp_path / 'from-env.db'}")
    assert QuotaHook().get_url() == f"sqlite:///{tmp_path / 'from-env.db'}"
