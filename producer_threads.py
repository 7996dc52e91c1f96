"""Several threads working on consecutive items of one iterable, their results handed out in the iterable's order.

The prefetcher's GPU decode path (``data.decode: gpu``) spends most of a batch's host time in nvJPEG's batched call
and in the launches of the crop stage; nvJPEG's call (through ctypes) and each PyTorch op release the GIL, so several
threads overlap there. With ``data.decode_threads`` the prefetcher decodes on that many threads. Measured on an H200
(bench/RESULTS.md, seventeenth session): two threads, each with its own nvJPEG decoder, decoded 1.67 times as many
JPEGs as one while the GPU trained (``bench/nvjpeg_under_load.py``); in training, eager ResNet-18 with every JPEG on
the GPU ran 1.02-1.26 times as fast with two threads (1.14 on average over four pairs, eighteenth session; three
threads: 0.99), with the split at 0.3 no faster, and compiled ResNet-50 gained nothing (0.99-1.01): there the decode
path's GPU work, not its thread, is what is left.

:func:`ordered_map` runs ``work`` on ``threads`` threads. Thread ``k`` takes items ``k``, ``k + threads``, ... from
the shared iterator, in turn, so the iterator is only ever advanced by one thread at a time and in order (a
``DataLoader`` iterator is not thread-safe, and its order is the sampler's). Each thread hands its results through a
queue of one, and the caller reads the queues in turn: the results come out in the items' order whatever thread
finishes first, and at most ``2 x threads`` results wait beyond the one being consumed (one in each queue, one more
finished on each thread). An exception from the iterator or from ``work`` is raised to the caller at its item's
place; one from a thread's context (entering or leaving it) ends the sequence and is raised where it ends. Closing
the generator (or leaving a ``for`` loop over it early) stops and joins every thread before it returns, so that
nothing still reads the iterator.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from typing import Any, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")

#: How often a thread blocked on a full queue or waiting for its turn looks whether it was stopped, in seconds.
POLL_S = 0.05


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


_END = object()


def ordered_map(
    items: Iterable[Item],
    work: Callable[[int, Item], Result],
    threads: int = 1,
    *,
    name: str = "ordered_map",
    thread_context: Callable[[int], AbstractContextManager[Any]] | None = None,
) -> Iterator[Result]:
    """Yields ``work(k, item)`` for every item of ``items``, in order, computed on ``threads`` threads.

    Args:
        items: What to work on. Iterated on the threads (the first thread's first turn calls ``iter``), never on the
            caller's thread.
        work: Called as ``work(k, item)`` on thread ``k`` (0 to ``threads - 1``); the item of position ``i`` goes to
            thread ``i % threads``.
        threads: How many threads (at least 1).
        name: The threads' Python names: ``name`` for one thread, ``name-k`` for several.
        thread_context: Entered by thread ``k`` around its whole life (e.g. its CUDA device and stream): called as
            ``thread_context(k)``.
    """
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be an integer >= 1, got {threads!r}")
    handoffs: list[queue.Queue] = [queue.Queue(maxsize=1) for _ in range(threads)]
    stop = threading.Event()
    turn = threading.Condition()
    state: dict[str, Any] = {"next": 0, "iterator": None, "ended": False}
    errors: list[BaseException] = []  # every thread's failure, also those no item's place reports (its context)

    def put(k: int, result: Any) -> None:
        while not stop.is_set():
            try:
                handoffs[k].put(result, timeout=POLL_S)
                return
            except queue.Full:
                continue

    def take(position: int) -> tuple[bool, Any]:
        """The item at ``position`` once it is this thread's turn: ``(True, item)``, or ``(False, None)`` at the end
        (the iterator ran out, failed, or the caller stopped). An error of the iterator is raised here."""
        with turn:
            while state["next"] != position and not state["ended"]:
                if stop.is_set():
                    return False, None
                turn.wait(POLL_S)
            if state["ended"] or stop.is_set():
                return False, None
            try:
                if state["iterator"] is None:
                    state["iterator"] = iter(items)
                item = next(state["iterator"])
            except StopIteration:
                state["ended"] = True
                return False, None
            except BaseException:
                state["ended"] = True  # the others stop taking items: this one's failure ends the sequence
                raise
            finally:
                turn.notify_all()
            state["next"] += 1
            return True, item

    def run(k: int) -> None:
        position = k
        try:
            with thread_context(k) if thread_context is not None else contextlib.nullcontext():
                while True:
                    more, item = take(position)
                    if not more:
                        break
                    result = work(k, item)
                    del item
                    put(k, result)
                    del result
                    position += threads
        except BaseException as error:  # handed to the caller, raised there with its traceback
            with turn:
                state["ended"] = True
                errors.append(error)
                turn.notify_all()
            put(k, _Failure(error))
        put(k, _END)

    started: list[threading.Thread] = []
    try:
        for k in range(threads):
            worker = threading.Thread(target=run, args=(k,), name=name if threads == 1 else f"{name}-{k}", daemon=True)
            worker.start()
            started.append(worker)
        k = 0
        while True:
            result = handoffs[k].get()
            if result is _END:
                break
            if isinstance(result, _Failure):
                raise result.error
            yield result
            del result
            k = (k + 1) % threads
    finally:
        # Also when the caller stops early: every thread must be done with the iterator before the caller asks the
        # iterable for a new one (the next epoch of a DataLoader).
        stop.set()
        for worker in started:
            worker.join()
    # The end, every thread joined. An error at an item's place was raised there; one that has no place (a thread's
    # context failed, so the sequence ended early, or failed on leaving it) is raised here, not lost.
    if errors:
        raise errors[0]
