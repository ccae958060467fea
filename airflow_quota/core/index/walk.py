"""The walk each placing step of the cycle makes (docs/model.md rules 4.2, 4.3 and 4.4): the
candidates of the step (``core/steps.py``), only the jobs that might fit now, in the step's order,
each offered once, a bucket dropped as soon as its jobs can no longer fit. The walk decides
nothing: the rules assess each candidate, and the walk is sent the verdict.

The jobs come from sorted streams of job keys, merged lazily (``MergedStreams``), each with a tag:

- ``NewJobs(share)``: the share's queued jobs that are new or changed since the last cycle,
  tried whatever their types;
- ``Bucket(share, instance_type, instances)``: the share's queued jobs with an entry asking
  that many instances of the type. A type's buckets join the walk only when something got
  easier on the type, and only those the step's bound lets fit.
- ``Waited(share, instance_type, instances)``: those of the bucket that have waited long
  enough to preempt in their share (step 4 only), beside the type's buckets.

What differs from step to step is a ``WalkPolicy``: the order, the bound, what to keep, which
entries to offer, what to remember of a verdict, and which types to look at again after a job
got capacity.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Generator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from sortedcontainers import SortedList

from airflow_quota.core.lifecycle import queued
from airflow_quota.core.model import Job
from airflow_quota.core.queues import JobKey, MergedStreams
from airflow_quota.core.rules import Candidate, Verdict, Wait
from airflow_quota.core.state import QuotaState


class NewJobs(NamedTuple):
    """The tag of a stream of a share's new or changed queued jobs."""

    share: str


class Bucket(NamedTuple):
    """The tag of a stream of a share's queued jobs with an entry asking ``instances`` of
    ``instance_type``."""

    share: str
    instance_type: str
    instances: int
    """How many instances of the type each job of the bucket asks for."""


@dataclass(frozen=True, slots=True)
class Waited:
    """The tag of a stream of a share's queued jobs with an entry asking ``instances`` of
    ``instance_type`` that have waited ``in_share_preemption_after_seconds``. Not a tuple: it
    has a ``Bucket``'s fields, and the two must never compare equal as tags of one walk."""

    share: str
    instance_type: str
    instances: int


class WalkPolicy(ABC):
    """What one step's walk does differently: the order, the bound, what to keep, which entries
    to offer, and what to remember of each verdict."""

    shares: Sequence[str]
    """The shares whose buckets the walk merges."""
    seen: set[int]
    """Jobs already offered (or not to be offered) in this walk."""

    def order(self, key: JobKey) -> Any:
        """The walk's order; it must grow with the keys of every stream. Queue order by default."""
        return key

    def most(self, share: str, instance_type: str) -> float:
        """The bound that depends on no job: the most instances of the type a job of ``share``
        could get now. Only buckets asking no more join the walk; computed once per share and
        type, not once per bucket. Unbounded by default."""
        return float("inf")

    def admits(self, bucket: Bucket, first: JobKey) -> bool:
        """The rest of the bound: whether the bucket, whose first job is ``first`` and whose
        count is within ``most``, may fit now. A bucket joins the walk only then."""
        return True

    @abstractmethod
    def keeps(self, bucket: Bucket, job: Job) -> bool:
        """Whether ``job``, next in the bucket, and every job after it may still fit:
        otherwise the bucket is dropped until something gets easier on its type."""

    def keeps_after(self, bucket: Bucket, verdict: Wait) -> bool:
        """Whether the bucket stays in the walk after its job got ``verdict``: not when the
        block the job met on the bucket's entry holds for every later job of the bucket too.
        Kept by default."""
        return True

    def waited(self, share: str, instance_type: str) -> Iterable[tuple[int, SortedList]]:
        """(count, keys) of jobs of ``share`` asking that count of the type, to walk beside its
        buckets, tagged ``Waited``, once ``most`` has been asked for the type. Nothing by default."""
        return ()

    def keeps_waited(self, tag: Waited, job: Job) -> bool:
        """Whether ``job``, next in the ``Waited`` stream, and every job after it may still
        succeed on the tag's entry; otherwise the stream is dropped."""
        return True

    def offer(self, job: Job) -> Candidate | None:
        """The job as a candidate of the step, or None when none of its entries can succeed
        now. Every entry by default."""
        return Candidate(job)

    def saw(self, candidate: Candidate, verdict: Verdict) -> None:
        """Remember what the verdict, now applied, says of later candidates. Nothing by default."""
        return None

    @abstractmethod
    def look_again(self) -> Iterable[str]:
        """After a job got capacity: the types whose buckets may fit now, walked from that job on."""

    def exhausted(self) -> bool:
        """After a job got capacity: whether no later job can get any in this walk, which then
        ends. Never by default."""
        return False


def walk(
    state: QuotaState, policy: WalkPolicy, new_jobs: Iterable[tuple[str, SortedList]], types: Iterable[str]
) -> Generator[Candidate, Verdict, bool]:
    """Offer, in the policy's order, the ``new_jobs`` (share, keys) and the jobs of the buckets
    of ``types`` the policy admits, each job once; drop a bucket once the policy does not keep
    it. Returns True when the walk ended because the policy was ``exhausted``."""
    jobs = state.jobs
    streams = MergedStreams(policy.order)
    streams.seen = policy.seen
    for share, keys in new_jobs:
        streams.add(keys, NewJobs(share))
    for instance_type in types:
        _add_buckets(state, policy, streams, instance_type, None)
    while (item := streams.pop()) is not None:
        key, tag, position = item
        job = jobs[key[2]]
        if type(tag) is Bucket:
            if not policy.keeps(tag, job):
                streams.drop(tag)
                continue
        elif type(tag) is Waited and not policy.keeps_waited(tag, job):
            streams.drop(tag)
            continue
        streams.seen.add(job.seq)
        if not queued(job) or (candidate := policy.offer(job)) is None:
            continue
        verdict = yield candidate
        policy.saw(candidate, verdict)
        if isinstance(verdict, Wait):
            if type(tag) is Bucket and not policy.keeps_after(tag, verdict):
                streams.drop(tag)
            continue
        if policy.exhausted():
            return True
        for instance_type in policy.look_again():
            _add_buckets(state, policy, streams, instance_type, position)
    return False


def _add_buckets(state: QuotaState, policy: WalkPolicy, streams: MergedStreams, instance_type: str, after: Any) -> None:
    """Merge in the buckets of the type that the policy admits, and its ``Waited`` stream if it
    has one, from ``after`` on if given."""
    queues = state.queues
    for share in policy.shares:
        queue = queues[share]
        counts = queue.counts.get(instance_type)
        if not counts:
            continue
        most = policy.most(share, instance_type)
        for count in counts:
            if count <= most:
                keys = queue.buckets[(instance_type, count)]
                bucket = Bucket(share, instance_type, count)
                if policy.admits(bucket, keys[0]):
                    streams.add(keys, bucket, after)
        for count, keys in policy.waited(share, instance_type):
            streams.add(keys, Waited(share, instance_type, count), after)
