"""``make demo``'s non-interactive mode from a clean copy of the repository: its own virtualenv,
a real Airflow on SQLite, the walkthrough, and the quota story it prints; the demo as a
starting point (``.demo/env.sh``, a DAG of one's own in ``.demo/dags/``); and, served, a
walkthrough that fails: the demo says why and the UI stays up until it is stopped. The last
tests check the pieces of that without Airflow."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_quota.devtools import demo, stack
from airflow_quota.devtools.slow_relay import SlowRelay
from airflow_quota.devtools.stack import AirflowStack, StackSettings

REPO = Path(__file__).resolve().parents[1]
MY_DAG = """\
import pendulum
from airflow.sdk import DAG, task

with DAG("my_first_dag", schedule=None, start_date=pendulum.datetime(2026, 1, 1)):

    @task
    def hello() -> None:
        print("hello")

    hello()
"""
"""A DAG file a user drops in ``.demo/dags/``."""
FAILING = ["--port", "0", "--unreachable-execution-api"]
"""The demo, served, with a walkthrough that fails."""


def clean_copy(target: Path) -> None:
    """The repository's files as a fresh clone would have them, with uncommitted edits."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)


@pytest.mark.skipif(shutil.which("make") is None or shutil.which("git") is None, reason="needs make and git")
@pytest.mark.timeout(3300)  # its two make demo runs may take 1500 s and 900 s, the failing one 600 s
def test_make_demo_once_tells_the_quota_story(tmp_path: Path) -> None:
    copy = tmp_path / "airflow-quota"
    clean_copy(copy)
    assert not (copy / ".venv").exists() and not (copy / ".demo").exists()
    (copy / ".demo" / "dags").mkdir(parents=True)
    (copy / ".demo" / "dags" / "my_first_dag.py").write_text(MY_DAG)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "VIRTUAL_ENV"))}
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != venv_bin)
    done = subprocess.run(
        ["make", "demo", "DEMO_ARGS=--once --port 0"],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-6000:]
    assert (copy / ".venv" / "bin" / "airflow").exists()  # its own virtualenv, with Airflow in it
    assert "Collecting apache-airflow" in out  # pip shows its progress (make test's install stays quiet)
    story = out[out.index("The quota story:") :]
    print(story)
    # who ran where, who was preempted by whom, what resumed from which checkpoint, waits, cost
    assert re.search(r"qs1_med \(share qs1, priority 2\): SUCCEEDED", story)
    assert re.search(r"borrowing 1 from another share; preempted \(CROSS_SHARE\) by qs2_job", story), story
    assert re.search(r"qs1_high .*\n  attempt 1 ran on 1x ml\.g5\.xlarge; preempted \(IN_SHARE\) by qs1_low", story)
    resumed = re.findall(r"attempt 2 ran on .*resumed from the checkpoint at step (\d+)", story)
    assert len(resumed) == 2 and all(int(step) > 0 for step in resumed), story
    waits = re.findall(r"waited (.+) in the queue; [\d.]+ GPU-hours, \$[\d.]+", story)
    assert len(waits) == 5, story
    assert all(re.fullmatch(r"\d+ \w+( \d+ \w+)?|less than a second", w) for w in waits), waits  # in words
    assert "5 trainings, 2 preemption(s)" in story
    assert "The Airflow UI" not in out and not re.search(r"http://127\.0\.0\.1:\d+", out)  # --once stops it
    # the live table was shown while the run went on
    assert out.count("share  instance type  limit  used  borrowed") >= 3
    login = (copy / ".demo" / "home" / "passwords.json").read_text()

    # the demo as a starting point: env.sh points the airflow and airflow-quota commands at it,
    # and its dag-processor read the DAG dropped in .demo/dags/ beside the walkthrough
    assert f"source {copy / '.demo' / 'env.sh'}" in out and f"drop .py files in {copy / '.demo' / 'dags'}/" in out
    listed = subprocess.run(
        ["bash", "-c", "source .demo/env.sh && airflow dags list -o json"],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert listed.returncode == 0, listed.stdout + listed.stderr
    # the JSON list, after the warnings Airflow may print first ("[warning  ] Could not import graphviz")
    listing, _ = json.JSONDecoder().raw_decode(listed.stdout[listed.stdout.index('[{"dag_id"') :])
    dags = {d["dag_id"] for d in listing}
    assert {"quota_walkthrough", "my_first_dag"} <= dags, listed.stdout
    shares = subprocess.run(
        ["bash", "-c", "source .demo/env.sh && airflow-quota shares"],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert shares.returncode == 0 and "qs1" in shares.stdout and "ml.g5.xlarge" in shares.stdout, shares

    # a second make demo reuses the virtualenv, the Airflow home, its databases and the login
    again = subprocess.run(
        ["make", "demo", "DEMO_ARGS=--once --port 0"], cwd=copy, env=env, capture_output=True, text=True, timeout=900
    )
    out2 = again.stdout + again.stderr
    assert again.returncode == 0, out2[-6000:]
    assert "pip install" not in out2, out2[:3000]
    assert f"reusing the Airflow home in {copy / '.demo'}" in out2
    assert (copy / ".demo" / "home" / "passwords.json").read_text() == login
    assert "5 trainings, 2 preemption(s)" in out2

    # served, a walkthrough whose workers cannot reach the execution API fails: the demo says
    # what does not answer and why each task failed, keeps the UI up, and exits 1 once stopped
    demo_command = [str(copy / ".venv" / "bin" / "python"), "-m", "airflow_quota.devtools.demo", *FAILING]
    with served_demo(demo_command, copy, env) as out3:
        assert re.search(
            r"- the execution API the workers call does not answer at http://127\.0\.0\.1:\d+/execution/", out3
        )
        assert re.search(r"- task \w+ failed: .*(ConnectError|Connection refused)", out3), out3[-6000:]


@contextlib.contextmanager
def served_demo(command: list[str], cwd: Path, env: dict[str, str]) -> Iterator[str]:
    """The demo, served, with a walkthrough that fails: until it says it serves, checks that it
    said the walkthrough did not succeed and that the UI answers; yields what it printed; then
    stops it as Ctrl-C does and checks that it exits 1."""
    served = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert served.stdout is not None
        lines = []
        for line in served.stdout:  # until it serves (or exits: then the assertions below say so)
            lines.append(line)
            if line.startswith("Serving until Ctrl-C"):
                break
        out = "".join(lines)
        assert "The walkthrough did not succeed: the run demo__" in out, out[-6000:]
        ui = re.search(r"The Airflow UI: (http://127\.0\.0\.1:\d+) +\(login admin / \S+\)", out)
        assert ui, out[-6000:]
        with urllib.request.urlopen(f"{ui.group(1)}/api/v2/version", timeout=60) as answer:
            assert answer.status == 200  # the UI still serves after the failure
        assert served.poll() is None
        yield out
        served.send_signal(signal.SIGTERM)  # as Ctrl-C
        assert served.wait(timeout=120) == 1
    finally:
        if served.poll() is None:
            served.kill()
            served.wait()


@pytest.mark.timeout(900)
def test_an_execution_api_that_answers_slowly_keeps_the_ui_up(tmp_path: Path) -> None:
    """The user's failure: the api-server took longer to answer the workers than they wait
    (``httpx.ReadTimeout``). Through a relay that holds each call 12 s while the workers wait 6 s,
    the walkthrough fails, the demo says which task timed out, and the UI stays up."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    command = [sys.executable, "-m", "airflow_quota.devtools.demo", "--root", str(tmp_path / "demo"), "--port", "0"]
    with served_demo([*command, "--slow-execution-api", "12"], REPO, env) as out:
        assert re.search(r"- the execution API the workers call does not answer at http://127\.0\.0\.1:\d+/", out)
        assert re.search(r"- task \w+ failed: .*(ReadTimeout|timed out)", out), out[-6000:]


def test_the_slow_relay_passes_each_call_on_after_its_delay() -> None:
    """The relay behind ``--slow-execution-api``: a call through it is answered by the server
    behind it, and not before the delay."""
    with socketserver.TCPServer(("127.0.0.1", 0), EchoOnce) as echo:
        threading.Thread(target=echo.handle_request, daemon=True).start()
        with SlowRelay(("127.0.0.1", echo.server_address[1]), delay=1.5) as relay:
            started = time.monotonic()
            with socket.create_connection(("127.0.0.1", relay.port), timeout=30) as conn:
                conn.sendall(b"ping")
                assert conn.recv(4) == b"ping"
            assert time.monotonic() - started >= 1.5


class EchoOnce(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        self.request.sendall(self.request.recv(4))


def test_env_script_exports_what_the_processes_get(tmp_path: Path) -> None:
    """Sourced, ``env.sh`` gives a shell every setting the stack gives its processes, and drops
    the settings of another Airflow; it is readable by its owner only (it holds secrets)."""
    af = AirflowStack(StackSettings(root=tmp_path / "demo", api_port=8793, extra_env={"AIRFLOW__X__Y": "a b'c"}))
    script = af.write_env_script(tmp_path / "demo" / "env.sh")
    assert script.stat().st_mode & 0o777 == 0o600
    shown = subprocess.run(
        ["bash", "-c", f"source {script} && env -0"],
        env={"PATH": "/usr/bin:/bin", "AIRFLOW__CORE__DAGS_FOLDER": "/elsewhere", "AIRFLOW_OTHER": "x"},
        capture_output=True,
        check=True,
    ).stdout.decode()
    got = dict(item.split("=", 1) for item in shown.split("\0") if "=" in item)
    for name, value in af.own_env.items():
        if name != "PATH":
            assert got.get(name) == value, name
    assert "AIRFLOW_OTHER" not in got
    assert got["PATH"].split(os.pathsep)[0] == str(stack.BIN)
    for setting in (
        "AIRFLOW__CORE__EXECUTOR",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL",
        "AIRFLOW__API_AUTH__JWT_SECRET",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE",
        "AIRFLOW__CORE__FERNET_KEY",
        "AIRFLOW_CONN_QUOTA_DEFAULT",
    ):
        assert got[setting], setting
    assert got["AIRFLOW__CORE__DAGS_FOLDER"] == str(tmp_path / "demo" / "dags")
    assert got["AIRFLOW__X__Y"] == "a b'c"


def test_the_scheduler_and_triggerer_start_once_the_api_server_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    af = AirflowStack(StackSettings(root=tmp_path))
    steps: list[str] = []
    monkeypatch.setattr(af, "prepare", lambda: steps.append("prepare"))
    monkeypatch.setattr(af, "start_process", lambda name, command: steps.append(name))
    monkeypatch.setattr(af, "wait_ready", lambda api_server_only=False: steps.append(f"wait {api_server_only}"))
    af.start()
    waited = steps.index("wait True")
    assert "api-server" in steps[:waited]
    assert set(steps[waited:]) == {"scheduler", "triggerer", "wait True", "wait False"}
    assert steps[-1] == "wait False" and len(steps) == len(stack.COMPONENTS) + 3


@pytest.mark.parametrize(
    ("log", "line"),
    [
        (
            "INFO starting\nTraceback (most recent call last):\n  ...\nhttpx.ReadTimeout: timed out\n",
            "httpx.ReadTimeout: timed out",
        ),
        (
            "httpx.ConnectError: [Errno 111] Connection refused\nINFO retrying",
            "httpx.ConnectError: [Errno 111] Connection refused",
        ),
        (
            json.dumps({"level": "info", "event": "fine"})
            + "\n"
            + json.dumps(
                {
                    "level": "error",
                    "event": "Task failed with exception",
                    "error_detail": [{"exc_type": "ValueError", "exc_value": "no"}],
                }
            ),
            "Task failed with exception (ValueError: no)",
        ),
        ("INFO all good\n", None),
    ],
)
def test_the_failure_line_of_a_log(log: str, line: str | None) -> None:
    assert demo.failure_line(log) == line
