"""nvJPEG's batched hardware decoder called directly (``data.nvjpeg: preallocated``), for what torchvision's binding
does not let the caller choose.

``torchvision.io.decode_jpeg(list, device="cuda")`` creates nvJPEG with the default allocators and flags and lets it
size its buffers as batches come. On an H200 nvJPEG then freed device memory whenever images of new sizes came:
about 6 ``cuMemFree`` per call on a folder of many sizes, each waiting for the whole device and holding up every other
thread's launches (``bench/nvjpeg_calls.py``, bench/RESULTS.md). This module creates its own handle on the hardware
backend, sizes the hardware decoder's buffers once for the batch size and the largest image
(``nvjpegDecodeBatchedPreAllocate``, what DALI's ``preallocate_width_hint``/``preallocate_height_hint`` do), and
decodes a batch into one buffer from PyTorch's allocator: planar RGB, image after image, the layout the batched crop of
gpu_decode.py reads.

The library is the ``libnvjpeg`` torchvision ships (or the system's); calls go through ctypes, which releases the GIL
for each. Only the JPEGs the hardware decoder takes (``nvjpegDecodeBatchedSupported``: baseline, its subsamplings)
decode here; gpu_decode.py decodes the others, and a batch nvJPEG fails, with torchvision.
"""

from __future__ import annotations

import ctypes
import glob
import os
import threading
import warnings
from collections.abc import Sequence

import torch

NVJPEG_MAX_COMPONENT = 4
BACKEND_HARDWARE = 3
OUTPUT_RGB = 3  # planar R, G, B
CSS_444 = 0  # the largest chroma planes: preallocating for it covers the others
CSS_UNKNOWN = -1
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
_header_library: ctypes.PyDLL | None = None

#: Calls that only read a JPEG's header on the host (microseconds): made through ``PyDLL``, which keeps the GIL, so a
#: batch does not release and take back the GIL three times per image against the training thread.
_HEADER_CALLS = ("nvjpegGetImageInfo", "nvjpegJpegStreamParseHeader", "nvjpegDecodeBatchedSupported")


def library() -> ctypes.CDLL:
    """The loaded library (calls release the GIL), with the argument types of the calls used here (loaded once)."""
    return _load()[0]


def header_library() -> ctypes.PyDLL:
    """The same library for the header calls (:data:`_HEADER_CALLS`), which keep the GIL."""
    return _load()[1]


def _load() -> tuple[ctypes.CDLL, ctypes.PyDLL]:
    global _library, _header_library
    with _lock:
        if _library is None or _header_library is None:
            path = library_path()
            try:
                lib, header_lib = ctypes.CDLL(path), ctypes.PyDLL(path)
            except OSError as error:
                raise NvjpegError(f"loading {path} ({error}); set NVJPEG_LIBRARY to a libnvjpeg.so", 8) from None
            p, i, size = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
            signatures = {
                "nvjpegGetProperty": [i, ctypes.POINTER(i)],
                "nvjpegCreateEx": [i, p, p, ctypes.c_uint, ctypes.POINTER(p)],
                "nvjpegDestroy": [p],
                "nvjpegJpegStateCreate": [p, ctypes.POINTER(p)],
                "nvjpegJpegStateDestroy": [p],
                "nvjpegDecodeBatchedPreAllocate": [p, p, i, i, i, i, i],
                "nvjpegDecodeBatchedInitialize": [p, p, i, i, i],
                "nvjpegDecodeBatched": [p, p, p, p, ctypes.POINTER(NvjpegImage), p],
                "nvjpegGetImageInfo": [p, p, size, *[ctypes.POINTER(i)] * 4],
                "nvjpegJpegStreamCreate": [p, ctypes.POINTER(p)],
                "nvjpegJpegStreamDestroy": [p],
                "nvjpegJpegStreamParseHeader": [p, p, size, p],
                "nvjpegDecodeBatchedSupported": [p, p, ctypes.POINTER(i)],
            }
            for name, argtypes in signatures.items():
                for target in (lib, header_lib) if name in _HEADER_CALLS else (lib,):
                    function = getattr(target, name, None)
                    if function is None:
                        raise NvjpegError(
                            f"{path} has no {name} (an nvJPEG older than CUDA 11?); set NVJPEG_LIBRARY", 9
                        )
                    function.argtypes, function.restype = argtypes, i
            _library, _header_library = lib, header_lib
        return _library, _header_library


#: Sizes of the workers' reading compared with nvJPEG's own before they are trusted (see BatchedDecoder.decode): two
#: batches of 256, so that a library that reads headers otherwise (another nvJPEG, another GPU) is found first.
CHECKED_SIZES = 512


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
        preallocate: Size the hardware decoder's buffers at once (``nvjpegDecodeBatchedPreAllocate``).
    """

    def __init__(
        self,
        device: torch.device | str,
        batch_size: int,
        max_height: int,
        max_width: int,
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
        # One state: calls are serialized, and each waits for the previous batch's decode (``done``) before it touches
        # the state's staging buffers, as torchvision (a stream sync) and nvImageCodec (an event) do.
        self.lock = threading.Lock()
        # Sizes of the workers' reading compared with nvJPEG's, and whether they are still believed (CHECKED_SIZES).
        self.checked, self.trust_known = 0, True
        self.lib, self.header_lib = library(), header_library()
        self.handle, self.state, self.parser = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
        try:
            with torch.cuda.device(self.device):
                self.done = torch.cuda.Event()
                handle = ctypes.byref(self.handle)
                _check("nvjpegCreateEx", self.lib.nvjpegCreateEx(BACKEND_HARDWARE, None, None, 0, handle))
                _check("nvjpegJpegStateCreate", self.lib.nvjpegJpegStateCreate(self.handle, ctypes.byref(self.state)))
                _check(
                    "nvjpegJpegStreamCreate", self.lib.nvjpegJpegStreamCreate(self.handle, ctypes.byref(self.parser))
                )
                if preallocate:
                    status = self.lib.nvjpegDecodeBatchedPreAllocate(
                        self.handle, self.state, batch_size, max_width, max_height, CSS_444, OUTPUT_RGB
                    )
                    _check("nvjpegDecodeBatchedPreAllocate", status)
        except BaseException:
            self.close()
            raise

    def decode(
        self, jpegs: Sequence[torch.Tensor], known: Sequence[tuple[int, int] | None] | None = None
    ) -> list[torch.Tensor | None]:
        """Decodes, on the current stream, the JPEGs (uint8 1-D CPU tensors: the files' bytes) that the hardware
        decoder takes; returns uint8 ``(3, H, W)`` views of one buffer (spare bytes at its end) for those and None
        for the others (progressive JPEGs, unusual subsamplings), which the caller decodes some other way.

        Each image's buffer is sized from its header, as nvJPEG reads it (``nvjpegGetImageInfo``,
        ``nvjpegDecodeBatchedSupported``) or, once :data:`CHECKED_SIZES` sizes of the workers' reading have matched
        nvJPEG's, as ``known[k]`` says: :func:`jpeg_header.hardware_size` of JPEG ``k``'s very bytes, read in a
        loader worker (None: nvJPEG reads that header). A size that differs makes nvJPEG read every header from then
        on, with a warning, as does a failed call with sizes from ``known``. The buffer comes from PyTorch's allocator
        on the current stream; the JPEG bytes must stay unchanged until the work queued here has run. Raises
        :class:`NvjpegError` when nvJPEG fails (a broken file, an error of the call).
        """
        if known is not None and len(known) != len(jpegs):
            raise ValueError(f"known holds {len(known)} sizes for {len(jpegs)} JPEGs")
        with torch.cuda.device(self.device), self.lock:
            if not self.handle:
                raise NvjpegError("decode after close", 1)
            self.done.synchronize()
            sizes, trusted = self._sizes(jpegs, known)
            chosen = [k for k, size in enumerate(sizes) if size is not None]
            if len(chosen) > self.batch_size:
                raise ValueError(f"{len(chosen)} JPEGs in one call; this decoder takes batch_size={self.batch_size}")
            results: list[torch.Tensor | None] = [None] * len(jpegs)
            if not chosen:
                return results
            planes = [sizes[k][0] * sizes[k][1] for k in chosen]  # type: ignore[index]
            # Spare bytes past the last image, a row of the widest rounded up to 8: gpu_decode's strided gather reads
            # up to that far past an image's end, and so reads this buffer where it is, with no copy of the images.
            spare = -(-max(sizes[k][1] for k in chosen) // 8) * 8  # type: ignore[index]
            out = torch.empty(3 * sum(planes) + spare, dtype=torch.uint8, device=self.device)
            base, offset = out.data_ptr(), 0
            images = (NvjpegImage * len(chosen))()
            data = (ctypes.c_void_p * len(chosen))()
            lengths = (ctypes.c_size_t * len(chosen))()
            for row, (k, plane) in enumerate(zip(chosen, planes, strict=True)):
                height, width = sizes[k]  # type: ignore[misc]
                data[row], lengths[row] = jpegs[k].data_ptr(), jpegs[k].numel()
                for c in range(3):
                    images[row].channel[c] = base + offset + c * plane
                    images[row].pitch[c] = width
                results[k] = out[offset : offset + 3 * plane].view(3, height, width)
                offset += 3 * plane
            stream = torch.cuda.current_stream(self.device)
            _check(
                "nvjpegDecodeBatchedInitialize",
                self.lib.nvjpegDecodeBatchedInitialize(self.handle, self.state, len(chosen), 1, OUTPUT_RGB),
            )
            status = self.lib.nvjpegDecodeBatched(
                self.handle, self.state, ctypes.cast(data, ctypes.c_void_p), ctypes.cast(lengths, ctypes.c_void_p),
                images, ctypes.c_void_p(stream.cuda_stream),
            )  # fmt: skip
            self.done.record(stream)
            if status != 0:
                # Whatever nvJPEG queued may still write into ``out``: it must not go back to the allocator before.
                stream.synchronize()
                if trusted:  # perhaps a JPEG the workers vouched for that the hardware refuses: ask nvJPEG from now on
                    self._distrust("a batch with sizes the loader's workers read failed")
                raise NvjpegError("nvjpegDecodeBatched", status)
            return results

    def _sizes(
        self, jpegs: Sequence[torch.Tensor], known: Sequence[tuple[int, int] | None] | None
    ) -> tuple[list[tuple[int, int] | None], bool]:
        """(height, width) of each JPEG the hardware decoder takes, else None, and whether any came from ``known``
        unchecked: nvJPEG reads every header until :data:`CHECKED_SIZES` of ``known``'s sizes have matched its
        reading, then only those ``known`` leaves to it."""
        if known is None or not self.trust_known:
            return [self._inspect(k, jpeg) for k, jpeg in enumerate(jpegs)], False
        if self.checked < CHECKED_SIZES:
            own = [self._inspect(k, jpeg) for k, jpeg in enumerate(jpegs)]
            compared = [k for k, size in enumerate(known) if size is not None]
            self.checked += len(compared)
            differ = [k for k in compared if known[k] != own[k]]
            if differ:
                k = differ[0]
                self._distrust(
                    f"nvJPEG reads the header of JPEG {k} of a batch as {own[k]} (height, width; None: not for its "
                    f"hardware decoder), the loader's workers as {known[k]} ({len(differ)} such JPEGs in the batch)"
                )
            return own, False
        sizes = [
            self._inspect(k, jpeg) if size is None else _checked(k, jpeg, size)
            for k, (jpeg, size) in enumerate(zip(jpegs, known, strict=True))
        ]
        return sizes, any(size is not None for size in known)

    def _distrust(self, why: str) -> None:
        self.trust_known = False
        warnings.warn(f"{why}; nvJPEG reads every header from now on", stacklevel=4)

    def inherit(self, old: BatchedDecoder) -> None:
        """Takes over ``old``'s checks of the workers' sizes (a decoder remade larger goes on where it was)."""
        self.checked, self.trust_known = old.checked, old.trust_known

    def image_info(self, k: int, jpeg: torch.Tensor) -> tuple[list[tuple[int, int]], int]:
        """(height, width) of each of JPEG ``k``'s components (one for a gray JPEG) and its chroma subsampling
        (``nvjpegChromaSubsampling_t``; :data:`CSS_UNKNOWN` for one nvJPEG does not know), as nvJPEG reads the header
        (``nvjpegGetImageInfo``). Raises :class:`NvjpegError` for a header it cannot read."""
        _checked(k, jpeg)
        components, subsampling = ctypes.c_int(), ctypes.c_int()
        widths, heights = (ctypes.c_int * NVJPEG_MAX_COMPONENT)(), (ctypes.c_int * NVJPEG_MAX_COMPONENT)()
        status = self.header_lib.nvjpegGetImageInfo(
            self.handle, ctypes.c_void_p(jpeg.data_ptr()), jpeg.numel(), ctypes.byref(components),
            ctypes.byref(subsampling), widths, heights,
        )  # fmt: skip
        _check(f"nvjpegGetImageInfo (JPEG {k})", status)
        return [(heights[c], widths[c]) for c in range(components.value)], subsampling.value

    def _inspect(self, k: int, jpeg: torch.Tensor) -> tuple[int, int] | None:
        """(height, width) from the header when the hardware decoder takes the JPEG, else None."""
        components, subsampling = self.image_info(k, jpeg)
        if subsampling == CSS_UNKNOWN or not components or min(components[0]) < 1:
            return None
        pointer, length = ctypes.c_void_p(jpeg.data_ptr()), jpeg.numel()
        _check(f"nvjpegJpegStreamParseHeader (JPEG {k})", self.header_lib.nvjpegJpegStreamParseHeader(
            self.handle, pointer, length, self.parser
        ))  # fmt: skip
        supported = ctypes.c_int(-1)
        _check("nvjpegDecodeBatchedSupported", self.header_lib.nvjpegDecodeBatchedSupported(
            self.handle, self.parser, ctypes.byref(supported)
        ))  # fmt: skip
        return components[0] if supported.value == 0 else None  # 0: the hardware takes it

    def close(self) -> None:
        """Frees the parser, the state and the handle (waits for the device: call it outside the hot loop)."""
        with self.lock:
            if self.state or self.parser:
                torch.cuda.synchronize(self.device)
            for attribute, destroy in (
                ("parser", self.lib.nvjpegJpegStreamDestroy),
                ("state", self.lib.nvjpegJpegStateDestroy),
                ("handle", self.lib.nvjpegDestroy),
            ):
                if getattr(self, attribute):
                    destroy(getattr(self, attribute))
                    setattr(self, attribute, ctypes.c_void_p())


def _checked(k: int, jpeg: torch.Tensor, size: tuple[int, int] | None = None) -> tuple[int, int] | None:
    """``size``, once JPEG ``k`` is bytes nvJPEG can read (contiguous uint8 1-D on the CPU) and ``size`` is None or
    a (height, width) a JPEG frame can have."""
    if jpeg.dtype != torch.uint8 or jpeg.dim() != 1 or jpeg.device.type != "cpu" or not jpeg.is_contiguous():
        raise ValueError(f"JPEG {k}: expected contiguous uint8 1-D bytes on the CPU, got {jpeg.dtype} {jpeg.shape}")
    if size is not None and not (
        type(size) is tuple and len(size) == 2 and all(type(side) is int and 0 < side < 65536 for side in size)
    ):
        raise ValueError(f"JPEG {k}: known size {size!r} is not a (height, width) of ints from 1 to 65535")
    return size
