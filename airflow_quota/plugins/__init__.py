"""The Quotas page in the Airflow UI: an ``AirflowPlugin`` (``quota_plugin.py``) that mounts a
FastAPI app on the api-server (``app.py``: the page, its assets and the JSON API of ``api.py``,
guarded by Airflow's own auth in ``security.py``), and an operator extra link from each
``QuotaTrainingOperator`` task to its job's page (``links.py``).

Importing this package is cheap: FastAPI and matplotlib load only with the modules that use them.
"""

URL_PREFIX = "/quota"
"""Where the app is mounted on the api-server (below ``[api] base_url``'s path)."""
