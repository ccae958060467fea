"""Per-share indexes of jobs, kept up to date on every state change so that a cycle only looks
at jobs that might now fit (never rescans a queue of jobs that cannot).

Every index is a SortedList of job keys; a key ends in the job's ``seq``, so keys are unique.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from sortedcontainers import SortedList

from airflow_quota.core.model import Entry, Job

JobKey = tuple[int, float, int]
"""(−priority, first submission, seq): the order inside a share (docs/model.md rule 4.0.2)."""

BorrowingPlace = tuple[float, int, JobKey]
"""((first submission, seq) of the latest job among a job and those ahead of it in its share's
queue, the job's key): a job's place in the borrowing order."""


def borrowing_place(levels: dict[int, tuple[float, int]], key: JobKey) -> BorrowingPlace:
    """Where the RUNNABLE job of ``key`` stands in the borrowing order of step 3 (FIFO of first
    submission across shares, a job considered only after the jobs ahead of it in its own
    share): at the latest first submission among it and the jobs of higher priority in its share,
    given its share's ``ShareQueue.priority_levels``. The same place decides who is "later in
    borrowing order" than a starving job whose reservation holds borrowing (docs/model.md rule
    8.4.2): a holder behind a job of higher priority stands at that job's place."""
    before = levels.get(key[0], (float("-inf"), 0))
    latest = max(before, (key[1], key[2]))
    return (latest[0], latest[1], key)


def key_priority(key: JobKey) -> int:
    """The priority of the job of a queue key (a key holds it negated, so that higher sorts first)."""
    return -key[0]


def victim_seq(key: tuple[int, float, float, int]) -> int:
    """The seq of the job of a victim key (``victim_key``; it holds it negated: later first)."""
    return -key[3]


def victim_key(job: Job) -> tuple[int, float, float, int]:
    """Candidate order among victims (docs/model.md rule 4.4.4):

    1. lowest priority first,
    2. then the most recently placed,
    3. then the least work since its last checkpoint (time-dependent: applied to ties of 1-2
       when victims are chosen, see rules/victims.py),
    4. then the latest first submission,
    5. then the latest in submission order (stable tiebreak).
    """
    assert job.placement is not None
    return (job.priority, -job.placement.placed_at, -job.submitted_at, -job.seq)


class ShareQueue:
    """The RUNNABLE and running jobs of one share, indexed for the cycle."""

    __slots__ = (
        "_levels",
        "_patience_ends",
        "_waiting",
        "buckets",
        "counts",
        "least",
        "patience",
        "patient",
        "patient_buckets",
        "reserving",
        "runnable",
        "running",
        "sizes",
        "starving",
        "starving_types",
        "unjudged",
        "version",
    )

    def __init__(self) -> None:
        self.runnable: SortedList = SortedList()
        self.buckets: dict[tuple[str, int], SortedList] = {}
        """(instance type, count) → keys of RUNNABLE jobs with that entry."""
        self.counts: dict[str, set[int]] = {}
        """instance type → the counts of its non-empty buckets; a type no RUNNABLE job asks
        for has no entry. The walk looks only at these, not at every bucket ever made (a
        bucket's list is kept when it empties: a walk in progress may still hold it)."""
        self.sizes: defaultdict[str, SortedList] = defaultdict(SortedList)
        """instance type → the counts RUNNABLE jobs ask of it, one per job (lender protection
        holds while the smallest fits under the share's limit)."""
        self.least: dict[str, int] = {}
        """instance type → the smallest of its ``sizes``, asked for on every cycle (``smallest``)."""
        self.running: dict[str, SortedList] = {}
        """instance type → victim keys of jobs holding it that may be preempted."""
        self.reserving = False
        """Whether the share's starving jobs hold reservations (its ``starvation_reservation``)."""
        self.starving: SortedList = SortedList()
        """Keys of the share's starving RUNNABLE jobs; the first holds the share's reservation."""
        self.starving_types: dict[JobKey, frozenset[str]] = {}
        self.unjudged: SortedList = SortedList()
        """(runnable since, seq) of the RUNNABLE jobs not yet past the share's starvation
        threshold: the earliest is the next to pass it (docs/model.md rule 8.2)."""
        self.version = 0
        """Bumped whenever the RUNNABLE jobs change: what is derived from them is kept until then."""
        self._levels: tuple[int, dict[int, tuple[float, int]]] | None = None
        self.patience: float | None = None
        """With in-share preemption, how long a RUNNABLE job waits before it may preempt in
        its share (``in_share_preemption_after_seconds``); None without."""
        self.patient: dict[str, SortedList] = {}
        """instance type → keys of the RUNNABLE jobs asking for it that have waited
        ``patience``, as of the last ``take_patient``."""
        self.patient_buckets: dict[tuple[str, int], SortedList] = {}
        """(instance type, count) → the keys of ``patient`` with that entry, as ``buckets`` are
        of ``runnable`` (a list is kept when it empties: a walk in progress may still hold it)."""
        self._waiting: list[tuple[float, JobKey]] = []
        """(when its wait ends, key) of RUNNABLE jobs still waiting; some are stale."""
        self._patience_ends: dict[JobKey, tuple[float, tuple[Entry, ...]]] = {}
        """key → (when its wait ends, the job's entries), for the items of ``_waiting`` that are
        not stale."""

    def add_runnable(self, job: Job) -> frozenset[str]:
        """Index a RUNNABLE job. Returns the types of the share's reservation when the job comes
        ahead of its holder: a starving job takes the reservation over (``add_starving``), and any
        job moves the holder later in borrowing order (``borrowing_place``), so the types it
        held got easier for the jobs it no longer comes before."""
        key = job.key
        self.version += 1
        self.runnable.add(key)
        if not job.past_threshold:
            self.unjudged.add((job.runnable_since, job.seq))
        for entry in job.entries:
            bucket = self.buckets.get((entry.instance_type, entry.count))
            if bucket is None:
                bucket = self.buckets[(entry.instance_type, entry.count)] = SortedList()
            if not bucket:
                self.counts.setdefault(entry.instance_type, set()).add(entry.count)
            bucket.add(key)
            self.sizes[entry.instance_type].add(entry.count)
            least = self.least.get(entry.instance_type)
            if least is None or entry.count < least:
                self.least[entry.instance_type] = entry.count
        holder = self.holder()
        eased = self.starving_types[holder] if holder is not None and key < holder else frozenset()
        if job.starving:
            self.add_starving(job)
        if self.patience is not None:
            self._await(key, job.runnable_since + self.patience, job.entries)
        return eased

    def remove_runnable(self, job: Job) -> list[str]:
        """Drop a job from the RUNNABLE indexes; returns the types it asked for (the share may
        stop protecting them)."""
        key = job.key
        self.version += 1
        self.runnable.remove(key)
        self.unjudged.discard((job.runnable_since, job.seq))
        released = []
        for entry in job.entries:
            bucket = self.buckets[(entry.instance_type, entry.count)]
            bucket.remove(key)
            if not bucket:
                self._forget_count(entry.instance_type, entry.count)
            sizes = self.sizes[entry.instance_type]
            sizes.remove(entry.count)
            if not sizes:
                del self.least[entry.instance_type]
            elif entry.count == self.least[entry.instance_type]:
                self.least[entry.instance_type] = sizes[0]
            released.append(entry.instance_type)
        if job.starving:
            self.remove_starving(job)
        if self._patience_ends.pop(key, None) is None:
            for entry in job.entries:
                patient = self.patient.get(entry.instance_type)
                if patient is not None and key in patient:
                    patient.remove(key)
                    self.patient_buckets[(entry.instance_type, entry.count)].remove(key)
        return released

    def set_patience(self, patience: float | None, runnable: list[Job]) -> None:
        """The share's wait before in-share preemption changed (None: no in-share preemption);
        ``runnable`` are its RUNNABLE jobs, whose waits count from ``runnable_since``."""
        self.patience = patience
        self.patient = {}
        self.patient_buckets = {}
        self._waiting = []
        self._patience_ends = {}
        if patience is not None:
            for job in runnable:
                self._await(job.key, job.runnable_since + patience, job.entries)

    def take_patient(self, now: float) -> None:
        """Move the jobs whose wait has ended by ``now`` into ``patient`` and ``patient_buckets``."""
        waiting = self._waiting
        while waiting and waiting[0][0] <= now:
            ends, key = heapq.heappop(waiting)
            awaited = self._patience_ends.get(key)
            if awaited is None or awaited[0] != ends:
                continue  # the job left the queue, or came back with a wait of its own
            del self._patience_ends[key]
            for entry in awaited[1]:
                _index(self.patient, entry.instance_type, key)
                _index(self.patient_buckets, (entry.instance_type, entry.count), key)

    def patient_counts(self, instance_type: str) -> list[tuple[int, SortedList]]:
        """(count, keys) of the non-empty ``patient_buckets`` of the type."""
        return [
            (count, keys)
            for count in self.counts.get(instance_type, ())
            if (keys := self.patient_buckets.get((instance_type, count)))
        ]

    def _await(self, key: JobKey, ends: float, entries: tuple[Entry, ...]) -> None:
        self._patience_ends[key] = (ends, entries)
        heapq.heappush(self._waiting, (ends, key))

    def _forget_count(self, instance_type: str, count: int) -> None:
        """The bucket (type, count) emptied: its count leaves ``counts``, and the type too
        when no RUNNABLE job asks for it any more."""
        counts = self.counts[instance_type]
        counts.discard(count)
        if not counts:
            del self.counts[instance_type]

    def priority_levels(self) -> dict[int, tuple[float, int]]:
        """For each priority level of the RUNNABLE jobs, the latest (first submission, seq) among
        the jobs of higher levels: in FIFO borrowing order a job comes only after all of them.
        Kept until the RUNNABLE jobs change."""
        if self._levels is not None and self._levels[0] == self.version:
            return self._levels[1]
        levels: dict[int, tuple[float, int]] = {}
        latest: tuple[float, int] = (float("-inf"), 0)
        index = 0
        runnable = self.runnable
        if runnable and runnable[0][0] == runnable[-1][0]:  # one level: nothing comes before it
            levels[runnable[0][0]] = latest
            index = len(runnable)
        while index < len(runnable):
            level = runnable[index][0]
            end = runnable.bisect_left((level + 1,))
            levels[level] = latest
            last = runnable[end - 1]
            latest = max(latest, (last[1], last[2]))
            index = end
        self._levels = (self.version, levels)
        return levels

    def borrowing_place(self, key: JobKey) -> BorrowingPlace:
        """The RUNNABLE job's place in the borrowing order (``borrowing_place``), as the share's
        queue stands now."""
        return borrowing_place(self.priority_levels(), key)

    def lower_priority_waits(self, key: JobKey) -> bool:
        """Whether a RUNNABLE job of the share has a lower priority than the job of ``key``."""
        return bool(self.runnable) and self.runnable[-1][0] > key[0]

    def smallest(self, instance_type: str) -> int | None:
        """The smallest count a RUNNABLE job of the share asks of the type, if any asks."""
        return self.least.get(instance_type)

    def add_starving(self, job: Job) -> frozenset[str]:
        """The job starts starving (or comes back to the queue starving). When it comes ahead
        of the share's holder in queue order, the reservation moves to it at once (docs/model.md
        rule 8.4: the first starving job holds it): returns the former holder's types, which that
        reservation no longer covers for the jobs behind it unless the new holder's does."""
        if not self.reserving:
            return frozenset()
        before = self.holder()
        self.starving.add(job.key)
        self.starving_types[job.key] = job.instance_types
        if before is None or job.key > before:
            return frozenset()
        return self.starving_types[before]

    def remove_starving(self, job: Job) -> None:
        if self.starving_types.pop(job.key, None) is not None:
            self.starving.remove(job.key)

    def set_reserving(self, reserving: bool, starving: Iterable[Job] = ()) -> None:
        """The share's ``starvation_reservation`` changed: without it, nothing is reserved.
        Switched on, the share's ``starving`` RUNNABLE jobs hold from now on, the first of them
        the reservation (docs/model.md rules 5.2 and 8.4): they need not start starving again."""
        was = self.reserving
        self.reserving = reserving
        if not reserving:
            self.starving.clear()
            self.starving_types.clear()
        elif not was:
            for job in starving:
                self.add_starving(job)

    def holder(self) -> JobKey | None:
        """The key of the job holding the share's reservation: its first starving job in queue
        order (docs/model.md rule 8.4: at most one reservation per share)."""
        return self.starving[0] if self.starving else None

    def reserves(self, instance_type: str) -> bool:
        """Whether the share's reservation asks for the type (its share lends none of it)."""
        return self.reserving and bool(self.starving) and instance_type in self.starving_types[self.starving[0]]

    def held_back(self, key: JobKey, instance_type: str) -> bool:
        """Whether the share's reservation, held by a job ahead of ``key``, covers the type."""
        return self.reserving and bool(self.starving) and self.starving[0] < key and self.reserves(instance_type)

    def add_running(self, job: Job, instance_type: str) -> None:
        self.running.setdefault(instance_type, SortedList()).add(victim_key(job))

    def remove_running(self, job: Job, instance_type: str) -> None:
        self.running[instance_type].remove(victim_key(job))

    def position(self, key: JobKey) -> int:
        """1-based position among the share's RUNNABLE jobs."""
        return int(self.runnable.bisect_left(key)) + 1


def _index(index: dict[Any, SortedList], at: Any, key: JobKey) -> None:
    """Add ``key`` to the list of ``index`` at ``at``, made when it has none."""
    keys = index.get(at)
    if keys is None:
        keys = index[at] = SortedList()
    keys.add(key)


class MergedStreams:
    """A lazy k-way merge of sorted key streams, each job yielded once, in a phase's order.

    Streams are SortedLists that may change while the merge runs (jobs placed or requeued):
    each stream remembers the last key it gave and resumes with ``bisect_right``. A stream is
    tagged; the caller drops a tag when its jobs can no longer fit, and may add it again later
    (from a given position) when they might. ``order`` must grow with the keys of a stream.
    """

    def __init__(self, order: Callable[[JobKey], Any]) -> None:
        self._order = order
        self._heap: list[tuple[Any, int, JobKey]] = []
        self._streams: list[tuple[SortedList, Any]] = []
        self._live: dict[Any, int] = {}
        self.seen: set[int] = set()

    def add(self, keys: SortedList, tag: Any, after: Any = None) -> None:
        """Merge ``keys`` in; with ``after`` (an order value), only keys ordered after it.
        A tag that is already being merged is left as it is."""
        if tag in self._live:
            return
        start = 0
        if after is not None:
            low, high = 0, len(keys)
            while low < high:
                middle = (low + high) // 2
                if self._order(keys[middle]) > after:
                    high = middle
                else:
                    low = middle + 1
            start = low
        if start < len(keys):
            index = len(self._streams)
            self._streams.append((keys, tag))
            self._live[tag] = index
            key = keys[start]
            heapq.heappush(self._heap, (self._order(key), index, key))

    def pop(self) -> tuple[JobKey, Any, Any] | None:
        """The next unseen key, its stream's tag and its order value; None when all are spent."""
        while self._heap:
            order, index, key = heapq.heappop(self._heap)
            keys, tag = self._streams[index]
            if self._live.get(tag) != index:
                continue
            position = keys.bisect_right(key)
            if position < len(keys):
                following = keys[position]
                heapq.heappush(self._heap, (self._order(following), index, following))
            else:
                del self._live[tag]
            if key[2] in self.seen:
                continue
            return key, tag, order
        return None

    def drop(self, tag: Any) -> None:
        """Stop merging the stream with this tag."""
        self._live.pop(tag, None)
