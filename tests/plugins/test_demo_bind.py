"""The demo's api-server listens on this machine only unless told otherwise (issue 14: it
listened on every interface). The listening socket of a real api-server is checked in
``test_api.py``; here, what the demo and the stack are told."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_quota.devtools import demo
from airflow_quota.devtools.stack import AirflowStack, StackSettings, connect_host


def test_the_demo_listens_on_127_0_0_1_unless_told_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(demo.HOST_VARIABLE, raising=False)
    assert demo.arguments().parse_args([]).host == "127.0.0.1"
    assert demo.arguments().parse_args(["--host", "0.0.0.0"]).host == "0.0.0.0"
    monkeypatch.setenv(demo.HOST_VARIABLE, "192.0.2.7")
    assert demo.arguments().parse_args([]).host == "192.0.2.7"
    assert demo.arguments().parse_args(["--host", "127.0.0.1"]).host == "127.0.0.1"


def test_the_stack_tells_the_api_server_where_to_listen(tmp_path: Path) -> None:
    local = AirflowStack(StackSettings(root=tmp_path / "local", api_port=8793))
    command = local._command("api-server")
    assert command[command.index("--host") + 1] == "127.0.0.1"
    assert local.env["AIRFLOW__API__HOST"] == "127.0.0.1"
    everywhere = AirflowStack(StackSettings(root=tmp_path / "all", api_port=8793, api_host="0.0.0.0"))
    command = everywhere._command("api-server")
    assert command[command.index("--host") + 1] == "0.0.0.0"
    assert everywhere.api_url == "http://127.0.0.1:8793"  # reached from here through loopback


@pytest.mark.parametrize(
    ("listen", "reach"), [("127.0.0.1", "127.0.0.1"), ("0.0.0.0", "127.0.0.1"), ("::", "127.0.0.1"), ("::1", "[::1]")]
)
def test_where_a_listening_address_is_reached(listen: str, reach: str) -> None:
    assert connect_host(listen) == reach
