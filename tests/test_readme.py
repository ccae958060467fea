"""Every ``airflow-quota`` command shown in the README runs, exits as the README implies, and
prints the lines shown under it."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests.conftest import ROOT, cli


def readme_commands() -> list[tuple[str, list[str]]]:
    """(command, the output lines shown under it) for each ``$ airflow-quota`` line."""
    text = (ROOT / "README.md").read_text()
    found = []
    for block in re.findall(r"```console\n(.*?)```", text, re.S):
        lines = block.splitlines()
        for i, line in enumerate(lines):
            if line.startswith("$ airflow-quota"):
                shown = []
                for following in lines[i + 1 :]:
                    if following.startswith("$ "):
                        break
                    shown.append(following)
                found.append((line[2:].split("  #")[0].strip(), shown))
    return found


COMMANDS = readme_commands()


def test_the_readme_shows_commands() -> None:
    assert len(COMMANDS) >= 6


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory like the repository's root, so commands that write (a quota.db) write there;
    the commands run in README order, each seeing what the previous ones did."""
    path = tmp_path_factory.mktemp("readme")
    (path / "examples").symlink_to(ROOT / "examples")
    return path


@pytest.mark.parametrize(("command", "shown"), COMMANDS, ids=[c for c, _ in COMMANDS])
def test_readme_command(command: str, shown: list[str], workdir: Path) -> None:
    args = shlex.split(command)[1:]
    run = cli(*args, cwd=workdir)
    assert "Traceback" not in run.stderr
    expected_code = 2 if "broken" in command else 0
    assert run.code == expected_code, run.stderr
    output = run.stdout + run.stderr
    for line in shown:
        assert line.strip() in output, f"README shows {line!r}, the command printed:\n{output}"
