"""``data.worker_nice``: loader workers at a lower CPU priority than the training process.

With ``data.decode: gpu`` on an H200 machine's 16 cores, 14 loader workers decode their share of the JPEGs beside the
training process, whose two busy threads (the training step's launches and the prefetcher's decode) need a core each,
when they need it: a step whose launches wait for a core leaves the GPU idle, while a worker that waits a few
milliseconds only eats into the batches it has loaded ahead (``data.prefetch_factor``). Linux shares a busy machine by
weight, and a nice value of 10 weighs about a tenth of 0, so the workers still get every core the training process
leaves free. ``os.nice`` in a worker changes that worker alone: the training process keeps its own priority, and
raising it back needs privileges no run should ask for.
"""

from __future__ import annotations

import os
from collections.abc import Callable

#: The values ``data.worker_nice`` takes: 0 (the training process's own priority) to 19, the lowest Linux has.
NICE_RANGE = range(20)


def check_worker_nice(value: object) -> int:
    """``value`` if it is a valid ``data.worker_nice``; a ValueError that says what is valid otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value not in NICE_RANGE:
        raise ValueError(
            f"data.worker_nice must be an integer from 0 (the workers keep the training process's priority) to 19 "
            f"(the lowest), got {value!r}"
        )
    if value and not hasattr(os, "nice"):
        raise ValueError(f"data.worker_nice {value} needs os.nice, which this platform lacks; leave it 0")
    return value


class LowerWorkerPriority:
    """``worker_init_fn`` that adds ``nice`` to the worker's nice value, then runs ``inner``.

    A class, not a closure, so that workers started with ``spawn`` or ``forkserver`` can unpickle it.

    Args:
        nice: What to add to the worker's nice value (1 to 19; the kernel caps the sum at 19).
        inner: A ``worker_init_fn`` to run afterwards (e.g. the signal shield and Lightning's seeding).
    """

    def __init__(self, nice: int, inner: Callable[[int], None] | None = None) -> None:
        self.nice = check_worker_nice(nice)
        self.inner = inner

    def __call__(self, worker_id: int) -> None:
        os.nice(self.nice)
        if self.inner is not None:
            self.inner(worker_id)
