"""The GPU decode path's worker side (``data.decode: gpu``): what a loader worker reads, draws and hands over.

A worker reads the file and draws the augmentation; it does not decode a plain JPEG. It parses the JPEG header for
the size, draws the RandomResizedCrop box and the flip exactly as torchvision would (validation: the window of source
pixels that ``Resize`` + ``CenterCrop`` read, :func:`center_crop_geometry`), and hands over the encoded bytes
(:class:`Encoded`). Files nvJPEG should not get (CMYK or YCCK JPEGs, PNGs named .JPEG, EXIF-rotated photos) are
decoded by PIL here and travel as uint8 pixels. With ``data.cpu_decode_share`` the worker decodes that share of the
files (a fixed hash of class folder and file name, :func:`decoded_on_cpu`) and finishes their crops as ``data.decode:
cpu`` would. :func:`encoded_collate` packs a batch into one buffer (:class:`PackedBatch`), which the GPU side
(gpu_decode.py) unpacks, decodes with nvJPEG and crops.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any, NamedTuple

import numpy as np
import torch
from PIL import Image
from torchvision import transforms

from image_loading import MAX_PIXELS, read_plain_jpeg
from jpeg_header import hardware_size


@dataclass
class Encoded:
    """One sample as the worker hands it over: bytes to decode on the GPU, or pixels the worker already decoded.

    Attributes:
        data: uint8 1-D tensor of the JPEG file, or uint8 ``(3, H, W)`` pixels.
        encoded: Whether ``data`` is a JPEG to decode.
        box: ``(top, left, height, width)`` of the crop in the decoded image: the pixels the output is made of.
        flip: Mirror the crop horizontally.
        finished: ``data`` is the final crop, uint8 ``(3, size, size)``: the worker decoded, cropped, resized and
            flipped it (``data.cpu_decode_share``, with ``data.cpu_decoder``'s loader and transform); ``box`` covers
            it whole and ``flip`` is False.
        hardware_size: ``(height, width)`` of a JPEG that nvJPEG's hardware decoder takes, read by the worker
            (:func:`jpeg_header.hardware_size`, and the same as PIL's reading): ``data.nvjpeg: preallocated``
            uses it instead of nvJPEG's reading once enough of these sizes have matched nvJPEG's
            (:meth:`nvjpeg_batched.BatchedDecoder.decode`). None: nvJPEG reads the header.
        resize: ``(height, width, top, left)``: the output is the ``size x size`` pixels at ``(top, left)`` of the
            whole decoded image resized to ``height x width`` (validation's ``Resize`` + ``CenterCrop``, see
            :func:`center_crop_geometry`), and ``box`` is the window of the image those pixels read. None: the
            output is ``box`` resized to ``size x size`` (RandomResizedCrop).
    """

    data: torch.Tensor
    encoded: bool
    box: tuple[int, int, int, int]
    flip: bool
    finished: bool = False
    hardware_size: tuple[int, int] | None = None
    resize: tuple[int, int, int, int] | None = None


class PackedBatch(NamedTuple):
    """A batch of the GPU path as a worker hands it over: every sample's bytes in one buffer.

    The loader sends each tensor of a batch from the worker through a shared-memory file descriptor of its own, which
    the main process receives and maps with the GIL held (a socket, a ``recvmsg``, an ``mmap`` and Python around them,
    per tensor): 256 JPEGs as 256 tensors held the GIL for milliseconds of every step, when the training thread needs
    it to launch kernels (measured with nsys on an H200, see bench/RESULTS.md). Packed, a batch is one buffer and a
    NumPy table, which pickles by value.

    Attributes:
        data: uint8 1-D: ``finished`` crops of ``(3, size, size)``, then every other sample's JPEG bytes or pixels.
        finished: How many finished crops (:attr:`Encoded.finished`) lead the buffer.
        size: Side of the finished crops.
        table: int64 ``(n - finished, 15)``, one row per other sample: offset and length in ``data``, encoded, height
            and width of its pixels (of a JPEG: :attr:`Encoded.hardware_size`, or 0), then the crop box (top, left,
            height, width), the flip, whether the JPEG's height and width are its ``hardware_size``, and
            :attr:`Encoded.resize` (zeros for None).
    """

    data: torch.Tensor
    finished: int
    size: int
    table: np.ndarray

    def unpack(self) -> tuple[torch.Tensor, list[Encoded]]:
        """The finished crops as a uint8 ``(finished, 3, size, size)`` view of ``data``, and the other samples with
        views of ``data`` as their bytes."""
        side = self.size
        finished = self.data[: self.finished * 3 * side * side].view(self.finished, 3, side, side)
        samples = []
        for row in self.table.tolist():
            offset, length, encoded, height, width, top, left, box_h, box_w, flip, hardware = row[:11]
            data = self.data[offset : offset + length]
            if not encoded:
                data = data.view(3, height, width)
            known = (height, width) if hardware else None
            resize = tuple(row[11:]) if row[11] else None
            box = (top, left, box_h, box_w)
            samples.append(Encoded(data, bool(encoded), box, bool(flip), hardware_size=known, resize=resize))
        return finished, samples


def decoded_on_cpu(path: str, share: float) -> bool:
    """Whether the file at ``path`` is one of the ``share`` of files the workers decode: a hash of its class folder and
    file name below ``share``, so the choice is the same in every worker, rank, epoch and run, wherever the dataset is
    mounted."""
    if share <= 0.0:
        return False
    key = "/".join(PurePath(path).parts[-2:])
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little") < share * 2.0**64


def center_crop_geometry(
    height: int, width: int, resize: int, crop: int
) -> tuple[tuple[int, int, int, int], tuple[int, int, int, int]]:
    """torchvision's ``Resize(resize)`` then ``CenterCrop(crop)`` of a ``height x width`` image as
    :class:`Encoded` describes it: the box ``(top, left, height, width)`` of the source pixels the crop is made of, and
    the resize ``(resized height, resized width, top, left)``: the size ``Resize`` gives the image and the crop's
    offset in it, rounded as ``CenterCrop`` rounds it. ``crop`` must not exceed ``resize``."""
    if not 1 <= crop <= resize or min(height, width) < 1:
        raise ValueError(f"center_crop_geometry: needs 1 <= crop <= resize and a non-empty image, got {locals()}")
    # transforms.functional.resize's arithmetic: the short side becomes ``resize``, the long side is truncated.
    short, long = (width, height) if width <= height else (height, width)
    new_short, new_long = resize, int(resize * long / short)
    resized_w, resized_h = (new_short, new_long) if width <= height else (new_long, new_short)
    into_y, into_x = int(round((resized_h - crop) / 2.0)), int(round((resized_w - crop) / 2.0))
    top, box_h = _support(height, resized_h, into_y, crop)
    left, box_w = _support(width, resized_w, into_x, crop)
    return (top, left, box_h, box_w), (resized_h, resized_w, into_y, into_x)


def _support(length: int, resized: int, first: int, count: int) -> tuple[int, int]:
    """Start and length of the source pixels that outputs ``first .. first + count - 1`` of an antialiased bilinear
    resize from ``length`` to ``resized`` pixels read: ATen's ``_upsample_bilinear2d_aa`` window (center
    ``(i + 0.5) * scale``, half-width ``max(scale, 1)``), one pixel wider on each side against rounding (weights
    there are zero), cut at the image."""
    scale = length / resized
    support = max(scale, 1.0)
    start = max(math.floor((first + 0.5) * scale - support + 0.5) - 1, 0)
    stop = min(math.floor((first + count - 0.5) * scale + support + 0.5) + 1, length)
    return start, stop - start


class EncodedSampleLoader:
    """The ImageFolder ``loader`` + ``transform`` of the GPU path, in the worker.

    Args:
        train: Draw a RandomResizedCrop box and a flip (else the validation center box).
        crop_size: Output side (for validation: the center crop).
        min_crop_scale: Smallest area fraction of the RandomResizedCrop.
        resize_size: Validation resize of the short side.
        pil_loader: Decoder for the files nvJPEG should not get (returns an RGB PIL image).
        cpu_share: Share of the files (by :func:`decoded_on_cpu`) that ``cpu_loader`` decodes and ``cpu_transform``
            crops here.
        cpu_transform: The ``data.decode: cpu`` transform of this split: ``cpu_loader``'s image in, ``crop_size``
            image out (PIL, or a ``(3, H, W)`` uint8 tensor under ``data.cpu_decoder: torchvision``).
        cpu_loader: The ``data.decode: cpu`` loader of the CPU share (default ``pil_loader``).
        read_headers: Read each JPEG's frame header for nvJPEG's hardware decoder
            (:attr:`Encoded.hardware_size`; for ``data.nvjpeg: preallocated``, which uses it).
    """

    def __init__(
        self,
        train: bool,
        crop_size: int,
        min_crop_scale: float,
        resize_size: int,
        pil_loader: Callable[[str], Image.Image],
        cpu_share: float = 0.0,
        cpu_transform: Callable[[Any], Any] | None = None,
        cpu_loader: Callable[[str], Any] | None = None,
        read_headers: bool = False,
    ) -> None:
        if not 0.0 <= cpu_share <= 1.0:
            raise ValueError(f"cpu_share must be in [0, 1], got {cpu_share}")
        if cpu_share > 0.0 and cpu_transform is None:
            raise ValueError("cpu_share > 0 needs the cpu_transform that crops the files decoded on the CPU")
        self.cpu_share = cpu_share
        self.cpu_transform = cpu_transform
        self.train = train
        self.crop_size = crop_size
        self.resize_size = resize_size
        self.scale = (min_crop_scale, 1.0)
        self.ratio = (3.0 / 4.0, 4.0 / 3.0)
        self.pil_loader = pil_loader
        self.cpu_loader = pil_loader if cpu_loader is None else cpu_loader
        self.read_headers = read_headers

    def __call__(self, path: str) -> Encoded:
        if self.cpu_share and decoded_on_cpu(path, self.cpu_share):
            return self._finished(path)
        # A JPEG without its end-of-image marker last is truncated (or carries trailing bytes): PIL decodes and judges
        # it, so a truncated file is a BadImageError of its sample, not an nvJPEG error of the whole batch.
        max_pixels = getattr(self.pil_loader, "max_pixels", MAX_PIXELS)
        plain = read_plain_jpeg(path, max_pixels)
        if plain is not None:
            # The PIL loader's own rules, as decode: cpu applies them: a JPEG over its pixel limit is its to refuse,
            # and one at least twice as large as any crop needs its to decode at a reduced size (a 16k x 16k photo
            # would otherwise take 0.8 GB of nvJPEG output and a float copy of its crop on the GPU).
            width, height = plain[1].size
            draft = getattr(self.pil_loader, "draft_min_side", None)
            if width * height > max_pixels or (draft is not None and min(width, height) >= 2 * draft):
                plain = None
        hardware = None
        if plain is not None:
            raw, header = plain
            data, encoded = torch.frombuffer(bytearray(raw), dtype=torch.uint8), True
            width, height = header.size
            if self.read_headers:  # here, in parallel, not on the producer thread with the GIL held
                hardware = hardware_size(raw)
                hardware = hardware if hardware == (height, width) else None  # and PIL reads the same size
        else:
            image = self.pil_loader(path)
            width, height = image.size
            data, encoded = torch.from_numpy(np.array(image, dtype=np.uint8)).permute(2, 0, 1).contiguous(), False
        if not self.train:
            box, resize = center_crop_geometry(height, width, self.resize_size, self.crop_size)
            return Encoded(data, encoded, box, False, hardware_size=hardware, resize=resize)
        # torchvision's own sampler of boxes, on a stand-in of the right size: the same distribution, the same RNG.
        box = transforms.RandomResizedCrop.get_params(torch.empty(0, height, width), self.scale, self.ratio)
        flip = bool(torch.rand(1) < 0.5)
        return Encoded(data, encoded, tuple(int(v) for v in box), flip, hardware_size=hardware)

    def _finished(self, path: str) -> Encoded:
        """The sample as ``data.decode: cpu`` makes it: the CPU loader's decode, then this split's crop (and flip)."""
        assert self.cpu_transform is not None
        image = self.cpu_transform(self.cpu_loader(path))
        if isinstance(image, torch.Tensor):
            pixels = image.contiguous()
            size = (pixels.shape[-1], pixels.shape[-2])
        else:
            pixels, size = None, image.size
        if size != (self.crop_size, self.crop_size):
            raise ValueError(
                f"{path}: the CPU transform gave {size[0]}x{size[1]}, the batch needs {self.crop_size}x{self.crop_size}"
            )
        if pixels is None:
            pixels = torch.from_numpy(np.array(image, dtype=np.uint8)).permute(2, 0, 1).contiguous()
        return Encoded(pixels, False, (0, 0, self.crop_size, self.crop_size), False, finished=True)


def encoded_collate(batch: Sequence[tuple[Encoded, int]]) -> tuple[PackedBatch, torch.Tensor]:
    """Packs a batch of :class:`EncodedSampleLoader` samples into one :class:`PackedBatch` and stacks the targets.

    Samples the workers finished (:attr:`Encoded.finished`) come first, the targets in the same order: the order
    within a batch matters neither to training nor to the metrics. In a worker the buffer is allocated in shared memory
    directly, as the loader's own collate does, so sending it copies nothing.
    """
    finished = [(sample, target) for sample, target in batch if sample.finished]
    rest = [(sample, target) for sample, target in batch if not sample.finished]
    side = finished[0][0].data.shape[-1] if finished else 0
    lead = len(finished) * 3 * side * side
    lengths = [sample.data.numel() for sample, _ in rest]
    total = lead + sum(lengths)
    if torch.utils.data.get_worker_info() is not None:
        data = torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage._new_shared(total))
    else:
        data = torch.empty(total, dtype=torch.uint8)
    if finished:
        crops = data[:lead].view(len(finished), 3, side, side)
        for i, (sample, _) in enumerate(finished):
            if tuple(sample.data.shape) != (3, side, side):
                raise ValueError(f"finished crops of one batch differ in size: {tuple(sample.data.shape)} and {side}")
            crops[i] = sample.data
    table = np.zeros((len(rest), 15), dtype=np.int64)
    offset = lead
    for row, ((sample, _), length) in enumerate(zip(rest, lengths, strict=True)):
        data[offset : offset + length] = sample.data.reshape(-1)
        hardware = sample.encoded and sample.hardware_size is not None
        if sample.encoded:
            height, width = sample.hardware_size or (0, 0)
        else:
            height, width = sample.data.shape[1:]
        resize = sample.resize or (0, 0, 0, 0)
        table[row] = (offset, length, sample.encoded, height, width, *sample.box, sample.flip, hardware, *resize)
        offset += length
    targets = torch.tensor([target for _, target in finished + rest], dtype=torch.int64)
    return PackedBatch(data, len(finished), side, table), targets
