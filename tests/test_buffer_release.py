"""The host buffers of the GPU decode path's packed batches: freed after their work, on the releaser thread, without
taking another tensor's data (buffer_release.py)."""

from __future__ import annotations

import threading

import pytest
import torch

import buffer_release
from buffer_release import release_host_buffer


def test_cuda_batches_buffers_are_released_on_the_releaser_thread_once_their_work_is_done(monkeypatch):

    released: list[tuple[str, int]] = []
    real = buffer_release.release_host_buffer

    def spy(buffer: torch.Tensor) -> bool:
        released.append((threading.current_thread().name, buffer.numel()))
        return real(buffer)

    class Event:  # stands in for a CUDA event: whether the batch's work has passed
        def __init__(self, done: bool) -> None:
            self.done = done

        def query(self) -> bool:
            return self.done

    monkeypatch.setattr(buffer_release, "release_host_buffer", spy)
    monkeypatch.setattr(buffer_release._PendingRelease, "pending", [])
    done, busy = (torch.ones(2**20, dtype=torch.uint8).share_memory_() for _ in range(2))
    busy_event = Event(False)
    buffer_release._PendingRelease.pending += [(Event(True), done), (busy_event, busy)]
    assert buffer_release.release_pending(wait=True) == 1  # the one whose work is still queued waits
    assert done.numel() == 0 and busy.numel() == 2**20
    assert released == [("HostBufferReleaser", 2**20)]  # not the caller's thread: the producer does not pay for it
    busy_event.done = True
    assert buffer_release.release_pending(wait=True) == 0 and busy.numel() == 0
    cpu = torch.ones(16, dtype=torch.uint8)
    buffer_release.release_later(cpu, torch.device("cpu"))  # a CPU batch: released by the caller, at once
    assert cpu.numel() == 0 and released[-1] == (threading.current_thread().name, 16)


def test_a_failed_release_reaches_the_producer_and_the_releaser_goes_on(monkeypatch):

    real = buffer_release.release_host_buffer

    def failing(buffer: torch.Tensor) -> bool:
        if buffer.numel() == 7:
            raise ValueError("cannot free this one")
        return real(buffer)

    monkeypatch.setattr(buffer_release, "release_host_buffer", failing)
    bad, good = torch.ones(7, dtype=torch.uint8), torch.ones(9, dtype=torch.uint8).share_memory_()
    buffer_release._Releaser.hand_over([bad, good])
    with pytest.raises(RuntimeError, match="freeing the host buffer of a batch failed: cannot free this one"):
        buffer_release._Releaser.wait()  # raised once, where the producer would see it; not a hang
    assert good.numel() == 0 and buffer_release._Releaser.inflight == 0
    later = torch.ones(9, dtype=torch.uint8).share_memory_()
    buffer_release._Releaser.hand_over([later])  # the thread survived the error
    buffer_release._Releaser.wait()
    assert later.numel() == 0 and buffer_release._Releaser.thread.is_alive()


def test_a_forked_child_starts_the_releaser_afresh():
    import os
    import signal

    buffer_release._Releaser.hand_over([torch.ones(4, dtype=torch.uint8).share_memory_()])
    buffer_release._Releaser.wait()
    with buffer_release._Releaser.cond:  # forked while another thread holds the lock: the child must not inherit it
        pid = os.fork()
        if pid == 0:  # pragma: no cover (the child: it must never return into pytest)
            code = 1
            try:
                signal.alarm(20)  # a child that inherited the held lock would hang: let it die instead
                ok = buffer_release._Releaser.thread is None and buffer_release._Releaser.inflight == 0
                child = torch.ones(4, dtype=torch.uint8).share_memory_()
                buffer_release._Releaser.hand_over([child])
                buffer_release._Releaser.wait()
                code = 0 if ok and child.numel() == 0 else 1
            finally:
                os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_where_no_thread_can_start_the_caller_releases(monkeypatch):

    def refuse(self) -> None:
        raise RuntimeError("can't create new thread at interpreter shutdown")

    monkeypatch.setattr(buffer_release._Releaser, "thread", None)
    monkeypatch.setattr(threading.Thread, "start", refuse)
    buffer = torch.ones(4, dtype=torch.uint8).share_memory_()
    buffer_release._Releaser.hand_over([buffer])
    assert buffer.numel() == 0 and buffer_release._Releaser.inflight == 0 and buffer_release._Releaser.thread is None


def test_a_shared_buffer_is_freed_unless_another_tensor_still_reads_it():
    alone = torch.arange(3 * 2**20, dtype=torch.int32).to(torch.uint8).share_memory_()
    assert release_host_buffer(alone) and alone.numel() == 0  # its pages went back (madvise on Linux)

    viewed = torch.full((3 * 2**20,), 7, dtype=torch.uint8).share_memory_()
    view = viewed[4096:]
    assert not release_host_buffer(viewed) and viewed.numel() == 0
    assert bool((view == 7).all())  # the other tensor keeps its data: only the first lost its storage

    private = torch.ones(4096, dtype=torch.uint8)  # not shared memory: nothing to free early
    assert not release_host_buffer(private) and private.numel() == 0
