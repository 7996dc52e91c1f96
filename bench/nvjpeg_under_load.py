"""nvJPEG's batched call while the GPU trains: its host time against CUDA_DEVICE_MAX_CONNECTIONS, side by side.

    python bench/nvjpeg_under_load.py --data DIR [--connections 8,32] [--bindings preallocated,torchvision]

Each value of ``--connections`` runs in its own process (CUDA reads the variable when it starts), which decodes
``--batch`` new files of the folder per call, ``--calls`` calls per row, through each binding of ``data.nvjpeg``
(``preallocated``: nvjpeg_batched.py's handle; ``torchvision``: ``torchvision.io.decode_jpeg``), on a stream of
gpu_decode's priority, first on an idle GPU, then while another thread keeps a queue of large bf16 matrix products
(SMs full, about as a training step) on a stream of its own, with one thread and with ``--threads`` threads at once
(each with its own decoder). The parent prints one Markdown table:

    call ms      median host time of one call (wall); CPU ms the calling thread's CPU time in it: nvJPEG waits for
                 its own streams by spinning, so CPU time near wall is waiting as well as work
    img/s        all threads' JPEGs over the row's wall time

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
COLUMNS = ("CUDA_DEVICE_MAX_CONNECTIONS", "binding", "GPU", "threads", "call ms", "CPU ms", "img/s")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="JPEG folder: DIR/train/<class>/*.JPEG (bench/make_jpeg_folder.py)")
    p.add_argument("--connections", default="8,32", help="CUDA_DEVICE_MAX_CONNECTIONS values, one process each")
    p.add_argument("--bindings", default=",".join(BINDINGS), help=f"data.nvjpeg bindings: {', '.join(BINDINGS)}")
    p.add_argument("--batch", type=int, default=128, help="JPEGs per call")
    p.add_argument("--calls", type=int, default=8, help="timed calls per row (after two untimed)")
    p.add_argument("--threads", type=int, default=2, help="threads decoding at once in the last row of each binding")
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
    for flag in ("batch", "calls", "threads"):
        if getattr(a, flag) < 1:
            p.error(f"--{flag} must be at least 1, got {getattr(a, flag)}")
    if not any((Path(a.data) / "train").glob("*/*")):
        p.error(f"--data {a.data}: no files in {Path(a.data) / 'train'}/<class>/ (bench/make_jpeg_folder.py)")
    return a


def table(rows: list[dict]) -> list[str]:
    """The Markdown table of the children's rows, in their order."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        cells = (r["connections"], r["binding"], r["load"], r["threads"], f"{r['call_ms']:.2f}", f"{r['cpu_ms']:.2f}")
        lines.append("| " + " | ".join(map(str, cells)) + f" | {r['img_s']:,.0f} |")
    return lines


def child(a: argparse.Namespace) -> None:
    """Runs every row in this process (its CUDA_DEVICE_MAX_CONNECTIONS set by the parent) and prints them as JSON."""
    import torch
    import torchvision.io

    sys.path.insert(0, str(ROOT))
    import gpu_decode
    from nvjpeg_batched import BatchedDecoder

    device = torch.device("cuda", 0)
    files = sorted(p for p in (Path(a.data) / "train").glob("*/*") if p.is_file())
    taken = iter(range(10**9))

    def new_batches(count: int) -> list[list[torch.Tensor]]:  # new files every call, as in training
        return [[torchvision.io.read_file(str(files[next(taken) % len(files)])) for _ in range(a.batch)]
                for _ in range(count)]  # fmt: skip

    stop = threading.Event()

    def busy() -> None:  # SMs full, a queue of work always waiting behind the running kernel
        x = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
        with torch.cuda.stream(torch.cuda.Stream(device)):
            while not stop.is_set():
                events = []
                for _ in range(20):
                    x @ x
                    events.append(torch.cuda.Event())
                    events[-1].record()
                events[5].synchronize()

    def row(binding: str, load: str, threads: int) -> dict:
        work = [new_batches(a.calls + 2) for _ in range(threads)]
        decoders = [BatchedDecoder(device, a.batch, 512, 512) if binding == "preallocated" else None for _ in work]
        streams = [torch.cuda.Stream(device, priority=gpu_decode.DECODE_STREAM_PRIORITY) for _ in work]
        timed: list[tuple[float, float]] = []

        def decode(k: int) -> None:
            with torch.cuda.stream(streams[k]):
                for call, jpegs in enumerate(work[k]):
                    wall, cpu = time.perf_counter(), time.thread_time()
                    if decoders[k] is not None:
                        decoders[k].decode(jpegs)
                    else:
                        torchvision.io.decode_jpeg(jpegs, device=device)
                    if call >= 2:
                        timed.append((time.perf_counter() - wall, time.thread_time() - cpu))
                streams[k].synchronize()

        start = time.perf_counter()
        pool = [threading.Thread(target=decode, args=(k,)) for k in range(threads)]
        [t.start() for t in pool]
        [t.join() for t in pool]
        seconds = time.perf_counter() - start
        for decoder in decoders:
            if decoder is not None:
                decoder.close()
        return {
            "connections": a.child, "binding": binding, "load": load, "threads": threads,
            "call_ms": statistics.median(w for w, _ in timed) * 1e3,
            "cpu_ms": statistics.median(c for _, c in timed) * 1e3,
            "img_s": threads * (a.calls + 2) * a.batch / seconds,
        }  # fmt: skip

    rows = [row(binding, "idle", 1) for binding in a.bindings]
    loader = threading.Thread(target=busy, daemon=True)
    loader.start()
    time.sleep(1.0)  # the queue filled
    for binding in a.bindings:
        rows += [row(binding, "busy", 1), row(binding, "busy", a.threads)]
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
        proc = subprocess.run(
            [sys.executable, __file__, *args, "--child", str(connections)], capture_output=True, text=True, env=env
        )
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
