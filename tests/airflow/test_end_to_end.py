"""End to end in a real Airflow 3.3: scheduler, dag-processor, triggerer and api-server processes,
LocalExecutor with two worker slots, a PostgreSQL metadata database, and ``airflow-quota
scheduler`` with the local backend on a second PostgreSQL database.

1. The example walkthrough (``dags/quota_walkthrough.py``, each step gated on the quota state)
   runs to success: the decision log holds a CROSS_SHARE and an
   IN_SHARE preemption, the preempted trainings resume from their checkpoints, the training tasks
   waited ``deferred`` (no worker slot) whenever their quota jobs waited, and the task logs tell
   the quota story.
2. ``airflow backfill create … --dag-run-conf '{"quota_priority": 9000}'`` on the example
   ``quota_daily_training``: the backfill's quota jobs carry priority 9000 and its runs succeed.
3. The TaskFlow example (``dags/quota_taskflow_training.py``: a ``@task``'s outputs into the
   operator) triggered while the quota scheduler is stopped: the API says no scheduler runs, the
   waiting task's log warns once; restarted, the run succeeds, the task log shows the training's
   own lines and the downstream ``@task`` reads the summary.

The PostgreSQL server is the one of ``QUOTA_TEST_POSTGRES_URL`` (an admin URL), else
127.0.0.1:5432. Each module run makes two fresh databases and drops them at the end.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from airflow_quota.devtools.stack import AirflowStack
from tests.airflow.stacks import airflow_on_postgres
from tests.waiting import wait_for

# Airflow's start (up to START_TIMEOUT) counts towards the first test, and the walkthrough
# alone may take WALKTHROUGH_TIMEOUT: twice the default limit (pyproject.toml) for each test.
pytestmark = pytest.mark.timeout(1200)

REPO = Path(__file__).resolve().parents[2]

WALKTHROUGH = "quota_walkthrough"
DAILY = "quota_daily_training"
TASKFLOW = "quota_taskflow_training"
DAG_FILES = ("quota_walkthrough.py", "quota_daily_training.py", "quota_taskflow_training.py", "train_script.py")
TRAININGS = ("qs1_high", "qs1_med", "qs1_low", "qs2_job", "qs3_job")
LIVE = ("SUBMITTED", "RUNNABLE", "SCHEDULED", "STARTING", "RUNNING")
SLOT_STATES = ("queued", "running")
"""Task instance states that hold (or are about to take) a worker slot."""

START_TIMEOUT = 240.0
WALKTHROUGH_TIMEOUT = 360.0
BACKFILL_TIMEOUT = 180.0


@pytest.fixture(scope="module")
def airflow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AirflowStack]:
    with airflow_on_postgres(
        "e2e",
        tmp_path_factory.mktemp("airflow-e2e"),
        # the example walkthrough, daily and TaskFlow DAGs and their training script, as they are
        dags=[REPO / "dags" / name for name in DAG_FILES],
        quota_config=REPO / "examples" / "quota.yaml",
        parallelism=2,
        wait_for_dags=[WALKTHROUGH, DAILY, TASKFLOW],
        start_timeout=START_TIMEOUT,
    ) as stack:
        yield stack


@dataclass
class Sample:
    at: float
    tis: dict[str, str | None]
    jobs: dict[str, str]
    """task id -> its quota job's state"""


class Sampler(threading.Thread):
    """Reads the training tasks' states in Airflow and their quota jobs' states, twice a second."""

    def __init__(self, af: AirflowStack, dag_id: str, run_id: str) -> None:
        super().__init__(daemon=True)
        self.af, self.dag_id, self.run_id = af, dag_id, run_id
        self.samples: list[Sample] = []
        self.errors: list[str] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                tis = self.af.ti_states(self.dag_id, self.run_id)
                jobs = {
                    j.task_id: j.state
                    for j in self.af.store.jobs(dag_id=self.dag_id)
                    if j.run_id == self.run_id and j.task_id
                }
                self.samples.append(Sample(time.monotonic(), tis, jobs))
            except Exception as exc:  # keep sampling; report at the end
                self.errors.append(repr(exc))
            self.stopping.wait(0.5)

    def stop(self) -> list[Sample]:
        self.stopping.set()
        self.join(timeout=10)
        return self.samples


def _diagnosis(af: AirflowStack, dag_id: str, run_ids: list[str]) -> str:
    lines = []
    for run_id in run_ids:
        lines.append(f"{run_id}: {af.run_state(dag_id, run_id)} {af.ti_states(dag_id, run_id)}")
    for job in af.store.jobs(dag_id=dag_id):
        lines.append(f"quota job {job.id} {job.task_id} {job.state} {job.reason or ''} {job.detail or ''}")
    return "\n".join(lines) + "\n" + af.tails(15)


def test_walkthrough_runs_with_preemptions_resumes_and_no_slot_held_while_waiting(airflow: AirflowStack) -> None:
    af = airflow
    started = time.monotonic()
    run_id = f"e2e__{uuid.uuid4().hex[:8]}"
    af.cli("dags", "unpause", WALKTHROUGH)
    sampler = Sampler(af, WALKTHROUGH, run_id)
    sampler.start()
    af.cli("dags", "trigger", WALKTHROUGH, "--run-id", run_id)
    try:
        states = af.wait_for_runs(WALKTHROUGH, [run_id], WALKTHROUGH_TIMEOUT)
    finally:
        samples = sampler.stop()
    assert states[run_id] == "success", f"the run is {states[run_id]}\n{_diagnosis(af, WALKTHROUGH, [run_id])}"
    print(f"\nwalkthrough run {run_id} succeeded in {time.monotonic() - started:.0f} s, {len(samples)} samples")

    # -- the quota store: every job succeeded, and the two preemptions of the walkthrough ----------
    jobs = {j.task_id: j for j in af.store.jobs(dag_id=WALKTHROUGH) if j.run_id == run_id}
    assert set(jobs) == set(TRAININGS)
    assert {t: j.state for t, j in jobs.items()} == dict.fromkeys(TRAININGS, "SUCCEEDED")
    names = {j.name: t for t, j in jobs.items()}
    ids = {j.id for j in jobs.values()}
    events = [e for e in af.store.events() if e.job_id in ids]
    preemptions = [(names[e.job], e.record["kind"], names.get(e.record["by"])) for e in events if e.type == "PREEMPTED"]
    print("decision log:\n  " + "\n  ".join(e.line for e in events))
    assert ("qs1_med", "CROSS_SHARE", "qs2_job") in preemptions, preemptions
    assert ("qs1_high", "IN_SHARE", "qs1_low") in preemptions, preemptions
    assert len(preemptions) == 2, preemptions
    placed_med = [e.record for e in events if e.type == "PLACED" and names[e.job] == "qs1_med"]
    assert placed_med[0]["borrowed"] == 1, placed_med  # qs1_med first borrowed qs2's idle instance
    assert [e.record["type"] for e in events if names[e.job] == "qs1_low"][:2] == ["SUBMITTED", "PRIORITY_CHANGED"]

    # -- the preempted trainings resumed from their checkpoints --------------------------------------
    for task_id in ("qs1_med", "qs1_high"):
        victim = jobs[task_id]
        assert (victim.attempts, victim.preemptions) == (2, 1), (task_id, victim.attempts, victim.preemptions)
        second = af.training_log(victim.id, 2)
        resumed = re.search(r"resumed from step (\d+)", second)
        assert resumed and int(resumed.group(1)) > 0, f"{task_id}'s second attempt:\n{second[:2000]}"
        assert "done at step" in second
        print(f"{task_id}: {resumed.group(0)} on its second attempt")
    for task_id in ("qs1_low", "qs2_job", "qs3_job"):
        assert (jobs[task_id].attempts, jobs[task_id].preemptions) == (1, 0)

    # -- no training task held a worker slot while its job waited ------------------------------------
    assert not sampler.errors, sampler.errors[:5]
    held: list[tuple[float, str, str | None, str]] = []
    deferred_while: dict[str, dict[str, int]] = {t: {"RUNNABLE": 0, "RUNNING": 0} for t in TRAININGS}
    first_deferred: dict[str, float] = {}
    for s in samples:
        for task_id in TRAININGS:
            ti, job = s.tis.get(task_id), s.jobs.get(task_id)
            if ti == "deferred":
                first_deferred.setdefault(task_id, s.at)
                if job in deferred_while[task_id]:
                    deferred_while[task_id][job] += 1
            # after its first deferral (before it, the task is submitting) a task may take a worker
            # slot again only to finish, once its job is final; and it is deferred while the job waits
            elif task_id in first_deferred and ((ti in SLOT_STATES and job in LIVE) or job == "RUNNABLE"):
                held.append((round(s.at - started, 1), task_id, ti, job))
    runnable_deferred = sum(c["RUNNABLE"] for c in deferred_while.values())
    running_deferred = sum(c["RUNNING"] for c in deferred_while.values())
    print(
        f"samples with a quota job RUNNABLE and its task deferred: {runnable_deferred} "
        f"(per task { ({t: c['RUNNABLE'] for t, c in deferred_while.items()}) }); "
        f"training RUNNING and its task deferred: {running_deferred}"
    )
    assert held == [], f"training tasks not deferred while their quota job was live: {held[:10]}"
    assert set(first_deferred) == set(TRAININGS)
    assert deferred_while["qs1_low"]["RUNNABLE"] > 0  # queued behind qs1_high and qs1_med
    assert deferred_while["qs1_med"]["RUNNABLE"] > 0  # preempted, back in the queue
    assert all(c["RUNNING"] > 0 for c in deferred_while.values())  # the training ran, the task deferred

    # -- the task logs tell the quota story ----------------------------------------------------------
    logs = {t: af.task_log(WALKTHROUGH, run_id, t) for t in TRAININGS}
    expected = {
        "qs1_high": [
            f"submitted as quota job {jobs['qs1_high'].id} to share qs1",
            "is RUNNING on 1x ml.g5.xlarge",
            "IN_SHARE by " + jobs["qs1_low"].name,
            "preempted 1 time(s) so far, resumes from its checkpoint",
            "SUCCEEDED after 2 attempt(s), 1 preemption(s)",
        ],
        "qs1_med": [
            "(borrowing 1 now)",
            "CROSS_SHARE by " + jobs["qs2_job"].name,
            "preempted 1 time(s) so far, resumes from its checkpoint",
            "SUCCEEDED after 2 attempt(s), 1 preemption(s)",
        ],
        "qs1_low": [
            "position 1 in its share",
            "PRIORITY_CHANGED",
            "after preempting " + jobs["qs1_high"].name,
            "SUCCEEDED after 1 attempt(s), 0 preemption(s)",
        ],
        "qs2_job": ["after preempting " + jobs["qs1_med"].name, "SUCCEEDED"],
        "qs3_job": ["within its share's limit", "SUCCEEDED"],
    }
    for task_id, phrases in expected.items():
        missing = [p for p in phrases if p not in logs[task_id]]
        assert not missing, f"{task_id}'s task log lacks {missing}:\n{logs[task_id][-3000:]}"
    # -- each training task links to its job's page on the Quotas plugin, which shows the job ---------
    for task_id in ("qs1_med", "qs3_job"):
        links = af.api("GET", f"/api/v2/dags/{WALKTHROUGH}/dagRuns/{run_id}/taskInstances/{task_id}/links")
        url = links["extra_links"].get("Quota job")
        assert url == f"{af.api_url}/quota/jobs/{jobs[task_id].id}", links
        page = af.api("GET", f"/quota/api/jobs/{jobs[task_id].id}")
        assert (page["job"]["name"], page["job"]["state"]) == (jobs[task_id].name, "SUCCEEDED"), page
        assert len(page["attempts"]) == jobs[task_id].attempts
    print("qs1_med's task log (worker and triggerer), its quota lines:")
    for line in logs["qs1_med"].splitlines():
        with contextlib.suppress(ValueError, TypeError, KeyError):
            entry = json.loads(line)
            if "quota job" in entry["event"]:
                print(f"  {entry['timestamp'][11:19]} {entry['event']}")


def test_backfill_with_priority_override(airflow: AirflowStack) -> None:
    af = airflow
    started = time.monotonic()
    days = ["2026-11-01", "2026-11-02", "2026-11-03"]
    run_ids = [f"backfill__{day}T00:00:00+00:00" for day in days]
    af.cli(
        "backfill",
        "create",
        "--dag-id",
        DAILY,
        "--from-date",
        days[0],
        "--to-date",
        days[-1],
        "--dag-run-conf",
        json.dumps({"quota_priority": 9000}),
    )
    created = af.query("SELECT run_id, conf FROM dag_run WHERE dag_id = :d AND run_type = 'backfill'", d=DAILY)
    assert sorted(r[0] for r in created) == run_ids, created
    # in 3.3.2 the backfill's runs stay queued while the DAG is paused
    af.cli("dags", "unpause", DAILY)
    states = af.wait_for_runs(DAILY, run_ids, BACKFILL_TIMEOUT)
    jobs = [j for j in af.store.jobs(dag_id=DAILY) if j.run_id in run_ids]
    print(f"\nbackfill runs {states} in {time.monotonic() - started:.0f} s")
    for j in af.store.jobs(dag_id=DAILY):
        print(f"  quota job {j.id} {j.run_id} {j.task_id}: priority {j.priority}, {j.state}")
    assert sorted((j.run_id, j.task_id) for j in jobs) == sorted(
        (r, t) for r in run_ids for t in ("train_encoder", "train_ranker")
    ), _diagnosis(af, DAILY, run_ids)
    assert {j.priority for j in jobs} == {9000}
    assert {j.request["priority"] for j in jobs} == {9000}  # submitted with it, not changed later
    assert not [e.line for j in jobs for e in af.store.events(job_id=j.id) if e.type == "PRIORITY_CHANGED"]
    log = af.task_log(DAILY, run_ids[0], "train_encoder")
    assert "priority 9000 (run conf override)" in log, log[-3000:]
    assert states == dict.fromkeys(run_ids, "success"), _diagnosis(af, DAILY, run_ids)
    assert {j.state for j in jobs} == {"SUCCEEDED"}
    # the DAG's own run (catchup=False makes one for the latest day when it is unpaused) keeps the
    # tasks' own priorities
    others = [j for j in af.store.jobs(dag_id=DAILY) if j.run_id not in run_ids]
    assert all(j.priority == {"train_encoder": 2, "train_ranker": 1}[j.task_id or ""] for j in others), others


def test_a_taskflow_training_waits_out_a_quota_scheduler_outage(airflow: AirflowStack) -> None:
    af = airflow

    def scheduler_running() -> bool:
        return bool(af.api("GET", "/quota/api/shares")["scheduler"]["running"])

    af.stop(["quota-scheduler"])
    wait_for(lambda: not scheduler_running(), 60, "the API to say no quota scheduler runs", interval=0.5)

    run_id = af.trigger(TASKFLOW, conf={"urgent": True, "gpus": 1})
    warning = "no quota scheduler is running"
    wait_for(lambda: warning in af.task_log(TASKFLOW, run_id, "train"), 180, "the waiting task's warning", interval=0.5)
    assert af.ti_states(TASKFLOW, run_id)["train"] == "deferred"  # waiting in the triggerer, no slot
    (job,) = [j for j in af.store.jobs(dag_id=TASKFLOW) if j.run_id == run_id]
    assert (job.share, job.priority, job.state) == ("qs1", 3, "SUBMITTED")  # from the @task's outputs

    af.start_process("quota-scheduler", af._command("quota-scheduler"))
    states = af.wait_for_runs(TASKFLOW, [run_id], BACKFILL_TIMEOUT)
    assert states == {run_id: "success"}, _diagnosis(af, TASKFLOW, [run_id])
    assert scheduler_running()
    log = af.task_log(TASKFLOW, run_id, "train")
    assert log.count(warning) == 1, log[-4000:]
    assert "a quota scheduler runs again" in log, log[-4000:]
    assert "[training, attempt 1]" in log, log[-4000:]  # the training's own output, from the triggerer
    done = af.store.job(job.id)
    assert done is not None and done.state == "SUCCEEDED" and done.request["max_pending_seconds"] == 600
    report = af.task_log(TASKFLOW, run_id, "report")
    assert re.search(rf"quota job {job.id} SUCCEEDED on 1x ml\.g5\.xlarge in share qs1", report), report[-3000:]
