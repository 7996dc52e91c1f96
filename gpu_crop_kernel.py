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
``transforms.RandomResizedCrop`` runs on tensors): along each axis, input pixel ``x`` of the box weighs ``max(0, 1 - |x
+ 0.5 - center| / support)`` with ``center = shift + (i + 0.5) * scale`` and ``support = max(scale, 1)``, cut at the
box's edges and normalized; the two axes are separable. A tile's output rows weigh a band of input rows (about ``15 x
scale + taps`` of them for 16 output rows): the kernel resizes that band along x, ``BLOCK_R`` rows at a time, each pixel
read and weighed once a tap, and weighs the rows for every output row as a small float32 matmul (most of its weights
zero). The direct version it replaced computed each output pixel from its ``taps_y x taps_x`` pixels: at scale 1.5 (5
taps an axis) 75 gathered loads an output pixel where this issues 30 (at 0.5, 48 and 12), each with int64 offsets and a
uint8 conversion at an eighth of the FMA rate. Its FMAs are not fewer (at 1.5, 126 an output pixel against 90; at 0.5,
60 each): the matmul's zeros. A flipped sample reads its output columns mirrored. Computed in float32 (the torch path's
matmuls take fp16 weights), written as float32 into the batch in its memory format.

Measured on an H200 (bench/RESULTS.md, thirty-eighth session), the direct version, 128 RandomResizedCrops of 300-500
px JPEGs decoded by ``data.nvjpeg: preallocated``, to 224 x 224: 0.53 ms of GPU a batch (with the concatenation of
the separately decoded images in three of its four batches) against the torch ops' 0.83 (56 kernels), 1.0 ms of the
host a call against 2.8-3.2, 59 MiB of peak memory against 221; the per-image ``F.interpolate`` reference's pixels
within 0.0025 of 255 (mean 8e-5) against 0.28 (0.033). This separable version, alternated with the direct one on
the same four batches of 128 crops (``bench/crop_kernel_time.py``, thirty-ninth session, two calls): 0.36 ms a batch
against 0.44 (0.82), the same pixels (within 0.0032 of 255 of the reference, mean 8.5e-5, both). It needs its 8 warps
a program: with 4 it took 0.45.

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

#: A program's tile of output pixels (rows x columns), and the input rows it resizes along x at a time. 224 is 14 x 16
#: and 7 x 32: no idle lanes at the app's size. The matmul weighs each of the tile's rows against every row of its band
#: (``15 x scale + taps`` rows for 16), so taller tiles compute more zero products and shorter ones resize more rows
#: twice (neighbouring bands overlap by the taps); ``tl.dot`` takes no fewer than 16 rows and 16 of the band a chunk.
BLOCK_Y, BLOCK_X, BLOCK_R = 16, 32, 16
#: Warps a program: 256 threads, 2 of the tile's 512 output pixels each and 2 of a chunk's 512 row pixels. On an H200
#: (bench/RESULTS.md, thirty-ninth session) 128 crops took 0.36 ms with 8 warps, 0.45 with 4 and 0.67 with 16; with 8,
#: 64-column tiles took 0.55 and 32-row chunks 0.59; with 4, 32-row tiles 0.47 and 64-column ones 0.37. The direct
#: version took 0.44 with 4 warps or 8: the separable version's half as many instructions gained nothing until more
#: warps hid the loads' latency.
NUM_WARPS = 8

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
            BLOCK_R=BLOCK_R, num_warps=NUM_WARPS,
        )  # fmt: skip


if triton is not None:

    @triton.jit
    def _axis_weight(position, center, inverse, length):
        """The triangle filter's weight of input pixels ``position`` (zero outside ``0 <= position < length``)."""
        weight = tl.maximum(1.0 - tl.abs(position.to(tl.float32) + 0.5 - center) * inverse, 0.0)
        return tl.where((position >= 0) & (position < length), weight, 0.0)

    @triton.jit
    def _as_float(pixels):
        """uint8 pixels as float32, exactly: ``2**23 + v`` has ``v`` as its mantissa's low bits. An OR and an add,
        full-rate instructions, where the conversion the compiler emits (``I2F.U16``) issues at an eighth of the FMA
        rate on Hopper: it was 12 of the 88 instructions of the direct kernel's inner loop."""
        return (pixels.to(tl.int32) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0

    @triton.jit
    def _minimum(a, b):
        """``tl.reduce``'s combine: ``tl.min`` and ``tl.max`` are jitted helpers, like ``tl.zeros`` (see the kernel)."""
        return tl.minimum(a, b)

    @triton.jit
    def _maximum(a, b):
        """``tl.reduce``'s combine (see :func:`_minimum`)."""
        return tl.maximum(a, b)

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
        BLOCK_R: tl.constexpr,
    ):
        crop = tl.program_id(0)
        tile = tl.program_id(1)
        # Not tl.cdiv nor tl.zeros (nor tl.min, tl.max, tl.sum): those are jitted helpers, which the tests' interpreted
        # copy of this module would call as compiled ones (Triton reads TRITON_INTERPRET when it decorates, and it
        # decorated them at its import).
        tiles_x = (size + BLOCK_X - 1) // BLOCK_X
        row = table + crop * INT_COLUMNS
        # The crop's first pixel as a pointer, its int64 offset added once: the offsets within the image (row x width
        # + column, less than a plane) are int32, whose arithmetic is one instruction an element (int64: two or more).
        # A plane is at most image_loading.MAX_PIXELS (2**28) pixels: the workers send no larger image.
        crop_base = flat + tl.load(row + 0)
        width = tl.load(row + 1).to(tl.int32)
        plane = tl.load(row + 2)
        box_h = tl.load(row + 3).to(tl.int32)
        box_w = tl.load(row + 4).to(tl.int32)
        taps_y = tl.load(row + 5).to(tl.int32)
        taps_x = tl.load(row + 6).to(tl.int32)
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
        first_y = tl.floor(center_y - 0.5 - tl.maximum(scale_y, 1.0)).to(tl.int32)
        first_x = tl.floor(center_x - 0.5 - tl.maximum(scale_x, 1.0)).to(tl.int32)

        # The normalization over each output's taps within the box, as the direct (2-D) version summed it.
        total_x = tl.full([BLOCK_X], 0.0, tl.float32)
        for t in range(0, taps_x):
            total_x += _axis_weight(first_x + t, center_x, inverse_x, box_w)
        total_y = tl.full([BLOCK_Y], 0.0, tl.float32)
        for s in range(0, taps_y):
            total_y += _axis_weight(first_y + s, center_y, inverse_y, box_h)

        # The input rows the tile's stored output rows weigh, cut at the box: from its first row's first tap to its
        # last stored row's last (the centers grow with the row). Outside them every weight is zero.
        lowest = tl.maximum(tl.reduce(first_y, 0, _minimum), 0)
        highest = tl.minimum(tl.reduce(tl.where(out_y < size, first_y, -1), 0, _maximum) + taps_y - 1, box_h - 1)
        red = tl.full([BLOCK_Y, BLOCK_X], 0.0, tl.float32)
        green = tl.full([BLOCK_Y, BLOCK_X], 0.0, tl.float32)
        blue = tl.full([BLOCK_Y, BLOCK_X], 0.0, tl.float32)
        # Separable: each chunk of BLOCK_R input rows is resized along x once (each pixel read taps_x times, not
        # taps_x x taps_y), then every output row weighs the chunk's rows, most of them by zero, as one small matmul.
        for chunk in range(lowest, highest + 1, BLOCK_R):
            # The last chunk's rows past the span read its last row again (weighed by zero: past every stored output
            # row's support, or past the box), rather than masked loads, whose zeros for the masked lanes cost more
            # instructions (112 instead of 88 a tap in the loop below, 4 warps, compiled for sm_90).
            y = chunk + tl.arange(0, BLOCK_R)
            read_y = tl.minimum(y, highest) * width
            rows = (crop_base + read_y)[:, None]
            row_red = tl.full([BLOCK_R, BLOCK_X], 0.0, tl.float32)
            row_green = tl.full([BLOCK_R, BLOCK_X], 0.0, tl.float32)
            row_blue = tl.full([BLOCK_R, BLOCK_X], 0.0, tl.float32)
            for t in range(0, taps_x):
                x = first_x + t
                # Once a tap and chunk (for its BLOCK_R rows), where the direct version weighed each row's taps.
                weight_x = _axis_weight(x, center_x, inverse_x, box_w)[None, :]
                # Columns outside the box weigh zero: read its nearest column instead of past the image.
                at = rows + tl.minimum(tl.maximum(x, 0), box_w - 1)[None, :]
                row_red += weight_x * _as_float(tl.load(at))
                row_green += weight_x * _as_float(tl.load(at + plane))
                row_blue += weight_x * _as_float(tl.load(at + 2 * plane))
            # (BLOCK_Y, BLOCK_R): output row i's weight of input row y; zero outside its support and the box.
            weight_y = _axis_weight(y[None, :], center_y[:, None], inverse_y, box_h)
            # IEEE float32: TF32 would round the weights and the rows' sums to 11 significant bits (about 0.1 of 255).
            # Triton lowers a float32 dot to FMAs: each thread keeps its accumulators and reads the operands from
            # shared memory (compiled for sm_90 with 4 warps: 192 FMAs and 58 shared loads a thread a chunk). The
            # broadcast tl.sum(weight_y[:, :, None] * row_red[None], 1) compiles to the same code (Triton rewrites it
            # as this dot); "tf32x3" to tensor-core MMAs, but its operand splits take as many instructions.
            red = tl.dot(weight_y, row_red, red, input_precision="ieee")
            green = tl.dot(weight_y, row_green, green, input_precision="ieee")
            blue = tl.dot(weight_y, row_blue, blue, input_precision="ieee")

        # (Past the output's edge a tile's lanes may weigh nothing: no division by zero there, they are not stored.)
        scale = 1.0 / tl.maximum(total_y[:, None] * total_x[None, :], 1e-30)
        inside = (out_y < size)[:, None] & (out_x < size)[None, :]
        at = out + crop.to(tl.int64) * stride_n + out_y[:, None] * stride_h + out_x[None, :] * stride_w
        tl.store(at, red * scale, mask=inside)
        tl.store(at + stride_c, green * scale, mask=inside)
        tl.store(at + 2 * stride_c, blue * scale, mask=inside)
