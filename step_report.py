"""The step-time report: where each step's time went, per phase and per rank, and whether the input copies overlap.

Written at the end of each profiling window (``--profile.report``, on by default with ``--profile.start_step``) into
``<run folder>/step_report/window_<A>-<B>.{json,md,png}``, and on demand from Kineto traces or earlier reports::

    python step_report.py runs/resnet50/version_0              # every trace and report under the run folder
    python step_report.py runs/.../traces/rank*_steps20-29.pt.trace.json --batch-size 224
    python step_report.py --compare runs/before/version_0 runs/after/version_0   # two reports side by side

Phases of an optimizer step, in the order they run on the main thread: ``data`` (waiting for the loader, issuing the
copy of a later batch), ``forward``, ``backward``, ``optimizer`` and ``other`` (the rest of the step: zero_grad,
hooks). ``h2d`` is the host-to-device copy on the prefetcher's side stream (not the normalization after it): it runs
beside the step, so it is not part of the step's sum. Times come from two clocks:

* host: ``time.perf_counter`` at the phase boundaries (the NVTX ranges' boundaries);
* gpu: CUDA events at the same boundaries on the compute stream (from a Kineto trace: kernel time of each phase).
  GPU ``data`` is the compute stream waiting for the host's fetch or for its input (the latter alone is ``copies``'
  ``waited_ms``); ``other`` includes idle gaps.

Pure analysis over plain data (no torch): per-rank summaries in, a report dict out, and its files. The interval
arithmetic and the reading of Kineto traces are in ``trace_summary.py``; the Markdown and the PNG in
``report_render.py``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import cuda_env
import report_compare
from atomic_files import atomic_write
from config_yaml import read_mapping, section_options
from report_render import between_text, markdown, ranks_text, render_png
from trace_summary import (
    INPUT_COPY_MIN_BYTES,
    PHASES,
    TRACE_NAME_RE,
    copy_stats,
    kineto_setup,
    load_trace,
    recorded_setup,
    summarize_trace,
)

#: Thresholds of the verdict.
DATA_WAIT_PCT = 5.0  # data wait above this share of the step: input-bound
ZERO_DATA_PCT = 1.0  # below this the data wait counts as zero
OVERLAP_OK = 0.9  # fraction of H2D copy time that must not hold up compute for the prefetch to count as hidden
BUSY_OK = 0.9  # GPU busy fraction below which the run is host-bound (when the data wait is not the cause)
LAG_HOST_BOUND = 0.1  # GPU trailing the host by less than this share of a step: the GPU waits for launches
#: Phases without DDP collectives: forward starts with the buffer broadcast, backward holds the gradient all-reduce,
#: and there a fast rank waits for a slow one; what a rank spends in the others is its own.
UNSYNCED = ("data", "optimizer", "other")
STRAGGLER_PCT = 5.0  # a rank spending this share of a step more in UNSYNCED phases than the other ranks: straggler
#: Lightning's short precision names (and its default, none) as it resolves them (``trainer.precision``).
PRECISION_ALIASES = {"None": "32-true", "16": "16-mixed", "bf16": "bf16-mixed", "32": "32-true", "64": "64-true"}
#: model.compile modes that capture the step in CUDA graphs (one launch a graph): the launch-overhead remedy is on.
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")
#: model.compile modes whose options include inductor's coordinate-descent tuning (what model.compile_tuning adds).
TUNED_MODES = ("max-autotune", "max-autotune-no-cudagraphs")


# --- rank summaries -> report ----------------------------------------------------------------------------------
def rank_stats(summary: dict) -> dict:
    """Aggregates of one rank: medians and means per phase and clock, split in %, images/s, data wait %."""
    steps = summary["steps"]
    # No steps: a window whose only step never ended (training stopped inside it); every figure is then None.
    clocks = (["host"] + (["gpu"] if all(s.get("gpu") for s in steps) else [])) if steps else []
    out: dict[str, Any] = {"clocks": clocks}
    for clock in clocks:
        mean = {p: statistics.fmean(s[clock][p] for s in steps) for p in (*PHASES, "total")}
        out[clock] = {
            "median_ms": {p: round(statistics.median(s[clock][p] for s in steps), 4) for p in (*PHASES, "total")},
            "mean_ms": {p: round(v, 4) for p, v in mean.items()},
            "pct": {p: round(100 * mean[p] / mean["total"], 2) if mean["total"] > 0 else 0.0 for p in PHASES},
        }
    images = [s.get("images") for s in steps]
    out["images"] = sum(images) if steps and None not in images else None
    # Images/s and the median step on the GPU's clock when it timed every step. The host's clock is short of the
    # GPU's when the host ran ahead: opening a window under nsys drains the GPU's queue, and the host of a GPU-bound
    # run then enqueues the window's steps faster than the GPU runs them (on an H200 a compiled ResNet-50 enqueued
    # 10 ms steps that took the GPU 37.6 ms). Otherwise the two agree.
    clock = "gpu" if "gpu" in clocks and summary.get("gpu_wall_ms") else "host"
    out["clock"] = clock if steps else None
    host_wall = summary.get("wall_ms") or 0.0
    wall = summary["gpu_wall_ms"] if clock == "gpu" else host_wall

    def rate(ms: float) -> float | None:
        return _figure(out["images"] / (ms / 1000)) if out["images"] and ms > 0 else None

    out["images_per_s"], out["host_images_per_s"] = rate(wall), rate(host_wall)
    out["step_ms"] = out[clock]["median_ms"]["total"] if steps else None
    out["host_step_ms"] = out["host"]["median_ms"]["total"] if steps else None
    # The data wait that held the GPU up: per step, the host waited for its batch and the GPU idled meanwhile (the
    # smaller of the two clocks' data times). A host that runs ahead also waits for batches, with the GPU still busy
    # on the steps it queued before (on an H200 a loader took 43% of such a host's step while the GPU was busy 100%:
    # not an input-bound run). Events time every fetch; a Kineto trace's GPU data time is the compute stream's idle
    # time before each fetch's first kernel (trace_summary), the same measure from kernels.
    data_clock = "gpu" if "gpu" in clocks else "host"
    out["data_clock"] = data_clock if steps else None
    out["data_pct"] = out["host"]["pct"]["data"] if steps else None
    out["host_data_ms"] = out["host"]["mean_ms"]["data"] if steps else None
    out["host_data_pct"] = None  # the host's own wait, as a share of the GPU's mean step (events only)
    if steps and data_clock == "gpu":
        waited = statistics.fmean(min(s["host"]["data"], s["gpu"]["data"]) for s in steps)
        total = out["gpu"]["mean_ms"]["total"]
        out["data_pct"] = round(100 * waited / total, 2) if total > 0 else 0.0
        out["host_data_pct"] = round(100 * out["host_data_ms"] / total, 2) if total > 0 else 0.0
    out["unsynced_ms"] = (
        round(statistics.median(sum(s[clocks[-1]][p] for p in UNSYNCED) for s in steps), 4) if steps else None
    )
    h2d = [s["h2d"] for s in steps if s.get("h2d") is not None]
    out["h2d_ms"] = round(statistics.median(h2d), 4) if h2d else None
    lags = [s["lag"] for s in steps if s.get("lag") is not None]
    out["lag_ms"] = round(statistics.median(lags), 4) if lags else None
    return out


def _figure(x: float) -> float:
    """A rate to two decimals, or to four significant digits when that is finer (a CPU run's 2.43 img/s)."""
    return round(x, max(2, 3 - math.floor(math.log10(abs(x))))) if x else 0.0


def stragglers(ranks: Sequence[dict], pct: float = STRAGGLER_PCT) -> list[dict]:
    """Ranks that spend more than ``pct``% of a step longer in the unsynchronized phases than the other ranks.

    Under DDP every rank's step ends together: a fast rank waits for a slow one inside the collectives (the buffer
    broadcast at the start of forward, the gradient all-reduce in backward), so step times are equal and a slow rank
    shows instead as more time in :data:`UNSYNCED` phases (data, optimizer, other) than the median of the other ranks.
    A rank whose forward/backward compute itself is slow is not seen this way (the Kineto trace shows it per kernel).
    """
    ranks = [r for r in ranks if r["stats"]["unsynced_ms"] is not None]  # ranks without steps have nothing to say
    if len(ranks) < 2:
        return []
    clock = "gpu" if all("gpu" in r["stats"]["clocks"] for r in ranks) else "host"
    step = statistics.median(r["stats"][clock]["median_ms"]["total"] for r in ranks)

    def unsynced(r: dict) -> float:
        """The rank's median time in UNSYNCED phases on the clock every rank has (one rank's host data time against
        another's GPU data time made a straggler of an identical rank)."""
        return statistics.median(sum(s[clock][p] for p in UNSYNCED) for s in r["steps"])

    out = []
    for r in ranks:
        others = [o for o in ranks if o is not r]
        excess = unsynced(r) - statistics.median(unsynced(o) for o in others)
        if step > 0 and excess > step * pct / 100:
            medians = r["stats"][clock]["median_ms"]
            by_phase = {
                p: medians[p] - statistics.median(o["stats"][clock]["median_ms"][p] for o in others) for p in UNSYNCED
            }
            phase = max(by_phase, key=by_phase.__getitem__)
            out.append(
                {
                    "rank": r["rank"],
                    "excess_ms": round(excess, 3),
                    "excess_pct": round(100 * excess / step, 1),  # of the median step
                    "phase": phase,
                    "phase_excess_ms": round(by_phase[phase], 3),
                    "clock": clock,
                }
            )
    return out


def build_report(summaries: Sequence[dict]) -> dict:
    """The report of one window over every rank's summary.

    A rank summary is ``{"rank", "device", "source", "window": [first, last], "steps": [{"step", "images",
    "host": {phase: ms, "total": ms}, "gpu": {...} | None, "h2d": ms | None, "lag": ms | None}], "wall_ms",
    "gpu_wall_ms" (None or absent: no GPU clock), "gpu_busy", "gpu_busy_source", "copies": {"count", "time_ms",
    "overlapped_ms", "overlap", "waited_ms", "hidden", "pinned", "pageable", "unknown"} | None}``
    (``trace_summary.copy_stats``).
    """
    ranks = sorted((dict(s) for s in summaries), key=lambda s: s["rank"])
    for r in ranks:
        r["stats"] = rank_stats(r)
    copies = [r["copies"] for r in ranks if r.get("copies")]
    copy_time = sum(c["time_ms"] for c in copies)
    waited = [c.get("waited_ms") for c in copies]
    overall_copies = (
        copy_stats(
            copy_time,
            sum(c["overlapped_ms"] for c in copies),
            sum(c["pinned"] for c in copies),
            sum(c["pageable"] for c in copies),
            sum(c["count"] for c in copies),
            "/".join(sorted({c["source"] for c in copies})),
            None if None in waited else sum(waited),
        )
        if copies
        else None
    )
    busy = [r["gpu_busy"] for r in ranks if r.get("gpu_busy") is not None]
    ips = [r["stats"]["images_per_s"] for r in ranks]
    steps_ms = [r["stats"]["step_ms"] for r in ranks if r["stats"]["step_ms"] is not None]
    host_ms = [r["stats"]["host_step_ms"] for r in ranks if r["stats"]["host_step_ms"] is not None]
    data_by_rank = [(r["stats"]["data_pct"], r["rank"]) for r in ranks if r["stats"]["data_pct"] is not None]
    data = [pct for pct, _ in data_by_rank]
    host_data = [
        (r["stats"]["host_data_pct"], r["stats"]["host_data_ms"], r["rank"])
        for r in ranks
        if r["stats"].get("host_data_pct") is not None
    ]
    # Ranks of the run that the report lacks: only some ranks traced (profile.ranks), read back from their traces.
    run_ranks = max((r.get("world_size") or 0 for r in ranks), default=0)
    overall = {
        "world_size": len(ranks),
        "run_world_size": run_ranks if run_ranks > len(ranks) else None,
        "images_per_s": _figure(sum(ips)) if ips and None not in ips else None,
        "step_ms": round(statistics.median(steps_ms), 4) if steps_ms else None,
        "host_step_ms": round(statistics.median(host_ms), 4) if host_ms else None,
        # The clock of images_per_s and step_ms: "gpu" when every rank's GPU timed its steps (see rank_stats).
        "clock": "/".join(sorted({r["stats"]["clock"] for r in ranks if r["stats"]["clock"]})) or None,
        "data_pct": round(statistics.fmean(data), 2) if data else None,
        "data_pct_max": max(data) if data else None,
        "data_pct_max_rank": max(data_by_rank)[1] if data else None,
        # The largest host-side data wait, in % of the GPU's step, of the ranks timed by events (see rank_stats).
        "host_data_pct_max": max(host_data)[0] if host_data else None,
        "host_data_ms_max": max(host_data)[1] if host_data else None,
        "host_data_pct_max_rank": max(host_data)[2] if host_data else None,
        "gpu_busy": round(statistics.fmean(busy), 4) if busy else None,
        "gpu_busy_source": "/".join(sorted({r["gpu_busy_source"] for r in ranks if r.get("gpu_busy_source")})) or None,
        "cuda": any(r.get("device", "").startswith("cuda") for r in ranks),
        "input": "/".join(sorted({r.get("input") or "unknown" for r in ranks})),
        "cpu_decoder": "/".join(sorted({r["cpu_decoder"] for r in ranks if r.get("cpu_decoder")})) or None,
        # The fewest threads decoding on any rank (data.decode_threads; None: not recorded or no GPU decode).
        "decode_threads": min((r["decode_threads"] for r in ranks if r.get("decode_threads")), default=None),
        # The fewest hardware queues of any rank (None: not recorded, as in reports from before the field).
        "device_connections": min(
            (r["device_connections"] for r in ranks if r.get("device_connections")), default=None
        ),
        "cuda_graphs": bool(ranks) and all(r.get("compile") in CUDA_GRAPH_MODES for r in ranks),
        "compiled": bool(ranks) and all(r.get("compile") for r in ranks),
        "compile_tuned": bool(ranks) and all(r.get("compile_tuning") or r.get("compile") in TUNED_MODES for r in ranks),
        "copies": overall_copies,
        "between_steps": between_steps(ranks),
    }
    for clock in ("host", "gpu"):
        if ranks and all(clock in r["stats"]["clocks"] for r in ranks):
            overall[f"{clock}_pct"] = {
                p: round(statistics.fmean(r["stats"][clock]["pct"][p] for r in ranks), 2) for p in PHASES
            }
    gpu_steps = [r["stats"]["gpu"]["median_ms"]["total"] for r in ranks if "gpu" in r["stats"]]
    lags = [r["stats"]["lag_ms"] for r in ranks if r["stats"]["lag_ms"] is not None]
    overall["lag_ms"] = round(statistics.median(lags), 4) if lags else None
    overall["gpu_step_ms"] = round(statistics.median(gpu_steps), 4) if gpu_steps else None
    slow = stragglers(ranks)
    findings, line = verdict(overall, slow)
    windows = [r["window"] for r in ranks]
    return {
        "window": [min(w[0] for w in windows), max(w[1] for w in windows)] if windows else None,
        "world_size": len(ranks),
        "verdict": line,
        "findings": findings,
        "overall": overall,
        "stragglers": slow,
        "ranks": ranks,
    }


def between_steps(ranks: Sequence[dict]) -> list[dict]:
    """The work between steps inside the window (validation, the epoch's end), each gap at its longest rank: left
    out of images/s and of the GPU busy fraction measured with events, so that those describe the steps. After an
    epoch's end the gap holds the next epoch's first fetch (``first_fetch_ms``: the loader refilling); a window that
    opens at an epoch's first step lists that fetch as ``epoch start`` before it."""
    longest: dict[tuple[int, str], dict] = {}
    for r in ranks:
        for gap in r.get("between_steps") or ():
            key = (gap["after_step"], gap["what"])
            if key not in longest or gap["host_ms"] > longest[key]["host_ms"]:
                longest[key] = dict(gap)
    return [longest[key] for key in sorted(longest)]


def verdict(overall: dict, slow: Sequence[dict] = ()) -> tuple[list[str], str]:
    """``(findings, verdict line)``: what limits the step, most important first, and one line that says it plainly."""
    findings = []
    data = overall.get("data_pct_max")
    # Judged as printed (one decimal): a 5.04% wait printed "5.0%" must not be above the 5% threshold.
    data = None if data is None else round(data, 1)
    copies = overall.get("copies")
    where = f" (rank {overall['data_pct_max_rank']})" if overall.get("world_size", 1) > 1 else ""
    if copies and copies["pageable"]:
        findings.append(
            f"copies are pageable ({copies['pageable']} of {copies['count']}): enable pin_memory in the DataLoader"
        )
    if data is not None and data > DATA_WAIT_PCT:
        if overall.get("input") == "gpu-decode":
            connections = overall.get("device_connections")
            # nvJPEG's batched call spreads over about 14 streams of its own; with CUDA's 8 hardware queues they wait
            # behind the training step's kernels, and the call spins on the producer thread meanwhile: compiled
            # ResNet-50 on the original JPEGs ran at 0.748 of synthetic data with 8 queues and 0.957 with 32
            # (bench/RESULTS.md, sixteenth session). With 32, the producer thread's host work is what is left: the
            # workers can take a share of the files off it while they have cores to spare. A second decoding thread
            # gave eager ResNet-18 1.02-1.26x with every JPEG on the GPU (four pairs), nothing with the split, and
            # compiled ResNet-50 nothing (seventeenth and eighteenth sessions): named after the options that gained
            # more.
            if connections is not None and connections < cuda_env.CONNECTIONS:
                advice = (
                    f"nvJPEG's calls wait behind the training step in CUDA's hardware queues "
                    f"({cuda_env.MAX_CONNECTIONS}={connections}): set {cuda_env.MAX_CONNECTIONS}="
                    f"{cuda_env.CONNECTIONS} before CUDA starts (train.py does unless the environment sets it)"
                )
            else:
                threads = overall.get("decode_threads") or 1
                who, more = "one thread decodes every batch", ", data.decode_threads 2"
                if threads > 1:
                    who, more = f"{threads} threads decode the batches", ""
                timed = "times it" if threads == 1 else "times them"
                advice = (
                    f"the GPU decode path's host work holds up the training process ({who}: bench/producer_timing.py "
                    f"{timed}): raise data.cpu_decode_share while CPU cores are free, data.nvjpeg preallocated{more}, "
                    "or data.decode cpu on a pre-resized copy (resize_dataset.py)"
                )
        else:
            # Fewer pixels per file: on an H200's 16 cores PIL kept compiled ResNet-50 fed from a copy at short side 256
            # (0.981 of synthetic) where the original 300-500 px files gave 0.517 (bench/RESULTS.md, tenth session).
            # On another such machine PIL fed 0.685 from the copy, the torchvision decoder 0.989 (fourteenth session).
            advice = "more data.workers, a pre-resized copy (resize_dataset.py)"
            # On a CPU run data.decode gpu falls back to the workers' decode: not advice there.
            advice += " or data.decode gpu" if overall.get("cuda") else ""
            if overall.get("cpu_decoder") == "pil":
                advice = f"data.cpu_decoder torchvision (1.2-1.3x PIL's rate), {advice}"
        findings.append(f"input-bound: data wait is {data:.1f}% of the step{where}; {advice}")
    overlapped = copies["overlap"] if copies else None
    # Hidden: overlapped, or run while the compute stream had nothing issued to run (then the host, not the copy, is
    # what the GPU waited for). A report without the wait (older JSON) judges the overlap alone.
    hidden = copies.get("hidden", overlapped) if copies else None
    hidden = None if hidden is None else round(hidden, 3)  # as printed: 0.8996 is "90.0%", not below 90%
    serialized = hidden is not None and hidden < OVERLAP_OK and not (data is not None and data > DATA_WAIT_PCT)
    if serialized:
        waited = copies.get("waited_ms")
        if overall.get("input") == "prefetcher":
            # The app's own prefetcher issues them so already: what can still serialize them is the step's doing.
            advice = (
                "the prefetcher issues them non_blocking from pinned memory on a side stream a batch ahead, so look "
                "for a host sync inside the step (a .item(), a tensor printed or compared on the host)"
            )
        else:
            advice = (
                "issue them non_blocking from pinned memory on a side stream a batch ahead, with no host sync in the "
                "step"
            )
        findings.append(
            f"copies serialize with compute: {100 * overlapped:.1f}% of H2D time overlaps compute kernels"
            + (f" and compute waited {waited:.2f} ms for its input" if waited is not None else "")
            + f"; {advice}"
        )
    input_ok = not findings
    busy, lag, step = overall.get("gpu_busy"), overall.get("lag_ms"), overall.get("gpu_step_ms")
    busy = None if busy is None else round(busy, 3)  # as printed: 0.8996 is "90.0%", not below 90%
    remedy = (
        "a larger batch, or less host work outside the compiled model (CUDA graphs are on already)"
        if overall.get("cuda_graphs")
        else "try model.compile reduce-overhead (CUDA graphs: one launch a graph) or a larger batch"
    )
    if overall.get("input") == "gpu-decode":
        # nsys on an H200: the decode thread's calls held the training thread's launches up (bench/RESULTS.md,
        # fourth and fifth sessions); the workers take files off it.
        remedy = (
            "most likely the GPU decode's host work: raise data.cpu_decode_share while CPU cores are free, "
            f"or data.decode cpu on a resize_dataset.py copy; else {remedy}"
        )
    exact_busy = busy is not None and overall.get("gpu_busy_source") == "kineto"
    if not input_ok and not serialized and overall.get("cuda") and exact_busy and busy + (data or 0.0) / 100 < BUSY_OK:
        # An input stall or pageable copies that leave far more GPU idle time unexplained: fixing them alone would not
        # end it. (Not after serialized copies: those are idle time of their own.)
        findings.append(
            f"host-bound too: the GPU is busy {100 * busy:.1f}% of the window, and the data wait explains only "
            f"{data or 0.0:.1f}% of the step; launch overhead: {remedy}"
        )
    if input_ok and overall.get("cuda"):
        if exact_busy and busy < BUSY_OK:
            findings.append(
                f"host-bound: the GPU is busy {100 * busy:.1f}% of the window with no input stall; launch overhead: "
                f"{remedy}"
            )
        elif lag is not None and step and lag < LAG_HOST_BOUND * step and overall.get("gpu_busy_source") != "kineto":
            findings.append(
                f"host-bound: the GPU finishes each step {lag:.2f} ms after the host issues it (of a {step:.1f} ms "
                f"step), so it waits for launches; {remedy}"
            )
    # GPU-bound: input and launches keep up, so the GPU's own work sets the pace; the busy fraction where it is exact
    # (Kineto), else the GPU still trailing the host at each step's end. Said only when nothing else is wrong.
    if overall.get("gpu_busy_source") == "kineto":
        gpu_bound = busy is not None and busy >= BUSY_OK
    else:
        gpu_bound = lag is not None and bool(step) and lag >= LAG_HOST_BOUND * step
    gpu_bound = gpu_bound and not findings and not slow and bool(overall.get("cuda"))
    for s in slow:
        findings.append(
            f"straggler: rank {s['rank']} spends {s['excess_ms']:.2f} ms ({s['excess_pct']}% of a step) longer "
            f"than the other ranks outside the synchronized phases ({s['phase']} +{s['phase_excess_ms']:.2f} ms); "
            "the others wait for it in forward/backward"
        )
    if input_ok:
        data_text = "" if data is None else f"data wait {'0' if data < 0.05 else f'{data:.1f}'}%"
        if data_text and overall.get("world_size", 1) > 1:
            data_text += f" (rank {overall['data_pct_max_rank']}'s, the most)"
        host_data = overall.get("host_data_pct_max")
        host_data = None if host_data is None else round(host_data, 1)
        if data is not None and host_data is not None and host_data > DATA_WAIT_PCT:
            # Not a stall of the GPU, but the loader is where a host that stops running ahead would wait first.
            rank = f" on rank {overall['host_data_pct_max_rank']}" if overall.get("world_size", 1) > 1 else ""
            data_text += (
                f" (the host waited {overall['host_data_ms_max']:.1f} ms a step{rank} for its batches, "
                f"{host_data:.1f}% of the step, while the GPU ran steps it had queued)"
            )
        if not overall.get("cuda"):
            head = f"CPU run: GPU times and copy overlap unavailable; {data_text}"
        elif copies is None and overall.get("input") == "other":
            head = (
                f"copies not measured (the loader is not a DevicePrefetcher: use profile.torch_profiler); {data_text}"
            )
        elif copies is None and overall.get("input") == "trace":
            # A trace alone does not say what the loader was: small copies (tiny JPEGs for the GPU decoder) are left
            # out as not the input's.
            head = f"no host-to-device copies of {INPUT_COPY_MIN_BYTES // 1024} KiB or more in the trace; {data_text}"
        elif copies is None:
            head = f"no host-to-device copies (data already on the device); {data_text}"
        elif overlapped is None:
            head = f"prefetch: copy overlap unknown; {data_text}"
        else:
            if copies["pinned"] == copies["count"]:
                kind = "pinned"
            elif overall.get("input") == "gpu-decode" or (
                copies["unknown"] == copies["count"] and copies.get("source") == "events"
            ):
                kind = "JPEGs decoded on the GPU"  # data.decode gpu: encoded bytes, no pixel copy to pin
            else:
                kind = f"pinned {copies['pinned']} of {copies['count']}"
            share = f"{100 * overlapped:.1f}% overlapped"
            if round(overlapped, 3) < OVERLAP_OK:  # hidden all the same: the rest ran while the GPU waited for the host
                share += f", compute waited {copies['waited_ms']:.2f} ms for input"
            head = f"prefetch hidden: {share}, {kind}, {data_text}"
            if data is not None and data >= ZERO_DATA_PCT:
                head = f"prefetch hidden ({share}, {kind}) but {data_text}"
        return findings, "; ".join([head.rstrip("; "), *findings, *([gpu_bound_note(overall)] if gpu_bound else [])])
    return findings, ("" if overall.get("cuda") else "CPU run: ") + "; ".join(findings)


def gpu_bound_note(overall: dict) -> str:
    """The verdict's note on a GPU-bound window: the lever left is the kernels, by how the model is compiled."""
    if overall.get("compile_tuned"):
        return "GPU-bound: the GPU's work sets the pace (the model is compiled and its kernels tuned)"
    if overall.get("compiled"):
        # ResNet-50 bf16 under reduce-overhead on an H200: 1.047 side by side (bench/RESULTS.md, twelfth session).
        return (
            "GPU-bound: the GPU's work sets the pace; for a long run, model.compile_tuning true (coordinate-descent "
            "tuning of the compiled kernels)"
        )
    return (
        "GPU-bound: the GPU's work sets the pace; faster kernels: model.compile reduce-overhead (and "
        "model.compile_tuning true for a long run)"
    )


# --- output ------------------------------------------------------------------------------------------------------
def summary_lines(report: dict) -> list[str]:
    """The few lines printed on rank 0 at the end of a window."""
    o = report["overall"]
    w = report["window"]
    head = f"step report, steps {w[0]}-{w[1]}, {ranks_text(report)}:"
    parts = [f"{o['images_per_s']:.1f} img/s" if o["images_per_s"] else "img/s n/a"]
    if o.get("run_world_size"):
        parts[0] += " (of those ranks)"
    if o["step_ms"] is not None:
        clock = o.get("clock") or "host"  # "GPU/host" only if ranks differed (some without CUDA events)
        on = "host clock"
        if clock != "host":
            on = f"{clock.replace('gpu', 'GPU')} clock; host {o['host_step_ms']:.2f} ms"
        parts.append(f"median step {o['step_ms']:.2f} ms ({on})")
    if o.get("gpu_busy") is not None:
        parts.append(f"GPU busy {100 * o['gpu_busy']:.1f}% ({o['gpu_busy_source']})")
    lines = [head, "  " + ", ".join(parts)]
    for clock in ("gpu", "host"):
        if f"{clock}_pct" in o:
            split = " ".join(f"{p} {o[f'{clock}_pct'][p]:.1f}%" for p in PHASES)
            lines.append(f"  phases ({clock}): {split}")
    lines.append(f"  verdict: {report['verdict']}")
    if o.get("between_steps"):
        lines.append(f"  between steps, left out of img/s and GPU busy: {between_text(o['between_steps'])}")
    if report["stragglers"]:
        lines.append(
            "  stragglers: " + ", ".join(f"rank {s['rank']} (+{s['excess_pct']}%)" for s in report["stragglers"])
        )
    return lines


def write_report(report: dict, folder: str | Path, stem: str | None = None) -> list[Path]:
    """Writes ``<folder>/<stem>.json``, ``.md`` and ``.png`` (default stem ``window_<A>-<B>``); returns the paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    stem = stem or f"window_{report['window'][0]}-{report['window'][1]}"
    paths = [folder / f"{stem}.{ext}" for ext in ("json", "md", "png")]
    for path, data in zip(paths, ((json.dumps(report, indent=1) + "\n").encode(), markdown(report).encode(),
                                  render_png(report)), strict=True):  # fmt: skip
        atomic_write(path, lambda file, data=data: file.write(data))  # a reader never sees half a file
    return paths


# --- command line ------------------------------------------------------------------------------------------------
def _run_config(traces: Path) -> dict:
    """The LightningCLI ``config.yaml`` of the run folder holding the folder ``traces`` (or of ``traces`` itself), as
    a mapping; empty if there is none or it does not read as one."""
    for folder in (traces.parent, traces):
        config = folder / "config.yaml"
        if config.is_file():
            return read_mapping(config)
    return {}


def _setup_from_config(config: dict) -> dict:
    """A report made from traces that record no settings of their own: the run's settings from its config, under the
    names the live report records (``callbacks/step_timer.py``'s ``run_setup``); what only the live run knows (the
    GPU, torch, the world size) is left out, and taken from what Kineto recorded where it did (``kineto_setup``)."""
    setup = {
        f"{name}.{key}": value
        for name in ("model", "data")
        for key, value in section_options(config, name).items()
        if key != "class_path" and not str(key).startswith("_")
    }
    trainer = section_options(config, "trainer")
    # The precision as Lightning resolves it (what a live report records): "bf16" is "bf16-mixed", none "32-true".
    precision = trainer.get("precision")
    setup["trainer.precision"] = PRECISION_ALIASES.get(str(precision), precision)
    if trainer.get("accumulate_grad_batches") is not None:
        setup["trainer.accumulate_grad_batches"] = trainer["accumulate_grad_batches"]
    return setup


def _images_per_batch(value: str) -> int:
    """``--batch-size``: a whole number of images >= 1 (argparse says the option's name with the message)."""
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"images per micro-batch per rank, a whole number >= 1, got {value!r}")
    return number


def _collect(paths: Sequence[str]) -> tuple[list[Path], list[Path]]:
    traces, reports = [], []
    for name in paths:
        path = Path(name).resolve()
        if path.is_dir():
            traces += sorted(path.rglob("*.pt.trace.json")) + sorted(path.rglob("*.pt.trace.json.gz"))
            # A run folder's step_report/ reports, or those of the folder given (a step_report folder, or a copy).
            found = (p for p in path.rglob("window_*.json") if p.parent.name == "step_report" or p.parent == path)
            reports += sorted(p for p in found if ".kineto" not in p.name)
        elif path.name.endswith((".json", ".json.gz")) and "trace" in path.name:
            traces.append(path)
        elif path.suffix == ".json":
            reports.append(path)
        else:
            raise SystemExit(f"step_report: {path} is neither a run folder, a Kineto trace nor a report JSON")
    # A folder and a file in it, or a folder given twice: each file once (read twice, a rank counted twice).
    return list(dict.fromkeys(traces, None)), list(dict.fromkeys(reports, None))


def _compare(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``--compare A B``: prints report_compare's Markdown."""
    if len(args.paths) != 2:
        parser.error(f"--compare takes two reports, A then B; got {len(args.paths)}: {' '.join(args.paths)}")
    if args.batch_size is not None or args.out is not None:
        parser.error("--compare reads two finished reports: --batch-size and --out do not apply")
    reports = []
    try:
        paths = [report_compare.find_report(path) for path in args.paths]
        if paths[0].resolve() == paths[1].resolve():
            raise report_compare.CompareError(f"A and B are the same report, {paths[0]}: pass two")
        for path in paths:
            try:
                report = json.loads(path.read_text())
                report_compare.check(report)
            except (ValueError, OSError, RecursionError) as error:  # CompareError is a ValueError
                reason = error if isinstance(error, report_compare.CompareError) else (
                    f"not a step report ({type(error).__name__}: {error})")  # fmt: skip
                raise report_compare.CompareError(
                    f"{path}: {reason}; pass a step_report/window_*.json with finished steps"
                ) from error
            reports.append(report)
        try:
            result = report_compare.compare(*reports)
        except (KeyError, TypeError, AttributeError, IndexError, ZeroDivisionError) as error:
            # Each file read whole alone; a field only the other clock reads (the host's, beside a CPU report).
            raise report_compare.CompareError(
                f"{paths[0]} and {paths[1]} do not compare: {type(error).__name__}: {error} (a step report missing "
                "a field)"
            ) from error
    except report_compare.CompareError as error:
        print(f"step_report: {error}", file=sys.stderr)
        return 1
    print(report_compare.markdown(result, (str(paths[0]), str(paths[1]))), end="")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: reports from Kineto traces (one per window, all ranks) and the summaries of earlier reports."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", help="run folders, Kineto traces (*.pt.trace.json[.gz]) or report JSONs")
    parser.add_argument(
        "--batch-size",
        type=_images_per_batch,
        help="images per micro-batch per rank (default: what the trace records, else the run's config.yaml)",
    )
    parser.add_argument("--out", help="folder for reports made from traces (default: <run folder>/step_report)")
    parser.add_argument(
        "--compare",
        action="store_true",
        help="compare two reports, A then B (report JSONs, or folders holding one each): settings that differ, "
        "images/s and each phase's time side by side, and whether the change is clear of the window's step-to-step "
        "spread",
    )
    args = parser.parse_args(argv)
    if args.compare:
        return _compare(parser, args)
    traces, reports = _collect(args.paths)
    if not traces and not reports:
        print(
            "step_report: no Kineto traces (*.pt.trace.json[.gz]) or step reports (window_*.json in a step_report "
            f"folder or in the folder given) found in {', '.join(args.paths)}",
            file=sys.stderr,
        )
        return 1
    groups: dict[tuple[Path, str], list[tuple[int | None, Path]]] = {}
    for trace in traces:
        match = TRACE_NAME_RE.search(trace.name)
        key = (trace.parent, f"{match.group(2)}-{match.group(3)}" if match else trace.name.split(".")[0])
        groups.setdefault(key, []).append((int(match.group(1)) if match else None, trace))
    for (folder, window), members in sorted(groups.items()):
        ranks = [rank for rank, _ in members if rank is not None]
        twice = next((rank for rank in ranks if ranks.count(rank) > 1), None)
        if twice is not None:
            named = " and ".join(str(trace) for rank, trace in members if rank == twice)
            raise SystemExit(
                f"step_report: {named} are both rank {twice}'s trace of steps {window} (a copy, e.g. gzipped): the "
                "rank would count twice; pass one of them"
            )
        # One run folder per group: its config, read once, gives the batch size and settings of every rank whose
        # trace records none of its own.
        config = _run_config(folder)
        from_config = _setup_from_config(config) if config else {}
        summaries = []
        for rank, trace in members:
            try:
                loaded = load_trace(trace)
                # The settings the profiling window recorded in the trace, exactly a live report's: a trace copied
                # away from its run folder compares as well. Else the config's, and what Kineto recorded.
                setup = recorded_setup(loaded) or {**from_config, **kineto_setup(loaded)}
                if args.batch_size:
                    setup["data.batch_size"] = args.batch_size
                batch = setup.get("data.batch_size")
                summaries.append(
                    summarize_trace(loaded, rank=rank, batch_size=batch if isinstance(batch, int) else None)
                )
                if setup:
                    summaries[-1]["setup"] = setup
            except (ValueError, KeyError, OSError, TypeError, AttributeError) as error:
                # A file that is JSON but not this app's trace (values of the wrong type, no ranges) included.
                raise SystemExit(f"step_report: {trace}: {type(error).__name__}: {error}") from error
        report = build_report(summaries)
        out = Path(args.out) if args.out else (folder.parent if folder.name == "traces" else folder) / "step_report"
        paths = write_report(report, out, f"window_{report['window'][0]}-{report['window'][1]}.kineto")
        traces = ", ".join(str(trace) for _, trace in members)
        print("\n".join(summary_lines(report)) + f"\n  from: {traces}\n  written: {', '.join(str(p) for p in paths)}")
    for path in reports:
        try:
            lines = summary_lines(json.loads(path.read_text()))
        except (ValueError, KeyError, OSError, TypeError, AttributeError) as error:
            raise SystemExit(
                f"step_report: {path}: not a step report ({type(error).__name__}: {error}); pass a "
                "step_report/window_*.json, a Kineto trace or a run folder"
            ) from error
        print("\n".join(lines) + f"\n  from: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
