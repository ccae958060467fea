"""The forecast's worker process dies with its leader (``PR_SET_PDEATHSIG``), even stopped: a
scheduler killed with ``kill -9`` leaves no worker behind. Real processes, read through psutil."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.waiting import wait_for

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SIGSTOP and PR_SET_PDEATHSIG: Linux")


def busy(seconds: float, started: str) -> float:
    """A refresh's stand-in: says it started (after the worker's start, which sets
    ``PR_SET_PDEATHSIG``), then works the CPU for ``seconds``."""
    Path(started).write_text(str(os.getpid()))
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    return seconds


LEADER = """
import multiprocessing, sys, time
from concurrent.futures import ProcessPoolExecutor
from airflow_quota.service.forecasts import _yield_to_the_leader
from tests.service.test_forecast_worker_dies import busy
if __name__ == "__main__":
    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=_yield_to_the_leader)
    pool.submit(busy, 600.0, sys.argv[1])
    time.sleep(600)
"""


def test_the_worker_dies_with_its_leader_even_when_stopped(tmp_path: Path) -> None:
    started = tmp_path / "started"
    leader = subprocess.Popen([sys.executable, "-c", LEADER, str(started)])
    try:
        wait_for(lambda: started.exists() and started.read_text() != "", 60, "the worker's first refresh")
        worker = psutil.Process(int(started.read_text()))
        worker.suspend()  # stopped too (SIGSTOP): SIGKILL still ends it
        leader.kill()
        leader.wait(timeout=30)
        wait_for(lambda: not worker.is_running() or worker.status() == psutil.STATUS_ZOMBIE, 10, "the worker gone")
    finally:
        if leader.poll() is None:
            leader.kill()
