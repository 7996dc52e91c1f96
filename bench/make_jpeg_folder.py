"""Writes an ImageNet-like JPEG folder for throughput runs: many classes, 300-500 px sides, about 100 KB at q90.

    python bench/make_jpeg_folder.py /tmp/jpegs --classes 100 --train-per-class 400 --val-per-class 4

The defaults (100 classes of 400 training images: 40,000, about 4 GB) make a folder that bench/throughput.py takes:
each GPU's first epoch must hold the warm-up, the timed steps and two batches, at batch 256 18,432 images on one GPU
(20 + 50 steps eager) and 28,672 compiled (60 + 50), 36,864 eager on two GPUs (bench/gpu_session.sh makes 400 per
class, more with more GPUs). Fewer, e.g. ``--train-per-class 50``, suit bench/pil_decode_rate.py.

Decode cost depends on pixel count and entropy, so the images mimic ImageNet's, not its content: random sizes and
aspect ratios in ImageNet's typical range, smooth colour fields plus textured noise tuned so that a q90 JPEG weighs
about what an ImageNet train JPEG does (~110 KB on average). Parallel over processes; deterministic per seed.

The folder is written under a temporary name beside it (``.<name>.partial``) and renamed into place when complete, so
an interrupted run leaves no folder of fewer images that a benchmark would then take for the whole one; a folder that
holds anything already is refused.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image


def make_image(rng: np.random.Generator) -> Image.Image:
    width, height = int(rng.integers(300, 501)), int(rng.integers(300, 501))
    # Low-frequency colour field: a coarse random grid upsampled smoothly.
    coarse = rng.integers(0, 256, size=(int(rng.integers(3, 9)), int(rng.integers(3, 9)), 3), dtype=np.uint8)
    field = np.asarray(Image.fromarray(coarse, "RGB").resize((width, height), Image.BICUBIC), dtype=np.float32)
    # Texture: noise at two scales, the entropy that makes real photos ~100 KB at q90.
    fine = rng.normal(0, 22, size=(height, width, 3))
    mid_small = rng.normal(0, 30, size=(height // 4 + 1, width // 4 + 1, 3)).astype(np.float32)
    mid = np.kron(mid_small, np.ones((4, 4, 1), dtype=np.float32))[:height, :width]
    pixels = np.clip(field + fine + mid, 0, 255).astype(np.uint8)
    return Image.fromarray(pixels, "RGB")


def write_class(args: tuple[Path, str, int, int, int]) -> int:
    root, split, index, count, seed = args
    rng = np.random.default_rng([seed, index, 0 if split == "train" else 1])
    folder = root / split / f"n{index:08d}"
    folder.mkdir(parents=True, exist_ok=True)
    total = 0
    for k in range(count):
        path = folder / f"{split}_{index:04d}_{k:05d}.JPEG"
        make_image(rng).save(path, quality=90)
        total += path.stat().st_size
    return total


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("root", type=Path)
    p.add_argument("--classes", type=int, default=100)
    p.add_argument(
        "--train-per-class",
        type=int,
        default=400,
        help="default %(default)s: enough for bench/throughput.py's defaults on one GPU, compiled too",
    )
    p.add_argument("--val-per-class", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    a = p.parse_args(argv)
    # A folder without validation images (or of one class) suits bench/pil_decode_rate.py, not the app's training,
    # which bench/throughput.py checks before its first run.
    for option, value, least in (
        ("--classes", a.classes, 1),
        ("--train-per-class", a.train_per_class, 1),
        ("--val-per-class", a.val_per_class, 0),
        ("--processes", a.processes, 1),
    ):
        if value < least:
            p.error(f"{option} {value}: give at least {least}")
    return a


def main(argv: list[str] | None = None) -> None:
    a = parse(argv)
    if a.root.exists() and (not a.root.is_dir() or any(a.root.iterdir())):
        sys.exit(f"make_jpeg_folder.py: {a.root} exists and is not an empty folder; pass a new one")
    staging = a.root.with_name(f".{a.root.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)  # an interrupted run's
    jobs = [(staging, "train", c, a.train_per_class, a.seed) for c in range(a.classes)]
    jobs += [(staging, "val", c, a.val_per_class, a.seed) for c in range(a.classes)]
    with ProcessPoolExecutor(a.processes) as pool:
        total = sum(pool.map(write_class, jobs))
    if a.root.exists():
        a.root.rmdir()  # empty (checked above): a rename cannot replace a folder
    os.replace(staging, a.root)
    # The files are still in the page cache, about 4 GB dirty: written back meanwhile, they would compete with the
    # first benchmark run after this one for the disk and the kernel's writeback threads. In the thirty-eighth
    # session the first JPEG row after a fresh folder ran 0.913-0.914 of synthetic data, later ones 0.940-0.969
    # (bench/RESULTS.md); whether writeback was the cause is not measured.
    os.sync()
    count = a.classes * (a.train_per_class + a.val_per_class)
    print(f"{count} JPEGs in {a.root}, {total / count / 1024:.0f} KB on average")


if __name__ == "__main__":
    main()
