"""The watchdog of docs/model.md rule 8.5: a RUNNABLE job with an entry that fits under its share's
limit must not keep waiting unless for a plan window, provider capacity, a starving job's
reservation, or victims. GUARANTEE_VIOLATED must never happen; this is what would notice.
"""

from __future__ import annotations

from airflow_quota.core.lifecycle import Lifecycle, queued
from airflow_quota.core.model import AlertKind, Job
from airflow_quota.core.queues import victim_seq
from airflow_quota.core.quota import Block
from airflow_quota.core.rules import SOURCE_BLOCKS
from airflow_quota.core.rules.placement import Mode, placement_check
from airflow_quota.core.state import QuotaState


class GuaranteeWatch:
    """Step 6 of the cycle: alerts when a guarantee stays unmet for two cycles."""

    def __init__(self) -> None:
        self.violating: dict[int, tuple[str, int, int]] = {}
        """Jobs found waiting with an entry under their limit: (type, count, cycles seen)."""

    def check(self, life: Lifecycle, now: float, types: set[str]) -> None:
        """Step 6: a RUNNABLE job with an entry under its share's limit must not keep waiting
        unless for a plan window, provider capacity, a starving job, or victims (stopping or
        protected). Looked at where something changed, and for jobs already found waiting."""
        state = life.state
        still: dict[int, tuple[str, int, int]] = {}
        for seq, (instance_type, count) in sorted(self._suspects(state, types).items()):
            job = state.jobs[seq]
            ledger = state.types[instance_type]
            fits = ledger.usage_of(job.share) + count <= ledger.limit_of(job.share)
            if not queued(job) or not fits or self._excused(state, job, instance_type, count, now):
                continue
            cycles = self.violating.get(seq, (instance_type, count, 0))[2] + 1
            still[seq] = (instance_type, count, cycles)
            if cycles >= 2 and AlertKind.GUARANTEE_VIOLATED not in job.alerts:
                life.alert(
                    job,
                    AlertKind.GUARANTEE_VIOLATED,
                    f"{count}x {instance_type} fits under the limit but the job still waits",
                    now,
                )
        self.violating = still

    def _suspects(self, state: QuotaState, types: set[str]) -> dict[int, tuple[str, int]]:
        """The jobs to look at, each with the (type, count) of its entry under the limit: those
        already found waiting, and the queued jobs of each share with an entry under its limit
        on a type in ``types``. A share none of whose waiting jobs asks a type in a count under
        its limit has none (the smallest count it asks decides)."""
        suspects = {seq: (instance_type, count) for seq, (instance_type, count, _) in self.violating.items()}
        for name in state.below_limit(types):
            queue = state.queues[name]
            for instance_type in types & queue.counts.keys():
                ledger = state.types[instance_type]
                headroom = ledger.limit_of(name) - ledger.usage_of(name)
                smallest = queue.smallest(instance_type)
                if headroom <= 0 or smallest is None or smallest > headroom:
                    continue
                for count in queue.counts[instance_type]:
                    if count <= headroom:
                        for key in queue.buckets[(instance_type, count)]:
                            if queue.held_back(key, instance_type):
                                break  # so are all the jobs behind it
                            suspects.setdefault(key[2], (instance_type, count))
        return suspects

    def _excused(self, state: QuotaState, job: Job, instance_type: str, count: int, now: float) -> bool:
        """Waiting for a plan window, provider capacity, a starving job, or victims (stopping or
        protected): the reasons a job under its limit may wait."""
        entry = next(e for e in job.entries if e.instance_type == instance_type)
        block = placement_check(state, job, entry, Mode.WITHIN_QUOTA, now)
        if block in (*SOURCE_BLOCKS, Block.HELD_FOR_STARVING_JOB, Block.BORROWING_HELD, Block.MAX_RUNNING_JOBS):
            return True
        ledger = state.types[instance_type]
        if ledger.draining > 0:
            return True
        for other, usage in ledger.usage.items():
            if usage > ledger.limit_of(other):
                for key in state.queues[other].running.get(instance_type, ()):
                    victim = state.jobs[victim_seq(key)]
                    protection = state.shares[other].preemption_protection_seconds
                    if now - victim.placement.placed_at < protection:  # type: ignore[union-attr]
                        return True
        return False
