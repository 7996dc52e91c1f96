"""Where the prefetcher's producer thread spends its time: wall and CPU time per call of each step, per thread.

    python bench/producer_timing.py [--switch-ms MS] [--sync-release] [--gil-probe [--gil-probe-after S]] [--nvtx] \
        -- SCRIPT [ARGS ...]

Runs the Python script SCRIPT (e.g. ``bench/throughput.py ... --child app_folder_gpu_tv@0.5:reduce-overhead``, one
variant in this process) with the input path's functions wrapped, and at exit prints one Markdown row per thread and
function: calls, wall and CPU milliseconds per call (inclusive: ``decode_batch`` holds ``_decode``), the total wall
seconds, and the first and the longest call's wall milliseconds. Under ``data.decode: gpu`` the producer thread
(``DevicePrefetcher``) decodes every batch; when the main thread's ``queue.Queue.get`` (its wait for the next batch)
takes about a step, that thread sets the pace, and its rows say on what. Wall well above CPU means the thread waited
(for the GIL, a lock, the loader's workers); CPU near wall means it worked, or spun: a CUDA synchronization spins on a
CPU core by default. The producer's ``queue.Queue.put`` row is its wait to hand a batch over (the consumer behind, the
queue full: then the producer is not the limit), and its span row (first timed call to last, per batch) against its
top rows (the loader's next batch, the whole batch, the hand-over) shows how much of each batch no timed call holds.
The first call of a row is apart because the main thread's first wait for a batch covers the loader's start (its
workers, the first decode): a mean well above ``(wall s - first) / (calls - 1)`` is that start, not the steady state.
On an H200 (fp16 eager ResNet-50, the split at 0.5) a first wait of 1.7-1.8 s made a mean of 11-12 ms a step over 150
steps; after it the wait was 0.02-0.03 ms a step (bench/RESULTS.md, thirty-sixth session).

On an H200, ResNet-50 compiled with ``reduce-overhead`` and half the 300-500 px JPEGs decoded by nvJPEG, the
producer took 55-67 ms a batch where the model's step on synthetic data takes 38 ms, 35-38 ms of it CPU time inside
nvJPEG's batched decode (bench/RESULTS.md, fifteenth session). That was nvJPEG spinning while its streams waited
behind the training step in CUDA's 8 hardware queues; with ``CUDA_DEVICE_MAX_CONNECTIONS=32`` (cuda_env.py) the call
took 16.6 ms (sixteenth session).

Options:
    --switch-ms MS    the interpreter's thread switch interval (``sys.setswitchinterval``; Python's default is 5 ms):
                      whether the GIL's hand-over holds the producer back
    --sync-release    free the host buffers of CUDA batches on the producer thread, as before ``gpu_decode``'s
                      releaser thread: that change side by side
    --side-priority P, --decode-priority P
                      the priority of the prefetcher's side stream (``prefetcher.SIDE_STREAM_PRIORITY``) and of
                      the app's decode stream (``gpu_decode.DECODE_STREAM_PRIORITY``; nvJPEG's work runs on it with
                      ``data.nvjpeg: preallocated``, torchvision's binding uses a stream of its own), from 0 (the
                      default pool, where the training stream is) to -3 (the most urgent): whether the input path's
                      kernels, queued behind the training step's, hold the producer back. The two must differ (see
                      DECODE_STREAM_PRIORITY). On an H200 neither changed anything (sixteenth session).

    --gil-probe       one more thread that sleeps 1 ms at a time and times how late each wake-up returns: a
                      thread that wakes must take the interpreter's lock (the GIL) back, so lateness well above the
                      probe's own before the script starts (printed beside it) is time the GIL was held by another
                      thread. With one thread running Python all the time, a wake-up waits about a switch interval
                      (5 ms by default); with the GIL mostly free, some tens of microseconds. Whether the producers
                      and the training thread's launches take turns on one lock, or run side by side. On an H200,
                      eager ResNet-18 with every JPEG on the GPU: 10% of wake-ups over 1 ms late, against 0.1% on
                      synthetic data (bench/RESULTS.md, eighteenth session).
    --gil-probe-after S
                      start probing S seconds in: the start-up (imports, building the model) holds the GIL for long
                      stretches of its own, so give the seconds before the timed steps to see the training alone.
    --nvtx            each timed call is also an NVTX range named as its row, on its own thread: under
                      ``nsys profile -t cuda,nvtx,osrt``, ``bench/nsys_api_by_range.py --same-thread --every-api``
                      then says which CUDA calls (and how long each took) every step of the producer made. The wall
                      time a row has beyond its CPU time is a wait; the trace names what the thread waited in.

The rows ``torch.cuda.Event.synchronize`` and ``torch.cuda.Stream.synchronize`` are the thread's waits for the device
(in ``_DecodeStream.decode``: for the previous batch's crops to be read before their memory is reused); ``torchvision
decode_jpeg`` and ``BatchedDecoder.decode`` are nvJPEG's call itself, by binding; inside the latter,
``BatchedDecoder._inspect`` reads one JPEG's header with the GIL held and ``nvjpegDecodeBatched`` is the batched C call,
with the GIL released.
"""

from __future__ import annotations

import argparse
import atexit
import functools
import math
import os
import queue
import runpy
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import nvtx

ROOT = Path(__file__).resolve().parent.parent

#: (thread name, thread ident, function) -> [calls, wall s, CPU s, first call's wall s, longest call's wall s]; two
#: producers (training and validation) share a name, so the ident keeps them apart.
STATS: dict[tuple[str, int, str], list] = defaultdict(lambda: [0, 0.0, 0.0, 0.0, 0.0])
#: (thread name, thread ident) -> [the first timed call's start, the last timed call's end], perf_counter seconds.
SPANS: dict[tuple[str, int], list] = {}
_LOCK = threading.Lock()
#: The row of a thread's span, and the row its per-batch figure divides by (a producer's whole batch).
SPAN_LABEL = "(span: its first timed call's start to its last one's end)"
BATCH_LABEL = "_to_device (the whole batch)"


#: Set by ``--nvtx``: each timed call is also an NVTX range of its label (the ``nvtx`` package's default domain).
NVTX_RANGES = False


def timed(owner: object, attr: str, label: str) -> None:
    """Replaces ``owner.attr`` by a wrapper that adds each call's wall and thread CPU time to
    ``STATS[thread name, thread ident, label]`` (and, with :data:`NVTX_RANGES`, makes the call an NVTX range)."""
    fn: Callable = getattr(owner, attr)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        ranged = NVTX_RANGES
        if ranged:
            nvtx.push_range(label)
        start, cpu = time.perf_counter(), time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            if ranged:
                nvtx.pop_range()
            end = time.perf_counter()
            wall, cpu = end - start, time.thread_time() - cpu
            thread = threading.current_thread()
            key = (thread.name, thread.ident or 0)
            with _LOCK:
                row = STATS[(*key, label)]
                if not row[0]:
                    row[3] = wall
                row[0] += 1
                row[1] += wall
                row[2] += cpu
                row[4] = max(row[4], wall)
                span = SPANS.setdefault(key, [start, end])
                span[0], span[1] = min(span[0], start), max(span[1], end)

    setattr(owner, attr, wrapper)


def instrument(
    sync_release: bool = False, side_priority: int | None = None, decode_priority: int | None = None
) -> None:
    """Wraps the loader's ``__next__``, ``queue.Queue.get`` (on the main thread, its wait for the producer), the
    prefetcher's ``_to_device`` and ``normalize``, ``gpu_decode``'s steps, ``buffer_release``'s (on
    the thread that frees the buffer: ``HostBufferReleaser``, or the producer with ``sync_release``), CUDA event and
    stream synchronizations, and nvJPEG's call through either binding; sets the streams' priorities that are given.
    Must run before the data module is imported: it imports ``decode_batch`` by name."""
    import torch
    import torch.utils.data.dataloader as dataloader
    import torchvision.io

    import buffer_release
    import encoded_batch
    import gpu_decode
    import nvjpeg_batched
    import prefetcher

    timed(dataloader._MultiProcessingDataLoaderIter, "__next__", "loader next (workers' batch)")
    timed(queue.Queue, "get", "queue.Queue.get (on MainThread: its wait for the producer)")
    # The producer's hand-over (producer_threads.ordered_map): a full queue, the consumer behind, shows as its wall.
    timed(queue.Queue, "put", "queue.Queue.put (on the producer: its wait for the consumer)")
    timed(prefetcher.DevicePrefetcher, "_to_device", BATCH_LABEL)
    timed(prefetcher, "normalize", "normalize")
    for name in ("decode_batch", "_decode", "_crop_resize", "_staged"):
        timed(gpu_decode, name, name)
    for name in ("release_later", "release_host_buffer"):
        timed(buffer_release, name, name)
    timed(gpu_decode._DecodeStream, "decode", "nvJPEG decode (_DecodeStream.decode)")
    timed(encoded_batch.PackedBatch, "unpack", "PackedBatch.unpack")
    timed(torch.cuda.Event, "synchronize", "torch.cuda.Event.synchronize")
    timed(torch.cuda.Stream, "synchronize", "torch.cuda.Stream.synchronize")
    timed(torchvision.io, "decode_jpeg", "torchvision decode_jpeg")
    timed(nvjpeg_batched.BatchedDecoder, "decode", "BatchedDecoder.decode")
    # Inside it: each JPEG's header, read with the GIL held (ctypes.PyDLL), and the batched call, which releases it.
    timed(nvjpeg_batched.BatchedDecoder, "_inspect", "BatchedDecoder._inspect (one header, GIL held)")
    try:
        lib = nvjpeg_batched.library()
    except nvjpeg_batched.NvjpegError:  # no libnvjpeg here: the torchvision binding's rows still come
        lib = None
    if lib is not None:
        timed(lib, "nvjpegDecodeBatched", "nvjpegDecodeBatched (the C call, GIL released)")
    if sync_release:

        def release_here(buffers: list) -> None:
            for buffer in buffers:
                buffer_release.release_host_buffer(buffer)

        buffer_release._Releaser.hand_over = release_here
    if side_priority is not None:
        prefetcher.SIDE_STREAM_PRIORITY = side_priority
    if decode_priority is not None:
        gpu_decode.DECODE_STREAM_PRIORITY = decode_priority


class GilProbe:
    """A daemon thread that sleeps ``interval`` seconds at a time and records how late each ``time.sleep`` returns.

    ``time.sleep`` drops the GIL and takes it back before it returns, so the lateness is the OS's wake-up plus the
    wait for the GIL: near zero when no other thread holds it, about ``sys.getswitchinterval()`` when another thread
    runs Python without pause (it keeps the GIL until asked to drop it after that interval).
    """

    def __init__(self, interval: float = 0.001, after: float = 0.0) -> None:
        if not (math.isfinite(interval) and interval > 0):
            raise ValueError(f"GilProbe interval must be a number of seconds > 0, got {interval}")
        if not (math.isfinite(after) and after >= 0):
            raise ValueError(f"GilProbe start delay must be a number of seconds >= 0, got {after}")
        self.interval, self.after = interval, after
        self.late: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> GilProbe:
        if self._thread is not None:
            raise RuntimeError("this GilProbe has started already: make a new one")
        self._thread = threading.Thread(target=self._run, name="GilProbe", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> list[float]:
        """Stops and joins the thread; returns the lateness of every wake-up, in seconds."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return self.late

    def _run(self) -> None:
        # Start-up (imports, the model's build) holds the GIL for long stretches of its own: skip it when asked.
        if self._stop.wait(self.after):
            return
        while not self._stop.is_set():
            start = time.perf_counter()
            time.sleep(self.interval)
            self.late.append(time.perf_counter() - start - self.interval)

    @staticmethod
    def measure(seconds: float, interval: float = 0.001) -> list[float]:
        """The lateness of the wake-ups of ``seconds`` of probing while the calling thread sleeps (the GIL free):
        the probe's own, for comparison."""
        probe = GilProbe(interval).start()
        time.sleep(seconds)
        return probe.stop()


def gil_summary(late: list[float], baseline: list[float], interval: float, after: float = 0.0) -> list[str]:
    """Lines that describe the probe's lateness (seconds) against its baseline: wake-ups, median, mean, 90th
    percentile and the share later than a millisecond."""

    def row(name: str, values: list[float]) -> str:
        if not values:
            return f"| {name} | 0 | (no wake-up: the script ended before the probe started?) | | | |"
        ordered = sorted(values)
        median, p90 = ordered[len(ordered) // 2], ordered[math.ceil(0.9 * len(ordered)) - 1]
        over = sum(v > 1e-3 for v in values) / len(values)
        return (
            f"| {name} | {len(values)} | {median * 1e3:.3f} | {sum(values) / len(values) * 1e3:.3f} | "
            f"{p90 * 1e3:.3f} | {over:.1%} |"
        )

    return [
        f"GIL probe: a thread that sleeps {interval * 1e3:g} ms at a time; how late its wake-ups returned "
        f"(switch interval {sys.getswitchinterval() * 1e3:g} ms)",
        "| when | wake-ups | median ms | mean ms | p90 ms | later than 1 ms |",
        "|---|---|---|---|---|---|",
        row("before the script (GIL free)", baseline),
        row(f"during the script, from {after:g} s" if after else "during the script", late),
    ]


def table(
    stats: dict[tuple[str, int, str], list], seconds: float, spans: dict[tuple[str, int], list] | None = None
) -> list[str]:
    """The Markdown table of ``stats``, the longest total wall time first. Threads that share a name are told apart
    as ``name#2``, ``name#3``, ... in the order they first appear. With ``spans``, each thread that made batches
    (:data:`BATCH_LABEL`) gets a row of its span too (:data:`SPAN_LABEL`, per batch): the time its top rows (the
    loader's next batch, the whole batch, the hand-over) leave out of it is time none of the timed calls held."""
    lines = [
        f"producer timing over {seconds:.1f} s of the process (inclusive times per call)",
        "| thread | function | calls | wall ms/call | CPU ms/call | wall s | first ms | longest ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    idents: dict[str, list[int]] = {}
    for name, ident, _ in stats:
        idents.setdefault(name, [])
        if ident not in idents[name]:
            idents[name].append(ident)

    def thread_of(name: str, ident: int) -> str:
        k = idents[name].index(ident)
        return name if k == 0 else f"{name}#{k + 1}"

    rows: list[tuple[float, str]] = []
    for (name, ident, label), (calls, wall, cpu, first, longest) in stats.items():
        thread = thread_of(name, ident)
        per_call = f"{wall / calls * 1e3:.2f} | {cpu / calls * 1e3:.2f} | {wall:.2f} | {first * 1e3:.2f}"
        rows.append((wall, f"| {thread} | {label} | {calls} | {per_call} | {longest * 1e3:.2f} |"))
    for (name, ident), (first, last) in (spans or {}).items():
        batches = stats.get((name, ident, BATCH_LABEL), [0])[0]
        if not batches:  # only a thread that made batches: another's span (the training thread's run) says nothing
            continue
        span, thread = last - first, thread_of(name, ident)
        per_batch = span / batches * 1e3
        rows.append((span, f"| {thread} | {SPAN_LABEL} | {batches} | {per_batch:.2f} | - | {span:.2f} | - | - |"))
    return lines + [line for _, line in sorted(rows, key=lambda row: -row[0])]


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--switch-ms", type=float, help="sys.setswitchinterval in milliseconds")
    p.add_argument("--sync-release", action="store_true", help="free CUDA batches' host buffers on the producer")
    p.add_argument("--side-priority", type=int, help="prefetcher.SIDE_STREAM_PRIORITY, 0 to -3")
    p.add_argument("--decode-priority", type=int, help="gpu_decode.DECODE_STREAM_PRIORITY, 0 to -3")
    p.add_argument("--gil-probe", action="store_true", help="time how late a 1 ms sleeper gets the GIL back")
    p.add_argument(
        "--gil-probe-after", type=float, metavar="S", help="start the GIL probe S seconds in (default at once)"
    )
    p.add_argument("--nvtx", action="store_true", help="make each timed call an NVTX range too (for nsys)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- SCRIPT [ARGS ...]")
    a = p.parse_args(argv)
    if a.command[:1] == ["--"]:
        a.command = a.command[1:]
    if not a.command:
        p.error("give the script to run after --, e.g. -- bench/throughput.py ... --child VARIANT")
    if not Path(a.command[0]).is_file():
        p.error(f"script {a.command[0]!r} not found")
    if a.switch_ms is not None and not (math.isfinite(a.switch_ms) and a.switch_ms > 0):
        p.error(f"--switch-ms must be a number > 0, got {a.switch_ms}")
    if a.gil_probe_after is not None:
        if not a.gil_probe:
            p.error("--gil-probe-after needs --gil-probe")
        if not (math.isfinite(a.gil_probe_after) and a.gil_probe_after >= 0):
            p.error(f"--gil-probe-after must be a number of seconds >= 0, got {a.gil_probe_after}")
    for flag, value in (("--side-priority", a.side_priority), ("--decode-priority", a.decode_priority)):
        if value is not None and not -3 <= value <= 0:
            p.error(f"{flag} must be one of PyTorch's stream priorities 0, -1, -2, -3, got {value}")
    sys.path.insert(0, str(ROOT))
    import gpu_decode
    import prefetcher

    side = prefetcher.SIDE_STREAM_PRIORITY if a.side_priority is None else a.side_priority
    decode = gpu_decode.DECODE_STREAM_PRIORITY if a.decode_priority is None else a.decode_priority
    if side == decode:
        p.error(
            f"the side stream and nvJPEG's stream would both draw from priority {side}'s pool (--side-priority "
            f"{side}, --decode-priority {decode}): give them different priorities"
        )
    return a


def main(argv: list[str] | None = None) -> None:
    a = parse(sys.argv[1:] if argv is None else argv)
    if a.switch_ms is not None:
        sys.setswitchinterval(a.switch_ms / 1000)
    global NVTX_RANGES
    NVTX_RANGES = a.nvtx
    instrument(a.sync_release, a.side_priority, a.decode_priority)
    probe = baseline = None
    if a.gil_probe:
        baseline = GilProbe.measure(0.5)
        probe = GilProbe(after=a.gil_probe_after or 0.0).start()
    start = time.perf_counter()

    def report() -> None:
        lines = table(STATS, time.perf_counter() - start, SPANS)
        if probe is not None:
            lines += ["", *gil_summary(probe.late, baseline or [], probe.interval, probe.after)]
        print("\n".join(lines), flush=True)

    atexit.register(report)
    sys.argv = a.command
    sys.path.insert(0, os.path.dirname(os.path.abspath(a.command[0])))  # as `python SCRIPT` has it
    try:
        runpy.run_path(a.command[0], run_name="__main__")
    finally:
        # The probe covers the script, not the interpreter's shutdown and the exit handlers that run before report().
        if probe is not None:
            probe.stop()


if __name__ == "__main__":
    main()
