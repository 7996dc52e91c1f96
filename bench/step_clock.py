"""The benchmarks' step timer: host time between two optimizer steps of a Lightning run, the device drained at both."""

from __future__ import annotations

import time

import pytorch_lightning as pl
import torch


class StepClock(pl.Callback):
    """Host time from the end of step ``first`` to the end of step ``last`` (``seconds``), as raw_loop.py times it:
    ``torch.cuda.synchronize()`` at both ends on a CUDA device."""

    def __init__(self, first: int, last: int) -> None:
        self.first, self.last, self.seconds = first, last, 0.0
        self.start = 0.0

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: object) -> None:
        if trainer.global_step in (self.first, self.last):
            if trainer.strategy.root_device.type == "cuda":
                torch.cuda.synchronize()
            if trainer.global_step == self.first:
                self.start = time.perf_counter()
            else:
                self.seconds = time.perf_counter() - self.start
