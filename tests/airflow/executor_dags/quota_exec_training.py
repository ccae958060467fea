"""The training the executor's end-to-end DAGs run: ``steps`` one-second steps, a checkpoint
after each (the step reached, in the placement's checkpoint location), resuming from it; every
start and end is a JSON line in ``$AIRFLOW_QUOTA_EXAMPLE_CHECKPOINTS/events.jsonl`` for the test."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from airflow_quota.executors import Placement, on_preemption


def _record(event: dict[str, object]) -> None:
    path = Path(os.environ["AIRFLOW_QUOTA_EXAMPLE_CHECKPOINTS"]) / "events.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as out:
        out.write(json.dumps({**event, "at": time.time()}) + "\n")


def train(name: str, steps: int) -> int:
    """Train ``steps`` steps (resuming after a preemption); the step reached."""
    placement = Placement.current()
    folder = Path(placement.checkpoint_uri or Path(os.environ["AIRFLOW_QUOTA_EXAMPLE_CHECKPOINTS"]) / name)
    folder.mkdir(parents=True, exist_ok=True)
    checkpoint = folder / "step"
    step = int(checkpoint.read_text()) if checkpoint.exists() else 0
    _record(
        {
            "task": name,
            "event": "start",
            "resumed_from": step,
            "share": placement.share,
            "instance_type": placement.instance_type,
            "attempt": placement.attempt,
            "job_id": placement.job_id,
        }
    )

    def save() -> None:
        checkpoint.write_text(str(step))
        _record({"task": name, "event": "checkpoint", "step": step, "attempt": placement.attempt})

    on_preemption(save)
    print(f"{name}: resumed from step {step}" if step else f"{name}: starting", flush=True)
    while step < steps:
        time.sleep(1)
        step += 1
        checkpoint.write_text(str(step))
    _record({"task": name, "event": "end", "step": step, "attempt": placement.attempt})
    return step
