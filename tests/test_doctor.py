"""``airflow-quota doctor``'s pure parts, without Airflow running: what each reading means (a
revision, a leader's lease and backends, the executor setting against the DAGs' executor names,
two database URLs, the api-server's answer), the lines and the JSON document, the per-check
timeout, and bad command-line input. ``tests/airflow/test_doctor.py`` runs it against a real
Airflow."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import pytest

from airflow_quota.doctor import (
    EXECUTOR_SETTING,
    Check,
    ConfiguredExecutor,
    bounded,
    executor_check,
    plugin_answer,
    report,
    revision_check,
    same_database,
    scheduler_check,
    task_executors,
)
from airflow_quota.store.lock import SchedulerHealth
from tests.conftest import cli

URL = "postgresql+psycopg://quota:secret@db:5432/quota"
LOCAL = ConfiguredExecutor(None, "airflow.executors.local_executor.LocalExecutor")
QUOTA = ConfiguredExecutor("quota", "airflow_quota.executors.QuotaExecutor")


def test_a_line_says_ok_or_fail_with_the_fix() -> None:
    assert Check("triggerer", True, "TriggererJob on h").line() == "ok   triggerer        TriggererJob on h"
    failing = Check("triggerer", False, "no TriggererJob heartbeat in 92 s", 'start "airflow triggerer"')
    assert failing.line() == 'FAIL triggerer        no TriggererJob heartbeat in 92 s: start "airflow triggerer"'


def test_the_json_document_has_every_check_with_name_ok_detail_and_fix() -> None:
    checks = [Check("a", True, "fine"), Check("b", False, "broken", "mend it")]
    document = json.loads(report(checks, as_json=True))
    assert document == {
        "ok": False,
        "checks": [
            {"name": "a", "ok": True, "detail": "fine", "fix": None},
            {"name": "b", "ok": False, "detail": "broken", "fix": "mend it"},
        ],
    }
    assert report(checks, as_json=False).splitlines()[1] == "FAIL b                broken: mend it"


def test_the_revision_line_hides_the_password_and_names_the_fix() -> None:
    at_head = revision_check(URL, "X", "0012", "0012", known=True)
    assert at_head.ok and at_head.detail == "postgresql+psycopg://quota:***@db:5432/quota at revision 0012 (head)"
    empty = revision_check(URL, "AIRFLOW_CONN_QUOTA_DEFAULT", None, "0012", known=False)
    assert not empty.ok and "from AIRFLOW_CONN_QUOTA_DEFAULT) answers but has no quota tables" in empty.detail
    assert empty.fix is not None and empty.fix.startswith('run "airflow-quota db migrate"')
    behind = revision_check(URL, "X", "0010", "0012", known=True)
    assert not behind.ok and behind.detail.endswith("is at revision 0010, not the head 0012")
    ahead = revision_check(URL, "X", "0099", "0012", known=False)
    assert not ahead.ok and "does not know" in ahead.detail and ahead.fix is not None and "install" in ahead.fix
    assert "secret" not in " ".join(c.line() for c in (at_head, empty, behind, ahead))


def health(
    silent: float = 1.0, left: float = 8.0, backends: tuple[str, ...] | None = ("airflow", "local")
) -> SchedulerHealth:
    return SchedulerHealth("host:12", silent, 2.5, left, backends)


def test_a_leading_scheduler_running_the_backends_the_live_jobs_name_holds() -> None:
    check = scheduler_check(health(), {"airflow": 3, "local": 1})
    assert (
        check.ok and check.detail == "host:12 leads, heartbeat 1 s ago (limit 7.5 s), runs airflow, local (4 live jobs)"
    )


@pytest.mark.parametrize(
    ("reading", "words"),
    [
        (SchedulerHealth(None, None, None), "no quota scheduler has ever led"),
        (health(left=-1.7e9), "none leads: the last leader, host:12, stopped and gave up its lease"),
        (health(silent=12.0, left=-2.0), "host:12, let its lease run out 2 s ago; heartbeat 12 s ago (limit 7.5 s)"),
        (health(silent=30.0, left=2.0), "host:12, holds its lease but stopped beating; heartbeat 30 s ago"),
    ],
)
def test_no_leader_fails_with_how_to_start_one(reading: SchedulerHealth, words: str) -> None:
    check = scheduler_check(reading, {})
    assert not check.ok and words in check.detail
    assert check.fix is not None and check.fix.startswith('start one: "airflow-quota scheduler"')


def test_live_jobs_naming_a_backend_the_leader_does_not_run_fail() -> None:
    check = scheduler_check(health(), {"airflow": 1, "sagemaker": 2})
    assert not check.ok
    assert check.detail == "host:12 leads but runs only airflow, local; 2 live jobs name sagemaker"
    unrecorded = scheduler_check(health(backends=None), {"sagemaker": 2})
    assert unrecorded.ok and "not recorded" in unrecorded.detail


def test_tasks_on_quota_need_quota_executor_in_the_executor_setting() -> None:
    used = {"quota": ["train_a", "train_b"]}
    missing = executor_check("LocalExecutor", [LOCAL], used)
    assert not missing.ok
    assert missing.detail == (
        "tasks use executor=\"quota\" in train_a, train_b, which [core] executor = 'LocalExecutor' does not configure"
    )
    assert missing.fix is not None and EXECUTOR_SETTING in missing.fix
    served = executor_check(EXECUTOR_SETTING, [LOCAL, QUOTA], used)
    assert (
        served.ok and served.detail == "[core] executor has QuotaExecutor as 'quota', used by 2 DAGs (train_a, train_b)"
    )


def test_an_executor_name_is_served_by_alias_path_or_class_name_only() -> None:
    other_alias = ConfiguredExecutor("gpu", "airflow_quota.executors.QuotaExecutor")
    assert not executor_check("LocalExecutor,gpu:…", [LOCAL, other_alias], {"quota": ["d"]}).ok
    assert executor_check("LocalExecutor,gpu:…", [LOCAL, other_alias], {"QuotaExecutor": ["d"]}).ok
    assert executor_check("LocalExecutor,gpu:…", [LOCAL, other_alias], {"LocalExecutor": ["d"]}).ok


def test_no_task_on_quota_passes_and_says_so() -> None:
    check = executor_check("LocalExecutor", [LOCAL], {})
    assert check.ok and check.detail == 'no DAG has a task with executor="quota"; [core] executor has no QuotaExecutor'


def test_the_executor_names_of_a_serialized_dag() -> None:
    serialized = {
        "dag": {
            "tasks": [
                {"__type": "operator", "__var": {"task_id": "a", "executor": "quota"}},
                {"__type": "operator", "__var": {"task_id": "b"}},
            ]
        }
    }
    assert task_executors(serialized) == {"quota"}
    assert task_executors({}) == set()


def test_two_spellings_of_one_database_are_the_same_database() -> None:
    assert same_database("postgresql://quota:a@db:5432/quota", "postgres://quota:b@db:5432/quota")
    assert not same_database("postgresql://quota@db:5432/quota", "postgresql://quota@db:5432/other")
    assert not same_database("sqlite:////tmp/a.db", "postgresql://quota@db:5432/quota")


def test_only_the_plugins_json_answer_counts_as_the_plugin() -> None:
    assert plugin_answer(401, "application/json")
    assert not plugin_answer(200, "text/html; charset=utf-8")  # Airflow's UI answers any path
    assert not plugin_answer(404, "application/json")


@pytest.fixture
def release() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()


def test_a_check_that_never_answers_fails_at_its_timeout(release: threading.Event) -> None:
    def hangs() -> Check:
        release.wait()
        return Check("plugin", True, "never")

    check = bounded("plugin", hangs, 0.2)
    assert not check.ok and check.detail == "no answer in 0.2 s"


def test_a_check_that_raises_fails_with_the_message_not_a_traceback() -> None:
    def breaks() -> Check:
        raise RuntimeError("the metadata database said no\nmore")

    check = bounded("triggerer", breaks, 5)
    assert not check.ok and check.detail == "could not be checked: RuntimeError: the metadata database said no"


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--no-such-flag"], "unrecognized arguments: --no-such-flag"), (["--timeout", "0"], "must be ≥ 0.1, not 0")],
)
def test_bad_input_exits_2_without_a_traceback(args: list[str], message: str) -> None:
    run = cli("doctor", *args)
    assert run.code == 2 and message in run.stderr, run.stderr
    assert "Traceback" not in run.stderr and run.stdout == ""
