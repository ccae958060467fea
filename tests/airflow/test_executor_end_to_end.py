"""QuotaExecutor end to end in a real Airflow 3.3: scheduler, dag-processor and api-server
processes with the hybrid executor setting ``LocalExecutor,quota:airflow_quota.executors.QuotaExecutor``,
a PostgreSQL metadata database, and ``airflow-quota scheduler`` on a second PostgreSQL database.
The DAGs are ``tests/airflow/executor_dags/`` (``@task`` and ``PythonOperator`` tasks in four
shares over a pool of two ml.g5.xlarge and two ml.g4dn.xlarge, ``quota.yaml`` there).

1. Held and placed in order: while a blocker fills the research share for 95 s, three research
   tasks (priorities 1, 9, 5) stay QUEUED past ``task_queued_timeout`` (30 s, checked every 5 s)
   and a prod task runs at once; then the research tasks run one at a time, highest priority
   first, and all succeed, the last after a hold of at least 90 s; r_low and r_mid, overtaken
   by r_high after 30 s of waiting, raise STARVING alerts (in the store and the quota
   scheduler's log).
3. Adoption: Airflow's scheduler killed with SIGKILL while one task runs and two are held, then
   restarted: the new scheduler's QuotaExecutor adopts all three; each runs exactly once (one
   try, one quota job, one start) and succeeds.
2. A cross-share reclaim: lab borrows ops's idle instance; an ops task takes it back; the lab task
   on it gets SIGTERM, checkpoints, is cleared (RESTARTING), is held again as its next try and
   resumes from its checkpoint; every task succeeds and the quota jobs agree. The second try's
   own log tells the quota's story so far in time order: submitted, placed (borrowing),
   preempted (by whom), waiting (why), placed again, what it runs on and where it resumes from.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from airflow_quota.devtools.stack import AirflowStack
from tests.airflow.stacks import (
    EXECUTOR_DAGS,
    airflow_on_postgres,
    connections_held_by,
    diagnosis,
    events,
    final_jobs,
    tries,
    wait_until,
)

# Airflow's start (up to START_TIMEOUT) counts towards the first test, and a test waits minutes
# for its holds and runs: twice the default limit (pyproject.toml) for each test.
pytestmark = pytest.mark.timeout(1200)

DAG_FILES = ("quota_exec_training.py", "quota_exec_shares.py", "quota_exec_reclaim.py", "quota_exec_adopt.py")
DAG_IDS = ("quota_exec_blocker", "quota_exec_shares", "quota_exec_lab", "quota_exec_ops", "quota_exec_adopt")
QUEUED_TIMEOUT = 30
START_TIMEOUT = 300.0


@pytest.fixture(scope="module")
def airflow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AirflowStack]:
    with airflow_on_postgres(
        "exec",
        tmp_path_factory.mktemp("airflow-exec"),
        dags=[EXECUTOR_DAGS / name for name in DAG_FILES],
        quota_config=EXECUTOR_DAGS / "quota.yaml",
        parallelism=6,
        components=("scheduler", "dag-processor", "api-server", "quota-scheduler"),
        wait_for_dags=DAG_IDS,
        start_timeout=START_TIMEOUT,
        extra_env={
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor,quota:airflow_quota.executors.QuotaExecutor",
            "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": str(QUEUED_TIMEOUT),
            "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT_CHECK_INTERVAL": "5",
            # a restarted scheduler adopts a dead one's tasks once its heartbeat is 30 s stale
            # (the default threshold), checked every 10 s rather than every 5 minutes
            "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "10",
        },
    ) as stack:
        yield stack


def logged(af: AirflowStack, dag_id: str, run_id: str, task_id: str, try_number: int) -> list[str]:
    """What one try's log says, line by line (Airflow writes it as JSON lines)."""
    path = (
        af.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}" / f"attempt={try_number}.log"
    )
    return [json.loads(line).get("event", "") for line in path.read_text().splitlines() if line.startswith("{")]


def seconds(later: datetime, earlier: datetime) -> float:
    return (later - earlier).total_seconds()


def test_tasks_are_held_while_their_share_is_full_and_placed_by_priority_past_the_queued_timeout(
    airflow: AirflowStack,
) -> None:
    af = airflow
    blocker = af.trigger("quota_exec_blocker", conf={"seconds": 95})
    wait_until(
        "the blocker running",
        lambda: tries(af, "quota_exec_blocker", blocker).get("block", {}).get("state") == "running",
        af,
        180,
    )
    run = af.trigger("quota_exec_shares")
    research = ("r_high", "r_mid", "r_low")

    def all_queued() -> bool:
        states = {t: ti["state"] for t, ti in tries(af, "quota_exec_shares", run).items()}
        return all(states.get(t) == "queued" for t in research)

    wait_until("the research tasks queued", all_queued, af, 120)
    # held: the research share is full; the prod task runs on prod's own instance meanwhile
    wait_until(
        "the prod task done",
        lambda: tries(af, "quota_exec_shares", run).get("p_now", {}).get("state") == "success",
        af,
        120,
    )
    held = tries(af, "quota_exec_shares", run)
    assert all(held[t]["state"] == "queued" for t in research), diagnosis(af, ("quota_exec_shares", run))
    jobs = {j.task_id: j for j in af.store.jobs(dag_id="quota_exec_shares")}
    assert {t: jobs[t].state for t in research} == dict.fromkeys(research, "RUNNABLE"), jobs
    assert {jobs[t].backend for t in research} == {"airflow"}

    states = af.wait_for_runs("quota_exec_shares", [run], 420)
    assert states[run] == "success", diagnosis(af, ("quota_exec_shares", run), ("quota_exec_blocker", blocker))
    assert af.wait_for_runs("quota_exec_blocker", [blocker], 60)[blocker] == "success"
    done = tries(af, "quota_exec_shares", run)
    # one try each: the stuck-in-queued check never rescheduled or failed them
    assert {t: (ti["state"], ti["try"]) for t, ti in done.items()} == dict.fromkeys(
        (*research, "p_now"), ("success", 1)
    ), done
    starts = sorted(research, key=lambda t: done[t]["start"])
    assert starts == ["r_high", "r_mid", "r_low"], {t: done[t]["start"] for t in research}
    for earlier, later in itertools.pairwise(starts):
        assert done[later]["start"] >= done[earlier]["end"], "the research share ran two tasks at once"
    longest = seconds(done["r_low"]["start"], done["r_low"]["queued"])
    assert longest >= 3 * QUEUED_TIMEOUT, f"r_low was held {longest:.0f} s"
    log = (af.logs / "scheduler.log").read_text(errors="replace")
    assert "stuck in queued" not in log.lower()
    # the quota jobs agree within a few of the quota scheduler's steps (it polls the reports each second)
    expected = dict.fromkeys((*research, "p_now"), ("SUCCEEDED", 1))
    wait_until("the quota jobs SUCCEEDED", lambda: final_jobs(af, "quota_exec_shares") == expected, af, 15)
    # Airflow queued r_low, then r_mid, then r_high (priority_weight); the quota model placed
    # r_high first: r_low and r_mid, waiting past research's 30 s, were overtaken and starved
    by_id = {jobs[t].id: t for t in research}
    starving = [a for a in af.store.alerts() if a.kind == "STARVING" and a.job_id in by_id]
    assert sorted(by_id[a.job_id] for a in starving) == ["r_low", "r_mid"], starving
    wait_until(
        "the STARVING alerts in the quota scheduler's log",
        lambda: all(
            f"quota alert STARVING: job {a.job_id} " in (af.logs / "quota-scheduler.log").read_text(errors="replace")
            for a in starving
        ),
        af,
        15,
    )
    started = {e["task"]: e for e in events(af) if e["event"] == "start"}
    assert started["r_high"]["share"] == "research" and started["p_now"]["share"] == "prod"
    assert started["r_mid"]["instance_type"] == "ml.g5.xlarge"
    print(f"\nr_low held {longest:.0f} s (task_queued_timeout {QUEUED_TIMEOUT} s); order {starts}")


def test_a_cross_share_reclaim_stops_a_running_task_which_resumes_from_its_checkpoint(
    airflow: AirflowStack,
) -> None:
    af = airflow
    lab = af.trigger("quota_exec_lab")

    def borrower_running() -> bool:
        return any(e["task"] == "lab_borrower" and e["event"] == "start" for e in events(af)) and all(
            ti["state"] == "running" for ti in tries(af, "quota_exec_lab", lab).values()
        )

    wait_until("both lab tasks running (one on ops's instance)", borrower_running, af, 180)
    step = Path(af.env["AIRFLOW_QUOTA_EXAMPLE_CHECKPOINTS"]) / "lab_borrower" / "step"
    wait_until("the borrower 5 steps in", lambda: step.exists() and int(step.read_text() or 0) >= 5, af, 60)
    ops = af.trigger("quota_exec_ops")
    states = af.wait_for_runs("quota_exec_lab", [lab], 420)
    assert states[lab] == "success", diagnosis(af, ("quota_exec_lab", lab), ("quota_exec_ops", ops))
    assert af.wait_for_runs("quota_exec_ops", [ops], 120)[ops] == "success"

    done = tries(af, "quota_exec_lab", lab)
    assert done["lab_first"]["try"] == 1 and done["lab_borrower"]["try"] == 2, done
    wait_until(
        "the quota jobs SUCCEEDED",
        lambda: final_jobs(af, "quota_exec_lab") == {"lab_first": ("SUCCEEDED", 1), "lab_borrower": ("SUCCEEDED", 2)},
        af,
        15,
    )
    jobs = {j.task_id: j for j in af.store.jobs() if j.task_id in ("lab_first", "lab_borrower", "ops_job")}
    assert (jobs["lab_borrower"].state, jobs["lab_borrower"].attempts, jobs["lab_borrower"].preemptions) == (
        "SUCCEEDED",
        2,
        1,
    ), jobs["lab_borrower"]
    preempted = [e for e in af.store.events(job_id=jobs["lab_borrower"].id) if e.type == "PREEMPTED"]
    assert [e.record["kind"] for e in preempted] == ["CROSS_SHARE"], preempted
    trail = [e for e in events(af) if e["task"] == "lab_borrower"]
    kinds = [e["event"] for e in trail]
    assert kinds[:2] == ["start", "checkpoint"] and kinds[-2:] == ["start", "end"], trail
    resumed = trail[-2]["resumed_from"]
    assert resumed >= 5 and trail[-2]["attempt"] == 2, trail
    assert jobs["ops_job"].state == "SUCCEEDED" and jobs["lab_first"].state == "SUCCEEDED"
    # the second try's own log tells the quota's story so far, in time order (issue 38)
    borrower, ops_name = jobs["lab_borrower"], jobs["ops_job"].name
    lines = logged(af, "quota_exec_lab", lab, "lab_borrower", 2)
    story = [
        f"submitted as quota job {borrower.id} to share lab ({borrower.name}, priority 1)",
        f"PLACED {borrower.name} [lab] on 1x ml.g4dn.xlarge, attempt 1",
        f"PREEMPTED {borrower.name} [lab] CROSS_SHARE by {ops_name}, lost",
        f"quota job {borrower.id} ({borrower.name}) in share lab is RUNNABLE: ",
        f"PLACED {borrower.name} [lab] on 1x ml.g4dn.xlarge, attempt 2",
        f"this try (Airflow try 2): quota job {borrower.id} ({borrower.name}) in share lab is ",
        f"quota job {borrower.id} resumes on attempt 2 after 1 preemption(s), from checkpoint {step.parent}",
    ]
    at = [next((i for i, line in enumerate(lines) if phrase in line), None) for phrase in story]
    assert None not in at and at == sorted(at), "\n".join(lines)
    assert "borrowing 1" in lines[at[1]] and "preempted 1 time(s) so far" in lines[at[3]], "\n".join(lines)
    print(f"\nlab_borrower: preempted by ops_job, resumed from step {resumed} on its second try")
    print("its second try's log:\n  " + "\n  ".join(lines[at[0] : at[-1] + 1]))


def test_a_scheduler_killed_while_tasks_are_held_and_running_is_restarted_and_each_task_runs_once(
    airflow: AirflowStack,
) -> None:
    af = airflow
    run = af.trigger("quota_exec_adopt")
    held = ("a_second", "a_third")

    def one_running_two_held() -> bool:
        states = {t: ti["state"] for t, ti in tries(af, "quota_exec_adopt", run).items()}
        started = any(e["task"] == "a_first" and e["event"] == "start" for e in events(af))
        return started and states.get("a_first") == "running" and all(states.get(t) == "queued" for t in held)

    wait_until("a_first running, the other two held", one_running_two_held, af, 180)
    old = af.processes["scheduler"]
    old_group = os.getpgid(old.pid)
    os.kill(old.pid, signal.SIGKILL)  # its LocalExecutor workers live on, running a_first
    old.wait(timeout=30)
    try:
        kept_open = connections_held_by(old_group)  # its workers live on, none of its sessions may
        assert kept_open == [], f"the killed scheduler's workers keep its database connections open: {kept_open}"
        af.start_process("scheduler", [str(Path(af.env["PATH"].split(os.pathsep)[0]) / "airflow"), "scheduler"])
        states = af.wait_for_runs("quota_exec_adopt", [run], 420)
        assert states[run] == "success", diagnosis(af, ("quota_exec_adopt", run))
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(old_group, signal.SIGKILL)  # the dead scheduler's idle workers
    done = tries(af, "quota_exec_adopt", run)
    assert {t: (ti["state"], ti["try"]) for t, ti in done.items()} == dict.fromkeys(
        ("a_first", *held), ("success", 1)
    ), done
    expected = dict.fromkeys(("a_first", *held), ("SUCCEEDED", 1))
    wait_until("the quota jobs SUCCEEDED", lambda: final_jobs(af, "quota_exec_adopt") == expected, af, 15)
    assert len(af.store.jobs(dag_id="quota_exec_adopt")) == 3  # never submitted twice
    starts = [e["task"] for e in events(af) if e["event"] == "start" and e["task"] in ("a_first", *held)]
    assert sorted(starts) == sorted(("a_first", *held)), starts  # each ran exactly once
    log = (af.logs / "scheduler.log").read_text(errors="replace")
    assert "QuotaExecutor adopted" in log
