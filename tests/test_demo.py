"""``make demo``'s non-interactive mode from a clean copy of the repository: its own virtualenv,
a real Airflow on SQLite, the walkthrough, and the quota story it prints."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


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
@pytest.mark.timeout(2700)  # its two make demo runs may take 1500 s and 900 s
def test_make_demo_once_tells_the_quota_story(tmp_path: Path) -> None:
    copy = tmp_path / "airflow-quota"
    clean_copy(copy)
    assert not (copy / ".venv").exists() and not (copy / ".demo").exists()
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
    assert re.search(r"The Airflow UI: http://127\.0\.0\.1:\d+ +\(login admin / \S+\)", story)
    # the live table was shown while the run went on
    assert out.count("share  instance type  limit  used  borrowed") >= 3
    login = re.search(r"\(login admin / (\S+)\)", story)
    assert login

    # a second make demo reuses the virtualenv, the Airflow home, its databases and the login
    again = subprocess.run(
        ["make", "demo", "DEMO_ARGS=--once --port 0"], cwd=copy, env=env, capture_output=True, text=True, timeout=900
    )
    out2 = again.stdout + again.stderr
    assert again.returncode == 0, out2[-6000:]
    assert "pip install" not in out2, out2[:3000]
    assert f"reusing the Airflow home in {copy / '.demo'}" in out2
    assert f"(login admin / {login.group(1)})" in out2
    assert "5 trainings, 2 preemption(s)" in out2
