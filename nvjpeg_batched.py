"""nvJPEG's batched hardware decoder called directly (``data.nvjpeg: preallocated``), for what torchvision's binding
does not let the caller choose.

``torchvision.io.decode_jpeg(list, device="cuda")`` creates nvJPEG with the default allocators and flags and lets it
size its buffers as batches come. On an H200 nvJPEG then freed device memory whenever images of new sizes came:
about 6 ``cuMemFree`` per call on a folder of many sizes, each waiting for the whole device and holding up every other
thread's launches (``bench/nvjpeg_calls.py``, bench/RESULTS.md). This module creates its own handle on the hardware
backend, sizes the hardware decoder's buffers once for the batch size and the largest image
(``nvjpegDecodeBatchedPreAllocate``, what DALI's ``preallocate_width_hint``/``preallocate_height_hint`` do), can turn
on nvJPEG's stream-ordered memory pools (``NVJPEG_FLAGS_ENABLE_MEMORY_POOLS``), and decodes a batch into one
buffer from PyTorch's allocator: planar RGB, image after image, the layout the batched crop of gpu_decode.py reads.

The library is the ``libnvjpeg`` torchvision ships (or the system's); calls go through ctypes, which releases the GIL
for each. Only baseline JPEGs of the hardware's subsamplings decode here; a batch nvJPEG refuses raises
:class:`NvjpegError` with the status, and gpu_decode.py then decodes that batch with torchvision.
"""

from __future__ import annotations

import ctypes
import glob
import os
import threading
from collections.abc import Sequence

import torch

NVJPEG_MAX_COMPONENT = 4
BACKEND_HARDWARE = 3
OUTPUT_RGB = 3  # planar R, G, B
CSS_444 = 0  # the largest chroma planes: preallocating for it covers the others
FLAG_ENABLE_MEMORY_POOLS = 1 << 1
STATUS = {
    0: "SUCCESS",
    1: "NOT_INITIALIZED",
    2: "INVALID_PARAMETER",
    3: "BAD_JPEG",
    4: "JPEG_NOT_SUPPORTED",
    5: "ALLOCATOR_FAILURE",
    6: "EXECUTION_FAILED",
    7: "ARCH_MISMATCH",
    8: "INTERNAL_ERROR",
    9: "IMPLEMENTATION_NOT_SUPPORTED",
    10: "INCOMPLETE_BITSTREAM",
}


class NvjpegError(RuntimeError):
    """An nvJPEG call failed; ``status`` is its ``nvjpegStatus_t``."""

    def __init__(self, call: str, status: int) -> None:
        super().__init__(f"{call} failed: NVJPEG_STATUS_{STATUS.get(status, status)} ({status})")
        self.status = status


class NvjpegImage(ctypes.Structure):
    """``nvjpegImage_t``: a device pointer and a row pitch (bytes) per output plane."""

    _fields_ = [
        ("channel", ctypes.c_void_p * NVJPEG_MAX_COMPONENT),
        ("pitch", ctypes.c_size_t * NVJPEG_MAX_COMPONENT),
    ]


def library_path() -> str:
    """The ``libnvjpeg`` to load: ``NVJPEG_LIBRARY`` if set, else the one torchvision ships, else the system's."""
    if os.environ.get("NVJPEG_LIBRARY"):
        return os.environ["NVJPEG_LIBRARY"]
    import torchvision

    shipped = sorted(glob.glob(os.path.join(os.path.dirname(torchvision.__file__) + ".libs", "libnvjpeg*.so*")))
    return shipped[0] if shipped else "libnvjpeg.so"


_lock = threading.Lock()
_library: ctypes.CDLL | None = None


def library() -> ctypes.CDLL:
    """The loaded library with the argument types of the calls used here (loaded once)."""
    global _library
    with _lock:
        if _library is None:
            path = library_path()
            try:
                lib = ctypes.CDLL(path)
            except OSError as error:
                raise NvjpegError(f"loading {path} ({error}); set NVJPEG_LIBRARY to a libnvjpeg.so", 8) from None
            p, i = ctypes.c_void_p, ctypes.c_int
            signatures = {
                "nvjpegGetProperty": [i, ctypes.POINTER(i)],
                "nvjpegCreateEx": [i, p, p, ctypes.c_uint, ctypes.POINTER(p)],
                "nvjpegDestroy": [p],
                "nvjpegJpegStateCreate": [p, ctypes.POINTER(p)],
                "nvjpegJpegStateDestroy": [p],
                "nvjpegDecodeBatchedPreAllocate": [p, p, i, i, i, i, i],
                "nvjpegDecodeBatchedInitialize": [p, p, i, i, i],
                "nvjpegDecodeBatched": [p, p, p, p, ctypes.POINTER(NvjpegImage), p],
            }
            for name, argtypes in signatures.items():
                function = getattr(lib, name)
                function.argtypes, function.restype = argtypes, i
            _library = lib
        return _library


def version() -> tuple[int, int, int]:
    """(major, minor, patch) of the loaded library."""
    lib, value, parts = library(), ctypes.c_int(), []
    for prop in range(3):  # MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
        _check("nvjpegGetProperty", lib.nvjpegGetProperty(prop, ctypes.byref(value)))
        parts.append(value.value)
    return parts[0], parts[1], parts[2]


def _check(call: str, status: int) -> None:
    if status != 0:
        raise NvjpegError(call, status)


class BatchedDecoder:
    """nvJPEG's hardware batched decoder on ``device``, its buffers sized once for ``batch_size`` images of at most
    ``max_height`` x ``max_width``.

    Args:
        device: The CUDA device to decode on.
        batch_size: Most JPEGs one call decodes.
        max_height: Largest image height to preallocate for (larger images still decode; nvJPEG grows its buffers).
        max_width: Largest image width to preallocate for.
        memory_pools: Create the handle with nvJPEG's stream-ordered memory pools.
        preallocate: Size the hardware decoder's buffers at once (``nvjpegDecodeBatchedPreAllocate``).
    """

    def __init__(
        self,
        device: torch.device | str,
        batch_size: int,
        max_height: int,
        max_width: int,
        memory_pools: bool = False,
        preallocate: bool = True,
    ) -> None:
        device = torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"nvJPEG decodes on a CUDA device, got {device}")
        if batch_size < 1 or max_height < 1 or max_width < 1:
            raise ValueError(
                f"batch_size, max_height and max_width must be positive, got {batch_size}, {max_height}, {max_width}"
            )
        self.device = device if device.index is not None else torch.device("cuda", torch.cuda.current_device())
        self.batch_size, self.max_height, self.max_width = batch_size, max_height, max_width
        self.lock = threading.Lock()  # one state: the train and val producers may decode at once
        self.lib = library()
        self.handle, self.state = ctypes.c_void_p(), ctypes.c_void_p()
        flags = FLAG_ENABLE_MEMORY_POOLS if memory_pools else 0
        with torch.cuda.device(self.device):
            _check(
                "nvjpegCreateEx",
                self.lib.nvjpegCreateEx(BACKEND_HARDWARE, None, None, flags, ctypes.byref(self.handle)),
            )
            _check("nvjpegJpegStateCreate", self.lib.nvjpegJpegStateCreate(self.handle, ctypes.byref(self.state)))
            if preallocate:
                status = self.lib.nvjpegDecodeBatchedPreAllocate(
                    self.handle, self.state, batch_size, max_width, max_height, CSS_444, OUTPUT_RGB
                )
                _check("nvjpegDecodeBatchedPreAllocate", status)

    def decode(self, jpegs: Sequence[torch.Tensor], sizes: Sequence[tuple[int, int]]) -> list[torch.Tensor]:
        """Decodes ``jpegs`` (uint8 1-D CPU tensors, the files' bytes) of ``sizes`` ((height, width) from their
        headers) on the current stream; returns uint8 ``(3, H, W)`` views of one buffer, image after image.

        The buffer comes from PyTorch's allocator on the current stream; the JPEG bytes must stay unchanged until the
        work queued here has run.
        """
        if len(jpegs) != len(sizes):
            raise ValueError(f"{len(jpegs)} JPEGs but {len(sizes)} sizes")
        count = len(jpegs)
        if not count:
            return []
        if count > self.batch_size:
            raise ValueError(f"{count} JPEGs in one call; this decoder holds at most batch_size={self.batch_size}")
        planes = [height * width for height, width in sizes]
        out = torch.empty(3 * sum(planes), dtype=torch.uint8, device=self.device)
        base = out.data_ptr()
        images = (NvjpegImage * count)()
        data = (ctypes.c_void_p * count)()
        lengths = (ctypes.c_size_t * count)()
        views, offset = [], 0
        for k, (jpeg, (height, width), plane) in enumerate(zip(jpegs, sizes, planes, strict=True)):
            if jpeg.dtype != torch.uint8 or jpeg.dim() != 1 or jpeg.device.type != "cpu" or not jpeg.is_contiguous():
                raise ValueError(
                    f"JPEG {k}: expected contiguous uint8 1-D bytes on the CPU, got {jpeg.dtype} {jpeg.shape}"
                )
            data[k], lengths[k] = jpeg.data_ptr(), jpeg.numel()
            for c in range(3):
                images[k].channel[c] = base + offset + c * plane
                images[k].pitch[c] = width
            views.append(out[offset : offset + 3 * plane].view(3, height, width))
            offset += 3 * plane
        stream = torch.cuda.current_stream(self.device).cuda_stream
        with self.lock:
            _check(
                "nvjpegDecodeBatchedInitialize",
                self.lib.nvjpegDecodeBatchedInitialize(self.handle, self.state, count, 1, OUTPUT_RGB),
            )
            status = self.lib.nvjpegDecodeBatched(
                self.handle, self.state, ctypes.cast(data, ctypes.c_void_p), ctypes.cast(lengths, ctypes.c_void_p),
                images, ctypes.c_void_p(stream),
            )  # fmt: skip
        _check("nvjpegDecodeBatched", status)
        return views

    def close(self) -> None:
        """Frees the state and the handle (waits for the device: call it outside the hot loop)."""
        if self.state:
            torch.cuda.synchronize(self.device)
            self.lib.nvjpegJpegStateDestroy(self.state)
            self.state = ctypes.c_void_p()
        if self.handle:
            self.lib.nvjpegDestroy(self.handle)
            self.handle = ctypes.c_void_p()
