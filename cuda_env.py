"""CUDA settings of the process that take effect only if they are in place before CUDA starts.

``CUDA_DEVICE_MAX_CONNECTIONS`` is how many hardware work queues the host's streams are spread over (CUDA's default
8, at most 32). Streams beyond that share a queue, and a queue runs its work in order: work on one stream then waits
for whatever another stream sharing its queue queued before it. nvJPEG's batched hardware decoder spreads a call over
about 14 streams of its own, so with 8 queues its copies and colour conversions wait behind the training step's
kernels. On an H200 (bench/RESULTS.md, sixteenth session), 128 JPEGs took nvJPEG's call 197 ms with a stream of large
matrix products queued beside it and 20 ms with 32 queues (8.5 ms on an idle GPU); the call spins on the producer
thread's core while it waits. So the app asks for 32 queues unless the environment already sets a value.

The driver reads the variable when CUDA starts in the process; setting it later changes nothing. :func:`request` is
the first thing ``train.py`` does (Lightning's DDP launcher and torchrun pass the environment on to every rank).
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import MutableMapping

#: The variable, and the number of queues the app asks for: CUDA's largest.
MAX_CONNECTIONS = "CUDA_DEVICE_MAX_CONNECTIONS"
CONNECTIONS = 32
#: CUDA's own default when the variable is not set.
CUDA_DEFAULT_CONNECTIONS = 8


def connections(environ: MutableMapping[str, str] | None = None) -> int:
    """The number of queues ``environ`` (default ``os.environ``) asks CUDA for: its value, or CUDA's default 8.

    Raises ValueError, naming the variable, for a value CUDA does not take (not a whole number from 1 to 32).
    """
    environ = os.environ if environ is None else environ
    value = environ.get(MAX_CONNECTIONS)
    if not value:  # unset, or set empty (``VAR= cmd``): CUDA's default
        return CUDA_DEFAULT_CONNECTIONS
    try:
        count = int(value)
    except ValueError:
        count = 0
    if not 1 <= count <= CONNECTIONS:
        raise ValueError(
            f"{MAX_CONNECTIONS}={value!r}: CUDA takes a whole number from 1 to {CONNECTIONS} (the app asks for "
            f"{CONNECTIONS})"
        )
    return count


def request(environ: MutableMapping[str, str] | None = None) -> int:
    """Sets ``CUDA_DEVICE_MAX_CONNECTIONS`` to :data:`CONNECTIONS` in ``environ`` (default ``os.environ``) unless it
    is set already (a value the user chose is kept, checked; an empty one counts as unset); returns the value asked
    for. Call it before CUDA starts: when this process has started CUDA already, the new value reaches only the
    processes it starts, and a warning says so."""
    environ = os.environ if environ is None else environ
    if environ.get(MAX_CONNECTIONS):
        return connections(environ)
    environ[MAX_CONNECTIONS] = str(CONNECTIONS)
    torch = sys.modules.get("torch")  # not imported: CUDA cannot have started
    if environ is os.environ and torch is not None and torch.cuda.is_initialized():
        warnings.warn(
            f"{MAX_CONNECTIONS}={CONNECTIONS} was set after CUDA started in this process, which keeps CUDA's "
            f"{CUDA_DEFAULT_CONNECTIONS} hardware queues; set it in the environment before the process starts",
            stacklevel=2,
        )
    return CONNECTIONS
