"""``data.cpu_decoder: torchvision``: the workers' decode and crop on uint8 tensors instead of PIL images.

``torchvision.io.decode_jpeg`` (libjpeg-turbo, as PIL; the same pixels on every file tested) and torch's uint8
antialiased bilinear resize (torchvision's v2 kernels, vectorized) in place of PIL's decode and resize. On one core of
an H200 machine: 1.33x PIL's images per second on 300-500 px JPEGs and 1.28x on a ``resize_dataset.py`` copy at short
side 256; 14 processes at once, 1.18x and 1.21x (``bench/pil_decode_rate.py --decoders pil torchvision``; README,
"Feeding the GPU").

What stays as with PIL, and where the two differ:

* The crop and flip: :class:`TrainTransform` draws its box with torchvision's own ``RandomResizedCrop.get_params``
  and its flip as ``RandomHorizontalFlip`` does, from the same generator, so a sample's seed
  (bad_image_policy.SeededIndex) gives the same box and flip under both decoders.
* The pixels, within a level or two: the resize rounds differently from PIL's, by at most 1 when it downscales (on a
  few thousandths of the pixels at most crop sizes, on up to a quarter of them at some), and by at most 2 on a few
  pixels of an upsampled crop (a box smaller than the output; tests/test_cpu_decode.py).
* A damaged JPEG that libjpeg still decodes (a corrupt segment, an end marker after a cut) loads on both paths, and
  under this one libjpeg prints its warning (``Corrupt JPEG data: ...``) to stderr without the file's name; PIL
  decodes it silently.
* Every rule of :func:`image_loading.load_rgb` (formats, modes, transparency, 16 bit, EXIF orientation, truncated
  files, the size bound, reduced-size decoding of huge JPEGs): only a plain JPEG (:func:`image_loading.plain_jpeg`)
  of ordinary size is decoded here; any other file, and one torchvision fails on, is loaded by ``load_rgb``, which
  applies those rules or raises ``BadImageError`` naming the file, and stays a PIL image: the transforms below then
  crop it with PIL's own resize (torchvision's v2 functions take either), so a huge PNG is cropped before it becomes
  an array, as on the PIL path.

:class:`TensorImageLoader` gives a ``(3, H, W)`` uint8 tensor or that PIL image; ``fast_collate`` takes both.
:func:`workers_pipeline` gives the loader and transforms of either decoder.
"""

from __future__ import annotations

from typing import Any

import torch
import torchvision.transforms.v2.functional as F
from PIL import Image
from torchvision import transforms
from torchvision.io import ImageReadMode, decode_jpeg

from image_loading import ImageLoader, load_rgb, read_plain_jpeg, refuse_truncated_loading

#: ``data.cpu_decoder``'s values: PIL images, or this module's uint8 tensors.
CPU_DECODERS = ("pil", "torchvision")


class TensorImageLoader(ImageLoader):
    """Picklable ``loader`` for ``ImageFolder``: a plain JPEG as a ``(3, H, W)`` uint8 RGB tensor; any other file as
    the RGB PIL image :func:`image_loading.load_rgb` makes of it. Options and their checks are
    :class:`image_loading.ImageLoader`'s.

    Args:
        max_pixels: Largest width x height that loads (as :func:`image_loading.load_rgb`).
        draft_min_side: JPEGs with a short side of at least twice this go to ``load_rgb``, which decodes them at a
            reduced size (see :func:`image_loading.min_decode_side`); ``None`` decodes every plain JPEG here.
    """

    def __call__(self, path: str) -> torch.Tensor | Image.Image:
        refuse_truncated_loading(path)  # at the first image, as load_rgb: not only at the first file PIL decodes
        plain = read_plain_jpeg(path, self.max_pixels)
        if plain is not None:
            raw, header = plain
            width, height = header.size
            drafted = self.draft_min_side is not None and min(width, height) >= 2 * self.draft_min_side
            if width * height <= self.max_pixels and not drafted:
                try:
                    return decode_jpeg(torch.frombuffer(bytearray(raw), dtype=torch.uint8), mode=ImageReadMode.RGB)
                except RuntimeError:
                    pass  # a corrupt stream: load_rgb decodes and judges it
        return load_rgb(path, self.max_pixels, self.draft_min_side)


class TrainTransform:
    """``RandomResizedCrop(size, scale)`` then ``RandomHorizontalFlip()`` on a ``(3, H, W)`` uint8 tensor (or a PIL
    image, with PIL's resize), with torchvision's draws (see the module docstring) and an antialiased bilinear
    resize."""

    def __init__(self, size: int, scale: tuple[float, float], ratio: tuple[float, float] = (3 / 4, 4 / 3)) -> None:
        self.size = size
        self.scale = scale
        self.ratio = ratio

    def __call__(self, image: torch.Tensor | Image.Image) -> torch.Tensor | Image.Image:
        top, left, height, width = transforms.RandomResizedCrop.get_params(image, list(self.scale), list(self.ratio))
        out = F.resized_crop(image, top, left, height, width, [self.size, self.size], antialias=True)
        if torch.rand(1) < 0.5:
            out = F.horizontal_flip(out)
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}(size={self.size}, scale={self.scale}, ratio={self.ratio})"


class ValTransform:
    """``Resize(resize_size)`` (the short side) then ``CenterCrop(crop_size)`` on a ``(3, H, W)`` uint8 tensor (or a
    PIL image)."""

    def __init__(self, resize_size: int, crop_size: int) -> None:
        self.resize_size = resize_size
        self.crop_size = crop_size

    def __call__(self, image: torch.Tensor | Image.Image) -> torch.Tensor | Image.Image:
        out = F.resize(image, [self.resize_size], antialias=True)
        return F.center_crop(out, [self.crop_size, self.crop_size])

    def __repr__(self) -> str:
        return f"{type(self).__name__}(resize_size={self.resize_size}, crop_size={self.crop_size})"


def workers_pipeline(
    decoder: str,
    draft_min_side: int | None,
    crop_size: int,
    min_crop_scale: float,
    val_resize_size: int,
    val_crop_size: int,
) -> tuple[Any, Any, Any]:
    """``(loader, train transform, val transform)`` of ``data.cpu_decoder`` ``decoder``, without normalization (the GPU
    normalizes): the data module's and ``bench/pil_decode_rate.py``'s one definition, so the benchmark measures what
    the workers run. ``torchvision``: this module's loader and transforms; ``pil``: the PIL loader with torchvision's
    ``RandomResizedCrop`` + ``RandomHorizontalFlip``, and ``Resize`` + ``CenterCrop``."""
    if decoder == "torchvision":
        return (
            TensorImageLoader(draft_min_side=draft_min_side),
            TrainTransform(crop_size, (min_crop_scale, 1.0)),
            ValTransform(val_resize_size, val_crop_size),
        )
    if decoder == "pil":
        return (
            ImageLoader(draft_min_side=draft_min_side),
            transforms.Compose(
                [
                    transforms.RandomResizedCrop(crop_size, scale=(min_crop_scale, 1.0)),
                    transforms.RandomHorizontalFlip(),
                ]
            ),
            transforms.Compose([transforms.Resize(val_resize_size), transforms.CenterCrop(val_crop_size)]),
        )
    raise ValueError(f"data.cpu_decoder must be one of {', '.join(CPU_DECODERS)}, got {decoder!r}")
