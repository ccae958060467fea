"""Who overtook a waiting job (docs/model.md rules 8.1 and 8.2): the record that decides when a job starts
starving, without rescanning queues at every placement.

A job is *overtaken* when, since it last became RUNNABLE, a job later than it in submission
order was placed on an instance type of its list, in its own share, or in any share by a
placement that borrows. Submission order is the order of ``seq`` (a job's first submission
time never decreases with its seq), so "later" is "higher seq".

Two kinds of channel record placements as sorted lists of the placer's seq: one per (share,
type) for placements that borrow nothing, one per type for placements that borrow. How many
placements overtook a job is then, summed over its types, the placers later than it in its
share's channel and in the borrowing channel, minus the same count when it became RUNNABLE.

A job past its threshold that nobody has overtaken yet is *watched*: the next overtaking
placement finds it at once (the watched jobs earlier than the placer are a prefix of a sorted
list) and it starts starving at that moment.

A placement by a job earlier than every job not yet final overtakes no job that can still wait,
so the log forgets such placements from time to time: it holds the window of live jobs, not the
whole history (a leader runs for months).
"""

from __future__ import annotations

from collections import defaultdict

from sortedcontainers import SortedList

from airflow_quota.core.model import Job

Channel = tuple[str, str] | str
"""(share, type) for placements that borrow nothing; the type alone for placements that borrow."""

PRUNE_AFTER = 1024
"""Placements recorded between two prunings at least; at most as many as the log then holds,
so pruning costs a constant per placement."""


def _later(placers: SortedList | None, seq: int) -> int:
    """How many placers in the channel are later than ``seq`` in submission order."""
    if not placers:
        return 0
    return len(placers) - int(placers.bisect_right(seq))


class OvertakeLog:
    """Placements by channel, the count each RUNNABLE job started from, and watched jobs."""

    __slots__ = ("_baseline", "_names", "_placers", "_prune_at", "_recorded", "_watched", "_watching")

    def __init__(self) -> None:
        self._placers: defaultdict[Channel, SortedList] = defaultdict(SortedList)
        self._names: dict[int, str] = {}
        """seq → "name (share)" of each placer the log holds, for the alerts (a finished job
        may be forgotten by the state before the log forgets its placement)."""
        self._baseline: dict[int, int] = {}
        """seq → overtaking placements already counted when the job last became RUNNABLE."""
        self._watched: defaultdict[Channel, SortedList] = defaultdict(SortedList)
        """Channel → seqs of jobs past their threshold and not yet overtaken."""
        self._watching: dict[int, tuple[Channel, ...]] = {}
        self._recorded = 0
        """Placements recorded since the log was last pruned."""
        self._prune_at = PRUNE_AFTER

    @staticmethod
    def channels(job: Job) -> tuple[Channel, ...]:
        """The channels whose placements overtake ``job``."""
        out: list[Channel] = []
        for entry in job.entries:
            out.append((job.share, entry.instance_type))
            out.append(entry.instance_type)
        return tuple(out)

    def _count(self, job: Job) -> int:
        return sum(_later(self._placers.get(channel), job.seq) for channel in self.channels(job))

    def became_runnable(self, job: Job) -> None:
        """Overtaking counts from now on."""
        self.forget(job)
        self._baseline[job.seq] = self._count(job)

    def overtaken(self, job: Job) -> int:
        """Placements of later jobs that overtook ``job`` since it last became RUNNABLE."""
        return self._count(job) - self._baseline.get(job.seq, 0)

    def latest_overtaker(self, job: Job) -> str | None:
        """ "name (share)" of the latest-submitted job placed in ``job``'s channels after it in
        submission order (one that overtook it, or, for a job requeued since, may have before)."""
        later = [placers[-1] for channel in self.channels(job) if (placers := self._placers.get(channel))]
        latest = max(later, default=None)
        return self._names.get(latest) if latest is not None and latest > job.seq else None

    def watch(self, job: Job) -> None:
        """``job`` is past its threshold and nobody overtook it yet: the next overtaking
        placement makes it starve. Watching a watched job changes nothing."""
        if job.seq in self._watching:
            return
        channels = self.channels(job)
        self._watching[job.seq] = channels
        for channel in channels:
            self._watched[channel].add(job.seq)

    def watched(self) -> frozenset[int]:
        """The seqs of the watched jobs."""
        return frozenset(self._watching)

    def unwatch(self, job: Job) -> None:
        """``job`` is no longer past its threshold (its share's was raised): an overtaking
        placement does not make it starve until it is past the new one."""
        self.forget(job)

    def forget(self, job: Job) -> None:
        """``job`` left the queue (placed, stopped, failed): it is watched no more."""
        for channel in self._watching.pop(job.seq, ()):
            self._watched[channel].remove(job.seq)

    def placed(self, job: Job, instance_type: str, borrows: bool) -> list[int]:
        """Record ``job``'s placement on the type; returns the seqs of the watched jobs it
        overtakes (earlier jobs of its share, or of any share when it borrows), now unwatched."""
        channel: Channel = instance_type if borrows else (job.share, instance_type)
        self._placers[channel].add(job.seq)
        self._names[job.seq] = f"{job.name} ({job.share})"
        self._recorded += 1
        if self._recorded >= self._prune_at:
            self._prune()
        watched = self._watched.get(channel)
        if not watched or watched[0] >= job.seq:
            return []
        overtaken = list(watched.irange(maximum=job.seq, inclusive=(True, False)))
        for seq in overtaken:
            for other in self._watching.pop(seq, ()):
                self._watched[other].remove(seq)
        return overtaken

    def _prune(self) -> None:
        """Forget the placements no job that is not final can count: those of jobs no later
        than the earliest such job (a job counts only placers later than itself; every job not
        yet final has a baseline, and a new job is later than all)."""
        earliest = min(self._baseline, default=None)
        for placers in self._placers.values():
            del placers[: len(placers) if earliest is None else placers.bisect_right(earliest)]
        self._names = {seq: name for seq, name in self._names.items() if earliest is not None and seq > earliest}
        self._recorded = 0
        self._prune_at = max(PRUNE_AFTER, self.held())

    def held(self) -> int:
        """Placements the log holds now (what pruning keeps bounded)."""
        return sum(len(placers) for placers in self._placers.values())

    def drop(self, job: Job) -> None:
        """``job`` is final: nothing about it is kept."""
        self.forget(job)
        self._baseline.pop(job.seq, None)
