"""Kineto traces and step intervals -> the per-rank summary of the step-time report (``step_report.py``).

Interval arithmetic over ``(start, end)`` pairs (union, overlap, phase times within a step) shared with the in-window
timer (``callbacks/step_timer.py``), and the reading of a Kineto trace of a profiling window: the ``step N`` ranges
and their phase children, kernel time per phase, host-to-device copies (pinned or pageable) and how much of their time
overlaps compute kernels on other streams. Pure Python over plain data (no torch).
"""

from __future__ import annotations

import bisect
import gzip
import itertools
import json
import re
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

#: The serial phases of a step; they sum to the step's time on each clock.
PHASES = ("data", "forward", "backward", "optimizer", "other")
#: Range names (NVTX / record_function) that mark phases.
RANGE_PHASES = ("data", "forward", "backward", "optimizer")
STEP_RE = re.compile(r"step (\d+)")
#: Ranges of the work between two steps (callbacks/ranges.py's VALIDATION, EPOCH_END, CHECKPOINT; spelled here so that
#: this module needs neither torch nor nvtx): a window's gaps, left out as the live step report leaves them out.
BETWEEN_STEPS = ("validation", "epoch end", "checkpoint")
EPOCH_END = "epoch end"
#: The range inside a step around an epoch's first fetch (callbacks/ranges.py's EPOCH_START).
EPOCH_START = "epoch start"
#: HtoD copies smaller than this in a trace are not input batches (a logged scalar, an index): not judged.
INPUT_COPY_MIN_BYTES = 64 * 1024
TRACE_NAME_RE = re.compile(r"rank(\d+)_steps(\d+)-(\d+)")
#: The top-level key of a trace under which the profiling window records its run's settings (``step_timer.run_setup``:
#: every model and data option, the precision, the world size, the GPU, torch), as a live step report records them.
SETUP_KEY = "imagenet_prof_setup"

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
    try:
        with opener(path, "rt") as handle:
            trace = json.load(handle)
    except EOFError as error:  # a gzipped file cut short
        raise ValueError(f"cut short ({error})") from error
    except zlib.error as error:  # a gzipped file with a damaged block
        raise ValueError(f"a damaged gzip file ({error})") from error
    if not isinstance(trace, dict):
        raise ValueError(f"not a Kineto trace: a JSON {type(trace).__name__} where an object with traceEvents is")
    return trace


def recorded_setup(trace: dict) -> dict[str, Any] | None:
    """The run's settings the profiling window wrote into ``trace`` (:data:`SETUP_KEY`); ``None`` for a trace
    without them (another tool's, or this application's before it recorded them)."""
    setup = trace.get(SETUP_KEY)
    return dict(setup) if isinstance(setup, dict) else None


def kineto_setup(trace: dict) -> dict[str, Any]:
    """What Kineto itself records of the run, under the names of a live report's settings: ``device_name`` (the GPU
    the trace's kernels ran on, from ``deviceProperties``) and ``world_size`` (``distributedInfo``); a key is left out
    where the trace does not tell."""
    setup: dict[str, Any] = {}
    devices = trace.get("deviceProperties")
    names = {d.get("id"): d.get("name") for d in devices if isinstance(d, dict)} if isinstance(devices, list) else {}
    events = trace.get("traceEvents")
    used = {
        (e.get("args") or {}).get("device")
        for e in (events if isinstance(events, list) else [])
        if isinstance(e, dict) and e.get("cat") == "kernel"
    }
    # The GPUs the kernels ran on; every GPU the process saw when the trace names none of them.
    seen = {names[d] for d in used if d in names} or set(names.values())
    if len(seen) == 1 and isinstance(name := next(iter(seen)), str) and name:
        setup["device_name"] = name
    world_size = (trace.get("distributedInfo") or {}).get("world_size")
    if isinstance(world_size, int) and world_size >= 1:
        setup["world_size"] = world_size
    return setup


def summarize_trace(trace: dict, rank: int | None = None, batch_size: int | None = None) -> dict:
    """A rank summary (see :func:`build_report`) from one rank's Kineto trace of a window.

    Steps and host phases come from the ``step N`` / phase ``user_annotation`` ranges. GPU kernels are attributed to
    the step and phase whose range holds their launch (the ``cuda_runtime`` event of the same correlation id; backward
    launches from autograd's thread fall inside the main thread's ``backward`` range). Compute streams are the
    streams of the kernels launched in ``forward``. Per step on the GPU: ``data`` is the gap before the step's first
    compute kernel, forward/backward/optimizer the union of their compute kernels, ``other`` the rest of the span
    (idle included). H2D copies are ``gpu_memcpy`` events named ``Memcpy HtoD (Pinned|Pageable -> Device)``;
    overlap is measured against kernels on other streams. ``batch_size`` (per micro-batch) gives images per step.

    Work between two steps (:data:`BETWEEN_STEPS` ranges after a step's end: validation, an epoch's end, a save) is a
    gap, as in the live report: listed in ``between_steps``, left out of the wall time, of GPU busy and of the copies
    launched in it; after an epoch's end the next step's first ``data`` range (the loader refilling) joins the gap.
    When the window's first step holds an ``epoch start`` range (the window opens at an epoch's first step), its first
    ``data`` range is moved out of it the same way, listed as an ``epoch start`` gap before the window.
    Compute kernels whose launch call the trace does not hold ran work queued before the window (the host ahead of
    the GPU): they belong to no step, and the first step starts on the GPU when they are done.
    """
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e and "ts" in e]
    annotations = [e for e in events if e.get("cat") == "user_annotation"]
    steps = sorted((e for e in annotations if STEP_RE.fullmatch(e["name"])), key=lambda e: e["ts"])
    if rank is None:
        rank = int(trace.get("distributedInfo", {}).get("rank", 0))
    world_size = trace.get("distributedInfo", {}).get("world_size")
    if not steps:
        raise ValueError("the trace has no 'step N' ranges (record it with --profile.torch_profiler true)")
    main_tid = steps[0].get("tid")
    step_ranges = [(float(e["ts"]), float(e["ts"] + e["dur"])) for e in steps]
    step_starts = [a for a, _ in step_ranges]
    gaps, first_fetch = _gaps(annotations, main_tid, step_ranges, step_starts)
    epoch_start = _fold_epoch_start(annotations, main_tid, step_ranges)
    step_starts = [a for a, _ in step_ranges]  # after an epoch's end a step now starts after its first fetch
    host_gaps = [(step_ranges[i][1], step_ranges[i + 1][0]) for i in sorted(gaps)]
    # The steps whose first fetch was moved out of them: every data range left in them is a later micro-batch's.
    folded = {i + 1 for i in first_fetch} | ({0} if epoch_start else set())
    launch_gaps = host_gaps + ([epoch_start] if epoch_start else [])
    phases: list[dict[str, list[Interval]]] = [{n: [] for n in RANGE_PHASES} for _ in steps]
    for e in annotations:
        if e["name"] in RANGE_PHASES and e.get("tid", main_tid) == main_tid:
            i = _find(step_ranges, step_starts, e["ts"])
            if i is not None:
                phases[i][e["name"]].append((float(e["ts"]), float(e["ts"] + e["dur"])))
    runtime = [
        e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    ]
    launches = {e["args"]["correlation"]: float(e["ts"]) for e in runtime}
    launch_tids = {e["args"]["correlation"]: e.get("tid", main_tid) for e in runtime}
    launch_ends = {e["args"]["correlation"]: float(e["ts"] + e["dur"]) for e in runtime}

    def launch(e: dict) -> float:
        """When the host launched a GPU activity (its own start when the launch is not in the trace)."""
        return launches.get(e.get("args", {}).get("correlation"), float(e["ts"]))

    def stream(e: dict) -> Any:
        return e.get("args", {}).get("stream")

    def in_gap(e: dict) -> bool:
        """Launched in a gap between steps (or in the window's epoch-start fetch): the gap's work, left out with it."""
        return any(a <= launch(e) < b for a, b in launch_gaps)

    def phase_at(i: int, t: float) -> str:
        return next((n for n, spans in phases[i].items() for a, b in spans if a <= t <= b), "other")

    kernels = [e for e in events if e.get("cat") == "kernel"]
    launched = [(k, launch(k), _find(step_ranges, step_starts, launch(k))) for k in kernels]
    # The model's forward runs on the main thread: producer threads (data.decode gpu) launch decode kernels on their
    # own streams at any time, also during forward; those streams are input work, not compute.
    compute_streams = {
        stream(k)
        for k, t, i in launched
        if i is not None
        and phase_at(i, t) == "forward"
        and launch_tids.get(k.get("args", {}).get("correlation"), main_tid) == main_tid
    }
    if not compute_streams and kernels:  # no launch correlation: the stream with the most kernel time
        busiest: dict[Any, float] = {}
        for k in kernels:
            busiest[stream(k)] = busiest.get(stream(k), 0.0) + k["dur"]
        compute_streams = {max(busiest, key=busiest.__getitem__)}
    on_compute = [(k, t, i) for k, t, i in launched if stream(k) in compute_streams]  # with launch time and step

    def unlaunched(k: dict) -> bool:
        """Launched before the trace began: the GPU's backlog when the window opened (a trace without launch calls
        cannot tell)."""
        return bool(launches) and k.get("args", {}).get("correlation") not in launches

    # The window starts on the GPU when the backlog the host queued before it is done (a host that ran ahead of a
    # GPU-bound run), as the live report's events measure it: the backlog belongs to no step.
    backlog_end = max((float(k["ts"] + k["dur"]) for k, _, _ in on_compute if unlaunched(k)), default=None)
    per_step: list[dict[str, list[Interval]]] = [{n: [] for n in (*RANGE_PHASES, "other")} for _ in steps]
    step_kernels: list[list[tuple[float, float, float]]] = [[] for _ in steps]  # (launch, start, end) per step
    for k, t, i in on_compute:
        if i is not None and not unlaunched(k):
            per_step[i][phase_at(i, t)].append((float(k["ts"]), float(k["ts"] + k["dur"])))
            step_kernels[i].append((t, float(k["ts"]), float(k["ts"] + k["dur"])))
    copies = [
        e
        for e in events
        if e.get("cat") == "gpu_memcpy"
        and "HtoD" in e.get("name", "")
        and e.get("args", {}).get("bytes", INPUT_COPY_MIN_BYTES) >= INPUT_COPY_MIN_BYTES
        and not in_gap(e)
    ]
    h2d = [0.0] * len(steps)
    copied = [False] * len(steps)
    for c in copies:
        i = _find(step_ranges, step_starts, launch(c))
        if i is not None:
            h2d[i] += c["dur"] / 1000
            copied[i] = True
    # The end of the compute-stream work launched in each gap (validation's forward passes, a save's copies): the GPU
    # may still run it after the host has started the next step.
    gap_work_end = [max((k["ts"] + k["dur"] for k, t, _ in on_compute if a <= t < b), default=a) for a, b in host_gaps]
    gap_after = {i: n for n, i in enumerate(sorted(gaps))}  # step index -> its gap's position in host_gaps
    rows = []
    previous_end: float | None = None
    gpu_start: float | None = None  # the first step's start on the GPU
    gpu_gaps: list[Interval] = []
    pending: float | None = None  # after a gap: where the next step with kernels starts on the GPU, at the earliest
    for i, (step, host) in enumerate(zip(steps, step_ranges, strict=True)):
        host_times = phase_times(host, phases[i])
        spans = [s for v in per_step[i].values() for s in v]
        if i - 1 in gap_after:
            pending = max(host[0], gap_work_end[gap_after[i - 1]])
        gpu = None
        if spans and launches:
            first, last = min(a for a, _ in spans), max(b for _, b in spans)
            begin = host[0] if previous_end is None else previous_end
            if previous_end is None:
                if backlog_end is not None:
                    begin = min(first, max(host[0], backlog_end))
                gpu_start = begin
            if pending is not None and previous_end is not None:
                # After a gap the step's GPU time starts when the host has started it and the gap's own work is
                # done (never after its first kernel): what ran before belongs to the gap.
                begin = min(first, max(previous_end, pending))
                gpu_gaps.append((previous_end, begin))
            pending = None
            later = phases[i]["data"] if i in folded else sorted(phases[i]["data"])[1:]
            gpu = {"data": max(0.0, first - begin) + _later_fetch_waits(step_kernels[i], later)}
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
                "h2d": round(h2d[i], 4) if copied[i] else None,  # as with events: a step without a copy has none
                "lag": None,
            }
        )
    span = (
        step_ranges[0][0] if gpu_start is None else gpu_start,
        previous_end if previous_end is not None else step_ranges[-1][1],
    )
    # Without launch calls (a trace recorded elsewhere, or with them dropped) a kernel is placed by its own start, and
    # the kernels of a host that ran ahead fall after their steps' ranges: no GPU clock then, GPU busy only.
    busy = None
    skipped = length(gpu_gaps)
    gpu_wall = span[1] - span[0] - skipped
    if kernels and gpu_wall > 0:
        clipped = [(max(span[0], k["ts"]), min(span[1], k["ts"] + k["dur"])) for k in kernels]
        busy = (length(clipped) - overlap(union(clipped), gpu_gaps)[1]) / gpu_wall
    copy_summary = None
    if copies:
        total = inside = 0.0
        # Kineto sees no kernel launched before the trace began, so a copy that starts before its first kernel may
        # well overlap compute it cannot see: such copies are left out of the overlap.
        first_kernel = min((k["ts"] for k in kernels), default=float("inf"))
        for copy_stream in {stream(c) for c in copies}:
            # The steps' compute kernels (not another lane's decode); the gap's work is left out, as the gap is.
            cover = [
                (k["ts"], k["ts"] + k["dur"])
                for k in kernels
                if stream(k) != copy_stream and stream(k) in compute_streams and not in_gap(k)
            ]
            spans = [
                (c["ts"], c["ts"] + c["dur"]) for c in copies if stream(c) == copy_stream and c["ts"] >= first_kernel
            ]
            t, o = overlap(spans, cover)
            total, inside = total + t, inside + o
        compute = [(float(k["ts"]), float(k["ts"] + k["dur"])) for k, _, _ in on_compute]
        with_launch = [
            (float(k["ts"]), launches[c], launch_ends[c])
            for k, _, _ in on_compute
            if (c := k.get("args", {}).get("correlation")) in launches
        ]
        fetched = [end for p in phases for _, end in p["data"]]  # an epoch's first fetch, in its gap, is not here
        copy_summary = copy_stats(
            total / 1000,
            inside / 1000,
            pinned=sum("Pinned" in c["name"] for c in copies),
            pageable=sum("Pageable" in c["name"] for c in copies),
            count=len(copies),
            source="kineto",
            waited_ms=None if (waited := input_wait(compute, with_launch, fetched)) is None else waited / 1000,
        )
    return {
        "rank": rank,
        "device": "cuda" if kernels else "cpu",
        "source": "kineto",
        "window": [rows[0]["step"], rows[-1]["step"]],
        "steps": rows,
        "wall_ms": round((step_ranges[-1][1] - step_ranges[0][0] - sum(b - a for a, b in host_gaps)) / 1000, 4),
        # From the first step's start on the GPU (after any backlog) to the end of the last step's last compute
        # kernel, less the gaps: the window as the GPU ran it (longer than the host's when the host ran ahead).
        "gpu_wall_ms": round(gpu_wall / 1000, 4) if previous_end is not None and gpu_wall > 0 else None,
        "between_steps": (
            [{"after_step": rows[0]["step"] - 1, "what": EPOCH_START, "host_ms": moved, "first_fetch_ms": moved}]
            if epoch_start and (moved := round((epoch_start[1] - epoch_start[0]) / 1000, 4)) > 0
            else []
        )
        + [
            {
                "after_step": rows[i]["step"],
                "what": " + ".join(gaps[i]),
                "host_ms": round((step_ranges[i + 1][0] - step_ranges[i][1]) / 1000, 4),
                **({"first_fetch_ms": round(first_fetch[i] / 1000, 4)} if first_fetch.get(i) else {}),
            }
            for i in sorted(gaps)
        ],
        "gpu_busy": round(busy, 4) if busy is not None else None,
        "gpu_busy_source": "kineto" if busy is not None else None,
        "copies": copy_summary,
        "input": "trace",
        # The run's ranks (profile.ranks may have traced only some): a report of fewer says so.
        "world_size": int(world_size) if world_size else None,
    }


def input_wait(
    compute: Sequence[Interval], launched: Sequence[tuple[float, float, float]], fetched: Sequence[float]
) -> float | None:
    """How long the compute stream waited for its input: after each fetch (the end of a ``data`` range), the first
    compute kernel launched after it starts later than both the end of its launch call and the end of the compute
    work before it.

    ``compute`` holds ``(start, end)`` of every kernel on the compute streams; ``launched`` ``(start, launch call's
    start, launch call's end)`` of those whose launch is in the trace. A kernel that starts as soon as its launch
    returns waited for the host, not for the input; one that starts when the kernels before it end waited for nothing.
    What remains is the stream waiting on the prefetcher's event: the batch's copy (or GPU decode) was not done.
    ``None`` when no compute kernel's launch is in the trace (nothing to tell a wait from the host by).
    """
    if not launched:
        return None
    by_start = sorted(compute)
    starts = [a for a, _ in by_start]
    ends_so_far = list(itertools.accumulate((b for _, b in by_start), max))  # latest end among kernels up to i
    by_launch = sorted(launched, key=lambda k: (k[1], k[0]))  # a CUDA graph's kernels share one launch
    launch_starts = [k[1] for k in by_launch]
    waited = 0.0
    for done in fetched:
        i = bisect.bisect_left(launch_starts, done)
        if i == len(by_launch):
            continue
        start, _, launch_end = by_launch[i]
        j = bisect.bisect_left(starts, start)  # kernels that started before this one
        before = ends_so_far[j - 1] if j > 0 else float("-inf")
        waited += max(0.0, start - max(before, launch_end))
    return waited


def _gaps(
    annotations: list[dict], main_tid: Any, step_ranges: list[Interval], step_starts: list[float]
) -> tuple[dict[int, list[str]], dict[int, float]]:
    """``({i: names of the work between step i and step i + 1}, {i: the first fetch moved into that gap, us})``.

    Only ranges that start after step ``i`` has ended count (a validation inside an accumulated step stays in it).
    After an epoch's end step ``i + 1`` is moved to start where its first ``data`` range ends (``step_ranges`` is
    changed in place).
    """
    gaps: dict[int, list[str]] = {}
    for e in sorted(annotations, key=lambda e: e["ts"]):
        if e["name"] in BETWEEN_STEPS and e.get("tid", main_tid) == main_tid:
            i = bisect.bisect_right(step_starts, e["ts"]) - 1
            if 0 <= i < len(step_ranges) - 1 and e["ts"] >= step_ranges[i][1]:
                gaps.setdefault(i, []).append(e["name"])
    first_fetch: dict[int, float] = {}
    for i, names in gaps.items():
        if EPOCH_END not in names:
            continue
        start = step_ranges[i + 1][0]
        # From the gap's start: a fetch that opens a microsecond before its step range still counts.
        fetched = _move_past_first_fetch(annotations, main_tid, step_ranges, i + 1, since=step_ranges[i][1])
        if fetched is not None:
            first_fetch[i] = fetched - start
    return gaps, first_fetch


def _move_past_first_fetch(
    annotations: list[dict], main_tid: Any, step_ranges: list[Interval], index: int, since: float
) -> float | None:
    """Moves step ``index`` to start where its first ``data`` range (one opening from ``since`` on) ended, and returns
    that point; ``None`` (the step unchanged) when there is none. ``step_ranges`` is changed in place."""
    start, end = step_ranges[index]
    fetches = [
        e for e in annotations if e["name"] == "data" and e.get("tid", main_tid) == main_tid and since <= e["ts"] <= end
    ]
    if not fetches:
        return None
    fetch = min(fetches, key=lambda e: e["ts"])
    fetched = max(start, float(fetch["ts"] + fetch["dur"]))
    step_ranges[index] = (fetched, end)
    return fetched


def _later_fetch_waits(kernels: Sequence[tuple[float, float, float]], later: Sequence[Interval]) -> float:
    """The compute stream's idle time at a step's later fetches (gradient accumulation's next micro-batches): for each
    ``data`` range of ``later``, from the end of the compute launched before the fetch ended to the start of the first
    kernel launched after it. ``kernels`` are the step's ``(launch, start, end)``; the first fetch's wait is the gap
    before the step's first kernel, counted by the caller (also where that fetch was moved out of the step)."""
    waited = 0.0
    for _, fetched in later:
        before = [end for launch, _, end in kernels if launch < fetched]
        after = [start for launch, start, _ in kernels if launch >= fetched]
        if before and after:
            waited += max(0.0, min(after) - max(before))
    return waited


def _fold_epoch_start(annotations: list[dict], main_tid: Any, step_ranges: list[Interval]) -> Interval | None:
    """The first step's epoch-start fetch ``(step start, fetch end)``, us, when the step holds an ``epoch start``
    range; the step is moved to start where that fetch ended (``step_ranges`` is changed in place)."""
    start, end = step_ranges[0]
    if not any(
        e["name"] == EPOCH_START and e.get("tid", main_tid) == main_tid and start <= e["ts"] <= end for e in annotations
    ):
        return None
    fetched = _move_past_first_fetch(annotations, main_tid, step_ranges, 0, since=start)
    return None if fetched is None else (start, fetched)


def _find(ranges: Sequence[Interval], starts: Sequence[float], t: float) -> int | None:
    i = bisect.bisect_right(starts, t) - 1
    return i if i >= 0 and t <= ranges[i][1] else None


def _ms(times: dict[str, float], scale: float = 1e-3) -> dict[str, float]:
    """Microseconds (Kineto's unit) to milliseconds, rounded to 0.1 us."""
    return {k: round(v * scale, 4) for k, v in times.items()}


def copy_stats(
    time_ms: float,
    overlapped_ms: float,
    pinned: int,
    pageable: int,
    count: int,
    source: str,
    waited_ms: float | None = None,
) -> dict:
    """The ``copies`` entry of a rank summary.

    ``waited_ms`` is how long the compute stream waited for its input after the host had issued its next work (see
    :func:`input_wait`). A copy that does not overlap compute costs the step nothing when the compute stream had
    nothing to run meanwhile (the host had not issued the step yet, as at a window's start, which the profiler's own
    start drains): ``hidden`` is the share of copy time that did not hold up compute, ``1 - min(waited, not
    overlapped) / time``; without ``waited_ms`` it is the overlap.
    """
    overlap_share = overlapped_ms / time_ms if time_ms > 0 else None
    hidden = overlap_share
    if waited_ms is not None and time_ms > 0:
        hidden = 1.0 - min(waited_ms, time_ms - overlapped_ms) / time_ms
    return {
        "count": count,
        "time_ms": round(time_ms, 4),
        "overlapped_ms": round(overlapped_ms, 4),
        "overlap": round(overlap_share, 4) if overlap_share is not None else None,
        "waited_ms": round(waited_ms, 4) if waited_ms is not None else None,
        "hidden": round(hidden, 4) if hidden is not None else None,
        "pinned": pinned,
        "pageable": pageable,
        "unknown": count - pinned - pageable,
        "source": source,
    }
