"""The GPU path's crop, antialiased resize and flip of a whole batch as one Triton kernel (``data.decode: gpu``).

:func:`gpu_decode.decode_crop_resize`'s batched torch path costs about 47 torch calls a group of crops, 94 a batch of
128 in two groups: each a launch and a hand-over of the GIL between the prefetcher's producer thread and the training
thread, whose own launches wait meanwhile. On an H200 under fp16 eager ResNet-50 training those calls took 14 ms of the
producer's CPU a batch (bench/RESULTS.md, thirty-seventh session), on a machine where the host was the step's limit.
Here the batch is one launch: each program computes a tile of one crop's output pixels straight from the decoded
images, with no padded copy of the crops, no weight matrices in memory and no groups. With ``data.nvjpeg:
preallocated`` the images are read where nvJPEG wrote them (one buffer); separately allocated ones (torchvision's
binding, pixels the workers decoded) are concatenated first.

Each output pixel is ATen's ``_upsample_bilinear2d_aa`` (``F.interpolate(mode="bilinear", antialias=True)``, what
``transforms.RandomResizedCrop`` runs on tensors): along each axis, input pixel ``x`` of the box weighs
``max(0, 1 - |x + 0.5 - center| / support)`` with ``center = shift + (i + 0.5) * scale`` and ``support = max(scale,
1)``, cut at the box's edges and normalized; the two axes are separable, so a tile sums its columns' weighted pixels
row by row and weighs the rows. A flipped sample reads its output columns mirrored. Computed in float32 (the torch
path's matmuls take fp16 weights), written as float32 into the batch in its memory format.

Measured on an H200 (bench/RESULTS.md, thirty-eighth session), 128 RandomResizedCrops of 300-500 px JPEGs decoded by
``data.nvjpeg: preallocated``, to 224 x 224: 0.53 ms of GPU a batch against the torch ops' 0.83 (56 kernels), 1.0 ms
of the host a call against 2.8-3.2, 59 MiB of peak memory against 221; the per-image ``F.interpolate`` reference's
pixels within 0.0025 of 255 (mean 8e-5) against 0.28 (0.033).

Triton comes with PyTorch's CUDA builds on Linux (``torch.compile`` generates its kernels with it). Where it cannot
be imported or its first compile fails, :func:`gpu_decode.decode_crop_resize` warns once and uses the torch path. On
the CPU the kernel runs under Triton's interpreter (``TRITON_INTERPRET=1``), which is how the tests check it without a
GPU.
"""

from __future__ import annotations

import contextlib
import threading

import numpy as np
import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - Triton ships with torch's Linux CUDA wheels
    triton = None

#: Columns of the integer table, one row a crop (crop ``i`` goes to row ``i`` of the output): where the crop's first
#: pixel of channel 0 is in the flat buffer, the image's row stride (its width) and plane (height x width), the box's
#: height and width, the taps computed along each axis, and whether the output is mirrored.
INT_COLUMNS = ("start", "width", "plane", "box_h", "box_w", "taps_y", "taps_x", "flip")
#: Columns of the float table: input pixels an output and the shift of output 0's center, along y then x (as
#: :func:`gpu_decode._filter_axes` gives them).
FLOAT_COLUMNS = ("scale_y", "shift_y", "scale_x", "shift_x")

#: A program's tile of output pixels (rows x columns): 512 pixels, 4 warps.
BLOCK_Y, BLOCK_X = 16, 32

AVAILABLE = triton is not None
# The train and val producers may launch at once; Triton does not document its JIT's first compile as thread-safe.
_lock = threading.Lock()


def taps(scale: np.ndarray) -> np.ndarray:
    """Input pixels the kernel visits per output along an axis with ``scale`` input pixels an output: the weights are
    nonzero over an open interval ``2 x max(scale, 1)`` wide, which holds at most ``ceil`` of that many pixels; the
    kernel starts a pixel below it (float rounding of the center) and visits one more."""
    return np.ceil(2.0 * np.maximum(scale, 1.0)).astype(np.int64) + 2


def launch(flat: torch.Tensor, table: torch.Tensor, parameters: torch.Tensor, out: torch.Tensor) -> None:
    """Writes every crop of ``table`` resized into ``out``.

    Args:
        flat: uint8, 1-D: the decoded images, each ``(3, H, W)`` contiguous somewhere in it.
        table: int64 ``(n, len(INT_COLUMNS))`` on ``out``'s device.
        parameters: float32 ``(n, len(FLOAT_COLUMNS))`` on ``out``'s device.
        out: float32 ``(n, 3, size, size)``, any strides (the batch in the model's memory format).

    Triton launches on the current device's current stream: the call makes ``out``'s device current (the prefetcher's
    side stream is the current stream of that device on its thread). Triton specializes a kernel on its pointers'
    16-byte alignment, so a table and parameters that are sometimes aligned and sometimes not compile it twice.
    """
    if triton is None:  # pragma: no cover
        raise RuntimeError("Triton is not installed: the fused crop kernel cannot run")
    count, size = table.shape[0], out.shape[-1]
    if count == 0:
        return
    grid = (count, triton.cdiv(size, BLOCK_Y) * triton.cdiv(size, BLOCK_X))
    on_device = torch.cuda.device(out.device) if out.is_cuda else contextlib.nullcontext()
    with _lock, on_device:
        _crop_resize_kernel[grid](
            flat, table, parameters, out, *out.stride(), size,
            INT_COLUMNS=len(INT_COLUMNS), FLOAT_COLUMNS=len(FLOAT_COLUMNS), BLOCK_Y=BLOCK_Y, BLOCK_X=BLOCK_X,
        )  # fmt: skip


if triton is not None:

    @triton.jit
    def _axis_weight(position, center, inverse, length):
        """The triangle filter's weight of input pixels ``position`` (zero outside ``0 <= position < length``)."""
        weight = tl.maximum(1.0 - tl.abs(position.to(tl.float32) + 0.5 - center) * inverse, 0.0)
        return tl.where((position >= 0) & (position < length), weight, 0.0)

    @triton.jit
    def _crop_resize_kernel(
        flat,
        table,
        parameters,
        out,
        stride_n,
        stride_c,
        stride_h,
        stride_w,
        size,
        INT_COLUMNS: tl.constexpr,
        FLOAT_COLUMNS: tl.constexpr,
        BLOCK_Y: tl.constexpr,
        BLOCK_X: tl.constexpr,
    ):
        crop = tl.program_id(0)
        tile = tl.program_id(1)
        # Not tl.cdiv nor tl.zeros: those are jitted helpers, which the tests' interpreted copy of this module would
        # call as compiled ones (Triton reads TRITON_INTERPRET when it decorates, and it decorated them at its import).
        tiles_x = (size + BLOCK_X - 1) // BLOCK_X
        row = table + crop * INT_COLUMNS
        start = tl.load(row + 0)
        width = tl.load(row + 1)
        plane = tl.load(row + 2)
        box_h = tl.load(row + 3)
        box_w = tl.load(row + 4)
        taps_y = tl.load(row + 5)
        taps_x = tl.load(row + 6)
        flip = tl.load(row + 7)
        scale_y = tl.load(parameters + crop * FLOAT_COLUMNS + 0)
        shift_y = tl.load(parameters + crop * FLOAT_COLUMNS + 1)
        scale_x = tl.load(parameters + crop * FLOAT_COLUMNS + 2)
        shift_x = tl.load(parameters + crop * FLOAT_COLUMNS + 3)
        inverse_y = 1.0 / tl.maximum(scale_y, 1.0)
        inverse_x = 1.0 / tl.maximum(scale_x, 1.0)

        out_y = (tile // tiles_x) * BLOCK_Y + tl.arange(0, BLOCK_Y)
        out_x = (tile % tiles_x) * BLOCK_X + tl.arange(0, BLOCK_X)
        # A mirrored crop's output column i is the unmirrored one's size - 1 - i.
        read_x = tl.where(flip != 0, size - 1 - out_x, out_x)
        center_y = shift_y + (out_y.to(tl.float32) + 0.5) * scale_y
        center_x = shift_x + (read_x.to(tl.float32) + 0.5) * scale_x
        # A pixel below the support's lower end (x + 0.5 > center - support): float rounding of the center.
        first_y = tl.floor(center_y - 0.5 - tl.maximum(scale_y, 1.0)).to(tl.int64)
        first_x = tl.floor(center_x - 0.5 - tl.maximum(scale_x, 1.0)).to(tl.int64)

        total_x = tl.full([BLOCK_X], 0.0, tl.float32)
        for t in range(0, taps_x):
            total_x += _axis_weight(first_x + t, center_x, inverse_x, box_w)
        red = tl.full([BLOCK_Y, BLOCK_X], 0.0, tl.float32)
        green = tl.full([BLOCK_Y, BLOCK_X], 0.0, tl.float32)
        blue = tl.full([BLOCK_Y, BLOCK_X], 0.0, tl.float32)
        total_y = tl.full([BLOCK_Y], 0.0, tl.float32)
        for s in range(0, taps_y):
            y = first_y + s
            weight_y = _axis_weight(y, center_y, inverse_y, box_h)
            total_y += weight_y
            # Rows outside the box weigh zero: read its nearest row instead of past the image.
            offset_y = start + tl.minimum(tl.maximum(y, 0), box_h - 1) * width
            row_red = tl.full([BLOCK_Y, BLOCK_X], 0.0, tl.float32)
            row_green = tl.full([BLOCK_Y, BLOCK_X], 0.0, tl.float32)
            row_blue = tl.full([BLOCK_Y, BLOCK_X], 0.0, tl.float32)
            for t in range(0, taps_x):
                x = first_x + t
                weight_x = _axis_weight(x, center_x, inverse_x, box_w)
                at = offset_y[:, None] + tl.minimum(tl.maximum(x, 0), box_w - 1)[None, :]
                row_red += weight_x[None, :] * tl.load(flat + at).to(tl.float32)
                row_green += weight_x[None, :] * tl.load(flat + at + plane).to(tl.float32)
                row_blue += weight_x[None, :] * tl.load(flat + at + 2 * plane).to(tl.float32)
            red += weight_y[:, None] * row_red
            green += weight_y[:, None] * row_green
            blue += weight_y[:, None] * row_blue

        # (Past the output's edge a tile's lanes may weigh nothing: no division by zero there, they are not stored.)
        scale = 1.0 / tl.maximum(total_y[:, None] * total_x[None, :], 1e-30)
        inside = (out_y < size)[:, None] & (out_x < size)[None, :]
        at = out + crop.to(tl.int64) * stride_n + out_y[:, None] * stride_h + out_x[None, :] * stride_w
        tl.store(at, red * scale, mask=inside)
        tl.store(at + stride_c, green * scale, mask=inside)
        tl.store(at + 2 * stride_c, blue * scale, mask=inside)
