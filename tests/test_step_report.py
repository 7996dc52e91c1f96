"""step_report.py: interval arithmetic, phase sums, overlap, stragglers, the verdict, a handcrafted Kineto trace, the
writers (JSON, Markdown, PNG; atomic) and the command line, all with known answers; a real CUDA window under ``-m gpu``.
"""

from __future__ import annotations

import copy
import gzip
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from PIL import Image

import shapes_dataset
import step_report
import trace_summary
from callbacks import ProfilerWindow
from datamodule import ImageNetDataModule
from imagenet_module import ImageNetClassifier
from step_report import build_report, markdown, summary_lines, verdict
from trace_summary import overlap, phase_times, summarize_trace, union


# --- interval arithmetic -----------------------------------------------------------------------------------------
def test_overlap_of_a_copy_with_compute_is_the_shared_part():
    assert overlap([(0, 10)], [(5, 20)]) == (10, 5)  # half the copy overlaps
    assert overlap([(0, 10)], [(20, 30)]) == (10, 0)
    assert overlap([(0, 10)], [(-5, 50)]) == (10, 10)
    # Overlapping cover intervals count once; several copies add up; empty copies are ignored.
    assert overlap([(0, 10), (30, 40), (50, 50)], [(2, 4), (3, 6), (8, 35)]) == (20, 4 + 2 + 5)


def test_union_merges_and_drops_empty_intervals():
    assert union([(5, 7), (0, 2), (1, 3), (7, 9), (4, 4)]) == [(0, 3), (5, 9)]
    assert trace_summary.length([(0, 2), (1, 3), (10, 11)]) == 4


def test_phase_times_sum_to_the_step_with_other_as_the_rest():
    times = phase_times(
        (100.0, 200.0),
        {
            "data": [(100, 110), (140, 145)],  # gradient accumulation: two micro-batches
            "forward": [(110, 130), (145, 160)],
            "backward": [(130, 140), (160, 180)],
            "optimizer": [(182, 198)],
        },
    )
    assert times == {"data": 15, "forward": 35, "backward": 30, "optimizer": 16, "other": 4, "total": 100}
    assert sum(times[p] for p in trace_summary.PHASES) == times["total"]
    # Parts outside the step are clipped, and a missing phase is zero.
    assert phase_times((0, 10), {"data": [(-5, 3)]}) == {
        "data": 3, "forward": 0, "backward": 0, "optimizer": 0, "other": 7, "total": 10,
    }  # fmt: skip


# --- rank summaries, stragglers, verdict ------------------------------------------------------------------------
def rank_summary(rank: int = 0, steps: int = 4, data: float = 0.1, forward: float = 30.0, gpu: bool = True,
                 copies: dict | None = None, busy: float | None = 0.98, lag: float | None = 40.0) -> dict:  # fmt: skip
    """A rank summary of ``steps`` identical 100 ms steps (backward absorbs the rest, like DDP's all-reduce wait)."""
    host = {"data": data, "forward": forward, "backward": 100 - data - forward - 12, "optimizer": 10, "other": 2}
    host["total"] = 100.0
    rows = [
        {"step": 20 + i, "images": 256, "host": dict(host), "gpu": dict(host) if gpu else None, "h2d": 3.0,
         "lag": lag if gpu else None}
        for i in range(steps)
    ]  # fmt: skip
    if copies is None and gpu:
        copies = trace_summary.copy_stats(40.0, 39.84, pinned=4, pageable=0, count=4, source="events")
    return {
        "rank": rank, "device": "cuda:0" if gpu else "cpu", "source": "events" if gpu else "host",
        "window": [20, 20 + steps - 1], "steps": rows, "wall_ms": 100.0 * steps,
        "gpu_busy": busy if gpu else None, "gpu_busy_source": "events" if gpu else None, "copies": copies,
    }  # fmt: skip


def test_gaps_between_steps_of_several_ranks_are_listed_at_the_longest_rank():
    a, b = rank_summary(rank=0), rank_summary(rank=1)
    a["between_steps"] = [{"after_step": 21, "what": "epoch end + checkpoint", "host_ms": 400.0, "first_fetch_ms": 9.0}]
    b["between_steps"] = [{"after_step": 21, "what": "epoch end + checkpoint", "host_ms": 650.0, "first_fetch_ms": 7.0},
                          {"after_step": 22, "what": "checkpoint", "host_ms": 5.0}]  # fmt: skip
    assert build_report([a, b])["overall"]["between_steps"] == [
        {"after_step": 21, "what": "epoch end + checkpoint", "host_ms": 650.0, "first_fetch_ms": 7.0},
        {"after_step": 22, "what": "checkpoint", "host_ms": 5.0},
    ]
    assert build_report([rank_summary()])["overall"]["between_steps"] == []


def test_report_of_a_hidden_prefetch_says_so_in_one_line():
    report = build_report([rank_summary()])
    assert report["verdict"] == (
        "prefetch hidden: 99.6% overlapped, pinned, data wait 0.1%; GPU-bound: the GPU's work sets the pace; faster "
        "kernels: model.compile reduce-overhead (and model.compile_tuning true for a long run)"
    )
    assert report["findings"] == []
    o = report["overall"]
    assert o["images_per_s"] == 2560.0  # 4 x 256 images in 0.4 s
    assert o["step_ms"] == 100.0
    assert o["gpu_pct"] == {"data": 0.1, "forward": 30.0, "backward": 57.9, "optimizer": 10.0, "other": 2.0}
    assert o["copies"]["overlap"] == 0.996
    assert report["stragglers"] == []


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"data": 20.0}, "input-bound: data wait is 20.0% of the step; more data.workers, a pre-resized copy"),
        ({"copies": trace_summary.copy_stats(40, 10, 0, 4, 4, "kineto")}, "copies are pageable (4 of 4): enable pin_m"),
        ({"copies": trace_summary.copy_stats(40, 10, 4, 0, 4, "kineto")}, "copies serialize with compute: 25.0% of"),
        ({"lag": 0.05}, "host-bound: the GPU finishes each step 0.05 ms after the host issues it"),
        ({"lag": 0.05}, "waits for launches; try model.compile reduce-overhead (CUDA graphs: one launch a graph)"),
        ({"gpu": False}, "CPU run: GPU times and copy overlap unavailable; data wait 0.1%"),
    ],
)
def test_verdict_names_what_to_change(kwargs, expected):
    report = build_report([rank_summary(**kwargs)])
    assert expected in report["verdict"], report["verdict"]


def test_an_input_stall_that_leaves_most_of_the_idle_gpu_unexplained_is_host_bound_too():
    """On an H200 a window said only "input-bound: data wait is 5.3%" while the GPU was busy 11.4% of it."""
    starved = rank_summary(data=6.0, busy=0.114) | {"gpu_busy_source": "kineto"}
    findings = build_report([starved])["findings"]
    assert findings[0].startswith("input-bound: data wait is 6.0% of the step")
    assert findings[1].startswith(
        "host-bound too: the GPU is busy 11.4% of the window, and the data wait explains only 6.0% of the step"
    )
    # Busy as far as the data wait explains: the input alone.
    explained = rank_summary(data=6.0, busy=0.87) | {"gpu_busy_source": "kineto"}
    assert [f.split(":")[0] for f in build_report([explained])["findings"]] == ["input-bound"]
    # Serialized copies without a data stall: idle time of their own, not launch overhead.
    serialized = trace_summary.copy_stats(40, 8, 4, 0, 4, "kineto")
    copies_only = rank_summary(busy=0.5, copies=serialized) | {"gpu_busy_source": "kineto"}
    assert [f.split(":")[0] for f in build_report([copies_only])["findings"]] == ["copies serialize with compute"]
    # Pageable copies do not explain an idle GPU: the host-bound finding stays.
    pageable = rank_summary(busy=0.5, copies=trace_summary.copy_stats(40, 39.84, 0, 4, 4, "kineto"))
    findings = build_report([pageable | {"gpu_busy_source": "kineto"}])["findings"]
    assert [f.split(":")[0] for f in findings] == ["copies are pageable (4 of 4)", "host-bound too"]


def test_the_verdict_judges_its_figures_as_it_prints_them():
    assert build_report([rank_summary(data=5.04)])["findings"] == []  # printed "5.0%": not above 5%
    assert build_report([rank_summary(data=5.06)])["findings"][0].startswith("input-bound: data wait is 5.1%")
    almost = rank_summary(busy=0.8996) | {"gpu_busy_source": "kineto"}
    assert build_report([almost])["findings"] == []  # printed "90.0%": not below 90%
    nearly = {"hidden": 0.8996, "overlap": 0.8996}
    copies = trace_summary.copy_stats(40, 36, 4, 0, 4, "kineto", waited_ms=0.5) | nearly
    findings, line = verdict({"cuda": True, "copies": copies,
                              "data_pct_max": 0.0, "input": "prefetcher", "gpu_busy": 0.95})  # fmt: skip
    assert findings == [] and "90.0% overlapped, pinned" in line  # no "compute waited" after a 90.0%
    # From a trace alone, a run without input copies of 64 KiB or more (tiny JPEGs for the GPU decoder) is not said
    # to have its data on the device.
    findings, line = verdict({"cuda": True, "copies": None, "data_pct_max": 0.0, "input": "trace"})
    assert line == "no host-to-device copies of 64 KiB or more in the trace; data wait 0%" and findings == []


def test_a_cpu_run_s_input_stall_is_not_sent_to_the_gpu_decoder():
    """data.decode gpu falls back to the workers on a CPU run: advice that changes nothing there."""
    report = build_report([rank_summary(data=8.0, gpu=False)])
    assert report["verdict"] == (
        "CPU run: input-bound: data wait is 8.0% of the step; more data.workers, a pre-resized copy (resize_dataset.py)"
    )
    assert "data.decode gpu" in build_report([rank_summary(data=8.0)])["verdict"]


def test_with_the_gpu_decoding_an_input_stall_points_at_cpu_cores_not_at_the_gpu_decoder():
    decoded = trace_summary.copy_stats(40.0, 39.84, pinned=0, pageable=0, count=4, source="events")
    stalled, hidden = rank_summary(data=20.0, copies=decoded), rank_summary(copies=decoded)
    stalled["input"] = hidden["input"] = "gpu-decode"
    assert build_report([stalled])["findings"] == [
        "input-bound: data wait is 20.0% of the step; the GPU decode path's host work holds up the training process "
        "(one thread decodes every batch: bench/producer_timing.py times it): raise data.cpu_decode_share while CPU "
        "cores are free, data.nvjpeg preallocated, data.decode_threads 2, or data.decode cpu on a pre-resized copy "
        "(resize_dataset.py)"
    ]
    # With data.decode_threads above 1 (the fewest of the ranks) the advice says how many and leaves the knob out.
    threaded = build_report([stalled | {"decode_threads": 3}, stalled | {"decode_threads": 2}])["findings"][0]
    assert "(2 threads decode the batches: bench/producer_timing.py times them)" in threaded
    assert "decode_threads" not in threaded
    assert build_report([stalled | {"decode_threads": 1}])["findings"] == build_report([stalled])["findings"]
    # With CUDA's 8 hardware queues (on any rank) nvJPEG's calls wait behind the step: that is the first thing to fix.
    for connections in (8, 1):
        few = build_report([stalled | {"device_connections": 32}, stalled | {"device_connections": connections}])
        assert few["findings"][0] == (
            "input-bound: data wait is 20.0% of the step (rank 0); nvJPEG's calls wait behind the training step in "
            f"CUDA's hardware queues (CUDA_DEVICE_MAX_CONNECTIONS={connections}): set CUDA_DEVICE_MAX_CONNECTIONS=32 "
            "before CUDA starts (train.py does unless the environment sets it)"
        )
    assert build_report([stalled | {"device_connections": 32}])["findings"] == build_report([stalled])["findings"]
    assert build_report([hidden])["verdict"].startswith(
        "prefetch hidden: 99.6% overlapped, JPEGs decoded on the GPU, data wait 0.1%; GPU-bound"
    )
    # Launch-bound under the GPU decode: the decode's host work is named first.
    launches = rank_summary(copies=decoded, lag=0.05) | {"input": "gpu-decode"}
    assert build_report([launches])["findings"] == [
        "host-bound: the GPU finishes each step 0.05 ms after the host issues it (of a 100.0 ms step), so it waits "
        "for launches; most likely the GPU decode's host work: raise data.cpu_decode_share while CPU "
        "cores are free, or data.decode cpu on a resize_dataset.py copy; else try model.compile reduce-overhead (CUDA "
        "graphs: one launch a graph) or a larger batch"
    ]
    # The CPU path's stall keeps its own advice; workers decoding with PIL are pointed at the faster decoder first.
    stalled["input"] = "prefetcher"
    assert build_report([stalled])["findings"][0].endswith(
        "; more data.workers, a pre-resized copy (resize_dataset.py) or data.decode gpu"
    )
    for decoder, first in (
        ("torchvision", "more data.workers"),
        ("pil", "data.cpu_decoder torchvision (1.2-1.3x PIL's rate), more data.workers"),
    ):
        finding = build_report([stalled | {"cpu_decoder": decoder}])["findings"][0]
        assert finding.startswith(f"input-bound: data wait is 20.0% of the step; {first}"), finding
        assert finding.endswith("a pre-resized copy (resize_dataset.py) or data.decode gpu")


def test_a_host_that_ran_ahead_waits_for_data_without_stalling_the_gpu():
    """Four 100 ms GPU steps; the host recorded each in less, 30 ms of it waiting for the loader, while the GPU ran
    the steps it had queued (its data phase 0): not input-bound, and the verdict says where the host waited."""
    ahead = rank_summary(data=30.0)
    for row in ahead["steps"]:
        row["gpu"] = {**row["gpu"], "data": 0.0, "backward": row["gpu"]["backward"] + 30.0}
    ahead["wall_ms"], ahead["gpu_wall_ms"] = 200.0, 400.0
    report = build_report([ahead])
    o = report["overall"]
    assert (o["clock"], o["images_per_s"], o["data_pct"], o["host_data_pct_max"]) == ("gpu", 2560.0, 0.0, 30.0)
    assert report["findings"] == []
    assert report["verdict"].startswith(
        "prefetch hidden: 99.6% overlapped, pinned, data wait 0% (the host waited 30.0 ms a step for its batches, "
        "30.0% of the step, while the GPU ran steps it had queued); GPU-bound: "
    )
    # A summary without the GPU's span (written before it was recorded): the rate is the host's, the data wait still
    # what the GPU idled through.
    ahead.pop("gpu_wall_ms")
    report = build_report([ahead])
    assert report["overall"]["clock"] == "host" and report["overall"]["images_per_s"] == 5120.0
    assert report["findings"] == [] and report["overall"]["data_pct"] == 0.0
    # A GPU stalled through the whole fetch: the wait is the host's, on both clocks, and it is the finding.
    stalled = rank_summary(data=30.0) | {"gpu_wall_ms": 400.0}
    assert build_report([stalled])["findings"][0].startswith("input-bound: data wait is 30.0% of the step")
    # Two ranks: the host's largest wait is named with its rank.
    quiet = rank_summary(rank=0, data=0.1) | {"gpu_wall_ms": 400.0}
    busy = copy.deepcopy(ahead) | {"rank": 1, "gpu_wall_ms": 400.0}
    line = build_report([quiet, busy])["verdict"]
    assert "(the host waited 30.0 ms a step on rank 1 for its batches, 30.0% of the step," in line


def test_ranks_on_different_clocks_are_labelled_so():
    with_events = rank_summary(rank=0) | {"gpu_wall_ms": 400.0}
    line = step_report.summary_lines(build_report([with_events, rank_summary(rank=1, gpu=False)]))[1]
    assert "median step 100.00 ms (GPU/host clock; host 100.00 ms)" in line
    line = step_report.summary_lines(build_report([with_events]))[1]
    assert line.startswith("  2560.0 img/s, median step 100.00 ms (GPU clock; host 100.00 ms)")
    assert "(host clock)" in step_report.summary_lines(build_report([rank_summary(rank=1, gpu=False)]))[1]


def test_host_bound_advice_knows_whether_cuda_graphs_are_on_already():
    graphs = [rank_summary(rank=r, lag=0.05) | {"compile": "reduce-overhead"} for r in range(2)]
    findings = build_report(graphs)["findings"]
    assert findings == [
        "host-bound: the GPU finishes each step 0.05 ms after the host issues it (of a 100.0 ms step), so it waits "
        "for launches; a larger batch, or less host work outside the compiled model (CUDA graphs are on already)"
    ]
    # A rank without graphs (or a report from before the mode was recorded): the graphs are the advice.
    graphs[1]["compile"] = "default"
    assert "try model.compile reduce-overhead" in build_report(graphs)["findings"][0]
    assert "try model.compile reduce-overhead" in build_report([rank_summary(lag=0.05)])["findings"][0]


def test_verdict_host_bound_from_an_exact_busy_fraction():
    summary = rank_summary(busy=0.55)
    summary["gpu_busy_source"] = "kineto"
    line = build_report([summary])["verdict"]
    hidden = "prefetch hidden: 99.6% overlapped, pinned, data wait 0.1%"
    assert line.startswith(f"{hidden}; host-bound: the GPU is busy 55.0% of the window with no input stall")
    findings, line = verdict({"cuda": True, "copies": None, "data_pct_max": 0.0, "input": "on-device"})
    assert line == "no host-to-device copies (data already on the device); data wait 0%" and findings == []
    _, line = verdict({"cuda": True, "copies": None, "data_pct_max": 0.0, "input": "other"})
    assert line.startswith("copies not measured (the loader is not a DevicePrefetcher: use profile.torch_profiler)")


def test_the_gpus_busy_fraction_of_several_ranks_is_their_mean():
    # Rank 1's GPU idles half the window: the job's busy fraction is the ranks' mean, 72.5%, and so host-bound
    # (the busiest rank alone, 95%, would hide it).
    ranks = [rank_summary(rank=0, busy=0.95), rank_summary(rank=1, busy=0.5)]
    for summary in ranks:
        summary["gpu_busy_source"] = "kineto"
    report = build_report(ranks)
    assert report["overall"]["gpu_busy"] == 0.725
    assert "host-bound: the GPU is busy 72.5% of the window" in report["verdict"]


@pytest.mark.parametrize(
    ("compile", "tuning", "lever"),
    [
        (None, False, "faster kernels: model.compile reduce-overhead (and model.compile_tuning true for a long run)"),
        ("reduce-overhead", False, "for a long run, model.compile_tuning true (coordinate-descent tuning of the"),
        ("reduce-overhead", True, "(the model is compiled and its kernels tuned)"),
        ("max-autotune", False, "(the model is compiled and its kernels tuned)"),  # the mode includes the tuning
        ("max-autotune-no-cudagraphs", False, "(the model is compiled and its kernels tuned)"),
        ("default", False, "for a long run, model.compile_tuning true"),
    ],
)
def test_a_gpu_bound_window_names_the_kernels_as_the_lever_by_how_the_model_is_compiled(compile, tuning, lever):
    ranks = [
        rank_summary(rank=r, data=0.1 + 0.02 * r) | {"compile": compile, "compile_tuning": tuning} for r in range(2)
    ]
    report = build_report(ranks)
    assert report["findings"] == []  # not a problem: what sets the pace
    # The data wait is the most of any rank's, named as such.
    hidden = "prefetch hidden: 99.6% overlapped, pinned, data wait 0.1% (rank 1's, the most); GPU-bound: "
    assert report["verdict"].startswith(hidden)
    assert lever in report["verdict"].split("; GPU-bound: ")[1]
    # One rank untuned (or from a report that predates the field): the tuning is still the advice.
    ranks[1].pop("compile_tuning")
    if tuning:
        assert "model.compile_tuning true" in build_report(ranks)["verdict"]


@pytest.mark.parametrize(("lag", "gpu_bound"), [(10.0, True), (9.99, False)])
def test_the_gpu_bound_threshold_from_events_is_a_tenth_of_the_step(lag, gpu_bound):
    """From events: the GPU's median lag behind the host at a step's end against a tenth of the median GPU step
    (100 ms here). Below it the window is host-bound instead."""
    line = build_report([rank_summary(lag=lag)])["verdict"]
    assert ("; GPU-bound: " in line) is gpu_bound
    assert ("host-bound" in line) is not gpu_bound


@pytest.mark.parametrize(
    "kwargs",
    [
        {"lag": 0.05},  # host-bound: the GPU waits for launches
        {"data": 20.0},  # input-bound
        {"gpu": False},  # a CPU run
        {"lag": None},  # no GPU lag measured, busy from events (an upper bound): not enough to say
        {"busy": 0.55, "source": "kineto"},  # the exact busy fraction says the GPU idles
    ],
)
def test_no_gpu_bound_note_when_something_else_limits_the_step_or_it_is_unknown(kwargs):
    kwargs = dict(kwargs)
    source = kwargs.pop("source", None)
    summary = rank_summary(**kwargs)
    if source:
        summary["gpu_busy_source"] = source
    assert "GPU-bound" not in build_report([summary])["verdict"]


@pytest.mark.parametrize(("busy", "gpu_bound"), [(0.9, True), (0.95, True), (0.899, False)])
def test_an_exact_busy_fraction_decides_gpu_bound_over_the_lag(busy, gpu_bound):
    summary = rank_summary(busy=busy, lag=0.05)  # the lag alone would read host-bound; Kineto's busy decides
    summary["gpu_busy_source"] = "kineto"
    line = build_report([summary])["verdict"]
    assert ("; GPU-bound: " in line) is gpu_bound
    assert ("host-bound: the GPU is busy" in line) is not gpu_bound


def test_a_straggler_is_named_instead_of_gpu_bound():
    ranks = [rank_summary(rank=r) for r in range(4)]
    ranks[2] = rank_summary(rank=2, data=12.1)
    line = build_report(ranks)["verdict"]
    assert "straggler: rank 2" in line and "GPU-bound" not in line


def test_a_slow_rank_is_flagged_with_the_phase_that_makes_it_slow():
    ranks = [rank_summary(rank=r) for r in range(4)]
    ranks[2] = rank_summary(rank=2, data=12.1)  # 12 ms more data wait; its backward (all-reduce wait) is shorter
    report = build_report(ranks)
    assert [s["rank"] for s in report["stragglers"]] == [2]
    (slow,) = report["stragglers"]
    assert slow["phase"] == "data" and slow["phase_excess_ms"] == pytest.approx(12.0)
    assert slow["excess_ms"] == pytest.approx(12.0) and slow["excess_pct"] == 12.0  # of the 100 ms step
    assert report["overall"]["images_per_s"] == 4 * 2560.0
    assert report["findings"] == [
        "input-bound: data wait is 12.1% of the step (rank 2); more data.workers, a pre-resized copy "
        "(resize_dataset.py) or data.decode gpu",
        "straggler: rank 2 spends 12.00 ms (12.0% of a step) longer than the other ranks outside the synchronized "
        "phases (data +12.00 ms); the others wait for it in forward/backward",
    ]
    # Forward holds DDP's buffer broadcast, where fast ranks wait: not a straggler sign. Below 5% of a step: noise.
    ranks[2] = rank_summary(rank=2, forward=45.0)
    assert build_report(ranks)["stragglers"] == []
    ranks[2] = rank_summary(rank=2, data=4.0)
    assert build_report(ranks)["stragglers"] == []
    # Two ranks: each is compared with the other, so the whole difference counts.
    (slow,) = build_report([rank_summary(rank=0), rank_summary(rank=1, data=6.1)])["stragglers"]
    assert slow["rank"] == 1 and slow["excess_ms"] == pytest.approx(6.0)


# --- Kineto trace ------------------------------------------------------------------------------------------------
def _x(name, cat, ts, dur, tid=1, **args):  # noqa: ANN001, ANN003
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 1, "tid": tid, "args": args}


def _launch(events: list, correlation: int, ts: float, activity: dict, tid: int = 1) -> None:
    """A GPU activity and the runtime call that launched it at ``ts`` on thread ``tid``, tied by ``correlation``."""
    events.append(_x("cudaLaunchKernel", "cuda_runtime", ts, 1, tid=tid, correlation=correlation))
    activity["args"]["correlation"] = correlation
    events.append(activity)


def handmade_trace() -> dict:
    """Two steps (us): step 10 at 0..100, step 11 at 100..200, compute on stream 7, copies on side stream 20."""
    events = [_x("step 10", "user_annotation", 0, 100), _x("step 11", "user_annotation", 100, 100)]
    for base, spans in ((0, (10, 30, 40, 15)), (100, (30, 20, 30, 15))):
        t = base
        for name, dur in zip(("data", "forward", "backward", "optimizer"), spans, strict=True):
            events.append(_x(name, "user_annotation", t, dur))
            t += dur
    launches = [  # (correlation, launch ts, launching thread, activity)
        (1, 5, 1, _x("Memcpy HtoD (Pinned -> Device)", "gpu_memcpy", 5, 20, stream=20)),
        (2, 6, 1, _x("normalize_kernel", "kernel", 25, 5, stream=20)),
        (3, 12, 1, _x("conv_fwd", "kernel", 15, 20, stream=7)),
        (4, 30, 1, _x("bn_fwd", "kernel", 35, 10, stream=7)),
        (5, 42, 2, _x("conv_bwd", "kernel", 45, 30, stream=7)),  # launched from autograd's thread
        (6, 82, 1, _x("sgd", "kernel", 82, 10, stream=7)),
        (11, 93, 1, _x("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy", 93, 1, stream=7, bytes=4)),  # a scalar
        (7, 105, 1, _x("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy", 120, 20, stream=20)),
        (8, 131, 1, _x("conv_fwd", "kernel", 132, 10, stream=7)),
        (9, 151, 2, _x("conv_bwd", "kernel", 152, 20, stream=7)),
        (10, 181, 1, _x("sgd", "kernel", 182, 8, stream=7)),
    ]
    for correlation, ts, tid, activity in launches:
        _launch(events, correlation, ts, activity, tid)
    events.append(_x("step 10", "gpu_user_annotation", 15, 77))  # not a host range: ignored
    events.append(_x("aten::conv2d", "cpu_op", 12, 3))
    return {"traceEvents": events, "distributedInfo": {"rank": 3}}


def test_kineto_trace_gives_known_phases_overlap_and_busy_fraction():
    summary = summarize_trace(handmade_trace(), batch_size=8)
    assert summary["rank"] == 3 and summary["window"] == [10, 11] and summary["source"] == "kineto"
    s10, s11 = summary["steps"]
    assert s10["host"] == {"data": 0.01, "forward": 0.03, "backward": 0.04, "optimizer": 0.015, "other": 0.005,
                           "total": 0.1}  # fmt: skip
    assert s11["host"]["data"] == 0.03 and s11["host"]["total"] == 0.1
    # GPU: data is the wait before the first compute kernel, phases are kernel time, other the rest of the span.
    assert s10["gpu"] == {"data": 0.015, "forward": 0.03, "backward": 0.03, "optimizer": 0.01, "other": 0.007,
                          "total": 0.092}  # fmt: skip
    assert s11["gpu"] == {"data": 0.04, "forward": 0.01, "backward": 0.02, "optimizer": 0.008, "other": 0.02,
                          "total": 0.098}  # fmt: skip
    assert s10["h2d"] == s11["h2d"] == 0.02
    assert s10["images"] == s11["images"] == 8
    copies = summary["copies"]
    assert copies["count"] == 2 and copies["pinned"] == 1 and copies["pageable"] == 1
    # The first copy starts before the trace's first kernel (it may overlap kernels launched before the trace): left
    # out. The second, 120..140 us, overlaps conv_fwd on stream 7 at 132..142 for 8 us.
    assert copies["time_ms"] == 0.02 and copies["overlapped_ms"] == 0.008 and copies["overlap"] == 0.4
    # The first compute kernel after each fetch: step 10's starts at 15, 2 us after its launch call returned (12..13)
    # on an idle stream; step 11's at 132, as its call (131..132) returns.
    assert copies["waited_ms"] == 0.002 and copies["hidden"] == 0.9
    # Without the launch calls in the trace a wait cannot be told from the host's time: none, the overlap judges.
    bare = {"traceEvents": [e for e in handmade_trace()["traceEvents"] if e["cat"] != "cuda_runtime"]}
    bare_copies = summarize_trace(bare, batch_size=8)["copies"]
    assert bare_copies["waited_ms"] is None and bare_copies["hidden"] == bare_copies["overlap"]
    # Kernels on all streams, 15..75, 82..92, 132..142, 152..172, 182..190 = 108 us of the 0..190 us span.
    assert summary["gpu_busy"] == round(108 / 190, 4) and summary["gpu_busy_source"] == "kineto"
    assert summary["wall_ms"] == 0.2
    report = build_report([summary])
    assert report["findings"][0] == "copies are pageable (1 of 2): enable pin_memory in the DataLoader"
    # On the GPU's clock, as with events: per step the smaller of the host's and the GPU's data time (0.01 and 0.03
    # ms) of the GPU's mean step (0.095 ms).
    assert report["ranks"][0]["stats"]["data_clock"] == "gpu"
    assert report["findings"][1].startswith("input-bound: data wait is 21.1% of the step")


def test_a_trace_of_a_host_running_ahead_of_a_busy_gpu_is_not_input_bound():
    # The host records each 50 us step with 30 us of it in the loader; the GPU runs each step's kernels back to back
    # in 100 us. A trace-only report took the host's 60% data time and read "input-bound" for a GPU never waiting
    # after the window's first step.
    events, correlation = [], 1
    for i in range(4):
        host = 50 * i
        events.append(_x(f"step {20 + i}", "user_annotation", host, 50))
        for name, at, dur in (("data", 0, 30), ("forward", 30, 8), ("backward", 38, 8), ("optimizer", 46, 3)):
            events.append(_x(name, "user_annotation", host + at, dur))
        for launched, start, dur in ((31, 0, 40), (39, 40, 50), (47, 90, 10)):
            events.append(_x("cudaLaunchKernel", "cuda_runtime", host + launched, 1, correlation=correlation))
            events.append(_x("kernel", "kernel", 31 + 100 * i + start, dur, stream=7, correlation=correlation))
            correlation += 1
    summary = summarize_trace({"traceEvents": events}, batch_size=8)
    assert [s["gpu"]["data"] for s in summary["steps"]] == [0.031, 0.0, 0.0, 0.0]
    stats = build_report([summary])["ranks"][0]["stats"]
    assert stats["data_clock"] == "gpu" and stats["host"]["pct"]["data"] == 60.0
    assert stats["data_pct"] == pytest.approx(100 * 0.0075 / 0.10775, abs=0.01)  # step 20's 31 us wait alone


def test_decode_kernels_a_producer_thread_launches_during_forward_are_not_compute():
    # data.decode gpu: a producer thread (tid 9) launches a decode kernel on its own stream 30 while forward runs;
    # counted as a compute stream, its time went into forward (the reviewer's 40 us one made step 11's phases sum to
    # 123 us of 100) and copies overlapping it counted as hidden behind compute.
    def trace(producer: bool) -> dict:
        events = []
        for n, base in ((10, 0), (11, 100)):
            events.append(_x(f"step {n}", "user_annotation", base, 100))
            for name, at, dur in (("data", 0, 5), ("forward", 5, 30), ("backward", 35, 45), ("optimizer", 80, 15)):
                events.append(_x(name, "user_annotation", base + at, dur))
        kernels = [(base + launched, base + start, dur, 7, 1) for base in (0, 100)
                   for launched, start, dur in ((6, 8, 30), (36, 38, 45), (81, 83, 12))]  # fmt: skip
        if producer:
            kernels += [(base + 20, base + 21, 10, 30, 9) for base in (0, 100)]
        kernels += [(base + 20, base + 96, 4, 30, 9) for base in (0, 100)]  # after the step's last compute kernel
        kernels += [(base + 2, base + 95, 4, 40, 1) for base in (0, 100)]  # each step's batch copy, stream 40
        for correlation, (launched, start, dur, stream, tid) in enumerate(kernels):
            events.append(_x("cudaLaunchKernel", "cuda_runtime", launched, 1, tid=tid, correlation=correlation))
            if stream == 40:
                events.append(_x("Memcpy HtoD (Pinned -> Device)", "gpu_memcpy", start, dur, stream=stream,
                                 correlation=correlation, bytes=1 << 20))  # fmt: skip
            else:
                events.append(_x("kernel", "kernel", start, dur, stream=stream, correlation=correlation))
        return {"traceEvents": events}

    plain, decoding = (summarize_trace(trace(p), batch_size=8) for p in (False, True))
    assert decoding["steps"][1]["gpu"] == plain["steps"][1]["gpu"]
    assert decoding["steps"][1]["gpu"]["forward"] == 0.03
    # The copies (95..99 us of each step) overlap no compute kernel (the last ends at 95), only the decode ones.
    assert decoding["copies"]["overlap"] == plain["copies"]["overlap"] == 0.0


def test_a_report_from_some_ranks_traces_says_how_many_ranks_the_run_had():
    # profile.ranks [0] on 8 GPUs: one trace; its images/s is that rank's, not "all ranks" of the run.
    trace = handmade_trace()
    trace["distributedInfo"] = {"rank": 0, "world_size": 8}
    report = build_report([summarize_trace(trace, batch_size=8)])
    assert report["overall"]["run_world_size"] == 8 and report["world_size"] == 1
    lines = summary_lines(report)
    assert lines[0].endswith(", 1 of 8 rank(s) (the others not traced):") and "img/s (of those ranks)" in lines[1]
    text = markdown(report)
    assert "| ranks | 1 of 8 rank(s) (the others not traced) |" in text and "| images/s (these ranks, " in text
    # Every rank's trace: the run's ranks, as before.
    trace["distributedInfo"] = {"rank": 0, "world_size": 1}
    report = build_report([summarize_trace(trace, batch_size=8)])
    assert report["overall"]["run_world_size"] is None and summary_lines(report)[0].endswith(", 1 rank(s):")
    assert "| images/s (all ranks, " in markdown(report)


def test_identical_ranks_on_different_clocks_are_no_stragglers():
    # Hosts that ran ahead: 30 ms of host data a step, none on the GPU. One step of rank 1 without GPU times (a
    # Kineto step with no kernel attributed) left it on the host's clock; its host data against rank 0's GPU data
    # made it a straggler "+30%" with "data +0.00 ms".
    ranks = []
    for r in range(2):
        summary = rank_summary(rank=r, data=30.0) | {"gpu_wall_ms": 400.0}
        for row in summary["steps"]:
            row["gpu"] = {**row["gpu"], "data": 0.0, "backward": row["gpu"]["backward"] + 30.0}
        ranks.append(summary)
    ranks[1]["steps"][-1]["gpu"] = None
    assert build_report(ranks)["stragglers"] == []


@pytest.mark.parametrize("epoch_start", [False, True])
def test_a_trace_counts_the_gpus_wait_at_every_micro_batchs_fetch(epoch_start):
    # Two micro-batches a step: the second fetch (host 20..30 us) held the compute stream idle from 25 (the first
    # micro-batch's last kernel) to 40 (the first kernel launched after the fetch). With the window opening at an
    # epoch's start, the first fetch (0..5) is moved out of the step, which then starts at 5: the second fetch's wait
    # was taken for the first one's and left out.
    events = [_x("step 5", "user_annotation", 0, 60)] + [_x("epoch start", "user_annotation", 0, 5)] * epoch_start
    for name, at, dur in (("data", 0, 5), ("forward", 5, 5), ("backward", 10, 10), ("data", 20, 10),
                          ("forward", 30, 5), ("backward", 35, 10), ("optimizer", 45, 5)):  # fmt: skip
        events.append(_x(name, "user_annotation", at, dur))
    for correlation, (launched, start, dur) in enumerate(((6, 6, 9), (11, 15, 10), (31, 40, 5), (36, 45, 10),
                                                          (46, 55, 3))):  # fmt: skip
        events.append(_x("cudaLaunchKernel", "cuda_runtime", launched, 1, correlation=correlation))
        events.append(_x("kernel", "kernel", start, dur, stream=7, correlation=correlation))
    (row,) = summarize_trace({"traceEvents": events}, batch_size=8)["steps"]
    # Before the first kernel (from the step's start, 0 or 5 us), and at the second fetch.
    assert row["gpu"]["data"] == pytest.approx((0.001 if epoch_start else 0.006) + 0.015)
    assert sum(row["gpu"][p] for p in ("data", "forward", "backward", "optimizer", "other")) == pytest.approx(
        row["gpu"]["total"]
    )


def test_a_backlog_queued_before_the_trace_belongs_to_no_step():
    """The host ran ahead before the window: when the trace began, the GPU still ran a kernel launched earlier (its
    launch call is not in the trace), until 12 us. Step 10 starts on the GPU when it is done, as events would see it."""
    trace = handmade_trace()
    trace["traceEvents"].append(_x("conv_bwd", "kernel", 2, 10, stream=7, correlation=99))  # no launch in the trace
    summary = summarize_trace(trace, batch_size=8)
    s10, s11 = summary["steps"]
    assert s10["gpu"] == {"data": 0.003, "forward": 0.03, "backward": 0.03, "optimizer": 0.01, "other": 0.007,
                          "total": 0.08}  # fmt: skip
    assert s11["gpu"]["total"] == 0.098  # unchanged
    assert summary["gpu_wall_ms"] == 0.178  # 12..190 us, not 0..190
    assert summary["gpu_busy"] == round(108 / 178, 4)  # the backlog's kernel is not the window's work
    # Without launch calls in the trace neither the backlog nor a step's kernels can be placed: no GPU clock (a host
    # that ran ahead had its kernels counted in no step, and the rate read twice the true one), GPU busy only.
    bare = summarize_trace({"traceEvents": [e for e in trace["traceEvents"] if e["cat"] != "cuda_runtime"]}, 8)
    assert bare["gpu_wall_ms"] is None and [s["gpu"] for s in bare["steps"]] == [None, None]
    assert bare["gpu_busy"] is not None
    stats = build_report([bare])["ranks"][0]["stats"]
    assert stats["clocks"] == ["host"] and stats["clock"] == "host"


def test_input_wait_is_what_the_first_kernel_after_a_fetch_waits_beyond_its_launch_and_the_work_before_it():
    compute = [(0.0, 40.0), (40.0, 50.0), (70.0, 90.0), (80.0, 85.0), (94.0, 99.0), (130.0, 140.0)]
    # (start, launch call start, launch call end); the first kernel's launch is not in the trace. 70 and 80 are one
    # CUDA graph's kernels: one launch.
    launched = [(40.0, 20.0, 21.0), (70.0, 55.0, 56.0), (80.0, 55.0, 56.0), (94.0, 94.0, 94.0), (130.0, 120.0, 121.0)]
    # Fetch ends at 50: the next launch (55..56) finds the stream idle (the work before it ended at 50); its first
    # kernel starts at 70: 14 us on the input. Fetch ends at 100: launched 120..121, idle since 99, started 130: 9 us.
    assert trace_summary.input_wait(compute, launched, [50.0]) == 14.0
    assert trace_summary.input_wait(compute, launched, [50.0, 100.0]) == 23.0
    # A kernel that starts when the work queued before it ends (fetch 10: launched at 20, ran at 40 after the kernel
    # before it) or as soon as its launch returns (fetch 90: 94) waited for nothing.
    assert trace_summary.input_wait(compute, launched, [10.0, 90.0]) == 0.0
    assert trace_summary.input_wait(compute, launched, [200.0]) == 0.0  # no kernel after the fetch
    assert trace_summary.input_wait(compute, [], [50.0]) is None  # no launch in the trace: unknown


def test_a_copy_that_holds_up_compute_is_judged_by_what_compute_waited():
    # 40 ms of copies, 10 overlapped: serialized when compute waited for most of the rest, hidden when it did not.
    held = trace_summary.copy_stats(40, 10, 4, 0, 4, "events", waited_ms=25.0)
    assert held["hidden"] == 0.375
    line = build_report([rank_summary(copies=held)])["verdict"]
    assert "serialize with compute: 25.0% of H2D time overlaps compute kernels and compute waited 25.00 ms for" in line
    free = trace_summary.copy_stats(40, 10, 4, 0, 4, "events", waited_ms=0.5)
    report = build_report([rank_summary(copies=free)])
    assert free["hidden"] == 0.9875 and report["findings"] == []
    assert report["verdict"].startswith(
        "prefetch hidden: 25.0% overlapped, compute waited 0.50 ms for input, pinned, data wait 0.1%; GPU-bound"
    )
    # Over ranks the waits add up; a rank summary without one (an older report) judges the overlap alone.
    two = build_report([rank_summary(rank=0, copies=free), rank_summary(rank=1, copies=held)])["overall"]["copies"]
    assert two["waited_ms"] == 25.5 and two["hidden"] == pytest.approx(1 - 25.5 / 80, abs=1e-4)
    old = {k: v for k, v in free.items() if k not in ("waited_ms", "hidden")}
    assert build_report([rank_summary(copies=old)])["overall"]["copies"]["hidden"] == 0.25


def test_kineto_trace_with_validation_and_an_epoch_end_between_steps_leaves_the_gap_out():
    """Step 10 at 0..100 us; validation (a kernel 150..250), the epoch's end and a save at 100..400; step 11 at
    400..700, whose first fetch waits for the loader until 600 and copies a batch (launched at 590)."""
    events = [_x("step 10", "user_annotation", 0, 100), _x("step 11", "user_annotation", 400, 300)]
    ranges = [("data", 0, 10), ("forward", 10, 30), ("backward", 40, 40), ("optimizer", 80, 15),
              ("validation", 100, 200), ("epoch end", 300, 100), ("checkpoint", 310, 80),
              ("data", 400, 200), ("forward", 600, 30), ("backward", 630, 30), ("optimizer", 660, 30)]  # fmt: skip
    events += [_x(name, "user_annotation", ts, dur) for name, ts, dur in ranges]
    launches = [  # (correlation, launch ts, activity)
        (1, 12, _x("conv_fwd", "kernel", 15, 20, stream=7)),
        (2, 42, _x("conv_bwd", "kernel", 45, 30, stream=7)),
        (3, 82, _x("sgd", "kernel", 82, 10, stream=7)),
        (4, 150, _x("conv_fwd", "kernel", 150, 100, stream=7)),  # validation
        (5, 590, _x("Memcpy HtoD (Pinned -> Device)", "gpu_memcpy", 590, 10, stream=20)),  # in the first fetch
        (6, 601, _x("conv_fwd", "kernel", 602, 20, stream=7)),
        (7, 605, _x("Memcpy HtoD (Pinned -> Device)", "gpu_memcpy", 605, 10, stream=20)),
        (8, 631, _x("conv_bwd", "kernel", 632, 20, stream=7)),
        (9, 661, _x("sgd", "kernel", 662, 10, stream=7)),
    ]
    for launch in launches:
        _launch(events, *launch)
    summary = summarize_trace({"traceEvents": events}, batch_size=8)
    # The gap: 100..600 us on the host, the 200 us fetch included; the window's wall time is the rest.
    assert summary["between_steps"] == [{"after_step": 10, "what": "validation + epoch end + checkpoint",
                                         "host_ms": 0.5, "first_fetch_ms": 0.2}]  # fmt: skip
    assert summary["wall_ms"] == 0.2
    s10, s11 = summary["steps"]
    assert s11["host"] == {"data": 0.0, "forward": 0.03, "backward": 0.03, "optimizer": 0.03, "other": 0.01,
                           "total": 0.1}  # fmt: skip
    # Step 11 on the GPU starts when the host started it (600 us), not at step 10's last kernel (92 us).
    assert s11["gpu"]["data"] == 0.002 and s11["gpu"]["total"] == 0.072
    # Busy over 0..672 us less the gap 92..600: kernels 20 + 30 + 10 + 20 + 20 + 10 us of 164 (validation's left out).
    assert summary["gpu_busy"] == round(110 / 164, 4)
    # The copy launched in the gap is the gap's; the other overlaps conv_fwd entirely.
    copies = summary["copies"]
    assert copies["count"] == 1 and copies["time_ms"] == 0.01 and copies["overlap"] == 1.0
    assert s11["h2d"] == 0.01 and s10["h2d"] is None  # no copy issued in step 10: none, as events say
    # The same from the report: the gap is listed, the verdict judges the steps.
    report = build_report([summary])
    assert report["overall"]["between_steps"] == summary["between_steps"]
    # Images/s on the GPU's clock (the 164 us above); the host recorded the two steps in 200 us.
    assert summary["gpu_wall_ms"] == 0.164 and report["overall"]["clock"] == "gpu"
    assert report["overall"]["images_per_s"] == pytest.approx(16 / 0.000164, rel=1e-3)
    assert report["ranks"][0]["stats"]["host_images_per_s"] == pytest.approx(16 / 0.0002, rel=1e-3)


def test_kineto_trace_after_a_gap_the_gpu_step_starts_when_the_gaps_own_work_is_done():
    """Step 1 at 0..100 us; validation at 100..200 launches a kernel the GPU runs until 500; step 2 (200..300) launches
    nothing; step 3 (300..600) launches kernels that run from 500, and a copy that overlaps only validation's kernel."""
    ranges = [("step 1", 0, 100), ("data", 0, 10), ("forward", 10, 30), ("backward", 40, 40), ("optimizer", 80, 15),
              ("validation", 100, 100),
              ("step 2", 200, 100), ("data", 200, 10), ("forward", 210, 40), ("backward", 250, 40),
              ("step 3", 300, 300), ("data", 300, 10), ("forward", 310, 90), ("backward", 400, 100),
              ("optimizer", 500, 90)]  # fmt: skip
    events = [_x(name, "user_annotation", ts, dur) for name, ts, dur in ranges]
    launches = [
        (1, 12, _x("conv_fwd", "kernel", 15, 20, stream=7)),
        (2, 42, _x("conv_bwd", "kernel", 45, 30, stream=7)),
        (3, 82, _x("sgd", "kernel", 82, 10, stream=7)),
        (4, 150, _x("conv_fwd", "kernel", 150, 350, stream=7)),  # validation, still running at 500
        (5, 312, _x("conv_fwd", "kernel", 500, 20, stream=7)),
        (6, 312, _x("Memcpy HtoD (Pinned -> Device)", "gpu_memcpy", 320, 20, stream=20)),
        (7, 402, _x("conv_bwd", "kernel", 520, 20, stream=7)),
        (8, 502, _x("sgd", "kernel", 540, 10, stream=7)),
    ]
    for launch in launches:
        _launch(events, *launch)
    summary = summarize_trace({"traceEvents": events})
    assert summary["between_steps"] == [{"after_step": 1, "what": "validation", "host_ms": 0.1}]
    s1, s2, s3 = summary["steps"]
    assert s2["gpu"] is None
    # Not from step 1's last kernel (92 us) nor from the host's start (300 us): from the end of validation's kernel.
    assert s3["gpu"]["data"] == 0.0 and s3["gpu"]["total"] == 0.05
    # Busy over 0..550 us less the gap 92..500: 60 + 50 us of kernels in 142 us.
    assert summary["gpu_busy"] == round(110 / 142, 4)
    # The copy overlaps only the gap's kernel: not hidden behind the steps' compute.
    assert summary["copies"]["count"] == 1 and summary["copies"]["overlap"] == 0.0


def test_trace_between_step_range_names_are_the_apps():
    import callbacks.ranges
    import trace_summary

    names = (callbacks.ranges.VALIDATION, callbacks.ranges.EPOCH_END, callbacks.ranges.CHECKPOINT)
    assert trace_summary.BETWEEN_STEPS == names and trace_summary.EPOCH_END == callbacks.ranges.EPOCH_END
    assert trace_summary.EPOCH_START == callbacks.ranges.EPOCH_START


def test_trace_without_step_ranges_is_refused():
    with pytest.raises(ValueError, match="no 'step N' ranges"):
        summarize_trace({"traceEvents": [_x("conv", "kernel", 0, 5, stream=7)]})


# --- writers and command line ------------------------------------------------------------------------------------
def test_write_report_writes_json_markdown_and_a_valid_png_atomically(tmp_path):
    ranks = [rank_summary(rank=0), rank_summary(rank=1, data=12.1)]
    report = build_report(ranks)
    paths = step_report.write_report(report, tmp_path / "step_report")
    assert [p.name for p in paths] == ["window_20-23.json", "window_20-23.md", "window_20-23.png"]
    assert json.loads(paths[0].read_text())["verdict"] == report["verdict"]
    text = paths[1].read_text()
    assert report["verdict"] in text and "| 1 | host |" in text and "## Ranks" in text
    assert "| rank | img/s (host clock) | step ms (host) |" in text and "host data ms" in text
    assert "Images/s and the median step are on the GPU's clock when CUDA events" in text
    data = paths[2].read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000
    with Image.open(paths[2]) as image:
        image.load()
        assert image.format == "PNG" and image.size[0] == 960
        colors = {c for _, c in image.getcolors(1 << 16)}
    assert (214, 39, 40) in colors and (31, 119, 180) in colors  # data and forward bars are drawn
    assert sorted(p.name for p in (tmp_path / "step_report").iterdir()) == sorted(p.name for p in paths)  # no temps


def test_a_report_file_that_fails_to_be_written_leaves_the_old_one_whole(tmp_path, monkeypatch):
    step_report.write_report(build_report([rank_summary()]), tmp_path, "w")
    png = (tmp_path / "w.png").read_bytes()
    monkeypatch.setattr(step_report, "render_png", lambda report: "not bytes: the write fails midway")
    with pytest.raises(TypeError):
        step_report.write_report(build_report([rank_summary(data=20.0)]), tmp_path, "w")
    assert (tmp_path / "w.png").read_bytes() == png
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.json", "w.md", "w.png"]  # no temporary left


def test_command_line_reports_every_window_of_a_run_folder(tmp_path, capsys):
    traces = tmp_path / "run" / "traces"
    traces.mkdir(parents=True)
    (tmp_path / "run" / "config.yaml").write_text("data:\n  batch_size: 8\n  workers: 4\n")
    (traces / "rank0_steps10-11.pt.trace.json").write_text(json.dumps(handmade_trace()))
    with gzip.open(traces / "rank1_steps10-11.pt.trace.json.gz", "wt") as handle:
        json.dump(handmade_trace(), handle)
    assert step_report.main([str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "steps 10-11, 2 rank(s)" in out and "verdict: copies are pageable (2 of 4)" in out
    assert f"from: {traces / 'rank0_steps10-11.pt.trace.json'}, {traces / 'rank1_steps10-11.pt.trace.json.gz'}" in out
    report = json.loads((tmp_path / "run" / "step_report" / "window_10-11.kineto.json").read_text())
    assert [r["rank"] for r in report["ranks"]] == [0, 1]
    assert report["ranks"][0]["steps"][0]["images"] == 8  # from the run's config.yaml
    # Now the folder also holds a report: the command prints it too (reports made from traces are not re-read).
    written = tmp_path / "run" / "step_report" / "window_10-11.json"
    written.write_text(json.dumps(build_report([rank_summary()])))
    assert step_report.main([str(tmp_path / "run"), "--out", str(tmp_path / "elsewhere")]) == 0
    out = capsys.readouterr().out
    assert "steps 20-23" in out and f"from: {written}" in out
    assert (tmp_path / "elsewhere" / "window_10-11.kineto.png").is_file()
    # The step_report folder itself, as a user reaches for it: its report is printed (its trace's report not re-read).
    assert step_report.main([str(tmp_path / "run" / "step_report")]) == 0
    out = capsys.readouterr().out
    assert f"from: {written}" in out and "steps 10-11" not in out
    (tmp_path / "empty").mkdir()
    assert step_report.main([str(tmp_path / "empty")]) == 1
    assert "no Kineto traces (*.pt.trace.json[.gz]) or step reports" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="neither a run folder"):
        step_report.main([str(tmp_path / "run" / "config.yaml")])


def test_a_trace_given_twice_counts_once_and_a_copy_of_it_is_refused(tmp_path, capsys):
    """A folder and a trace in it, or a trace beside its gzipped copy, read as two ranks: "2 rank(s)", twice the
    img/s."""
    traces = tmp_path / "run" / "traces"
    traces.mkdir(parents=True)
    trace = traces / "rank0_steps10-11.pt.trace.json"
    trace.write_text(json.dumps(handmade_trace()))
    assert step_report.main([str(tmp_path / "run"), str(trace), "--batch-size", "8"]) == 0
    assert "steps 10-11, 1 rank(s)" in capsys.readouterr().out
    with gzip.open(traces / "rank0_steps10-11.pt.trace.json.gz", "wt") as handle:
        json.dump(handmade_trace(), handle)
    with pytest.raises(SystemExit, match=r"rank0_steps10-11.pt.trace.json and .*\.gz are both rank 0's trace of steps "
                                         r"10-11 .*pass one of them"):  # fmt: skip
        step_report.main([str(tmp_path / "run")])


@pytest.mark.parametrize(
    ("name", "content", "said"),
    [
        ("rank0_steps1-2.pt.trace.json", "[]", "not a Kineto trace: a JSON list"),
        ("rank0_steps1-2.pt.trace.json.gz", None, "cut short"),
        ("rank0_steps1-2.pt.trace.json.gz", b"damaged", "a damaged gzip file"),
        ("rank0_steps1-2.pt.trace.json", '{"traceEvents": [{"ph": "X", "name": "step 1", "cat": "user_annotation", '
         '"ts": "0", "dur": 5}]}', "rank0_steps1-2.pt.trace.json: "),
        ("window_1-2.json", '{"foo": 1}', "window_1-2.json: not a step report (KeyError"),
        ("window_1-2.json", "not json", "window_1-2.json: not a step report (JSONDecodeError"),
    ],
)  # fmt: skip
def test_a_file_that_is_not_a_trace_or_a_report_is_named_in_one_line(tmp_path, name, content, said):
    path = tmp_path / name
    packed = gzip.compress(json.dumps(handmade_trace()).encode())
    if content is None:  # a gzipped trace cut short
        path.write_bytes(packed[:200])
    elif isinstance(content, bytes):  # a damaged block
        path.write_bytes(packed[:10] + b"\xff" * 8 + packed[18:])
    else:
        path.write_text(content)
    with pytest.raises(SystemExit) as stopped:
        step_report.main([str(path), "--out", str(tmp_path / "out")])
    assert str(stopped.value).startswith("step_report: ") and said in str(stopped.value)
    assert not (tmp_path / "out").exists()


def test_the_png_wraps_a_long_verdict_instead_of_cutting_it():
    import report_render

    report = build_report([rank_summary()])
    heights = []
    for verdict_text in ("short", "x " * 200):  # one line, then three of at most 150 characters
        with Image.open(io.BytesIO(report_render.render_png({**report, "verdict": verdict_text}))) as image:
            heights.append(image.size[1])
    assert heights[1] == heights[0] + 2 * 14


def test_report_survives_json_round_trip_and_rank_order():
    ranks = [rank_summary(rank=1), rank_summary(rank=0)]
    report = build_report(copy.deepcopy(ranks))
    assert [r["rank"] for r in report["ranks"]] == [0, 1]
    assert json.loads(json.dumps(report)) == report
    assert step_report.summary_lines(report)[0] == "step report, steps 20-23, 2 rank(s):"


# --- GPU ---------------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("torch_profiler", [False, True])
def test_gpu_window_reports_gpu_times_pinned_copies_and_overlap(tmp_path: Path, torch_profiler: bool):
    # 1000 images, 15 batches an epoch: the prefetcher copies two batches ahead, so every window step issues a copy.
    root = shapes_dataset.generate(tmp_path / "shapes", train_per_class=100, val_per_class=2, image_size=80)
    data = ImageNetDataModule(root=str(root), batch_size=64, workers=4, crop_size=160, channels_last=True)
    model = ImageNetClassifier(arch="resnet50", num_classes=10, batch_size=64, channels_last=True)
    window = ProfilerWindow(start_step=3, num_steps=3, torch_profiler=torch_profiler)
    trainer = pl.Trainer(accelerator="gpu", devices=1, precision="bf16-mixed", max_steps=20, limit_val_batches=0,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         default_root_dir=str(tmp_path / "run"), callbacks=[window])  # fmt: skip
    trainer.fit(model, data)
    (report,) = window.reports
    print("\n".join(step_report.summary_lines(report)))
    (rank,) = report["ranks"]
    assert [s["step"] for s in rank["steps"]] == [3, 4, 5]
    for s in rank["steps"]:
        assert s["images"] == 64 and s["gpu"]["total"] > 0 and s["gpu"]["backward"] > 0 and s["lag"] is not None
        assert sum(s["gpu"][p] for p in trace_summary.PHASES) == pytest.approx(s["gpu"]["total"], abs=1e-3)
        assert s["h2d"] is not None and s["h2d"] > 0
    copies = report["overall"]["copies"]
    assert copies["count"] >= 3 and copies["pinned"] == copies["count"] and copies["pageable"] == 0
    assert 0.0 <= copies["overlap"] <= copies["hidden"] <= 1.0 and copies["waited_ms"] >= 0.0
    assert 0.0 < report["overall"]["gpu_busy"] <= 1.0
    assert rank["source"] == ("events+kineto" if torch_profiler else "events")
    assert copies["source"] == ("kineto" if torch_profiler else "events")
    assert sorted(p.name for p in (tmp_path / "run" / "step_report").iterdir()) == [
        "window_3-5.json", "window_3-5.md", "window_3-5.png",
    ]  # fmt: skip
    if torch_profiler:  # the GPU as the window recorded it in the trace, and as Kineto did (the kernels' device)
        (trace,) = window.trace_files
        loaded = trace_summary.load_trace(trace)
        assert trace_summary.recorded_setup(loaded) == rank["setup"]
        assert rank["setup"]["device_name"] == torch.cuda.get_device_name(0)
        assert trace_summary.kineto_setup(loaded)["device_name"] == torch.cuda.get_device_name(0)


class _MatmulChain(pl.LightningModule):
    """A step of few, long kernels (matmuls of width 4096): the host enqueues it in a fraction of its GPU time."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(*(torch.nn.Linear(4096, 4096) for _ in range(12)))

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        x = torch.ones(len(batch), 4096, device=self.device)
        return self.layers(x).float().square().mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-6)


class _SlowBatches(torch.utils.data.Dataset):
    """Batches of 4096 rows, each fetched in 15 ms: a loader the host waits for, far faster than the GPU's step."""

    def __len__(self) -> int:
        return 20

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(0.015)
        return torch.zeros(4096, 1)


class _DrainAfter(pl.Callback):
    """Synchronizes at the end of the step before ``step``: the empty queue that opening a window under nsys leaves.
    (Step ``step``'s window opens at its fetch, before any hook of that step.)"""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: pl.Trainer, *args: object) -> None:
        if trainer.global_step == self.step:  # counted up already: the step before ``step`` just ended
            torch.cuda.synchronize()


@pytest.mark.gpu
def test_gpu_window_after_a_drained_queue_reports_the_gpus_rate_not_the_hosts(tmp_path: Path):
    # The reference: the same step timed on its own, with the queue drained around each one (after warm-up steps).
    model = _MatmulChain().cuda()
    opt = model.configure_optimizers()
    times = []
    for _ in range(7):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        model.training_step(torch.zeros(4096, 1), 0).backward()
        opt.step()
        opt.zero_grad()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    alone = sorted(times[2:])[2]
    window = ProfilerWindow(start_step=4, num_steps=8)
    loader = torch.utils.data.DataLoader(_SlowBatches(), batch_size=None, pin_memory=True)
    trainer = pl.Trainer(accelerator="gpu", devices=1, max_steps=14, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(tmp_path),
                         callbacks=[_DrainAfter(4), window])  # fmt: skip
    trainer.fit(model, loader)
    (report,) = window.reports
    print("\n".join(step_report.summary_lines(report)), f"\nthe step alone: {alone:.2f} ms")
    o = report["overall"]
    assert [s["step"] for s in report["ranks"][0]["steps"]] == list(range(4, 12))
    assert o["clock"] == "gpu"
    assert o["host_step_ms"] < 0.5 * o["step_ms"], "the host did not run ahead: the test's premise failed"
    assert o["step_ms"] == pytest.approx(alone, rel=0.2)
    assert o["images_per_s"] == pytest.approx(4096 / (alone / 1000), rel=0.2)
    assert report["ranks"][0]["stats"]["host_images_per_s"] > 1.5 * o["images_per_s"]
    # The host waited 15 ms a step for the loader (on its own clock well over 5%: input-bound, as the report said
    # before); the GPU idled through the fetch only at the window's first step, right after the drain.
    assert report["ranks"][0]["stats"]["host"]["pct"]["data"] > 20
    assert o["data_pct"] < 5 and "input-bound" not in report["verdict"]
    assert "for its batches" in report["verdict"]


@pytest.mark.gpu
@pytest.mark.slow
def test_two_gpu_ddp_report_holds_both_ranks_with_gpu_times(tmp_path: Path):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA devices")
    # 2000 images, 15 batches per rank and epoch: the window (steps 5-8) stays inside the first epoch.
    root = shapes_dataset.generate(tmp_path / "shapes", train_per_class=200, val_per_class=2, image_size=80)
    repo = Path(__file__).resolve().parent.parent
    cmd = [
        sys.executable, "train.py", "fit", "--data.root", str(root), "--data.workers", "4",
        "--data.batch_size", "64", "--data.crop_size", "160", "--model.arch", "resnet50",
        "--model.channels_last", "true", "--trainer.precision", "bf16-mixed", "--trainer.accelerator", "gpu",
        "--trainer.devices", "2", "--trainer.strategy", "ddp", "--trainer.max_steps", "30",
        "--trainer.limit_val_batches", "0", "--trainer.enable_progress_bar", "false",
        "--trainer.default_root_dir", str(tmp_path), "--trainer.logger.init_args.save_dir", str(tmp_path),
        "--profile.start_step", "5", "--profile.num_steps", "4",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=repo, env=dict(os.environ), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (path,) = tmp_path.rglob("step_report/window_5-8.json")
    report = json.loads(path.read_text())
    print("\n".join(step_report.summary_lines(report)))
    assert report["world_size"] == 2 and [r["rank"] for r in report["ranks"]] == [0, 1]
    for rank in report["ranks"]:
        assert rank["device"] == f"cuda:{rank['rank']}" and [s["step"] for s in rank["steps"]] == [5, 6, 7, 8]
        assert all(s["gpu"]["total"] > 0 and s["images"] == 64 for s in rank["steps"])
        assert rank["copies"]["pinned"] == rank["copies"]["count"] >= 4 and 0 <= rank["copies"]["overlap"] <= 1
    assert report["overall"]["images_per_s"] > 0 and path.with_suffix(".png").stat().st_size > 1000


def test_a_rank_without_steps_and_the_rank_of_the_largest_data_wait(tmp_path: Path):
    with_steps = [
        {"rank": r, "device": "cpu", "source": "host", "window": [0, 1], "wall_ms": 20.0, "gpu_busy": None,
         "gpu_busy_source": None, "copies": None, "input": "prefetcher",
         "steps": [{"step": i, "images": 4, "host": {"data": data, "forward": 4.0, "backward": 4.0, "optimizer": 1.0,
                                                    "other": 1.0 - data, "total": 10.0}, "gpu": None, "h2d": None,
                    "lag": None} for i in range(2)]}
        for r, data in ((1, 0.5), (2, 0.9))
    ]  # fmt: skip
    empty = {**with_steps[0], "rank": 0, "steps": [], "wall_ms": 0.0}  # its only step never ended
    report = build_report([empty, *with_steps])
    assert report["ranks"][0]["stats"]["step_ms"] is None
    assert report["overall"]["data_pct_max"] == 9.0 and report["overall"]["data_pct_max_rank"] == 2
    assert report["stragglers"] == []
    assert [p.suffix for p in step_report.write_report(report, tmp_path)] == [".json", ".md", ".png"]


def test_what_kineto_records_of_the_gpu_and_the_world_size_is_read_as_settings():
    """A trace without the window's settings (another tool's, or an older version's): the GPU its kernels ran on and
    the world size, from Kineto's own metadata, under a live report's names; nothing where the trace does not tell."""
    trace = handmade_trace()
    trace["deviceProperties"] = [{"id": 0, "name": "NVIDIA H200"}, {"id": 1, "name": "NVIDIA H100 80GB HBM3"}]
    trace["distributedInfo"] = {"backend": "nccl", "rank": 1, "world_size": 2}
    for event in trace["traceEvents"]:
        if event.get("cat") == "kernel":
            event["args"]["device"] = 1
    assert trace_summary.recorded_setup(trace) is None
    assert trace_summary.kineto_setup(trace) == {"device_name": "NVIDIA H100 80GB HBM3", "world_size": 2}
    for event in trace["traceEvents"]:  # kernels that name no device: two models seen, none said
        event.get("args", {}).pop("device", None)
    assert trace_summary.kineto_setup(trace) == {"world_size": 2}
    trace["deviceProperties"] = [{"id": 0, "name": "NVIDIA H200"}, {"id": 1, "name": "NVIDIA H200"}]
    del trace["distributedInfo"]
    assert trace_summary.kineto_setup(trace) == {"device_name": "NVIDIA H200"}
    assert trace_summary.kineto_setup({"deviceProperties": [], "traceEvents": []}) == {}  # a CPU trace
    trace[trace_summary.SETUP_KEY] = {"model.arch": "resnet50", "world_size": 8}
    assert trace_summary.recorded_setup(trace) == {"model.arch": "resnet50", "world_size": 8}


@pytest.mark.parametrize("value", ["-4", "0", "2.5", "abc"])
def test_a_batch_size_that_is_no_count_of_images_is_refused(tmp_path, capsys, value):
    """``--batch-size -4`` printed a negative images/s and exited 0, and 0 gave n/a: refused, naming the option."""
    with pytest.raises(SystemExit) as exit_info:
        step_report.main([str(tmp_path), "--batch-size", value])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --batch-size: images per micro-batch per rank, a whole number >= 1, got '{value}'" in err
