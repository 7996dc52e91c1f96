"""GPU time of the prefetcher's normalization of a channels_last batch: as rows of ``W x C`` values
(:func:`prefetcher.normalize`) against the ``(1, C, 1, 1)`` broadcast it replaced, alternated, with their outputs
compared bit for bit.

    python bench/normalize_time.py [--batch 256] [--size 224] [--input float32|uint8] [--calls 20] [--rounds 5]

Each call normalizes the same random batch (``--input float32``: what ``data.decode: gpu`` hands over, 0..255 in
channels_last; ``uint8``: a collated NCHW batch of the CPU path, cast and made channels_last first). A round times
``--calls`` calls of each variant between two CUDA events, queued while the stream sleeps, so that they run back to
back however long the host takes to launch them; the table gives each variant's median over ``--rounds`` rounds of ms
a call. Without CUDA it times on the CPU with the host's clock. Prints to stdout only.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from prefetcher import IMAGENET_MEAN_255, IMAGENET_STD_255, normalize  # noqa: E402

#: GPU clock cycles (about 10 ms) the stream sleeps before each timed series while the host queues its calls.
QUEUE_CYCLES = 20_000_000


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("--batch", type=int, default=256, help="images a batch")
    p.add_argument("--size", type=int, default=224, help="image side")
    p.add_argument("--input", choices=("float32", "uint8"), default="float32", help="what the prefetcher is handed")
    p.add_argument("--calls", type=int, default=20, help="timed calls a variant and round")
    p.add_argument("--rounds", type=int, default=5, help="alternations of the variants (median over them)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = p.parse_args(argv)
    for option in ("batch", "size", "calls", "rounds"):
        if getattr(a, option) < 1:
            p.error(f"--{option} {getattr(a, option)}: give at least 1")
    return a


def broadcast(images: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """The normalization as the prefetcher did it before: the ``(1, C, 1, 1)`` statistics broadcast over the batch."""
    return images.to(memory_format=torch.channels_last).float().sub_(mean).div_(std)


def rows(images: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """The prefetcher's normalization (:func:`prefetcher.normalize`)."""
    return normalize(images, mean, std, torch.channels_last)


def main(argv: list[str] | None = None) -> None:
    a = parse(argv)
    device = torch.device(a.device)
    generator = torch.Generator(device="cpu").manual_seed(0)
    pixels = torch.randint(0, 256, (a.batch, 3, a.size, a.size), generator=generator, dtype=torch.uint8)
    if a.input == "float32":
        source = pixels.to(device).float().contiguous(memory_format=torch.channels_last)
    else:
        source = pixels.to(device)
    mean = torch.tensor(IMAGENET_MEAN_255, device=device).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD_255, device=device).view(1, 3, 1, 1)
    variants = {"broadcast": broadcast, "rows": rows}
    # In place on a float32 input: each call works on a fresh copy, made outside the timed series.
    fresh = (lambda: source.clone(memory_format=torch.channels_last)) if a.input == "float32" else (lambda: source)
    outputs = {name: run(fresh(), mean, std) for name, run in variants.items()}
    same = torch.equal(outputs["broadcast"], outputs["rows"])
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(a.rounds):
        for name, run in variants.items():
            inputs = [fresh() for _ in range(a.calls)]
            times[name].append(_timed(device, lambda inputs=inputs, run=run: [run(x, mean, std) for x in inputs]))
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"{where}, torch {torch.__version__}; {a.batch} x 3 x {a.size} x {a.size} {a.input} -> float32 "
          f"channels_last; same bits: {'yes' if same else 'NO'}")  # fmt: skip
    print(f"{'variant':<10}  {'ms a call (median)':>18}  rounds (ms)")
    for name, series in times.items():
        per_call = [t / a.calls for t in series]
        print(f"{name:<10}  {statistics.median(per_call):18.4f}  {', '.join(f'{t:.4f}' for t in per_call)}")


def _timed(device: torch.device, work) -> float:
    """Milliseconds ``work()`` takes: on CUDA between two events, queued behind a sleep of the stream."""
    if device.type != "cuda":
        start = time.perf_counter()
        work()
        return (time.perf_counter() - start) * 1e3
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(QUEUE_CYCLES)
    start.record()
    work()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


if __name__ == "__main__":
    main()
