"""The errors airflow-quota raises.

::

    QuotaError                      anything airflow-quota refuses
    ├── InvalidInput                input that breaks a rule: YAML, configuration, scenario, job fields.
    │                               Carries every problem as (path, message), and the file they are
    │                               in when they come from one; the CLI prints them as ``path: message``
    │                               lines, under the file's name, and exits with status 2.
    ├── Refused                     a well-formed request the quota state refuses now
    │   ├── SubmissionRejected      a submission (disabled share, a count no entry can ever get, ...)
    │   │   └── SubmissionDenied    from a DAG or user the share's ``access.submit`` rule leaves out
    │   └── ChangeRefused           a priority change above the share's max_priority, a change to a
    │       │                       finished job
    │       └── PriorityChangeDenied  by a DAG or user the share's ``access.set_priority`` leaves out
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
    """Input that breaks one or more rules; every problem is kept, not only the first.

    ``file`` is the file the problems are in (``path``, or ``path:line:column`` where YAML does
    not parse), set by ``core.config.load_file``; it is shown once, ahead of the problems.
    """

    def __init__(self, problems: Iterable[Problem], file: str | None = None) -> None:
        self.problems = list(problems)
        self.file = file
        super().__init__("\n".join(self.lines()))

    @classmethod
    def single(cls, path: str, message: str) -> InvalidInput:
        return cls([Problem(path, message)])

    def lines(self) -> list[str]:
        """As printed: a ``path: message`` line per problem; in a file, ``FILE: message`` for a
        problem of the whole file, else a ``FILE:`` line and the problems indented under it."""
        shown = [str(p) for p in self.problems]
        if self.file is None:
            return shown
        if len(self.problems) == 1 and not self.problems[0].path:
            return [f"{self.file}: {self.problems[0].message}"]
        return [f"{self.file}:", *(f"  {line}" for line in shown)]

    def in_file(self, file: str) -> InvalidInput:
        """The same problems, in ``file``; problems that already name their file keep it."""
        return self if self.file is not None else InvalidInput(self.problems, file)

    def under(self, path: str) -> list[Problem]:
        """The problems as problems at ``path`` of another input (a scenario's ``quota_file``),
        each naming the file it is in: ``quota_file: quota.yaml: shares[0].name: ...``."""
        if self.file is None:
            return [Problem(join_path(path, p.path), p.message) for p in self.problems]
        return [Problem(path, f"{self.file}: {p}") for p in self.problems]


class Refused(QuotaError):
    """A well-formed request that the quota state refuses; nothing changes."""


class SubmissionRejected(Refused):
    """A submission the quota state refuses: nothing is stored."""


class SubmissionDenied(SubmissionRejected):
    """A submission from a DAG or user the share's ``access.submit`` rule does not list
    (``core.access``): nothing is stored. The message names the rule and who asked."""


class ChangeRefused(Refused):
    """A change to a job (priority, cancel) the quota state refuses: nothing changes."""


class PriorityChangeDenied(ChangeRefused):
    """A priority change by a DAG or user the share's ``access.set_priority`` rule does not
    list (``core.access``): nothing changes. The API answers it 403, not 409."""


class DatabaseUnavailable(QuotaError):
    """The quota database cannot be reached; the message is one line naming it."""


def join_path(prefix: str, path: str) -> str:
    """Join two error paths: ``join_path("events[2]", "submit.count")``."""
    if not prefix:
        return path
    if not path:
        return prefix
    return prefix + path if path.startswith("[") else f"{prefix}.{path}"
