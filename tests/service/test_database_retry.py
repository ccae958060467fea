"""How the quota scheduler's process retries a pass that met a database error
(``QuotaService._retrying``, tenacity): 0.5 s, doubling up to 5 s, reset by a pass that works;
each error is one log line and drops what the process held in memory. The waits are recorded,
not slept (the real ones, and a real unreachable database, are in test_cli_service.py and
test_database_faults.py)."""

from __future__ import annotations

import logging
import threading

import pytest
from tenacity import RetryError

from airflow_quota.exceptions import DatabaseUnavailable
from airflow_quota.service.backends.fake import FakeBackend
from airflow_quota.service.clock import ManualClock
from airflow_quota.service.scheduler import QuotaService
from airflow_quota.store.engine import make_engine, migrate


@pytest.fixture
def service(sqlite_url: str) -> QuotaService:
    engine = make_engine(sqlite_url)
    migrate(engine)
    clock = ManualClock()
    return QuotaService(engine, {"fake": FakeBackend(clock.now)}, clock=clock)


def test_a_pass_is_retried_with_back_off_that_a_working_pass_resets(
    service: QuotaService, caplog: pytest.LogCaptureFixture
) -> None:
    waits: list[float] = []
    retrying = service._retrying(threading.Event()).copy(sleep=waits.append)
    outcomes = iter([False, False, False, False, False, False, True, False, True])

    def a_pass() -> None:
        if not next(outcomes):
            raise DatabaseUnavailable("quota database sqlite:///x is unreachable: disk I/O error")

    with caplog.at_level(logging.ERROR, logger="airflow_quota.service.scheduler"):
        retrying(a_pass)  # six errors, then a pass that works
        retrying(a_pass)  # one error: the back-off starts again from its first wait
    assert waits == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0, 0.5]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 7
    assert lines[0] == (
        f"{service.holder} (standby): database error: quota database sqlite:///x is unreachable: "
        "disk I/O error; retrying in 0.5 s"
    )


def test_a_database_error_drops_the_leadership_and_what_is_in_memory(service: QuotaService) -> None:
    service.recover()
    service._leading = True
    retrying = service._retrying(threading.Event()).copy(sleep=lambda _: None)
    outcomes = iter([False, True])

    def a_pass() -> None:
        if not next(outcomes):
            raise DatabaseUnavailable("quota database sqlite:///x is unreachable: disk I/O error")

    retrying(a_pass)
    assert service._leading is False
    assert service.scheduler is None  # rebuilt from the committed log once it leads again


def test_a_stopped_process_does_not_retry(service: QuotaService) -> None:
    stop = threading.Event()
    stop.set()
    calls: list[None] = []

    def a_pass() -> None:
        calls.append(None)
        raise DatabaseUnavailable("quota database sqlite:///x is unreachable: disk I/O error")

    with pytest.raises(RetryError):
        service._retrying(stop)(a_pass)
    assert len(calls) == 1
