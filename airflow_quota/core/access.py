"""Who may use a share: the ``access`` rules of quota.yaml and the one check of them.

A share may list who may submit to it and who may change its jobs' priorities::

    shares:
      - name: team-a
        capacity_limits: {ml.g5.xlarge: 2}
        access:
          submit:                      # who may submit jobs to the share
            dags: ["team_a_*"]         # DAG ids
            tags: ["team-a"]           # Airflow DAG tags
            bundles: ["team-a-repo"]   # DAG bundle names
          set_priority:                # who may change the priority of the share's jobs
            users: ["alice", "ml-oncall-*"]

Each list holds glob patterns (``fnmatch``, case-sensitive: ``*``, ``?``, ``[abc]``). An actor
(``Actor``: the DAG a task runs in, with its tags and bundle, and/or a user) passes a rule when
any of its names matches any pattern of the list for that kind of name: the lists are
alternatives, not conditions that must all hold. A share without ``access``, or without one of
the two rules, is open to everyone for that action, so configurations written before these
rules keep working.

Who asks, per entry (``Actor``):

- a ``QuotaTrainingOperator`` task submits as its DAG (id, tags, bundle); a run's
  ``quota_priority`` override is a priority change by that DAG and by the user who triggered
  the run (a backfill's creator), either may be granted;
- ``QuotaHook.set_priority`` inside a task asks as the task's DAG;
- the Quotas page and API ask as the logged-in Airflow user;
- the command line asks as the operating-system user (``$USER``) and as no DAG.

The check is here and pure; the store calls it once per entry (``QuotaStore.submit`` and
``QuotaStore.set_priority``), in the transaction that would write the request, so a refused
request leaves nothing behind. Rules bind well-behaved clients: whoever holds the quota
database's credentials can write to it directly (as IAM cannot be bypassed with AWS
credentials, database credentials cannot be scoped per share here).
"""

from __future__ import annotations

import fnmatch
import getpass
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from airflow_quota.exceptions import PriorityChangeDenied, SubmissionDenied

PATTERN_MAX_LENGTH = 250
"""A pattern is at most as long as the longest name it can match (Airflow's ``ID_LEN``)."""
PATTERNS_MAX = 100
"""Patterns per list: enough for any team, few enough to check at every submission."""

Action = Literal["submit", "set_priority"]


def _printable(value: str) -> str:
    """A pattern is one line of printable text, at most ``PATTERN_MAX_LENGTH`` characters
    (never echoed when longer: it could be anything)."""
    if len(value) > PATTERN_MAX_LENGTH:
        raise ValueError(f"at most {PATTERN_MAX_LENGTH} characters (got {len(value)})")
    if not value.strip():
        raise ValueError("a pattern must not be empty or blank")
    if not value.isprintable():
        raise ValueError(f"a pattern is one line of printable characters, got {value!r}")
    return value


def _a_list(value: object) -> object:
    """A lone string where a list belongs is the likeliest slip (``dags: team_a_*``): say so."""
    if isinstance(value, str):
        raise ValueError(f"a list of glob patterns: write [{value[:40]!r}], not {value[:40]!r}")
    return value


Pattern = Annotated[str, Field(strict=True), AfterValidator(_printable)]


def _few(patterns: list[str]) -> list[str]:
    if len(patterns) > PATTERNS_MAX:
        raise ValueError(f"at most {PATTERNS_MAX} patterns (got {len(patterns)})")
    return patterns


Patterns = Annotated[list[Pattern], BeforeValidator(_a_list), AfterValidator(_few)]


@dataclass(frozen=True, slots=True)
class Actor:
    """Who makes a request: the DAG it comes from (its id, tags and bundle), the user, or
    both (a run's priority override: its DAG and who triggered the run). ``Actor()`` is
    nobody known: it passes no rule, only shares without one."""

    dag_id: str | None = None
    tags: frozenset[str] = field(default_factory=frozenset)
    bundle: str | None = None
    user: str | None = None

    @classmethod
    def of_dag(cls, dag_id: str, tags: Iterable[str] = (), bundle: str | None = None, user: str | None = None) -> Actor:
        """A request from a DAG's task (``user``: who triggered its run, when known)."""
        return cls(dag_id=dag_id, tags=frozenset(tags), bundle=bundle, user=user)

    def describe(self) -> str:
        """The actor in a refusal: ``DAG 'train' (tags 'a', 'b'; bundle 'dags-folder')``,
        ``user 'alice'``, or both."""
        parts = []
        if self.dag_id is not None:
            details = []
            if self.tags:
                details.append(f"tags {_listed(sorted(self.tags))}")
            else:
                details.append("no tags")
            if self.bundle is not None:
                details.append(f"bundle {self.bundle!r}")
            parts.append(f"DAG {self.dag_id!r} ({'; '.join(details)})")
        if self.user is not None:
            parts.append(f"user {self.user!r}")
        return " and ".join(parts) if parts else "no DAG and no known user"


def local_user() -> Actor:
    """Who a process outside Airflow's tasks asks as (the command line, a script using the
    hook): its operating-system user (``$LOGNAME``/``$USER``, else the account's name)."""
    try:
        return Actor(user=getpass.getuser())
    except (OSError, KeyError):  # no user name anywhere (a container's bare uid)
        return Actor()


class AccessRule(BaseModel):
    """Who may do one thing with a share: patterns of DAG ids, DAG tags, bundle names and user
    names, any one match enough. At least one list must be given: to close a share to
    submissions, set its ``state`` to ``DISABLED``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dags: Patterns = Field(default_factory=list)
    tags: Patterns = Field(default_factory=list)
    bundles: Patterns = Field(default_factory=list)
    users: Patterns = Field(default_factory=list)

    @model_validator(mode="after")
    def _names_someone(self) -> AccessRule:
        if not (self.dags or self.tags or self.bundles or self.users):
            raise ValueError(
                "list at least one pattern in dags, tags, bundles or users "
                "(leave the rule out to allow everyone; set the share's state to DISABLED to allow nobody)"
            )
        return self

    def allows(self, actor: Actor) -> bool:
        """Whether any of the actor's names matches a pattern of its kind."""
        return (
            _any_match([actor.dag_id], self.dags)
            or _any_match(actor.tags, self.tags)
            or _any_match([actor.bundle], self.bundles)
            or _any_match([actor.user], self.users)
        )

    def describe(self) -> str:
        """The rule in a refusal: ``DAGs 'team_a_*', DAGs tagged 'team-a' or users 'alice'``."""
        parts = [
            f"{label} {_listed(patterns)}"
            for label, patterns in (
                ("DAGs", self.dags),
                ("DAGs tagged", self.tags),
                ("DAGs of bundles", self.bundles),
                ("users", self.users),
            )
            if patterns
        ]
        return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " or " + parts[-1]


class ShareAccess(BaseModel):
    """A share's ``access``: who may submit, who may change priorities; a rule left out
    allows everyone."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    submit: AccessRule | None = None
    set_priority: AccessRule | None = None


_RULE_SAYS = {
    "submit": "share {share!r} takes submissions only from {rule}",
    "set_priority": "share {share!r} lets only {rule} change its jobs' priorities",
}


def access_refusal(share: str, access: ShareAccess | None, action: Action, actor: Actor) -> str | None:
    """Why ``actor`` may not ``action`` in ``share`` (the rule and who asked), or None when
    it may: no rule for the action, or the actor matches it."""
    rule = None if access is None else getattr(access, action)
    if rule is None or rule.allows(actor):
        return None
    says = _RULE_SAYS[action].format(share=share, rule=rule.describe())
    return f"access.{action}: {says}; asked by {actor.describe()}: no pattern matches"


def check_submit_access(share: str, access: ShareAccess | None, actor: Actor) -> None:
    """Raise ``SubmissionDenied`` naming the share's rule unless ``actor`` may submit to it."""
    refusal = access_refusal(share, access, "submit", actor)
    if refusal is not None:
        raise SubmissionDenied(refusal)


def check_priority_access(share: str, access: ShareAccess | None, actor: Actor) -> None:
    """Raise ``PriorityChangeDenied`` naming the share's rule unless ``actor`` may change the
    priority of the share's jobs."""
    refusal = access_refusal(share, access, "set_priority", actor)
    if refusal is not None:
        raise PriorityChangeDenied(refusal)


def _any_match(names: Iterable[str | None], patterns: list[str]) -> bool:
    return any(name is not None and fnmatch.fnmatchcase(name, p) for name in names for p in patterns)


def _listed(values: list[str]) -> str:
    return ", ".join(repr(v) for v in values)
