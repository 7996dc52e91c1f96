"""The CPU input path's cost per image, side by side on several folders: the app's PIL loader + RandomResizedCrop +
flip (exactly ``data.decode: cpu``'s training transform) on one core.

    python bench/make_jpeg_folder.py /tmp/jpegs --classes 20 --train-per-class 50 --val-per-class 1
    python resize_dataset.py /tmp/jpegs /tmp/jpegs_256 --short-side 256
    python bench/pil_decode_rate.py --data /tmp/jpegs /tmp/jpegs_256

The same sample of files (by relative path) in every folder, read once before timing so that the page cache serves
them; the best of ``--repeats`` passes in this one process: images per second per core, and the ratio to the first
folder. A data loader's workers add their own overhead (collation, the hand-off), so a training run's per-core rate is
lower; the ratio is what carries over.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import torch
from PIL import Image
from torchvision import transforms

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from image_loading import ImageLoader, min_decode_side  # noqa: E402
from resize_dataset import image_files  # noqa: E402


def measure(paths: list[Path], crop: int, min_scale: float, val_resize: int, repeats: int) -> float:
    """Images per second of one core through the app's loader and training transform (best of ``repeats``)."""
    load = ImageLoader(draft_min_side=min_decode_side(crop, min_scale, val_resize))
    train = transforms.Compose(
        [transforms.RandomResizedCrop(crop, scale=(min_scale, 1.0)), transforms.RandomHorizontalFlip()]
    )
    torch.manual_seed(0)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for path in paths:
            train(load(str(path)))
        best = min(best, time.perf_counter() - start)
    return len(paths) / best


def _pixels(path: Path) -> int:
    with Image.open(path) as image:  # the header only
        return image.size[0] * image.size[1]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", nargs="+", type=Path, required=True, help="ImageNet-layout folders; the first is the base")
    p.add_argument("--images", type=int, default=400, help="training files sampled (default 400)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--crop", type=int, default=224)
    p.add_argument("--min-crop-scale", type=float, default=0.08)
    p.add_argument("--val-resize", type=int, default=256)
    a = p.parse_args(argv)
    names = list(image_files(a.data[0], ("train",)))
    if not names:
        p.error(f"--data {a.data[0]}: no training images (train/<class>/*)")
    sample = sorted(random.Random(0).sample(names, min(a.images, len(names))))
    for folder in a.data[1:]:
        missing = [n for n in sample if not (folder / n).is_file()]
        if missing:
            p.error(f"--data {folder}: {len(missing)} of the sampled files are not there (first: {missing[0]})")
    rows = []
    for folder in a.data:
        paths = [folder / n for n in sample]
        kb = statistics.fmean(len(path.read_bytes()) for path in paths) / 1024  # also: now in the page cache
        pixels = statistics.fmean(_pixels(path) for path in paths)
        rate = measure(paths, a.crop, a.min_crop_scale, a.val_resize, a.repeats)
        rows.append((folder, kb, pixels, rate))
    print(f"| folder ({len(sample)} training files, one core) | KB per file | pixels per file | img/s | vs first |")
    print("|---|---|---|---|---|")
    for folder, kb, pixels, rate in rows:
        print(f"| {folder} | {kb:.0f} | {pixels / 1000:.0f} k | {rate:.0f} | {rate / rows[0][3]:.2f} |")


if __name__ == "__main__":
    main()
