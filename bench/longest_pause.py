"""The benchmarks' probe of a second thread: how long it waits, at most, between two iterations of its own loop.

A thread that needs the GIL, or a driver lock, for every iteration stalls while another thread holds it; its longest
gap between two iterations is then how long a training thread would have waited to launch its next kernel.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager


class LongestPause:
    """A thread that runs ``step`` in a loop (by default nothing: a pure Python loop) and records the longest gap
    between two iterations (``longest``, seconds), counted from a flag it sets after ``warmup_s`` of looping.

    Args:
        step: One iteration's work, e.g. a kernel launch.
        context: Entered in the thread around the loop, e.g. ``lambda: torch.cuda.stream(s)``.
        warmup_s: Looping before gaps count, so the thread's start is not one of them.
    """

    def __init__(
        self,
        step: Callable[[], object] = lambda: None,
        context: Callable[[], AbstractContextManager] = contextlib.nullcontext,
        warmup_s: float = 0.05,
    ) -> None:
        self.step, self.context, self.warmup_s = step, context, warmup_s
        self.longest = 0.0
        self.stop = threading.Event()
        self.started = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        warmup_end = time.perf_counter() + self.warmup_s
        with self.context():
            last = time.perf_counter()
            while not self.stop.is_set():
                self.step()
                now = time.perf_counter()
                if self.started.is_set():
                    self.longest = max(self.longest, now - last)
                elif now >= warmup_end:
                    self.started.set()
                last = now

    def __enter__(self) -> LongestPause:
        self.thread.start()
        if not self.started.wait(timeout=30):
            raise RuntimeError("the probe thread did not finish its warm-up within 30 s")
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
