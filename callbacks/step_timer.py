"""Phase timing inside a profiling window: host clock and CUDA events, the prefetcher's copies, one report per window.

:class:`ProfilerWindow` drives a :class:`StepTimer` at the same points where it opens and closes its NVTX ranges,
and only while a window is open: outside the window nothing is recorded and nothing synchronizes. Inside it each
boundary costs a ``perf_counter`` call and, on CUDA, one event recorded on the compute stream (no sync); the
prefetcher records three events per batch on its side stream. At the window's end the timer synchronizes once, turns
the events into per-step phase times on both clocks, gathers every rank's summary to rank 0 (one collective, reached
by every rank at the same step) and rank 0 writes the report (``step_report.py``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from pytorch_lightning.utilities import rank_zero_info, rank_zero_warn

import cuda_env
import step_report
import trace_summary
from callbacks.ranges import EPOCH_END, EPOCH_START
from prefetcher import CopyEvents, DevicePrefetcher, SyntheticBatches

BEGIN, END = True, False


def find_prefetchers(loaders: Any) -> list[DevicePrefetcher]:
    """The :class:`DevicePrefetcher` objects among ``trainer.train_dataloader`` (one loader, a list or a dict)."""
    if isinstance(loaders, DevicePrefetcher):
        return [loaders]
    if isinstance(loaders, dict):
        loaders = list(loaders.values())
    if isinstance(loaders, (list, tuple)):
        return [p for item in loaders for p in find_prefetchers(item)]
    return []


def batch_size(batch: Any) -> int | None:
    """Images in a batch: the length of its first tensor."""
    while isinstance(batch, (list, tuple)) and batch:
        batch = batch[0]
    if isinstance(batch, dict) and batch:
        return batch_size(next(iter(batch.values())))
    return int(batch.shape[0]) if isinstance(batch, torch.Tensor) and batch.dim() > 0 else None


class StepTimer:
    """Records phase boundaries of the steps of one window and turns them into a rank summary.

    Marks are ``(step, name, begin?, host seconds, CUDA event or None)``; ``name`` is ``step`` or a phase of
    :data:`trace_summary.RANGE_PHASES`. A phase may open and close several times in a step (gradient accumulation).
    """

    def __init__(self) -> None:
        self.clock = time.perf_counter  # host clock in seconds (a test may substitute its own)
        self.active = False
        self.window: tuple[int, int] | None = None
        self._cuda = False
        self._device: torch.device | None = None
        self._marks: list[tuple[int, str, bool, float, Any]] = []
        self._open: set[str] = set()
        self._images: dict[int, int | None] = {}
        self._copies: list[CopyEvents] = []
        self._prefetchers: list[DevicePrefetcher] = []
        self._input = "other"
        self._compile: str | None = None
        self._compile_tuning = False
        self._cpu_decoder: str | None = None
        self._decode_threads: int | None = None
        self._setup: dict[str, Any] = {}
        self._between: dict[int, list[str]] = {}  # step -> the work between it and the next step (epoch end, ...)
        self._epoch_starts: set[int] = set()  # steps whose first fetch was an epoch's first (the loader refilling)

    # --- recording (inside the window only) ------------------------------------------------------------
    def start(self, trainer: pl.Trainer, window: tuple[int, int]) -> None:
        """Starts recording for ``window`` (``[first step, end)``) and switches the prefetchers' copy timing on."""
        self.abort()
        self.active, self.window = True, window
        self._device = trainer.strategy.root_device
        self._cuda = self._device.type == "cuda"
        loaders = trainer.train_dataloader
        # What feeds the steps: copies are measured for the prefetcher; synthetic batches live on the device already.
        self._input = "on-device" if isinstance(loaders, SyntheticBatches) else "other"
        self._decode_threads = None
        # The model's torch.compile mode: the advice for launch overhead depends on whether CUDA graphs are on already.
        hparams = getattr(getattr(trainer, "lightning_module", None), "hparams", None) or {}
        mode = hparams.get("compile")
        self._compile = mode if isinstance(mode, str) else None
        # Recorded beside the mode: a tuned and an untuned run of one mode differ by about 5% in speed.
        self._compile_tuning = self._compile is not None and hparams.get("compile_tuning") is True
        # The workers' decoder (data.cpu_decoder): the advice for a CPU input stall names the faster one if unused.
        data_hparams = getattr(getattr(trainer, "datamodule", None), "hparams", None) or {}
        decoder = data_hparams.get("cpu_decoder")
        self._cpu_decoder = decoder if isinstance(decoder, str) and self._input != "on-device" else None
        self._setup = run_setup(trainer, hparams, data_hparams)
        prefetchers = find_prefetchers(loaders)
        if prefetchers:
            # The verdict's advice differs: an input stall with the GPU decoding is GPU time, not CPU cores; and it
            # depends on how many threads decode (data.decode_threads).
            decoding = [p.producers for p in prefetchers if p.decoder is not None]
            self._input = "gpu-decode" if decoding else "prefetcher"
            self._decode_threads = max(decoding) if decoding else None
        if self._cuda:
            self._prefetchers = prefetchers
            for prefetcher in prefetchers:
                prefetcher.timing = self._copies

    def mark(self, step: int, name: str, begin: bool) -> None:
        """A phase boundary now: host time and, on CUDA, an event on the current (compute) stream."""
        if begin:
            self._open.add(name)
        elif name in self._open:
            self._open.discard(name)
        else:
            return  # closing what is not open (the hook order repeats a pop): nothing to record
        event = None
        if self._cuda:
            event = self.new_event()
            event.record()
        self._marks.append((step, name, begin, self.clock(), event))

    def new_event(self) -> Any:
        """A timing CUDA event (a test may substitute its own)."""
        return torch.cuda.Event(enable_timing=True)

    def synchronize(self) -> None:
        """Waits for all work on the device: the window's one sync (a test may substitute its own)."""
        torch.cuda.synchronize(self._device)

    def between(self, after_step: int, name: str) -> None:
        """Work that is no step ran after ``after_step`` (``validation``, ``epoch end``, ``checkpoint``): the gap up
        to the next step is left out of the window's wall time and GPU busy fraction, and listed apart."""
        self._between.setdefault(after_step, []).append(name)

    def epoch_start(self, step: int) -> None:
        """``step``'s first fetch is an epoch's first (or this process's first): the loader refills from empty. When
        ``step`` opens the window, that fetch is moved out of it as the window's epoch-start gap (after an epoch's end
        inside the window it joins that gap)."""
        self._epoch_starts.add(step)

    def begin(self, step: int, name: str) -> None:
        self.mark(step, name, BEGIN)

    def end(self, step: int, name: str) -> None:
        self.mark(step, name, END)

    def end_phases(self, step: int) -> None:
        """Closes every open phase (not the step): the end of a micro-batch or of the step."""
        for name in [n for n in trace_summary.RANGE_PHASES if n in self._open]:
            self.mark(step, name, END)

    def add_images(self, step: int, batch: Any) -> None:
        count = batch_size(batch)
        previous = self._images.get(step, 0)
        self._images[step] = None if count is None or previous is None else previous + count

    def abort(self) -> None:
        """Stops recording and drops what was recorded (an exception, or a fresh window)."""
        for prefetcher in self._prefetchers:
            prefetcher.timing = None
        self._prefetchers = []
        self.active = False
        self._marks, self._copies, self._images, self._open = [], [], {}, set()
        self._between = {}
        self._epoch_starts = set()

    # --- the window's end -------------------------------------------------------------------------------
    def finish(self, trainer: pl.Trainer) -> dict:
        """Stops recording, synchronizes once and returns this rank's summary (see ``step_report.build_report``)."""
        for prefetcher in self._prefetchers:
            prefetcher.timing = None  # before the sync: a copy issued after it would still be in flight
        marks, copies, images, between = self._marks, list(self._copies), self._images, self._between
        epoch_starts = self._epoch_starts
        window = self.window
        cuda = self._cuda
        offset = 0.0
        if cuda:
            self.synchronize()
            # The GPU clock onto the host's: with the device idle an event completes as soon as it is recorded.
            anchor = self.new_event()
            host_anchor = self.clock()
            anchor.record()
            anchor.synchronize()
        self.abort()
        host = [m[3] * 1000 for m in marks]
        gpu: list[float] | None = None
        if cuda and marks:
            reference = marks[0][4]
            gpu = [reference.elapsed_time(m[4]) for m in marks]
            offset = host_anchor * 1000 - reference.elapsed_time(anchor)  # host ms of the reference event
        steps = _steps(marks, host, gpu, images, offset)
        # Gaps after a step that validation, the epoch's end or a save followed: not the training loop's steady state
        # (a checkpoint save alone can take seconds), so not counted as wall time or as the GPU idling.
        gaps = [(a, b) for a, b in zip(steps, steps[1:], strict=False) if a["row"]["step"] in between]
        # After an epoch's end the next step's fetch waits for the loader to refill from empty (the workers restart
        # on the new epoch's order): a cost of the epoch boundary, hundreds of ms, that would otherwise turn the
        # window's verdict into "input-bound". It joins the gap; the step keeps the rest of its phases.
        first_fetch = {
            a["row"]["step"]: _fold_first_fetch(b) for a, b in gaps if EPOCH_END in between[a["row"]["step"]]
        }
        first_fetch = {step: ms for step, ms in first_fetch.items() if ms > 0}  # none: a loader Lightning cannot see
        left_out = sum(b["host"][0] - a["host"][1] for a, b in gaps)
        # A window that opens at an epoch's first step: the same refill, before the window's steady state; moved out
        # of the first step (its span then starts where the fetch ended) and listed as the window's first gap.
        epoch_start: list[dict] = []
        gap_hosts = [(a["host"][1], b["host"][0]) for a, b in gaps]
        if steps and steps[0]["row"]["step"] in epoch_starts:
            opened = steps[0]["host"][0]
            moved = _fold_first_fetch(steps[0])
            if moved > 0:
                step = steps[0]["row"]["step"]
                epoch_start.append(
                    {"after_step": step - 1, "what": EPOCH_START, "host_ms": moved, "first_fetch_ms": moved}
                )
                gap_hosts.insert(0, (opened, steps[0]["host"][0]))
        summary: dict[str, Any] = {
            "rank": trainer.global_rank,
            "device": str(self._device),
            "source": "events" if cuda else "host",
            "window": [window[0], window[1] - 1] if window else None,
            "steps": [s["row"] for s in steps],
            "wall_ms": round(steps[-1]["host"][1] - steps[0]["host"][0] - left_out, 4) if steps else 0.0,
            "gpu_wall_ms": None,
            "between_steps": epoch_start
            + [
                {
                    "after_step": a["row"]["step"],
                    "what": " + ".join(between[a["row"]["step"]]),
                    "host_ms": round(b["host"][0] - a["host"][1], 4),
                    **({"first_fetch_ms": first_fetch[a["row"]["step"]]} if a["row"]["step"] in first_fetch else {}),
                }
                for a, b in gaps
            ],
            "gpu_busy": None,
            "gpu_busy_source": None,
            "copies": None,
            "input": self._input,
            # The hardware queues this process asked CUDA for: with fewer than 32, nvJPEG's calls wait behind the step.
            "device_connections": cuda_env.connections() if self._cuda else None,
            "cpu_decoder": self._cpu_decoder,
            "decode_threads": self._decode_threads,
            "compile": self._compile,
            "compile_tuning": self._compile_tuning,
            "setup": self._setup,
        }
        if steps:
            summary["window"] = [steps[0]["row"]["step"], steps[-1]["row"]["step"]]
        if gpu is not None and steps:
            skipped = sum(max(0.0, b["gpu"][0] - a["gpu"][1]) for a, b in gaps)
            span = steps[-1]["gpu"][1] - steps[0]["gpu"][0] - skipped
            stalled = sum(s["row"]["gpu"]["data"] for s in steps)
            stalled += sum(max(0.0, b["gpu"][0] - a["gpu"][1]) for a, b in zip(steps, steps[1:], strict=False))
            stalled -= skipped
            summary["gpu_busy"] = round(max(0.0, 1 - stalled / span), 4) if span > 0 else None
            # The window's length as the GPU ran it: the host's own is short of it when the host ran ahead (after
            # cudaProfilerStart under nsys drained the queue, the host of a GPU-bound run enqueues the window's steps
            # faster than the GPU runs them).
            summary["gpu_wall_ms"] = round(span, 4) if span > 0 else None
            summary["gpu_busy_source"] = "events" if span > 0 else None
            # Until the GPU reaches the window's first event it still runs the steps before the window: compute too.
            backlog = (host[0] - offset, 0.0)
            summary["copies"] = _copies(copies, marks[0][4], steps, backlog, gap_hosts, _input_wait(steps, offset))
        return summary

    def report(
        self, trainer: pl.Trainer, summary: dict, folder: Path, trace: Path | None = None
    ) -> tuple[dict, list[Path]] | None:
        """Adds kernel-level figures from this rank's Kineto trace, gathers every rank's summary on rank 0 and
        writes the report there; returns it and its files on rank 0 (``None`` elsewhere). Every rank must call it."""
        if trace is not None and trace.is_file():
            try:
                exact = trace_summary.summarize_trace(trace_summary.load_trace(trace), rank=summary["rank"])
            except (ValueError, KeyError, OSError) as error:
                rank_zero_info(f"profile: step report: the Kineto trace {trace} is not usable ({error})")
            else:
                summary["source"] += "+kineto"
                # Kernel-exact, also with a gap in the window (validation, an epoch's end, a save): the trace finds
                # the same gaps and leaves them out; on an H200 its gap matched the events' to 0.1 ms and its median
                # GPU step theirs to 0.01 ms (bench/RESULTS.md, ninth session).
                if exact["gpu_busy"] is not None:
                    summary["gpu_busy"], summary["gpu_busy_source"] = exact["gpu_busy"], "kineto"
                if exact["copies"] is not None:
                    summary["copies"] = exact["copies"]
        summaries = [summary]
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            gathered: list[Any] | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
            dist.gather_object(summary, gathered, dst=0)
            summaries = gathered or []
        if trainer.global_rank != 0:
            return None
        try:
            result = step_report.build_report(summaries)
            files = step_report.write_report(result, folder)
        except Exception as error:  # a diagnostic must not end the training (nor leave the other ranks waiting)
            rank_zero_warn(f"profile: the step report of this window could not be written: {error!r}")
            return None
        rank_zero_info("profile: " + "\n".join(step_report.summary_lines(result)))
        rank_zero_info(f"profile: step report written to {folder} ({', '.join(p.name for p in files)})")
        return result, files


def trainer_setup(trainer: pl.Trainer) -> dict[str, Any]:
    """:func:`run_setup` of the trainer's module and data module (no options of a module without ``hparams``)."""
    hparams = getattr(getattr(trainer, "lightning_module", None), "hparams", None) or {}
    data_hparams = getattr(getattr(trainer, "datamodule", None), "hparams", None) or {}
    return run_setup(trainer, hparams, data_hparams)


def run_setup(trainer: pl.Trainer, hparams: Any, data_hparams: Any) -> dict[str, Any]:
    """What the window ran, recorded in the summary so that ``step_report.py --compare`` can say how two reports'
    runs differ (a speed-up from bf16 is not one from a new kernel): every model and data option under its
    command-line name (``model.arch``, ``data.crop_size``), the trainer's precision and accumulation, the world size,
    the strategy, ``cudnn.benchmark``, the device and torch."""
    device = trainer.strategy.root_device
    # Options only: jsonargparse's own entries (``_instantiator``) are no setting of the run.
    setup = {f"model.{key}": _plain(value) for key, value in dict(hparams).items() if not str(key).startswith("_")}
    setup.update(
        {f"data.{key}": _plain(value) for key, value in dict(data_hparams).items() if not str(key).startswith("_")}
    )
    setup.update(
        {
            "trainer.precision": _plain(getattr(trainer, "precision", None)),
            "trainer.accumulate_grad_batches": _plain(getattr(trainer, "accumulate_grad_batches", None)),
            "world_size": _plain(getattr(trainer, "world_size", None)),
            "strategy": type(trainer.strategy).__name__,
            "cudnn.benchmark": torch.backends.cudnn.benchmark,
            # The GPU's model name (an H100 against an H200 is a difference to be told of); a test's stand-in CUDA
            # device on a machine without one keeps its type.
            "device_name": torch.cuda.get_device_name(device)
            if device.type == "cuda" and torch.cuda.is_available()
            else device.type,
            "torch": torch.__version__,
        }
    )
    return setup


def _plain(value: Any) -> Any:
    """``value`` as JSON writes it back unchanged: scalars as they are, sequences and mappings element by element,
    anything else (a ``Path``, an enum) as its string."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    return str(value)


def _steps(marks: list, host: list[float], gpu: list[float] | None, images: dict, offset: float) -> list[dict]:
    """Per step: the step's interval and its phase times on each clock, from the marks."""
    by_step: dict[int, list[int]] = {}
    for i, mark in enumerate(marks):
        by_step.setdefault(mark[0], []).append(i)
    out = []
    for step, indices in sorted(by_step.items()):
        row: dict[str, Any] = {"step": step, "images": images.get(step), "h2d": None, "lag": None}
        entry: dict[str, Any] = {"row": row}
        for clock, times in (("host", host), ("gpu", gpu)):
            if times is None:
                row[clock] = None
                continue
            intervals = _intervals([marks[i] for i in indices], [times[i] for i in indices])
            if intervals is None:
                break  # the step never ended (cannot happen at a window's end): leave it out
            entry[clock] = intervals[0]
            row[clock] = {k: round(v, 4) for k, v in trace_summary.phase_times(*intervals).items()}
            entry[f"{clock}_phases"] = intervals[1]
        else:
            if gpu is not None:
                end = indices[-1]  # the step's end mark: when the GPU got there vs when the host recorded it
                row["lag"] = round(max(0.0, offset + gpu[end] - host[end]), 4)
            out.append(entry)
    return out


def _fold_first_fetch(entry: dict) -> float:
    """Moves the step's first ``data`` interval (the first fetch of an epoch) out of the step: the step then starts
    where that fetch ended, on both clocks, and its phases are recomputed. Returns the host time moved (ms)."""
    moved = 0.0
    for clock in ("host", "gpu"):
        phases = entry.get(f"{clock}_phases")
        if phases is None or not phases.get("data"):
            continue
        (_, fetched), *rest = phases["data"]
        start, end = entry[clock]
        if clock == "host":
            moved = fetched - start
        entry[clock] = (fetched, end)
        phases["data"] = rest
        entry["row"][clock] = {k: round(v, 4) for k, v in trace_summary.phase_times(entry[clock], phases).items()}
    return round(moved, 4)


def _intervals(marks: list, times: list[float]) -> tuple[tuple[float, float], dict[str, list]] | None:
    step: list[float] = []
    phases: dict[str, list[tuple[float, float]]] = {}
    opened: dict[str, float] = {}
    for (_, name, begin, _, _), t in zip(marks, times, strict=True):
        if name == "step":
            step.append(t)
        elif begin:
            opened[name] = t
        elif name in opened:
            phases.setdefault(name, []).append((opened.pop(name), t))
    if len(step) != 2:
        return None
    return (step[0], step[1]), phases


def _copies(
    copies: list[CopyEvents],
    reference: Any,
    steps: list[dict],
    backlog: tuple[float, float],
    gaps: Sequence[tuple[float, float]] = (),
    waited_ms: float | None = None,
) -> dict | None:
    """Copy statistics of the window: H2D time on the side stream and its part inside the compute spans.

    Compute spans are each step's forward start..step end on the compute stream, and ``backlog``: the work queued
    before the window, from the host's first mark (on the GPU clock) until the GPU reached it. Copies issued inside
    ``gaps`` (host ms between steps: validation, an epoch's end with the next epoch's first fetch, whose first two
    batches are copied while the GPU has no step to overlap) are left out, as the gaps are of images/s. ``waited_ms``
    (:func:`_input_wait`) tells how much of the copy time that overlaps no compute held compute up.
    """
    if not copies:
        return None
    compute = [backlog]
    for s in steps:
        forward = s["gpu_phases"].get("forward")
        # Under gradient accumulation the later micro-batches' fetches lie inside the span: where the compute stream
        # waited there for its input, no compute ran for a copy to hide behind.
        compute += _minus((forward[0][0] if forward else s["gpu"][0], s["gpu"][1]), s["gpu_phases"].get("data", []))
    starts = [s["host"][0] for s in steps]
    total = inside = 0.0
    done = []
    for c in copies:
        if not (c.start.query() and c.copied.query() and c.done.query()):
            continue  # issued after the window's sync by the decode thread: not part of this window
        if any(begin <= c.issued * 1000 < end for begin, end in gaps):
            continue
        interval = (reference.elapsed_time(c.start), reference.elapsed_time(c.copied))
        t, o = trace_summary.overlap([interval], compute)
        total, inside = total + t, inside + o
        done.append(c)
        # The step whose host time the copy was issued in (side-stream time: not part of the step's sum). With several
        # producers (data.decode_threads) two lanes' copies may run at once: the sum is stream time, not wall time.
        index = max((i for i, a in enumerate(starts) if a <= c.issued * 1000), default=None)
        if index is not None:
            row = steps[index]["row"]
            row["h2d"] = round((row["h2d"] or 0.0) + interval[1] - interval[0], 4)
    pinned = sum(c.pinned is True for c in done)
    pageable = sum(c.pinned is False for c in done)
    return trace_summary.copy_stats(total, inside, pinned, pageable, len(done), "events", waited_ms)


def _minus(span: tuple[float, float], holes: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """``span`` less the ``holes`` in it: the pieces left, in order."""
    pieces, begin = [], span[0]
    for a, b in sorted(holes):
        if b <= begin or a >= span[1]:
            continue
        if a > begin:
            pieces.append((begin, a))
        begin = max(begin, b)
    if begin < span[1]:
        pieces.append((begin, span[1]))
    return pieces


def _input_wait(steps: list[dict], offset: float) -> float:
    """How long the compute stream waited for its input (ms): in each fetch, the GPU's time from reaching the fetch
    (the work before it done) to passing it, beyond the host's own. The fetch's end mark cannot pass on the GPU before
    the host records it; what the GPU takes longer is the wait on the prefetcher's event: the batch's copy (or decode)
    was not done. An idle GPU waiting for the host (a window's first step, after the profiler's start drained it) is
    the host's time, not this. ``offset`` is the host ms of the GPU clock's zero."""
    waited = 0.0
    for s in steps:
        host, gpu = s["host_phases"].get("data", []), s["gpu_phases"].get("data", [])
        for (_, host_end), (gpu_begin, gpu_end) in zip(host, gpu, strict=False):
            waited += max(0.0, gpu_end - max(gpu_begin, host_end - offset))
    return waited
