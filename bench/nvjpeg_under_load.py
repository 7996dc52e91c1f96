"""nvJPEG's batched call while the GPU trains: its host time against CUDA_DEVICE_MAX_CONNECTIONS, side by side.

    python bench/nvjpeg_under_load.py --data DIR [--connections 8,32] [--bindings preallocated,torchvision]

Each value of ``--connections`` runs in its own process (CUDA reads the variable when it starts), which decodes
``--batch`` new files of the folder per call, ``--calls`` calls per row, through each binding of ``data.nvjpeg``
(``preallocated``: nvjpeg_batched.py's handle; ``torchvision``: ``torchvision.io.decode_jpeg``), on a stream of
gpu_decode's priority, first on an idle GPU, then while another thread keeps a queue of large bf16 matrix products
(SMs full, about as a training step) on a stream of its own, with one thread and, for ``preallocated``, with
``--threads`` threads at once, each with its own decoder (torchvision's binding has one decoder for all threads, behind
a lock). Each thread's first two calls are not timed. The parent prints one Markdown table:

    call ms      median host time of one call (wall); CPU ms the calling thread's CPU time in it: nvJPEG waits for
                 its own streams by spinning, so CPU time near wall is waiting as well as work
    img/s        all threads' timed JPEGs over the time from the first timed call's start to the last one's end
    refused      JPEGs the hardware decoder did not take (``preallocated`` only; the app decodes them otherwise)

On an H200 (bench/RESULTS.md, sixteenth session) with 128 JPEGs of 300-500 px a call: 8.5 ms on an idle GPU; 197 ms
beside the matrix products with CUDA's default 8 hardware queues, where nvJPEG's ~14 internal streams share queues
with the busy stream and wait for its queued work; 20 ms with 32 queues (cuda_env.py, which train.py applies).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BINDINGS = ("preallocated", "torchvision")
COLUMNS = ("CUDA_DEVICE_MAX_CONNECTIONS", "binding", "GPU", "threads", "call ms", "CPU ms", "img/s", "refused")
WARMUP = 2  # untimed calls of each thread before its timed ones (the decoder's first allocations)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="JPEG folder: DIR/train/<class>/*.JPEG (bench/make_jpeg_folder.py)")
    p.add_argument("--connections", default="8,32", help="CUDA_DEVICE_MAX_CONNECTIONS values, one process each")
    p.add_argument("--bindings", default=",".join(BINDINGS), help=f"data.nvjpeg bindings: {', '.join(BINDINGS)}")
    p.add_argument("--batch", type=int, default=128, help="JPEGs per call")
    p.add_argument("--calls", type=int, default=8, help="timed calls per thread and row (after two untimed)")
    p.add_argument(
        "--threads", type=int, default=2, help="threads decoding at once, each its own decoder (preallocated)"
    )
    p.add_argument("--timeout", type=float, default=900, help="seconds for each connections value's process")
    p.add_argument("--child", type=int, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    try:
        a.connections = [int(value) for value in a.connections.split(",")]
    except ValueError:
        p.error(f"--connections: comma-separated whole numbers from 1 to 32, got {a.connections!r}")
    if not all(1 <= value <= 32 for value in a.connections):
        p.error(f"--connections: CUDA takes 1 to 32 hardware queues, got {a.connections}")
    a.bindings = a.bindings.split(",")
    unknown = [b for b in a.bindings if b not in BINDINGS]
    if unknown:
        p.error(f"--bindings: {', '.join(unknown)} unknown; choose from {', '.join(BINDINGS)}")
    if a.timeout <= 0:
        p.error(f"--timeout must be positive, got {a.timeout}")
    for flag in ("batch", "calls", "threads"):
        if getattr(a, flag) < 1:
            p.error(f"--{flag} must be at least 1, got {getattr(a, flag)}")
    if not training_files(a.data):
        p.error(f"--data {a.data}: no files in {Path(a.data) / 'train'}/<class>/ (bench/make_jpeg_folder.py)")
    return a


def training_files(data: str) -> list[Path]:
    """The training images of the folder ``data``, as the app's dataset finds them (resize_dataset.image_files)."""
    sys.path.insert(0, str(ROOT))
    from resize_dataset import image_files

    return [Path(data) / name for name in image_files(Path(data), ("train",))]


def table(rows: list[dict]) -> list[str]:
    """The Markdown table of the children's rows, in their order."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        cells = (r["connections"], r["binding"], r["load"], r["threads"], f"{r['call_ms']:.2f}", f"{r['cpu_ms']:.2f}")
        lines.append("| " + " | ".join(map(str, cells)) + f" | {r['img_s']:,.0f} | {r['refused']} |")
    return lines


def child(a: argparse.Namespace) -> None:
    """Runs every row in this process (its CUDA_DEVICE_MAX_CONNECTIONS set by the parent) and prints them as JSON."""
    import torch
    import torchvision.io

    sys.path.insert(0, str(ROOT))
    import gpu_decode
    from nvjpeg_batched import BatchedDecoder

    device = torch.device("cuda", 0)
    files = training_files(a.data)
    taken = iter(range(10**9))

    def new_batches(count: int) -> list[list[torch.Tensor]]:  # new files every call, as in training
        return [[torchvision.io.read_file(str(files[next(taken) % len(files)])) for _ in range(a.batch)]
                for _ in range(count)]  # fmt: skip

    stop = threading.Event()
    load_errors: list[BaseException] = []

    def busy() -> None:  # SMs full, a queue of work always waiting behind the running kernel
        try:
            with torch.cuda.stream(torch.cuda.Stream(device)):
                x = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
                while not stop.is_set():
                    events = []
                    for _ in range(20):
                        x @ x
                        events.append(torch.cuda.Event())
                        events[-1].record()
                    events[5].synchronize()
        except BaseException as error:  # the busy rows would measure an idle GPU: the row raises it
            load_errors.append(error)

    def row(binding: str, load: str, threads: int) -> dict:
        work = [new_batches(a.calls + WARMUP) for _ in range(threads)]
        decoders = [BatchedDecoder(device, a.batch, 512, 512) if binding == "preallocated" else None for _ in work]
        streams = [torch.cuda.Stream(device, priority=gpu_decode.DECODE_STREAM_PRIORITY) for _ in work]
        ready = threading.Barrier(threads)  # every thread past its warm-up before the clock starts
        timed: list[tuple[float, float]] = []
        spans: list[tuple[float, float]] = []
        refused, errors = [0] * threads, []  # refused: per thread, each adds to its own

        def decode(k: int) -> None:
            try:
                with torch.cuda.stream(streams[k]):
                    for call, jpegs in enumerate(work[k]):
                        if call == WARMUP:
                            streams[k].synchronize()
                            ready.wait()
                            begin = time.perf_counter()
                        wall, cpu = time.perf_counter(), time.thread_time()
                        if decoders[k] is not None:
                            images = decoders[k].decode(jpegs)  # None: a JPEG the hardware decoder does not take
                            refused[k] += sum(image is None for image in images) if call >= WARMUP else 0
                        else:
                            torchvision.io.decode_jpeg(jpegs, device=device)
                        if call >= WARMUP:
                            timed.append((time.perf_counter() - wall, time.thread_time() - cpu))
                    streams[k].synchronize()
                    spans.append((begin, time.perf_counter()))
            except BaseException as error:
                errors.append(error)
                ready.abort()  # the other threads stop waiting for this one

        pool = [threading.Thread(target=decode, args=(k,)) for k in range(threads)]
        [t.start() for t in pool]
        [t.join() for t in pool]
        for decoder in decoders:
            if decoder is not None:
                decoder.close()
        failed = [e for e in errors if not isinstance(e, threading.BrokenBarrierError)] or errors
        if failed:
            raise RuntimeError(f"{binding}, {load}, {threads} thread(s): a decoding thread failed") from failed[0]
        if load == "busy" and (load_errors or not loader.is_alive()):
            raise RuntimeError("the thread that keeps the GPU busy stopped: the busy rows would be idle ones") from (
                load_errors[0] if load_errors else None
            )
        seconds = max(end for _, end in spans) - min(begin for begin, _ in spans)
        return {
            "connections": a.child, "binding": binding, "load": load, "threads": threads,
            "call_ms": statistics.median(w for w, _ in timed) * 1e3,
            "cpu_ms": statistics.median(c for _, c in timed) * 1e3,
            "img_s": threads * a.calls * a.batch / seconds,
            "refused": sum(refused),
        }  # fmt: skip

    rows = [row(binding, "idle", 1) for binding in a.bindings]
    loader = threading.Thread(target=busy, daemon=True)
    loader.start()
    time.sleep(1.0)  # the queue filled
    for binding in a.bindings:
        rows.append(row(binding, "busy", 1))
        if binding == "preallocated" and a.threads > 1:  # torchvision's decoder is one, behind a lock, for all threads
            rows.append(row(binding, "busy", a.threads))
    stop.set()
    loader.join()
    for r in rows:
        print("ROW " + json.dumps(r), flush=True)


def main(argv: list[str] | None = None) -> None:
    a = parse(argv)
    if a.child is not None:
        child(a)
        return
    rows = []
    args = list(sys.argv[1:] if argv is None else argv)
    for connections in a.connections:
        env = {**os.environ, "CUDA_DEVICE_MAX_CONNECTIONS": str(connections)}
        try:
            proc = subprocess.run(
                [sys.executable, __file__, *args, "--child", str(connections)],
                capture_output=True,
                text=True,
                env=env,
                timeout=a.timeout,
            )
        except subprocess.TimeoutExpired:
            sys.exit(f"the process with CUDA_DEVICE_MAX_CONNECTIONS={connections} ran past --timeout {a.timeout:g} s")
        found = [json.loads(line[4:]) for line in proc.stdout.splitlines() if line.startswith("ROW ")]
        if proc.returncode != 0 or not found:
            print(proc.stdout[-2000:], proc.stderr[-4000:], file=sys.stderr)
            sys.exit(f"the process with CUDA_DEVICE_MAX_CONNECTIONS={connections} failed ({proc.returncode})")
        rows += found
        print(f"CUDA_DEVICE_MAX_CONNECTIONS={connections}: {len(found)} rows", flush=True)
    print(f"\nnvJPEG's batched call, {a.batch} new JPEGs a call of {a.data}, median of {a.calls} calls per row")
    print("\n".join(table(rows)))


if __name__ == "__main__":
    main()
