"""Random input to every command that reads input (issue 14): the only answers are exit 0
(accepted) and exit 2 (refused, ``path: message`` on standard error), never a traceback.

The documents are random JSON values, and valid documents (a quota file, a scenario, a job
file) with one node replaced by a random value, written as YAML, as JSON, or as random bytes;
job keys are random text, priorities and ``--until`` random numbers. The CLI's ``main`` runs
in-process so that a few hundred examples take seconds: any exception it lets out fails the
test with its traceback, as a user would have seen it.
"""

from __future__ import annotations

import copy
import io
import json
import math
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_quota.cli import main
from airflow_quota.core.model import JobRequest
from airflow_quota.store.engine import make_engine, migrate
from airflow_quota.store.repository import QuotaStore
from tests.conftest import ROOT

G5 = "ml.g5.xlarge"
WALKTHROUGH = ROOT / "examples" / "walkthrough.yaml"
QUOTA: dict[str, Any] = {
    "pool": {"capacity": {G5: 4}, "training_plans": []},
    "shares": [
        {"name": "qs1", "capacity_limits": {G5: 2}, "strategy": "LEND_AND_BORROW", "borrow_limit": 50},
        {"name": "qs2", "capacity_limits": {G5: 1}, "max_priority": 10},
    ],
    "instance_types": {"ml.custom.large": {"gpus": 1, "hourly_price": 1.5}},
}
JOB: dict[str, Any] = {
    "name": "j1",
    "share": "qs1",
    "priority": 1,
    "preferences": [{"instance_type": G5, "count": 1}],
    "checkpoint_uri": "s3://bucket/j1",
    "retry_on": ["ExitCode:137"],
    "backend": "fake",
    "training": {"duration": 5, "env": {"A": "1"}},
    "client_token": "token-1",
    "dag_id": "dag",
    "task_id": "task",
    "run_id": "run",
}
SCENARIO: dict[str, Any] = {
    "quota": QUOTA,
    "events": [
        {"at": 0, "submit": {**{k: JOB[k] for k in ("name", "share", "priority", "preferences")}, "duration": 60}},
        {"at": 10, "set_priority": {"job": "j1", "priority": 3}},
        {"at": 20, "cancel": {"job": "j1"}},
    ],
}

SETTINGS = settings(
    max_examples=60,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=30)
    | st.sampled_from(["", "ml.g5.xlarge", "qs1", "LEND", "2026-01-01", "{{ x }}", "<b>x</b>\n", "é" * 300])
)
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=12,
)


def _nodes(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every path into a document (keys of mappings, indexes of lists), the root first."""
    yield path
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _nodes(child, (*path, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from _nodes(child, (*path, index))


def _replaced(document: dict[str, Any], which: int, value: Any) -> Any:
    """``document`` with its ``which``-th node (modulo their number) replaced by ``value``."""
    paths = list(_nodes(document))
    path = paths[which % len(paths)]
    if not path:
        return value
    changed = copy.deepcopy(document)
    node = changed
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return changed


names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_", min_size=1, max_size=12)
bases = st.one_of(
    st.sampled_from([QUOTA, SCENARIO]),
    names.map(lambda name: {**JOB, "name": name, "client_token": f"token-{name}"}),  # a new job each time
)
documents = st.one_of(
    json_values,
    st.builds(_replaced, bases, st.integers(0, 200), scalars),
    st.builds(_replaced, bases, st.integers(0, 200), json_values),
)


def _as_text(document: Any, form: str) -> str:
    if form == "json":
        return json.dumps(document)
    return yaml.safe_dump(document, allow_unicode=True)


file_contents = st.one_of(
    st.tuples(documents, st.sampled_from(["yaml", "json"])).map(lambda pair: _as_text(*pair).encode()),
    st.binary(max_size=120),
)


def run(*args: str) -> tuple[int, str, str]:
    """``airflow-quota ARGS`` in this process: exit status, standard output, standard error."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse refusing the arguments: usage, exit 2
            code = exc.code if isinstance(exc.code, int) else 2
    return code, out.getvalue(), err.getvalue()


def assert_answered(code: int, stdout: str, stderr: str, args: tuple[str, ...]) -> None:
    shown = f"airflow-quota {' '.join(a[:60] for a in args)}\nexit {code}\n{stdout[-500:]}\n{stderr[-2000:]}"
    if args[0] == "aws-batch" and code == 1:  # valid input, and AWS out of reach (``no_aws``): said so
        assert "cannot call AWS Batch" in stderr, shown
        return
    assert code in (0, 2), shown
    assert "Traceback" not in stderr, shown
    if code == 2:
        assert stderr.strip(), shown  # a refusal says why


@pytest.fixture(scope="module")
def quota_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One SQLite quota database with ``QUOTA`` applied and a job submitted, for every example."""
    url = f"sqlite:///{tmp_path_factory.mktemp('fuzz') / 'quota.db'}"
    engine = make_engine(url)
    migrate(engine)
    store = QuotaStore(engine)
    store.apply_config(QUOTA)
    request = {k: JOB[k] for k in ("name", "share", "priority", "preferences")}
    store.submit(JobRequest.model_validate(request), "fake", {"duration": 5})
    yield url
    engine.dispose()


@pytest.fixture(autouse=True, scope="module")
def no_aws() -> Iterator[None]:
    """The aws-batch commands' calls go nowhere, at once: input they accept ends there (exit 1)."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in {"AWS_ENDPOINT_URL_BATCH": "http://127.0.0.1:9", "AWS_MAX_ATTEMPTS": "1",
                            "AWS_DEFAULT_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "x",
                            "AWS_SECRET_ACCESS_KEY": "y"}.items():  # fmt: skip
            patch.setenv(name, value)
        yield


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz-files")


@SETTINGS
@given(content=file_contents)
def test_every_command_that_reads_a_file_answers_random_files_with_exit_0_or_2(
    quota_url: str, folder: Path, content: bytes
) -> None:
    path = folder / "input.yaml"
    path.write_bytes(content)
    for args in (
        ("validate", str(path)),
        ("simulate", str(path), "--json", "--until", "600"),
        ("apply", str(path), "--db", quota_url),
        ("jobs", "submit", str(path), "--db", quota_url),
        ("aws-batch", "plan", str(path), "--job-queue", "quota-queue"),
    ):
        assert_answered(*run(*args), args)


job_keys = st.one_of(
    st.text(max_size=40),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.sampled_from(["1", "j1", str(2**63), str(2**63 - 1), "0", "٣", "²", "1" * 5000]),
)
priorities = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.floats().map(lambda f: repr(f) if not math.isnan(f) else "nan"),
    st.text(max_size=10),
)


waits = st.sampled_from(["-1", "nan", "inf", "-inf", "1e400", "3601", "0", "0.01", "", "x"])
"""``--wait`` values: out of range, or short (a valid long one would wait for no scheduler)."""


@SETTINGS
@given(key=job_keys, priority=priorities, wait=waits)
def test_every_command_that_takes_a_job_answers_random_keys_with_exit_0_or_2(
    quota_url: str, key: str, priority: str, wait: str
) -> None:
    for args in (
        ("jobs", "show", key, "--db", quota_url),
        ("jobs", "set-priority", key, priority, "--db", quota_url, "--wait", "0"),
        ("jobs", "set-priority", "j1", "1", "--db", quota_url, "--wait", wait),
        ("jobs", "cancel", key, "--db", quota_url),
        ("simulate", str(WALKTHROUGH), "--json", "--until", priority),
        ("aws-batch", "import", "--job-queue", key),
    ):
        assert_answered(*run(*args), args)
