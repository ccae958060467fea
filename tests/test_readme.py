"""Every ``airflow-quota`` command shown in the README and the manual's pages (``docs/``) runs,
exits as the page implies, and prints the lines shown under it."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests.conftest import ROOT, cli


def toctree(page: Path) -> list[Path]:
    """The pages a page's ``{toctree}`` blocks list, in order, each followed by its own."""
    pages = []
    for block in re.findall(r"```\{toctree\}\n(.*?)```", page.read_text(), re.S):
        for entry in block.splitlines():
            entry = entry.strip()
            if entry and not entry.startswith(":"):
                child = page.parent / f"{entry}.md"
                pages += [child, *toctree(child)]
    return pages


def pages() -> list[Path]:
    """The README, then the manual's pages in the order of its table of contents (docs/index.md):
    the order in which a reader meets the commands, the old README's, so each one's prerequisites
    come before it (``db migrate`` before ``apply``, ``apply`` before ``jobs submit``)."""
    return [ROOT / "README.md", ROOT / "docs" / "index.md", *toctree(ROOT / "docs" / "index.md")]


def test_every_page_is_read() -> None:
    """No page of docs/ escapes the commands' checks: each one is in the table of contents."""
    found = {p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts}
    assert found == set(pages()[1:]), sorted(str(p) for p in found ^ set(pages()[1:]))


def test_the_readme_shows_the_two_commands() -> None:
    text = (ROOT / "README.md").read_text()
    assert "make test" in text and "make demo" in text


NEEDS_A_RUNNING_AIRFLOW = r"airflow-quota doctor( --json)?"
"""``airflow-quota`` commands whose output the pages show from a whole installation (every
Airflow component and a quota scheduler running): run by the test EXERCISED_BY names, not here."""


def needs_a_running_airflow(command: str) -> bool:
    return re.fullmatch(NEEDS_A_RUNNING_AIRFLOW, command.split("  #")[0].strip()) is not None


def readme_commands() -> list[tuple[str, list[str]]]:
    """(command, the output lines shown under it) for each ``$ airflow-quota`` line of every page."""
    text = "\n".join(page.read_text() for page in pages())
    found = []
    for block in re.findall(r"```console\n(.*?)```", text, re.S):
        lines = block.splitlines()
        for i, line in enumerate(lines):
            if line.startswith("$ airflow-quota") and not needs_a_running_airflow(line[2:]):
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
    the commands run in the pages' order, each seeing what the previous ones did."""
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
        assert line.strip() in output, f"the docs show {line!r}, the command printed:\n{output}"


def bash_commands(block: str) -> list[str]:
    """The commands of one ``bash`` block: continuations joined, comments dropped."""
    commands = []
    for line in block.replace("\\\n", " ").splitlines():
        command = line.split("  #")[0].strip()
        if command and not command.startswith("#"):
            commands.append(re.sub(r"\s+", " ", command))
    return commands


def shell_commands() -> list[str]:
    """Every command the README shows outside ``$ airflow-quota`` console lines: the lines of
    ``bash`` blocks (continuations joined, comments dropped) and the other ``$`` lines, on every page."""
    text = "\n".join(page.read_text() for page in pages())
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        commands += bash_commands(block)
    for block in re.findall(r"```console\n(.*?)```", text, re.S):
        commands += [
            line[2:].strip()
            for line in block.splitlines()
            if line.startswith("$ ") and ("airflow-quota" not in line.split()[1] or needs_a_running_airflow(line[2:]))
        ]
    return commands


EXERCISED_BY: list[tuple[str, str, list[str]]] = [
    # (a command, as a regular expression; the file that runs it; what that file must contain)
    (r"make demo", "tests/test_demo.py", ['"make", "demo"']),
    (
        NEEDS_A_RUNNING_AIRFLOW,
        "tests/airflow/test_doctor.py",
        ['"doctor"', "test_every_line_holds_on_a_wired_installation", "--json"],
    ),
    (r"make test", ".ci/run", ["make test"]),
    (r"docker compose up --build", "tests/test_compose.py", ['"config", "--quiet"']),
    (
        r"airflow backfill create --dag-id quota_daily_training .*--dag-run-conf .*",
        "tests/airflow/test_end_to_end.py",
        ['"backfill"', '"create"', '"--dag-run-conf"', '"quota_priority": 9000'],
    ),
    (r"airflow dags unpause \S+", "tests/airflow/test_end_to_end.py", ['"dags", "unpause"']),
    (
        r"airflow celery worker --queues ml\.[\w.-]+",
        "tests/airflow/test_executor_celery_end_to_end.py",
        ['"celery",', '"worker",', '"--queues",', "QUEUES"],
    ),
    (
        r"airflow-quota compare --trace itp:data/traces/itp-2021 --quota examples/itp-quota\.yaml .*",
        "benchmarks/itp_replay.py",
        ['"compare"', '"--policy"', '"--report"', '"--plots"', "examples/itp-quota.yaml"],
    ),
    # docs/install.md's deploy commands, which need root, a registry or a cluster: the test checks
    # the files they install (the unit with systemd-analyze, the manifests against the schemas)
    (
        r"sudo (cp|install) .*deploy/systemd/.*|sudo systemctl daemon-reload && .*"
        r"|journalctl -u airflow-quota-scheduler -f",
        "tests/test_deploy_files.py",
        ['"verify"', "EnvironmentFile=/etc/airflow/airflow-quota.env"],
    ),
    (
        r"docker (build|push) registry\.example\.com/airflow-quota:\S+( \.)?|docker build -t \S+ \.",
        "tests/test_deploy_files.py",
        ["test_the_image_tag_is_the_packages_version"],
    ),
    (
        r"(helm upgrade --install airflow|kubectl apply -n airflow) .*deploy/kubernetes/.*",
        "tests/test_deploy_files.py",
        ["kubernetes_validate.validate", "CHART_TOP_LEVEL_KEYS"],
    ),
    (r"export AIRFLOW_CONN_QUOTA_DEFAULT=\S+", "airflow_quota/devtools/stack.py", ['"AIRFLOW_CONN_QUOTA_DEFAULT"']),
    (r"airflow-quota apply examples/quota.yaml", "airflow_quota/devtools/stack.py", ['"apply"']),
    (r"airflow-quota scheduler( &)?", "airflow_quota/devtools/stack.py", ['"airflow-quota"), "scheduler"']),
    (
        r"airflow-quota scheduler --aws-batch-job-queue quota-queue --aws-conn-id aws_default",
        "tests/airflow/test_same_dag_on_aws_batch.py",
        ['"--aws-batch-job-queue", "quota-queue", "--aws-conn-id", "aws_default"'],
    ),
    (
        r"airflow dags unpause quota_walkthrough && airflow dags trigger quota_walkthrough",
        "tests/airflow/test_end_to_end.py",
        ['"dags", "unpause", WALKTHROUGH', '"dags", "trigger", WALKTHROUGH'],
    ),
]


INSTALL_PAGE_TEST = "tests/airflow/test_install_page.py"
INSTALL_STEPS = {
    command
    for block in re.findall(
        r"<!-- install-step: [^>]*-->\n```bash\n(.*?)```", (ROOT / "docs" / "install.md").read_text(), re.S
    )
    for command in bash_commands(block)
}
"""The commands of docs/install.md's blocks marked ``<!-- install-step: NAME -->``, which
``tests/airflow/test_install_page.py`` runs, block by block, in a fresh Airflow."""


@pytest.mark.parametrize("command", shell_commands())
def test_every_other_readme_command_is_exercised(command: str) -> None:
    """A command the README or a page shows but this module cannot run is run by the test (or the tool
    the demo and the end-to-end tests share) named here."""
    if command in INSTALL_STEPS:
        source = (ROOT / INSTALL_PAGE_TEST).read_text()
        assert "<!-- install-step:" in source and "page_steps()" in source, (
            f"{INSTALL_PAGE_TEST} no longer runs {command!r}"
        )
        return
    for pattern, path, evidence in EXERCISED_BY:
        if re.fullmatch(pattern, command):
            source = (ROOT / path).read_text()
            missing = [e for e in evidence if e not in source]
            assert not missing, f"{path} no longer runs {command!r}: it lacks {missing}"
            return
    pytest.fail(f"the docs show {command!r}, which no test runs: run it in a test and list it in EXERCISED_BY")
