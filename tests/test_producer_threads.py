"""producer_threads.ordered_map: several threads, one iterator, results in order, errors in place, clean stops."""

from __future__ import annotations

import contextlib
import random
import threading
import time

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from producer_threads import ordered_map


def alive(prefix: str) -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(prefix)]


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_results_come_in_the_items_order_whatever_thread_finishes_first(threads: int) -> None:
    delays = random.Random(threads).choices([0.0, 0.001, 0.004], k=40)

    def work(k: int, item: int) -> tuple[int, int, str]:
        time.sleep(delays[item])  # later items often finish before earlier ones
        return item, k, threading.current_thread().name

    results = list(ordered_map(range(40), work, threads, name="om-order"))
    assert [item for item, _, _ in results] == list(range(40))
    # Item i on thread i % threads, each thread named after its index.
    assert [k for _, k, _ in results] == [i % threads for i in range(40)]
    names = {name for _, _, name in results}
    assert names == ({"om-order"} if threads == 1 else {f"om-order-{k}" for k in range(threads)})
    assert not alive("om-order")


def test_two_threads_work_at_the_same_time() -> None:
    """Each item waits until two are in work at once: on threads that took turns this would time out."""
    both = threading.Barrier(2, timeout=10)

    def work(k: int, item: int) -> int:
        both.wait()
        return item * 10

    assert list(ordered_map(range(6), work, 2, name="om-overlap")) == [0, 10, 20, 30, 40, 50]


def test_the_iterator_is_advanced_by_one_thread_at_a_time_off_the_callers_thread() -> None:
    caller = threading.get_ident()
    seen: list[int] = []
    inside = threading.Lock()

    def items():
        for i in range(30):
            assert inside.acquire(blocking=False), "two threads advanced the iterator at once"
            seen.append(threading.get_ident())
            time.sleep(0.0005)
            inside.release()
            yield i

    assert list(ordered_map(items(), lambda k, i: i, 3, name="om-iter")) == list(range(30))
    assert caller not in seen and len(set(seen)) == 3


def test_an_error_in_work_is_raised_at_its_items_place() -> None:
    def work(k: int, item: int) -> int:
        if item == 5:
            raise KeyError("item five")
        return item

    got = []
    with pytest.raises(KeyError, match="item five"):
        for value in ordered_map(range(20), work, 2, name="om-work-error"):
            got.append(value)
    assert got == [0, 1, 2, 3, 4]
    assert not alive("om-work-error")


def test_an_error_of_the_iterator_is_raised_at_its_place_and_nothing_after_it_is_taken() -> None:
    taken = []

    def items():
        for i in range(10):
            if i == 4:
                raise OSError("the loader failed")
            taken.append(i)
            yield i

    got = []
    with pytest.raises(OSError, match="the loader failed"):
        for value in ordered_map(items(), lambda k, i: i, 3, name="om-iter-error"):
            got.append(value)
    assert got == taken == [0, 1, 2, 3]
    assert not alive("om-iter-error")


def test_stopping_early_joins_every_thread_and_takes_at_most_a_few_items_ahead() -> None:
    taken = []

    def items():
        for i in range(1000):
            taken.append(i)
            yield i

    results = ordered_map(items(), lambda k, i: i, 2, name="om-early")
    assert [next(results) for _ in range(3)] == [0, 1, 2]
    results.close()
    assert not alive("om-early")
    # One item in hand per thread and one result waiting per thread beyond what was consumed, at most.
    assert len(taken) <= 3 + 2 * 2


def test_each_thread_works_inside_its_context() -> None:
    log: list[tuple[str, int]] = []
    inside = threading.local()

    class Context:
        def __init__(self, k: int) -> None:
            self.k = k

        def __enter__(self) -> None:
            inside.k = self.k
            log.append(("enter", self.k))

        def __exit__(self, *exc: object) -> None:
            log.append(("exit", self.k))
            del inside.k

    def work(k: int, item: int) -> int:
        assert inside.k == k  # entered on this very thread, not yet left
        log.append(("work", k))
        return item

    assert list(ordered_map(range(7), work, 3, name="om-ctx", thread_context=Context)) == list(range(7))
    for k in range(3):
        mine = [what for what, thread in log if thread == k]
        assert mine[0] == "enter" and mine[-1] == "exit" and mine[1:-1] == ["work"] * len(range(k, 7, 3))


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("failing", [0, 1])
def test_a_context_that_cannot_be_entered_is_raised_not_an_empty_sequence(threads: int, failing: int) -> None:
    """The context's failure has no item's place; the sequence ends, and the caller gets the error, never a short
    sequence that looks complete (the thread that failed may be any)."""
    failing = min(failing, threads - 1)

    @contextlib.contextmanager
    def context(k: int):
        if k == failing:
            raise RuntimeError(f"no stream for thread {k}")
        time.sleep(0.01)  # the others start later: the failure comes first
        yield

    with pytest.raises(RuntimeError, match=f"no stream for thread {failing}"):
        list(ordered_map(range(10), lambda k, i: i, threads, name="om-ctx-enter", thread_context=context))
    assert not alive("om-ctx-enter")


def test_a_context_that_fails_on_leaving_is_raised_after_the_results() -> None:
    @contextlib.contextmanager
    def context(k: int):
        yield
        if k == 1:
            raise OSError("could not leave")

    got = []
    with pytest.raises(OSError, match="could not leave"):
        for value in ordered_map(range(10), lambda k, i: i, 2, name="om-ctx-exit", thread_context=context):
            got.append(value)
    assert got == list(range(10))


def test_an_empty_iterable_and_fewer_items_than_threads() -> None:
    assert list(ordered_map([], lambda k, i: i, 3, name="om-empty")) == []
    assert list(ordered_map([7], lambda k, i: i, 3, name="om-one")) == [7]
    assert not alive("om-empty") and not alive("om-one")


def test_a_data_loader_with_workers_gives_every_batch_once_in_order_epoch_after_epoch() -> None:
    """The prefetcher's use: a DataLoader (two worker processes, persistent), iterated again for a second epoch."""
    loader = DataLoader(
        TensorDataset(torch.arange(64)), batch_size=4, num_workers=2, persistent_workers=True, shuffle=False
    )
    for _ in range(2):
        batches = list(ordered_map(loader, lambda k, batch: batch[0].clone(), 2, name="om-loader"))
        assert torch.equal(torch.cat(batches), torch.arange(64))
    # Stopped early (Lightning's max_steps, an exit after a profiling window): the threads are done with the
    # loader's iterator when close returns, so the next epoch starts afresh, whole and in order.
    early = ordered_map(loader, lambda k, batch: batch[0].clone(), 2, name="om-loader")
    assert torch.equal(next(early), torch.arange(4))
    early.close()
    batches = list(ordered_map(loader, lambda k, batch: batch[0].clone(), 2, name="om-loader"))
    assert torch.equal(torch.cat(batches), torch.arange(64))
    assert not alive("om-loader")


@pytest.mark.parametrize("threads", [0, -1, 1.5, True, "2"])
def test_a_thread_count_below_one_or_not_an_integer_is_refused(threads: object) -> None:
    with pytest.raises(ValueError, match="threads must be an integer >= 1"):
        next(ordered_map(range(3), lambda k, i: i, threads))  # type: ignore[arg-type]
