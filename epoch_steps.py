"""Optimizer steps per training epoch, as Lightning runs them.

Lightning steps the optimizer after every ``accumulate_grad_batches`` batches and on an epoch's last batch whether or
not the accumulation is complete there: an epoch of ``batches`` batches has ``ceil(batches / accumulate_grad_batches)``
steps. The LR schedule's epochs (imagenet_module), a converted main_amp.py checkpoint's step count (legacy_checkpoint)
and the profiler window's ``min_epochs`` check (callbacks/profiler_window) count in these steps. A module of its own
so that the callbacks and the converter need not import imagenet_module, which imports the callbacks package (a cycle).
"""

from __future__ import annotations

import math


def optimizer_steps_per_epoch(batches: int, accumulate_grad_batches: int) -> int:
    """The optimizer steps of an epoch of ``batches`` training batches (at least 1, finite) under
    ``accumulate_grad_batches``."""
    return math.ceil(batches / accumulate_grad_batches)
