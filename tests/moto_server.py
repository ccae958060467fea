"""A real moto server in a subprocess, for the SageMaker and IAM paths (the backend's calls and
the operator's role expansion and results), with dummy credentials and a region in the
environment for clients built from it.

The ``moto_url`` fixture (one server per test module) is imported by ``tests/airflow/conftest.py``
and ``tests/service/conftest.py``, so their tests take it by name."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator

import pytest

from airflow_quota.devtools.stack import free_port
from tests.waiting import wait_for

REGION = "us-east-1"


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    """The server's URL while it runs; the credentials and region are set meanwhile."""
    if importlib.util.find_spec("moto") is None:
        pytest.skip("moto is not installed: pip install 'moto[server]' to run the SageMaker moto tests")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    credentials = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION}
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env={**os.environ, **credentials},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )

    def answers() -> bool:
        try:
            urllib.request.urlopen(f"{url}/moto-api/", timeout=1).close()
            return True
        except OSError:
            return False

    def running() -> None:
        if server.poll() is not None:
            stderr = server.stderr.read().decode() if server.stderr else ""
            pytest.fail(f"moto server exited with {server.returncode}: {stderr[-2000:]}")

    try:
        wait_for(answers, 30, "the moto server to answer", interval=0.1, check=running)
        with pytest.MonkeyPatch.context() as patch:
            for key, value in credentials.items():
                patch.setenv(key, value)
            patch.delenv("AWS_PROFILE", raising=False)
            yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    """The URL of a moto server that runs for the test module (``moto_server``)."""
    with moto_server() as url:
        yield url
