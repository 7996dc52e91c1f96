"""The application's own gloo process groups under DDP, beside Lightning's default group (NCCL on GPUs).

Two parts of the app run collectives of their own: the preemption handler's signal exchange
(``callbacks/preemption.py``) and the sum of the epoch's loss at a checkpoint (``step_metrics.py``). Each makes its own
group, so that its collectives never pair with another's on the default group, and on the host: CPU tensors, no GPU
stream involved.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytorch_lightning as pl
import torch.distributed as dist


def new_gloo_group(trainer: pl.Trainer) -> Any:
    """A gloo group of every rank, whose operations time out as the DDP strategy's do (a rank that never joins one
    fails the others within the job's bound). A collective itself: every rank calls it at the same point."""
    # The DDP strategy keeps its timeout private (Lightning's default is 30 minutes; --trainer.strategy.timeout).
    timeout = getattr(trainer.strategy, "_timeout", None)
    return dist.new_group(backend="gloo", timeout=timeout if isinstance(timeout, timedelta) else None)
