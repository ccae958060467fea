"""A small real training script for the local backend's tests (pure Python).

It fits ``y = 3x + 2`` with a linear model by gradient descent, one step every
``--step-seconds``, and behaves as a preemptible training should:

- it sizes itself from ``QUOTA_INSTANCE_TYPE`` and ``QUOTA_GPUS`` (and says so);
- it writes ``$QUOTA_CHECKPOINT_URI/checkpoint.json`` (step and weights) every
  ``--checkpoint-every`` steps, at the end, and on SIGTERM, after which it exits 0;
- it resumes from that checkpoint when there is one (``resumed from step N``).

``--fail-with N`` makes it exit N once the steps are done, to play a failed training.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType

DATA = [(x / 10, 3 * (x / 10) + 2) for x in range(-10, 11)]


def gradient_step(w: float, b: float, lr: float) -> tuple[float, float, float]:
    """One step of gradient descent on the mean squared error; the new weights and the loss."""
    n = len(DATA)
    errors = [(w * x + b - y, x) for x, y in DATA]
    loss = sum(e * e for e, _ in errors) / n
    dw = 2 * sum(e * x for e, x in errors) / n
    db = 2 * sum(e for e, _ in errors) / n
    return w - lr * dw, b - lr * db, loss


def save(path: Path, step: int, w: float, b: float) -> None:
    """Write the checkpoint atomically, so a kill mid-write never leaves half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"step": step, "weights": {"w": w, "b": b}}))
    os.replace(tmp, path)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--step-seconds", type=float, default=0.05)
    parser.add_argument("--checkpoint-every", type=int, default=5)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--fail-with", type=int, default=None)
    args = parser.parse_args()

    terminated = False

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        nonlocal terminated
        terminated = True

    signal.signal(signal.SIGTERM, on_sigterm)

    instance_type = os.environ.get("QUOTA_INSTANCE_TYPE", "unknown")
    gpus = int(os.environ.get("QUOTA_GPUS", "0"))
    print(f"sized for {instance_type} with {gpus} GPUs (batch size {32 * max(gpus, 1)})", flush=True)

    checkpoint_dir = os.environ.get("QUOTA_CHECKPOINT_URI")
    checkpoint = Path(checkpoint_dir) / "checkpoint.json" if checkpoint_dir else None
    step, w, b = 0, 0.0, 0.0
    if checkpoint is not None and checkpoint.exists():
        state = json.loads(checkpoint.read_text())
        step, w, b = state["step"], state["weights"]["w"], state["weights"]["b"]
        print(f"resumed from step {step}", flush=True)

    loss = float("nan")
    while step < args.steps:
        if terminated:
            if checkpoint is not None:
                save(checkpoint, step, w, b)
            print(f"SIGTERM at step {step}: checkpoint written, exiting", flush=True)
            return 0
        w, b, loss = gradient_step(w, b, args.lr)
        step += 1
        if checkpoint is not None and step % args.checkpoint_every == 0:
            save(checkpoint, step, w, b)
            print(f"step {step}: loss {loss:.5f}, checkpoint written", flush=True)
        time.sleep(args.step_seconds)

    if checkpoint is not None:
        save(checkpoint, step, w, b)
    print(f"done at step {step}: w={w:.3f} b={b:.3f} loss={loss:.5f}", flush=True)
    if args.fail_with is not None:
        print(f"failing with exit code {args.fail_with}", flush=True)
        return int(args.fail_with)
    return 0


if __name__ == "__main__":
    sys.exit(main())
