"""The orders a cycle walks in (docs/model.md rules 4.0.2, 4.0.3 and 4.3.1), as named keys.

Each is a plain function of the jobs and the state as they stand; none is kept between calls.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from airflow_quota.core.model import Job
from airflow_quota.core.state import QuotaState


def queue_order(job: Job) -> tuple[int, float, int]:
    """Rule 4.0.2, inside a share: higher priority first, then earlier first submission (a
    requeued job keeps its place), then submission order."""
    return (-job.priority, job.submitted_at, job.seq)


def share_order(state: QuotaState, names: Collection[str]) -> list[str]:
    """Rule 4.0.3: shares by usage/limit in instances, lowest first, then by name."""
    return sorted(names, key=lambda name: (state.share_usage[name] / state.share_limit[name], name))


def borrowing_order(jobs: Iterable[Job]) -> list[Job]:
    """Rule 4.3.1: across shares by first submission, then submission order, a job only after
    every job of higher priority in its own share: it stands at the latest first submission
    among itself and those jobs (ties in queue order)."""
    by_share: dict[str, list[Job]] = {}
    for job in jobs:
        by_share.setdefault(job.share, []).append(job)
    places: list[tuple[tuple[float, int], tuple[int, float, int], Job]] = []
    for share_jobs in by_share.values():
        share_jobs.sort(key=queue_order)
        latest_of_higher: tuple[float, int] = (float("-inf"), 0)
        latest_so_far: tuple[float, int] = (float("-inf"), 0)
        level: int | None = None
        for job in share_jobs:
            if job.priority != level:  # every job seen so far has a higher priority
                level, latest_of_higher = job.priority, latest_so_far
            own = (job.submitted_at, job.seq)
            places.append((max(latest_of_higher, own), queue_order(job), job))
            latest_so_far = max(latest_so_far, own)
    places.sort(key=lambda place: place[:2])
    return [job for _, _, job in places]
