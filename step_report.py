"""The step-time report: where each step's time went, per phase and per rank, and whether the input copies overlap.

Written at the end of each profiling window (``--profile.report``, on by default with ``--profile.start_step``) into
``<run folder>/step_report/window_<A>-<B>.{json,md,png}``, and on demand from Kineto traces or earlier reports::

    python step_report.py runs/resnet50/version_0              # every trace and report under the run folder
    python step_report.py runs/.../traces/rank*_steps20-29.pt.trace.json --batch-size 224

Phases of an optimizer step, in the order they run on the main thread: ``data`` (waiting for the loader, issuing the
copy of a later batch), ``forward``, ``backward``, ``optimizer`` and ``other`` (the rest of the step: zero_grad,
hooks). ``h2d`` is the host-to-device copy and normalization on the prefetcher's side stream: it runs beside the
step, so it is not part of the step's sum. Times come from two clocks:

* host: ``time.perf_counter`` at the phase boundaries (the NVTX ranges' boundaries);
* gpu: CUDA events at the same boundaries on the compute stream (from a Kineto trace: kernel time of each phase).
  GPU ``data`` is the compute stream waiting for its input; ``other`` includes idle gaps.

This module is pure analysis over plain data (no torch): per-rank summaries in, a report dict out, and writers.
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import io
import json
import math
import os
import re
import statistics
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

#: The serial phases of a step; they sum to the step's time on each clock.
PHASES = ("data", "forward", "backward", "optimizer", "other")
#: Range names (NVTX / record_function) that mark phases.
RANGE_PHASES = ("data", "forward", "backward", "optimizer")
STEP_RE = re.compile(r"step (\d+)")
#: HtoD copies smaller than this in a trace are not input batches (a logged scalar, an index): not judged.
INPUT_COPY_MIN_BYTES = 64 * 1024
TRACE_NAME_RE = re.compile(r"rank(\d+)_steps(\d+)-(\d+)")
#: Thresholds of the verdict.
DATA_WAIT_PCT = 5.0  # data wait above this share of the step: input-bound
ZERO_DATA_PCT = 1.0  # below this the data wait counts as zero
OVERLAP_OK = 0.9  # fraction of H2D copy time that overlaps compute for the prefetch to count as hidden
BUSY_OK = 0.9  # GPU busy fraction below which the run is host-bound (when the data wait is not the cause)
LAG_HOST_BOUND = 0.1  # GPU trailing the host by less than this share of a step: the GPU waits for launches
#: Phases without DDP collectives: forward starts with the buffer broadcast, backward holds the gradient all-reduce,
#: and there a fast rank waits for a slow one; what a rank spends in the others is its own.
UNSYNCED = ("data", "optimizer", "other")
STRAGGLER_PCT = 5.0  # a rank spending this share of a step more in UNSYNCED phases than the other ranks: straggler

Interval = tuple[float, float]


# --- interval arithmetic --------------------------------------------------------------------------------------
def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, merged, non-empty intervals covering the same points."""
    merged: list[list[float]] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def length(intervals: Iterable[Interval]) -> float:
    """Total length of the union of ``intervals``."""
    return sum(b - a for a, b in union(intervals))


def overlap(intervals: Sequence[Interval], cover: Sequence[Interval]) -> tuple[float, float]:
    """``(total length of intervals, length of their parts inside the union of cover)``; each interval counted once.

    Copy ``[0, 10]`` against compute ``[5, 20]`` gives ``(10, 5)``: half the copy overlaps.
    """
    merged = union(cover)
    starts = [a for a, _ in merged]
    total = inside = 0.0
    for start, end in intervals:
        if end <= start:
            continue
        total += end - start
        for a, b in merged[max(0, bisect.bisect_right(starts, start) - 1) :]:
            if a >= end:
                break
            inside += max(0.0, min(b, end) - max(a, start))
    return total, inside


def phase_times(step: Interval, phases: dict[str, Sequence[Interval]]) -> dict[str, float]:
    """Phase times of one step: each phase's intervals summed (clipped to the step), ``other`` the rest, ``total``.

    Gradient accumulation gives a phase several intervals per step; they add up.
    """
    total = step[1] - step[0]
    out = {}
    for name in RANGE_PHASES:
        out[name] = sum(max(0.0, min(b, step[1]) - max(a, step[0])) for a, b in phases.get(name, ()))
    out["other"] = max(0.0, total - sum(out.values()))
    out["total"] = total
    return out


# --- a Kineto trace -> a rank summary ----------------------------------------------------------------------------
def load_trace(path: str | Path) -> dict:
    """A Kineto (chrome trace) JSON file, plain or gzipped."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as handle:
        return json.load(handle)


def summarize_trace(trace: dict, rank: int | None = None, batch_size: int | None = None) -> dict:
    """A rank summary (see :func:`build_report`) from one rank's Kineto trace of a window.

    Steps and host phases come from the ``step N`` / phase ``user_annotation`` ranges. GPU kernels are attributed to
    the step and phase whose range holds their launch (the ``cuda_runtime`` event of the same correlation id; backward
    launches from autograd's thread fall inside the main thread's ``backward`` range). Compute streams are the
    streams of the kernels launched in ``forward``. Per step on the GPU: ``data`` is the gap before the step's first
    compute kernel, forward/backward/optimizer the union of their compute kernels, ``other`` the rest of the span
    (idle included). H2D copies are ``gpu_memcpy`` events named ``Memcpy HtoD (Pinned|Pageable -> Device)``;
    overlap is measured against kernels on other streams. ``batch_size`` (per micro-batch) gives images per step.
    """
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e and "ts" in e]
    annotations = [e for e in events if e.get("cat") == "user_annotation"]
    steps = sorted((e for e in annotations if STEP_RE.fullmatch(e["name"])), key=lambda e: e["ts"])
    if rank is None:
        rank = int(trace.get("distributedInfo", {}).get("rank", 0))
    if not steps:
        raise ValueError("the trace has no 'step N' ranges (record it with --profile.torch_profiler true)")
    main_tid = steps[0].get("tid")
    step_ranges = [(float(e["ts"]), float(e["ts"] + e["dur"])) for e in steps]
    step_starts = [a for a, _ in step_ranges]
    phases: list[dict[str, list[Interval]]] = [{n: [] for n in RANGE_PHASES} for _ in steps]
    for e in annotations:
        if e["name"] in RANGE_PHASES and e.get("tid", main_tid) == main_tid:
            i = _find(step_ranges, step_starts, e["ts"])
            if i is not None:
                phases[i][e["name"]].append((float(e["ts"]), float(e["ts"] + e["dur"])))
    launches = {
        e["args"]["correlation"]: float(e["ts"])
        for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }

    def launch(e: dict) -> float:
        """When the host launched a GPU activity (its own start when the launch is not in the trace)."""
        return launches.get(e.get("args", {}).get("correlation"), float(e["ts"]))

    def stream(e: dict) -> Any:
        return e.get("args", {}).get("stream")

    def phase_at(i: int, t: float) -> str:
        return next((n for n, spans in phases[i].items() for a, b in spans if a <= t <= b), "other")

    kernels = [e for e in events if e.get("cat") == "kernel"]
    launched = [(k, launch(k), _find(step_ranges, step_starts, launch(k))) for k in kernels]
    compute_streams = {stream(k) for k, t, i in launched if i is not None and phase_at(i, t) == "forward"}
    if not compute_streams and kernels:  # no launch correlation: the stream with the most kernel time
        busiest: dict[Any, float] = {}
        for k in kernels:
            busiest[stream(k)] = busiest.get(stream(k), 0.0) + k["dur"]
        compute_streams = {max(busiest, key=busiest.__getitem__)}
    per_step: list[dict[str, list[Interval]]] = [{n: [] for n in (*RANGE_PHASES, "other")} for _ in steps]
    for k, t, i in launched:
        if i is not None and stream(k) in compute_streams:
            per_step[i][phase_at(i, t)].append((float(k["ts"]), float(k["ts"] + k["dur"])))
    copies = [
        e
        for e in events
        if e.get("cat") == "gpu_memcpy"
        and "HtoD" in e.get("name", "")
        and e.get("args", {}).get("bytes", INPUT_COPY_MIN_BYTES) >= INPUT_COPY_MIN_BYTES
    ]
    h2d = [0.0] * len(steps)
    for c in copies:
        i = _find(step_ranges, step_starts, launch(c))
        if i is not None:
            h2d[i] += c["dur"] / 1000
    rows = []
    previous_end: float | None = None
    for i, (step, host) in enumerate(zip(steps, step_ranges, strict=True)):
        host_times = phase_times(host, phases[i])
        spans = [s for v in per_step[i].values() for s in v]
        gpu = None
        if spans:
            first, last = min(a for a, _ in spans), max(b for _, b in spans)
            begin = host[0] if previous_end is None else previous_end
            gpu = {"data": max(0.0, first - begin)}
            for name in ("forward", "backward", "optimizer"):
                gpu[name] = length(per_step[i][name])
            gpu["total"] = last - begin
            gpu["other"] = max(0.0, gpu["total"] - sum(gpu[n] for n in RANGE_PHASES))
            previous_end = last
        micro = len(phases[i]["forward"]) or 1
        rows.append(
            {
                "step": int(STEP_RE.fullmatch(step["name"]).group(1)),  # type: ignore[union-attr]
                "images": batch_size * micro if batch_size else None,
                "host": _ms(host_times),
                "gpu": _ms(gpu) if gpu else None,
                "h2d": round(h2d[i], 4) if copies else None,
                "lag": None,
            }
        )
    span = (step_ranges[0][0], previous_end if previous_end is not None else step_ranges[-1][1])
    busy = None
    if kernels and span[1] > span[0]:
        clipped = [(max(span[0], k["ts"]), min(span[1], k["ts"] + k["dur"])) for k in kernels]
        busy = length(clipped) / (span[1] - span[0])
    copy_summary = None
    if copies:
        total = inside = 0.0
        # Kineto sees no kernel launched before the trace began, so a copy that starts before its first kernel may
        # well overlap compute it cannot see: such copies are left out of the overlap.
        first_kernel = min((k["ts"] for k in kernels), default=float("inf"))
        for copy_stream in {stream(c) for c in copies}:
            cover = [(k["ts"], k["ts"] + k["dur"]) for k in kernels if stream(k) != copy_stream]
            spans = [
                (c["ts"], c["ts"] + c["dur"]) for c in copies if stream(c) == copy_stream and c["ts"] >= first_kernel
            ]
            t, o = overlap(spans, cover)
            total, inside = total + t, inside + o
        copy_summary = copy_stats(
            total / 1000,
            inside / 1000,
            pinned=sum("Pinned" in c["name"] for c in copies),
            pageable=sum("Pageable" in c["name"] for c in copies),
            count=len(copies),
            source="kineto",
        )
    return {
        "rank": rank,
        "device": "cuda" if kernels else "cpu",
        "source": "kineto",
        "window": [rows[0]["step"], rows[-1]["step"]],
        "steps": rows,
        "wall_ms": round((step_ranges[-1][1] - step_ranges[0][0]) / 1000, 4),
        "gpu_busy": round(busy, 4) if busy is not None else None,
        "gpu_busy_source": "kineto" if busy is not None else None,
        "copies": copy_summary,
        "input": "trace",
    }


def _find(ranges: Sequence[Interval], starts: Sequence[float], t: float) -> int | None:
    i = bisect.bisect_right(starts, t) - 1
    return i if i >= 0 and t <= ranges[i][1] else None


def _ms(times: dict[str, float], scale: float = 1e-3) -> dict[str, float]:
    """Microseconds (Kineto's unit) to milliseconds, rounded to 0.1 us."""
    return {k: round(v * scale, 4) for k, v in times.items()}


def copy_stats(time_ms: float, overlapped_ms: float, pinned: int, pageable: int, count: int, source: str) -> dict:
    """The ``copies`` entry of a rank summary."""
    return {
        "count": count,
        "time_ms": round(time_ms, 4),
        "overlapped_ms": round(overlapped_ms, 4),
        "overlap": round(overlapped_ms / time_ms, 4) if time_ms > 0 else None,
        "pinned": pinned,
        "pageable": pageable,
        "unknown": count - pinned - pageable,
        "source": source,
    }


# --- rank summaries -> report ----------------------------------------------------------------------------------
def rank_stats(summary: dict) -> dict:
    """Aggregates of one rank: medians and means per phase and clock, split in %, images/s, data wait %."""
    steps = summary["steps"]
    clocks = ["host"] + (["gpu"] if steps and all(s.get("gpu") for s in steps) else [])
    out: dict[str, Any] = {"clocks": clocks}
    for clock in clocks:
        mean = {p: statistics.fmean(s[clock][p] for s in steps) for p in (*PHASES, "total")}
        out[clock] = {
            "median_ms": {p: round(statistics.median(s[clock][p] for s in steps), 4) for p in (*PHASES, "total")},
            "mean_ms": {p: round(v, 4) for p, v in mean.items()},
            "pct": {p: round(100 * mean[p] / mean["total"], 2) if mean["total"] > 0 else 0.0 for p in PHASES},
        }
    images = [s.get("images") for s in steps]
    wall = summary.get("wall_ms") or 0.0
    out["images"] = sum(images) if steps and None not in images else None
    out["images_per_s"] = round(out["images"] / (wall / 1000), 2) if out["images"] and wall > 0 else None
    out["step_ms"] = out["host"]["median_ms"]["total"] if steps else None
    out["data_pct"] = out["host"]["pct"]["data"] if steps else None
    clock = clocks[-1]
    out["unsynced_ms"] = (
        round(statistics.median(sum(s[clock][p] for p in UNSYNCED) for s in steps), 4) if steps else None
    )
    h2d = [s["h2d"] for s in steps if s.get("h2d") is not None]
    out["h2d_ms"] = round(statistics.median(h2d), 4) if h2d else None
    lags = [s["lag"] for s in steps if s.get("lag") is not None]
    out["lag_ms"] = round(statistics.median(lags), 4) if lags else None
    return out


def stragglers(ranks: Sequence[dict], pct: float = STRAGGLER_PCT) -> list[dict]:
    """Ranks that spend more than ``pct``% of a step longer in the unsynchronized phases than the other ranks.

    Under DDP every rank's step ends together: a fast rank waits for a slow one inside the collectives (the buffer
    broadcast at the start of forward, the gradient all-reduce in backward), so step times are equal and a slow rank
    shows instead as more time in :data:`UNSYNCED` phases (data, optimizer, other) than the median of the other ranks.
    A rank whose forward/backward compute itself is slow is not seen this way (the Kineto trace shows it per kernel).
    """
    if len(ranks) < 2:
        return []
    clock = "gpu" if all("gpu" in r["stats"]["clocks"] for r in ranks) else "host"
    step = statistics.median(r["stats"][clock]["median_ms"]["total"] for r in ranks)
    out = []
    for r in ranks:
        others = [o for o in ranks if o is not r]
        excess = r["stats"]["unsynced_ms"] - statistics.median(o["stats"]["unsynced_ms"] for o in others)
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
    "gpu_busy", "gpu_busy_source", "copies": {"count", "time_ms", "overlapped_ms", "overlap", "pinned",
    "pageable", "unknown"} | None}``.
    """
    ranks = sorted((dict(s) for s in summaries), key=lambda s: s["rank"])
    for r in ranks:
        r["stats"] = rank_stats(r)
    copies = [r["copies"] for r in ranks if r.get("copies")]
    copy_time = sum(c["time_ms"] for c in copies)
    overall_copies = (
        copy_stats(
            copy_time,
            sum(c["overlapped_ms"] for c in copies),
            sum(c["pinned"] for c in copies),
            sum(c["pageable"] for c in copies),
            sum(c["count"] for c in copies),
            "/".join(sorted({c["source"] for c in copies})),
        )
        if copies
        else None
    )
    busy = [r["gpu_busy"] for r in ranks if r.get("gpu_busy") is not None]
    ips = [r["stats"]["images_per_s"] for r in ranks]
    steps_ms = [r["stats"]["step_ms"] for r in ranks if r["stats"]["step_ms"] is not None]
    data = [r["stats"]["data_pct"] for r in ranks if r["stats"]["data_pct"] is not None]
    overall = {
        "world_size": len(ranks),
        "images_per_s": round(sum(ips), 2) if ips and None not in ips else None,
        "step_ms": round(statistics.median(steps_ms), 4) if steps_ms else None,
        "data_pct": round(statistics.fmean(data), 2) if data else None,
        "data_pct_max": max(data) if data else None,
        "data_pct_max_rank": ranks[data.index(max(data))]["rank"] if data else None,
        "gpu_busy": round(statistics.fmean(busy), 4) if busy else None,
        "gpu_busy_source": "/".join(sorted({r["gpu_busy_source"] for r in ranks if r.get("gpu_busy_source")})) or None,
        "cuda": any(r.get("device", "").startswith("cuda") for r in ranks),
        "input": "/".join(sorted({r.get("input") or "unknown" for r in ranks})),
        "copies": overall_copies,
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


def verdict(overall: dict, slow: Sequence[dict] = ()) -> tuple[list[str], str]:
    """``(findings, verdict line)``: what limits the step, most important first, and one line that says it plainly."""
    findings = []
    data = overall.get("data_pct_max")
    copies = overall.get("copies")
    where = f" (rank {overall['data_pct_max_rank']})" if overall.get("world_size", 1) > 1 else ""
    if copies and copies["pageable"]:
        findings.append(
            f"copies are pageable ({copies['pageable']} of {copies['count']}): enable pin_memory in the DataLoader"
        )
    if data is not None and data > DATA_WAIT_PCT:
        findings.append(
            f"input-bound: data wait is {data:.1f}% of the step{where}; more data.workers or data.decode gpu"
        )
    overlapped = copies["overlap"] if copies else None
    if overlapped is not None and overlapped < OVERLAP_OK and not (data is not None and data > DATA_WAIT_PCT):
        findings.append(
            f"copies serialize with compute: {100 * overlapped:.1f}% of H2D time overlaps compute kernels; issue them "
            "non_blocking from pinned memory on a side stream a batch ahead, with no host sync in the step"
        )
    input_ok = not findings
    busy, lag, step = overall.get("gpu_busy"), overall.get("lag_ms"), overall.get("gpu_step_ms")
    if input_ok and overall.get("cuda"):
        if busy is not None and overall.get("gpu_busy_source") == "kineto" and busy < BUSY_OK:
            findings.append(
                f"host-bound: the GPU is busy {100 * busy:.1f}% of the window with no input stall; launch overhead: "
                "try model.compile or a larger batch"
            )
        elif lag is not None and step and lag < LAG_HOST_BOUND * step and overall.get("gpu_busy_source") != "kineto":
            findings.append(
                f"host-bound: the GPU finishes each step {lag:.2f} ms after the host issues it (of a {step:.1f} ms "
                "step), so it waits for launches; try model.compile or a larger batch"
            )
    for s in slow:
        findings.append(
            f"straggler: rank {s['rank']} spends {s['excess_ms']:.2f} ms ({s['excess_pct']}% of a step) longer "
            f"than the other ranks outside the synchronized phases ({s['phase']} +{s['phase_excess_ms']:.2f} ms); "
            "the others wait for it in forward/backward"
        )
    if input_ok:
        data_text = "" if data is None else f"data wait {'0' if data < 0.05 else f'{data:.1f}'}%"
        if not overall.get("cuda"):
            head = f"CPU run: GPU times and copy overlap unavailable; {data_text}"
        elif copies is None and overall.get("input") == "other":
            head = (
                f"copies not measured (the loader is not a DevicePrefetcher: use profile.torch_profiler); {data_text}"
            )
        elif copies is None:
            head = f"no host-to-device copies (data already on the device); {data_text}"
        elif overlapped is None:
            head = f"prefetch: copy overlap unknown; {data_text}"
        else:
            if copies["pinned"] == copies["count"]:
                kind = "pinned"
            elif copies["unknown"] == copies["count"] and copies.get("source") == "events":
                kind = "JPEGs decoded on the GPU"  # data.decode gpu: encoded bytes, no pixel copy to pin
            else:
                kind = f"pinned {copies['pinned']} of {copies['count']}"
            head = f"prefetch hidden: {100 * overlapped:.1f}% overlapped, {kind}, {data_text}"
            if data is not None and data >= ZERO_DATA_PCT:
                head = f"prefetch overlapped ({100 * overlapped:.1f}%, {kind}) but {data_text}"
        return findings, "; ".join([head.rstrip("; "), *findings])
    return findings, "; ".join(findings)


# --- output ------------------------------------------------------------------------------------------------------
def summary_lines(report: dict) -> list[str]:
    """The few lines printed on rank 0 at the end of a window."""
    o = report["overall"]
    w = report["window"]
    head = f"step report, steps {w[0]}-{w[1]}, {report['world_size']} rank(s):"
    parts = [f"{o['images_per_s']:.1f} img/s" if o["images_per_s"] else "img/s n/a"]
    if o["step_ms"] is not None:
        parts.append(f"median step {o['step_ms']:.2f} ms")
    if o.get("gpu_busy") is not None:
        parts.append(f"GPU busy {100 * o['gpu_busy']:.1f}% ({o['gpu_busy_source']})")
    lines = [head, "  " + ", ".join(parts)]
    for clock in ("gpu", "host"):
        if f"{clock}_pct" in o:
            split = " ".join(f"{p} {o[f'{clock}_pct'][p]:.1f}%" for p in PHASES)
            lines.append(f"  phases ({clock}): {split}")
    lines.append(f"  verdict: {report['verdict']}")
    if report["stragglers"]:
        lines.append(
            "  stragglers: " + ", ".join(f"rank {s['rank']} (+{s['excess_pct']}%)" for s in report["stragglers"])
        )
    return lines


def markdown(report: dict) -> str:
    """The readable report."""
    o, w = report["overall"], report["window"]
    copies = o.get("copies")
    out = [f"# Step-time report: steps {w[0]}-{w[1]}", "", f"**{report['verdict']}**", "", "| | |", "|---|---|"]
    rows = [
        ("ranks", report["world_size"]),
        ("images/s (all ranks)", o["images_per_s"]),
        ("median step (host, ms)", o["step_ms"]),
        ("median step (GPU, ms)", o.get("gpu_step_ms")),
        ("data wait (% of step, mean / max of ranks)", f"{o['data_pct']} / {o['data_pct_max']}"),
        ("GPU busy", f"{100 * o['gpu_busy']:.1f}% ({o['gpu_busy_source']})" if o.get("gpu_busy") is not None else None),
        ("GPU behind host at step end (ms)", o.get("lag_ms")),
    ]
    if copies:
        rows += [
            ("H2D copies", f"{copies['count']} ({copies['source']}), {copies['time_ms']:.3f} ms"),
            (
                "H2D overlapped with compute",
                f"{100 * copies['overlap']:.1f}%" if copies["overlap"] is not None else None,
            ),
            ("pinned / pageable / unknown", f"{copies['pinned']} / {copies['pageable']} / {copies['unknown']}"),
        ]
    out += [f"| {k} | {'n/a' if v is None else v} |" for k, v in rows]
    header = "| rank | clock | " + " | ".join(PHASES) + " | step | h2d (side stream) |"
    out += ["", "## Median per step (ms)", "", header, "|" + "---|" * (len(PHASES) + 4)]
    for r in report["ranks"]:
        for clock in r["stats"]["clocks"]:
            m = r["stats"][clock]["median_ms"]
            h2d = r["stats"]["h2d_ms"] if clock == "gpu" else None
            cells = " | ".join(f"{m[p]:.3f}" for p in (*PHASES, "total"))
            out.append(f"| {r['rank']} | {clock} | {cells} | {'' if h2d is None else f'{h2d:.3f}'} |")
    if report["world_size"] > 1:
        head = "| rank | img/s | step ms | data+optimizer+other ms | data % | GPU busy | straggler |"
        out += ["", "## Ranks", "", head, "|---|---|---|---|---|---|---|"]
        slow = {s["rank"]: s for s in report["stragglers"]}
        for r in report["ranks"]:
            s = r["stats"]
            flag = f"+{slow[r['rank']]['excess_pct']}% ({slow[r['rank']]['phase']})" if r["rank"] in slow else ""
            busy = f"{100 * r['gpu_busy']:.1f}%" if r.get("gpu_busy") is not None else "n/a"
            out.append(f"| {r['rank']} | {s['images_per_s']} | {s['step_ms']} | {s['unsynced_ms']} | "
                       f"{s['data_pct']} | {busy} | {flag} |")  # fmt: skip
    out += ["", "## Steps (ms)", "", "| rank | step | images | clock | " + " | ".join(PHASES) + " | step | h2d |",
            "|" + "---|" * (len(PHASES) + 6)]  # fmt: skip
    for r in report["ranks"]:
        for s in r["steps"]:
            for clock in ("host", "gpu"):
                if s.get(clock):
                    cells = " | ".join(f"{s[clock][p]:.3f}" for p in (*PHASES, "total"))
                    h2d = s.get("h2d") if clock == "gpu" else None
                    out.append(f"| {r['rank']} | {s['step']} | {s.get('images') or ''} | {clock} | {cells} | "
                               f"{'' if h2d is None else f'{h2d:.3f}'} |")  # fmt: skip
    if report["findings"]:
        out += ["", "## What to change", ""] + [f"- {f}" for f in report["findings"]]
    out += ["", "## How this was measured", "", MEASURED]
    return "\n".join(out) + "\n"


MEASURED = (
    "Phases follow the NVTX ranges of each step: `data` (loader hand-off and issuing the next batch's copy), "
    "`forward`, `backward`, `optimizer`, `other` (the rest of the step). Host times are `perf_counter` at the range "
    "boundaries. GPU times from CUDA events at the same boundaries on the compute stream (recorded inside the window "
    "only, read after one synchronize at its end): GPU `data` is the compute stream waiting for input, and GPU busy is "
    "the rest of the window (an upper bound: gaps between kernels inside a phase count as busy). From a Kineto trace "
    "GPU phases are kernel time and GPU busy is exact. `h2d` is the copy and normalization on the prefetcher's side "
    "stream; its overlap is the share of copy time that lies inside the compute stream's forward..optimizer spans "
    "(events) or inside kernels on other streams (Kineto). Stragglers: ranks that spend over 5% of a step longer than "
    "the other ranks in data+optimizer+other; under DDP the fast ranks wait for them inside forward (buffer "
    "broadcast) and backward (gradient all-reduce), so those phases are left out."
)


def render_png(report: dict, max_ranks: int = 8) -> bytes:
    """A PNG chart: stacked phase times per step (one panel per rank, GPU clock where measured) and per rank."""
    from PIL import Image, ImageDraw, ImageFont

    colors = {"data": (214, 39, 40), "forward": (31, 119, 180), "backward": (44, 160, 44), "optimizer": (255, 127, 14),
              "other": (170, 170, 170), "h2d": (148, 103, 189)}  # fmt: skip
    ranks = report["ranks"][:max_ranks]
    panels: list[tuple[str, list[str], list[dict], list[float | None]]] = []
    for r in ranks:
        clock = r["stats"]["clocks"][-1]
        panels.append((f"rank {r['rank']} per step ({clock} clock, ms)", [str(s["step"]) for s in r["steps"]],
                       [s[clock] for s in r["steps"]], [s.get("h2d") for s in r["steps"]]))  # fmt: skip
    if report["world_size"] > 1:
        clock = "gpu" if all("gpu" in r["stats"]["clocks"] for r in report["ranks"]) else "host"
        slow = {s["rank"] for s in report["stragglers"]}
        panels.append((f"median step per rank ({clock} clock, ms; * straggler)",
                       [f"{r['rank']}{'*' if r['rank'] in slow else ''}" for r in report["ranks"]],
                       [r["stats"][clock]["median_ms"] for r in report["ranks"]],
                       [r["stats"]["h2d_ms"] for r in report["ranks"]]))  # fmt: skip
    width, panel_h, top = 960, 190, 80
    image = Image.new("RGB", (width, top + panel_h * len(panels) + 10), "white")
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default()
    w = report["window"]
    ips = report["overall"]["images_per_s"]
    head = f"step report, steps {w[0]}-{w[1]}, {report['world_size']} rank(s), {ips or 'n/a'} img/s"
    draw.text((10, 4), head, fill="black", font=font)
    draw.text((10, 20), report["verdict"][:170], fill="black", font=font)
    x = 10
    for name in (*PHASES, "h2d"):
        draw.rectangle([x, 44, x + 12, 56], fill=colors[name])
        label = "h2d (side stream)" if name == "h2d" else name
        draw.text((x + 16, 44), label, fill="black", font=font)
        x += 30 + int(draw.textlength(label, font=font))
    for n, (title, labels, values, h2d) in enumerate(panels):
        y0 = top + n * panel_h
        left, right, plot_top, bottom = 60, width - 20, y0 + 18, y0 + panel_h - 24
        draw.text((left, y0 + 2), title, fill="black", font=font)
        peak = max([v["total"] for v in values] + [h or 0.0 for h in h2d] + [1e-9])
        tick = _nice(peak / 5)
        ticks = math.ceil(peak / tick - 1e-9)
        scale = (bottom - plot_top) / (tick * ticks)
        for i in range(ticks + 1):
            y = bottom - i * tick * scale
            draw.line([left, y, right, y], fill=(230, 230, 230))
            draw.text((4, y - 6), f"{i * tick:g}", fill="black", font=font)
        slot = (right - left) / max(1, len(values))
        every = max(1, int(len(values) * 30 / (right - left)) + 1)
        for i, (v, h) in enumerate(zip(values, h2d, strict=True)):
            x0 = left + i * slot + slot * 0.1
            x1 = x0 + slot * 0.6
            y = bottom
            for phase in PHASES:
                height = v[phase] * scale
                if height > 0:
                    draw.rectangle([x0, y - height, x1, y], fill=colors[phase])
                y -= height
            if h:
                draw.rectangle([x1 + slot * 0.05, bottom - h * scale, x1 + slot * 0.2, bottom], fill=colors["h2d"])
            if i % every == 0:
                draw.text((x0, bottom + 4), labels[i], fill="black", font=font)
        draw.line([left, bottom, right, bottom], fill="black")
        draw.line([left, plot_top, left, bottom], fill="black")
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _nice(x: float) -> float:
    """The smallest of 1, 2, 2.5, 5 x 10^k at or above ``x``."""
    if x <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(x))
    return next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= x)


def write_atomic(path: Path, data: bytes) -> None:
    """Writes ``data`` to ``path`` through a temporary file and ``os.replace``: a reader never sees half a file."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        partial.write_bytes(data)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def write_report(report: dict, folder: str | Path, stem: str | None = None) -> list[Path]:
    """Writes ``<folder>/<stem>.json``, ``.md`` and ``.png`` (default stem ``window_<A>-<B>``); returns the paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    stem = stem or f"window_{report['window'][0]}-{report['window'][1]}"
    paths = [folder / f"{stem}.{ext}" for ext in ("json", "md", "png")]
    write_atomic(paths[0], (json.dumps(report, indent=1) + "\n").encode())
    write_atomic(paths[1], markdown(report).encode())
    write_atomic(paths[2], render_png(report))
    return paths


# --- command line ------------------------------------------------------------------------------------------------
def _batch_size_from_config(trace: Path) -> int | None:
    """``data.batch_size`` of the LightningCLI ``config.yaml`` of the run folder holding ``traces/``, if any."""
    import yaml  # jsonargparse's dependency: there wherever train.py runs

    for folder in (trace.parent.parent, trace.parent):
        config = folder / "config.yaml"
        if config.is_file():
            data = (yaml.safe_load(config.read_text()) or {}).get("data") or {}
            size = data.get("batch_size") or (data.get("init_args") or {}).get("batch_size")
            if isinstance(size, int):
                return size
    return None


def _collect(paths: Sequence[str]) -> tuple[list[Path], list[Path]]:
    traces, reports = [], []
    for name in paths:
        path = Path(name)
        if path.is_dir():
            traces += sorted(path.rglob("*.pt.trace.json")) + sorted(path.rglob("*.pt.trace.json.gz"))
            reports += sorted(p for p in path.rglob("step_report/window_*.json") if ".kineto" not in p.name)
        elif path.name.endswith((".json", ".json.gz")) and "trace" in path.name:
            traces.append(path)
        elif path.suffix == ".json":
            reports.append(path)
        else:
            raise SystemExit(f"step_report: {path} is neither a run folder, a Kineto trace nor a report JSON")
    return traces, reports


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: reports from Kineto traces (one per window, all ranks) and the summaries of earlier reports."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", help="run folders, Kineto traces (*.pt.trace.json[.gz]) or report JSONs")
    parser.add_argument("--batch-size", type=int, help="images per micro-batch per rank (default: the run's config)")
    parser.add_argument("--out", help="folder for reports made from traces (default: <run folder>/step_report)")
    args = parser.parse_args(argv)
    traces, reports = _collect(args.paths)
    if not traces and not reports:
        print("step_report: no Kineto traces or step reports found", file=sys.stderr)
        return 1
    groups: dict[tuple[Path, str], list[tuple[int | None, Path]]] = {}
    for trace in traces:
        match = TRACE_NAME_RE.search(trace.name)
        key = (trace.parent, f"{match.group(2)}-{match.group(3)}" if match else trace.name.split(".")[0])
        groups.setdefault(key, []).append((int(match.group(1)) if match else None, trace))
    for (folder, _), members in sorted(groups.items()):
        summaries = []
        for rank, trace in members:
            batch = args.batch_size or _batch_size_from_config(trace)
            summaries.append(summarize_trace(load_trace(trace), rank=rank, batch_size=batch))
        report = build_report(summaries)
        out = Path(args.out) if args.out else (folder.parent if folder.name == "traces" else folder) / "step_report"
        paths = write_report(report, out, f"window_{report['window'][0]}-{report['window'][1]}.kineto")
        print("\n".join(summary_lines(report)) + f"\n  written: {', '.join(str(p) for p in paths)}")
    for path in reports:
        print("\n".join(summary_lines(json.loads(path.read_text()))) + f"\n  from: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
