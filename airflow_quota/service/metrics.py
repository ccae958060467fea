"""The quota scheduler's metrics, through Airflow's metrics (StatsD or OpenTelemetry, as
Airflow's ``[metrics]`` section says), or nowhere when Airflow is not installed or metrics are off.

What is sent (docs/alerts-metrics.md has the table):

- gauges per share and instance type, at most every ``gauge_seconds``: ``limit``, ``used``,
  ``borrowed``, ``lent``, ``runnable``, ``oldest_pending_seconds``, from the shares' view the
  leader last committed (the read model of ``store/views.py``, the figures the CLI and the
  Quotas page show);
- counters per step, from the decisions it made: placements (share, instance type),
  preemptions (share, kind), failures (share, reason), alerts (share, kind), and the
  notifications sent and failed (notifier);
- a timer: how long each cycle took (``quota.cycle.duration``, milliseconds);
- a counter: the leader's heartbeats (``quota.scheduler.heartbeat``), one per lease renewal.

Names start with ``quota.`` (Airflow adds its ``statsd_prefix``/``otel_prefix``). Tags carry
share, instance type, kind, reason where the backend keeps tags (OpenTelemetry, Datadog,
StatsD with ``statsd_influxdb_enabled``); plain StatsD drops tags, so there the values go in the
name: ``quota.share.<share>.<instance type>.used``, with the dots of an instance type turned
into underscores (``ml_g5_xlarge``) to keep one name segment each.

Nothing here runs in the cycle: counters walk the decisions the step already has, gauges read
the view the step already has, and with metrics off every call returns at once.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Iterable
from datetime import timedelta
from typing import Any, Protocol

from airflow_quota.core.model import Alert, Decision, Failed, Placed, Preempted
from airflow_quota.notifications.base import keeping_logging
from airflow_quota.store.settings import airflow_config_file
from airflow_quota.store.views import QuotaView

log = logging.getLogger("airflow_quota.scheduler")

GAUGES = ("limit", "used", "borrowed", "lent", "runnable", "oldest_pending_seconds")
"""Per share and instance type, in this order."""
SWITCHES = ("statsd_on", "statsd_datadog_enabled", "otel_on")
"""The options of Airflow's ``[metrics]`` that turn its metrics on; each is False by default."""
FALSE_WORDS = ("f", "false", "0")
"""What Airflow's ``conf.getboolean`` reads as False."""


def metrics_may_be_on() -> bool:
    """Whether Airflow's ``[metrics]`` may turn metrics on, read without importing Airflow.

    Why: importing Airflow's configuration costs a second or two on an idle machine, many more
    on a loaded one, and the quota scheduler settles its metrics before it tries for the lease,
    so a new leader would wait that long for nothing where metrics are off (the default).
    False only when every switch (``SWITCHES``) is absent, Airflow's default, or set to one of
    Airflow's false words, in its environment variable or in Airflow's configuration file, read
    in Airflow's order; a switch set to anything else, or given as a command or a secret, is
    left to Airflow to read (``QuotaMetrics.from_airflow``), including values Airflow refuses."""
    parser = airflow_config_file()
    for option in SWITCHES:
        variable = f"AIRFLOW__METRICS__{option.upper()}"
        if variable in os.environ:
            value = os.environ[variable]
        elif any(f"{variable}{suffix}" in os.environ for suffix in ("_CMD", "_SECRET")):
            return True
        elif parser.has_option("metrics", option):
            value = parser.get("metrics", option)
        elif any(parser.has_option("metrics", f"{option}{suffix}") for suffix in ("_cmd", "_secret")):
            return True
        else:
            continue
        word = os.path.expandvars(value).lower().strip().split("#")[0].strip()  # as Airflow reads it
        if word not in FALSE_WORDS:
            return True
    return False


class StatsBackend(Protocol):
    """The three calls of ``airflow.sdk.observability.stats`` the quota scheduler makes."""

    def incr(self, stat: str, count: int = 1, *, tags: dict[str, str] | None = None) -> None: ...

    def gauge(self, stat: str, value: float, *, tags: dict[str, str] | None = None) -> None: ...

    def timing(self, stat: str, dt: timedelta, *, tags: dict[str, str] | None = None) -> None: ...


class AirflowStats:
    """``airflow.sdk.observability.stats`` as a ``StatsBackend``."""

    def __init__(self, stats: Any) -> None:
        self.stats = stats

    def incr(self, stat: str, count: int = 1, *, tags: dict[str, str] | None = None) -> None:
        self.stats.incr(stat, count, tags=tags)

    def gauge(self, stat: str, value: float, *, tags: dict[str, str] | None = None) -> None:
        self.stats.gauge(stat, value, tags=tags)

    def timing(self, stat: str, dt: timedelta, *, tags: dict[str, str] | None = None) -> None:
        self.stats.timing(stat, dt, tags=tags)


def segment(value: str) -> str:
    """A tag value as one segment of a StatsD name: dots would split it in two."""
    return value.replace(".", "_")


class QuotaMetrics:
    """Turns what a step did into metrics. ``QuotaMetrics.off()`` sends nothing;
    ``QuotaMetrics.from_airflow()`` sends through Airflow's metrics as configured.

    :param backend: where metrics go; None for nowhere.
    :param tagged: whether the backend keeps tags; if not, tag values go in the names.
    :param gauge_seconds: gauges are sent at most this often (service clock seconds).
    """

    def __init__(self, backend: StatsBackend | None, tagged: bool = True, gauge_seconds: float = 10.0) -> None:
        self.backend = backend
        self.tagged = tagged
        self.gauge_seconds = gauge_seconds
        self._last_gauges = float("-inf")
        self._gauged: set[tuple[str, str]] = set()
        self._failing = False

    @property
    def enabled(self) -> bool:
        return self.backend is not None

    @classmethod
    def off(cls) -> QuotaMetrics:
        return cls(None)

    @classmethod
    def from_airflow(cls, gauge_seconds: float = 10.0) -> QuotaMetrics:
        """Initialise Airflow's metrics in this process as Airflow's own processes do
        (``stats.initialize`` with the factory ``[metrics]`` selects) and send through them;
        with Airflow missing or metrics off, send nothing. Says which in one log line. Airflow is
        imported only when its ``[metrics]`` may turn metrics on (``metrics_may_be_on``)."""
        installed = importlib.util.find_spec("airflow") is not None  # finds, does not import
        if not installed or not metrics_may_be_on():
            return cls._none_sent(airflow_installed=installed)
        try:
            with keeping_logging():
                from airflow.sdk.configuration import conf
                from airflow.sdk.observability import stats
                from airflow.sdk.observability.metrics import stats_utils
        except ImportError:
            return cls._none_sent(airflow_installed=False)
        statsd = conf.getboolean("metrics", "statsd_on")
        datadog = conf.getboolean("metrics", "statsd_datadog_enabled", fallback=False)
        otel = conf.getboolean("metrics", "otel_on", fallback=False)
        if not (statsd or datadog or otel):
            return cls._none_sent(airflow_installed=True)
        client = "datadog" if datadog else "statsd"
        if (statsd or datadog) and importlib.util.find_spec(client) is None:  # Airflow's logger needs it
            log.error(
                "[metrics] %s is set but the %s package is not installed (pip install 'apache-airflow[%s]'): "
                "the quota scheduler sends no metrics",
                "statsd_datadog_enabled" if datadog else "statsd_on",
                client,
                client,
            )
            return cls.off()
        stats.initialize(
            factory=stats_utils.get_stats_factory(),
            export_legacy_names=conf.getboolean("metrics", "legacy_names_on", fallback=True),
        )
        if datadog:
            tagged, where = True, "Datadog StatsD"
        elif statsd:
            tagged = conf.getboolean("metrics", "statsd_influxdb_enabled", fallback=False)
            where = "StatsD" + (" (InfluxDB tags)" if tagged else "")
        else:
            tagged, where = True, "OpenTelemetry"
        if datadog or statsd:
            where += f" at {conf.get('metrics', 'statsd_host')}:{conf.get('metrics', 'statsd_port')}"
            prefix = conf.get("metrics", "statsd_prefix", fallback="")
        else:
            host, port = conf.get("metrics", "otel_host", fallback="?"), conf.get("metrics", "otel_port", fallback="?")
            where += f" at {host}:{port}"
            prefix = conf.get("metrics", "otel_prefix", fallback="")
        shape = "tags" if tagged else "share and type in the names"
        log.info("metrics go to %s as %squota.* (%s)", where, f"{prefix}." if prefix else "", shape)
        return cls(AirflowStats(stats), tagged=tagged, gauge_seconds=gauge_seconds)

    @classmethod
    def _none_sent(cls, airflow_installed: bool) -> QuotaMetrics:
        """No metrics, said in one log line: Airflow is missing, or its ``[metrics]`` are off."""
        if not airflow_installed:
            log.info(
                "Airflow is not installed here: the quota scheduler sends no metrics, and alerts go to "
                "the log and to notifiers that need no Airflow (pip install 'airflow-quota[airflow]')"
            )
        else:
            log.info("metrics are off in Airflow's [metrics] (statsd_on, otel_on): the quota scheduler sends none")
        return cls.off()

    # -- what a step did -----------------------------------------------------------------

    def decisions(self, decisions: Iterable[Decision]) -> None:
        """Counters: placements, preemptions by kind, failures by reason, alerts by kind."""
        if self.backend is None:
            return
        for decision in decisions:
            if isinstance(decision, Placed):
                self._incr("quota.placements", share=decision.share, instance_type=decision.entry.instance_type)
            elif isinstance(decision, Preempted):
                self._incr("quota.preemptions", share=decision.share, kind=decision.kind.value)
            elif isinstance(decision, Failed):
                self._incr("quota.failures", share=decision.share, reason=decision.reason.value)
            elif isinstance(decision, Alert):
                self._incr("quota.alerts", share=decision.share, kind=decision.kind.value)

    def heartbeats(self, count: int) -> None:
        """``quota.scheduler.heartbeat``: the leader's lease renewals, as Airflow's own
        ``scheduler_heartbeat``; a rate of zero means no quota scheduler leads."""
        if self.backend is not None and count > 0:
            self._send("incr", "quota.scheduler.heartbeat", count, None)

    def cycle(self, seconds: float) -> None:
        """The timer of one cycle (the core's work for one ``cycle`` input)."""
        if self.backend is not None:
            self._send("timing", "quota.cycle.duration", timedelta(seconds=seconds), None)

    def notification(self, notifier: str, sent: bool) -> None:
        """One alert sent to a notifier, or one failed try."""
        if self.backend is not None:
            self._incr("quota.notifications.sent" if sent else "quota.notifications.failed", notifier=notifier)

    def gauges(self, view: QuotaView | None, now: float) -> None:
        """Per share and instance type of the leader's view, at most every ``gauge_seconds``:
        limit, used, borrowed, lent, RUNNABLE count and oldest pending age (at ``now``). A pair
        shown before and gone now (its limit removed, nothing left running or waiting) is sent
        once more as zeros, so a dashboard does not keep its last value."""
        if self.backend is None or view is None or now - self._last_gauges < self.gauge_seconds:
            return
        self._last_gauges = now
        shown: set[tuple[str, str]] = set()
        for share in sorted(view.shares, key=lambda s: s.share):
            for t in share.types:
                shown.add((share.share, t.instance_type))
                values = {
                    "limit": t.limit,
                    "used": t.used,
                    "borrowed": t.borrowed,
                    "lent": t.lent,
                    "runnable": t.runnable,
                    "oldest_pending_seconds": t.oldest_pending_seconds(now),
                }
                for gauge in GAUGES:
                    self._gauge(gauge, float(values[gauge]), share.share, t.instance_type)
        for share_name, instance_type in sorted(self._gauged - shown):
            for gauge in GAUGES:
                self._gauge(gauge, 0.0, share_name, instance_type)
        self._gauged = shown

    # -- names ---------------------------------------------------------------------------

    def name(self, base: str, tags: dict[str, str]) -> str:
        """The name a metric goes by: ``base`` when tags are kept, else with the tag values
        (in the order given) as name segments. Gauges put theirs before the gauge's name."""
        if self.tagged or not tags:
            return base
        values = ".".join(segment(v) for v in tags.values())
        if base.startswith("quota.share."):
            return f"quota.share.{values}.{base.removeprefix('quota.share.')}"
        return f"{base}.{values}"

    def _gauge(self, gauge: str, value: float, share: str, instance_type: str) -> None:
        tags = {"share": share, "instance_type": instance_type}
        self._send("gauge", self.name(f"quota.share.{gauge}", tags), value, tags)

    def _incr(self, base: str, **tags: str) -> None:
        self._send("incr", self.name(base, tags), 1, tags)

    def _send(self, call: str, stat: str, value: Any, tags: dict[str, str] | None) -> None:
        """One metric; a failing backend is logged once (until it works again), never raised:
        metrics must not stop the scheduler."""
        try:
            getattr(self.backend, call)(stat, value, tags=tags)
        except Exception as exc:
            if not self._failing:
                log.warning(
                    "could not send metric %s: %s: %s (logged once until it works again)", stat, type(exc).__name__, exc
                )
            self._failing = True
            return
        self._failing = False
