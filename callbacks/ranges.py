"""A stack of named ranges emitted as NVTX push/pop ranges and, while a Kineto trace records, as ``record_function``.

NVTX push/pop ranges are per thread and must be popped in LIFO order, also when an exception unwinds the step:
the stack remembers what it pushed so that ``close_all`` pops exactly that, no more (popping a range somebody else
pushed corrupts their nesting) and no less (an unpopped range swallows the rest of the timeline in Nsight Systems).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any

import nvtx
import torch


@dataclass
class _Open:
    name: str
    kineto: Any  # an entered torch.profiler.record_function, or None


class RangeStack:
    """Pushes and pops named ranges on the calling thread.

    Args:
        enabled: Emit NVTX ranges. When false only Kineto annotations are made (while one records).
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.kineto = False  # set while a torch.profiler trace records, to mirror ranges into it
        self._open: list[_Open] = []

    @property
    def names(self) -> list[str]:
        """Names of the open ranges, outermost first."""
        return [entry.name for entry in self._open]

    def top(self) -> str | None:
        return self._open[-1].name if self._open else None

    def push(self, name: str) -> None:
        if self.enabled:
            nvtx.push_range(name)
        kineto = None
        if self.kineto:
            kineto = torch.profiler.record_function(name)
            kineto.__enter__()
        self._open.append(_Open(name, kineto))

    def pop(self, name: str) -> None:
        """Pops the innermost range, which must be ``name`` (a mismatch is a bug in the caller's hook order)."""
        if not self._open or self._open[-1].name != name:
            raise RuntimeError(f"range stack: expected to close {name!r}, open ranges are {self.names}")
        self._pop_one()

    def pop_if_top(self, name: str) -> bool:
        if self.top() == name:
            self._pop_one()
            return True
        return False

    def close_all(self) -> None:
        """Pops every range this stack opened, innermost first."""
        while self._open:
            self._pop_one()

    def _pop_one(self) -> None:
        entry = self._open.pop()
        if entry.kineto is not None:
            entry.kineto.__exit__(None, None, None)
        if self.enabled:
            nvtx.pop_range()


#: The ranges of what runs between two training steps (bench/check_nsys.py accepts kernels inside them).
VALIDATION = "validation"
EPOCH_END = "epoch end"
#: The range around every checkpoint save of the app (ResumableCheckpoint, the preemption save): it runs where no step
#: range is open (checkpoint callbacks run after the step closes), with the device-to-host copies of the whole state.
CHECKPOINT = "checkpoint"
#: The range around the module's metrics reduction on the log steps (every ``trainer.log_every_n_steps``): Lightning
#: calls the module's ``on_train_batch_end`` after the callbacks' (the step range is closed by then); the reduction is
#: a few kernels, an all-reduce under DDP and the interval's one host sync. Part of the steady state, so not a gap of
#: the step report (it stays in images/s), but named on the timeline.
METRICS = "metrics"
#: The range inside a step around an epoch's first fetch (also the first after a start or resume): the loader's
#: workers start on the epoch's order and the fetch waits for them (hundreds of ms), a cost of the epoch boundary that
#: the step report moves out of the step.
EPOCH_START = "epoch start"


@contextmanager
def app_range(name: str) -> Iterator[None]:
    """An NVTX range ``name`` around work outside the step ranges (:data:`CHECKPOINT`, :data:`METRICS`), balanced also
    when the work raises; also a ``record_function`` of that name, which a Kineto trace records when one is on
    (outside a trace it records nothing)."""
    nvtx.push_range(name)
    try:
        with torch.profiler.record_function(name):
            yield
    finally:
        nvtx.pop_range()


def checkpoint_range() -> AbstractContextManager[None]:
    """:func:`app_range` of a checkpoint save."""
    return app_range(CHECKPOINT)
