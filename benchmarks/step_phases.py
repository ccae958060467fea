"""Where a leader's step spends its time: wall and CPU time (this thread's) per call of each
phase of ``QuotaService.step`` and of the replay's submissions, measured by wrapping the
methods of one replay's service and store (``service_trace.py --phases``). The wall time less
the CPU time is what the phase waits for (the database, a thread)."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from benchmarks.service_replay import ServiceReplay

PHASES = ("_take_in_reports", "_take_in_requests", "_cycle", "_commit", "_act", "_mark_done", "_report")
"""The step's phases in the order they run (``_mark_done`` is part of ``_act``)."""


@dataclass
class Phase:
    calls: int = 0
    wall: float = 0.0
    cpu: float = 0.0


@dataclass
class StepPhases:
    """The phases timed so far, by name: the step's, ``step`` itself and ``submit``."""

    phases: dict[str, Phase] = field(default_factory=dict)

    @classmethod
    def timing(cls, replay: ServiceReplay) -> StepPhases:
        """Start timing the phases of ``replay``'s service and its submissions."""
        timer = cls()
        for name in ("step", *PHASES):
            setattr(replay.service, name, timer._timed(name, getattr(replay.service, name)))
        replay.store.submit = timer._timed("submit", replay.store.submit)  # type: ignore[method-assign]
        return timer

    def _timed(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        phase = self.phases.setdefault(name, Phase())

        @functools.wraps(method)
        def timed(*args: Any, **kwargs: Any) -> Any:
            wall, cpu = time.perf_counter(), time.thread_time()
            try:
                return method(*args, **kwargs)
            finally:
                phase.calls += 1
                phase.wall += time.perf_counter() - wall
                phase.cpu += time.thread_time() - cpu

        return timed

    def table(self) -> list[dict[str, Any]]:
        """Each phase's calls and its wall and CPU time in all and per call (ms), and per step."""
        steps = self.phases["step"].calls or 1
        return [
            {
                "phase": name,
                "calls": phase.calls,
                "wall_seconds": phase.wall,
                "cpu_seconds": phase.cpu,
                "wall_ms_a_call": 1000 * phase.wall / (phase.calls or 1),
                "cpu_ms_a_call": 1000 * phase.cpu / (phase.calls or 1),
                "wall_ms_a_step": 1000 * phase.wall / steps,
            }
            for name, phase in self.phases.items()
        ]


def show(table: list[dict[str, Any]]) -> None:
    heads = ("calls", "wall s", "CPU s", "wall ms/call", "CPU ms/call", "wall ms/step")
    print(f"{'phase':20s} " + " ".join(f"{head:>13s}" for head in heads))
    for row in table:
        print(
            f"{row['phase']:20s} {row['calls']:13,d} {row['wall_seconds']:13.2f} {row['cpu_seconds']:13.2f} "
            f"{row['wall_ms_a_call']:13.3f} {row['cpu_ms_a_call']:13.3f} {row['wall_ms_a_step']:13.3f}"
        )
