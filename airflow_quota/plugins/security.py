"""Who may read and change what through the Quotas page, decided by Airflow's own auth manager.

A FastAPI app mounted by a plugin gets no authentication from Airflow, so every route of
``app.py`` depends on these, the way Airflow's own routes and the edge3 provider's do:

- **a login**: ``get_user`` (``GetUserDep``) takes the bearer token of an API client, or the
  UI's JWT cookie, so the page works inside the Airflow UI's iframe; none gives 401, an
  invalid one 403;
- **reading** anything needs the right to read DAGs (``requires_access_dag("GET")``, as
  ``GET /api/v2/dags`` asks); a job, its alerts and its preemptions are shown only to users
  who may read the job's DAG (a job submitted outside Airflow has no DAG: any DAG reader
  sees it); to anyone else, reading or changing the job is answered as for an id that names
  no job (``no_such_job``: 404, the same body), naming no DAG;
- **changing** a job (its priority, cancelling it) needs the right to edit the job's DAG
  (``PUT``); for a job without a DAG, the right to edit DAGs in general; a user who may read
  the job but not edit it gets 403 naming the right they miss;
- **other jobs' names**: a job named in what the user may read (the preemptor of a readable
  job, a victim in its story) is shown as ``ANOTHER_JOB`` when its DAG is not readable;
- **no cross-site changes**: every route that changes something carries ``same_origin_json``
  (``SameOriginJson``): the request must say ``Content-Type: application/json`` (an HTML form
  cannot, and a cross-site script cannot without a CORS preflight that the api-server does not
  grant) and, when a browser says where it comes from (``Origin``, else ``Sec-Fetch-Site``),
  come from the api-server itself. The login cookie alone is not enough: Airflow's UI sets it
  without ``SameSite``. API clients (curl, scripts) send neither header and pass on the
  content type alone.

The rules of the quota itself (a priority above the share's ``max_priority``, a share's
``access.set_priority`` rule, checked for the user's name: ``DagAccess.actor``) are the
store's; see ``api.py`` for how refusals are answered.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Annotated, Any, Literal, TypeVar
from urllib.parse import urlsplit

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.models.resource_details import DagDetails
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag
from fastapi import Depends, HTTPException, Request, status

from airflow_quota.core.access import Actor, ShareAccess, access_refusal
from airflow_quota.store.models import JobRow
from airflow_quota.store.repository import QuotaStore

Method = Literal["GET", "PUT"]
T = TypeVar("T")

ANOTHER_JOB = "another job"
"""What a job of a DAG the user may not read is called where another job names it."""
DEFAULT_PORTS = {"http": 80, "https": 443}

requires_login_and_dag_read = Depends(requires_access_dag("GET"))
"""The dependency every route carries: an Airflow login (401 without one) with the right to
read DAGs (403 without it). A ``dag_id`` query parameter narrows the check to that DAG."""


def no_such_job(job_id: int) -> HTTPException:
    """The 404 of a job id that names no job, and of a job the user may not read: one answer,
    byte for byte, so that an id's answer tells nothing of a job the user may not see."""
    return HTTPException(status.HTTP_404_NOT_FOUND, f"no quota job {job_id}")


class DagAccess:
    """One user's DAG-level rights, asked of the auth manager at most once per DAG and method
    within a request."""

    def __init__(self, user: Any, multi_team: bool | None = None) -> None:
        self.user = user
        self._decided: dict[tuple[str, str | None], bool] = {}
        self._teams: dict[str, str | None] = {}
        self._multi_team = multi_team
        self._share_access: dict[str, ShareAccess | None] | None = None

    def allows(self, method: Method, dag_id: str | None) -> bool:
        """Whether the user may ``method`` the DAG (``None``: DAGs in general)."""
        key = (method, dag_id)
        if key not in self._decided:
            self._decided[key] = bool(
                get_auth_manager().is_authorized_dag(
                    method=method,
                    details=DagDetails(id=dag_id, team_name=self._team(dag_id)),
                    user=self.user,
                )
            )
        return self._decided[key]

    def actor(self) -> Actor:
        """Who this user is to a share's ``access`` rules (``core.access``): the auth manager's
        user name (``get_name()``)."""
        name = self.user.get_name() if hasattr(self.user, "get_name") else None
        return Actor(user=str(name)) if name else Actor()

    def may_set_priority(self, share: str, store: QuotaStore) -> bool:
        """Whether the share's ``access.set_priority`` rule lets this user change priorities, so
        the page offers the priority field only where a change can pass (the store checks
        again when one is asked). The configuration is read once per request."""
        if self._share_access is None:
            latest = store.latest_config()
            self._share_access = {s.name: s.access for s in latest[1].shares} if latest else {}
        return access_refusal(share, self._share_access.get(share), "set_priority", self.actor()) is None

    def readable(self, items: Iterable[T], dag_of: Callable[[T], str | None]) -> list[T]:
        """The items whose DAG the user may read."""
        return [item for item in items if self.allows("GET", dag_of(item))]

    def name_of(self, name: str, dag_id: str | None) -> str:
        """``name``, or ``ANOTHER_JOB`` when the user may not read the job's DAG ``dag_id``."""
        return name if self.allows("GET", dag_id) else ANOTHER_JOB

    def require_read(self, job: JobRow) -> None:
        """404 unless the user may read the job's DAG: the very answer of an id that names no
        job (``no_such_job``), so a refusal names no DAG and does not tell that the id exists."""
        if not self.allows("GET", job.dag_id):
            raise no_such_job(job.id)

    def require_edit(self, job: JobRow) -> None:
        """403 unless the user may edit the job's DAG (DAGs in general for a job without one).
        Asked after ``require_read``: the user sees the job already, so the refusal may name
        what they miss."""
        if not self.allows("PUT", job.dag_id):
            what = f"DAG {job.dag_id!r}" if job.dag_id else "DAGs (the job was submitted outside Airflow)"
            raise HTTPException(
                status.HTTP_403_FORBIDDEN, f"changing quota job {job.id} ({job.name}) needs edit access to {what}"
            )

    def _team(self, dag_id: str | None) -> str | None:
        """The DAG's team in multi-team mode (one metadata query per DAG); None otherwise."""
        if dag_id is None or not self._multi_team_enabled():
            return None
        if dag_id not in self._teams:
            from airflow.models.dag import DagModel

            self._teams[dag_id] = DagModel.get_team_name(dag_id)
        return self._teams[dag_id]

    def _multi_team_enabled(self) -> bool:
        if self._multi_team is None:
            from airflow.configuration import conf

            self._multi_team = conf.getboolean("core", "multi_team", fallback=False)
        return self._multi_team


def dag_access(user: GetUserDep) -> DagAccess:
    """FastAPI dependency: the requesting user's DAG rights."""
    return DagAccess(user)


DagAccessDep = Annotated[DagAccess, Depends(dag_access)]


# -- cross-site requests ---------------------------------------------------------------------


def _origin(url: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of a URL or ``Origin`` value, ports made explicit; None when it
    names no origin (``null``, garbage)."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
    if scheme not in DEFAULT_PORTS or not host:
        return None
    return scheme, host, port if port is not None else DEFAULT_PORTS[scheme]


def own_origins(request: Request) -> set[tuple[str, str, int]]:
    """The origins the api-server answers as: the one the request was sent to (its scheme and
    ``Host``) and the configured ``[api] base_url`` (what browsers see behind a proxy that
    terminates TLS or rewrites ``Host``)."""
    origins = set()
    host = request.headers.get("host")
    if host:
        mine = _origin(f"{request.url.scheme}://{host}")
        if mine:
            origins.add(mine)
    try:
        from airflow.configuration import conf

        base_url = conf.get("api", "base_url", fallback=None)
    except Exception:  # outside a configured Airflow: only the request's own origin
        base_url = None
    configured = _origin(base_url) if base_url else None
    if configured:
        origins.add(configured)
    return origins


def same_origin_json(request: Request) -> None:
    """FastAPI dependency of every route that changes something: 403 unless the request is a
    JSON request from the api-server's own pages or from a client that is no browser.

    Refused: a content type other than ``application/json`` (what forms and "simple" cross-site
    requests send), an ``Origin`` other than the api-server's own, and, without ``Origin``, a
    ``Sec-Fetch-Site`` other than ``same-origin`` or ``none`` (typed by the user). Only headers
    are looked at: nothing of the body is read.
    """
    media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media_type != "application/json":
        shown = media_type or "none"
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            f"refused as a possible cross-site request: changes need Content-Type: application/json (got {shown})",
        )
    origin = request.headers.get("origin")
    if origin is not None:
        if _origin(origin) not in own_origins(request):
            raise HTTPException(
                status.HTTP_403_FORBIDDEN,
                f"refused as a cross-site request: Origin {origin[:200]!r} is not this api-server's",
            )
        return
    site = request.headers.get("sec-fetch-site")
    if site is not None and site.strip().lower() not in ("same-origin", "none"):
        raise HTTPException(
            status.HTTP_403_FORBIDDEN, f"refused as a cross-site request: Sec-Fetch-Site is {site[:50]!r}"
        )


SameOriginJson = Depends(same_origin_json)
"""The dependency every route that changes something lists first (``dependencies=[...]``)."""
