"""Robust image decoding of the input pipeline; the bad-image policy is in :mod:`bad_image_policy`.

**Decoding** (:func:`load_rgb`, :class:`ImageLoader`): every file a class folder legitimately holds comes out as an
8-bit RGB PIL image, whatever its format or mode:

* The format is sniffed from the content, not the name (ImageNet's train set has a PNG named ``.JPEG``).
* CMYK, YCbCr, grayscale, bilevel and palette images are converted to RGB; ICC profiles are ignored, as torchvision's
  default loader does.
* Transparency (RGBA, LA, PA, palette or single-colour ``tRNS`` transparency) is composited onto **white**. Dropping
  the alpha channel instead exposes whatever colour the encoder left under transparent pixels (often black, sometimes
  garbage); white is the page the image was made to be shown on (product shots, logos, clip art) and so what an
  annotator saw.
* 16-bit images (PIL modes ``I;16*`` and ``I``) are scaled to 8 bit, ``round(v * 255 / 65535)``. PIL's own
  ``convert`` clips them at 255 instead, which turns almost every pixel of a 16-bit image white. Mode ``I`` is
  assumed to hold 16-bit samples (that is what PNG and TIFF decoders produce); values outside 0..65535 are clipped.
* The EXIF orientation is applied, so a portrait photo stored sideways is trained on upright.
* Images smaller than the crop load as they are; the crop transforms upsample them.
* Size bound: images up to :data:`MAX_PIXELS` (16384 x 16384) load. PIL's own decompression-bomb guard would refuse
  anything over 2 x 89.5 MP (and warn above 89.5 MP); it is raised to this bound when a loader runs. A JPEG whose short
  side is at least twice ``draft_min_side`` is decoded by libjpeg at a power-of-two reduction (DCT scaling, PIL's
  ``draft``) that keeps the short side >= ``draft_min_side``: an 8192 x 8192 JPEG then takes about a third of the
  decode time (measured 250 ms instead of 690 ms on one core) and 1/64 of the memory (3 MB instead of 200 MB per
  worker), and the crop and resize that follow work on 1024 x 1024 pixels instead of 8192 x 8192.
  :func:`min_decode_side` gives the bound below which no crop of the training or validation transform would need
  more pixels than the drafted image has: no crop is upsampled. libjpeg's DCT scaling is another filter than a
  full-size decode followed by the antialiased resize, so pixels differ a little (a 2000 x 2000 JPEG's validation
  crop: 0.8 levels of 255 on average, 6 at most). Images of ordinary size are never drafted.

**Undecodable files** raise :class:`BadImageError`, whose message names the file and the reason: a truncated file
(``ImageFile.LOAD_TRUNCATED_IMAGES`` must stay off: a truncated file is a bad file, not a gray-padded image; the
loader forces the full decode with ``load()`` so the error surfaces in the loader, not later in a transform), an
empty file, a file that is not an image, an unreadable file, an image over the size bound. What then happens is
``data.on_bad_image``'s (:mod:`bad_image_policy`).
"""

from __future__ import annotations

import io
import math
import struct
import zlib

import numpy as np
from PIL import Image, ImageFile, ImageOps, UnidentifiedImageError

#: Largest image (width x height, in pixels) that loads: 16384 x 16384. A PNG or TIFF that large decodes to 805 MB
#: of RGB per worker; a JPEG that large is drafted (see the module docstring) when a ``draft_min_side`` is given.
MAX_PIXELS = 16384 * 16384

#: Sample modes PIL decodes 16-bit data into (grayscale PNG and TIFF).
_SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")

#: Modes that carry an alpha channel.
_ALPHA_MODES = ("RGBA", "RGBa", "LA", "La", "PA")

#: Background that transparent pixels are composited onto.
BACKGROUND = (255, 255, 255)


class BadImageError(Exception):
    """A file of the dataset cannot be decoded into an image.

    Args:
        message: The full message. It names the file and the reason (see :meth:`for_file`).
        path: The file.
        reason: Why it cannot be decoded.

    The one-argument form is what the ``DataLoader`` needs to re-raise the error of a worker process in the main
    process with the worker's traceback as the message.
    """

    def __init__(self, message: str, path: str | None = None, reason: str | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.reason = reason

    @classmethod
    def for_file(cls, path: str, reason: str) -> BadImageError:
        """The error for ``path``, with a message that names it and says why it is bad and what to do."""
        return cls(
            f"bad image {path}: {reason} (remove or replace the file, or set data.on_bad_image: skip to train "
            "without it)",
            path=path,
            reason=reason,
        )


class BadImageWarning(UserWarning):
    """A bad image was skipped (``data.on_bad_image: skip``); issued once per file and process."""


def min_decode_side(crop_size: int, min_crop_scale: float, val_resize_size: int) -> int:
    """The short side below which decoding at reduced size could lose pixels that the transforms would use.

    ``RandomResizedCrop(crop_size, scale=(min_crop_scale, 1), ratio=(3/4, 4/3))`` cuts a region of at least
    ``min_crop_scale`` of the area; its shorter side is at least ``sqrt(min_crop_scale * 3/4)`` times the image's short
    side (a square image is the worst case), and it is resized to ``crop_size``. Validation resizes the short side to
    ``val_resize_size``. An image whose short side is at least the returned value therefore never has a crop that
    needs upsampling, so a JPEG decoded down to this short side gives the transforms all the detail they keep.
    """
    if crop_size < 1 or val_resize_size < 1 or not 0.0 < min_crop_scale <= 1.0:
        raise ValueError(
            f"min_decode_side: crop_size and val_resize_size must be >= 1 and min_crop_scale in (0, 1], got "
            f"{crop_size}, {val_resize_size}, {min_crop_scale}"
        )
    train_side = math.ceil(crop_size / math.sqrt(min_crop_scale * 3 / 4))
    return max(train_side, val_resize_size)


def to_rgb(image: Image.Image) -> Image.Image:
    """Converts a decoded image of any mode to 8-bit RGB (see the module docstring for the rules)."""
    mode = image.mode
    transparent = image.info.get("transparency")  # tRNS: a palette's alphas, or the one colour that is transparent
    if mode == "RGB" and transparent is None:
        return image
    if mode in _SIXTEEN_BIT_MODES:
        # np.asarray honours the byte order of I;16B/I;16L; int64 keeps the arithmetic clear of overflow.
        values = np.asarray(image).astype(np.int64)
        gray = ((np.clip(values, 0, 65535) * 255 + 32767) // 65535).astype(np.uint8)
        rgb = np.repeat(gray[:, :, None], 3, axis=2)
        if isinstance(transparent, int):  # PIL's convert("RGBA") would drop a 16-bit tRNS value: done here
            rgb[values == transparent] = BACKGROUND
        return Image.fromarray(rgb, "RGB")
    if mode in _ALPHA_MODES or transparent is not None:
        # convert("RGBA") resolves palette and tRNS transparency into a real alpha channel first.
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (*BACKGROUND, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    # L, 1, P, CMYK (PIL inverts Adobe CMYK itself), YCbCr, F (taken on PIL's 0..255 scale, clipped).
    return image.convert("RGB")


def refuse_truncated_loading(path: str) -> None:
    """Raises RuntimeError when PIL's "pad truncated files with gray" (``ImageFile.LOAD_TRUNCATED_IMAGES``) is on.

    Some code in this process turned it on. That is a configuration error, not a bad file: raised as such, at the first
    image, so that ``on_bad_image: skip`` does not quietly skip everything, nor truncated files train as gray.
    """
    if ImageFile.LOAD_TRUNCATED_IMAGES:
        raise RuntimeError(
            "PIL.ImageFile.LOAD_TRUNCATED_IMAGES is on, so truncated files would load as gray-padded images instead "
            f"of failing; turn it off (it is off by default) to load {path}"
        )


def allow_pixels(max_pixels: int) -> None:
    """Raises PIL's process-wide decompression-bomb limit to ``max_pixels`` (never lowers a limit someone raised
    further): ``Image.open`` reads it, so call this before opening any header, or PIL warns about or refuses images
    the loader's own bound allows."""
    if Image.MAX_IMAGE_PIXELS is not None and Image.MAX_IMAGE_PIXELS < max_pixels:
        Image.MAX_IMAGE_PIXELS = max_pixels


def load_rgb(path: str, max_pixels: int = MAX_PIXELS, draft_min_side: int | None = None) -> Image.Image:
    """Decodes the image file ``path`` into an 8-bit RGB PIL image, upright according to its EXIF orientation.

    Args:
        path: The image file.
        max_pixels: Largest width x height that loads.
        draft_min_side: Decode JPEGs whose short side is at least twice this at a power-of-two reduction that keeps
            the short side >= this (see :func:`min_decode_side`); ``None`` always decodes at full size.

    Raises:
        BadImageError: The file cannot be read or decoded, or the image is larger than ``max_pixels``.
    """
    refuse_truncated_loading(path)
    allow_pixels(max_pixels)
    try:
        with open(path, "rb") as f:
            # Up to max_pixels PIL neither warns nor refuses now; above it, the check below refuses the file (between
            # max_pixels and twice that, after PIL's DecompressionBombWarning).
            image = Image.open(f)
            width, height = image.size
            if width * height > max_pixels:
                raise BadImageError.for_file(
                    path,
                    f"{width}x{height} pixels is more than the {max_pixels} pixels an image may have "
                    f"(about {math.isqrt(max_pixels)}x{math.isqrt(max_pixels)})",
                )
            if draft_min_side is not None and image.format == "JPEG":
                # libjpeg scales by 1/2, 1/4 or 1/8; PIL picks the largest that keeps both sides >= the requested
                # size, so an image under twice draft_min_side is decoded at full size.
                image.draft(None, (draft_min_side, draft_min_side))
            # Image.open only reads the header: load() forces the whole decode while the file is open, so a truncated
            # or corrupt file fails here, in the loader, with its name.
            image.load()
            image = ImageOps.exif_transpose(image)
            return to_rgb(image)
    except BadImageError:
        raise
    except UnidentifiedImageError:
        raise BadImageError.for_file(path, _unidentified_reason(path)) from None
    except Image.DecompressionBombError as error:
        raise BadImageError.for_file(path, f"too large: {error}") from error
    except OSError as error:
        # Truncated data, unreadable file (permission, I/O error, a folder named like an image), decoder errors.
        reason = error.strerror if error.strerror else str(error)
        raise BadImageError.for_file(path, f"{type(error).__name__}: {reason}") from error
    except (ValueError, SyntaxError, TypeError, IndexError, EOFError, struct.error, zlib.error) as error:
        # What PIL's plugins raise on malformed headers, EXIF data, palettes or compressed chunks. MemoryError is not
        # in the list: running out of memory is not the file's fault.
        raise BadImageError.for_file(path, f"{type(error).__name__}: {error}") from error


#: EXIF tag of the orientation.
_ORIENTATION = 0x0112


def plain_jpeg(header: Image.Image, raw: bytes) -> bool:
    """Whether a file that PIL opened as ``header`` (header only) from the bytes ``raw`` is a JPEG that a plain
    libjpeg/nvJPEG decode to RGB turns into exactly what :func:`load_rgb` makes of it: a JPEG of three (YCbCr) or
    one (gray) channels, upright (EXIF orientation 1 or none) and ending with its end-of-image marker.

    Anything else (CMYK, rotated, truncated, trailing bytes, a broken EXIF block) is for :func:`load_rgb`, which
    applies the module's rules or raises :class:`BadImageError` naming the file.
    """
    if header.format != "JPEG" or header.mode not in ("RGB", "L") or not raw.endswith(b"\xff\xd9"):
        return False
    try:
        orientation = header.getexif().get(_ORIENTATION, 1)
    except Exception:  # a broken EXIF block: let PIL decode and judge the file
        return False
    return orientation == 1


def read_plain_jpeg(path: str, max_pixels: int = MAX_PIXELS) -> tuple[bytes, Image.Image] | None:
    """``(bytes, header)`` of the file at ``path`` when it is a plain JPEG (:func:`plain_jpeg`; PIL parses the header
    only, no pixels), else None: unreadable, no image PIL knows, or anything else :func:`load_rgb` must judge, which
    then raises :class:`BadImageError` naming the file and why. PIL's limit is raised to ``max_pixels`` first, as
    :func:`load_rgb` raises it."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
        allow_pixels(max_pixels)
        header = Image.open(io.BytesIO(raw))
    except Exception:
        return None
    return (raw, header) if plain_jpeg(header, raw) else None


def _unidentified_reason(path: str) -> str:
    try:
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError:
        head = b""
    if not head:
        return "the file is empty"
    return f"not an image file (PIL knows no format that starts with {head!r})"


class ImageLoader:
    """Picklable ``loader`` for ``torchvision.datasets.ImageFolder``: :func:`load_rgb` with fixed options.

    Args:
        max_pixels: Largest width x height that loads (default 16384 x 16384).
        draft_min_side: See :func:`load_rgb`; :func:`min_decode_side` computes the value at which no crop is upsampled.
    """

    def __init__(self, max_pixels: int = MAX_PIXELS, draft_min_side: int | None = None) -> None:
        if max_pixels < 1:
            raise ValueError(f"max_pixels must be >= 1, got {max_pixels}")
        if draft_min_side is not None and draft_min_side < 1:
            raise ValueError(f"draft_min_side must be >= 1 or None (no reduced-size decoding), got {draft_min_side}")
        self.max_pixels = max_pixels
        self.draft_min_side = draft_min_side

    def __call__(self, path: str) -> Image.Image:
        return load_rgb(path, self.max_pixels, self.draft_min_side)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(max_pixels={self.max_pixels}, draft_min_side={self.draft_min_side})"
