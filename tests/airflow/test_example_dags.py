"""The example DAGs of ``dags/``: they import cleanly in a real ``DagBag``, and they run.

The run tests use ``dag.test()`` (tasks in this process, triggers run inline, so the training
tasks really defer and resume) against a SQLite quota database, with the real ``QuotaService``
stepping every 0.1 s on the wall clock in a background thread and the real local backend, so
``dags/train_script.py`` really trains. ``dag.test()`` runs one task at a time, so these runs
show placement, fallback and the priority override, not concurrency (the walkthrough's
preemptions need a real Airflow with concurrent tasks: ``test_end_to_end.py`` runs it).
"""

from __future__ import annotations

import json
import re
import tempfile
import threading
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from airflow.dag_processing.dagbag import DagBag

from airflow_quota.operators import QuotaTrainingOperator
from airflow_quota.service.backends.local import LocalBackend
from airflow_quota.service.scheduler import QuotaService
from airflow_quota.store.engine import make_engine, migrate
from airflow_quota.store.repository import QuotaStore
from tests.conftest import ROOT

DAGS = ROOT / "dags"
EXPECTED_TASKS = {
    "quota_walkthrough": 11,
    "quota_preference_fallback": 5,
    "quota_daily_training": 3,
    "quota_taskflow_training": 3,
    "quota_executor_training": 2,
    "quota_sagemaker_training": 1,
}


@pytest.fixture(scope="module")
def dagbag(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DagBag]:
    """The example DAGs, parsed with their checkpoints under a temporary directory (read at parse time)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AIRFLOW_QUOTA_EXAMPLE_CHECKPOINTS", str(tmp_path_factory.mktemp("checkpoints")))
        # the hybrid setting quota_executor_training.py needs (an unknown executor fails the parse)
        patch.setenv("AIRFLOW__CORE__EXECUTOR", "LocalExecutor,quota:airflow_quota.executors.QuotaExecutor")
        forget_loaded_executors(patch)
        yield DagBag(dag_folder=str(DAGS), safe_mode=False)


def forget_loaded_executors(patch: pytest.MonkeyPatch) -> None:
    """Airflow's executor loader keeps the executors it first read from the configuration for
    the life of the process: an earlier test in this worker may have loaded another set. Fresh
    caches for the fixture's time, so the setting above is read (the old ones come back after)."""
    from airflow.executors import executor_loader

    patch.setattr(executor_loader, "_executor_names", [])
    for name in (
        "_alias_to_executors_per_team",
        "_module_to_executors_per_team",
        "_classname_to_executors_per_team",
    ):
        patch.setattr(executor_loader, name, defaultdict(dict))
    patch.setattr(executor_loader, "_team_name_to_executors", defaultdict(list))


def test_every_example_dag_file_imports_without_errors(dagbag: DagBag) -> None:
    assert dagbag.import_errors == {}
    assert {dag_id: len(dag.tasks) for dag_id, dag in dagbag.dags.items()} == EXPECTED_TASKS
    files = {Path(dag.fileloc).name for dag in dagbag.dags.values()}
    assert files == {f"{dag_id}.py" for dag_id in EXPECTED_TASKS}


def test_the_daily_dag_declares_the_priority_override(dagbag: DagBag) -> None:
    dag = dagbag.dags["quota_daily_training"]
    param = dag.params.get_param("quota_priority")
    assert param.value is None and param.schema["maximum"] == 9999
    assert dag.catchup is False
    assert [t.task_id for t in dag.tasks if t.task_type == "QuotaTrainingOperator"] == ["train_encoder", "train_ranker"]


def test_the_walkthrough_submits_in_the_walkthroughs_order(dagbag: DagBag) -> None:
    dag = dagbag.dags["quota_walkthrough"]
    training = {t.task_id: (t.share, t.priority) for t in dag.tasks if isinstance(t, QuotaTrainingOperator)}
    assert training == {
        "qs1_high": ("qs1", 3),
        "qs1_med": ("qs1", 2),
        "qs1_low": ("qs1", 1),
        "qs2_job": ("qs2", 1),
        "qs3_job": ("qs3", 1),
    }
    # each step waits for the quota state it needs, checked by the gate before it
    upstream = {t.task_id: t.upstream_task_ids for t in dag.tasks}
    assert upstream == {
        "qs1_high": set(),
        "high_running": set(),
        "qs1_med": {"high_running"},
        "med_borrowing": {"high_running"},
        "qs1_low": {"med_borrowing"},
        "low_waiting": {"med_borrowing"},
        "qs2_job": {"low_waiting"},
        "qs2_running": {"low_waiting"},
        "qs3_job": {"qs2_running"},
        "qs3_running": {"qs2_running"},
        "raise_qs1_low": {"qs3_running"},
    }
    # a victim is preempted only once it has written a checkpoint
    assert dag.get_task("low_waiting").op_kwargs["checkpointed"] == ["qs1_med"]
    assert dag.get_task("qs3_running").op_kwargs["checkpointed"] == ["qs1_high"]
    # qs1_low is raised only when the pool is full and qs1_high is qs1's only running job
    assert dag.get_task("qs3_running").op_args[0] == {
        "qs3_job": "RUNNING",
        "qs2_job": "RUNNING",
        "qs1_high": "RUNNING",
        "qs1_med": "RUNNABLE",
        "qs1_low": "RUNNABLE",
    }


def test_the_fallback_dags_docstring_shows_the_quota_it_expects(dagbag: DagBag) -> None:
    train = dagbag.dags["quota_preference_fallback"].get_task("train")
    assert isinstance(train, QuotaTrainingOperator)
    shown = (DAGS / "quota_preference_fallback.py").read_text().split("in YAML)::")[1].split("Save it")[0]
    fallback = _module_globals(dagbag, "quota_preference_fallback")
    assert yaml.safe_load(shown) == fallback["QUOTA"]
    assert train.instance_preferences == [
        {"instance_type": "ml.g5.xlarge", "count": 1},
        {"instance_type": "ml.g4dn.xlarge", "count": 1},
    ]


def _module_globals(dagbag: DagBag, dag_id: str) -> dict[str, Any]:
    """The globals of the module a DAG was loaded from (DagBag imports it under its own name)."""
    callable_ = next(t for t in dagbag.dags[dag_id].tasks if hasattr(t, "python_callable")).python_callable
    namespace: dict[str, Any] = callable_.__globals__
    return namespace


# -- running them ------------------------------------------------------------------------------


@dataclass
class RunningQuota:
    store: QuotaStore
    attempts: Path

    def training_log(self, job_id: int, attempt: int = 1) -> str:
        return (self.attempts / f"{job_id}-{attempt}" / "training.log").read_text()


@pytest.fixture(scope="module")
def airflow_db() -> None:
    """Airflow's metadata database, created once in the tests' AIRFLOW_HOME (a temporary
    directory set by conftest.py before Airflow was imported); never a real one."""
    from airflow import settings
    from airflow.utils import db

    url = str(settings.engine.url) if settings.engine is not None else ""
    if not (url.startswith("sqlite") and tempfile.gettempdir() in url):
        pytest.skip(f"Airflow's metadata database is not a temporary SQLite file: {url}")
    db.initdb()


@pytest.fixture
def quota(airflow_db: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dagbag: DagBag) -> Iterator[RunningQuota]:
    """The fallback DAG's quota (the walkthrough's plus a g4dn for qs3) in a SQLite database,
    the quota scheduler with the local backend stepping every 0.1 s in a thread, and Airflow
    pointed at it: ``AIRFLOW_CONN_QUOTA_DEFAULT`` and a dags-folder bundle on ``dags/``."""
    url = f"sqlite:///{tmp_path / 'quota.db'}"
    engine = make_engine(url)
    migrate(engine)
    store = QuotaStore(engine)
    store.apply_config(_module_globals(dagbag, "quota_preference_fallback")["QUOTA"])
    monkeypatch.setenv("AIRFLOW_CONN_QUOTA_DEFAULT", url)
    bundle = {"name": "dags-folder", "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle"}
    monkeypatch.setenv(
        "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST", json.dumps([{**bundle, "kwargs": {"path": str(DAGS)}}])
    )
    attempts = tmp_path / "attempts"
    service = QuotaService(engine, {"local": LocalBackend(attempts)}, poll_seconds=0.05)
    stop = threading.Event()
    errors: list[BaseException] = []

    def loop() -> None:
        while not stop.is_set():
            try:
                service.step()
            except BaseException as exc:  # surfaced by the test, not lost in the thread
                errors.append(exc)
                return
            stop.wait(0.1)

    thread = threading.Thread(target=loop, name="quota-scheduler", daemon=True)
    thread.start()
    try:
        yield RunningQuota(store, attempts)
    finally:
        stop.set()
        thread.join(10)
        engine.dispose()
    assert not errors, errors


def _fast(dag: Any) -> None:
    """Poll every 0.2 s instead of the examples' 2 s (the DAG objects dag.test() runs)."""
    for t in dag.tasks:
        if hasattr(t, "poll_interval"):
            t.poll_interval = 0.2
        if hasattr(t, "poke_interval"):
            t.poke_interval = 0.2


def test_the_daily_dag_runs_with_a_priority_override(quota: RunningQuota, dagbag: DagBag) -> None:
    dag = dagbag.dags["quota_daily_training"]
    _fast(dag)
    run = dag.test(run_conf={"quota_priority": 9000})
    assert run.state == "success"
    jobs = {j.task_id: j for j in quota.store.jobs()}
    root = Path(_module_globals(dagbag, "quota_daily_training")["CHECKPOINTS"])
    assert root.name.startswith("checkpoints") and (root / "quota_daily_training").is_dir()
    assert {t: (j.state, j.priority, j.instance_type) for t, j in jobs.items()} == {
        "train_encoder": ("SUCCEEDED", 9000, "ml.g5.xlarge"),
        "train_ranker": ("SUCCEEDED", 9000, "ml.g5.xlarge"),
    }
    log = quota.training_log(jobs["train_encoder"].id)
    assert "sized for 1x ml.g5.xlarge with 1 GPU(s): global batch 32 (32 per GPU)" in log, log
    assert re.search(r"done at step 40: w=", log), log


def test_the_fallback_dag_lands_on_the_second_entry(
    quota: RunningQuota, dagbag: DagBag, monkeypatch: pytest.MonkeyPatch
) -> None:
    dag = dagbag.dags["quota_preference_fallback"]
    _fast(dag)
    # the rival holds the g5 for 6 s instead of 20: long enough for train to be placed first
    monkeypatch.setitem(_module_globals(dagbag, "quota_preference_fallback"), "RIVAL_SECONDS", 6)
    run = dag.test()
    assert run.state == "success"
    jobs = {j.task_id: j for j in quota.store.jobs()}
    assert {t: (j.state, j.instance_type) for t, j in jobs.items()} == {
        "rival_takes_g5": ("SUCCEEDED", "ml.g5.xlarge"),
        "train": ("SUCCEEDED", "ml.g4dn.xlarge"),
    }
    assert "sized for 1x ml.g4dn.xlarge with 1 GPU(s)" in quota.training_log(jobs["train"].id)


def test_the_taskflow_dag_parses_with_values_known_only_at_run_time(dagbag: DagBag) -> None:
    train = dagbag.dags["quota_taskflow_training"].get_task("train")
    assert isinstance(train, QuotaTrainingOperator)
    assert train.instance_preferences == [{"instance_type": "ml.g5.xlarge", "count": "{{ params.gpus }}"}]
    assert {"plan"} == train.upstream_task_ids


def test_the_taskflow_dag_trains_with_what_its_plan_decided(quota: RunningQuota, dagbag: DagBag) -> None:
    dag = dagbag.dags["quota_taskflow_training"]
    _fast(dag)
    run = dag.test(run_conf={"urgent": True, "gpus": 1})
    assert run.state == "success"
    [job] = quota.store.jobs()
    assert (job.task_id, job.state, job.share, job.priority, job.instance_type, job.count) == (
        "train",
        "SUCCEEDED",
        "qs1",
        3,
        "ml.g5.xlarge",
        1,
    )
    assert job.request["max_pending_seconds"] == 600.0
