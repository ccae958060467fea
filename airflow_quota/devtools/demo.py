"""``make demo``: the AWS walkthrough in a real Airflow on this machine, then its quota story.

Prepares an Airflow home under ``.demo/`` (SQLite for Airflow and for the quota database: the
embedded default), applies ``examples/quota.yaml``, starts Airflow and ``airflow-quota
scheduler`` with the local backend, triggers the ``quota_walkthrough`` DAG, shows the quota
table while it runs, tells who ran where, who was preempted by whom, what resumed from which
checkpoint, the waits and the cost, and keeps the UI serving until Ctrl-C (``--once``: stop
after the story). A second run reuses the home, its databases and the UI login. The UI listens
on 127.0.0.1 (this machine only) unless ``--host`` or ``$AIRFLOW_QUOTA_DEMO_HOST`` names
another address.

The demo is a starting point: it writes ``.demo/env.sh`` (``source`` it and ``airflow`` and
``airflow-quota`` talk to the demo's Airflow and quota database) and its dag-processor reads
every DAG file dropped in ``.demo/dags/``, beside the walkthrough. When the walkthrough fails the
demo says why (what does not answer, each failed task's failure line) and keeps serving the UI:
in serve mode it exits, non-zero, only on Ctrl-C; ``--once`` exits non-zero at once.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import socket
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

from airflow_quota.core.human_time import duration_words
from airflow_quota.devtools.slow_relay import SlowRelay
from airflow_quota.devtools.stack import (
    AirflowStack,
    StackError,
    StackSettings,
    connect_host,
    free_port,
    stop_on_sigterm,
)
from airflow_quota.sim.report import table
from airflow_quota.store.models import JobRow
from airflow_quota.store.repository import QuotaStore

REPO = Path(__file__).resolve().parents[2]
DAG_ID = "quota_walkthrough"
RUN_TIMEOUT = 600.0
RESUMED = re.compile(r"resumed from step (\d+)")
HOST_VARIABLE = "AIRFLOW_QUOTA_DEMO_HOST"
"""Where the demo's api-server listens when ``--host`` is not given (127.0.0.1 when unset)."""
DAGS_REFRESH_SECONDS = 10
"""How often the demo's dag-processor looks for new files in its DAGs folder (Airflow's default,
300 s, would leave a DAG dropped in ``.demo/dags/`` unseen for five minutes)."""
EXCEPTION_LINE = re.compile(r"^\s*([\w.]*(Error|Exception|Timeout|Refused)\w*)(: .*)?$")
"""A log line naming an exception, as Python prints it: ``httpx.ReadTimeout: timed out``."""


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


def failure_line(log: str) -> str | None:
    """The last line of a log that tells why something failed: an error record of Airflow's
    JSON task logs (its event and exception), or a plain ``SomeError: why`` line; ``None``
    when the log has neither."""
    found: str | None = None
    for raw in log.splitlines():
        line = raw.strip()
        try:
            record = json.loads(line) if line.startswith("{") else None
        except ValueError:
            record = None
        if isinstance(record, dict):
            if str(record.get("level", "")).lower() not in ("error", "critical"):
                continue
            found = str(record.get("event", "")).strip()
            details = record.get("error_detail")
            if isinstance(details, list) and details and isinstance(details[-1], dict):
                last = details[-1]
                found += f" ({last.get('exc_type', '?')}: {last.get('exc_value', '')})"
        elif EXCEPTION_LINE.match(line):
            found = line
    return found[:400] if found else None


def diagnosis(stack: AirflowStack, run_id: str, state: str | None) -> str:
    """Why the walkthrough did not succeed: what does not answer, and for each failed task
    its failure line (from its task log, else from the scheduler's log, where a worker that
    could not reach the execution API says so)."""
    lines = [f"the run {run_id} is {state or 'not started'}" + ("" if state == "failed" else " after the wait")]
    lines += [f"- {piece}" for piece in stack.not_answering()]
    try:
        tasks = stack.ti_states(DAG_ID, run_id)
    except Exception as exc:  # the metadata database itself
        tasks = {}
        lines.append(f"- the task states cannot be read ({exc.__class__.__name__})")
    scheduler_line = failure_line(stack_log(stack, "scheduler"))
    for task_id, task_state in sorted(tasks.items()):
        if task_state == "failed":
            why = failure_line(stack.task_log(DAG_ID, run_id, task_id))
            if why is None and scheduler_line is not None:
                why = f"{scheduler_line} (the scheduler's log)"
            lines.append(f"- task {task_id} failed: {why or 'its log names no error; see the logs named below'}")
    unfinished = sorted(t for t, s in tasks.items() if s not in ("success", "failed", "upstream_failed", "skipped"))
    if unfinished:
        lines.append(f"- not finished: {', '.join(unfinished)}")
    upstream = sorted(t for t, s in tasks.items() if s == "upstream_failed")
    if upstream:
        lines.append(f"- not run because a task before them failed: {', '.join(upstream)}")
    lines.append(f"The logs: {stack.logs} (each process) and {stack.home / 'logs'} (each task).")
    return "\n".join(lines)


def stack_log(stack: AirflowStack, name: str, lines: int = 400) -> str:
    """The last lines of one process's log."""
    try:
        return "\n".join((stack.logs / f"{name}.log").read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def walkthrough(stack: AirflowStack, say: Callable[[str], None]) -> str | None:
    """Trigger the walkthrough, show the quota table as it changes and tell the story; ``None``
    when the run succeeded, else why it did not."""
    run_id = f"demo__{time.strftime('%Y%m%dT%H%M%S')}_{uuid.uuid4().hex[:4]}"
    try:
        stack.trigger(DAG_ID, run_id=run_id)
    except (StackError, OSError) as exc:
        return f"{DAG_ID} could not be triggered ({exc})\n{diagnosis(stack, run_id, None)}"
    say(f"[3/4] triggered {DAG_ID} (run {run_id}); the quota table as it changes:")
    try:
        state = watch(stack, run_id, say)
    except StackError:
        state = stack.run_state(DAG_ID, run_id)
    jobs = [j for j in stack.store.jobs(dag_id=DAG_ID) if j.run_id == run_id]
    say(f"\n[4/4] the run ended {state}. The quota story:\n")
    say(quota_story(stack.store, jobs, stack.training_log))
    say(f"\nDecision log: airflow-quota jobs show <id> --db {stack.quota_url}")
    return None if state == "success" else diagnosis(stack, run_id, state)


def starting_point(stack: AirflowStack, env_script: Path) -> str:
    """How to use the demo's Airflow beyond the walkthrough: the CLI, and where DAGs go."""
    return (
        f"To use this Airflow from a shell: source {env_script}   (then airflow dags list, airflow-quota shares)\n"
        f"Your DAGs: drop .py files in {stack.dags_folder}/ (the dag-processor looks every "
        f"{DAGS_REFRESH_SECONDS} s; import errors: airflow dags list-import-errors)"
    )


def serve(stack: AirflowStack, say: Callable[[str], None]) -> None:
    """Keep serving while the api-server runs (the UI is where one looks next, also after a
    failure), telling once about each other process that stops; returns when the api-server
    stops."""
    told: set[str] = set()
    while "api-server" not in stack.dead():
        for name, code in stack.dead().items():
            if name not in told:
                say(f"{name} stopped (exit code {code}); the UI still serves. Its log: {stack.logs / name}.log")
                told.add(name)
        time.sleep(1)
    say(f"the api-server stopped (exit code {stack.dead()['api-server']})\n{stack.tails(10)}")


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
    parser.add_argument(
        "--once", action="store_true", help="stop after the story instead of serving the UI (exit 1 if it failed)"
    )
    parser.add_argument(
        "--unreachable-execution-api",
        action="store_true",
        help="for testing the failure path: give the workers an execution API address where nothing listens, "
        "so the walkthrough's tasks fail at once",
    )
    parser.add_argument(
        "--slow-execution-api",
        type=float,
        metavar="SECONDS",
        help="for testing the failure path: the workers reach the execution API through a relay that holds "
        "each call SECONDS before passing it on, longer than they wait, so their calls time out",
    )
    return parser


def demo_environment(unreachable_execution_api: bool, slow_relay: SlowRelay | None = None) -> dict[str, str]:
    """The settings the demo adds to the stack's: a short look-for-new-DAG-files interval and,
    to test the failure path, an execution API nobody answers at, or one reached through a
    relay slower than the workers wait (tried once, not five times)."""
    env = {"AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": str(DAGS_REFRESH_SECONDS)}
    if unreachable_execution_api:
        env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] = f"http://127.0.0.1:{free_port()}/execution/"
        env["AIRFLOW__WORKERS__EXECUTION_API_RETRIES"] = "1"  # one try, no retry
    elif slow_relay is not None:
        env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] = f"http://127.0.0.1:{slow_relay.port}/execution/"
        env["AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT"] = str(max(1.0, slow_relay.delay / 2))
        env["AIRFLOW__WORKERS__EXECUTION_API_RETRIES"] = "1"
    return env


def main(argv: Sequence[str] | None = None) -> int:
    args = arguments().parse_args(argv)
    stop_on_sigterm()

    def say(text: str) -> None:
        print(text, flush=True)

    api_port = port_or_free(args.port)
    with contextlib.ExitStack() as cleanup:
        relay = None
        if args.slow_execution_api is not None:
            relay = cleanup.enter_context(SlowRelay((connect_host(args.host), api_port), args.slow_execution_api))
        return run(args, api_port, relay, say)


def run(args: argparse.Namespace, api_port: int, relay: SlowRelay | None, say: Callable[[str], None]) -> int:
    """Start the stack, tell the walkthrough's story, then serve (or stop, with ``--once``)."""
    root = Path(args.root).resolve()
    again = (root / "home" / "airflow.db").exists()
    settings = StackSettings(
        root=root,
        dags=[REPO / "dags" / "quota_walkthrough.py", REPO / "dags" / "train_script.py"],
        quota_config=REPO / "examples" / "quota.yaml",
        parallelism=2,
        users={"admin": "admin"},
        wait_for_dags=[DAG_ID],
        api_port=api_port,
        api_host=args.host,
        extra_env=demo_environment(args.unreachable_execution_api, relay),
    )
    stack = AirflowStack(settings)
    env_script = stack.write_env_script(root / "env.sh")
    say(f"[1/4] {'reusing' if again else 'preparing'} the Airflow home in {root} (SQLite, LocalExecutor, 2 slots)")
    started = time.monotonic()
    problem: str | None = None
    try:
        try:
            stack.start()
        except StackError as exc:
            problem = f"Airflow did not start: {exc}"
        else:
            up = time.monotonic() - started
            say(f"[2/4] Airflow 3.3 and the quota scheduler are up ({up:.0f} s); logs in {stack.logs}")
            say(starting_point(stack, env_script))
            for filename, why in stack.import_errors().items():
                say(f"a DAG file does not import: {filename}: {why}")
            problem = walkthrough(stack, say)
        if problem is not None:
            say(f"\nThe walkthrough did not succeed: {problem}")
        if args.once:
            return 0 if problem is None else 1
        if not stack.api_answers():
            say(f"The UI does not answer either, so there is nothing to serve.\n{stack.tails(10)}")
            return 1
        say(f"\nThe Airflow UI: {stack.api_url}  (login admin / {stack.password('admin')}); Quotas is in its menu.")
        say(
            "Serving until Ctrl-C."
            + (" (The walkthrough failed: make demo exits 1 when you stop it.)" if problem else "")
        )
        serve(stack, say)
        return 1
    except KeyboardInterrupt:
        say("\nstopping")
        return 0 if problem is None else 1
    finally:
        stack.stop()


if __name__ == "__main__":
    sys.exit(main())
