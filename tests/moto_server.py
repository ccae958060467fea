"""A real moto server in a subprocess, for the SageMaker and IAM paths (the backend's calls and
the operator's role expansion and results), with dummy credentials and a region in the
environment for clients built from it."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator

import pytest

REGION = "us-east-1"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    """The server's URL while it runs; the credentials and region are set meanwhile."""
    if importlib.util.find_spec("moto") is None:
        pytest.skip("moto is not installed: pip install 'moto[server]' to run the SageMaker moto tests")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    credentials = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION}
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env={**os.environ, **credentials},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while True:  # poll until the server answers (a condition, with a deadline)
            try:
                urllib.request.urlopen(f"{url}/moto-api/", timeout=1).close()
                break
            except OSError:
                if server.poll() is not None:
                    stderr = server.stderr.read().decode() if server.stderr else ""
                    pytest.fail(f"moto server exited with {server.returncode}: {stderr[-2000:]}")
                if time.monotonic() > deadline:
                    pytest.fail("moto server did not answer within 30 s")
                time.sleep(0.1)
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
