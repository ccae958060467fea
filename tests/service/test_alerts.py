"""Alerts through notifiers (issue 5): a starving job raises exactly one STARVING alert, sent
once to each configured notifier after the cycle that raised it has committed; not again after
a restart of the quota scheduler; retried a bounded number of times when a notifier fails; never
twice even when the scheduler dies while sending; and a notifier that cannot be built is a clear
error naming ``alerts.notifiers[i]`` and the rule.

The notifiers are Airflow ``BaseNotifier`` classes from ``tests/service/alert_notifiers.py``,
named by import path in the configuration as a user names the amazon provider's SnsNotifier.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("airflow.sdk")

from sqlalchemy import Engine

from airflow_quota.core.config import parse_config
from airflow_quota.core.model import JobRequest
from airflow_quota.exceptions import InvalidInput
from airflow_quota.notifications.loader import check_notifiers
from airflow_quota.service.backends.fake import FakeBackend
from airflow_quota.service.clock import ManualClock
from airflow_quota.service.scheduler import QuotaService
from airflow_quota.store.models import AlertRow
from airflow_quota.store.repository import QuotaStore
from tests.conftest import cli
from tests.service import alert_notifiers
from tests.service.alert_notifiers import calls, sent

HELPERS = "tests.service.alert_notifiers"
G5 = [{"instance_type": "ml.g5.xlarge", "count": 1}]
G5_PAIR = [{"instance_type": "ml.g5.xlarge", "count": 2}]

OPS: dict[str, Any] = {
    "class": f"{HELPERS}.RecordingNotifier",
    "name": "ops",
    "kwargs": {
        "subject": "[quota] {{ alert.kind }} {{ alert.job_name }}",
        "message": "{{ alert.message }} (waiting {{ alert.age_seconds | int }} s)",
    },
}
"""Configured as one configures ``SnsNotifier``: templated subject and message."""


def quota(*notifiers: dict[str, Any]) -> dict[str, Any]:
    """Two g5 for one share; a job waiting 60 s, overtaken by a later one, starves."""
    return {
        "pool": {"capacity": {"ml.g5.xlarge": 2}},
        "shares": [{"name": "research", "capacity_limits": {"ml.g5.xlarge": 2}, "starvation_after_seconds": 60}],
        "alerts": {"notifiers": list(notifiers)},
    }


def with_kwargs(entry: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    changed = copy.deepcopy(entry)
    changed["kwargs"].update(kwargs)
    return changed


class World:
    """A quota database with ``quota`` applied, the real scheduler on a manual clock, and a job
    (``late``, 2 instances) that waits behind ``hog`` from t=1001 while ``small``, submitted after
    it, is placed beside ``hog`` (an overtaking): it starves at t=1061."""

    def __init__(self, engine: Engine, config: dict[str, Any], **service: Any) -> None:
        self.engine = engine
        self.clock = ManualClock(1000.0)
        self.store = QuotaStore(engine, self.clock.now)
        self.store.apply_config(config)
        self.fake = FakeBackend(self.clock.now)
        self.options = service
        self.service = self.restart(recover=False)
        self.store.submit(JobRequest(name="hog", share="research", preferences=G5), "fake", {"duration": 1000})
        self.step(1000)
        self.late = self.store.submit(JobRequest(name="late", share="research", preferences=G5_PAIR), "fake", {})
        self.store.submit(JobRequest(name="small", share="research", preferences=G5), "fake", {"duration": 10})
        self.step(1001)

    def restart(self, recover: bool = True) -> QuotaService:
        """A new quota scheduler on the same database (what a restart or a new leader is)."""
        self.service = QuotaService(self.engine, {"fake": self.fake}, clock=self.clock, **self.options)
        if recover:
            self.service.recover()
        return self.service

    def step(self, at: float) -> None:
        self.clock.advance_to(at)
        self.service.step()

    def alerts(self) -> list[AlertRow]:
        return self.store.alerts()


@pytest.fixture(autouse=True)
def _fresh_notifiers(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    alert_notifiers.reset()
    caplog.set_level(logging.INFO, logger="airflow_quota")
    yield
    alert_notifiers.reset()


def lines(caplog: pytest.LogCaptureFixture, needle: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "airflow_quota.alerts" and needle in r.getMessage()]


def test_a_starving_job_raises_one_alert_sent_once_through_the_notifier(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    world = World(engine, quota(OPS))
    world.step(1030)
    assert sent == []
    world.step(1061)
    job = world.late.id
    assert sent == [
        {
            "key": "ops",
            "subject": "[quota] STARVING late",
            "message": f"quota alert STARVING: job {job} (late) in share research: RUNNABLE for 60 s, "
            "past its threshold of 60 s (starvation_after_seconds); overtaken by 1 later placement, "
            "latest small (research), position 1 in its share (waiting 60 s)",
            "alert": {
                "id": 1,
                "kind": "STARVING",
                "job_id": job,
                "job_name": "late",
                "share": "research",
                "reason": "RUNNABLE for 60 s, past its threshold of 60 s (starvation_after_seconds); "
                "overtaken by 1 later placement, latest small (research)",
                "age_seconds": 60.0,
                "position": 1,
                "at": "1970-01-01T00:17:41+00:00",
                "timestamp": 1061.0,
                "message": f"quota alert STARVING: job {job} (late) in share research: RUNNABLE for 60 s, "
                "past its threshold of 60 s (starvation_after_seconds); overtaken by 1 later placement, "
                "latest small (research), position 1 in its share",
                "dag_id": None,
                "task_id": None,
                "run_id": None,
            },
        }
    ]
    assert lines(caplog, "sent to") == [f"alert 1 STARVING for job {job} (late) [research]: sent to ops"]
    for at in (1062, 1200, 1500):
        world.step(at)
    world.restart()
    world.step(1600)
    assert len(sent) == 1 and calls == ["ops"]
    [alert] = world.alerts()
    assert (alert.kind, alert.notified, alert.notified_at) == ("STARVING", True, 1061)
    assert alert.deliveries == {"ops": {"state": "SENT", "attempts": 1, "next_at": None, "error": None, "at": 1061}}


def test_a_failing_notifier_is_retried_with_back_off_and_delivers_once(
    sqlite_engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    world = World(sqlite_engine, quota(with_kwargs(OPS, fail_first=2)))
    world.step(1061)  # first try fails; the next is due 5 s later
    world.step(1064)  # not yet
    world.step(1066)  # second try fails; the next is due 10 s later
    world.restart()  # retries survive a restart
    world.step(1070)
    world.step(1076)
    assert calls == ["ops", "ops", "ops"] and len(sent) == 1
    job = world.late.id
    assert lines(caplog, "failed") == [
        f"alert 1 STARVING for job {job} (late) [research]: notifier ops failed (try 1 of 5, next in 5 s): "
        "ConnectionError: the topic is unreachable",
        f"alert 1 STARVING for job {job} (late) [research]: notifier ops failed (try 2 of 5, next in 10 s): "
        "ConnectionError: the topic is unreachable",
    ]
    [alert] = world.alerts()
    assert alert.notified and alert.deliveries is not None and alert.deliveries["ops"]["attempts"] == 3


def test_a_notifier_that_keeps_failing_is_given_up_and_the_scheduler_goes_on(
    sqlite_engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    world = World(sqlite_engine, quota(with_kwargs(OPS, fail_first=99)), alert_attempts=2, alert_retry_seconds=1)
    for at in (1061, 1062, 1063, 1100):
        world.step(at)
    assert calls == ["ops", "ops"] and sent == []
    assert lines(caplog, "giving up") == [
        f"alert 1 STARVING for job {world.late.id} (late) [research]: notifier ops failed 2 times, giving up: "
        "ConnectionError: the topic is unreachable"
    ]
    [alert] = world.alerts()
    assert (alert.notified, alert.notified_at, alert.deliveries and alert.deliveries["ops"]["state"]) == (
        False,
        1062,
        "GAVE_UP",
    )
    world.step(2000)  # hog is done: the starving job is placed all the same
    assert world.store.job(world.late.id).state in ("SCHEDULED", "RUNNING")  # type: ignore[union-attr]


def test_a_scheduler_that_dies_while_sending_never_sends_it_again(
    sqlite_engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    world = World(sqlite_engine, quota({"class": f"{HELPERS}.DyingNotifier", "name": "pager"}))
    with pytest.raises(KeyboardInterrupt):
        world.step(1061)  # the alert is committed and claimed, then the process "dies"
    world.restart()
    world.step(1062)
    world.step(1100)
    assert calls == ["dying"]
    [alert] = world.alerts()
    assert alert.deliveries is not None and alert.deliveries["pager"]["state"] == "UNKNOWN"
    assert (alert.notified, alert.notified_at) == (False, 1062)
    assert lines(caplog, "stopped while sending") == [
        f"alert 1 STARVING for job {world.late.id} (late) [research]: the scheduler stopped while sending it to "
        "pager; it may or may not have arrived, and is not sent again (at most once)"
    ]


def test_each_notifier_gets_the_kinds_it_takes_and_async_notifiers_work(sqlite_engine: Engine) -> None:
    pager = {**with_kwargs(OPS, key="pager"), "name": "pager", "kinds": ["GUARANTEE_VIOLATED"]}
    chat = {"class": f"{HELPERS}.AsyncOnlyNotifier", "kwargs": {"message": "{{ alert.kind }}: {{ alert.job_name }}"}}
    world = World(sqlite_engine, quota(OPS, pager, chat))
    world.step(1061)
    world.step(1100)
    assert sorted(calls) == ["async", "ops"]
    assert [s["message"] for s in sent if s["key"] == "async"] == ["STARVING: late"]
    [alert] = world.alerts()
    assert alert.notified and set(alert.deliveries or {}) == {"ops", "AsyncOnlyNotifier"}


def test_without_notifiers_alerts_go_to_the_log(sqlite_engine: Engine, caplog: pytest.LogCaptureFixture) -> None:
    world = World(sqlite_engine, quota())
    world.step(1061)
    job = world.late.id
    assert lines(caplog, "quota alert") == [
        f"quota alert STARVING: job {job} (late) in share research: RUNNABLE for 60 s, "
        "past its threshold of 60 s (starvation_after_seconds); overtaken by 1 later placement, "
        "latest small (research), position 1 in its share"
    ]
    assert [r.levelname for r in caplog.records if r.getMessage().startswith("quota alert")] == ["WARNING"]


def test_the_readme_sns_example_publishes_through_the_amazon_provider(
    sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The amazon provider's own ``SnsNotifier``, configured as the README shows, against moto:
    the topic's subscriber gets one message per alert, rendered for that alert."""
    pytest.importorskip("airflow.providers.amazon.aws.notifications.sns")
    moto = pytest.importorskip("moto")
    import boto3

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "test")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with moto.mock_aws():
        sns, sqs = boto3.client("sns"), boto3.client("sqs")
        topic = sns.create_topic(Name="quota-alerts")["TopicArn"]
        queue = sqs.create_queue(QueueName="ops")["QueueUrl"]
        queue_arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn)
        example = {
            "class": "airflow.providers.amazon.aws.notifications.sns.SnsNotifier",
            "name": "ops-sns",
            "kwargs": {
                "aws_conn_id": None,
                "region_name": "us-east-1",
                "target_arn": topic,
                "subject": "[quota] {{ alert.kind }}: {{ alert.job_name }} in {{ alert.share }}",
                "message": "{{ alert.message }}",
            },
        }
        world = World(sqlite_engine, quota(example))
        world.step(1061)
        world.step(1100)
        messages = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, WaitTimeSeconds=0).get("Messages", [])
    published = [json.loads(m["Body"]) for m in messages]
    assert [(m["Subject"], m["Message"]) for m in published] == [
        (
            "[quota] STARVING: late in research",
            f"quota alert STARVING: job {world.late.id} (late) in share research: RUNNABLE for 60 s, "
            "past its threshold of 60 s (starvation_after_seconds); overtaken by 1 later placement, "
            "latest small (research), position 1 in its share",
        )
    ]


# -- bad configuration -----------------------------------------------------------------------

BAD = [
    pytest.param(
        {"class": "SnsNotifier"},
        "alerts.notifiers[0].class",
        "'SnsNotifier' is not an import path: module.Class, e.g. "
        "airflow.providers.amazon.aws.notifications.sns.SnsNotifier",
        id="not an import path",
    ),
    pytest.param(
        {"class": f"{HELPERS}.Missing"},
        "alerts.notifiers[0].class",
        f"module '{HELPERS}' has no attribute 'Missing'",
        id="no such class",
    ),
    pytest.param(
        {"class": "airflow_quota.no_such_module.Notifier"},
        "alerts.notifiers[0].class",
        "cannot import module 'airflow_quota.no_such_module': No module named 'airflow_quota.no_such_module'",
        id="no such module in an installed package",
    ),
    pytest.param(
        {"class": f"{HELPERS}.NotANotifier"},
        "alerts.notifiers[0].class",
        f"{HELPERS}.NotANotifier is not a notifier: it must subclass airflow.sdk.BaseNotifier or "
        "airflow_quota.notifications.QuotaNotifier",
        id="not a BaseNotifier",
    ),
    pytest.param(
        {"class": f"{HELPERS}.RecordingNotifier", "kwargs": {"subject": "s"}},
        "alerts.notifiers[0].kwargs",
        "RecordingNotifier refuses these arguments: TypeError: RecordingNotifier.__init__() missing 1 required "
        "keyword-only argument: 'message'",
        id="bad arguments",
    ),
    pytest.param(
        {"class": f"{HELPERS}.RecordingNotifier", "kwargs": {"subject": "{{ alert.kind", "message": "m"}},
        "alerts.notifiers[0].kwargs.subject",
        "not a valid template: unexpected end of template, expected 'end of print statement'. (line 1)",
        id="bad template",
    ),
]


def _problems(raw: dict[str, Any]) -> list[str]:
    try:
        check_notifiers(parse_config(raw))
    except InvalidInput as exc:
        return [str(p) for p in exc.problems]
    return []


@pytest.mark.parametrize(("entry", "path", "message"), BAD)
def test_a_notifier_that_cannot_be_built_is_a_clear_error(entry: dict[str, Any], path: str, message: str) -> None:
    assert _problems(quota(entry, OPS)) == [f"{path}: {message}"]


def test_a_provider_not_installed_here_is_left_to_the_scheduler_host() -> None:
    entry = {"class": "airflow.providers.not_installed.notifications.Notifier"}
    assert _problems(quota(entry)) == []


def test_apply_refuses_a_bad_notifier_and_stores_nothing(sqlite_engine: Engine) -> None:
    store = QuotaStore(sqlite_engine)
    with pytest.raises(InvalidInput, match=r"alerts\.notifiers\[0\]\.class: .* is not a notifier"):
        store.apply_config(quota({"class": f"{HELPERS}.NotANotifier"}))
    assert store.latest_config() is None


def test_validate_exits_2_naming_the_notifier(tmp_path: Path) -> None:
    path = tmp_path / "quota.yaml"
    path.write_text(yaml.safe_dump(quota({"class": f"{HELPERS}.NotANotifier"})))
    run = cli("validate", str(path), cwd=Path(__file__).resolve().parents[2])
    assert run.code == 2 and run.stdout == "" and "Traceback" not in run.stderr
    # the file named once, the problem under it (Airflow may log as it loads)
    problems = [line for line in run.stderr.splitlines() if line.startswith((f"{path}:", "  alerts."))]
    assert problems == [
        f"{path}:",
        f"  alerts.notifiers[0].class: {HELPERS}.NotANotifier is not a notifier: it must subclass "
        "airflow.sdk.BaseNotifier or airflow_quota.notifications.QuotaNotifier",
    ]


def test_the_scheduler_logs_a_notifier_it_cannot_build_and_falls_back_to_the_log(
    sqlite_engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    # apply cannot know (that provider is not installed here); the scheduler can
    missing = {"class": "airflow.providers.not_installed.notifications.Notifier", "name": "chat"}
    world = World(sqlite_engine, quota(missing))
    world.step(1061)
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors == [
        "alerts.notifiers[0].class: cannot import module 'airflow.providers.not_installed.notifications': "
        "No module named 'airflow.providers.not_installed': this notifier gets no alerts until the "
        "configuration is fixed"
    ]
    assert len(lines(caplog, "quota alert STARVING")) == 1
    [alert] = world.alerts()
    assert alert.notified and set(alert.deliveries or {}) == {"log"}


@pytest.fixture
def sqlite_engine(sqlite_url: str) -> Iterator[Engine]:
    from airflow_quota.store.engine import make_engine, migrate

    engine = make_engine(sqlite_url)
    migrate(engine)
    yield engine
    engine.dispose()
