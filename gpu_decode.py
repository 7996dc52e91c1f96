"""JPEG decoding and RandomResizedCrop + flip on the GPU (``data.decode: gpu``), for when CPU workers cannot keep up.

An H200 trains ResNet-50 faster (5,700-7,200 img/s) than 16 cores decode and crop with PIL (~3,500 img/s). Here the
workers only read the file and draw the augmentation: they parse the JPEG header (no pixel decode) to learn the size,
draw the RandomResizedCrop box and the flip exactly as torchvision would, and hand over the encoded bytes (one buffer
per batch, :class:`~encoded_batch.PackedBatch`; that side is encoded_batch.py). This module is the GPU side: the
prefetcher decodes the whole batch with nvJPEG
(``torchvision.io.decode_jpeg`` on a list, one batched call) and crops, resizes (bilinear, antialiased, as
``transforms.RandomResizedCrop`` on tensors), flips and normalizes on its side stream.

Files nvJPEG should not get (CMYK or YCCK JPEGs, PNGs named .JPEG, EXIF-rotated photos) are decoded by PIL in the worker
as before and travel as uint8 pixels; the GPU stage treats both kinds alike from the crop on.

Validation uses the same stage, exactly: ``Resize(s) + CenterCrop(c)`` of torchvision is one antialiased resize of the
whole image to the size ``Resize`` computes, of which the crop keeps ``c x c`` pixels at the offset ``CenterCrop``
rounds to. The resize is separable, so those output pixels read only a window of the source (each output pixel's
filter support, cut at the image's edges): the workers send that window as the box, with the resized size and the
crop's offset in it (:attr:`Encoded.resize`), and the filter weights (the fused kernel's and the matmuls') are those
of the whole-image resize at those rows and columns. On the CPU the result equals torchvision's ``Resize`` +
``CenterCrop`` on float tensors up to float rounding (``tests/test_gpu_decode.py``), and so ``data.cpu_decoder:
torchvision``'s validation up to its rounding to uint8.

**Splitting the decode between the workers and the GPU** (``data.cpu_decode_share``). On an H200 nvJPEG decodes on the
JPEG engines (torchvision creates its hardware backend; an nsys trace shows only its colour conversion on the SMs, ~0.3
ms a batch), but every JPEG also costs host work in the training process (headers, output buffers, the crop table)
beside the training thread, which needs the GIL to launch kernels, and nvJPEG frees device memory when images of new
sizes come; a free waits for the whole GPU and holds up the training thread's launches meanwhile
(``bench/nvjpeg_calls.py``; torchvision does not let the caller set nvJPEG's allocators). PIL in the workers costs the
training process nothing but ~3 ms of a core per image. With a share ``s``, the workers decode, crop, resize and flip
that share of the files exactly as ``data.decode: cpu`` does (same transforms, same per-sample random draws) and hand
the finished crops over as uint8 pixels; the GPU path takes the rest. Which files go to the CPU is a fixed function of
the class folder and file name (a hash below ``s``): independent of the worker, the rank, the epoch, resuming and where
the dataset is mounted, so runs stay reproducible. A collated batch (:class:`PackedBatch`) puts its finished crops first
and the encoded files after them, targets in the same order; the order within a batch does not matter to training or
metrics.

The crop, resize and flip of a batch are one launch on CUDA: :mod:`gpu_crop_kernel`'s Triton kernel computes each
output pixel straight from the decoded images with the same antialiased filter (:data:`CROP_KERNEL`). The per-image
loop of the first sessions (crop, cast, flip, ``F.interpolate`` per sample, ~6 ops each, ~1,500 per batch of 256)
held the GIL on the prefetcher's producer thread against the training thread's own launches; the batched torch ops
that replaced it, a fixed handful of launches a group of crops, still made 94 torch calls a batch of 128. Against
those, on an H200 the kernel's GPU time (a concatenation included where the images were decoded apart) is 0.53
instead of 0.83 ms a batch of 128, the call's host time (the host otherwise idle) 1.0 instead of 2.8-3.2 ms, the
stage's peak memory 59 instead of 221 MiB, and its pixels are float32 throughout (bench/RESULTS.md, thirty-eighth
session); the kernel's separable version takes 0.82 of that first version's GPU time (thirty-ninth session). The
batched torch ops do it on the CPU, where Triton cannot build its kernel (no C compiler for its launcher: one
warning), with :data:`CROP_KERNEL` ``torch`` and with ``gather="copy"`` (:func:`decode_crop_resize`):

1. gather: the crops of a group (below), padded to the group's largest, into one uint8 ``(n, Hp, 3, Wp)`` tensor.
   One index op reads row ``y`` of channel ``c`` of crop ``i`` from a sliding-window view of one flat buffer of the
   decoded images (``unfold``: one index per row, not per pixel): the buffer :mod:`nvjpeg_batched` decoded them into,
   or else the group's images concatenated (one ``torch.cat``).
2. resize: antialiased bilinear resizing is separable, ``out = Wy @ crop @ Wx^T`` with a ``(size, Hp)`` and a
   ``(size, Wp)`` weight matrix per crop, so two batched matmuls (fp16 on the GPU, fp32 accumulation) resize the
   whole group. The weights are those of ``F.interpolate(mode="bilinear", antialias=True)``: a triangle of half-width
   ``max(1, crop_side / size)`` around each output pixel's center, cut at the crop's edges and normalized; zero past a
   crop's own height and width, so whatever the padding holds adds nothing and nothing outside the crop is read.
   Upscaling (a crop smaller than ``size``) is plain bilinear with ``align_corners=False``, as in torchvision.
3. flip: the flipped samples' ``Wx`` has its rows reversed, which mirrors the output: no launch at all.
4. write: each group's crops go straight into their rows of the batch (:func:`decode_batch` allocates it in the
   model's memory format, so the prefetcher's normalization works in place).

A batch whose padded tensor would exceed ``max_padded_pixels`` is split into groups of crops of similar size (less
padding, and one group's buffers at a time: on an H200 the stage's peak fell from 856 to 436 MiB for a batch of 256,
and the app's peak with ``decode: gpu`` from 1.08-1.10 to 1.05 of the plain loop, for about 1 ms more a group;
bench/RESULTS.md, eighth session), and a crop larger than that on its own takes the per-image path
(:func:`decode_crop_resize_reference`, kept as the reference of the tests and the benchmark,
``bench/decode_bench.py``).
"""

from __future__ import annotations

import math
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

import buffer_release
import gpu_crop_kernel
from encoded_batch import Encoded, PackedBatch

try:  # one C++ call (no GIL held) that flattens and concatenates a list of tensors, as DDP's bucketing does
    from torch._utils import _flatten_dense_tensors
except ImportError:  # pragma: no cover

    def _flatten_dense_tensors(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        return torch.cat([t.reshape(-1) for t in tensors])


#: How ``data.nvjpeg`` may decode on CUDA: torchvision's binding, or :mod:`nvjpeg_batched` with buffers sized once.
NVJPEG_BINDINGS = ("torchvision", "preallocated")

#: Smallest side the preallocated decoder sizes its buffers for (most photo collections stay within it).
PREALLOCATE_SIDE = 512

#: Priority of the stream nvJPEG decodes on (lower is more urgent; PyTorch keeps stream pools at 0, -1, -2 and -3).
#: Above the default pool that the prefetcher and torchvision's decoder draw from, so that this stream (and its
#: allocator pool) is shared with neither; read when the stream is made (``bench/producer_timing.py
#: --decode-priority``).
DECODE_STREAM_PRIORITY = -1

#: Pixels (crops x padded height x padded width) of one group of the batched resize: 64 crops of 512 x 512, about
#: 50 MB of uint8 plus 100 MB of fp16 on the GPU while a group is resized. A batch over it goes in groups of crops of
#: similar size, which also pad less: for 256 RandomResizedCrops of 300-500 px images, 3 groups and 35 M padded pixels
#: instead of one group of 56 M (the whole batch padded to its largest crop), for about 47 more torch calls (27 kernel
#: launches) a group.
MAX_PADDED_PIXELS = 64 * 512 * 512

#: What crops, resizes and flips a batch on CUDA: ``triton``, :mod:`gpu_crop_kernel`'s one launch a batch (the
#: torch ops where Triton cannot run), or ``torch``, the batched torch ops below (about 47 a group of crops). Read at
#: each call: ``bench/throughput.py``'s ``+torchcrop`` rows set it.
CROP_KERNEL = "triton"

# Rows of the per-crop table (one column a crop) that the batched path copies to the device in one transfer, with the
# filter parameters (:func:`_filter_parameters`): where the crop's first row starts in its flat buffer (channel 0), the
# image's width and plane, the crop's last row, and _SOURCE, the sample's position in the batch (where its crop goes).
# The device reads each row as an ``(n, 1, 1)`` view, so that a group's indices and weights take a few broadcasting
# ops: each op is a launch and a hand-over of the GIL between this thread and the training thread, whose own launches
# wait meanwhile (bench/RESULTS.md, thirty-seventh session).
_START, _WIDTH, _PLANE, _LAST_ROW, _SOURCE = range(5)


def decode_batch(
    images: PackedBatch,
    device: torch.device | str,
    size: int,
    nvjpeg: str = "torchvision",
    memory_format: torch.memory_format = torch.contiguous_format,
    lane: int = 0,
) -> torch.Tensor:
    """The prefetcher's decoder: the batch's finished crops copied, the other samples decoded and cropped
    (:func:`decode_crop_resize`, with ``nvjpeg`` and ``lane``); float32 ``(N, 3, size, size)`` on 0..255, finished
    crops first, in ``memory_format`` (the model's: the prefetcher's normalization then needs no copy of the batch).

    The host buffer of a :class:`PackedBatch` is handed to :func:`buffer_release.release_later` (``data`` is left
    empty once it is released).
    """
    device = torch.device(device)
    if images.finished and images.size != size:
        raise ValueError(f"finished crops are {images.size}x{images.size}, expected {size}x{size}")
    # The whole buffer in page-locked memory, in one copy: the finished crops, the pixels and the JPEG bytes. nvJPEG
    # copies each JPEG to the device itself, one cudaMemcpyAsync an image; from the worker's pageable buffer each of
    # those had the driver stage the bytes while the call lasted, 36 us median on an H200 under fp16 eager training
    # (130 a batch, 5.0 ms of the producer's time, holding up the other threads' launches meanwhile; nsys, bench/
    # RESULTS.md, thirty-sixth session). _decode keeps these bytes alive until nvJPEG's copies have run.
    finished, samples = images._replace(data=_staged(images.data, device)).unpack()
    shape = (images.finished + len(images.table), 3, size, size)
    out = torch.empty(shape, dtype=torch.float32, device=device, memory_format=memory_format)
    if images.finished:
        # The cast in the copy into ``out``: no float32 temporary (a uint8 one on the device).
        out[: images.finished].copy_(_staged(finished, device).to(device, non_blocking=True))
    if samples:
        capacity = images.finished + len(images.table)  # the batch: the most JPEGs a later call may bring
        decode_crop_resize(
            samples, device, size, nvjpeg=nvjpeg, capacity=capacity, out=out[images.finished :], lane=lane
        )
    del finished, samples  # views of the buffer: its release must drop the last reference
    buffer_release.release_later(images.data, device)
    return out


def _staged(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``host`` in page-locked memory when it goes to a CUDA device: a copy from pageable memory holds a driver lock
    while the driver stages it, and every other thread's launches wait that long (5-8 ms a step for 218 finished crops
    in an H200 trace, the training thread's launches included). Copying into page-locked memory here takes the same
    few milliseconds of this thread, without the GIL or the driver once PyTorch's host allocator has cached blocks of
    the size (its first ones come from ``cudaHostAlloc``, 30-36 ms each on the H200, once); the copy to the device then
    runs on its own. The staging block goes back to that allocator, which reuses it only after PyTorch's own copies
    from it have finished; nvJPEG's copies of JPEG bytes it holds are not PyTorch's: :func:`_decode` parks those bytes
    until the batch's work has passed."""
    if device.type != "cuda" or host.is_pinned():
        return host
    staging = torch.empty(host.shape, dtype=host.dtype, pin_memory=True)
    return staging.copy_(host)


def decode_crop_resize(
    samples: list[Encoded],
    device: torch.device | str,
    size: int,
    *,
    max_padded_pixels: int | None = None,
    gather: str = "strided",
    dtype: torch.dtype | None = None,
    nvjpeg: str = "torchvision",
    capacity: int = 0,
    out: torch.Tensor | None = None,
    lane: int = 0,
) -> torch.Tensor:
    """Decodes, crops, resizes and flips a batch on ``device``; returns float32 ``(N, 3, size, size)`` on 0..255.

    Must run on the stream the result is wanted on (the prefetcher's side stream). On CUDA one launch of
    :mod:`gpu_crop_kernel` (with :data:`CROP_KERNEL` ``triton`` and ``gather="strided"``; images that are not views of
    the preallocated decoder's one buffer are concatenated first, one more), else about 27 launches per group of
    similar crops (see the module's docstring); same pixels as :func:`decode_crop_resize_reference` up to
    float rounding (mean absolute difference 1e-4 of 255), or, with the torch ops on the GPU, fp16 rounding (below
    0.05).

    Args:
        samples: The batch, as :class:`EncodedSampleLoader` made it.
        device: Where to decode and resize.
        size: Output side.
        max_padded_pixels: Bound of ``crops x padded height x padded width`` of one group of the batched torch ops;
            a crop larger than this alone is resized on its own (the per-image path). Default
            :data:`MAX_PADDED_PIXELS`. (The fused kernel pads nothing.)
        gather: How the crops reach the padded tensor: ``strided`` (one index op a group, from nvJPEG's output
            buffer or, for images decoded apart, a concatenation of them) or ``copy`` (one copy per crop; kept for
            the benchmark's comparison).
        dtype: Of the torch ops' padded crops and matmuls: default float16 on CUDA (exact for 0..255; weights to 11
            bits), float32 elsewhere. (The fused kernel computes in float32.)
        nvjpeg: Which binding of nvJPEG decodes on CUDA: ``torchvision`` (``decode_jpeg`` on the list) or
            ``preallocated`` (:mod:`nvjpeg_batched`: buffers sized once, see ``data.nvjpeg``).
        capacity: The most JPEGs a call of this run may bring (the batch size), for ``preallocated``; at least this
            call's.
        out: Where to write the crops (float32 ``(N, 3, size, size)`` on ``device``, e.g. a slice of the batch's
            tensor): no second batch-sized buffer; a new tensor when ``None``.
        lane: Which of the device's decode lanes (a stream, the parked images, an nvJPEG decoder each) decodes on
            CUDA: one per thread that decodes at once (the prefetcher's producer ``k`` uses lane ``k``; training and
            validation share a lane's decoder, behind its lock).
    """
    if gather not in ("strided", "copy"):
        raise ValueError(f"gather must be 'strided' or 'copy', got {gather!r}")
    if CROP_KERNEL not in ("triton", "torch"):
        raise ValueError(f"gpu_decode.CROP_KERNEL must be 'triton' or 'torch', got {CROP_KERNEL!r}")
    if nvjpeg not in NVJPEG_BINDINGS:
        raise ValueError(f"nvjpeg must be one of {', '.join(NVJPEG_BINDINGS)}, got {nvjpeg!r}")
    device = torch.device(device)
    if dtype is None:
        dtype = torch.float16 if device.type == "cuda" else torch.float32
    shape = (len(samples), 3, size, size)
    if out is None:
        out = torch.empty(shape, dtype=torch.float32, device=device)
    elif (
        tuple(out.shape) != shape
        or out.dtype != torch.float32
        or out.device.type != device.type
        or device.index not in (None, out.device.index)
    ):
        raise ValueError(f"out must be float32 {shape} on {device}, got {out.dtype} {tuple(out.shape)} on {out.device}")
    else:
        device = out.device  # where the crops go ('cuda' alone names no index): decode there too
    if not samples:
        return out
    if max_padded_pixels is None:
        max_padded_pixels = MAX_PADDED_PIXELS  # read at the call: bench/throughput.py's _onegroup variant sets it
    images, release = _decode(samples, device, nvjpeg, capacity, lane)
    try:
        return _crop_resize(samples, images, out, max_padded_pixels, gather, dtype)
    finally:
        release()  # after every read of the decoded images is enqueued


def decode_crop_resize_reference(samples: list[Encoded], device: torch.device | str, size: int) -> torch.Tensor:
    """The per-image version of :func:`decode_crop_resize`: crop, cast, flip and ``F.interpolate`` (bilinear,
    antialiased) one sample at a time. The reference of the tests and of ``bench/decode_bench.py``."""
    device = torch.device(device)
    out = torch.empty((len(samples), 3, size, size), dtype=torch.float32, device=device)
    if not samples:
        return out
    images, release = _decode(samples, device)
    try:
        for i, (sample, image) in enumerate(zip(samples, images, strict=True)):
            out[i] = _resize_one(image, sample, size)
    finally:
        release()
    return out


def _resize_one(image: torch.Tensor, sample: Encoded, size: int) -> torch.Tensor:
    if sample.resize is not None:  # as torchvision's Resize (the whole image; none to its own size) + CenterCrop
        resized_h, resized_w, top, left = sample.resize
        whole = image.unsqueeze(0).float()
        if (resized_h, resized_w) != tuple(image.shape[1:]):
            whole = F.interpolate(whole, (resized_h, resized_w), mode="bilinear", align_corners=False, antialias=True)
        crop = whole[0, :, top : top + size, left : left + size]
        return crop.flip(-1) if sample.flip else crop
    top, left, height, width = sample.box
    crop = image[:, top : top + height, left : left + width].unsqueeze(0).float()
    if sample.flip:
        # Bilinear resizing is mirror-symmetric, so flipping the (smaller) crop first gives the same pixels.
        crop = crop.flip(-1)
    if (height, width) == (size, size):
        return crop[0]
    return F.interpolate(crop, size=(size, size), mode="bilinear", align_corners=False, antialias=True)[0]


# --- decoding --------------------------------------------------------------------------------------------------------
def _decode(
    samples: list[Encoded], device: torch.device, nvjpeg: str = "torchvision", capacity: int = 0, lane: int = 0
) -> tuple[list[torch.Tensor], Callable[[], None]]:
    """The ``(3, H, W)`` uint8 pixels of every sample on ``device``, and what to call once their last read is queued."""
    from torchvision.io import ImageReadMode, decode_jpeg

    images = [
        None if sample.encoded else _staged(sample.data, device).to(device, non_blocking=True) for sample in samples
    ]
    jpeg_index = [i for i, sample in enumerate(samples) if sample.encoded]
    release: Callable[[], None] = _nothing
    if jpeg_index:
        data = [samples[i].data for i in jpeg_index]
        if device.type == "cuda":
            pool = _DecodeStream.of(device, lane)
            known = [samples[i].hardware_size for i in jpeg_index]
            decoded = pool.decode(data, device, nvjpeg, max(capacity, len(data)), known)
            # The JPEG bytes too: nvJPEG's API lets its own copies of them run after the call returns, on its streams,
            # which PyTorch's page-locked allocator does not see (a staged buffer freed now could then be handed to the
            # next batch first). On the H200 they had finished within the call (bench/RESULTS.md, thirty-sixth session).
            release = lambda: pool.park([*decoded, *data])  # noqa: E731
        else:
            decoded = decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
        for i, image in zip(jpeg_index, decoded, strict=True):
            images[i] = image
    return images, release  # type: ignore[return-value]


def _nothing() -> None:
    pass


class _DecodeStream:
    """Keeps the memory nvJPEG writes away from memory that queued kernels still read.

    ``decode_jpeg(device="cuda")`` allocates its outputs on the caller's current stream but writes them on its own
    stream, without waiting for the caller's stream. Decoding on the prefetcher's side stream, the outputs could get
    the memory of the previous batch's temporaries (freed by Python while their kernels are still queued there) and
    nvJPEG could overwrite it before those kernels ran. So the outputs are allocated on a stream of their own, which
    nothing else allocates on, and the decoded images of a call are held (parked) until an event recorded after their
    last read on the consumer stream has passed; only then can the next decode reuse their memory. The JPEG bytes the
    call read are parked with them: nvJPEG may copy them to the device after its call has returned. One per device and
    lane: threads that decode at once (the prefetcher's producers) each use their own lane, so that neither waits for
    the other's decoder; threads of one lane (the train and val producers, which may overlap) share it, behind its
    locks.
    """

    _lock = threading.Lock()
    _pools: dict[tuple[int, int], _DecodeStream] = {}

    def __init__(self, device: torch.device) -> None:
        self.stream = torch.cuda.Stream(device=device, priority=DECODE_STREAM_PRIORITY)
        self.lock = threading.Lock()
        self.parked: list[tuple[torch.cuda.Event, list[torch.Tensor]]] = []
        self.preallocated: Any = None  # nvjpeg_batched.BatchedDecoder, made at the first call that asks for it
        self.preallocated_failed = False
        self.preallocated_lock = threading.Lock()
        self.warned: set[str] = set()

    @classmethod
    def of(cls, device: torch.device, lane: int = 0) -> _DecodeStream:
        if isinstance(lane, bool) or not isinstance(lane, int) or lane < 0:
            raise ValueError(f"lane must be an integer >= 0, got {lane!r}")
        index = device.index if device.index is not None else torch.cuda.current_device()
        with cls._lock:
            if (index, lane) not in cls._pools:
                cls._pools[index, lane] = cls(torch.device("cuda", index))
            return cls._pools[index, lane]

    def decode(
        self,
        data: list[torch.Tensor],
        device: torch.device,
        nvjpeg: str = "torchvision",
        capacity: int = 0,
        known: list[tuple[int, int] | None] | None = None,
    ) -> list[torch.Tensor]:
        from torchvision.io import ImageReadMode, decode_jpeg

        with self.lock:
            parked, self.parked = self.parked, []
        [event.synchronize() for event, _ in parked]  # a comprehension: no loop variable keeps an image alive
        parked.clear()  # their reads are done: the memory may be reused
        consumer = torch.cuda.current_stream(self.stream.device)
        with torch.cuda.stream(self.stream):
            images = self._decode_preallocated(data, capacity, known) if nvjpeg == "preallocated" else None
            if images is None:
                images = decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
            elif any(image is None for image in images):
                # JPEGs the hardware decoder does not take (progressive, unusual subsamplings): torchvision's nvJPEG.
                rest = [k for k, image in enumerate(images) if image is None]
                decoded = decode_jpeg([data[k] for k in rest], mode=ImageReadMode.RGB, device=device)
                for k, image in zip(rest, decoded, strict=True):
                    images[k] = image
                self._warn_once(
                    "data.nvjpeg: preallocated: some JPEGs are not for nvJPEG's hardware decoder (progressive JPEGs, "
                    "unusual chroma subsamplings); torchvision decodes those"
                )
        consumer.wait_stream(self.stream)
        return images

    def _decode_preallocated(
        self, data: list[torch.Tensor], capacity: int, known: list[tuple[int, int] | None] | None = None
    ) -> list[torch.Tensor | None] | None:
        """The images by :class:`nvjpeg_batched.BatchedDecoder` on this stream (None for the JPEGs it does not take;
        ``known``: the sizes the workers read, see :meth:`nvjpeg_batched.BatchedDecoder.decode`),
        or None when it cannot decode the batch (then torchvision does, with one warning per reason). One decoder per
        lane, made at the first call and sized for ``capacity`` JPEGs of up to PREALLOCATE_SIDE x PREALLOCATE_SIDE
        (a larger image makes nvJPEG grow its buffers once more); remade, as large, for a call with more JPEGs."""
        from nvjpeg_batched import BatchedDecoder, NvjpegError

        with self.preallocated_lock:  # the train and val producers may both be here; a decoder closes only here
            decoder = self.preallocated
            if self.preallocated_failed:
                return None
            if decoder is None or len(data) > decoder.batch_size:
                old = decoder
                try:
                    decoder = BatchedDecoder(
                        self.stream.device,
                        max(capacity, len(data), old.batch_size if old else 0),
                        max(PREALLOCATE_SIDE, old.max_height if old else 0),
                        max(PREALLOCATE_SIDE, old.max_width if old else 0),
                    )
                except (NvjpegError, OSError, RuntimeError) as error:
                    if old is not None:  # e.g. out of memory for the larger one: keep the old decoder for later calls
                        self._warn_once(
                            f"nvJPEG's batched decoder could not grow ({error}); torchvision decodes larger calls"
                        )
                        return None
                    self.preallocated_failed = True
                    self._warn_once(
                        f"data.nvjpeg: preallocated is not available here ({error}); decoding with torchvision"
                    )
                    return None
                if old is not None:
                    decoder.inherit(old)  # what it learned of the workers' sizes
                    old.close()
                self.preallocated = decoder
            try:
                return decoder.decode(data, known)
            except NvjpegError as error:
                self._warn_once(f"nvJPEG's batched hardware decoder failed a batch ({error}); torchvision decodes it")
                return None

    def _warn_once(self, message: str) -> None:
        if message not in self.warned:
            self.warned.add(message)
            warnings.warn(message, stacklevel=3)

    def park(self, images: list[torch.Tensor]) -> None:
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.stream.device))
        with self.lock:
            self.parked.append((event, images))


# --- the batched crop, resize and flip -------------------------------------------------------------------------------
def _crop_resize(
    samples: list[Encoded],
    images: list[torch.Tensor],
    out: torch.Tensor,
    max_padded_pixels: int,
    gather: str,
    dtype: torch.dtype,
) -> torch.Tensor:
    count, size, device = len(samples), out.shape[-1], out.device
    boxes = [sample.box for sample in samples]
    shapes = [image.shape for image in images]
    for i, ((_, image_h, image_w), (top, left, height, width)) in enumerate(zip(shapes, boxes, strict=True)):
        if min(top, left) < 0 or min(height, width) < 1 or top + height > image_h or left + width > image_w:
            raise ValueError(
                f"sample {i}: crop box (top, left, height, width) = {boxes[i]} does not fit its "
                f"{image_w}x{image_h} image"
            )
        resize = samples[i].resize
        if resize is not None and (min(resize) < 0 or resize[2] + size > resize[0] or resize[3] + size > resize[1]):
            raise ValueError(
                f"sample {i}: a {size}x{size} crop at (top, left) = {resize[2:]} does not fit its image resized to "
                f"{resize[1]}x{resize[0]}"
            )
    if (
        gather == "strided"
        and device.type == "cuda"
        and CROP_KERNEL == "triton"
        and _crop_resize_fused(samples, images, out)
    ):
        return out
    batched = [i for i, box in enumerate(boxes) if box[2] * box[3] <= max_padded_pixels]
    outliers = [i for i, box in enumerate(boxes) if box[2] * box[3] > max_padded_pixels] if len(batched) < count else []
    grouped = _groups([boxes[i] for i in batched], max_padded_pixels)
    groups = [([batched[k] for k in members], h, w) for members, h, w in grouped]  # sample indices
    in_order = [i for members, _, _ in groups for i in members] == list(range(count))

    # One table of every batched crop's geometry, group after group, and the resize's float parameters, each group's
    # as one block (:func:`_resize` slices it without a copy): one host-to-device copy. Offsets count from the start of
    # the buffer the group is read from: the decoder's (_shared_buffer), or the group's images concatenated.
    rows, blocks, taps, buffers = [], [], [], []
    for members, _, padded_w in groups:
        shared = _shared_buffer([images[i] for i in members], padded_w) if gather == "strided" else None
        buffers.append(shared[0] if shared else None)
        offset = 0
        for k, i in enumerate(members):
            _, height, width = shapes[i]
            top, left, crop_h, _ = boxes[i]
            at = shared[1][k] if shared else offset
            rows.append((at + top * width + left, width, height * width, crop_h - 1, i))
            offset += 3 * height * width
        axes = np.array([_filter_axes(samples[i], shapes[i][1:], size) for i in members], dtype=np.float64)
        flips = np.array([samples[i].flip for i in members], dtype=bool)
        lengths, scales, shifts = axes.T.reshape(3, -1)  # each: the heights, then the widths
        blocks.append(_filter_parameters(lengths, scales, shifts, np.concatenate([np.zeros_like(flips), flips]), size))
        taps.append(_taps(float(axes[:, 2:4].max())))
    if groups:  # (every crop an outlier: no table)
        table_bytes = np.array(rows, dtype=np.int64).T.reshape(-1).view(np.uint8)
        packed = np.concatenate([table_bytes, *(block.reshape(-1).view(np.uint8) for block in blocks)])
        packed = _staged(torch.from_numpy(packed), device).to(device, non_blocking=True)  # page-locked, as the rest
        table = packed[: table_bytes.size].view(torch.int64).view(_SOURCE + 1, len(rows), 1, 1)
        parameters = packed[table_bytes.size :].view(torch.float32)

    start = 0
    for (members, padded_h, padded_w), group_taps, flat in zip(groups, taps, buffers, strict=True):
        stop = start + len(members)
        meta = table[:, start:stop].unbind(0)
        if gather == "strided":
            if flat is None:
                # The group's images flattened end to end, plus room for the last rows' padded reads: one cat a
                # group, so that no more than one group's pixels are copied at a time.
                tail = torch.empty(padded_w, dtype=torch.uint8, device=device)
                flat = _flatten_dense_tensors([*(images[i] for i in members), tail])
                del tail
            crops = _gather_strided(flat, meta, padded_h, padded_w)
            del flat
        else:
            crops = torch.empty((len(members), padded_h, 3, padded_w), dtype=torch.uint8, device=device)
            for k, i in enumerate(members):
                top, left, crop_h, crop_w = boxes[i]
                crop = images[i][:, top : top + crop_h, left : left + crop_w]
                crops[k, :crop_h, :, :crop_w].copy_(crop.transpose(0, 1))
        crops = crops.to(dtype)  # frees the uint8 copy
        filters = parameters[2 * len(_FILTER_ROWS) * start : 2 * len(_FILTER_ROWS) * stop]
        resized = _resize(crops, filters.view(len(_FILTER_ROWS), -1, 1, 1), size, group_taps)
        del crops
        if in_order:
            out[start:stop].copy_(resized)  # the cast in the copy
        else:  # each crop into its sample's row (index_copy_ wants the destination's dtype: one group's cast)
            out.index_copy_(0, meta[_SOURCE].view(-1), resized.to(out.dtype))
        del resized
        start = stop
    for i in outliers:
        out[i] = _resize_one(images[i], samples[i], size)
    return out


def _crop_resize_fused(samples: list[Encoded], images: list[torch.Tensor], out: torch.Tensor) -> bool:
    """The whole batch's crops resized into ``out`` by :mod:`gpu_crop_kernel`'s one launch; False (once warned) where
    Triton cannot run here: then the torch path does it. The kernel reads the decoded images where nvJPEG's batched
    decoder wrote them (one buffer), else from one concatenation of them."""
    global _FUSED_STATE
    if _FUSED_STATE == "failed":
        return False
    if not gpu_crop_kernel.AVAILABLE:
        with _FIRST_LAUNCH_LOCK:
            if _FUSED_STATE != "failed":
                _fused_failed("Triton cannot be imported")
        return False
    shapes = [image.shape for image in images]
    shared = _shared_buffer(images, 0)
    if shared is None:
        flat = _flatten_dense_tensors(images)
        offsets = np.cumsum([0] + [image.numel() for image in images[:-1]]).tolist()
    else:
        flat, offsets = shared
    table, parameters = fused_table(samples, shapes, offsets, out.shape[-1])
    # The parameters first: 16 bytes a crop, so that the table after them starts 16-byte aligned whatever the count
    # (Triton would compile the kernel again for a table that is not; the buffer itself is).
    packed = np.concatenate([parameters.reshape(-1).view(np.uint8), table.reshape(-1).view(np.uint8)])
    packed = _staged(torch.from_numpy(packed), out.device).to(out.device, non_blocking=True)  # one page-locked copy
    device_parameters = packed[: parameters.nbytes].view(torch.float32).view(parameters.shape)
    device_table = packed[parameters.nbytes :].view(torch.int64).view(table.shape)
    if _FUSED_STATE == "verified":
        gpu_crop_kernel.launch(flat, device_table, device_parameters, out)
        return True
    with _FIRST_LAUNCH_LOCK:  # the train and val producers: one first launch, one warning
        if _FUSED_STATE == "failed":
            return False
        try:  # the first launch compiles the kernel (and Triton's launcher, with the host's C compiler)
            gpu_crop_kernel.launch(flat, device_table, device_parameters, out)
        except Exception as error:  # noqa: BLE001 - whatever keeps Triton from building or running the kernel
            _fused_failed(f"{type(error).__name__}: {str(error)[:300]}")
            return False
        _FUSED_STATE = "verified"
    return True


def fused_table(
    samples: list[Encoded],
    shapes: Sequence[Sequence[int]],
    offsets: Sequence[int],
    size: int,
    taps: Callable[[np.ndarray], np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The fused kernel's int64 table (:data:`gpu_crop_kernel.INT_COLUMNS`) and float32 parameters
    (:data:`gpu_crop_kernel.FLOAT_COLUMNS`), a row a crop, C order; the images' ``(3, H, W)`` shapes and where each
    starts in the flat buffer. ``taps``: the kernel's (default :func:`gpu_crop_kernel.taps`; bench/crop_kernel_time.py
    gives each copy of the kernel its own)."""
    taps = taps or gpu_crop_kernel.taps
    rows, axes = [], []
    for sample, (_, height, width), at in zip(samples, shapes, offsets, strict=True):
        top, left, box_h, box_w = sample.box
        rows.append((at + top * width + left, width, height * width, box_h, box_w, 0, 0, sample.flip))
        axes.append(_filter_axes(sample, (height, width), size))
    table, scales = np.array(rows, dtype=np.int64), np.array(axes, dtype=np.float64)
    table[:, 5], table[:, 6] = taps(scales[:, 2]), taps(scales[:, 3])
    # Scale and shift along y, then x; C order (numpy's fancy index keeps its result column-major).
    return table, np.ascontiguousarray(scales[:, [2, 4, 3, 5]], dtype=np.float32)


def _fused_failed(reason: str) -> None:
    global _FUSED_STATE
    _FUSED_STATE = "failed"
    warnings.warn(
        f"the fused crop kernel (gpu_crop_kernel.py, Triton) cannot run here ({reason}); the GPU path crops with its "
        "torch ops instead (about 94 launches a batch of 128)",
        stacklevel=5,
    )


#: "unknown" until the fused kernel's first launch, then "verified" or "failed" (the torch path from then on).
_FUSED_STATE = "unknown"
_FIRST_LAUNCH_LOCK = threading.Lock()


def _round8(value: int) -> int:
    """Padded sides are multiples of 8: aligned fp16 rows for the tensor cores."""
    return -(-value // 8) * 8


def _groups(boxes: list[tuple[int, int, int, int]], budget: int) -> list[tuple[list[int], int, int]]:
    """Positions in ``boxes`` grouped so that ``len(group) x padded height x padded width`` stays within ``budget``,
    each with its padded height and width: one group in the given order when the whole batch fits, else greedily by
    area (similar sizes together, little padding)."""
    if not boxes:
        return []
    padded_h, padded_w = _round8(max(box[2] for box in boxes)), _round8(max(box[3] for box in boxes))
    if len(boxes) * padded_h * padded_w <= budget:
        return [(list(range(len(boxes))), padded_h, padded_w)]
    groups: list[tuple[list[int], int, int]] = []
    members: list[int] = []
    padded_h = padded_w = 0
    for k in sorted(range(len(boxes)), key=lambda k: boxes[k][2] * boxes[k][3]):
        h, w = _round8(boxes[k][2]), _round8(boxes[k][3])
        grown_h, grown_w = max(padded_h, h), max(padded_w, w)
        if members and (len(members) + 1) * grown_h * grown_w > budget:
            groups.append((members, padded_h, padded_w))
            members, grown_h, grown_w = [], h, w
        members.append(k)
        padded_h, padded_w = grown_h, grown_w
    groups.append((members, padded_h, padded_w))
    return groups


def _shared_buffer(images: list[torch.Tensor], padded_w: int) -> tuple[torch.Tensor, list[int]] | None:
    """The flat uint8 buffer that all ``images`` are contiguous views of, and each one's offset in it, when it holds
    ``padded_w`` bytes past every image's end (room for :func:`_gather_strided`'s padded reads); else None.

    :mod:`nvjpeg_batched` decodes a call's images into one such buffer, spare bytes at its end included: the gather
    then reads the decoder's output where it is, without the concatenation that a list of separately allocated images
    (torchvision's binding, pixels decoded by the workers) needs. That copy of the decoded images took 0.17 ms of an
    H200 a step of fp16 eager training, where the GPU is the step's limit (bench/RESULTS.md, thirty-sixth session).
    """
    base = images[0]._base
    if base is None or base.dim() != 1 or base.dtype != torch.uint8 or not base.is_contiguous():
        return None
    offsets = []
    for image in images:
        if image._base is not base or not image.is_contiguous():
            return None
        offset = image.storage_offset() - base.storage_offset()
        if offset < 0 or offset + image.numel() + padded_w > base.numel():
            return None
        offsets.append(offset)
    return base, offsets


def _gather_strided(flat: torch.Tensor, meta: Sequence[torch.Tensor], padded_h: int, padded_w: int) -> torch.Tensor:
    """The crops of ``meta`` (the table's rows, ``(n, 1, 1)`` each) as uint8 ``(n, padded_h, 3, padded_w)``, in one
    index op.

    ``flat.unfold(0, padded_w, 1)`` is a view whose row ``r`` is ``flat[r : r + padded_w]``, so one index per output
    row (its first element's offset in ``flat``) selects it. Rows past a crop's height repeat its last row; columns
    past its width read whatever follows in ``flat``: the resize weights there are zero, and any uint8 is finite.
    """
    windows = flat.unfold(0, padded_w, 1)
    y = torch.minimum(_arange(padded_h, flat.device, torch.int64).view(padded_h, 1), meta[_LAST_ROW])  # (n, Hp, 1)
    first = torch.addcmul(meta[_START], y, meta[_WIDTH])  # the rows' starts in channel 0
    return windows[torch.addcmul(first, _arange(3, flat.device, torch.int64), meta[_PLANE])]  # (n, Hp, 3) starts


def _arange(n: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """``torch.arange(n)``, made once per length, device, stream and dtype: a launch fewer each time (a view of one
    longer tensor would cost a slicing call instead). Keyed by the stream that made it, whose later work is ordered
    after the kernel that filled it. The lengths are the groups' padded heights (multiples of 8), the taps and the
    output size: a few hundred at most, a few KB each; past :data:`_ARANGES_KEPT` the cache starts again (a tensor
    in use on its stream stays valid: its memory is reused only by that stream's later work)."""
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (n, device, stream, dtype)
    cached = _ARANGES.get(key)
    if cached is None:
        if len(_ARANGES) >= _ARANGES_KEPT:
            _ARANGES.clear()
        cached = _ARANGES[key] = torch.arange(n, device=device, dtype=dtype)
    return cached


_ARANGES: dict[tuple[int, torch.device, int, torch.dtype], torch.Tensor] = {}
_ARANGES_KEPT = 4096


def _filter_axes(sample: Encoded, shape: Sequence[int], size: int) -> tuple[float, float, float, float, float, float]:
    """The box's height and width, and the scale and shift of :func:`_filter_weights` along each, of a sample resized
    to ``size`` from an image of ``shape`` (height, width).

    A RandomResizedCrop resizes its box whole: ``box / size`` input pixels an output, centers from the box's start. A
    center crop (:attr:`Encoded.resize`) keeps part of the whole image's resize: ``image / resized`` pixels an output,
    and its output 0 is that resize's output ``top`` (``left``), whose center counts from the image's start, not the
    box's.
    """
    top, left, box_h, box_w = sample.box
    if sample.resize is None:
        return box_h, box_w, box_h / size, box_w / size, 0.0, 0.0
    resized_h, resized_w, into_y, into_x = sample.resize
    scale_h, scale_w = shape[0] / resized_h, shape[1] / resized_w
    return box_h, box_w, scale_h, scale_w, into_y * scale_h - top, into_x * scale_w - left


def _taps(max_scale: float) -> int:
    """Input pixels computed for one output pixel along an axis, for boxes of at most ``max_scale`` input pixels an
    output: the filter's support, ``2 x max(scale, 1)`` pixels wide, covers at most ``ceil(2 x max(scale, 1)) + 1``
    of them; :func:`_filter_weights` starts a pixel early and one more is spare for float rounding of the centers
    (such taps weigh zero)."""
    return math.ceil(2 * max(max_scale, 1.0)) + 3


def _resize(crops: torch.Tensor, parameters: torch.Tensor, size: int, taps: int) -> torch.Tensor:
    """Antialiased bilinear resize of padded crops ``(n, Hp, 3, Wp)`` to ``(n, 3, size, size)`` (a permuted view),
    flipping the flagged ones: ``Wy @ crop @ Wx^T`` as two batched matmuls. ``parameters``: :func:`_filter_parameters`
    of the crops' heights, then their widths (those of flipped samples mirrored); ``taps``: at least :func:`_taps` of
    the group's largest scale."""
    n, padded_h, _, padded_w = crops.shape
    weights = _filter_weights(parameters, size, max(padded_h, padded_w), crops.dtype, taps)
    rows = weights[:n, :, :padded_h]  # (n, size, Hp)
    columns = weights[n:, :, :padded_w].transpose(1, 2)  # (n, Wp, size)
    half = torch.bmm(rows, crops.view(n, padded_h, 3 * padded_w))  # (n, size, 3 * Wp)
    out = torch.bmm(half.view(n, size * 3, padded_w), columns)  # (n, size * 3, size): rows, channels, columns
    return out.view(n, size, 3, size).permute(0, 2, 1, 3)


#: Rows of :func:`_filter_parameters`: output 0's center (as an input pixel's index: pixel ``x`` spans ``x .. x + 1``,
#: its center ``x + 0.5``, minus that half), the step to the next output's (negative where mirrored), the filter's
#: half-width plus one, minus its inverse, and the first and last input pixel of the box.
_FILTER_ROWS = ("center0", "step", "reach", "neg_inverse", "lowest", "last")


def _filter_parameters(
    lengths: np.ndarray, scale: np.ndarray, shift: np.ndarray, mirror: np.ndarray, size: int
) -> np.ndarray:
    """The per-row parameters of :func:`_filter_weights`, computed on the host: float32 ``(6, m, 1, 1)``
    (:data:`_FILTER_ROWS`), for ``lengths[j]`` input pixels, ``scale[j]`` input pixels per output and output ``i``
    centered at ``(i + 0.5) * scale + shift`` (the input's pixel ``x`` at ``x + 0.5``); output order reversed where
    ``mirror``. A box resized whole has ``scale = length / size`` and ``shift = 0``."""
    scale, shift = scale.astype(np.float64), shift.astype(np.float64)
    support = np.maximum(scale, 1.0)  # the filter's half-width in input pixels
    first = np.where(mirror, size - 0.5, 0.5)  # the first output's position, in outputs
    rows = [shift + first * scale - 0.5, np.where(mirror, -scale, scale), support + 1.0, -1.0 / support]
    rows += [np.zeros_like(scale), lengths.astype(np.float64) - 1.0]
    return np.stack(rows).astype(np.float32).reshape(len(_FILTER_ROWS), -1, 1, 1)


def _filter_weights(parameters: torch.Tensor, size: int, padded: int, dtype: torch.dtype, taps: int) -> torch.Tensor:
    """``(m, size, padded)`` weights of ``F.interpolate(mode="bilinear", antialias=True)`` for the ``m`` rows of
    ``parameters`` (:func:`_filter_parameters`), zero past each input's length. Computed in float32, returned in
    ``dtype``.

    As in ATen's ``_upsample_bilinear2d_aa``: weight of input ``x`` ``max(0, 1 - |x + 0.5 - center| / max(scale, 1))``
    over ``0 <= x < length``, normalized (multiplied by the inverse, as ATen does, rather than divided: its rounding).

    Only the ``taps`` pixels from just below each output's support on are computed (``(m, size, taps)``), then
    scattered into zeros. The dense ``(m, size, padded)`` float32 tensor this replaces, with its ten elementwise passes,
    was the stage's largest GPU cost: on an H200 its kernels took 0.97 ms a step in an nsys trace of fp16 eager
    ResNet-50 training, where the GPU is the step's limit; the whole stage's kernels went from 1.30 to 0.92 ms a batch
    of 128 (bench/RESULTS.md, thirty-sixth session). The per-row values come from the host, so that a group's weights
    are about 18 launches.
    """
    center0, step, reach, neg_inverse, lowest, last = parameters.unbind(0)  # (m, 1, 1) each
    device = parameters.device
    center = torch.addcmul(center0, _arange(size, device, torch.float32).view(size, 1), step)  # (m, size, 1)
    x = (center - reach).floor_() + _arange(taps, device, torch.float32)  # (m, size, taps): from a pixel below
    weights = (x - center).abs_().mul_(neg_inverse).add_(1.0).clamp_(min=0.0)  # the triangle
    inside = torch.clamp(x, lowest, last)
    weights.masked_fill_(inside != x, 0.0)  # cut at the input's edges
    weights /= weights.sum(-1, keepdim=True)
    # Taps past the input's edges weigh zero: clamped onto the edge pixel (within the padded width), they add nothing.
    dense = torch.zeros((parameters.shape[1], size, padded), dtype=dtype, device=device)
    return dense.scatter_add_(2, inside.long(), weights.to(dtype))
