"""``make demo``: the AWS walkthrough in a real Airflow on this machine, then its quota story.

Prepares an Airflow home under ``.demo/`` (SQLite for Airflow and for the quota database: the
embedded default), applies ``examples/quota.yaml``, starts Airflow and ``airflow-quota
scheduler`` with the local backend, triggers the ``quota_walkthrough`` DAG, shows the quota
table while it runs, tells who ran where, who was preempted by whom, what resumed from which
checkpoint, the waits and the cost, and keeps the UI serving until Ctrl-C (``--once``: stop
after the story). A second run reuses the home, its databases and the UI login. The UI listens
on 127.0.0.1 (this machine only) unless ``--host`` or ``$AIRFLOW_QUOTA_DEMO_HOST`` names
another address.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

from airflow_quota.core.human_time import duration_words
from airflow_quota.devtools.stack import AirflowStack, StackError, StackSettings, stop_on_sigterm
from airflow_quota.sim.report import table
from airflow_quota.store.models import JobRow
from airflow_quota.store.repository import QuotaStore

REPO = Path(__file__).resolve().parents[2]
DAG_ID = "quota_walkthrough"
RUN_TIMEOUT = 600.0
RESUMED = re.compile(r"resumed from step (\d+)")
HOST_VARIABLE = "AIRFLOW_QUOTA_DEMO_HOST"
"""Where the demo's api-server listens when ``--host`` is not given (127.0.0.1 when unset)."""


def port_or_free(preferred: int) -> int:
    """``preferred`` when nothing listens there (and it is not 0), else any free port."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", preferred))
        except OSError:
            s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def quota_table(store: QuotaStore, dag_id: str, run_id: str) -> str:
    """The shares and the run's quota jobs, as two small tables."""
    rows = [
        [share.share, t.instance_type, t.limit, t.used, t.borrowed, round(t.lent, 3), t.idle, t.runnable]
        for share in store.view().shares
        for t in share.types
    ]
    shares = table(["share", "instance type", "limit", "used", "borrowed", "lent", "idle", "RUNNABLE"], rows)
    jobs = [j for j in store.jobs(dag_id=dag_id) if j.run_id == run_id]
    job_rows = [
        [
            j.task_id,
            j.share,
            j.priority,
            j.state,
            j.pending_reason if j.state == "RUNNABLE" else j.reason,
            f"{j.count}x {j.instance_type}" + (" (borrowed)" if j.borrowed else "") if j.instance_type else None,
            j.attempts,
            j.preemptions,
        ]
        for j in jobs
    ]
    listing = table(["task", "share", "prio", "state", "why", "placed on", "attempts", "preempted"], job_rows)
    return f"{shares}\n\n{listing}"


def quota_story(store: QuotaStore, jobs: Sequence[JobRow], training_log: Callable[[int, int], str]) -> str:
    """Who ran where, who was preempted by whom, what resumed from which checkpoint, the waits
    and the cost, for the given jobs."""
    names = {j.name: j.task_id or j.name for j in jobs}
    lines: list[str] = []
    for job in sorted(jobs, key=lambda j: j.submitted_at):
        who = job.task_id or job.name
        lines.append(f"{who} (share {job.share}, priority {job.priority}): {job.state}")
        preemptions = {p.attempt: p for p in store.preemptions(job.id)}
        for attempt in store.attempts(job.id):
            where = f"{attempt.count}x {attempt.instance_type}"
            if attempt.borrowed:
                where += f", borrowing {attempt.borrowed} from another share"
            line = f"  attempt {attempt.number} ran on {where}"
            resumed = RESUMED.search(training_log(job.id, attempt.number))
            if resumed:
                line += f", resumed from the checkpoint at step {resumed.group(1)}"
            preempted = preemptions.get(attempt.number)
            if preempted is not None:
                line += (
                    f"; preempted ({preempted.kind}) by {names.get(preempted.by_job, preempted.by_job)}, "
                    f"{duration_words(preempted.lost_seconds)} of work lost"
                )
            lines.append(line)
        waited = duration_words(job.wait_seconds)
        lines.append(f"  waited {waited} in the queue; {job.gpu_hours:.4f} GPU-hours, ${job.cost:.4f}")
    total_cost = sum(j.cost for j in jobs)
    total_wait = sum(j.wait_seconds for j in jobs)
    preemptions_in_all = sum(j.preemptions for j in jobs)
    lines.append(
        f"{len(jobs)} trainings, {preemptions_in_all} preemption(s), {duration_words(total_wait)} of waiting in all, "
        f"cost ${total_cost:.4f}"
    )
    return "\n".join(lines)


def watch(stack: AirflowStack, run_id: str, out: Callable[[str], None], timeout: float = RUN_TIMEOUT) -> str | None:
    """Show the quota table whenever it changes until the run is final; the run's state."""
    shown = ""
    deadline = time.monotonic() + timeout
    state: str | None = None
    while time.monotonic() < deadline:
        state = stack.run_state(DAG_ID, run_id)
        current = quota_table(stack.store, DAG_ID, run_id)
        if current != shown:
            tasks = stack.ti_states(DAG_ID, run_id)
            busy = ", ".join(f"{t} {s}" for t, s in tasks.items() if s in ("running", "deferred", "queued"))
            out(f"\n--- {time.strftime('%H:%M:%S')}  run {state}; tasks: {busy or '-'}\n{current}")
            shown = current
        if state in ("success", "failed"):
            return state
        if stack.dead():
            raise StackError(f"Airflow processes died: {stack.dead()}\n{stack.tails()}")
        time.sleep(2)
    return state


def arguments() -> argparse.ArgumentParser:
    """The demo's command line."""
    parser = argparse.ArgumentParser(prog="airflow-quota-demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=".demo", help="where the demo keeps Airflow's home and its databases")
    parser.add_argument("--port", type=int, default=8080, help="the UI's port (another free one if it is taken)")
    parser.add_argument(
        "--host",
        default=os.environ.get(HOST_VARIABLE) or "127.0.0.1",
        help=f"the address the UI listens on (default ${HOST_VARIABLE}, else 127.0.0.1: this machine only; "
        "0.0.0.0 for every interface)",
    )
    parser.add_argument("--once", action="store_true", help="stop after the story instead of serving the UI")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = arguments().parse_args(argv)
    stop_on_sigterm()

    def say(text: str) -> None:
        print(text, flush=True)

    root = Path(args.root).resolve()
    again = (root / "home" / "airflow.db").exists()
    settings = StackSettings(
        root=root,
        dags=[REPO / "dags" / "quota_walkthrough.py", REPO / "dags" / "train_script.py"],
        quota_config=REPO / "examples" / "quota.yaml",
        parallelism=2,
        users={"admin": "admin"},
        wait_for_dags=[DAG_ID],
        api_port=port_or_free(args.port),
        api_host=args.host,
    )
    stack = AirflowStack(settings)
    say(f"[1/4] {'reusing' if again else 'preparing'} the Airflow home in {root} (SQLite, LocalExecutor, 2 slots)")
    started = time.monotonic()
    try:
        stack.start()
        up = time.monotonic() - started
        say(f"[2/4] Airflow 3.3 and the quota scheduler are up ({up:.0f} s); logs in {stack.logs}")
        run_id = f"demo__{time.strftime('%Y%m%dT%H%M%S')}_{uuid.uuid4().hex[:4]}"
        stack.trigger(DAG_ID, run_id=run_id)
        say(f"[3/4] triggered {DAG_ID} (run {run_id}); the quota table as it changes:")
        state = watch(stack, run_id, say)
        jobs = [j for j in stack.store.jobs(dag_id=DAG_ID) if j.run_id == run_id]
        say(f"\n[4/4] the run ended {state}. The quota story:\n")
        say(quota_story(stack.store, jobs, stack.training_log))
        say(f"\nDecision log: airflow-quota jobs show <id> --db {stack.quota_url}")
        say(f"The Airflow UI: {stack.api_url}  (login admin / {stack.password('admin')}); Quotas is in its menu.")
        if state != "success":
            say(f"the walkthrough did not succeed; the logs are in {stack.logs}\n{stack.tails(10)}")
            return 1
        if args.once:
            return 0
        say("Serving until Ctrl-C.")
        while not stack.dead():
            time.sleep(1)
        say(f"an Airflow process stopped: {stack.dead()}\n{stack.tails(10)}")
        return 1
    except KeyboardInterrupt:
        say("\nstopping")
        return 0
    except StackError as exc:
        say(f"the demo could not run: {exc}")
        return 1
    finally:
        stack.stop()


if __name__ == "__main__":
    sys.exit(main())
