"""Notifiers for the alert tests, importable by path as ``alerts.notifiers`` names them.

Each records what it was sent in ``sent`` (its rendered fields and the alert's context) and
every call in ``calls``; ``fail_first`` makes a notifier raise on its first calls (counted per
notifier ``key`` across instances, since the quota scheduler builds a fresh one per alert).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseNotifier

sent: list[dict[str, Any]] = []
calls: list[str] = []
_FAILED: dict[str, int] = {}


def reset() -> None:
    sent.clear()
    calls.clear()
    _FAILED.clear()


class RecordingNotifier(BaseNotifier):
    """Like the amazon provider's ``SnsNotifier``: keyword-only arguments, templated subject
    and message, one "publish" per alert."""

    template_fields: Sequence[str] = ("subject", "message")

    def __init__(self, *, subject: str, message: str, key: str = "ops", fail_first: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.subject = subject
        self.message = message
        self.key = key
        self.fail_first = fail_first

    def notify(self, context: Any) -> None:
        calls.append(self.key)
        if _FAILED.get(self.key, 0) < self.fail_first:
            _FAILED[self.key] = _FAILED.get(self.key, 0) + 1
            raise ConnectionError("the topic is unreachable")
        sent.append({"key": self.key, "subject": self.subject, "message": self.message, "alert": context["alert"]})


class AsyncOnlyNotifier(BaseNotifier):
    """Implements only ``async_notify``, as triggerer-first notifiers do."""

    template_fields: Sequence[str] = ("message",)

    def __init__(self, *, message: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.message = message

    async def async_notify(self, context: Any) -> None:
        calls.append("async")
        sent.append({"key": "async", "message": self.message, "alert": context["alert"]})


class DyingNotifier(BaseNotifier):
    """The quota scheduler process dies while this one sends (KeyboardInterrupt is not an
    ``Exception``: it goes through the scheduler like a SIGKILL would stop it)."""

    def notify(self, context: Any) -> None:
        calls.append("dying")
        raise KeyboardInterrupt


class NotANotifier:
    """A class that is no notifier."""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
