"""The CPU input path's cost per image, side by side on several folders and decoders: the app's loader and training
transform (exactly ``data.decode: cpu``'s, RandomResizedCrop + flip) with ``data.cpu_decoder`` ``pil`` (PIL images)
and ``torchvision`` (cpu_decode.py: uint8 tensors), on one core or on several at once.

    python bench/make_jpeg_folder.py /tmp/jpegs --classes 20 --train-per-class 50 --val-per-class 1
    python resize_dataset.py /tmp/jpegs /tmp/jpegs_256 --short-side 256
    python bench/pil_decode_rate.py --data /tmp/jpegs /tmp/jpegs_256 [--decoders pil torchvision] [--processes 14]

The same sample of files (by relative path) in every folder, read once before timing so that the page cache serves them;
images per second of the best of ``--repeats`` passes over the sample, in both modes (the first pass pays one-time
costs, such as the decoder's first calls; the best one is free of them). ``--processes N`` runs N such processes at the
same time, each with one thread, as a loader worker has, and each pass started in all of them together; a pass's rate is
all the images the N processes decoded in it over the time from the first one's start of it to the last one's end: what
N workers could decode on this machine, where cores share caches, memory bandwidth and (with SMT) execution units, and
the clock may drop under load. ``N at once / (N x one core)`` thus compares best passes with best passes. A data
loader's workers add their own overhead (collation, the hand-off), so a training run's rate is lower; the ratios are
what carry over.
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import cpu_decode  # noqa: E402
from image_loading import min_decode_side  # noqa: E402
from resize_dataset import image_files  # noqa: E402


def passes(
    paths: list[Path],
    crop: int,
    min_scale: float,
    val_resize: int,
    repeats: int,
    decoder: str = "pil",
    before_pass: Callable[[], object] | None = None,
) -> list[tuple[float, float]]:
    """``(start, end)`` of each of ``repeats`` passes of one core over ``paths`` through the app's loader and training
    transform, on ``time.monotonic`` (CLOCK_MONOTONIC: one clock for all processes); ``before_pass`` runs before each
    pass's start."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in a loader worker
    try:
        draft = min_decode_side(crop, min_scale, val_resize)
        load, train, _ = cpu_decode.workers_pipeline(decoder, draft, crop, min_scale, val_resize, crop)
        torch.manual_seed(0)
        spans = []
        for _ in range(repeats):
            if before_pass is not None:
                before_pass()
            start = time.monotonic()
            for path in paths:
                train(load(str(path)))
            spans.append((start, time.monotonic()))
        return spans
    finally:
        torch.set_num_threads(threads)  # the caller's process as it was (tests run this in theirs)


def best_pass_rate(images: int, runs: list[list[tuple[float, float]]]) -> float:
    """Images per second of the best pass of ``runs`` (each process's ``(start, end)`` per pass, of ``images`` each):
    pass k's images in all processes over the window from the first one's start of it to the last one's end."""
    windows = [max(end for _, end in spans) - min(start for start, _ in spans) for spans in zip(*runs, strict=True)]
    return len(runs) * images / min(windows)


def measure(
    paths: list[Path], crop: int, min_scale: float, val_resize: int, repeats: int, decoder: str = "pil"
) -> float:
    """Images per second of one core through the app's loader and training transform (its best of ``repeats``)."""
    return best_pass_rate(len(paths), [passes(paths, crop, min_scale, val_resize, repeats, decoder)])


def _passes_together(args: tuple) -> list[tuple[float, float]]:
    barrier, *rest = args
    # Every process starts each pass at once, so that they load the machine together and pass k's window holds
    # pass k only.
    return passes(*rest, before_pass=barrier.wait)


def measure_parallel(processes: int, paths: list[Path], *args: object) -> float:
    """Images per second of ``processes`` simultaneous :func:`measure` runs (forked), the statistic of one: their best
    pass, every image they decoded in it over its window from the first one's start to the last one's end, so that
    no process's rate counts time it ran alone."""
    if processes == 1:
        return measure(paths, *args)
    ctx = multiprocessing.get_context("fork")
    with ctx.Manager() as manager, ctx.Pool(processes) as pool:
        barrier = manager.Barrier(processes)
        # Each process blocks in the barrier until all have come: the tasks go to ``processes`` different ones.
        runs = pool.map(_passes_together, [(barrier, paths, *args)] * processes)
    return best_pass_rate(len(paths), runs)


def _pixels(path: Path) -> int:
    with Image.open(path) as image:  # the header only
        return image.size[0] * image.size[1]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("--data", nargs="+", type=Path, required=True, help="ImageNet-layout folders; the first is the base")
    p.add_argument("--images", type=int, default=400, help="training files sampled (default 400)")
    p.add_argument("--repeats", type=int, default=3, help="passes over the sample; the best one counts (default 3)")
    p.add_argument("--crop", type=int, default=224)
    p.add_argument("--min-crop-scale", type=float, default=0.08)
    p.add_argument("--val-resize", type=int, default=256)
    p.add_argument("--decoders", nargs="+", default=["pil"], choices=cpu_decode.CPU_DECODERS)
    p.add_argument(
        "--processes", type=int, default=1, help="processes at once; all their images of the best pass over its window"
    )
    a = p.parse_args(argv)
    if a.processes < 1:
        p.error(f"--processes must be >= 1, got {a.processes}")
    if a.repeats < 1:
        p.error(f"--repeats must be >= 1, got {a.repeats}")
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
        for decoder in a.decoders:
            rate = measure_parallel(a.processes, paths, a.crop, a.min_crop_scale, a.val_resize, a.repeats, decoder)
            rows.append((folder, decoder, kb, pixels, rate))
    best = f"best of {a.repeats} passes"
    cores = f"one core, {best}"
    if a.processes > 1:  # the same statistic: each pass started together, all its images over its window
        cores = f"{a.processes} processes at once, all their images over the window of the {best}"
    head = f"folder ({len(sample)} training files, {cores})"
    print(f"| {head} | decoder | KB per file | pixels per file | img/s | vs first |")
    print("|---|---|---|---|---|---|")
    for folder, decoder, kb, pixels, rate in rows:
        print(f"| {folder} | {decoder} | {kb:.0f} | {pixels / 1000:.0f} k | {rate:.0f} | {rate / rows[0][4]:.2f} |")


if __name__ == "__main__":
    main()
