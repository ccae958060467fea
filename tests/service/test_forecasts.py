"""The quota scheduler keeps every live job's forecast (``service/forecasts.py``) in
``quota_forecasts``, and ``airflow-quota jobs list/show`` say it: on SQLite and PostgreSQL, a
replay whose answer is known (a share of one instance; j1 and j2 run 100 s each, j3 and j4 come
at 150 s, once j1's runtime is known) and a refresh in the worker process."""

from __future__ import annotations

import multiprocessing
import threading

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from airflow_quota.core import snapshot
from airflow_quota.core.cycle import QuotaScheduler
from airflow_quota.core.estimates import EstimateSource, RuntimeEstimate
from airflow_quota.service.forecasts import ForecastRefresh, _Follower
from airflow_quota.sim.forecast import Forecast, forecast
from airflow_quota.store.models import ForecastRow, JobRow
from benchmarks.service_replay import ServiceReplay
from tests.builders import job, quota, request, scenario, share
from tests.conftest import cli
from tests.waiting import wait_for

G5 = "ml.g5.xlarge"
WORKLOAD = scenario(
    quota({G5: 1}, share("A", {G5: 1})),
    job("j1", "A", (G5, 1), duration=100),
    job("j2", "A", (G5, 1), duration=100),
    job("j3", "A", (G5, 1), duration=100, at=150),
    job("j4", "A", (G5, 1), duration=100, at=150),
)


def forecasts(engine: Engine) -> dict[str, ForecastRow]:
    with Session(engine, expire_on_commit=False) as session:
        rows = session.execute(select(JobRow.name, ForecastRow).join(JobRow, JobRow.id == ForecastRow.job_id)).all()
    return {name: row for name, row in rows}


def test_the_forecast_is_kept_and_shown(engine: Engine) -> None:
    replay = ServiceReplay(WORKLOAD, engine, service_options={"forecast_interval": 0.0, "forecast_inline": True})
    origin = replay.origin
    while replay.now < origin + 150:
        assert replay.advance()
    kept = forecasts(engine)
    assert set(kept) == {"j2", "j3", "j4"}, "j1 has ended; the others are live"
    assert kept["j2"].end == origin + 200 and kept["j2"].source == EstimateSource.POOL.value
    assert kept["j3"].start == origin + 200 and kept["j3"].instance_type == G5 and not kept["j3"].preempts
    assert kept["j4"].start == origin + 300
    url = engine.url.render_as_string(hide_password=False)
    shown = cli("jobs", "show", "j3", "--db", url, "--json")
    assert shown.code == 0, shown.stderr
    assert shown.json()["forecast"]["start"] == origin + 200
    text = cli("jobs", "show", "j3", "--db", url)
    assert "expected to start around" in text.stdout and "on 1x ml.g5.xlarge" in text.stdout
    listed = cli("jobs", "list", "--db", url)
    assert "around" in listed.stdout and "ends around" in listed.stdout
    assert replay.run(max_steps=1000)
    assert forecasts(engine) == {}, "nothing is live at the end: no forecast is left"


@pytest.mark.parametrize(
    ("expected_runtime", "lead_ends", "source", "next_starts"),
    [(250.0, 250.0, EstimateSource.AUTHOR, 250.0), (None, None, EstimateSource.NONE, None)],
    ids=["given", "not given"],
)
def test_the_authors_expected_runtime_is_the_best_estimate(
    engine: Engine,
    expected_runtime: float | None,
    lead_ends: float | None,
    source: EstimateSource,
    next_starts: float | None,
) -> None:
    """A job submitted with an expected runtime (the operator's ``expected_runtime``, stored as
    ``expected_runtime_seconds``) is forecast to run that long and says so; the job waiting
    behind it is expected to start when it ends, before any run has finished. Without it, no
    history can say yet: neither is forecast."""
    replay = ServiceReplay(
        scenario(quota({G5: 1}, share("A", {G5: 1})), job("j1", "A", (G5, 1), duration=100)),
        engine,
        service_options={"forecast_interval": 0.0, "forecast_inline": True},
    )
    origin = replay.origin
    replay.durations["lead"] = 100  # how long it truly runs: the forecast is not told
    replay.ids["lead"] = replay.store.submit(
        request("lead", "A", (G5, 1)), "fake", {"startup": 0, "failures": []}, expected_runtime_seconds=expected_runtime
    ).id
    assert replay.advance()  # at the start: lead (submitted first) is placed, j1 waits for it
    kept = forecasts(engine)
    assert set(kept) == {"lead", "j1"}
    assert kept["lead"].source == source.value
    assert kept["lead"].end == (None if lead_ends is None else origin + lead_ends)
    assert kept["j1"].start == (None if next_starts is None else origin + next_starts)


def test_a_refresh_runs_in_a_process_of_its_own(sqlite_url: str) -> None:
    from airflow_quota.store.engine import make_engine, migrate

    engine = make_engine(sqlite_url)
    migrate(engine)
    replay = ServiceReplay(WORKLOAD, engine)
    while replay.now < replay.origin + 150:
        assert replay.advance()
    assert replay.service.scheduler is not None
    refresh = ForecastRefresh(sqlite_url, interval=0.0)
    try:
        refresh.after_step(replay.service.scheduler, replay.now, changed=True)
        assert refresh._running is not None, "the refresh was handed to the worker"
        wait_for(lambda: (refresh.after_step(None, replay.now, False), refresh.refreshed)[1] == 1, timeout=60)
    finally:
        refresh.close()
    assert forecasts(engine)["j3"].start == replay.origin + 200


def test_the_worker_follows_the_input_log_as_a_standby_does(engine: Engine) -> None:
    """The forecast's process rebuilds the core once from the log (the newest snapshot and the
    inputs after it), then takes in only the inputs committed since: each time it forecasts what
    the leader's own state does, and the leader hands it nothing. (Not the very same state: a
    cycle that decided nothing is not logged, and a replay needs it not.) A log that is no longer
    the one it followed (here: its last input is not what it took in) is followed anew, with a
    record of forecasts of its own: a job id of another log is another job, and learning from it
    would skew the calibration (a quota database emptied and filled again gave ranges that began
    before the job's submission)."""
    replay = ServiceReplay(WORKLOAD, engine)
    follower = _Follower()

    def predicted(scheduler: QuotaScheduler) -> Forecast:
        copy = snapshot.decode(snapshot.encode(scheduler))  # the leader's own is left as it is
        estimates = {seq: RuntimeEstimate(EstimateSource.TASK, (100.0,)) for seq in copy.state.jobs}
        return forecast(copy, replay.now, estimates, runs=2, seed=7)

    def caught_up() -> QuotaScheduler:
        with Session(engine) as session, session.begin():
            followed = follower.catch_up(session)
        assert followed is not None and replay.service.scheduler is not None
        assert predicted(followed) == predicted(replay.service.scheduler)
        return followed

    while replay.now < replay.origin + 150:
        assert replay.advance()
    first = caught_up()
    assert set(predicted(first).starts) == {"j3", "j4"}, "the jobs the forecast is about"
    record = follower.record
    record.note_first(3, replay.now, 50.0)
    taken = follower.last_input
    assert replay.advance()
    assert caught_up() is first, "fed the new inputs, not rebuilt"
    assert follower.last_input > taken
    assert follower.record is record and 3 in record.first, "the same log: the same record"
    follower._last_row = ("submit", -1.0)
    assert caught_up() is not first, "rebuilt from the log"
    assert follower.record is not record and not follower.record.first, "another log: a record of its own"


def test_the_worker_waits_while_the_leader_runs_the_core(sqlite_url: str) -> None:
    """``leader_first`` raises a byte the worker shares while the leader takes in inputs and
    runs its cycle; a worker giving way (``_give_way``, before each input of a forward run)
    waits while it is up and goes on once it is down."""
    from airflow_quota.service import forecasts as worker

    refresh = ForecastRefresh(sqlite_url, interval=0.0)
    try:
        with refresh.leader_first():
            pass  # no worker yet: nothing to raise
        refresh._start_worker()
        busy = refresh._leader_busy
        assert busy is not None and busy.value == 0
        with pytest.raises(RuntimeError), refresh.leader_first():
            assert busy.value == 1
            raise RuntimeError("a step that fails lowers it too")
        assert busy.value == 0
    finally:
        refresh.close()
    shared = multiprocessing.get_context("spawn").RawValue("b", 1)
    worker._LEADER_BUSY = shared  # as the worker process's start sets it
    try:
        waiting = threading.Thread(target=worker._give_way)
        waiting.start()
        waiting.join(timeout=0.5)
        assert waiting.is_alive(), "it went on while the leader ran the core"
        shared.value = 0
        waiting.join(timeout=30)
        assert not waiting.is_alive()
    finally:
        worker._LEADER_BUSY = None


def test_the_leaders_step_holds_the_worker(sqlite_url: str) -> None:
    """The quota service raises the worker's byte for the whole of each step, and lowers it after."""
    from airflow_quota.store.engine import make_engine, migrate

    engine = make_engine(sqlite_url)
    migrate(engine)
    replay = ServiceReplay(WORKLOAD, engine, service_options={"forecast_interval": 0.0})
    refresh = replay.service.forecasts
    assert refresh is not None
    try:
        while refresh._leader_busy is None:  # the worker starts with the first refresh
            assert replay.advance()
        busy = refresh._leader_busy
        seen: list[int] = []
        step = replay.service._step

        def watched() -> bool:
            seen.append(busy.value)
            return step()

        replay.service._step = watched  # type: ignore[method-assign]
        assert replay.advance()
        assert seen and set(seen) == {1}, "the byte was down during a step"
        assert busy.value == 0
        running = refresh._running
        wait_for(lambda: running is None or running.done(), 60, "the refresh in flight")  # no thread left behind
    finally:
        refresh.close()
