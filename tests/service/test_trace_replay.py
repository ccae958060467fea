"""The short version of the ITP trace through the real service under chaos (issue 39): the
trace's first 2,000 jobs through real ``airflow-quota scheduler`` processes on a PostgreSQL
server of the test's own, with two leader SIGKILLs (a standby takes over each time), one
server restart, and 2 % of the fake backend's calls failing. The whole trace is
``benchmarks/trace_chaos.py``; the machinery, and why the clock is scaled, ``trace_chaos.py``.

The trace's durations are a quarter of the real ones and its clock runs 40,000 times faster
than the wall's; the run took 46 s on the 2-core machine with a load average of 7, 160 s with a load
average of 12 (other suites running), most of it the 2,000 submissions.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.service.trace_chaos import ChaosSettings, run_chaos

JOBS = 2000


@pytest.mark.timeout(600)
def test_two_thousand_trace_jobs_through_kills_a_restart_and_failing_calls(tmp_path: Path) -> None:
    """Every job ends exactly once (none lost, doubled or stuck), nothing starts twice, the
    invariant holds after every committed step of the decision log and in every sample, and
    no capacity is held at the end; the faults all happened, and each was recovered from."""
    settings = ChaosSettings(jobs=JOBS, speed=40_000, kills=2, restarts=1, duration_scale=0.25, timeout=300)
    result = run_chaos(settings, tmp_path)

    assert not result.problems, result.problems
    assert result.jobs == JOBS
    assert sum(result.outcomes.values()) == JOBS and set(result.outcomes) <= {"SUCCEEDED", "FAILED"}, result.outcomes
    assert sorted(f.kind for f in result.faults) == ["kill", "kill", "restart"], result.faults
    for fault in result.faults:
        assert fault.decision_after is not None and fault.decision_after < 60, fault
    assert result.injected.get("start", 0) > 0 and result.injected.get("poll", 0) > 0, result.injected
    assert result.books["attempts"] >= JOBS, result.books
    assert result.audit.events >= 3 * JOBS and result.audit.steps > 10, (result.audit.events, result.audit.steps)
    assert result.watcher_samples >= 20, result.watcher_samples
