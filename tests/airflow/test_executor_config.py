"""QuotaExecutor's ``executor_config["quota"]``: checked by the operator's own function, with the
operator's messages under ``executor_config.quota.``, at DAG parse time (``quota_config`` in the
DAG file and the cluster policy on every task) and when the executor takes the task."""

from __future__ import annotations

import subprocess
import sys
import uuid
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.exceptions import AirflowClusterPolicyViolation
from airflow.providers.standard.operators.python import PythonOperator

from airflow_quota.exceptions import InvalidInput
from airflow_quota.executors import quota_config
from airflow_quota.executors.config import config_problems, quota_arguments
from airflow_quota.executors.policy import is_quota_executor, task_policy
from airflow_quota.operators.training import QuotaTrainingOperator

G5 = [{"instance_type": "ml.g5.xlarge", "count": 1}]


def operator_problems(**arguments: Any) -> list[str]:
    """What the operator says of the same arguments (its parse-time check)."""
    with pytest.raises(InvalidInput) as refused:
        QuotaTrainingOperator(
            task_id="t", share="research", command="true", **{"instance_preferences": G5, **arguments}
        )
    return [str(p) for p in refused.value.problems]


@pytest.mark.parametrize(
    "arguments",
    [
        {"instance_preferences": [{"instance_type": "ml.g5.xlarge", "count": 0}]},
        {"instance_preferences": [*G5, {"instance_type": "ml.g5.xlarge", "count": 2}]},
        {"instance_preferences": []},
        {"instance_preferences": [{"instance_type": f"ml.g5.{n}xlarge", "count": 1} for n in range(2, 8)]},
        {"instance_preferences": [{"instance_type": "ml.g5.xlarge", "count": 1, "plan": "night"}]},
        {"priority": 10000},
        {"max_pending_time": -5},
        {"preemption_retries": -1},
        {"expected_runtime": 0},
        {"expected_runtime": "an hour"},
    ],
    ids=[
        "count 0",
        "a type twice",
        "no entry",
        "six types",
        "a misspelled key in an entry",
        "priority too high",
        "negative pending time",
        "negative retries",
        "an expected runtime of nothing",
        "an expected runtime in words",
    ],
)
def test_the_executor_says_what_the_operator_says_under_its_own_field_names(arguments: dict[str, Any]) -> None:
    expected = [f"executor_config.quota.{line}" for line in operator_problems(**arguments)]
    config = {"quota": {"share": "research", "instance_preferences": G5, **arguments}}
    assert [str(p) for p in config_problems(config)] == expected
    with pytest.raises(InvalidInput) as refused:
        quota_config(share="research", **{"instance_preferences": G5, **arguments})
    assert [str(p) for p in refused.value.problems] == expected


@pytest.mark.parametrize(
    ("config", "queue", "problem"),
    [
        (None, None, "executor_config.quota: missing: a task of QuotaExecutor says what it needs there"),
        ({"quota": ["research"]}, None, "executor_config.quota: must be a mapping of share, instance_preferences"),
        (
            {"quota": {"share": "research", "instance_preferences": G5, "gpus": 4}},
            None,
            "executor_config.quota.gpus: unknown field; the known ones are share, instance_preferences",
        ),
        (
            {"quota": {"instance_preferences": G5}},
            "default",
            "executor_config.quota.share: missing: name the share here or as the task's queue",
        ),
    ],
    ids=["no quota key", "not a mapping", "unknown field", "no share and the default queue"],
)
def test_a_config_that_is_not_the_quota_shape_names_the_field(config: Any, queue: str | None, problem: str) -> None:
    problems = [str(p) for p in config_problems(config, queue)]
    assert len(problems) == 1 and problems[0].startswith(problem), problems


def test_quota_config_takes_the_expected_runtime_as_a_timedelta_or_seconds() -> None:
    assert quota_config(share="research", instance_preferences=G5, expected_runtime=timedelta(hours=2)) == {
        "quota": {"priority": 0, "share": "research", "instance_preferences": G5, "expected_runtime": 7200.0}
    }
    assert (
        quota_config(share="research", instance_preferences=G5, expected_runtime=90)["quota"]["expected_runtime"] == 90
    )
    assert "expected_runtime" not in quota_config(share="research", instance_preferences=G5)["quota"]


def test_the_task_queue_names_the_share_when_the_config_does_not() -> None:
    assert quota_arguments({"quota": {"instance_preferences": G5}}, "research")["share"] == "research"
    assert quota_arguments({"quota": {"share": "prod", "instance_preferences": G5}}, "research")["share"] == "prod"
    assert config_problems({"quota": {"instance_preferences": G5}}, "research") == []


def test_jinja_is_checked_once_rendered_not_at_parse_time() -> None:
    config = {"quota": {"share": "research", "instance_preferences": G5, "priority": "{{ params.p }}"}}
    assert config_problems(config, parse_time=True) == []
    assert [p.path for p in config_problems(config)] == ["executor_config.quota.priority"]


def test_the_cluster_policy_fails_the_dag_naming_the_field() -> None:
    bad = {"quota": {"share": "research", "instance_preferences": [{"instance_type": "ml.g5.xlarge", "count": 0}]}}
    task = PythonOperator(task_id="train", python_callable=print, executor="quota", executor_config=bad)
    with pytest.raises(AirflowClusterPolicyViolation, match=r"instance_preferences\[0\]\.count"):
        task_policy(task)
    good = PythonOperator(
        task_id="ok",
        python_callable=print,
        executor="quota",
        executor_config=quota_config(share="research", instance_preferences=G5),
    )
    task_policy(good)


def test_a_quota_config_on_another_executor_is_refused_not_ignored() -> None:
    task = PythonOperator(
        task_id="train", python_callable=print, executor_config=quota_config(share="research", instance_preferences=G5)
    )
    with pytest.raises(AirflowClusterPolicyViolation, match="give it executor='quota'"):
        task_policy(task)
    task_policy(PythonOperator(task_id="plain", python_callable=print))  # no quota config: not ours


def test_the_executor_is_named_by_its_class_or_path() -> None:
    assert is_quota_executor("QuotaExecutor") and is_quota_executor("airflow_quota.executors.QuotaExecutor")
    assert not is_quota_executor("LocalExecutor") and not is_quota_executor(None)


def test_the_package_imports_before_airflow_does() -> None:
    """Airflow loads the policy (an entry point) while it initialises itself: importing the
    executors package first must not be a circular import."""
    script = (
        "from airflow_quota.executors import quota_config, QuotaExecutor\n"
        "print(quota_config(share='a', instance_preferences=[{'instance_type': 'ml.g5.xlarge', 'count': 1}]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "'share': 'a'" in done.stdout


def test_held_tasks_use_none_of_the_executors_slots() -> None:
    from airflow.executors.workloads import BundleInfo, ExecuteTask
    from airflow.executors.workloads.task import TaskInstanceDTO

    from airflow_quota.executors import QuotaExecutor

    class RunConf:
        """Stands in for the scheduler's session: no run row (an empty conf), no DAG tags."""

        def execute(self, query: Any) -> Any:
            return SimpleNamespace(first=lambda: None)

        def scalars(self, query: Any) -> list[str]:
            return []

    executor = QuotaExecutor(parallelism=2)
    for name in ("a", "b", "c"):
        ti = TaskInstanceDTO(
            id=uuid.uuid4(),
            task_id=name,
            dag_id="dag",
            run_id="run",
            try_number=1,
            dag_version_id=uuid.uuid4(),
            map_index=-1,
            pool_slots=1,
            priority_weight=1,
            queue="research",
            executor_config={"quota": {"instance_preferences": G5}},
        )
        workload = ExecuteTask(
            ti=ti, token="", dag_rel_path="dag.py", bundle_info=BundleInfo(name="dags-folder"), log_path=None
        )
        executor.queue_workload(workload, RunConf())  # type: ignore[arg-type]
    assert len(executor.held) == 3 and not executor.queued_tasks
    assert executor.slots_available == 2
    assert all(h.problem is None and h.arguments["share"] == "research" for h in executor.held.values())
    with pytest.raises(NotImplementedError):
        executor.revoke_task(ti=None)  # type: ignore[arg-type]


SIX_TYPES = [{"instance_type": f"ml.g5.{n}xlarge", "count": 1} for n in range(2, 8)]
KNOWN_FIELDS = (
    "share, instance_preferences, priority, max_pending_time, preemption_retries, checkpoint_uri, checkpoint_interval,"
    " expected_runtime"
)


@pytest.mark.parametrize(
    ("arguments", "problems"),
    [
        (
            {"instance_preferences": SIX_TYPES},
            ["executor_config.quota.instance_preferences: 6 instance types listed; a job lists at most 5"],
        ),
        (
            {"instance_preferences": [{"instance_type": "ml.g5.xlarge", "cont": 1}]},
            [
                "executor_config.quota.instance_preferences[0].count: required field is missing",
                "executor_config.quota.instance_preferences[0].cont: unknown key; did you mean 'count'?"
                " The known ones are instance_type, count, training_plan",
            ],
        ),
        (
            {"instance_preference": G5},
            [
                "executor_config.quota.instance_preferences: required field is missing",
                "executor_config.quota.instance_preference: unknown field; did you mean 'instance_preferences'?"
                f" The known ones are {KNOWN_FIELDS}",
            ],
        ),
        (
            {"instance_preferences": G5, "gpus": 4},
            [f"executor_config.quota.gpus: unknown field; the known ones are {KNOWN_FIELDS}"],
        ),
    ],
    ids=["six types", "a misspelled key in an entry", "a misspelled keyword", "an unknown keyword"],
)
def test_quota_config_names_a_bad_keyword_in_our_words_not_a_type_error(
    arguments: dict[str, Any], problems: list[str]
) -> None:
    """A typo of a keyword is an ``InvalidInput`` naming it, the known ones and the closest (not
    Python's bare ``TypeError``); too many preferences says how many and the limit."""
    with pytest.raises(InvalidInput) as refused:
        quota_config(share="research", **arguments)
    assert [str(p) for p in refused.value.problems] == problems


def test_an_unknown_field_of_the_config_is_named_with_the_closest_known_one() -> None:
    config = {"quota": {"share": "research", "instance_preferences": G5, "priorty": 3}}
    assert [str(p) for p in config_problems(config)] == [
        f"executor_config.quota.priorty: unknown field; did you mean 'priority'? The known ones are {KNOWN_FIELDS}"
    ]
