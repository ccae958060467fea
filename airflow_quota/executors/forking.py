"""Before the executor forks its worker processes: no database connection shared with them.

A forked child holds a copy of every socket its parent has open. Airflow's ``clean_in_fork``
makes the child forget the parent's pooled connections without closing them (closing would end
the parent's sessions), so the copies live as long as the child. When the scheduler is killed
(SIGKILL, out of memory), PostgreSQL therefore does not see its connections close: its workers
still hold them, one possibly inside a transaction whose ``SELECT … FOR UPDATE SKIP LOCKED``
locks a DAG run, and a new scheduler skips that run for as long as the dead one's workers live
(they run on after it, by design: a running task is adopted, not killed).

Closing the parent's idle pooled connections just before forking leaves the children nothing
to inherit: the connections the scheduler opens afterwards are its own and die with it. It also
ends those that processes forked earlier share (Airflow's serve-logs, another executor's
workers). The scheduler forks between its sessions, so no connection is checked out then.
"""

from __future__ import annotations

from airflow_quota.hooks.quota import open_stores


def close_pooled_connections() -> None:
    """Close the idle connections of Airflow's metadata database pool and of this process's quota
    database pools (the next session opens new ones); a connection in use now stays open."""
    from airflow import settings  # configured by the time an executor forks

    engine = getattr(settings, "engine", None)
    if engine is not None:
        engine.dispose()
    for store in open_stores():
        store.engine.dispose()
