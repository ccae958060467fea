"""The soak of issue 3 on real PostgreSQL.

4 submitting processes × N jobs each, 2 quota schedulers (``airflow-quota scheduler``
subprocesses), the fake backend with random durations, the leader SIGKILLed at random moments and
replaced at once, and a watcher (a thread with its own engine) sampling the database throughout:
from the ``quota_jobs`` rows that hold capacity, Σ usage ≤ capacity, borrowed ≤ lendable and each
share within its holding cap, for every type (``docs/model.md`` section 4, computed with ``TypeLedger``).
At the end: every job ends exactly once, no attempt started twice, no open attempt, usage 0 (see
``check_books`` in ``chaos.py``).

N comes from ``QUOTA_SOAK_JOBS`` (default 100, so ``make test`` stays short; 2 to 2.5 minutes on
the 2026-12-03 machine).
The issue's figure is 500 jobs per submitter; run it with::

    QUOTA_SOAK_JOBS=500 .venv/bin/pytest tests/service/test_soak.py -q

``QUOTA_SOAK_SEED`` (default 1) seeds the workload, the durations and the kill moments.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select

from airflow_quota.store.models import JobRow, Leader
from tests.conftest import ROOT
from tests.service.chaos import Env, Scheduler, Watcher, all_final, check_books, counts, prepared
from tests.waiting import wait_for

JOBS = int(os.environ.get("QUOTA_SOAK_JOBS", "100"))
SEED = int(os.environ.get("QUOTA_SOAK_SEED", "1"))
SUBMITTERS = 4

SOAK_POOL = {
    "pool": {"capacity": {"ml.g5.xlarge": 24, "ml.g5.2xlarge": 12}},
    "shares": [
        {
            "name": "research",
            "capacity_limits": {"ml.g5.xlarge": 8, "ml.g5.2xlarge": 4},
            "strategy": "LEND_AND_BORROW",
            "borrow_limit": 200,
            "in_share_preemption": True,
            "in_share_preemption_after_seconds": 0,  # preempts at once: these tests are about preemption
        },
        {"name": "prod", "capacity_limits": {"ml.g5.xlarge": 8, "ml.g5.2xlarge": 4}, "strategy": "LEND"},
        {"name": "critical", "capacity_limits": {"ml.g5.xlarge": 4, "ml.g5.2xlarge": 4}, "strategy": "RESERVE"},
    ],
}

# One submitting process: the mixed workload of chaos.py (borrowing, reclaim,
# in-share preemption), submitted through QuotaStore with random pauses.
SUBMITTER = """
import random, sys
from tests.service.chaos import mixed_workload, submit_over_time
url, prefix, n, seed, pause = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
rng = random.Random(seed)
submit_over_time(url, mixed_workload(rng, prefix, n), rng, pause)
"""


# its own deadline is 300 s + 0.5 s a job, after the leaders' start; the submitters and the books
# come on top: the default limit (pyproject.toml) is too short for QUOTA_SOAK_JOBS=500
@pytest.mark.timeout(900 + SUBMITTERS * JOBS)
def test_soak(postgres_url: str, tmp_path: Path, schedulers: list[Scheduler]) -> None:
    rng = random.Random(SEED)
    env = Env(postgres_url, tmp_path)
    engine, store = prepared(postgres_url, SOAK_POOL)
    latest = store.latest_config()
    assert latest is not None
    watcher = Watcher(postgres_url, latest[1], interval=0.02).start()
    total = SUBMITTERS * JOBS

    live = [Scheduler(env), Scheduler(env)]
    schedulers.extend(live)
    # jobs arrive while a leader runs, not all before it leads
    wait_for(lambda: any(s.leads() for s in live), 60, lambda: f"a leader: {[s.log()[-2000:] for s in live]}")
    pythonpath = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    submitters = [
        subprocess.Popen(
            [sys.executable, "-c", SUBMITTER, postgres_url, f"s{k}", str(JOBS), str(SEED * 100 + k), "0.05"],
            env=dict(os.environ, PYTHONPATH=pythonpath),
            stderr=subprocess.PIPE,
            text=True,
        )
        for k in range(SUBMITTERS)
    ]

    done = all_final(engine, total)
    kills = 0
    takeovers: list[float] = []
    # a guard against a hang, not a speed target: 400 jobs took 105 s on one machine and 120 to
    # 145 s on another, alone, and longer beside other work (each leader lives 1 to 4 s: a
    # leader whose first step outlives that makes no progress, the livelock this catches)
    deadline = time.monotonic() + 300 + total * 0.5
    while any(p.poll() is None for p in submitters) or not done():
        assert time.monotonic() < deadline, f"the soak did not finish: {counts(engine)}"
        time.sleep(rng.uniform(1.0, 4.0))
        leaders = [s for s in live if s.leads()]
        assert len(leaders) <= 1, [s.log() for s in leaders]  # one leader among the living
        assert all(s.alive() for s in live), [s.log()[-2000:] for s in live if not s.alive()]
        if not leaders:
            continue  # the replacement of the last one killed has not come up yet
        leader = leaders[0]
        with engine.connect() as c:
            assert c.scalar(select(Leader.holder)) == leader.holder
        leader.kill()
        killed_at = time.monotonic()
        kills += 1
        live.remove(leader)
        fresh = Scheduler(env)
        schedulers.append(fresh)
        live.append(fresh)
        standby = live[0]
        wait_for(
            lambda: standby.leads() or fresh.leads(),  # noqa: B023 (waited for within the iteration)
            10,
            lambda: f"a takeover:\n{standby.log()[-2000:]}",  # noqa: B023
        )
        takeovers.append(time.monotonic() - killed_at)

    for p in submitters:
        assert p.wait(timeout=60) == 0, p.stderr.read() if p.stderr else ""
    watcher.stop()
    with engine.connect() as c:
        assert c.scalar(select(func.count()).select_from(JobRow)) == total
    figures = check_books(env, engine, total)

    assert not watcher.errors, watcher.errors[:5]
    watcher.assert_held(at_least=100)
    assert watcher.busiest > 20, "the pool was never busy: the soak did not load it"
    assert kills >= 3, f"only {kills} kills: the soak was too short to mean much"
    assert len(watcher.leaders) >= 2, watcher.leaders
    assert max(takeovers) < 10, takeovers
    preempted = sum(j.preemptions for j in store.jobs())
    assert preempted > 0, "nothing was preempted: the workload should reclaim and preempt in-share"
    print(
        f"soak: {total} jobs, {figures['attempts']} attempts, {preempted} preemptions, {kills} leader kills, "
        f"takeover ≤ {max(takeovers):.1f} s, {watcher.samples} samples, busiest {watcher.busiest} instances, "
        f"{figures['repeated_starts']} repeated start calls"
    )
    for s in live:
        assert s.terminate() == 0
    engine.dispose()
