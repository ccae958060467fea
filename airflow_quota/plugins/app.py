"""The FastAPI app the plugin mounts on Airflow's api-server at ``/quota``.

=============================  ==============================================================
``GET /``                      the Quotas page (shown in the Airflow UI's iframe)
``GET /jobs/{job_id}``         one job's page (the operator extra link points here)
``GET /static/{name}``         the page's script and style sheet, shipped in the wheel
``GET /openapi.json``          the API's OpenAPI schema
``/api/...``                   the JSON API (``api.py``)
=============================  ==============================================================

Every route, the page and its assets included, needs an Airflow login with the right to read
DAGs (``security.py``); Swagger's UI is left out because it loads its script from a CDN, and
nothing here fetches from the network. The quota database is the one the Airflow connection
``quota_default`` names (``QuotaHook``), as for the operators and triggers.
"""

from __future__ import annotations

import html
import string
from collections.abc import Callable
from functools import cache
from importlib import resources
from typing import Any

from fastapi import FastAPI, HTTPException, Request, status
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

import airflow_quota
from airflow_quota.exceptions import DatabaseUnavailable
from airflow_quota.plugins import api
from airflow_quota.plugins.security import requires_login_and_dag_read
from airflow_quota.store.repository import QuotaStore

STATIC_TYPES = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
REFRESH_SECONDS = 5
"""How often the page polls the JSON API."""

DESCRIPTION = """Quota shares, their jobs, preemptions and alerts, from the quota database.

Every route needs an Airflow login: a bearer token from `POST /auth/token` or the Airflow
UI's session cookie. Reading needs the right to read DAGs; jobs are shown to users who may
read their DAG, and to others a job's id is answered as an id of no job (404, the same body).
Changing a job's priority or cancelling it needs the right to edit the job's
DAG, and a priority above the share's `max_priority` is refused (422). Changes must be sent
as `Content-Type: application/json` and, from a browser, from this api-server's own origin
(cross-site requests are 403); their bodies are read only once the right to edit is checked,
and at most 4096 bytes of them (413 beyond). Times are epoch seconds on the quota scheduler's
clock.
"""


def default_store(conn_id: str = "quota_default") -> Callable[[], QuotaStore]:
    """The quota database named by an Airflow connection, resolved on first use (the
    api-server may start before the connection exists) and then kept for the process."""
    chosen: list[QuotaStore] = []

    def provide() -> QuotaStore:
        if not chosen:
            from airflow_quota.hooks.quota import QuotaHook

            chosen.append(QuotaHook(conn_id).store)
        return chosen[0]

    return provide


def create_app(store: Callable[[], QuotaStore] | None = None) -> FastAPI:
    """The app; ``store`` provides the quota database (the Airflow connection by default)."""
    app = FastAPI(
        title="airflow-quota: Quotas API",
        version=airflow_quota.__version__,
        description=DESCRIPTION,
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
        dependencies=[requires_login_and_dag_read],
    )
    app.state.quota_store = store or default_store()
    app.include_router(api.router)

    @app.exception_handler(DatabaseUnavailable)
    async def unavailable(_: Request, exc: DatabaseUnavailable) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=status.HTTP_503_SERVICE_UNAVAILABLE)

    @app.exception_handler(HTTPException)
    async def login_first(request: Request, exc: HTTPException) -> Response:
        """A person opening a page without a login goes to Airflow's login page and back;
        the API and the assets keep answering 401 (scripts need the status, not a page)."""
        if exc.status_code == status.HTTP_401_UNAUTHORIZED and _is_page(request):
            login = _login_url(str(request.url))
            if login:
                return RedirectResponse(login, status_code=status.HTTP_303_SEE_OTHER)
        return await http_exception_handler(request, exc)

    @app.get("/openapi.json", include_in_schema=False)
    def openapi(request: Request) -> JSONResponse:
        schema = dict(app.openapi())
        root = request.scope.get("root_path", "").rstrip("/")
        if root:
            schema["servers"] = [{"url": root}]
        return JSONResponse(schema)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def page(request: Request) -> HTMLResponse:
        return HTMLResponse(_render("index.html", request))

    @app.get("/jobs/{job_id}", response_class=HTMLResponse, include_in_schema=False)
    def job_page(request: Request, job_id: int) -> HTMLResponse:
        return HTMLResponse(_render("job.html", request, job_id=api.bounded_id(job_id)))

    @app.get("/static/{name}", include_in_schema=False)
    def static(name: str) -> Response:
        content = _static(name)
        if content is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"no asset {name!r}")
        media_type = STATIC_TYPES[name[name.rindex(".") :]]
        return Response(content, media_type=media_type, headers={"Cache-Control": "private, max-age=300"})

    return app


def _is_page(request: Request) -> bool:
    """Whether the request is for one of the HTML pages, from a browser."""
    path = request.url.path[len(request.scope.get("root_path", "").rstrip("/")) :]
    is_page = path in ("", "/") or (path.startswith("/jobs/") and path.count("/") == 2)
    return request.method == "GET" and is_page and "text/html" in request.headers.get("accept", "")


def _login_url(next_url: str) -> str | None:
    """The auth manager's login page, coming back to ``next_url``; None outside an api-server."""
    try:
        from airflow.api_fastapi.app import get_auth_manager

        return str(get_auth_manager().get_url_login(next_url=next_url))
    except Exception:
        return None


def _render(template: str, request: Request, **values: Any) -> str:
    """A page template with its placeholders filled (HTML-escaped): the app's root path, the
    asset version (a new release is fetched afresh), the refresh period, and ``values``."""
    fields = {
        "root": request.scope.get("root_path", "").rstrip("/"),
        "version": airflow_quota.__version__,
        "refresh": str(REFRESH_SECONDS),
        **{k: str(v) for k, v in values.items()},
    }
    return string.Template(_template(template)).substitute({k: html.escape(v) for k, v in fields.items()})


@cache
def _template(name: str) -> str:
    return resources.files("airflow_quota.plugins").joinpath("templates").joinpath(name).read_text(encoding="utf-8")


@cache
def _static(name: str) -> bytes | None:
    """A packaged asset by its plain file name (no paths), or None."""
    if "/" in name or "\\" in name or name.startswith(".") or "." not in name:
        return None
    if name[name.rindex(".") :] not in STATIC_TYPES:
        return None
    path = resources.files("airflow_quota.plugins").joinpath("static").joinpath(name)
    return path.read_bytes() if path.is_file() else None
