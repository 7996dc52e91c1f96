"""Small image files for the tests: every kind the decode paths tell apart (tests/test_encoded_batch.py,
tests/test_gpu_decode.py), and JPEGs of noise (tests/test_image_loading.py, tests/test_bad_image_policy.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image


def smooth_image(width: int, height: int, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, size=(4, 4, 3), dtype=np.uint8)
    return Image.fromarray(coarse, "RGB").resize((width, height), Image.BICUBIC)


def files_of_every_kind(folder: Path) -> dict[str, Path]:
    """A plain JPEG, a grayscale one, a CMYK one, a PNG named .JPEG and an EXIF-rotated JPEG in ``folder``."""
    out = {}
    out["jpeg"] = folder / "a.JPEG"
    smooth_image(300, 200).save(out["jpeg"], quality=95)
    out["gray"] = folder / "g.JPEG"
    smooth_image(120, 160).convert("L").save(out["gray"], quality=95)
    out["cmyk"] = folder / "c.JPEG"
    smooth_image(200, 150).convert("CMYK").save(out["cmyk"], quality=95)
    out["png"] = folder / "p.JPEG"  # a PNG named .JPEG, as ImageNet has one
    smooth_image(180, 140).save(out["png"], format="PNG")
    out["rotated"] = folder / "r.JPEG"
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees on display
    smooth_image(200, 100).save(out["rotated"], quality=95, exif=exif)
    return out


def noise_jpeg(path: Path, size: int = 64, seed: int = 0) -> Path:
    array = np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path, "JPEG", quality=90)
    return path
