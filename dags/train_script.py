"""A small, real training script for the example training pipelines (pure Python, no numpy).

It fits ``y = 3x + 2`` (plus a little seeded noise) with a linear model trained by mini-batch
gradient descent, and behaves as a preemptible training must under quota management:

- **It sizes itself from its placement.** The quota service's local backend tells the training
  where it was placed: ``QUOTA_INSTANCE_TYPE``, ``QUOTA_INSTANCE_COUNT`` and ``QUOTA_GPUS`` (all
  the GPUs of all its instances). The global batch is ``--batch-per-gpu`` per GPU (one "GPU" on
  a CPU-only type) and the learning rate grows with it (the linear scaling rule), so the same
  job runs on whichever entry of its preference list it got. It prints what it chose::

      sized for 1x ml.g5.xlarge with 1 GPU(s): global batch 32 (32 per GPU), learning rate 0.050

- **It checkpoints.** Every ``--checkpoint-every`` steps, at the end, and when it receives
  SIGTERM (a preemption: the quota scheduler stops it and gives it the share's
  ``preemption_grace_seconds``), it writes ``checkpoint.json`` (step, weights) atomically into
  ``$QUOTA_CHECKPOINT_URI`` (a local directory, or ``file://`` URI). After SIGTERM it exits with
  status 143, as a process ended by SIGTERM conventionally does: a stop nobody asked for must
  never look like a finished training.
- **It resumes.** When the checkpoint is there (its next attempt, after a preemption or a
  failure), it starts from it and prints ``resumed from step N``; the steps done are not redone.

Run it by hand to try it: ``QUOTA_GPUS=4 QUOTA_CHECKPOINT_URI=/tmp/ckpt python train_script.py``.
``--fail-with N`` makes it exit N once the steps are done, to play a failed training (the local
backend's tests use it).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import time
from pathlib import Path
from types import FrameType

SIGTERM_EXIT = 128 + signal.SIGTERM
CHECKPOINT_FILE = "checkpoint.json"


def dataset(size: int = 512, seed: int = 7) -> list[tuple[float, float]]:
    """``size`` points of ``y = 3x + 2`` with Gaussian noise, the same every run (seeded)."""
    rng = random.Random(seed)
    points = []
    for _ in range(size):
        x = rng.uniform(-1.0, 1.0)
        points.append((x, 3.0 * x + 2.0 + rng.gauss(0.0, 0.05)))
    return points


def gradient_step(batch: list[tuple[float, float]], w: float, b: float, lr: float) -> tuple[float, float, float]:
    """One step of gradient descent on the batch's mean squared error: new weights, loss."""
    errors = [(w * x + b - y, x) for x, y in batch]
    n = len(batch)
    loss = sum(e * e for e, _ in errors) / n
    dw = 2.0 * sum(e * x for e, x in errors) / n
    db = 2.0 * sum(e for e, _ in errors) / n
    return w - lr * dw, b - lr * db, loss


def checkpoint_dir(uri: str | None) -> Path | None:
    """The local directory of ``$QUOTA_CHECKPOINT_URI`` (plain path or ``file://``), or None."""
    if not uri:
        return None
    if uri.startswith("file://"):
        return Path(uri[len("file://") :])
    if "://" in uri:
        print(f"checkpoints disabled: {uri} is not a local directory", flush=True)
        return None
    return Path(uri)


def save(directory: Path, step: int, w: float, b: float) -> None:
    """Write the checkpoint atomically: a kill mid-write never leaves half a file."""
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / (CHECKPOINT_FILE + ".tmp")
    tmp.write_text(json.dumps({"step": step, "weights": {"w": w, "b": b}}))
    os.replace(tmp, directory / CHECKPOINT_FILE)


def load(directory: Path | None) -> tuple[int, float, float]:
    """(step, w, b) from the checkpoint, or a fresh start."""
    if directory is None or not (directory / CHECKPOINT_FILE).exists():
        return 0, 0.0, 0.0
    state = json.loads((directory / CHECKPOINT_FILE).read_text())
    return int(state["step"]), float(state["weights"]["w"]), float(state["weights"]["b"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--steps", type=int, default=60, help="training steps in total")
    parser.add_argument("--step-seconds", type=float, default=0.1, help="pause per step, to play a longer training")
    parser.add_argument("--checkpoint-every", type=int, default=10, help="steps between two checkpoints")
    parser.add_argument("--batch-per-gpu", type=int, default=32, help="examples per GPU per step")
    parser.add_argument("--base-lr", type=float, default=0.05, help="learning rate for a batch of --batch-per-gpu")
    parser.add_argument("--fail-with", type=int, default=None, help="exit status once done: a failed training")
    args = parser.parse_args(argv)

    stop_requested = False

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        nonlocal stop_requested
        stop_requested = True  # finish the current step, checkpoint, exit

    signal.signal(signal.SIGTERM, on_sigterm)

    # 1. size the training from the placement the quota scheduler chose
    instance_type = os.environ.get("QUOTA_INSTANCE_TYPE", "local")
    count = int(os.environ.get("QUOTA_INSTANCE_COUNT", "1"))
    gpus = int(os.environ.get("QUOTA_GPUS", "0"))
    workers = max(gpus, 1)
    batch_size = args.batch_per_gpu * workers
    lr = min(args.base_lr * workers, 0.4)  # the linear scaling rule, capped to stay stable
    print(
        f"sized for {count}x {instance_type} with {gpus} GPU(s): global batch {batch_size} "
        f"({args.batch_per_gpu} per GPU), learning rate {lr:.3f}",
        flush=True,
    )

    # 2. resume from the checkpoint of an earlier attempt, if any
    directory = checkpoint_dir(os.environ.get("QUOTA_CHECKPOINT_URI"))
    step, w, b = load(directory)
    if step:
        print(f"resumed from step {step}", flush=True)

    # 3. train, checkpointing as we go
    data = dataset()
    loss = float("nan")
    while step < args.steps:
        if stop_requested:
            if directory is not None:
                save(directory, step, w, b)
                print(f"SIGTERM at step {step}: checkpoint written, exiting", flush=True)
            else:
                print(f"SIGTERM at step {step}: no checkpoint location, the work is lost", flush=True)
            return SIGTERM_EXIT
        start = (step * batch_size) % len(data)
        batch = (data + data)[start : start + batch_size] if batch_size <= len(data) else data
        w, b, loss = gradient_step(batch, w, b, lr)
        step += 1
        if directory is not None and step % args.checkpoint_every == 0:
            save(directory, step, w, b)
            print(f"step {step}: loss {loss:.5f}, checkpoint written", flush=True)
        time.sleep(args.step_seconds)

    if directory is not None:
        save(directory, step, w, b)
    print(f"done at step {step}: w={w:.3f} b={b:.3f} loss={loss:.5f}", flush=True)
    if args.fail_with is not None:
        print(f"failing with exit code {args.fail_with}", flush=True)
        return int(args.fail_with)
    return 0


if __name__ == "__main__":
    sys.exit(main())
