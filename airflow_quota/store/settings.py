"""Which database holds the quota state: one URL setting, looked up in this order:

1. the ``--db`` option of the command line;
2. the environment variable ``AIRFLOW__QUOTA__SQL_ALCHEMY_CONN`` (Airflow's convention for the
   ``sql_alchemy_conn`` option of the ``[quota]`` section);
3. ``[quota] sql_alchemy_conn`` in ``$AIRFLOW_HOME/airflow.cfg``;
4. the Airflow connection ``quota_default`` (``AIRFLOW_CONN_QUOTA_DEFAULT`` as a URI, or the
   connection stored in Airflow when Airflow is installed);
5. ``sqlite:///$AIRFLOW_HOME/quota.db`` (``AIRFLOW_HOME`` defaults to ``~/airflow``).
"""

from __future__ import annotations

import configparser
import os
from pathlib import Path

ENV_URL = "AIRFLOW__QUOTA__SQL_ALCHEMY_CONN"
ENV_CONN = "AIRFLOW_CONN_QUOTA_DEFAULT"


def airflow_home() -> Path:
    return Path(os.environ.get("AIRFLOW_HOME", Path.home() / "airflow")).expanduser()


def database_url(explicit: str | None = None, conn_id: str = "quota_default") -> str:
    """The SQLAlchemy URL of the quota database (see the module docstring for the order)."""
    if explicit:
        return normalize(explicit)
    configured = configured_url()
    if configured:
        return configured
    from_connection = _airflow_connection_uri(conn_id)
    if from_connection:
        return normalize(from_connection)
    return f"sqlite:///{airflow_home() / 'quota.db'}"


def configured_url() -> str | None:
    """The URL an explicit setting gives (the environment variable, then ``[quota]
    sql_alchemy_conn`` in airflow.cfg), or None when neither is set."""
    if os.environ.get(ENV_URL):
        return normalize(os.environ[ENV_URL])
    cfg = airflow_home() / "airflow.cfg"
    if cfg.exists():
        parser = configparser.ConfigParser(interpolation=None)
        parser.read(cfg)
        if parser.has_option("quota", "sql_alchemy_conn"):
            return normalize(parser.get("quota", "sql_alchemy_conn"))
    return None


def _airflow_connection_uri(conn_id: str) -> str | None:
    env = os.environ.get(f"AIRFLOW_CONN_{conn_id.upper()}")
    if env:
        return env
    try:  # Airflow's own connection store, when Airflow is installed and configured
        from airflow.sdk import BaseHook  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None
    try:
        return str(BaseHook.get_connection(conn_id).get_uri())
    except Exception:
        return None


def normalize(url: str) -> str:
    """Use the psycopg 3 driver for PostgreSQL URLs written the usual ways."""
    for prefix in ("postgres://", "postgresql://", "postgresql+psycopg2://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def redacted(url: str) -> str:
    """The URL without its password, for logs and messages."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)
