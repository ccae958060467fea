"""Which database holds the quota state: one URL setting, looked up in this order:

1. the ``--db`` option of the command line;
2. the environment variable ``AIRFLOW__QUOTA__SQL_ALCHEMY_CONN`` (Airflow's convention for the
   ``sql_alchemy_conn`` option of the ``[quota]`` section);
3. ``[quota] sql_alchemy_conn`` in Airflow's configuration file (``$AIRFLOW_CONFIG``, else
   ``$AIRFLOW_HOME/airflow.cfg``);
4. the Airflow connection ``quota_default`` (``AIRFLOW_CONN_QUOTA_DEFAULT`` as a URI, or the
   connection stored in Airflow when Airflow is installed);
5. ``sqlite:///$AIRFLOW_HOME/quota.db`` (``AIRFLOW_HOME`` defaults to ``~/airflow``).

Steps 2 and 3 are Airflow's configuration, in Airflow's order (the variable, its command or
secret form, the file's value, its command or secret form). A command or a secret
(``AIRFLOW__QUOTA__SQL_ALCHEMY_CONN_CMD`` / ``_SECRET``, ``sql_alchemy_conn_cmd`` /
``sql_alchemy_conn_secret`` in the file) is read through ``airflow.configuration.conf``: only
Airflow runs the command or asks its secrets backend, and it does so because the provider
declares the option sensitive (``get_provider_info``). A plain value is read as Airflow reads
it (``$VARS`` in the file expanded) without importing Airflow, which costs seconds per command
line call and is absent where the quota scheduler runs without it. A command or secret with no
Airflow installed is refused naming it, rather than falling through to another database.
"""

from __future__ import annotations

import configparser
import importlib.util
import os
from pathlib import Path

from airflow_quota.exceptions import InvalidInput

SECTION, OPTION = "quota", "sql_alchemy_conn"
ENV_URL = "AIRFLOW__QUOTA__SQL_ALCHEMY_CONN"
ENV_CONN = "AIRFLOW_CONN_QUOTA_DEFAULT"
INDIRECT = ("_cmd", "_secret")
"""The suffixes of Airflow's indirect forms of a sensitive option: a command, a secret's key."""


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
    """The URL an explicit setting gives, in Airflow's order: the environment variable, its
    command or secret form, ``[quota] sql_alchemy_conn`` in Airflow's configuration file, its
    command or secret form (see the module docstring); None when none is set. InvalidInput
    names the setting when its command fails or Airflow, which alone can run it, is missing."""
    if os.environ.get(ENV_URL):
        return normalize(os.environ[ENV_URL])
    in_environment = [f"{ENV_URL}{s.upper()}" for s in INDIRECT if os.environ.get(f"{ENV_URL}{s.upper()}")]
    if in_environment:
        return _from_airflow_conf(in_environment[0])
    parser = airflow_config_file()
    if parser.has_option(SECTION, OPTION):
        return normalize(os.path.expandvars(parser.get(SECTION, OPTION)))  # Airflow expands $VARS too
    in_file = [f"[{SECTION}] {OPTION}{s}" for s in INDIRECT if parser.has_option(SECTION, OPTION + s)]
    if in_file:
        return _from_airflow_conf(in_file[0])
    return None


def _from_airflow_conf(setting: str) -> str | None:
    """``[quota] sql_alchemy_conn`` as Airflow reads it, for a ``setting`` given as a command
    or a secret: Airflow runs the command or asks its secrets backend."""
    if importlib.util.find_spec("airflow") is None:
        raise InvalidInput.single(
            setting,
            f"a command or secret is read by Airflow, which is not installed here: set {ENV_URL} "
            f"(or [{SECTION}] {OPTION}) to the URL itself",
        )
    from airflow.configuration import conf  # type: ignore[import-not-found,unused-ignore]

    try:
        value = conf.get(SECTION, OPTION, fallback=None)
    except Exception as exc:  # AirflowConfigException: the command failed, the secret is missing
        raise InvalidInput.single(setting, f"Airflow could not read it: {exc}") from None
    value = str(value).strip() if value is not None else ""  # a command's output ends with a line break
    return normalize(value) if value else None


def airflow_config_file() -> configparser.ConfigParser:
    """Airflow's configuration file as plain text (``$AIRFLOW_CONFIG``, else
    ``$AIRFLOW_HOME/airflow.cfg``); empty when there is none. Read without importing Airflow,
    which costs seconds (the quota scheduler's metrics check, ``service/metrics.py``, too)."""
    parser = configparser.ConfigParser(interpolation=None)
    path = Path(os.environ.get("AIRFLOW_CONFIG") or airflow_home() / "airflow.cfg").expanduser()
    if path.exists():
        parser.read(path)
    return parser


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


RETENTION_OPTION = "retention_days"
ENV_RETENTION = "AIRFLOW__QUOTA__RETENTION_DAYS"
DEFAULT_RETENTION_DAYS = 90.0
"""Finished jobs, and the inputs a snapshot covers, are pruned this many days after they ended
(``store/retention.py``); 0 keeps everything."""

DEFAULT_SNAPSHOT_EVERY = 10_000
"""Inputs between two snapshots of the quota scheduler's state, by default (``--snapshot-every``,
``service/snapshots.py``)."""


def retention_days(explicit: str | None = None) -> float:
    """The ``retention_days`` setting: ``--retention-days``, else ``AIRFLOW__QUOTA__RETENTION_DAYS``,
    else ``[quota] retention_days`` in Airflow's configuration file (read as ``configured_url``
    reads the URL, without importing Airflow), else 90. InvalidInput names the setting that
    holds a value that is not a number of days ≥ 0."""
    if explicit is not None:
        return parse_days(explicit, "--retention-days")
    if os.environ.get(ENV_RETENTION):
        return parse_days(os.environ[ENV_RETENTION], ENV_RETENTION)
    parser = airflow_config_file()
    if parser.has_option(SECTION, RETENTION_OPTION):
        raw = os.path.expandvars(parser.get(SECTION, RETENTION_OPTION)).split("#")[0]
        return parse_days(raw, f"[{SECTION}] {RETENTION_OPTION}")
    return DEFAULT_RETENTION_DAYS


def parse_days(text: str, setting: str) -> float:
    """A number of days ≥ 0 (fractions allowed), else InvalidInput naming ``setting``."""
    try:
        days = float(text.strip())
    except ValueError:
        raise InvalidInput.single(setting, f"{text.strip()!r} is not a number of days (0 keeps everything)") from None
    if not days >= 0 or days == float("inf"):  # also refuses NaN
        raise InvalidInput.single(setting, f"must be a number of days ≥ 0 (0 keeps everything), not {text.strip()}")
    return days
