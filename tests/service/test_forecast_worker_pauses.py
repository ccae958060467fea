"""The forecast's worker process waits while the leader runs a cycle (``ForecastRefresh.paused``:
SIGSTOP, then SIGCONT), and dies with the leader, so a leader killed mid-cycle leaves no stopped
process behind. Real processes; their states read from the kernel (psutil)."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import psutil
import pytest

from airflow_quota.service.forecasts import ForecastRefresh, _yield_to_the_leader
from tests.waiting import wait_for

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SIGSTOP and PR_SET_PDEATHSIG: Linux")


def busy(seconds: float) -> float:
    """A refresh's stand-in: CPU work for ``seconds``."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    return seconds


def test_a_refresh_in_flight_is_stopped_during_the_cycle_and_goes_on_after() -> None:
    refresh = ForecastRefresh("sqlite://", interval=0)
    refresh._pool = ProcessPoolExecutor(
        1, mp_context=multiprocessing.get_context("spawn"), initializer=_yield_to_the_leader
    )
    try:
        refresh._running = refresh._pool.submit(busy, 3.0)
        [pid] = list(refresh._pool._processes)  # type: ignore[attr-defined]
        worker = psutil.Process(pid)
        wait_for(lambda: worker.cpu_times().user > 0.05, 20, "the refresh to be under way")
        with refresh.paused():
            wait_for(lambda: worker.status() == psutil.STATUS_STOPPED, 5, "the worker stopped")
            spent = worker.cpu_times().user
            time.sleep(0.3)  # a cycle's worth of waiting: the stopped worker spends nothing
            assert worker.cpu_times().user == spent
        wait_for(lambda: worker.status() != psutil.STATUS_STOPPED, 5, "the worker going on")
        assert refresh._running.result(timeout=30) == 3.0
        assert worker.nice() >= 10
    finally:
        refresh.close()


def test_without_a_refresh_in_flight_nothing_is_signalled() -> None:
    refresh = ForecastRefresh("sqlite://", interval=0)
    with refresh.paused():
        pass  # no worker: no error, nothing to stop
    assert refresh._pool is None


LEADER = """
import multiprocessing, sys, time
from concurrent.futures import ProcessPoolExecutor
from airflow_quota.service.forecasts import _yield_to_the_leader
from tests.service.test_forecast_worker_pauses import busy
if __name__ == "__main__":
    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=_yield_to_the_leader)
    pool.submit(busy, 600.0)
    time.sleep(1.0)
    print(list(pool._processes)[0], flush=True)
    time.sleep(600)
"""


def test_the_worker_dies_with_its_leader_even_when_stopped(tmp_path: object) -> None:
    leader = subprocess.Popen([sys.executable, "-c", LEADER], stdout=subprocess.PIPE, text=True)
    try:
        assert leader.stdout is not None
        worker = psutil.Process(int(leader.stdout.readline()))
        worker.suspend()  # as a leader killed inside a cycle leaves it
        leader.kill()
        leader.wait(timeout=30)
        wait_for(lambda: not worker.is_running() or worker.status() == psutil.STATUS_ZOMBIE, 10, "the worker gone")
    finally:
        if leader.poll() is None:
            leader.kill()
