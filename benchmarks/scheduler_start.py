"""Benchmark of the quota scheduler's start (issue 39): from process start to its first decision.

    python benchmarks/scheduler_start.py                   # SQLite and PostgreSQL, idle and loaded, 5 starts each
    python benchmarks/scheduler_start.py --repeat 9        # more starts (median and least of each)
    python benchmarks/scheduler_start.py --imports         # also: what it imports before it leads (-X importtime)
    python benchmarks/scheduler_start.py --source A --source B   # two checkouts' airflow_quota, starts alternating

Each start is of ``airflow-quota scheduler`` in a fresh process, on a fresh quota database: a
SQLite file in a temporary folder, or a PostgreSQL database created on the server named by
``QUOTA_TEST_POSTGRES_URL`` (an admin URL; default ``postgresql://postgres@127.0.0.1:5432/test``)
and dropped afterwards. The database is migrated, a configuration applied (4 shares, 2 types) and
one job submitted (fake backend) before the process starts, so its first cycle places that job.
The process gets a fresh ``AIRFLOW_HOME`` (no ``airflow.cfg``: Airflow's defaults, metrics off).

What is measured, from just before the process is started to the time stamp of the log line:

- *imports done*: the line that settles metrics (``metrics are off ...``, ``metrics go to ...``
  or ``Airflow is not installed ...``), logged after the service is built and before the first
  try for the lease: everything it imports before it can lead is imported by then (on
  PostgreSQL the psycopg driver too, which SQLAlchemy imports when the engine is made);
- *lease taken*: ``... leads the quota scheduler (lease epoch ...)``; the migration check
  (``airflow-quota db migrate``'s code, a no-op on a migrated database) runs just before it;
- *first decision*: the ``PLACED`` line of the submitted job, logged once its cycle has committed.

*python alone* is ``python -c pass`` from the same virtualenv: what no change here can cut.
*loaded* runs the same starts with one busy process (``while True: pass``) for the machine's
other core, to mimic a leader restarted on a loaded machine. With ``--source DIR`` the scheduler
runs ``DIR/airflow_quota`` (``PYTHONPATH``), e.g. ``git archive COMMIT airflow_quota | tar -x -C
DIR``; with two, their starts alternate, so a before and an after meet the same load.

``--imports`` runs one more start (SQLite, idle) under ``python -X importtime`` and prints the
top-level imports made before the lease is taken, by cumulative time, and the self time summed
per top-level package (importtime itself slows imports down: compare its figures between
themselves, not with the timings above).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from airflow_quota.store.backend_names import TEST_BACKENDS_VARIABLE  # noqa: E402
from benchmarks.service import ADMIN, fresh_database, prepared, request  # noqa: E402

PYTHON = sys.executable
MARKS = {
    "imports done": ("metrics are off", "metrics go to", "Airflow is not installed"),
    "lease taken": ("leads the quota scheduler",),
    "first decision": (" PLACED ",),
}
"""Each measured moment and the log lines that mark it (the first one seen)."""
TIMEOUT = 120.0
"""How long one start may take before the benchmark gives up on it (a loaded machine is slow)."""


@contextmanager
def sqlite_database() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="quota-start-") as folder:
        yield f"sqlite:///{folder}/quota.db"


DATABASES: dict[str, Callable[[], AbstractContextManager[str]]] = {
    "SQLite": sqlite_database,
    "PostgreSQL": fresh_database,
}


def with_one_job(url: str) -> None:
    """Migrate, apply the benchmark's configuration and submit the job the first cycle places."""
    engine, store = prepared(url, capacity=8)
    store.submit(request(0), "fake", {"duration": 3600})
    engine.dispose()


def scheduler_command(url: str, state: Path, importtime: bool = False) -> list[str]:
    """``airflow-quota scheduler`` as its console script runs it (``airflow_quota.cli.main``)."""
    flags = ["-X", "importtime"] if importtime else []
    code = "import sys; from airflow_quota.cli import main; sys.exit(main())"
    cli = ["scheduler", "--db", url, "--state-dir", str(state), "--poll-seconds", "0.05"]
    return [PYTHON, *flags, "-c", code, *cli]


def environment(home: Path, source: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env |= {"AIRFLOW_HOME": str(home), TEST_BACKENDS_VARIABLE: "fake", "PYTHONUNBUFFERED": "1"}
    if source is not None:
        env["PYTHONPATH"] = str(source)
    return env


def stamp(line: str) -> float | None:
    """The epoch time of a log line (``%(asctime)s``: local time, milliseconds), else None."""
    try:
        return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    except ValueError:
        return None


def marks_in(log: str) -> dict[str, float]:
    """When each of MARKS was first logged, as epoch seconds."""
    found: dict[str, float] = {}
    for line in log.splitlines():
        for mark, needles in MARKS.items():
            at = stamp(line)
            if mark not in found and at is not None and any(needle in line for needle in needles):
                found[mark] = at
    return found


def one_start(database: str, source: Path | None, importtime: bool = False) -> tuple[dict[str, float], str]:
    """Start the scheduler on a fresh database with one job waiting; the seconds from just
    before the process started to each mark, and the process's log (stderr)."""
    with DATABASES[database]() as url, tempfile.TemporaryDirectory(prefix="quota-start-") as folder:
        with_one_job(url)
        root = Path(folder)
        (root / "home").mkdir()
        log_path = root / "scheduler.log"
        with log_path.open("w") as log:
            started = time.time()
            proc = subprocess.Popen(
                scheduler_command(url, root / "state", importtime),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=environment(root / "home", source),
                cwd=root,  # not the checkout: python -c puts the working folder first on sys.path
            )
            try:
                deadline = time.monotonic() + TIMEOUT
                while "first decision" not in marks_in(log_path.read_text()):  # poll the log, no fixed sleep
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise SystemExit(f"the scheduler did not place the job:\n{log_path.read_text()[-3000:]}")
                    time.sleep(0.01)
            finally:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        text = log_path.read_text()
    return {mark: at - started for mark, at in marks_in(text).items()}, text


def python_alone() -> float:
    started = time.perf_counter()
    subprocess.run([PYTHON, "-c", "pass"], check=True)
    return time.perf_counter() - started


@contextmanager
def busy_core(loaded: bool) -> Iterator[None]:
    """With ``loaded``, one process spinning on a core for as long as the block runs."""
    if not loaded:
        yield
        return
    spinner = subprocess.Popen([PYTHON, "-c", "while True: pass"])
    try:
        yield
    finally:
        spinner.kill()
        spinner.wait()


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):6.2f} / {min(values):5.2f}"


def timings(repeat: int, sources: list[Path | None], databases: list[str], loads: list[str]) -> None:
    """Median and least over ``repeat`` starts of each mark, per load, database and source; the
    sources' starts alternate, so a load that comes and goes weighs on each alike."""
    print(f"{'start of airflow-quota scheduler, seconds':<56} {'median / least':>14}")
    for load in loads:
        with busy_core(load == "loaded"):
            alone = [python_alone() for _ in range(repeat)]
            print(f"{load + ': python alone':<56} {summary(alone)}")
            for database in databases:
                runs: dict[Path | None, list[dict[str, float]]] = {source: [] for source in sources}
                for _ in range(repeat):
                    for source in sources:
                        runs[source].append(one_start(database, source)[0])
                for source in sources:
                    for mark in MARKS:
                        label = f"{load}, {database}{'' if source is None else f' ({source.name})'}: {mark}"
                        print(f"{label:<56} {summary([r[mark] for r in runs[source]])}")


def top_imports(source: Path | None, count: int) -> None:
    """What the scheduler imports before it leads, from ``-X importtime`` (one SQLite start)."""
    _, text = one_start("SQLite", source, importtime=True)
    before = text.split("leads the quota scheduler")[0].splitlines()
    rows: list[tuple[int, int, str]] = []
    for line in before:
        if line.startswith("import time:") and "|" in line:
            self_us, cumulative_us, name = line[len("import time:") :].split("|", 2)
            if self_us.strip().isdigit():
                rows.append((int(cumulative_us), int(self_us), name.rstrip()))
    top_level = sorted((r for r in rows if not r[2].startswith("  ")), reverse=True)  # a top-level import
    print(f"\nbefore the lease: {len(rows)} modules, {sum(r[1] for r in rows) / 1e6:.2f} s of import (importtime)")
    print("top-level imports by cumulative time:")
    for cumulative, _, name in top_level[:count]:
        print(f"  {cumulative / 1000:7.0f} ms  {name.strip()}")
    packages: Counter[str] = Counter()
    for _, own, name in rows:
        packages[name.strip().split(".")[0]] += own
    print("self time by top-level package:")
    for package, own in packages.most_common(count):
        print(f"  {own / 1000:7.0f} ms  {package}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5, help="starts of each kind (median and least)")
    parser.add_argument(
        "--source", type=Path, action="append", help="a folder holding the airflow_quota to run (repeatable)"
    )
    parser.add_argument("--imports", action="store_true", help="also the top imports before the lease")
    parser.add_argument("--top", type=int, default=12, help="how many imports and packages --imports lists")
    parser.add_argument("--database", choices=sorted(DATABASES), action="append", help="only these (repeatable)")
    parser.add_argument("--load", choices=["idle", "loaded"], action="append", help="only these (repeatable)")
    args = parser.parse_args()
    sources: list[Path | None] = list(args.source or [None])
    for source in sources:
        if source is not None and not (source / "airflow_quota" / "cli.py").is_file():
            parser.error(f"--source: {source} holds no airflow_quota/cli.py")
    flags = f"--repeat {args.repeat}" + "".join(f" --source {source}" for source in sources if source is not None)
    print(f"$ python benchmarks/scheduler_start.py {flags}  (PostgreSQL at {ADMIN.split('@')[-1]})")
    timings(args.repeat, sources, args.database or list(DATABASES), args.load or ["idle", "loaded"])
    if args.imports:
        for source in sources:
            top_imports(source, args.top)


if __name__ == "__main__":
    main()
