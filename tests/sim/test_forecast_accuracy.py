"""``airflow-quota forecast-accuracy`` (issue 41): forecasts made at submission from what was
known then, compared with the replay's starts; the JSON document's contract; bad input; and
the calibration by the forecasts' own record."""

from __future__ import annotations

from pathlib import Path

from airflow_quota.core.estimates import EstimateSource
from airflow_quota.core.model import Entry
from airflow_quota.sim.forecast import Calibration, ExpectedStart
from airflow_quota.sim.forecast_accuracy import BUCKETS, PREDICTORS, measure
from tests.builders import job, quota, scenario, share
from tests.conftest import cli

DATA = Path(__file__).resolve().parent / "data"
G5 = "ml.g5.xlarge"


def test_a_forecast_uses_only_what_was_known_at_submission() -> None:
    """j1 runs 0-100 and j2 100-200 in a share of one; j2, submitted at 0, gets no forecast (no
    run had finished: j1's end is unknown); j3, submitted at 150, once j1's 100 s are known, is
    forecast to start when j2 ends, at 200, and does."""
    loaded = scenario(
        quota({G5: 1}, share("A", {G5: 1})),
        job("j1", "A", (G5, 1), duration=100),
        job("j2", "A", (G5, 1), duration=100),
        job("j3", "A", (G5, 1), duration=100, at=150),
    )
    by_name = {p.job: p for p in measure(loaded, runs=3)}
    assert by_name["j1"].forecast == 0 and by_name["j1"].started == 0
    assert by_name["j2"].forecast is None and by_name["j2"].started == 100
    assert by_name["j3"].forecast == 200 and by_name["j3"].started == 200
    assert by_name["j3"].naive_share_wait == 150, "nobody waits ahead of it: the naive guess is now"


def test_known_runtimes_and_another_task_change_what_the_forecast_knows() -> None:
    """The bounds ``benchmarks/forecast_accuracy.py`` measures beside the forecast: with every
    job's own duration as its estimate, j2 (no run finished at its submission) is forecast,
    exactly, as is j4 behind j3's 300 s, which the history (100 s runs) underestimates; and the
    history is kept and asked by the ``task`` given, for finished and live jobs alike."""
    loaded = scenario(
        quota({G5: 1}, share("A", {G5: 1})),
        job("j1", "A", (G5, 1), duration=100),
        job("j2", "A", (G5, 1), duration=100),
        job("j3", "A", (G5, 1), duration=300, at=150),
        job("j4", "A", (G5, 1), duration=100, at=150),
    )
    learned = {p.job: p for p in measure(loaded, runs=3)}
    assert learned["j2"].forecast is None and learned["j4"].forecast == 300 and learned["j4"].started == 500
    known = {p.job: p for p in measure(loaded, runs=3, known_runtimes=True)}
    assert known["j2"].forecast == known["j2"].started == 100
    assert known["j4"].forecast == known["j4"].started == 500
    asked: list[str] = []
    measure(loaded, runs=3, task=lambda j: asked.append(j.name) or "kind")
    assert "j1" in asked and "j4" in asked


def test_the_json_document_holds_the_contracts_fields(tmp_path: Path) -> None:
    run = cli("forecast-accuracy", "--trace", f"itp:{DATA / 'itp'}", "--quota", str(DATA / "itp-quota.yaml"), "--json")
    assert run.code == 0, run.stderr
    document = run.json()
    assert set(document["buckets"]) == {name for name, _, _ in BUCKETS}
    assert sum(group["jobs"] for group in document["buckets"].values()) == document["jobs"] > 0
    for group in [document["waited_1h_plus"], *document["buckets"].values()]:
        for predictor in PREDICTORS:
            assert set(group[predictor]) == {"median_abs_error_s", "p90_abs_error_s", "median_rel_error"}
        assert {"within_band", "range_coverage", "without_forecast"} <= set(group)
    text = cli("forecast-accuracy", "--trace", f"itp:{DATA / 'itp'}", "--quota", str(DATA / "itp-quota.yaml"))
    assert text.code == 0 and "waited 1 h+" in text.stdout and "naive_position" in text.stdout


def test_bad_input_names_the_flag_and_exits_2() -> None:
    for flag, value in (("--every", "0"), ("--runs", "-1")):
        run = cli(
            "forecast-accuracy", "--trace", f"itp:{DATA / 'itp'}", "--quota", str(DATA / "itp-quota.yaml"), flag, value
        )
        assert run.code == 2 and flag in run.stderr and "Traceback" not in run.stderr
    missing = cli("forecast-accuracy", "--trace", f"itp:{DATA / 'itp'}", "--quota", "/nonexistent.yaml")
    assert missing.code == 2 and "Traceback" not in missing.stderr


def expected(start: float, low: float, high: float | None) -> ExpectedStart:
    return ExpectedStart("j", "A", start, low, high, Entry(G5, 1), 0, False, 0, EstimateSource.TASK)


def test_the_calibration_scales_by_the_record_once_it_holds_enough() -> None:
    calibration = Calibration(needed=30)
    raw = expected(1_100.0, 1_050.0, 1_200.0)
    for _ in range(29):
        calibration.learn("B", 100.0, 200.0)
    assert calibration.apply(raw, 1_000.0) == raw, "too few outcomes: left as it was"
    calibration.learn("B", 100.0, 200.0)
    calibrated = calibration.apply(raw, 1_000.0)
    assert (calibrated.start, calibrated.low, calibrated.high) == (1_200.0, 1_050.0, 1_200.0)
    assert calibration.apply(expected(1_100.0, 1_050.0, None), 1_000.0).high is None, "no end stays no end"


def test_the_calibration_takes_the_jobs_share_record_once_it_holds_enough() -> None:
    """Share B's forecasts came out twice too early, share A's three times: A's job is scaled by
    the pool's record (mostly B's) until A's own holds ``needed`` outcomes, then by A's."""
    calibration = Calibration(needed=30)
    raw = expected(1_100.0, 1_050.0, 1_200.0)  # a job of share A, forecast to wait 100 s
    for _ in range(60):
        calibration.learn("B", 100.0, 200.0)
    for _ in range(29):
        calibration.learn("A", 100.0, 300.0)
    assert calibration.apply(raw, 1_000.0).start == 1_200.0, "the pool's median ratio: 2"
    calibration.learn("A", 100.0, 300.0)
    assert calibration.apply(raw, 1_000.0).start == 1_300.0, "share A's own: 3"


def test_the_calibration_learns_nothing_from_a_start_before_its_forecast() -> None:
    """A start before the forecast was made (two hosts' clocks) says nothing of the forecast: a
    negative ratio would put a range's early end before the instant it was made."""
    calibration = Calibration(needed=30)
    for _ in range(30):
        calibration.learn("A", 100.0, -50.0)
    assert not calibration.ready
    for _ in range(30):
        calibration.learn("A", 100.0, 200.0)
    calibrated = calibration.apply(expected(1_100.0, 1_050.0, 1_200.0), 1_000.0)
    assert calibrated.low is not None and calibrated.low >= 1_000.0
