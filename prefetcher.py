"""Device-side input pipeline: the next batch is copied and normalized while the current one computes.

This is apex's ``data_prefetcher`` done inside Lightning. Workers hand over uint8 NCHW batches (see
``datamodule.fast_collate``): four times fewer bytes than float32 to pin and copy. On CUDA the copy is issued
``non_blocking`` from pinned memory on a side stream, and the cast, normalization and memory-format change run on
that stream too, so the compute stream only ever waits on an event, never on the host. The consumer stream waits
for the side stream when a batch is handed out, and ``record_stream`` tells the caching allocator that the batch is
in use on the consumer stream, so its memory is not reused by the next copy while a kernel still reads it (timm's
loader leaves this out; apex had it).

On CPU the same class runs synchronously: same output, no streams.

The wrapper proxies ``sampler``, ``batch_sampler``, ``dataset`` and ``__len__`` so that Lightning treats it as the
loader it wraps: it calls ``set_epoch`` on the ``DistributedSampler`` through it and sizes epochs with it.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from producer_threads import ordered_map

#: ImageNet channel statistics on the 0..255 scale of the uint8 batches.
IMAGENET_MEAN_255 = (0.485 * 255, 0.456 * 255, 0.406 * 255)
IMAGENET_STD_255 = (0.229 * 255, 0.224 * 255, 0.225 * 255)


#: Priority of the prefetcher's side stream (lower is more urgent; PyTorch keeps stream pools at 0, -1, -2 and -3).
#: Read when a prefetcher is made; ``bench/producer_timing.py --side-priority`` sets it for a side-by-side run.
SIDE_STREAM_PRIORITY = 0


#: The producer thread's name in the OS (at most 15 bytes): top, /proc, py-spy and Nsight Systems' thread rows show it.
PRODUCER_THREAD_NAME = "prefetcher"


def name_os_thread(name: str) -> None:
    """Gives the calling thread ``name`` in the OS (Linux, cut to 15 bytes), so that tools outside Python tell it apart:
    before Python 3.14 a ``threading.Thread``'s name stays inside Python and every thread shows the process's name.
    Does nothing on other systems or where the call fails."""
    if sys.platform != "linux":
        return
    try:
        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # 15: PR_SET_NAME
    except (OSError, AttributeError):
        pass


def normalize(
    images: torch.Tensor,
    mean: torch.Tensor,
    std: torch.Tensor,
    memory_format: torch.memory_format = torch.contiguous_format,
) -> torch.Tensor:
    """Casts a uint8 NCHW batch to float32 and normalizes it per channel; ``mean``/``std`` are on the 0..255 scale."""
    out = images.to(memory_format=memory_format).float()
    return out.sub_(mean).div_(std)


@dataclass
class CopyEvents:
    """CUDA events around one batch's trip to the device, recorded on the prefetcher's side stream.

    ``start`` is recorded before the host-to-device copy (or the GPU decode), ``copied`` after it, ``done`` after the
    cast and normalization; ``issued`` is the host ``time.perf_counter()`` at ``start``; ``pinned`` tells whether the
    host images were in page-locked memory (``None`` when they are not a tensor: encoded files for the GPU decoder).
    """

    start: Any  # torch.cuda.Event
    copied: Any
    done: Any
    issued: float
    pinned: bool | None
    nbytes: int


class LoaderProxy:
    """Stands in for the loader it wraps: ``sampler``, ``batch_sampler``, ``dataset`` and ``len`` are the loader's.

    Lightning calls ``set_epoch`` on ``sampler``/``batch_sampler.sampler`` and sizes epochs with ``len``; a wrapper
    that hid them would silently repeat one shuffle order every epoch under DDP.
    """

    loader: Any

    @property
    def sampler(self) -> Any:
        return getattr(self.loader, "sampler", None)

    @property
    def batch_sampler(self) -> Any:
        return getattr(self.loader, "batch_sampler", None)

    @property
    def dataset(self) -> Any:
        return getattr(self.loader, "dataset", None)

    def __len__(self) -> int:
        return len(self.loader)


class DevicePrefetcher(LoaderProxy):
    """Wraps a loader of ``(uint8 images, int64 targets)`` batches and yields normalized batches on ``device``.

    Args:
        loader: The data loader (or any iterable with a length) yielding uint8 NCHW image batches and targets.
        device: Where batches go. On CUDA the copy and normalization overlap compute on a side stream.
        mean: Per-channel mean on the 0..255 scale.
        std: Per-channel standard deviation on the 0..255 scale.
        channels_last: Hand batches out in ``torch.channels_last`` memory format.
        decoder: Turns what the loader yields as images into float32 images on the device (0..255), e.g.
            ``gpu_decode.decode_batch``; called as ``decoder(images, device)`` on CPU and with one producer, and as
            ``decoder(images, device, lane=k)`` on producer ``k`` of several, so that it keeps its state (a stream, an
            nvJPEG decoder) per thread. ``None``: the images are uint8 batches, copied.
        producers: With a decoder on CUDA, how many threads decode batches at once, each on its own side stream
            (batches still come out in the loader's order). Ignored without a decoder or on CPU.
    """

    def __init__(
        self,
        loader: Iterable,
        device: torch.device | str,
        mean: Sequence[float] = IMAGENET_MEAN_255,
        std: Sequence[float] = IMAGENET_STD_255,
        channels_last: bool = False,
        decoder: Callable[..., torch.Tensor] | None = None,
        producers: int = 1,
    ) -> None:
        if isinstance(producers, bool) or not isinstance(producers, int) or producers < 1:
            raise ValueError(f"producers must be an integer >= 1 (threads that decode batches), got {producers!r}")
        self.loader = loader
        self.decoder = decoder
        self.device = torch.device(device)
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.mean = torch.tensor(mean, device=self.device, dtype=torch.float32).view(1, -1, 1, 1)
        self.std = torch.tensor(std, device=self.device, dtype=torch.float32).view(1, -1, 1, 1)
        self.is_cuda = self.device.type == "cuda"
        # A side stream per producer: one producer's batches are serialized on its stream. With one producer (and
        # always without a decoder) that keeps at most one batch in flight beyond the one being consumed; each more
        # producer (data.decode_threads) adds its own batches in flight (producer_threads.py).
        self.producers = producers if decoder is not None and self.is_cuda else 1
        self.streams = (
            [torch.cuda.Stream(device=self.device, priority=SIDE_STREAM_PRIORITY) for _ in range(self.producers)]
            if self.is_cuda
            else []
        )
        self.stream = self.streams[0] if self.streams else None
        #: While a list (the step report switches it on for a profiling window only), every CUDA batch appends its
        #: :class:`CopyEvents` to it; ``None`` costs nothing. list.append is atomic, also from the decode thread.
        self.timing: list[CopyEvents] | None = None
        self._iterations: weakref.WeakSet = weakref.WeakSet()  # generators handed out and not yet finished

    # --- iteration ------------------------------------------------------------------------------------
    def _to_device(self, batch: Sequence[Any], lane: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        images, targets = batch[0], batch[1]
        timing = self.timing if self.is_cuda else None
        if timing is not None:
            events = self._copy_started(images, targets)
        if self.decoder is not None:
            # float32 on the 0..255 scale, already on the device
            lanes = {"lane": lane} if self.producers > 1 else {}
            images = self.decoder(images, self.device, **lanes)
        else:
            images = images.to(self.device, non_blocking=True)
        targets = targets.to(self.device, non_blocking=True)
        if timing is not None:
            events.copied.record()
        out = normalize(images, self.mean, self.std, self.memory_format), targets
        if timing is not None:
            events.done.record()
            timing.append(events)
        return out

    @staticmethod
    def _copy_started(images: Any, targets: Any) -> CopyEvents:
        """Records the start event on the current (side) stream and notes what the host batch is."""
        parts = images if isinstance(images, tuple) else (images,)  # an encoded_batch.PackedBatch: its buffer
        tensors = [t for t in (*parts, targets) if isinstance(t, torch.Tensor)]
        pinned = images.is_pinned() if isinstance(images, torch.Tensor) else None
        nbytes = sum(t.nelement() * t.element_size() for t in tensors)
        start, copied, done = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        issued = time.perf_counter()
        start.record()
        return CopyEvents(start, copied, done, issued, pinned, nbytes)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        batches = self._batches()
        self._iterations.add(batches)
        return batches

    def close(self) -> None:
        """Ends every iteration still in progress and shuts down the wrapped loader's persistent workers.

        Lightning stops iterating at ``max_steps``, an exit after a profiling window or a preemption stop without
        closing the iterator, and it shuts down the workers only of loaders it sees as ``DataLoader`` s, which this
        wrapper hides. Left to garbage collection at interpreter exit, the workers would be terminated while the
        decode thread may still be reading from them. Called by the data module's ``teardown``.
        """
        for batches in list(self._iterations):
            batches.close()  # runs the generator's ``finally``: the decode thread is stopped and joined
        self._iterations.clear()
        loader = self.loader
        while loader is not None and not isinstance(loader, torch.utils.data.DataLoader):
            loader = getattr(loader, "loader", None)  # through the LoaderProxy wrappers
        iterator = getattr(loader, "_iterator", None)
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()
            loader._iterator = None

    def _batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if not self.is_cuda:
            for batch in self.loader:
                yield self._to_device(batch)
            return
        if self.decoder is not None:
            yield from self._threaded()
            return
        assert self.stream is not None
        iterator = iter(self.loader)
        pending = self._preload(iterator)
        while pending is not None:
            consumer = torch.cuda.current_stream(self.device)
            consumer.wait_stream(self.stream)
            images, targets = pending
            # The tensors were allocated on the side stream; without this the allocator could hand their memory to
            # the next copy as soon as this Python reference dies, while kernels on the consumer stream still read it.
            images.record_stream(consumer)
            targets.record_stream(consumer)
            pending = self._preload(iterator)
            yield images, targets

    def _preload(self, iterator: Iterator) -> tuple[torch.Tensor, torch.Tensor] | None:
        try:
            batch = next(iterator)
        except StopIteration:
            return None
        with torch.cuda.stream(self.stream):
            return self._to_device(batch)

    def _threaded(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Decodes on producer threads (``producers``, each with its own side stream): the decoder's host work (file
        bytes to nvJPEG, a few dozen launches per batch) then runs beside the training loop's own launches instead
        of in front of them, and several batches' at once (producer_threads.py)."""

        def on_thread(lane: int) -> contextlib.ExitStack:
            name_os_thread(PRODUCER_THREAD_NAME if self.producers == 1 else f"{PRODUCER_THREAD_NAME}-{lane}")
            stack = contextlib.ExitStack()
            stack.enter_context(torch.cuda.device(self.device))
            stack.enter_context(torch.cuda.stream(self.streams[lane]))
            return stack

        def produce(lane: int, batch: Any) -> tuple[torch.Tensor, torch.Tensor, torch.cuda.Event]:
            images, targets = self._to_device(batch, lane)
            ready = torch.cuda.Event()
            ready.record(self.streams[lane])
            return images, targets, ready

        batches = ordered_map(self.loader, produce, self.producers, name="DevicePrefetcher", thread_context=on_thread)
        try:
            for images, targets, ready in batches:
                consumer = torch.cuda.current_stream(self.device)
                consumer.wait_event(ready)
                images.record_stream(consumer)
                targets.record_stream(consumer)
                yield images, targets
        finally:
            # Also when the consumer stops early (exit after a profiling window): the producers must be done with
            # the loader's iterator before the next epoch asks the loader for a new one.
            batches.close()


class SyntheticBatches:
    """A fixed random batch that already lives on the device, handed out ``length`` times: the compute ceiling.

    Like DeepLearningExamples' synthetic backend: no decode, no copy, no normalization, so the step time is the
    model's alone. Images are drawn once from a normal distribution (what normalized inputs look like) and targets
    uniformly from ``num_classes``, with a fixed seed.

    Args:
        batch_size: Images per batch.
        image_size: Height and width.
        num_classes: Targets are drawn from ``range(num_classes)``.
        length: Batches per epoch.
        device: Where the batch lives.
        channels_last: Memory format of the images.
        seed: Seed of the generator that draws the batch.
    """

    def __init__(
        self,
        batch_size: int,
        image_size: int,
        num_classes: int,
        length: int,
        device: torch.device | str,
        channels_last: bool = False,
        seed: int = 0,
    ) -> None:
        self.length = length
        generator = torch.Generator().manual_seed(seed)
        images = torch.randn(batch_size, 3, image_size, image_size, generator=generator)
        targets = torch.randint(0, num_classes, (batch_size,), generator=generator)
        memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.images = images.to(device).contiguous(memory_format=memory_format)
        self.targets = targets.to(device)

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for _ in range(self.length):
            yield self.images, self.targets
