"""``QuotaPlugin``: the Quotas page and API on Airflow's api-server, and a "Quotas" entry in the
Airflow UI's navigation. (The "Quota job" link of ``QuotaTrainingOperator`` tasks is declared on
the operator, ``links.QuotaJobLink``: Airflow 3 stores operator links with the serialized DAG,
so it needs no registration here. Neither does the listener that writes a ``QuotaExecutor``
task's quota story into its log: ``executors/task_listener.py``, a plugin of its own.)

Discovered through the ``airflow.plugins`` entry point (``pyproject.toml``); ``airflow plugins``
lists it. The page is an ``external_views`` entry with a ``url_route``, so the UI shows it in an
iframe under ``/plugin/quotas``; the iframe is same-origin, so the UI's login cookie
authenticates it.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

from airflow.configuration import conf
from airflow.plugins_manager import AirflowPlugin

from airflow_quota.plugins import URL_PREFIX
from airflow_quota.plugins.app import create_app


def _base_path() -> str:
    """The path of ``[api] base_url`` (``""`` when Airflow is served at the root)."""
    return urlparse(conf.get("api", "base_url", fallback="/") or "/").path.rstrip("/")


class QuotaPlugin(AirflowPlugin):
    """The Quotas page: shares, queue, running jobs, preemptions, alerts, utilisation, cost."""

    name = "airflow_quota"
    fastapi_apps: list[dict[str, Any]] = [  # noqa: RUF012 - AirflowPlugin's API
        {"app": create_app(), "url_prefix": URL_PREFIX, "name": "Quotas"}
    ]
    external_views: list[dict[str, Any]] = [  # noqa: RUF012 - AirflowPlugin's API
        {
            "name": "Quotas",
            "href": f"{_base_path()}{URL_PREFIX}/",
            "icon": f"{_base_path()}{URL_PREFIX}/static/quotas-icon.svg",
            "url_route": "quotas",
            "destination": "nav",
            "nav_top_level": True,
        }
    ]
