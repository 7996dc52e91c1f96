"""Throughput of the ``data.decode: gpu`` stage alone: nvJPEG decode, then the per-image or batched crop/resize/flip.

    python bench/make_jpeg_folder.py /tmp/jpegs --classes 100 --train-per-class 96 --val-per-class 4
    python bench/decode_bench.py --data /tmp/jpegs --batch 256 --iters 20            # CUDA
    python bench/decode_bench.py --data /tmp/small --batch 16 --iters 2 --device cpu  # a smoke test on CPU

Batches come from the JPEG folder through the real ``EncodedSampleLoader`` (RandomResizedCrop boxes and flips drawn as
in training), read into memory before any timing, and are cycled. Each row runs its stage on a side stream, as the
prefetcher does, ``--iters`` times after ``--warmup`` untimed ones, between two ``torch.cuda.synchronize()``:

    decode                 torchvision.io.decode_jpeg on the batch's list of JPEGs (one batched nvJPEG call)
    decode + per-image     gpu_decode.decode_crop_resize_reference: a Python loop of ~6 ops per image
    decode + fused         gpu_decode.decode_crop_resize as the app runs it on CUDA: gpu_crop_kernel.py's one Triton
                           launch a batch (on the CPU the torch ops below)
    decode + batched       the same with its torch ops (gpu_decode.CROP_KERNEL = torch): per group of similar crops
                           one gather, two batched matmuls, the flip in the weights
    decode + batched/copy  the torch ops with one copy per crop into the padded tensor instead of the strided gather
    decode + batched/fp32  the torch ops in float32 instead of float16 (the default on CUDA)
    ... max_padded_pixels  the torch ops with another bound on one group's padded crops (--budgets): smaller
                           groups of similar crops pad less and hold less memory, for a few more launches
    ... + busy thread      the same while another thread launches small kernels in a loop, as the training thread
                           does: how much the stage suffers from (and takes from) a thread competing for the GIL

``busy launch/s`` is what the busy thread achieved during the row (alone, before any row, it is printed above the
table); ``peak MiB`` is the most memory the row allocated beyond what was allocated before it. The mean and largest
absolute difference between the per-image output and each other one of the same batch (0..255 scale) follow the
table.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import gpu_decode  # noqa: E402
from encoded_batch import Encoded, EncodedSampleLoader  # noqa: E402
from gpu_decode import decode_crop_resize, decode_crop_resize_reference  # noqa: E402
from image_loading import ImageLoader, min_decode_side  # noqa: E402

EXTENSIONS = {".jpeg", ".jpg", ".png"}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="JPEG folder: DIR/train/<class>/* (or DIR/<class>/*)")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--iters", type=int, default=20, help="timed batches per row")
    p.add_argument("--warmup", type=int, default=3, help="untimed batches per row before timing")
    p.add_argument("--batches", type=int, default=4, help="distinct batches read into memory and cycled")
    p.add_argument("--size", type=int, default=224, help="output side")
    p.add_argument("--device", default="cuda")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--budgets",
        default="",
        help="comma-separated max_padded_pixels of extra batched rows, in units of 512x512 (e.g. 256,64,32)",
    )
    a = p.parse_args(argv)
    for option, value, least in (("--batch", a.batch, 1), ("--iters", a.iters, 1), ("--batches", a.batches, 1),
                                 ("--size", a.size, 1), ("--warmup", a.warmup, 0)):  # fmt: skip
        if value < least:
            p.error(f"{option} {value}: give at least {least}")
    try:
        a.budget_blocks = [int(b) for b in a.budgets.split(",") if b.strip()]
    except ValueError:
        a.budget_blocks = [0]
    if any(b < 1 for b in a.budget_blocks):
        p.error(f"--budgets {a.budgets!r}: give whole numbers of 512x512 pixel blocks, 1 or more, e.g. 256,64,32")
    return a


def folder_files(data: str, seed: int, needed: int, extensions: set[str] = EXTENSIONS) -> list[str]:
    """``needed`` files of ``data/train/<class>/`` (or ``data/<class>/``) with those extensions, in an order shuffled
    by ``seed``; a small folder is cycled. Also bench/crop_kernel_time.py's."""
    folder = Path(data) / "train" if (Path(data) / "train").is_dir() else Path(data)
    files = sorted(str(f) for f in folder.glob("*/*") if f.suffix.lower() in extensions)
    if not files:
        raise SystemExit(f"no {', '.join(sorted(extensions))} files under {folder}/<class>/")
    random.Random(seed).shuffle(files)
    return (files * (needed // len(files) + 1))[:needed]


def load_batches(a: argparse.Namespace) -> list[list[Encoded]]:
    needed = a.batch * a.batches
    files = folder_files(a.data, a.seed, needed)
    resize = round(a.size * 256 / 224)
    pil_loader = ImageLoader(draft_min_side=min_decode_side(a.size, 0.08, resize))  # as the app's, for non-JPEGs
    loader = EncodedSampleLoader(True, a.size, 0.08, resize, pil_loader)
    torch.manual_seed(a.seed)
    samples = [loader(path) for path in files]
    return [samples[i : i + a.batch] for i in range(0, needed, a.batch)]


class BusyThread:
    """Launches a small kernel in a loop (a sync every 64, so the queue stays short) until stopped."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.tensor = torch.zeros(4096, device=device)
        self.stop = threading.Event()
        self.launches = 0
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.is_set():
            for _ in range(64):
                self.tensor.add_(1.0)
            self.launches += 64
            if self.device.type == "cuda":
                torch.cuda.current_stream(self.device).synchronize()

    def __enter__(self) -> BusyThread:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_row(
    stage: Callable[[list[Encoded]], object],
    batches: list[list[Encoded]],
    a: argparse.Namespace,
    busy: bool,
    counted: Callable[[list[Encoded]], int] = len,
) -> dict:
    """``stage``'s rate over ``a.iters`` of ``batches``, in images it handled (``counted`` of each batch)."""
    device = torch.device(a.device)
    stream = torch.cuda.Stream(device) if device.type == "cuda" else None
    context = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
    base = 0
    if device.type == "cuda":
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    busy_thread = BusyThread(device) if busy else None
    with context:
        if busy_thread is not None:
            busy_thread.__enter__()
        try:
            for i in range(a.warmup):
                stage(batches[i % len(batches)])
            synchronize(device)
            launches0, start = (busy_thread.launches if busy_thread else 0), time.perf_counter()
            for i in range(a.iters):
                stage(batches[i % len(batches)])
            synchronize(device)
            elapsed = time.perf_counter() - start
            launches = (busy_thread.launches if busy_thread else 0) - launches0
        finally:
            if busy_thread is not None:
                busy_thread.__exit__()
    images = sum(counted(batches[i % len(batches)]) for i in range(a.iters))
    row = {"img/s": images / elapsed, "ms/batch": elapsed / a.iters * 1e3}
    row["busy launch/s"] = launches / elapsed if busy else None
    row["peak MiB"] = (torch.cuda.max_memory_allocated(device) - base) / 2**20 if device.type == "cuda" else None
    return row


def busy_alone(device: torch.device, seconds: float = 1.0) -> float:
    with BusyThread(device) as busy:
        time.sleep(0.2)
        launches0, start = busy.launches, time.perf_counter()
        time.sleep(seconds)
        return (busy.launches - launches0) / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> None:
    from torchvision.io import ImageReadMode, decode_jpeg

    a = parse(argv)
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda, but CUDA is not available (use --device cpu)")
    start = time.perf_counter()
    batches = load_batches(a)
    encoded = sum(s.encoded for batch in batches for s in batch)
    total = sum(len(batch) for batch in batches)
    import torchvision

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}, {name}")
    print(
        f"{len(batches)} batches of {a.batch} from {a.data} ({encoded}/{total} JPEGs to decode_jpeg, rest PIL), "
        f"read in {time.perf_counter() - start:.1f} s; output {a.size}x{a.size}, {a.iters} timed iterations per row"
    )

    def decode_only(batch: list[Encoded]) -> object:
        data = [s.data for s in batch if s.encoded]
        return decode_jpeg(data, mode=ImageReadMode.RGB, device=device) if data else None

    def jpegs(batch: list[Encoded]) -> int:
        return sum(s.encoded for s in batch)

    def torch_ops(stage: Callable[[list[Encoded]], torch.Tensor]) -> Callable[[list[Encoded]], torch.Tensor]:
        """``stage`` with the crop's batched torch ops instead of the fused kernel."""

        def run(batch: list[Encoded]) -> torch.Tensor:
            previous, gpu_decode.CROP_KERNEL = gpu_decode.CROP_KERNEL, "torch"
            try:
                return stage(batch)
            finally:
                gpu_decode.CROP_KERNEL = previous

        return run

    alone = "decode (nvJPEG batched) alone" + ("" if encoded == total else ", img/s of the JPEGs it decodes")
    rows: list[tuple[str, Callable[[list[Encoded]], object], bool]] = [
        ("decode + per-image loop (old)", lambda b: decode_crop_resize_reference(b, device, a.size), False),
        ("decode + per-image loop, busy thread", lambda b: decode_crop_resize_reference(b, device, a.size), True),
        ("decode + fused kernel", lambda b: decode_crop_resize(b, device, a.size), False),
        ("decode + fused kernel, busy thread", lambda b: decode_crop_resize(b, device, a.size), True),
        ("decode + batched torch ops", torch_ops(lambda b: decode_crop_resize(b, device, a.size)), False),
        ("decode + batched torch ops, busy thread", torch_ops(lambda b: decode_crop_resize(b, device, a.size)), True),
        ("decode + batched, gather=copy", lambda b: decode_crop_resize(b, device, a.size, gather="copy"), False),
        (
            "decode + batched, float32",
            torch_ops(lambda b: decode_crop_resize(b, device, a.size, dtype=torch.float32)),
            False,
        ),
    ]
    for budget in a.budget_blocks:
        rows.append(
            (
                f"decode + batched, max_padded_pixels {budget} x 512^2",
                torch_ops(
                    lambda b, budget=budget: decode_crop_resize(b, device, a.size, max_padded_pixels=budget * 512**2)
                ),
                False,
            )
        )
    print(f"busy thread alone: {busy_alone(device):,.0f} launch/s")
    print()
    print("| stage | img/s | ms/batch | busy launch/s | peak MiB |")
    print("|---|---|---|---|---|")
    for label, stage, busy, counted in [(alone, decode_only, False, jpegs), *((*row, len) for row in rows)]:
        try:
            r = time_row(stage, batches, a, busy, counted)
        except Exception as error:  # one failing row must not hide the others
            message = (str(error).strip().splitlines() or [""])[0][:200]
            print(f"| {label} | failed: {type(error).__name__}: {message} | | | |", flush=True)
            continue
        busy_s = f"{r['busy launch/s']:,.0f}" if r["busy launch/s"] is not None else "-"
        peak = f"{r['peak MiB']:,.0f}" if r["peak MiB"] is not None else "-"
        print(f"| {label} | {r['img/s']:,.0f} | {r['ms/batch']:.2f} | {busy_s} | {peak} |", flush=True)

    old = decode_crop_resize_reference(batches[0], device, a.size)
    fused = decode_crop_resize(batches[0], device, a.size)
    new = torch_ops(lambda b: decode_crop_resize(b, device, a.size))(batches[0])
    copied = decode_crop_resize(batches[0], device, a.size, gather="copy")
    wide = torch_ops(lambda b: decode_crop_resize(b, device, a.size, dtype=torch.float32))(batches[0])
    print()
    default = "float16" if device.type == "cuda" else "float32"
    outputs = [("fused kernel" if device.type == "cuda" else "fused kernel (the torch ops on the CPU)", fused)]
    outputs += [(f"batched ({default})", new), ("batched, gather=copy", copied), ("batched, float32", wide)]
    for label, out in outputs:
        diff = (out - old).abs()
        print(f"per-image vs {label}: mean abs diff {diff.mean().item():.4f}, max {diff.max().item():.3f} (0..255)")


if __name__ == "__main__":
    main()
