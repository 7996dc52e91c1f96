"""What the GPU decode path's producer work costs the training thread: nvJPEG's frees and pageable copies.

An nsys trace of ``data.decode: gpu`` with ``data.cpu_decode_share 0.85`` (bench/RESULTS.md) showed the producer
thread in a pageable ``cudaMemcpyAsync`` of the finished crops every step (5.1-8.0 ms) and in a ``cuMemFree``
(0.8-12.3 ms) inside torchvision's batched nvJPEG call in 7 of 10 steps; the training thread's launches waited for
both. This script calls the producer's work the way the prefetcher does, on new files every call as in training, while
a second thread launches small kernels (as the training thread does) and the GPU runs unrelated work on another stream
(a one-thread ``torch.cuda._sleep`` kernel that leaves the SMs free), and prints per row:

    call ms        host time of one call (median / largest)
    waited         calls that returned only after the unrelated GPU work (--busy-ms, longer than any call should
                   take) had finished: a device-wide sync
    launcher gap   the launching thread's longest pause between two launches during the row (the GIL, or a driver
                   lock the call held), against the ``idle`` row's

Rows, in this order in one process:

    new files (cold)        torchvision.io.decode_jpeg on a list, counts drawn as the split draws them
    new files, all W x H    (--same-size W H) the next files re-encoded at one size: new bitstreams, one image size
    decode_batch, pageable  the app's producer work on packed batches (share --share), the batch left in pageable
                            memory (crops, JPEG bytes and crop table copied from it)
    decode_batch            the same as the app does it: the batch staged in page-locked memory
    nvjpeg_batched (...)    the next files by nvjpeg_batched.py's own handle: buffers preallocated for the batch at
                            512 x 512 (``data.nvjpeg: preallocated``), and the same handle without preallocation
    decode_batch, data.nvjpeg preallocated   the app's producer work with that decoder

Run it under ``nsys profile -t cuda,nvtx`` and count ``cuMemFree`` per row with ``bench/nsys_api_by_range.py``
(each row is an NVTX range, its warm-up calls included). On an H200 (bench/RESULTS.md) the frees came with new image
sizes: 101 in 18 calls of files of many sizes, each waiting for the whole device, and 3 short ones with files of one
size; decoding 256 large JPEGs first did not prevent them. Only files nvJPEG gets are used (the ones the app hands to
PIL, such as CMYK or truncated JPEGs, are skipped).

    python bench/nvjpeg_calls.py --data /tmp/jpegs --share 0.85
"""

from __future__ import annotations

import argparse
import io
import itertools
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from longest_pause import LongestPause  # noqa: E402 (bench/, the script's own folder)

import gpu_decode  # noqa: E402
from encoded_batch import Encoded, EncodedSampleLoader, encoded_collate  # noqa: E402
from gpu_decode import decode_batch  # noqa: E402
from nvjpeg_batched import BatchedDecoder, NvjpegError  # noqa: E402


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="JPEG folder: DIR/train/<class>/*.JPEG (bench/make_jpeg_folder.py)")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--share", type=float, default=0.85, help="data.cpu_decode_share the JPEG counts stand for")
    p.add_argument("--calls", type=int, default=25, help="timed calls per row")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls per row before timing")
    p.add_argument(
        "--busy-ms", type=float, default=100.0, help="GPU work on another stream before each call: longer than a call"
    )
    p.add_argument("--same-size", type=int, nargs=2, metavar=("W", "H"), help="add a row of new files all W x H")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    if not 0.0 <= a.share < 1.0:
        p.error(f"--share must be in [0, 1), got {a.share}")
    return a


def launcher(device: torch.device) -> LongestPause:
    """A thread that launches a small kernel on its own stream in a loop: its longest pause between two launches."""
    tensor, stream, launches = torch.zeros(1024, device=device), torch.cuda.Stream(device), itertools.count(1)

    def launch() -> None:
        tensor.add_(1.0)
        if next(launches) % 64 == 0:
            stream.synchronize()  # a short queue: the pause measures the host, not a full queue

    return LongestPause(launch, context=lambda: torch.cuda.stream(stream), warmup_s=0.1)


def resized(jpeg: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    buffer = io.BytesIO()
    Image.open(io.BytesIO(jpeg.numpy().tobytes())).convert("RGB").resize(size).save(buffer, "JPEG", quality=90)
    return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)


def sleep_cycles(device: torch.device, ms: float) -> int:
    """Cycles of ``torch.cuda._sleep`` that last about ``ms``."""
    torch.cuda._sleep(1000)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()
    return int(10_000_000 * ms / start.elapsed_time(end))


def row(label: str, call: Callable[[], object], a: argparse.Namespace, device: torch.device, cycles: int) -> str:
    side = torch.cuda.Stream(device)
    torch.cuda.nvtx.range_push(label)  # for an nsys run: which row a runtime call belongs to
    for _ in range(a.warmup):
        call()
    torch.cuda.synchronize(device)
    times, waited = [], 0
    with launcher(device) as pauses:
        for _ in range(a.calls):
            with torch.cuda.stream(side):
                torch.cuda._sleep(cycles)
                busy = torch.cuda.Event()
                busy.record(side)
            start = time.perf_counter()
            call()
            times.append((time.perf_counter() - start) * 1e3)
            waited += busy.query()
            torch.cuda.synchronize(device)
        gap = pauses.longest * 1e3
    torch.cuda.nvtx.range_pop()
    return f"| {label} | {statistics.median(times):.2f} / {max(times):.2f} | {waited}/{a.calls} | {gap:.2f} |"


def main(argv: list[str] | None = None) -> None:
    from torchvision.io import ImageReadMode, decode_jpeg

    a = parse(argv)
    if not torch.cuda.is_available():
        raise SystemExit("needs CUDA: nvJPEG runs on the GPU")
    device = torch.device("cuda")
    folder = Path(a.data) / "train" if (Path(a.data) / "train").is_dir() else Path(a.data)
    files = sorted(folder.glob("*/*.JPEG"))
    np.random.default_rng(a.seed).shuffle(files)
    rows_with_files = 7 if a.same_size else 6
    counts = np.random.default_rng(a.seed).binomial(a.batch, 1.0 - a.share, size=a.calls + a.warmup)
    counts = counts.clip(min=1).tolist()
    needed = rows_with_files * sum(counts)
    loader = EncodedSampleLoader(True, 224, 0.08, 256, pil_loader=lambda path: Image.open(path).convert("RGB"))
    torch.manual_seed(a.seed)
    encoded = []  # read before any timing; only files nvJPEG gets (not CMYK, PNG, rotated or truncated ones)
    for f in files:
        if len(encoded) == needed:
            break
        sample = loader(str(f))
        if sample.encoded:
            encoded.append(sample)
    if len(encoded) < needed:
        raise SystemExit(f"{folder}: every call gets new files; need {needed} JPEGs for nvJPEG, found {len(encoded)}")
    samples = iter(encoded)
    crop = torch.randint(0, 256, (3, 224, 224), dtype=torch.uint8)
    finished = Encoded(crop, False, (0, 0, 224, 224), False, finished=True)
    producer = torch.cuda.Stream(device)

    def jpeg_calls(size: tuple[int, int] | None = None) -> Callable[[], object]:
        files = [[next(samples).data for _ in range(n)] for n in counts]
        if size is not None:  # the same files re-encoded at one size: new bitstreams, one image size
            files = [[resized(data, size) for data in batch] for batch in files]
        batches: Iterator[list[torch.Tensor]] = iter(files)
        return lambda: decode_jpeg(next(batches), mode=ImageReadMode.RGB, device=device)

    def own_calls(**options: bool) -> Callable[[], object]:
        """nvjpeg_batched.BatchedDecoder on the next files, sized as the app sizes it (batch, PREALLOCATE_SIDE)."""
        batches = iter([[next(samples) for _ in range(n)] for n in counts])
        side = gpu_decode.PREALLOCATE_SIDE
        decoder = BatchedDecoder(device, a.batch, side, side, **options)

        def call() -> object:
            batch = next(batches)
            with torch.cuda.stream(producer):
                return decoder.decode([s.data for s in batch])

        return call

    def packed_calls(nvjpeg: str = "torchvision") -> Callable[[], object]:
        batches = [[(next(samples), 0) for _ in range(n)] + [(finished, 0)] * (a.batch - n) for n in counts]
        packed = iter([encoded_collate(batch)[0] for batch in batches])

        def call() -> object:
            with torch.cuda.stream(producer):
                return decode_batch(next(packed), device, 224, nvjpeg=nvjpeg)

        return call

    cycles = sleep_cycles(device, a.busy_ms)
    print(
        f"torch {torch.__version__}, {torch.cuda.get_device_name(device)}; {a.calls} calls per row after {a.warmup}; "
        f"JPEGs per call: binomial({a.batch}, {1 - a.share:.2f}), {min(counts)}-{max(counts)}; "
        f"{a.busy_ms:.0f} ms of GPU work on another stream before each call"
    )
    print()
    print("| row | call ms (median / max) | waited for the other GPU work | launcher's longest gap ms |")
    print("|---|---|---|---|")
    print(row("idle (no call)", lambda: None, a, device, cycles), flush=True)
    print(row("new files (cold)", jpeg_calls(), a, device, cycles), flush=True)
    if a.same_size:
        width, height = a.same_size
        print(row(f"new files, all {width} x {height}", jpeg_calls((width, height)), a, device, cycles), flush=True)
    staged = gpu_decode._staged
    gpu_decode._staged = lambda host, device: host  # the copy as it was: from pageable memory
    try:
        print(row(f"decode_batch, share {a.share}, pageable", packed_calls(), a, device, cycles), flush=True)
    finally:
        gpu_decode._staged = staged
    print(row(f"decode_batch, share {a.share}", packed_calls(), a, device, cycles), flush=True)
    for label, options in [("preallocated", {}), ("no preallocation", {"preallocate": False})]:
        try:
            calls = own_calls(**options)
        except NvjpegError as error:
            print(f"| new files, nvjpeg_batched ({label}) | {error} | | |", flush=True)
            continue
        print(row(f"new files, nvjpeg_batched ({label})", calls, a, device, cycles), flush=True)
    preallocated = packed_calls("preallocated")
    print(row(f"decode_batch, share {a.share}, data.nvjpeg preallocated", preallocated, a, device, cycles))


if __name__ == "__main__":
    main()
