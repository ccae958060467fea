"""Build the notifiers of ``alerts.notifiers``: import each class, check that it is a notifier,
instantiate it with its arguments, and wrap it so that the quota scheduler can send an alert.

The configuration's shape is checked when it is parsed (``core.config.NotifierEntry``); what
needs imports is checked here, each problem naming its entry and the rule:

- ``alerts.notifiers[i].class``: the module cannot be imported, has no such attribute, the
  attribute is not a class, or the class is neither an Airflow ``BaseNotifier`` nor a
  ``QuotaNotifier``, or it implements neither ``notify`` nor ``async_notify``;
- ``alerts.notifiers[i].kwargs``: the class refuses the arguments (its ``__init__`` raised);
- ``alerts.notifiers[i].kwargs.<field>``: a templated field is not a valid Jinja template.

The quota scheduler builds what it can and logs the rest (``build_notifiers``);
``airflow-quota validate`` and ``apply`` refuse a configuration with a problem they can see
(``check_notifiers``), skipping only classes whose package is not installed where they run.
"""

from __future__ import annotations

import asyncio
import copy
import importlib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from airflow_quota.core.config import AlertsConfig, NotifierEntry, QuotaConfig
from airflow_quota.exceptions import InvalidInput, Problem
from airflow_quota.notifications.base import QuotaNotifier, airflow_base_notifier, keeping_logging
from airflow_quota.notifications.log import QuotaLogNotifier

LOG_NOTIFIER = f"{QuotaLogNotifier.__module__}.{QuotaLogNotifier.__qualname__}"


@dataclass(frozen=True)
class Notifier:
    """A notifier ready to send: its name (the key of its delivery records), where it was
    configured, the alert kinds it takes (None: all), and how to send one alert."""

    name: str
    where: str
    class_path: str
    kinds: frozenset[str] | None
    sender: Callable[[dict[str, Any]], None]

    def accepts(self, kind: str) -> bool:
        return self.kinds is None or kind in self.kinds

    def send(self, context: Mapping[str, Any]) -> None:
        """Send one alert; raises whatever the notifier raised. The notifier gets its own copy
        of the context (a ``BaseNotifier`` merges its fields into it)."""
        self.sender(copy.deepcopy(dict(context)))


class _NotInstalledHere(Exception):
    """The entry's package is not installed in this process (another host may have it)."""


def default_notifiers() -> list[Notifier]:
    """What alerts go to when ``alerts.notifiers`` is empty: the log."""
    notifier = QuotaLogNotifier()
    return [Notifier("log", "default", LOG_NOTIFIER, None, notifier)]


def build_notifiers(alerts: AlertsConfig) -> tuple[list[Notifier], list[Problem]]:
    """Every configured notifier that can be built, and the problems of those that cannot.
    No notifier configured, or none buildable, gives the log notifier: alerts always go
    somewhere a person can read them."""
    if not alerts.notifiers:
        return default_notifiers(), []
    built: list[Notifier] = []
    problems: list[Problem] = []
    for i, (entry, name) in enumerate(zip(alerts.notifiers, alerts.notifier_names(), strict=True)):
        try:
            built.append(load_notifier(entry, i, name))
        except InvalidInput as exc:
            problems.extend(exc.problems)
    return (built or default_notifiers()), problems


def check_notifiers(config: QuotaConfig) -> list[Problem]:
    """Raise ``InvalidInput`` with every notifier problem that can be known in this process
    (for ``validate`` and ``apply``). An entry whose package is not installed here is not
    refused: the quota scheduler's host may have it, and checks it when it takes the
    configuration in; it is returned as a warning (``alerts.notifiers[i].class: ...``) for
    the command to show, since a missing package is more often a typo or a forgotten
    install than a different host."""
    problems: list[Problem] = []
    warnings: list[Problem] = []
    names = config.alerts.notifier_names()
    for i, entry in enumerate(config.alerts.notifiers):
        try:
            load_notifier(entry, i, names[i], installed_only=True)
        except InvalidInput as exc:
            problems.extend(exc.problems)
        except _NotInstalledHere as exc:
            warnings.append(
                Problem(
                    f"alerts.notifiers[{i}].class",
                    f"cannot import {entry.class_path}: {exc.args[1]!r} is not installed here; "
                    "the quota scheduler's host must have it, or its alerts go to the log",
                )
            )
    if problems:
        raise InvalidInput(problems)
    return warnings


def load_notifier(entry: NotifierEntry, index: int, name: str, installed_only: bool = False) -> Notifier:
    """Import, check and instantiate one entry; ``InvalidInput`` names the entry and the rule."""
    where = f"alerts.notifiers[{index}]"
    cls = _import_class(entry.class_path, f"{where}.class", installed_only)
    kinds = frozenset(entry.kinds) if entry.kinds else None
    if issubclass(cls, QuotaNotifier):
        instance = _instantiate(cls, entry.kwargs, where)
        return Notifier(name, where, entry.class_path, kinds, instance)
    base = airflow_base_notifier()
    if base is None or not issubclass(cls, base):
        rule = "airflow.sdk.BaseNotifier" + (" (Airflow is not installed here)" if base is None else "")
        raise InvalidInput.single(
            f"{where}.class",
            f"{entry.class_path} is not a notifier: it must subclass {rule} or "
            "airflow_quota.notifications.QuotaNotifier",
        )
    sync = cls.notify is not base.notify  # type: ignore[attr-defined]
    if not sync and cls.async_notify is base.async_notify:  # type: ignore[attr-defined]
        raise InvalidInput.single(f"{where}.class", f"{entry.class_path} implements neither notify nor async_notify")
    instance = _instantiate(cls, entry.kwargs, where)
    _check_templates(instance, where)
    return Notifier(name, where, entry.class_path, kinds, _airflow_sender(cls, entry.kwargs, sync))


def _import_class(path: str, where: str, installed_only: bool) -> type:
    module_name, _, attribute = path.rpartition(".")
    try:
        with keeping_logging():
            module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if installed_only and _not_installed(exc.name or "", module_name):
            raise _NotInstalledHere(path, exc.name) from None
        raise InvalidInput.single(where, f"cannot import module {module_name!r}: {exc}") from None
    except Exception as exc:  # a module that fails while importing: its error, in one line
        message = f"importing module {module_name!r} failed: {type(exc).__name__}: {exc}"
        raise InvalidInput.single(where, message) from None
    found = getattr(module, attribute, None)
    if found is None:
        raise InvalidInput.single(where, f"module {module_name!r} has no attribute {attribute!r}")
    if not inspect.isclass(found):
        raise InvalidInput.single(where, f"{path} is not a class (a notifier class is expected)")
    return found


def _not_installed(missing: str, module_name: str) -> bool:
    """Whether a failed import means "that distribution is not installed here" (a top-level
    package, or an Airflow provider), not a wrong path inside an installed package."""
    if not missing or not (module_name == missing or module_name.startswith(missing + ".")):
        return False
    return "." not in missing or missing.startswith("airflow.providers.")


def _instantiate(cls: type, kwargs: Mapping[str, Any], where: str) -> Any:
    try:
        return cls(**copy.deepcopy(dict(kwargs)))
    except Exception as exc:
        raise InvalidInput.single(
            f"{where}.kwargs", f"{cls.__name__} refuses these arguments: {type(exc).__name__}: {exc}"
        ) from None


def _check_templates(instance: Any, where: str) -> None:
    """Each templated field that is a string must parse as a Jinja template (rendering comes
    later, per alert)."""
    from jinja2 import TemplateSyntaxError
    from jinja2.sandbox import SandboxedEnvironment

    env = SandboxedEnvironment()
    problems = []
    for field in getattr(instance, "template_fields", ()):
        value = getattr(instance, field, None)
        if not isinstance(value, str):
            continue
        try:
            env.parse(value)
        except TemplateSyntaxError as exc:
            message = f"not a valid template: {exc.message} (line {exc.lineno})"
            problems.append(Problem(f"{where}.kwargs.{field}", message))
    if problems:
        raise InvalidInput(problems)


def _airflow_sender(cls: type, kwargs: Mapping[str, Any], sync: bool) -> Callable[[dict[str, Any]], None]:
    """Send through a fresh ``BaseNotifier`` each time: rendering its templated fields
    replaces them for good, so an instance serves one alert."""

    def send(context: dict[str, Any]) -> None:
        notifier = cls(**copy.deepcopy(dict(kwargs)))
        if sync:
            notifier(context)  # BaseNotifier.__call__: merge fields into the context, render, notify
            return
        notifier.context = context

        async def awaited() -> None:
            await notifier  # BaseNotifier.__await__: render, then async_notify

        asyncio.run(awaited())

    return send
