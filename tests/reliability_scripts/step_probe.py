"""A test-only callback for ``python train.py``: one JSON line per optimizer step of what the step trained on.

    python train.py ... --trainer.callbacks '[{"class_path": "step_probe.StepRecord", "init_args": {"path": "F"}}]'

(with ``tests/reliability_scripts`` on ``PYTHONPATH``). Each process appends to ``path``, one line as soon as a step
is done, so what a killed process did up to its death is on file:

* ``{"start", "rank", "pid", "time", "deterministic", "cudnn_benchmark", "cublas_workspace"}`` when training
  starts: ``start`` is the global step it starts at (> 0 after a resume), then whether
  ``torch.use_deterministic_algorithms`` is on, ``torch.backends.cudnn.benchmark`` and ``CUBLAS_WORKSPACE_CONFIG``;
* ``{"step", "epoch", "batch_idx", "loss", "lr", "images", "targets", "rank", "pid", "time"}`` per optimizer step:
  ``step`` is the 0-based step the batch trained, ``loss`` the exact float of this rank's loss, ``lr`` the learning
  rate it was trained at, ``images`` a digest of the batch's bytes (order, crops and flips), ``targets`` its labels.

It reads the loss back to the host every step: for tests, not for speed.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback


class StepRecord(Callback):
    """Appends one JSON line per optimizer step to ``path`` (see the module docstring).

    Args:
        path: The JSON-lines file (appended to, created if missing).
    """

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self._lr: float | None = None

    def _write(self, record: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            # One write call per line: a SIGKILL leaves whole lines, at most the last one cut short.
            f.write(json.dumps(record) + "\n")

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._write(
            {
                "start": trainer.global_step,
                "rank": trainer.global_rank,
                "pid": os.getpid(),
                "time": time.time(),
                "deterministic": torch.are_deterministic_algorithms_enabled(),
                "cudnn_benchmark": torch.backends.cudnn.benchmark,
                "cublas_workspace": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
            }
        )

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, idx: int) -> None:
        # Before the scheduler steps (after the optimizer step): the rate this batch trains at.
        self._lr = trainer.optimizers[0].param_groups[0]["lr"]

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        images, targets = batch
        self._write(
            {
                "step": trainer.global_step - 1,
                "epoch": trainer.current_epoch,
                "batch_idx": batch_idx,
                "loss": float(outputs["loss"]),
                "lr": self._lr,
                "images": hashlib.sha1(images.detach().cpu().contiguous().numpy().tobytes()).hexdigest(),
                "targets": targets.tolist(),
                "rank": trainer.global_rank,
                "pid": os.getpid(),
                "time": time.time(),
            }
        )
