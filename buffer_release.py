"""Freeing the host buffers of the GPU decode path's packed batches, off the threads that set the pace.

A batch of ``data.decode: gpu`` comes from a loader worker as one buffer in shared memory
(:class:`~encoded_batch.PackedBatch`). Once the GPU stage (gpu_decode.py) has taken what it needs from it, the buffer
goes back: after the work queued on the device that may read it (:func:`release_later`, :func:`release_pending`), on a
thread of its own (:class:`_Releaser`), with its pages freed without the GIL (:func:`release_host_buffer`).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
import threading
from typing import Any

import torch

#: ``madvise`` advice that frees a shared mapping's pages and their backing store (Linux, tmpfs/shmem).
_MADV_REMOVE = 9
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def release_host_buffer(buffer: torch.Tensor) -> bool:
    """Empties ``buffer`` (``set_()``) and, when it is the only tensor on shared memory, frees its pages first with
    ``madvise(MADV_REMOVE)``; returns whether it did the latter.

    A batch that came from a worker lives in shared memory, and its Python storage object outlives the tensor, so the
    last reference drops with the GIL held whichever way it goes (``del`` or ``set_()``), and the unmapping, 3-6 ms
    a batch in the H200 trace, held up the training thread's launches. ``madvise`` through ctypes runs without the
    GIL (ctypes releases it for the call) and leaves the unmapping little to do (``bench/host_release.py`` measures
    both). Another tensor on the same storage would lose its data, so then only ``set_()`` runs.
    """
    freed = False
    use_count = getattr(torch._C, "_storage_Use_Count", None)  # private: without it, only set_()
    if _libc is not None and use_count is not None and buffer.is_shared() and buffer.numel():
        storage = buffer.untyped_storage()
        # The tensor and the storage object just taken: anything more is another view.
        if use_count(storage._cdata) <= 2:
            page = mmap.PAGESIZE
            begin = -(-storage.data_ptr() // page) * page  # whole pages inside the storage only
            end = (storage.data_ptr() + storage.nbytes()) // page * page
            if end > begin:
                freed = _libc.madvise(ctypes.c_void_p(begin), ctypes.c_size_t(end - begin), _MADV_REMOVE) == 0
        del storage
    buffer.set_()
    return freed


class _PendingRelease:
    """Host buffers of packed batches waiting until nothing queued on the device can read them.

    On CUDA the whole buffer leaves through one CPU copy into page-locked memory (gpu_decode.py's ``_staged``), and
    the device reads only that copy, so nothing queued should read the buffer. It is still released only once an
    event recorded after its batch's work on the current stream has passed (in practice at the next batch): that costs
    nothing and keeps it safe from any copy that reads it in place, as on systems that share memory between CPU and
    GPU. One list for all devices and loaders (the train and val producers may overlap).
    """

    lock = threading.Lock()
    pending: list[tuple[Any, torch.Tensor]] = []


class _Releaser:
    """One daemon thread that frees the buffers of CUDA batches, off the producer thread.

    Freeing a batch's pages (``madvise``) took 4.4-5.5 ms of the producer thread's CPU a batch in H200 runs of the
    compiled decode split, where that thread set the pace (bench/RESULTS.md, fifteenth session). The call holds no
    GIL, so this thread takes it off the critical path. Started at the first hand-over; a process forked after it
    starts afresh (threads and the lock's state do not carry over a fork). Where no thread can start (interpreter
    shutdown) the caller releases. A failed release is raised to the next caller of :meth:`hand_over` or
    :meth:`wait`, as it was raised to the producer when that thread released its buffers itself.
    """

    cond = threading.Condition()
    jobs: list[torch.Tensor] = []
    inflight = 0  # buffers handed over and not yet released
    thread: threading.Thread | None = None
    error: BaseException | None = None  # the first failed release, not yet raised

    @classmethod
    def reset(cls) -> None:
        cls.cond = threading.Condition()
        cls.jobs, cls.inflight, cls.thread, cls.error = [], 0, None, None

    @classmethod
    def hand_over(cls, buffers: list[torch.Tensor]) -> None:
        with cls.cond:
            if cls.thread is None or not cls.thread.is_alive():
                cls.thread = threading.Thread(target=cls._run, name="HostBufferReleaser", daemon=True)
                try:
                    cls.thread.start()
                except RuntimeError:  # "can't create new thread at interpreter shutdown"
                    cls.thread = None
            if cls.thread is not None:
                cls.jobs.extend(buffers)
                cls.inflight += len(buffers)
                cls.cond.notify_all()
                cls._raise_error()
                return
        for buffer in buffers:
            release_host_buffer(buffer)

    @classmethod
    def _run(cls) -> None:
        while True:
            with cls.cond:
                cls.cond.wait_for(lambda: bool(cls.jobs))
                jobs, cls.jobs = cls.jobs, []
            count = len(jobs)
            try:
                while jobs:
                    buffer = jobs.pop()  # no reference of this thread outlives its release
                    try:
                        release_host_buffer(buffer)
                    except BaseException as error:  # kept for the producer; this thread goes on
                        with cls.cond:
                            cls.error = cls.error or error
                    del buffer
            finally:
                with cls.cond:
                    cls.inflight -= count
                    cls.cond.notify_all()

    @classmethod
    def wait(cls) -> None:
        with cls.cond:
            cls.cond.wait_for(lambda: cls.inflight == 0)
            cls._raise_error()

    @classmethod
    def _raise_error(cls) -> None:
        """Raises the kept error once (the caller holds ``cond``)."""
        error, cls.error = cls.error, None
        if error is not None:
            raise RuntimeError(f"freeing the host buffer of a batch failed: {error}") from error


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_Releaser.reset)


def release_later(buffer: torch.Tensor, device: torch.device) -> None:
    """Queues ``buffer`` for :func:`release_host_buffer` after the work queued so far on ``device``'s current stream
    (at once on the CPU), and releases the buffers queued before whose work has finished."""
    event = None
    if device.type == "cuda":
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(device))
    with _PendingRelease.lock:
        _PendingRelease.pending.append((event, buffer))
    release_pending()


def release_pending(wait: bool = False) -> int:
    """Releases every queued buffer whose work has finished; returns how many are still waiting for their work.

    A CPU batch's buffer is released here; a CUDA batch's by the :class:`_Releaser` thread, so the caller (the
    producer thread) does not spend the time. ``wait``: return only once that thread has released what it was given.
    """
    with _PendingRelease.lock:
        waiting, ready = [], []
        for item in _PendingRelease.pending:
            (ready if item[0] is None or item[0].query() else waiting).append(item)
        _PendingRelease.pending = waiting
    threaded = [buffer for event, buffer in ready if event is not None]
    if threaded:
        _Releaser.hand_over(threaded)
    for event, buffer in ready:
        if event is None:
            release_host_buffer(buffer)
    del ready, threaded
    if wait:
        _Releaser.wait()
    return len(waiting)
