"""A tiny training for the install page's first DAGs (docs/install.md): it counts steps,
keeps the step reached in a checkpoint file, and starts from it again after a preemption.

Run as a command by the quota scheduler's local backend (``QuotaTrainingOperator``), it reads
its checkpoint location from ``QUOTA_CHECKPOINT_URI`` and stops at the step it reached on
SIGTERM (exit status 143, as a stopped process must). Imported by a ``@task`` that runs on
QuotaExecutor, ``train()`` is called with the placement's checkpoint location instead.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType

SIGTERM_EXIT = 128 + signal.SIGTERM


def train(steps: int, step_seconds: float, checkpoint: Path | None) -> int:
    """Run ``steps`` steps from the checkpoint's step (0 without one); the step reached."""
    step = int(checkpoint.read_text()) if checkpoint is not None and checkpoint.exists() else 0
    if step:
        print(f"resumed from step {step}", flush=True)
    while step < steps:
        time.sleep(step_seconds)  # one step of "training"
        step += 1
        if checkpoint is not None:
            checkpoint.parent.mkdir(parents=True, exist_ok=True)
            checkpoint.write_text(str(step))
    print(f"done at step {step}", flush=True)
    return step


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="a tiny training that checkpoints each step")
    parser.add_argument("--steps", type=int, default=20, help="steps in total")
    parser.add_argument("--step-seconds", type=float, default=0.1, help="how long one step takes")
    args = parser.parse_args(argv)

    def stop(signum: int, frame: FrameType | None) -> None:
        print("SIGTERM: stopping at the step reached (kept in the checkpoint)", flush=True)
        sys.exit(SIGTERM_EXIT)

    signal.signal(signal.SIGTERM, stop)
    location = os.environ.get("QUOTA_CHECKPOINT_URI")
    checkpoint = Path(location.removeprefix("file://")) / "step" if location else None
    placed = os.environ.get("QUOTA_INSTANCE_COUNT", "1"), os.environ.get("QUOTA_INSTANCE_TYPE", "this machine")
    print(f"training on {placed[0]}x {placed[1]}", flush=True)
    train(args.steps, args.step_seconds, checkpoint)
    return 0


if __name__ == "__main__":
    sys.exit(main())
