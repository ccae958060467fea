"""The quota scheduler's metrics through Airflow's metrics (issue 5): a real UDP socket stands
in for a StatsD server, Airflow's ``[metrics]`` is configured through its environment variables,
and the quota scheduler initialises Airflow's stats the way Airflow's own processes do.
"""

from __future__ import annotations

import logging
import socket
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("airflow.sdk")

from sqlalchemy import Engine

from airflow_quota.core.model import JobRequest
from airflow_quota.service.backends.fake import FakeBackend
from airflow_quota.service.clock import ManualClock
from airflow_quota.service.metrics import QuotaMetrics, StatsBackend
from airflow_quota.service.scheduler import QuotaService
from airflow_quota.store.engine import make_engine, migrate
from airflow_quota.store.repository import QuotaStore
from tests.service.stats_recording import Recording

G5 = [{"instance_type": "ml.g5.xlarge", "count": 1}]
QUOTA: dict[str, Any] = {
    "pool": {"capacity": {"ml.g5.xlarge": 2}},
    "shares": [
        {
            "name": "research",
            "capacity_limits": {"ml.g5.xlarge": 1},
            "strategy": "LEND_AND_BORROW",
            "starvation_after_seconds": 60,
        },
        {"name": "prod", "capacity_limits": {"ml.g5.xlarge": 1}, "strategy": "LEND"},
    ],
}
"""Two g5 instances, one per share: research borrows prod's until prod wants it back."""


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    engine = make_engine(f"sqlite:///{tmp_path / 'quota.db'}")
    migrate(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def airflow_stats(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Airflow's stats module as a fresh process has it, restored afterwards (it is global)."""
    from airflow.sdk._shared.observability.metrics import stats

    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "airflow"))  # if this is the first import of Airflow
    monkeypatch.setattr(stats, "_factory", None)
    monkeypatch.setattr(stats, "_backend", None)
    yield


@pytest.fixture
def statsd_listener(monkeypatch: pytest.MonkeyPatch, airflow_stats: None) -> Iterator[socket.socket]:
    """A UDP socket where Airflow's ``[metrics]`` sends StatsD, as a StatsD server would listen."""
    pytest.importorskip("statsd")
    listener = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    listener.bind(("127.0.0.1", 0))
    listener.settimeout(0.5)
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_ON", "True")
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_HOST", "127.0.0.1")
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_PORT", str(listener.getsockname()[1]))
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_PREFIX", "airflow")
    yield listener
    listener.close()


def received(listener: socket.socket) -> list[tuple[str, float, str]]:
    """Every StatsD line received so far, as (name, value, type)."""
    lines = []
    try:
        while True:
            for line in listener.recv(65535).decode().splitlines():
                name, rest = line.split(":", 1)
                value, kind = rest.split("|")[:2]
                lines.append((name, float(value), kind))
    except TimeoutError:
        return lines


def run_story(service: QuotaService, store: QuotaStore, clock: ManualClock) -> None:
    """Placements (one borrowing), a cross-share preemption, a starving job (overtaken by a
    higher-priority job of its share) and its alert, a cancelled job."""

    def submit(name: str, share: str) -> int:
        return store.submit(JobRequest(name=name, share=share, preferences=G5), "fake", {"duration": 1000}).id

    def step(at: float) -> None:
        clock.advance_to(at)
        service.step()

    store.submit(JobRequest(name="r1", share="research", preferences=G5), "fake", {"duration": 20})
    r2 = submit("r2", "research")
    step(1000)  # r1 within the limit, r2 borrowing prod's instance
    step(1001)
    submit("p1", "prod")
    step(1010)  # p1 reclaims: r2 preempted, RUNNABLE again
    store.submit(JobRequest(name="r3", share="research", priority=5, preferences=G5), "fake", {"duration": 1000})
    step(1011)
    step(1020)  # r1 ends: r3 (later, higher priority) takes research's instance, overtaking r2
    step(1071)  # r2 has waited 61 s and was overtaken: STARVING
    store.cancel(r2)
    step(1080)  # FAILED CANCELLED


def world(engine: Engine, metrics: QuotaMetrics) -> tuple[QuotaService, QuotaStore, ManualClock]:
    clock = ManualClock(1000.0)
    store = QuotaStore(engine, clock.now)
    store.apply_config(QUOTA)
    service = QuotaService(engine, {"fake": FakeBackend(clock.now)}, clock=clock, metrics=metrics)
    return service, store, clock


def test_a_statsd_listener_receives_the_quota_metrics(
    engine: Engine, statsd_listener: socket.socket, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="airflow_quota")
    metrics = QuotaMetrics.from_airflow(gauge_seconds=0)
    port = statsd_listener.getsockname()[1]
    assert f"metrics go to StatsD at 127.0.0.1:{port} as airflow.quota.* (share and type in the names)" in [
        r.getMessage() for r in caplog.records
    ]
    run_story(*world(engine, metrics))
    lines = [line for line in received(statsd_listener) if line[0].startswith("airflow.quota.")]

    counters: dict[str, float] = defaultdict(float)
    for name, value, kind in lines:
        if kind == "c":
            counters[name] += value
    assert dict(counters) == {
        "airflow.quota.placements.research.ml_g5_xlarge": 3,
        "airflow.quota.placements.prod.ml_g5_xlarge": 1,
        "airflow.quota.preemptions.research.CROSS_SHARE": 1,
        "airflow.quota.alerts.research.STARVING": 1,
        "airflow.quota.notifications.sent.log": 1,
        "airflow.quota.failures.research.CANCELLED": 1,
    }

    gauges: dict[str, list[float]] = defaultdict(list)
    for name, value, kind in lines:
        if kind == "g":
            gauges[name].append(value)
    research = "airflow.quota.share.research.ml_g5_xlarge"
    assert {name.rsplit(".", 1)[1] for name in gauges if name.startswith(research)} == {
        "limit",
        "used",
        "borrowed",
        "lent",
        "runnable",
        "oldest_pending_seconds",
    }
    assert gauges[f"{research}.used"][0] == 2 and gauges[f"{research}.borrowed"][0] == 1
    assert gauges["airflow.quota.share.prod.ml_g5_xlarge.lent"][0] == 1
    assert max(gauges[f"{research}.oldest_pending_seconds"]) == 61
    assert gauges[f"{research}.runnable"][-1] == 0  # r2 cancelled

    timings = [value for name, value, kind in lines if kind == "ms"]
    assert {name for name, _, kind in lines if kind == "ms"} == {"airflow.quota.cycle.duration"}
    assert timings and all(0 <= t < 5_000 for t in timings)


def test_backends_that_keep_tags_get_one_name_per_metric_with_tags(engine: Engine) -> None:
    backend = Recording()
    _: StatsBackend = backend
    run_story(*world(engine, QuotaMetrics(backend, tagged=True, gauge_seconds=0)))
    counted = [(stat, tags) for call, stat, _, tags in backend.calls if call == "incr"]
    assert counted == [
        ("quota.placements", {"share": "research", "instance_type": "ml.g5.xlarge"}),
        ("quota.placements", {"share": "research", "instance_type": "ml.g5.xlarge"}),
        ("quota.preemptions", {"share": "research", "kind": "CROSS_SHARE"}),
        ("quota.placements", {"share": "prod", "instance_type": "ml.g5.xlarge"}),
        ("quota.placements", {"share": "research", "instance_type": "ml.g5.xlarge"}),
        ("quota.notifications.sent", {"notifier": "log"}),
        ("quota.alerts", {"share": "research", "kind": "STARVING"}),
        ("quota.failures", {"share": "research", "reason": "CANCELLED"}),
    ]
    gauged = {(stat, tuple(sorted((tags or {}).items()))) for call, stat, _, tags in backend.calls if call == "gauge"}
    assert ("quota.share.used", (("instance_type", "ml.g5.xlarge"), ("share", "prod"))) in gauged
    assert {stat for stat, _ in gauged} == {f"quota.share.{g}" for g in ("limit", "used", "borrowed", "lent")} | {
        "quota.share.runnable",
        "quota.share.oldest_pending_seconds",
    }


def test_gauges_go_at_most_every_gauge_seconds_and_idle_cycles_are_not_timed(engine: Engine) -> None:
    backend = Recording()
    service, _, clock = world(engine, QuotaMetrics(backend, tagged=True, gauge_seconds=10))
    gauged_at, timed_at = [], []
    for at in (1000, 1001, 1005, 1009, 1011, 1012):
        clock.advance_to(at)
        before = len(backend.calls)
        service.step()
        calls = {call for call, *_ in backend.calls[before:]}
        if "gauge" in calls:
            gauged_at.append(at)
        if "timing" in calls:
            timed_at.append(at)
    assert gauged_at == [1000, 1011]
    assert timed_at == [1000]  # the configuration was taken in; the later cycles had nothing to do


def test_metrics_off_in_airflow_means_none_sent(
    monkeypatch: pytest.MonkeyPatch, airflow_stats: None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="airflow_quota")
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_ON", "False")
    monkeypatch.setenv("AIRFLOW__METRICS__OTEL_ON", "False")
    assert not QuotaMetrics.from_airflow().enabled
    assert "metrics are off in Airflow's [metrics] (statsd_on, otel_on): the quota scheduler sends none" in [
        r.getMessage() for r in caplog.records
    ]


def test_without_airflow_no_metrics_and_alerts_go_to_the_log(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="airflow_quota")
    for module in ("airflow", "airflow.sdk", "airflow.sdk.configuration", "airflow.sdk.observability"):
        monkeypatch.setitem(sys.modules, module, None)  # import fails as if Airflow were not installed
    assert not QuotaMetrics.from_airflow().enabled
    assert [r.getMessage() for r in caplog.records if "Airflow is not installed" in r.getMessage()] == [
        "Airflow is not installed here: the quota scheduler sends no metrics, and alerts go to the log and to "
        "notifiers that need no Airflow (pip install 'airflow-quota[airflow]')"
    ]

    from airflow_quota.core.config import AlertsConfig
    from airflow_quota.notifications.loader import build_notifiers

    sns = "airflow.providers.amazon.aws.notifications.sns"
    monkeypatch.setitem(sys.modules, sns, None)
    alerts = AlertsConfig.model_validate(
        {
            "notifiers": [
                {"class": "airflow_quota.notifications.QuotaLogNotifier", "name": "audit", "kwargs": {"level": "INFO"}},
                {"class": f"{sns}.SnsNotifier", "kwargs": {"target_arn": "arn:aws:sns:us-east-1:1:t", "message": "m"}},
            ]
        }
    )
    notifiers, problems = build_notifiers(alerts)
    assert [n.name for n in notifiers] == ["audit"]  # a notifier that needs no Airflow works all the same
    assert [p.path for p in problems] == ["alerts.notifiers[1].class"]
    assert problems[0].message.startswith(f"cannot import module '{sns}'")
