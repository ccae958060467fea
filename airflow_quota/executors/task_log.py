"""One readable line in an Airflow task's own log for why its try could not run.

A try that never started has no process of its own to say why: its supervisor could not reach
Airflow's execution API (the task process is killed before it logs more than ``::group::Pre
Execute``), or its quota job failed, was refused or cancelled while ``QuotaExecutor`` held it.
Airflow's supervisor writes a try's log as JSON lines under ``[logging] base_log_folder``, at the
workload's ``log_path``; ``append_to_task_log`` appends a line there the same way (the Task
SDK's own log file and processors), so the Airflow UI shows it in the try's log. ``failure_cause``
words the exception a supervisor raised as that one line.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import structlog

log = logging.getLogger(__name__)

MAX_CAUSE_CHARACTERS = 500
"""A cause longer than this is cut: it is one line of a log and of the quota job's detail."""


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the exceptions it was raised from or during, outermost first (each once)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def one_line(text: str) -> str:
    """``text``'s first non-empty line, at most ``MAX_CAUSE_CHARACTERS`` long."""
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return first if len(first) <= MAX_CAUSE_CHARACTERS else first[: MAX_CAUSE_CHARACTERS - 1] + "…"


def failure_cause(exc: BaseException, server: str | None) -> str:
    """Why a try's supervisor failed, in one line. A connection to the execution API that could
    not be made (refused, timed out, a name that does not resolve) names the URL and what to check;
    anything else is the exception's type and first line."""
    import httpx  # the Task SDK's client: loaded wherever a supervisor runs

    for link in _chain(exc):
        if isinstance(link, (httpx.ConnectError, httpx.ConnectTimeout)):
            os_error = next((e for e in _chain(link) if isinstance(e, OSError) and e.strerror), None)
            why = os_error.strerror if os_error is not None else (str(link) or type(link).__name__)
            return one_line(
                f"could not reach Airflow's execution API at {server or '(no URL set)'} ({why}): "
                "is the api-server running and [core] execution_api_server_url right?"
            )
    return one_line(f"the try could not run: {type(exc).__name__}: {exc}")


def append_to_task_log(log_path: str | None, message: str, level: str = "error") -> bool:
    """Append ``message`` to the try's log (``workload.log_path``, relative to ``[logging]
    base_log_folder``) as Airflow's supervisor writes it; False when it could not be written (no
    path, a read-only folder): the caller has logged the line in its own log already."""
    if not log_path:
        return False
    try:
        from airflow.sdk.log import init_log_file, logging_processors

        path = init_log_file(log_path)
        with path.open("ab") as handle:
            writer = structlog.wrap_logger(
                structlog.BytesLogger(handle), processors=logging_processors(json_output=True), logger_name="quota"
            )
            getattr(writer, level)(message)
    except Exception:
        log.exception("could not write to the task log %s", log_path)
        return False
    return True
