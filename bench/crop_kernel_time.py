"""GPU time of variants of gpu_crop_kernel.py's kernel on real batches, alternated, with their pixels against the
per-image reference.

    python bench/make_jpeg_folder.py /tmp/jpegs --classes 100 --train-per-class 96 --val-per-class 4
    git show e6a36b2:gpu_crop_kernel.py > /tmp/direct.py   # the direct (2-D) version
    python bench/crop_kernel_time.py --data /tmp/jpegs --kernel-file /tmp/direct.py --kernel-file gpu_crop_kernel.py

On an H200 (bench/RESULTS.md, thirty-ninth session; 4 batches of 128, median scale 1.23): the direct version 0.440 ms
a batch, the separable one 0.361 with 8 warps (0.451 with 4), the same pixels (max 3.2e-3 of 255 from the reference).

Why alternated and on real batches: a kernel's time depends on the crops' scales (the taps and input rows a tile
reads) and on the clocks and L2 at the time; each variant runs in turn (A, B, A, B, ...) on the same decoded
batches, so that drift of the machine falls on all of them alike.

``--batches`` batches of ``--batch`` JPEGs of ``DIR/train/<class>/`` (or ``DIR/<class>/``) are decoded once with
``torchvision.io.decode_jpeg`` on the GPU (one batched nvJPEG call a batch), RandomResizedCrop boxes (scale 0.08-1,
as the app's loader) and flips drawn with ``--seed``. Each variant is a copy of gpu_crop_kernel.py (``--kernel-file``,
repeatable; the repo's own without one), loaded under its own module name, and gets the table and parameters
:func:`gpu_decode._crop_resize_fused` builds (:func:`gpu_decode.fused_table`, with the variant's ``taps``), from the
images concatenated into one flat buffer (as for torchvision's separately allocated images). A round times, for each
variant and batch, ``--launches`` launches between two CUDA events after ``--warmup`` untimed ones, queued while the
stream sleeps (so that they run back to back, however long the host takes to launch them); the table gives
each variant's median over ``--rounds`` rounds of its mean ms a launch (a batch), and the largest and mean absolute
difference of its pixels (0..255) from the per-image reference (``F.interpolate`` of each crop in float32 on the GPU,
:func:`gpu_decode._resize_one`). Repeated launches on one batch find part of its images in L2 (a training step
crops each batch once); that favours no variant. Prints to stdout only.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from decode_bench import folder_files  # noqa: E402 (bench/, the script's own folder)

import gpu_decode  # noqa: E402
from encoded_batch import Encoded  # noqa: E402

EXTENSIONS = {".jpeg", ".jpg"}
#: GPU clock cycles (about 10 ms) the stream sleeps before each timed series while the host queues its launches.
QUEUE_CYCLES = 20_000_000
#: Where the batches are decoded and the kernels run.
DEVICE = "cuda"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("--data", required=True, help="JPEG folder: DIR/train/<class>/*.JPEG (or DIR/<class>/*)")
    p.add_argument(
        "--kernel-file",
        action="append",
        default=[],
        metavar="PATH",
        help="a copy of gpu_crop_kernel.py to time (repeatable; default: the repo's gpu_crop_kernel.py)",
    )
    p.add_argument("--batch", type=int, default=128, help="crops a launch")
    p.add_argument("--batches", type=int, default=4, help="distinct batches decoded once")
    p.add_argument("--size", type=int, default=224, help="output side")
    p.add_argument("--launches", type=int, default=40, help="timed launches a variant, batch and round")
    p.add_argument("--warmup", type=int, default=5, help="untimed launches before them")
    p.add_argument("--rounds", type=int, default=4, help="alternations of the variants (median over them)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--memory-format", choices=("channels_last", "contiguous"), default="channels_last")
    a = p.parse_args(argv)
    least = {"batch": 1, "batches": 1, "size": 1, "launches": 1, "warmup": 0, "rounds": 1}
    for option, value in least.items():
        if getattr(a, option) < value:
            p.error(f"--{option} {getattr(a, option)}: give at least {value}")
    a.kernel_file = a.kernel_file or [str(ROOT / "gpu_crop_kernel.py")]
    return a


def load_variant(path: str, index: int) -> ModuleType:
    """``path`` as a module of its own (``crop_kernel_variant_<index>``): two copies of one kernel do not share
    Triton's cache of compiled kernels by name, nor their module state."""
    spec = importlib.util.spec_from_file_location(f"crop_kernel_variant_{index}", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--kernel-file {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # The layout gpu_decode.fused_table writes (the repo's gpu_crop_kernel.py), for this script as for the app.
    layout = (gpu_decode.gpu_crop_kernel.INT_COLUMNS, gpu_decode.gpu_crop_kernel.FLOAT_COLUMNS)
    if (tuple(module.INT_COLUMNS), tuple(module.FLOAT_COLUMNS)) != layout:
        raise SystemExit(f"--kernel-file {path}: another table layout than gpu_decode.fused_table writes")
    return module


def decode_batches(a: argparse.Namespace, device: torch.device) -> list[tuple[list[Encoded], list[torch.Tensor]]]:
    """Each batch's samples (box and flip drawn) and decoded ``(3, H, W)`` uint8 images on ``device``."""
    from torchvision import transforms
    from torchvision.io import ImageReadMode, decode_jpeg, read_file

    needed = a.batch * a.batches
    files = folder_files(a.data, a.seed, needed, EXTENSIONS)  # JPEGs only: nvJPEG decodes them
    torch.manual_seed(a.seed)
    batches = []
    for first in range(0, needed, a.batch):
        data = [read_file(path) for path in files[first : first + a.batch]]
        images = decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
        samples = []
        for encoded, image in zip(data, images, strict=True):
            box = transforms.RandomResizedCrop.get_params(image, (0.08, 1.0), (3 / 4, 4 / 3))
            flip = bool(torch.rand(1).item() < 0.5)
            samples.append(Encoded(encoded, True, tuple(int(v) for v in box), flip))
        batches.append((samples, [image.contiguous() for image in images]))
    torch.cuda.synchronize(device)
    return batches


def build(module: ModuleType, samples: list[Encoded], images: list[torch.Tensor], size: int) -> tuple:
    """``(flat, table, parameters)`` for ``module.launch``, as :func:`gpu_decode._crop_resize_fused` builds them
    from separately allocated images (one concatenation), with ``module``'s own taps."""
    flat = gpu_decode._flatten_dense_tensors(images)
    offsets = np.cumsum([0] + [image.numel() for image in images[:-1]]).tolist()
    shapes = [image.shape for image in images]
    table, parameters = gpu_decode.fused_table(samples, shapes, offsets, size, taps=module.taps)
    return flat, torch.from_numpy(table).to(flat.device), torch.from_numpy(parameters).to(flat.device)


def main(argv: list[str] | None = None) -> None:
    a = parse(argv)
    device = torch.device(DEVICE)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device: the kernels are timed on the GPU")
    variants = []  # (label, module): a path given twice is two variants
    for k, path in enumerate(a.kernel_file):
        variants.append((path if a.kernel_file.count(path) == 1 else f"{path} #{k + 1}", load_variant(path, k)))
    batches = decode_batches(a, device)
    memory_format = torch.channels_last if a.memory_format == "channels_last" else torch.contiguous_format
    scales = [max(s.box[2], s.box[3]) / a.size for samples, _ in batches for s in samples]
    print(f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}; {a.batches} batches of {a.batch} "
          f"RandomResizedCrops to {a.size} x {a.size} ({a.memory_format}), input pixels an output along the longer "
          f"side: median {statistics.median(scales):.2f}, {min(scales):.2f}-{max(scales):.2f}")  # fmt: skip

    references = [
        torch.stack([gpu_decode._resize_one(image, sample, a.size) for sample, image in zip(*batch, strict=True)])
        for batch in batches
    ]
    inputs, outputs, errors = {}, {}, {}
    for path, module in variants:
        largest, total, count = 0.0, 0.0, 0
        for b, ((samples, images), reference) in enumerate(zip(batches, references, strict=True)):
            inputs[path, b] = build(module, samples, images, a.size)
            out = torch.empty((len(samples), 3, a.size, a.size), device=device, memory_format=memory_format)
            outputs[path, b] = out
            module.launch(*inputs[path, b], out)  # the first launch compiles the variant
            difference = (out - reference).abs()
            largest, total, count = max(largest, difference.max().item()), total + difference.sum().item(), count + 1
        errors[path] = (largest, total / (count * references[0].numel()))

    times: dict[str, list[float]] = {path: [] for path, _ in variants}
    drained = 0  # timed series whose sleep ended before the host had queued them
    for _ in range(a.rounds):
        for path, module in variants:  # A, B, ..., then again: each variant's rounds alternate with the others'
            events = []
            for b in range(len(batches)):
                for _ in range(a.warmup):
                    module.launch(*inputs[path, b], outputs[path, b])
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                # The GPU waits while the host queues the launches: the events then time the kernels back to back,
                # not the host's launch rate (a launch's Python and Triton overhead can exceed a faster kernel's time).
                torch.cuda._sleep(QUEUE_CYCLES)
                start.record()
                for _ in range(a.launches):
                    module.launch(*inputs[path, b], outputs[path, b])
                drained += start.query()  # the GPU already past the sleep: some launches may have waited for the host
                end.record()
                events.append((start, end))
            torch.cuda.synchronize(device)
            times[path].append(sum(s.elapsed_time(e) for s, e in events) / (len(events) * a.launches))

    width = max(len("variant"), *(len(path) for path, _ in variants))
    span = 8 * a.rounds  # "0.1234, " a round
    print(f"{'variant':<{width}}  ms a batch (median)  {'rounds (ms)':<{span}}  max |diff|  mean |diff|")
    for path, _ in variants:
        rounds = ", ".join(f"{t:.4f}" for t in times[path])
        largest, mean = errors[path]
        median = statistics.median(times[path])
        print(f"{path:<{width}}  {median:19.4f}  {rounds:<{span}}  {largest:10.2e}  {mean:11.2e}")
    if drained:
        print(f"{drained} timed series started before the host had queued all their launches: their times may include "
              "the host's launch gaps; give fewer --launches")  # fmt: skip


if __name__ == "__main__":
    main()
