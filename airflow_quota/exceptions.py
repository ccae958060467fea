"""The errors airflow-quota raises.

::

    QuotaError                      anything airflow-quota refuses
    ├── InvalidInput                input that breaks a rule: YAML, configuration, scenario, job fields.
    │                               Carries every problem as (path, message); the CLI prints them
    │                               as ``path: message`` lines and exits with status 2.
    ├── Refused                     a well-formed request the quota state refuses now
    │   ├── SubmissionRejected      a submission (disabled share, a count no entry can ever get, ...)
    │   └── ChangeRefused           a priority change above the share's max_priority, a change to a
    │                               finished job
    └── DatabaseUnavailable         the quota database cannot be reached (one line naming it)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Problem:
    """One broken rule: where (a dotted path such as ``shares[1].borrow_limit``) and what."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class QuotaError(Exception):
    """Base of every error airflow-quota raises on purpose."""


class InvalidInput(QuotaError):
    """Input that breaks one or more rules; every problem is kept, not only the first."""

    def __init__(self, problems: Iterable[Problem]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))

    @classmethod
    def single(cls, path: str, message: str) -> InvalidInput:
        return cls([Problem(path, message)])

    def prefixed(self, prefix: str) -> InvalidInput:
        """The same problems with their paths placed under ``prefix``."""
        return InvalidInput(Problem(join_path(prefix, p.path), p.message) for p in self.problems)


class Refused(QuotaError):
    """A well-formed request that the quota state refuses; nothing changes."""


class SubmissionRejected(Refused):
    """A submission the quota state refuses: nothing is stored."""


class ChangeRefused(Refused):
    """A change to a job (priority, cancel) the quota state refuses: nothing changes."""


class DatabaseUnavailable(QuotaError):
    """The quota database cannot be reached; the message is one line naming it."""


def join_path(prefix: str, path: str) -> str:
    """Join two error paths: ``join_path("events[2]", "submit.count")``."""
    if not prefix:
        return path
    if not path:
        return prefix
    return prefix + path if path.startswith("[") else f"{prefix}.{path}"
