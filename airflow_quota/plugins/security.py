"""Who may read and change what through the Quotas page, decided by Airflow's own auth manager.

A FastAPI app mounted by a plugin gets no authentication from Airflow, so every route of
``app.py`` depends on these, the way Airflow's own routes and the edge3 provider's do:

- **a login**: ``get_user`` (``GetUserDep``) takes the bearer token of an API client, or the
  UI's JWT cookie, so the page works inside the Airflow UI's iframe; none gives 401, an
  invalid one 403;
- **reading** anything needs the right to read DAGs (``requires_access_dag("GET")``, as
  ``GET /api/v2/dags`` asks); a job, its alerts and its preemptions are shown only to users
  who may read the job's DAG (a job submitted outside Airflow has no DAG: any DAG reader
  sees it);
- **changing** a job (its priority, cancelling it) needs the right to edit the job's DAG
  (``PUT``); for a job without a DAG, the right to edit DAGs in general.

The rules of the quota itself (a priority above the share's ``max_priority``) are the
store's; see ``api.py`` for how refusals are answered.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Annotated, Any, Literal, TypeVar

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.models.resource_details import DagDetails
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag
from fastapi import Depends, HTTPException, status

from airflow_quota.store.models import JobRow

Method = Literal["GET", "PUT"]
T = TypeVar("T")

requires_login_and_dag_read = Depends(requires_access_dag("GET"))
"""The dependency every route carries: an Airflow login (401 without one) with the right to
read DAGs (403 without it). A ``dag_id`` query parameter narrows the check to that DAG."""


class DagAccess:
    """One user's DAG-level rights, asked of the auth manager at most once per DAG and method
    within a request."""

    def __init__(self, user: Any, multi_team: bool | None = None) -> None:
        self.user = user
        self._decided: dict[tuple[str, str | None], bool] = {}
        self._teams: dict[str, str | None] = {}
        self._multi_team = multi_team

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

    def readable(self, items: Iterable[T], dag_of: Callable[[T], str | None]) -> list[T]:
        """The items whose DAG the user may read."""
        return [item for item in items if self.allows("GET", dag_of(item))]

    def require_read(self, job: JobRow) -> None:
        if not self.allows("GET", job.dag_id):
            raise HTTPException(
                status.HTTP_403_FORBIDDEN, f"reading quota job {job.id} needs read access to DAG {job.dag_id!r}"
            )

    def require_edit(self, job: JobRow) -> None:
        """403 unless the user may edit the job's DAG (DAGs in general for a job without one)."""
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
