"""A share's ``access`` rules from the Airflow side: who a task asks as, a submission refused
by the rule fails the task without retry (in a real DAG run too), a run's priority override
needs the ``set_priority`` rule, and the hook's priority changes ask as the task's DAG or the
operating-system user."""

from __future__ import annotations

import json
import tempfile
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from airflow.sdk import Context
from airflow.sdk.exceptions import AirflowFailException, TaskDeferred

from airflow_quota.core.access import Actor
from airflow_quota.exceptions import PriorityChangeDenied
from airflow_quota.hooks.quota import QuotaHook, current_actor, task_actor
from airflow_quota.operators.training import QuotaTrainingOperator
from tests.airflow.conftest import G5, QUOTA, QuotaWorld

RESEARCH_RULES = {
    "submit": {"dags": ["research_*"], "tags": ["research"]},
    "set_priority": {"users": ["alice"]},
}


def with_rules(world: QuotaWorld, access: dict[str, Any] = RESEARCH_RULES) -> None:
    """Apply the tests' quota with ``access`` on the share research, and let the scheduler take it in."""
    shares = [{**s, "access": access} if s["name"] == "research" else s for s in QUOTA["shares"]]
    world.store.apply_config({**QUOTA, "shares": shares})
    world.step()


@dataclass
class TaskInstance:
    dag_id: str
    task_id: str = "train"
    run_id: str = "manual__1"
    map_index: int = -1
    bundle_instance: Any = None
    xcoms: dict[str, Any] = field(default_factory=dict)

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcoms[key] = value


def context(
    dag_id: str, tags: list[str], bundle: str | None = "dags-folder", user: str | None = None, **conf: Any
) -> Context:
    """What the operator reads of a running task's context."""
    return cast(
        Context,
        {
            "ti": TaskInstance(dag_id, bundle_instance=SimpleNamespace(name=bundle) if bundle else None),
            "dag": SimpleNamespace(dag_id=dag_id, tags=set(tags)),
            "dag_run": SimpleNamespace(conf=conf, triggering_user_name=user),
            "params": {},
        },
    )


def operator(**overrides: Any) -> QuotaTrainingOperator:
    arguments: dict[str, Any] = {"task_id": "train", "share": "research", "priority": 5, "instance_preferences": G5}
    return QuotaTrainingOperator(**{"command": "python train.py", **arguments, **overrides})


def test_a_task_asks_as_its_dag_its_tags_its_bundle_and_who_triggered_the_run() -> None:
    actor = task_actor(context("research_nightly", ["research", "gpu"], bundle="ml-repo", user="alice"))
    assert actor == Actor("research_nightly", frozenset({"research", "gpu"}), "ml-repo", "alice")
    assert task_actor(context("scheduled", [], bundle=None)) == Actor("scheduled")


def test_a_submission_the_share_rule_refuses_fails_the_task_without_retry(world: QuotaWorld) -> None:
    with_rules(world)
    with pytest.raises(AirflowFailException) as failure:
        operator().execute(context("prod_nightly", ["prod"]))
    assert str(failure.value).endswith(
        "was not submitted: access.submit: share 'research' takes submissions only from DAGs 'research_*' or "
        "DAGs tagged 'research'; asked by DAG 'prod_nightly' (tags 'prod'; bundle 'dags-folder'): no pattern matches"
    )
    assert world.store.jobs() == []


def test_a_dag_the_rule_lists_submits(world: QuotaWorld) -> None:
    with_rules(world)
    with pytest.raises(TaskDeferred):  # submitted, then deferred to its trigger
        operator().execute(context("any_dag", ["research"]))
    [job] = world.store.jobs()
    assert (job.dag_id, job.share) == ("any_dag", "research")


def test_a_run_override_needs_the_set_priority_rule(world: QuotaWorld) -> None:
    with_rules(world)
    with pytest.raises(AirflowFailException) as failure:
        operator().execute(context("research_nightly", [], user="bob", quota_priority=40))
    assert str(failure.value).endswith(
        "was not submitted (quota_priority=40 from the run's conf): access.set_priority: share 'research' lets "
        "only users 'alice' change its jobs' priorities; asked by DAG 'research_nightly' (no tags; bundle "
        "'dags-folder') and user 'bob': no pattern matches"
    )
    assert world.store.jobs() == []


def test_the_hook_changes_priorities_as_the_operating_system_user_outside_a_task(
    world: QuotaWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = world.submit("j1")  # before the rules: the store's own default actor is nobody known
    with_rules(world)
    monkeypatch.setenv("LOGNAME", "bob")
    assert current_actor() == Actor(user="bob")
    hook = QuotaHook()
    with pytest.raises(PriorityChangeDenied, match=r"asked by user 'bob': no pattern matches$"):
        hook.set_priority(job.id, 7)
    monkeypatch.setenv("LOGNAME", "alice")
    hook.set_priority(job.id, 7)
    with pytest.raises(PriorityChangeDenied, match=r"asked by DAG 'research_x' \(no tags\): no pattern matches$"):
        hook.set_priority(job.id, 8, Actor.of_dag("research_x"))


# -- in a real DAG run ---------------------------------------------------------------------------

DAG_FILE = """
import pendulum
from datetime import timedelta
from airflow.sdk import DAG
from airflow_quota.operators import QuotaTrainingOperator

with DAG("prod_nightly", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), tags=["prod"]):
    QuotaTrainingOperator(
        task_id="train",
        share="research",
        instance_preferences=[{"instance_type": "ml.g5.xlarge", "count": 1}],
        command="true",
        poll_interval=0.2,
        deferrable=False,  # waits in the worker: bounded by execution_timeout, also under dag.test()
        execution_timeout=timedelta(seconds=20),  # were it submitted, no scheduler would ever run it
    )
"""


@pytest.fixture(scope="module")
def airflow_db() -> None:
    """Airflow's metadata database in the tests' temporary AIRFLOW_HOME, never a real one."""
    from airflow import settings
    from airflow.utils import db

    url = str(settings.engine.url) if settings.engine is not None else ""
    if not (url.startswith("sqlite") and tempfile.gettempdir() in url):
        pytest.skip(f"Airflow's metadata database is not a temporary SQLite file: {url}")
    db.initdb()


def test_a_real_dag_run_fails_at_once_when_the_share_refuses_its_dag(
    airflow_db: None,
    world: QuotaWorld,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from airflow.dag_processing.dagbag import DagBag

    with_rules(world)
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "prod_nightly.py").write_text(textwrap.dedent(DAG_FILE))
    bundle = {"name": "prod-repo", "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle"}
    monkeypatch.setenv(
        "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST", json.dumps([{**bundle, "kwargs": {"path": str(dags)}}])
    )
    dag = DagBag(dag_folder=str(dags), safe_mode=False, bundle_name="prod-repo").dags["prod_nightly"]
    run = dag.test()
    assert run.state == "failed"
    assert world.store.jobs() == []
    [ti] = run.get_task_instances()
    assert (ti.state, ti.try_number) == ("failed", 1)
    task_log = capsys.readouterr().out  # dag.test() runs the task here and logs to standard output
    assert (
        "was not submitted: access.submit: share 'research' takes submissions only from DAGs 'research_*' or "
        "DAGs tagged 'research'; asked by DAG 'prod_nightly' (tags 'prod')" in task_log
    ), task_log
