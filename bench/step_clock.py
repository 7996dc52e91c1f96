"""The benchmarks' step timer: host time between two optimizer steps of a Lightning run, the device drained at both."""

from __future__ import annotations

import time

import pytorch_lightning as pl
import torch


class StepClock(pl.Callback):
    """Host time from the end of step ``first`` to the end of step ``last`` (``seconds``), as raw_loop.py times it:
    ``torch.cuda.synchronize()`` at both ends on a CUDA device.

    Steps count from 1 (``trainer.global_step`` after the step), so ``first`` is at least 1: at the end of the first
    batch the global step is already 1, and a clock waiting for step 0 would never start. Reaching ``last`` without a
    start raises instead of timing from an unset one.

    ``device_in_use_gib``: what the CUDA device had in use when the clock stopped (``cudaMemGetInfo``, total less free:
    the context, torch's reserved pool, cuDNN's and nvJPEG's own buffers), None on other devices. Read there, not after
    the fit: Lightning's teardown empties torch's cache.
    """

    def __init__(self, first: int, last: int) -> None:
        if not 1 <= first < last:
            raise ValueError(
                f"StepClock({first}, {last}): the clock starts at the end of step first (at least 1, the global step "
                "after the first batch) and stops at the end of step last (after first)"
            )
        self.first, self.last, self.seconds = first, last, 0.0
        self.start: float | None = None
        self.device_in_use_gib: float | None = None

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: object) -> None:
        if trainer.global_step in (self.first, self.last):
            if trainer.strategy.root_device.type == "cuda":
                torch.cuda.synchronize()
            if trainer.global_step == self.first:
                self.start = time.perf_counter()
            elif self.start is None:
                raise RuntimeError(
                    f"StepClock: step {self.last} ended, but the clock never started at the end of step {self.first} "
                    "(the global step skipped it): no time to report"
                )
            else:
                self.seconds = time.perf_counter() - self.start
                if trainer.strategy.root_device.type == "cuda":
                    self.device_in_use_gib = device_in_use_gib(trainer.strategy.root_device)


def device_in_use_gib(device: torch.device | None = None) -> float:
    """GiB in use on the CUDA ``device`` (the current one by default): ``cudaMemGetInfo``'s total less free, which
    counts the context and every library's buffers with torch's reserved pool."""
    free, total = torch.cuda.mem_get_info(device)
    return (total - free) / 2**30
