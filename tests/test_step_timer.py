"""StepTimer and ProfilerWindow's step report: known-answer timings (host clock and stand-in CUDA events), reports
written by real CPU Trainers (one row per window step, accumulation, cut-short and repeated windows, exceptions), and
two-process CPU DDP with a slow rank flagged on rank 0."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
from profiling_helpers import ddp_synthetic_args, fit_with_window

import step_report
import trace_summary
from callbacks import ProfilerWindow
from callbacks.step_timer import StepTimer, batch_size, find_prefetchers
from datamodule import ImageNetDataModule
from prefetcher import CopyEvents, DevicePrefetcher, SyntheticBatches

ROOT = Path(__file__).resolve().parent.parent


# --- known answers without a GPU -----------------------------------------------------------------------------------
class FakeDevice:
    """A host clock and a GPU clock the test sets; events record the GPU clock (milliseconds)."""

    def __init__(self) -> None:
        self.host_ms = 0.0
        self.gpu_ms = 0.0

    def at(self, host_ms: float, gpu_ms: float | None = None) -> None:
        self.host_ms, self.gpu_ms = host_ms, self.gpu_ms if gpu_ms is None else gpu_ms

    def clock(self) -> float:
        return self.host_ms / 1000

    def timer(self) -> StepTimer:
        """A :class:`StepTimer` on these clocks, its one synchronize a no-op."""
        timer = StepTimer()
        timer.clock, timer.new_event, timer.synchronize = self.clock, self.event, lambda: None
        return timer

    def event(self, gpu_ms: float | None = None) -> FakeEvent:
        event = FakeEvent(self)
        if gpu_ms is not None:
            event.t = gpu_ms
        return event


class FakeEvent:
    def __init__(self, device: FakeDevice) -> None:
        self.device, self.t = device, None

    def record(self, stream=None) -> None:  # noqa: ANN001
        self.t = self.device.gpu_ms

    def elapsed_time(self, end: FakeEvent) -> float:
        return end.t - self.t

    def query(self) -> bool:
        return self.t is not None

    def synchronize(self) -> None:
        pass


def fake_trainer(device: str, loader: object = None) -> SimpleNamespace:
    return SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device(device)), global_rank=0,
                           train_dataloader=loader)  # fmt: skip


def phases(*ms: float) -> object:
    """Phase times in the order data, forward, backward, optimizer, other, total, for an approximate comparison."""
    return pytest.approx(dict(zip((*trace_summary.PHASES, "total"), ms, strict=True)))


def run_step(timer: StepTimer, fake: FakeDevice, step: int, times: list[tuple[float, float]], images: int = 4):
    """One step's boundaries at ``times`` = (host ms, GPU ms) for: start, data end, forward end, backward end, end."""
    batch = (torch.zeros(images, 3, 2, 2), torch.zeros(images))
    fake.at(*times[0])
    timer.begin(step, "step")
    timer.begin(step, "data")
    fake.at(*times[1])
    timer.end(step, "data")
    timer.add_images(step, batch)
    timer.begin(step, "forward")
    fake.at(*times[2])
    timer.end(step, "forward")
    timer.begin(step, "backward")
    fake.at(*times[3])
    timer.end(step, "backward")
    timer.begin(step, "optimizer")
    fake.at(*times[4])
    timer.end_phases(step)
    timer.end(step, "step")


def test_events_give_known_phase_times_lag_busy_fraction_and_copy_overlap(monkeypatch):
    fake = FakeDevice()
    timer = fake.timer()
    prefetcher = DevicePrefetcher([], "cpu")
    trainer = fake_trainer("cuda:0", loader=[prefetcher])
    timer.start(trainer, (0, 2))
    assert prefetcher.timing is not None
    # The copy of a batch on the side stream: GPU 0..6 ms (pinned), then one at 24..28 ms (pageable).
    prefetcher.timing.append(CopyEvents(fake.event(0), fake.event(6), fake.event(7), 0.0005, True, 100))
    run_step(timer, fake, 0, [(0, 1), (2, 3), (4, 10), (6, 20), (7, 24)])
    prefetcher.timing.append(CopyEvents(fake.event(24), fake.event(28), fake.event(29), 0.0085, False, 100))
    run_step(timer, fake, 1, [(8, 26), (9, 27), (10, 30), (11, 40), (12, 42)])
    fake.at(30, 30)  # the window's end: the device is idle, both clocks read 30 ms
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "16")
    summary = timer.finish(trainer)
    assert prefetcher.timing is None and not timer.active
    s0, s1 = summary["steps"]
    assert s0["host"] == phases(2, 2, 2, 1, 0, 7) and s1["host"] == phases(1, 1, 1, 1, 0, 4)
    assert s0["gpu"] == phases(2, 7, 10, 4, 0, 23) and s1["gpu"] == phases(1, 3, 10, 2, 0, 16)
    # The GPU reaches the end of step 0 at 24 ms, 17 ms after the host recorded it at 7 ms; step 1: 42 - 12.
    assert (s0["lag"], s1["lag"]) == pytest.approx((17, 30))
    assert (s0["h2d"], s1["h2d"]) == pytest.approx((6, 4))
    assert (s0["images"], s1["images"]) == (4, 4)
    # Stalls: GPU data 2 + 1 ms and the 2 ms gap between the steps, of the 41 ms from 1 to 42.
    assert summary["gpu_busy"] == round(36 / 41, 4) and summary["gpu_busy_source"] == "events"
    # Copy 0..6 vs compute (forward start..step end) 3..24 and the backlog before the window (the host recorded the
    # first event at 0, the GPU reached it at 1): 1 + 3 of 6 ms; copy 24..28 vs 27..42: 1 of 4 ms.
    copies = summary["copies"]
    assert copies["time_ms"] == pytest.approx(10) and copies["overlapped_ms"] == pytest.approx(5)
    assert copies["overlap"] == pytest.approx(0.5)
    # The GPU passed step 0's fetch at 3 ms, 1 ms after the host (2 ms); step 1's at 27 ms, 1 ms after it reached the
    # fetch (26 ms): 2 ms of compute waiting for input, of the 5 ms of copy time outside compute.
    assert copies["waited_ms"] == pytest.approx(2) and copies["hidden"] == pytest.approx(0.8)
    assert (copies["count"], copies["pinned"], copies["pageable"]) == (2, 1, 1)
    assert summary["wall_ms"] == pytest.approx(12) and summary["window"] == [0, 1] and summary["device"] == "cuda:0"
    assert summary["input"] == "prefetcher" and summary["compile"] is None  # no model: no mode known
    assert summary["compile_tuning"] is False
    assert summary["device_connections"] == 16  # what this process asked CUDA for
    # The host recorded the two steps in 12 ms; the GPU ran them from 1 to 42 ms: the rate is the GPU's.
    assert summary["gpu_wall_ms"] == pytest.approx(41)
    o = step_report.build_report([summary])["overall"]
    assert o["clock"] == "gpu" and o["images_per_s"] == pytest.approx(8 / 0.041, abs=0.01)
    assert o["step_ms"] == pytest.approx((23 + 16) / 2) and o["host_step_ms"] == pytest.approx((7 + 4) / 2)
    line = step_report.summary_lines(step_report.build_report([summary]))[1]
    assert line.startswith("  195.1 img/s, median step 19.50 ms (GPU clock; host 5.50 ms)")


def test_a_gpu_clock_a_little_ahead_of_the_hosts_reads_no_lag_rather_than_a_negative_one():
    """The clocks are put together from one event at the window's end; the jitter of that reading can put a step's
    end on the GPU before the host recorded it. A device that kept up has no lag: never a negative one."""
    fake = FakeDevice()
    timer = fake.timer()
    trainer = fake_trainer("cuda:0")
    timer.start(trainer, (0, 2))
    run_step(timer, fake, 0, [(0, 0), (1, 1), (2, 2), (3, 3), (4, 4)])
    run_step(timer, fake, 1, [(5, 5), (6, 6), (7, 7), (8, 8), (9, 8.5)])  # ends on the GPU 0.5 ms "before" the host
    fake.at(10, 10)
    s0, s1 = timer.finish(trainer)["steps"]
    assert s0["lag"] == 0 and s1["lag"] == 0


@pytest.mark.parametrize(
    ("mode", "tuning", "recorded"),
    [
        (None, False, False),
        (None, True, False),  # no compiled model: nothing was tuned, whatever the flag says
        ("default", False, False),
        ("reduce-overhead", False, False),
        ("reduce-overhead", True, True),
    ],
)
def test_the_summary_names_the_models_compile_mode_and_tuning(mode, tuning, recorded) -> None:
    timer = StepTimer()
    trainer = fake_trainer("cpu")
    trainer.lightning_module = SimpleNamespace(hparams={"compile": mode, "compile_tuning": tuning, "arch": "resnet50"})
    timer.start(trainer, (0, 1))
    run_step(timer, FakeDevice(), 0, [(0, 0), (1, 1), (2, 2), (3, 3), (4, 4)])
    summary = timer.finish(trainer)
    assert (summary["compile"], summary["compile_tuning"]) == (mode, recorded)


@pytest.mark.parametrize("held_up", [False, True])
def test_a_copy_run_while_the_gpu_waits_for_the_host_is_hidden_one_that_compute_waits_for_is_not(held_up: bool):
    """A window's first step on a GPU that the window's start drained (the host and GPU clocks agree): the copy of
    the next batch, issued in the step's fetch, runs while the compute stream has nothing issued, so it overlaps no
    compute and holds nothing up. With ``held_up`` the step's own batch is still being copied when the host has
    finished the fetch: the compute stream waits for it."""
    fake = FakeDevice()
    timer = fake.timer()
    prefetcher = DevicePrefetcher([], "cpu")
    trainer = fake_trainer("cuda:0", loader=[prefetcher])
    timer.start(trainer, (0, 2))
    # Step 0: fetch 0..1 ms on both clocks; the copy runs 0.2..0.8 (or, held up, 0.2..2, passing the fetch at 2).
    copy_end, fetched = (2.0, 2.0) if held_up else (0.8, 1.0)
    prefetcher.timing.append(CopyEvents(fake.event(0.2), fake.event(copy_end), fake.event(copy_end), 0.0002, True, 1))
    run_step(timer, fake, 0, [(0, 0), (1, fetched), (10, 15), (20, 35), (30, 40)])
    # Step 1: the host is ahead; its copy (host 31.5 ms) runs at 31.5..32.5, inside step 0's compute.
    prefetcher.timing.append(CopyEvents(fake.event(31.5), fake.event(32.5), fake.event(32.5), 0.0315, True, 1))
    run_step(timer, fake, 1, [(31, 40), (32, 40), (40, 50), (50, 70), (60, 80)])
    fake.at(100, 100)
    summary = timer.finish(trainer)
    copies = summary["copies"]
    report = step_report.build_report([summary])
    if not held_up:
        assert (copies["time_ms"], copies["overlapped_ms"]) == (pytest.approx(1.6), pytest.approx(1))
        assert copies["overlap"] == 0.625 and copies["waited_ms"] == 0 and copies["hidden"] == 1.0
        assert report["findings"] == []
        # Data wait: step 0's 1 ms fetch with the GPU idle; step 1's (host 31..32) while the GPU ran step 0: 0.5 ms
        # a step of the GPU's 40 (on the host's clock alone, 2 of 59 ms: 3.4%).
        assert report["verdict"].startswith(
            "prefetch hidden (62.5% overlapped, compute waited 0.00 ms for input, pinned) but data wait 1.2%; "
            "GPU-bound: "
        )
    else:  # 1.8 ms outside compute, of which the compute stream waited 1 (2 ms on the GPU, the host done at 1)
        assert (copies["time_ms"], copies["overlapped_ms"]) == (pytest.approx(2.8), pytest.approx(1))
        assert copies["waited_ms"] == pytest.approx(1) and copies["hidden"] == pytest.approx(1 - 1 / 2.8, abs=1e-4)
        assert report["findings"] == [
            "copies serialize with compute: 35.7% of H2D time overlaps compute kernels and compute waited 1.00 ms "
            "for its input; the prefetcher issues them non_blocking from pinned memory on a side stream a batch "
            "ahead, so look for a host sync inside the step (a .item(), a tensor printed or compared on the host)"
        ]  # not the advice to do what the app's prefetcher does already
    assert "| compute waited for input (ms) |" in step_report.markdown(report)


def test_the_gap_of_an_epoch_end_and_the_next_first_fetch_are_left_out_of_wall_time_and_gpu_busy(tmp_path, monkeypatch):
    fake = FakeDevice()
    timer = fake.timer()
    prefetcher = DevicePrefetcher([], "cpu")
    trainer = fake_trainer("cuda:0", loader=[prefetcher])
    timer.start(trainer, (0, 3))
    # A copy issued in step 0, on the GPU inside its compute (3..4 ms); one issued during the next epoch's first
    # fetch (host 650 ms), on the GPU while it has no step (700..701): the gap's, left out like the gap.
    prefetcher.timing.append(CopyEvents(fake.event(3), fake.event(4), fake.event(4), 0.002, True, 100))
    prefetcher.timing.append(CopyEvents(fake.event(700), fake.event(701), fake.event(701), 0.650, True, 100))
    run_step(timer, fake, 0, [(0, 0), (1, 1), (3, 5), (5, 9), (6, 10)])
    # The epoch's end (a checkpoint save) after step 0: 494 ms on the host, then the next epoch's first fetch waits
    # 200 ms for the loader to refill; the GPU idles from 10 to 705.
    timer.between(0, "epoch end")
    run_step(timer, fake, 1, [(500, 505), (700, 705), (702, 709), (704, 713), (705, 714)])
    # An ordinary 2 ms gap (the loop's own overhead) stays in both.
    run_step(timer, fake, 2, [(707, 716), (708, 717), (710, 721), (712, 725), (713, 726)])
    fake.at(800, 800)
    summary = timer.finish(trainer)
    # Step 1 starts where its first fetch ended, on both clocks; its other phases stay.
    s1 = summary["steps"][1]
    assert s1["host"] == phases(0, 2, 2, 1, 0, 5) and s1["gpu"] == phases(0, 4, 4, 1, 0, 9)
    # Wall: 0..713 less the 694 ms gap (6..700) = 19 ms; GPU span 0..726 less the gap 10..705 = 31 ms, of which
    # data 1 + 0 + 1 ms and the 2 ms between steps 1 and 2 stalled.
    assert summary["wall_ms"] == pytest.approx(19)
    gap = {"after_step": 0, "what": "epoch end", "host_ms": pytest.approx(694), "first_fetch_ms": pytest.approx(200)}
    assert summary["between_steps"] == [gap]
    assert summary["gpu_busy"] == round(27 / 31, 4)
    copies = summary["copies"]
    assert (copies["count"], copies["time_ms"], copies["overlap"]) == (1, pytest.approx(1), pytest.approx(1.0))
    assert summary["steps"][0]["h2d"] == pytest.approx(1) and summary["steps"][1]["h2d"] is None
    report = step_report.build_report([summary])
    assert summary["gpu_wall_ms"] == pytest.approx(31)
    assert report["overall"]["images_per_s"] == pytest.approx(12 / 0.031, abs=0.01)
    assert report["ranks"][0]["stats"]["host_images_per_s"] == pytest.approx(12 / 0.019, abs=0.01)
    assert report["overall"]["between_steps"] == [gap]
    # Data 1 + 0 + 1 ms (the GPU idled through each) of the GPU's 10 + 9 + 10 ms: the refill's 200 ms are not the
    # steps' data wait.
    assert report["overall"]["data_pct"] == pytest.approx(100 * 2 / 29, abs=0.01)
    lines = step_report.summary_lines(report)
    text = "epoch end after step 0 (694.0 ms, of which 200.0 ms the next epoch's first batch)"
    assert f"  between steps, left out of img/s and GPU busy: {text}" in lines
    assert text in step_report.markdown(report)
    # A Kineto trace of the window leaves the same gap out (trace_summary): its kernel-exact figures replace the
    # events' upper bound, gap or not; the gap's listing stays the events'.
    trace = tmp_path / "rank0.pt.trace.json"
    trace.write_text("{}")
    exact_copies = trace_summary.copy_stats(0.8, 0.8, 1, 0, 1, "kineto", waited_ms=0.0)
    exact = {"gpu_busy": 0.5, "gpu_busy_source": "kineto", "copies": exact_copies}
    monkeypatch.setattr(trace_summary, "summarize_trace", lambda *args, **kwargs: exact)
    result, _ = timer.report(trainer, dict(summary), tmp_path / "report", trace)
    assert result["overall"]["gpu_busy"] == 0.5 and result["overall"]["gpu_busy_source"] == "kineto"
    assert result["overall"]["copies"]["source"] == "kineto" and result["overall"]["between_steps"] == [gap]
    assert result["ranks"][0]["source"] == "events+kineto"
    # A trace that cannot be read leaves the events' figures.
    trace.write_text("not json")
    monkeypatch.undo()
    result, _ = timer.report(trainer, dict(summary), tmp_path / "report", trace)
    assert result["overall"]["gpu_busy"] == round(27 / 31, 4) and result["ranks"][0]["source"] == "events"


def test_a_window_opening_at_an_epochs_first_step_leaves_its_first_fetch_out():
    # The nsys check of a window at an epoch's first step (window 25-29, 25 batches an epoch) read "input-bound: data
    # wait is 44.9% of the step": 212 ms of step 25's 276 were the loader refilling, 1-2 ms in each later step.
    fake = FakeDevice()
    timer = fake.timer()
    prefetcher = DevicePrefetcher([], "cpu")
    trainer = fake_trainer("cuda:0", loader=[prefetcher])
    timer.start(trainer, (25, 27))
    timer.epoch_start(25)
    # A copy issued during the refill (host 150 ms; on the GPU at 199..200 with no step to overlap): the gap's.
    prefetcher.timing.append(CopyEvents(fake.event(199), fake.event(200), fake.event(200), 0.150, True, 100))
    run_step(timer, fake, 25, [(0, 0), (200, 200), (205, 206), (209, 212), (210, 213)])
    run_step(timer, fake, 26, [(211, 214), (212, 215), (217, 220), (221, 226), (222, 227)])
    fake.at(300, 300)
    summary = timer.finish(trainer)
    # Step 25 starts where the fetch ended, on both clocks, with no data phase left.
    assert summary["steps"][0]["host"] == phases(0, 5, 4, 1, 0, 10)
    assert summary["steps"][0]["gpu"] == phases(0, 6, 6, 1, 0, 13)
    gap = {"after_step": 24, "what": "epoch start", "host_ms": pytest.approx(200), "first_fetch_ms": pytest.approx(200)}
    assert summary["between_steps"] == [gap]
    # Wall 200..222 = 22 ms on the host; GPU 200..227 = 27 ms, of which only step 26's 1 ms data and the 1 ms
    # between the steps stalled.
    assert summary["wall_ms"] == pytest.approx(22) and summary["gpu_wall_ms"] == pytest.approx(27)
    assert summary["gpu_busy"] == round(25 / 27, 4)
    assert summary["copies"]["count"] == 0  # the refill's copy is left out with it
    report = step_report.build_report([summary])
    assert report["overall"]["data_pct"] == pytest.approx(100 * 1 / 26, abs=0.01)  # of the steps' 13 + 13 GPU ms
    assert "input-bound" not in report["verdict"]
    text = "epoch start before step 25 (200.0 ms, the epoch's first batch)"
    assert f"  between steps, left out of img/s and GPU busy: {text}" in step_report.summary_lines(report)
    assert text in step_report.markdown(report)

    # The same window without the mark (opening in the middle of an epoch): the fetch is the step's own.
    timer = fake.timer()
    timer.start(fake_trainer("cuda:0"), (25, 27))
    run_step(timer, fake, 25, [(0, 0), (200, 200), (205, 206), (209, 212), (210, 213)])
    run_step(timer, fake, 26, [(211, 214), (212, 215), (217, 220), (221, 226), (222, 227)])
    fake.at(300, 300)
    summary = timer.finish(fake_trainer("cuda:0"))
    assert summary["between_steps"] == [] and summary["steps"][0]["host"]["data"] == pytest.approx(200)
    assert "input-bound" in step_report.build_report([summary])["verdict"]


def test_a_copy_the_second_micro_batch_waited_for_is_not_overlapped_by_the_steps_span():
    # Two micro-batches: the step's compute span (first forward .. step end) holds the second fetch, where the compute
    # stream waited 10 ms for a copy; that copy overlapped no compute (the report read "prefetch hidden, 100%").
    fake = FakeDevice()
    timer = fake.timer()
    prefetcher = DevicePrefetcher([], "cpu")
    trainer = fake_trainer("cuda:0", loader=[prefetcher])
    timer.start(trainer, (0, 1))
    batch = (torch.zeros(4, 1), torch.zeros(4))

    def micro_batch(host: float, gpu: float, wait: float) -> float:
        fake.at(host, gpu)
        timer.begin(0, "data")
        fake.at(host + 1, gpu + 1 + wait)  # the compute stream passes the fetch once the copy is done
        timer.end(0, "data")
        timer.add_images(0, batch)
        timer.begin(0, "forward")
        fake.at(host + 2, gpu + 11 + wait)
        timer.end(0, "forward")
        timer.begin(0, "backward")
        fake.at(host + 3, gpu + 31 + wait)
        timer.end(0, "backward")
        return gpu + 31 + wait

    fake.at(0, 0)
    timer.begin(0, "step")
    gpu = micro_batch(0, 0, 0)
    prefetcher.timing.append(CopyEvents(fake.event(gpu + 1), fake.event(gpu + 11), fake.event(gpu + 11), 0.0035, True,
                                        1 << 20))  # fmt: skip
    gpu = micro_batch(3.5, gpu, 10)
    timer.begin(0, "optimizer")
    fake.at(8, gpu + 5)
    timer.end_phases(0)
    timer.end(0, "step")
    fake.at(200, 200)
    summary = timer.finish(trainer)
    copies = summary["copies"]
    assert (copies["count"], copies["overlap"], copies["hidden"]) == (1, 0.0, 0.0)
    assert copies["waited_ms"] == pytest.approx(11)
    assert step_report.build_report([summary])["verdict"].startswith("copies serialize with compute")


def test_a_step_without_a_fetch_range_after_an_epoch_end_keeps_its_start():
    # A loader Lightning does not report fetches of opens no `data` phase: nothing to fold, no first_fetch_ms.
    fake = FakeDevice()
    timer = fake.timer()
    trainer = fake_trainer("cuda:0")
    timer.start(trainer, (0, 2))
    run_step(timer, fake, 0, [(0, 0), (1, 1), (3, 5), (5, 9), (6, 10)])
    timer.between(0, "epoch end")
    fake.at(100, 100)
    timer.begin(1, "step")
    timer.begin(1, "forward")
    fake.at(103, 104)
    timer.end_phases(1)
    timer.end(1, "step")
    fake.at(200, 200)
    summary = timer.finish(trainer)
    assert summary["between_steps"] == [{"after_step": 0, "what": "epoch end", "host_ms": pytest.approx(94)}]
    assert summary["steps"][1]["host"] == phases(0, 3, 0, 0, 0, 3)


@pytest.mark.parametrize(("decoder", "expected"), [(None, "prefetcher"), (lambda files, device: files, "gpu-decode")])
def test_the_summary_names_the_input_path(decoder, expected):
    timer = StepTimer()
    trainer = fake_trainer("cpu", loader=DevicePrefetcher([], "cpu", decoder=decoder))
    timer.start(trainer, (0, 0))
    summary = timer.finish(trainer)
    assert summary["input"] == expected
    # One thread decodes on CPU whatever data.decode_threads says; no GPU decode, no count.
    assert summary["decode_threads"] == (1 if decoder else None)


@pytest.mark.parametrize("cpu_decoder", ["pil", "torchvision"])
def test_the_summary_names_the_workers_decoder(cpu_decoder, shapes_root):
    timer = StepTimer()
    trainer = fake_trainer("cpu", loader=DevicePrefetcher([], "cpu"))
    timer.start(trainer, (0, 0))
    assert timer.finish(trainer)["cpu_decoder"] is None  # no data module: unknown
    trainer.datamodule = ImageNetDataModule(root=str(shapes_root), cpu_decoder=cpu_decoder)
    timer.start(trainer, (0, 0))
    assert timer.finish(trainer)["cpu_decoder"] == cpu_decoder
    trainer.train_dataloader = SyntheticBatches(2, 4, 8, 1, "cpu")
    timer.start(trainer, (0, 0))
    assert timer.finish(trainer)["cpu_decoder"] is None  # synthetic batches: no worker decodes anything


def test_host_clock_alone_on_cpu_with_gradient_accumulation():
    fake = FakeDevice()
    timer = StepTimer()
    timer.clock = fake.clock
    trainer = fake_trainer("cpu")
    timer.start(trainer, (5, 6))
    batch = (torch.zeros(3, 1), torch.zeros(3))
    for host, action in [(0, "begin step"), (0, "begin data"), (1, "end data"), (1, "begin forward"),
                         (3, "end forward"), (3, "begin backward"), (6, "end backward"), (6, "ends -"),
                         (7, "begin data"), (9, "end data"), (9, "begin forward"), (10, "end forward"),
                         (10, "begin backward"), (12, "end backward"), (12.5, "begin optimizer"), (14, "ends -"),
                         (14, "end step")]:  # fmt: skip
        fake.at(host)
        kind, name = action.split()
        if kind == "ends":
            timer.end_phases(5)
        elif kind == "begin" and name == "forward":
            timer.add_images(5, batch)
            timer.begin(5, name)
        else:
            timer.mark(5, name, kind == "begin")
    timer.end(5, "forward")  # not open: nothing recorded
    summary = timer.finish(trainer)
    (row,) = summary["steps"]
    assert row["host"] == phases(3, 3, 5, 1.5, 1.5, 14)
    assert row["gpu"] is None and row["lag"] is None and row["images"] == 6
    assert summary["source"] == "host" and summary["gpu_busy"] is None and summary["copies"] is None
    assert summary["input"] == "other"


def test_helpers_find_prefetchers_and_count_images():
    prefetcher = DevicePrefetcher([], "cpu")
    assert find_prefetchers(prefetcher) == [prefetcher]
    assert find_prefetchers({"a": [prefetcher], "b": object()}) == [prefetcher]
    assert find_prefetchers(None) == []
    assert batch_size((torch.zeros(7, 3), torch.zeros(7))) == 7
    assert batch_size({"x": torch.zeros(2, 1)}) == 2
    assert batch_size("text") is None


# --- real Trainers on the CPU --------------------------------------------------------------------------------------
def fit(tmp_path: Path, window: ProfilerWindow, max_steps: int = 10, **kwargs: Any) -> pl.Trainer:
    return fit_with_window(tmp_path, window, max_steps, **kwargs)


@pytest.fixture(autouse=True)
def _no_nsight(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_INJECTION64_PATH", raising=False)


def test_window_writes_json_markdown_and_png_with_one_row_per_step(tmp_path, caplog):
    window = ProfilerWindow(start_step=2, num_steps=3)
    trainer = fit(tmp_path, window)
    assert trainer.global_step == 5
    folder = tmp_path / "step_report"
    assert sorted(p.name for p in folder.iterdir()) == ["window_2-4.json", "window_2-4.md", "window_2-4.png"]
    assert window.report_files == [folder / "window_2-4.json", folder / "window_2-4.md", folder / "window_2-4.png"]
    report = json.loads((folder / "window_2-4.json").read_text())
    assert report == json.loads(json.dumps(window.reports[0]))
    (rank,) = report["ranks"]
    assert [s["step"] for s in rank["steps"]] == [2, 3, 4]
    for row in rank["steps"]:
        assert row["images"] == 4 and row["gpu"] is None
        assert sum(row["host"][p] for p in trace_summary.PHASES) == pytest.approx(row["host"]["total"], abs=1e-3)
        assert row["host"]["forward"] > 0 and row["host"]["backward"] > 0 and row["host"]["optimizer"] > 0
    assert sum(s["host"]["total"] for s in rank["steps"]) <= rank["wall_ms"] + 1e-3
    assert report["overall"]["images_per_s"] == pytest.approx(12 / (rank["wall_ms"] / 1000), rel=1e-3)
    assert report["verdict"].startswith("CPU run: GPU times and copy overlap unavailable; data wait")
    assert rank["input"] == "on-device"  # data.source synthetic
    assert rank["device_connections"] is None  # no CUDA in this run
    assert "# Step-time report: steps 2-4" in (folder / "window_2-4.md").read_text()
    assert (folder / "window_2-4.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "step report, steps 2-4, 1 rank(s)" in caplog.text and "verdict: CPU run" in caplog.text


def test_a_window_across_validation_and_an_epoch_end_lists_them_and_leaves_them_out(tmp_path):
    window = ProfilerWindow(start_step=1, num_steps=4)
    fit(tmp_path, window, max_steps=10, train_steps=3, val_batches=2, num_sanity_val_steps=0)
    (rank,) = window.reports[0]["ranks"]
    assert [s["step"] for s in rank["steps"]] == [1, 2, 3, 4]
    (gap,) = rank["between_steps"]  # epochs of 3 steps: validation, then the epoch's end, after step 2
    assert gap["after_step"] == 2 and gap["what"] == "validation + epoch end" and gap["host_ms"] > 0
    assert 0 < gap["first_fetch_ms"] < gap["host_ms"]  # the next epoch's first fetch joined the gap
    steps = {s["step"]: s for s in rank["steps"]}
    assert steps[3]["host"]["data"] == 0 and steps[3]["host"]["forward"] > 0
    # The wall time holds the four steps and the ordinary gaps between them, not the validation pass.
    assert sum(s["host"]["total"] for s in steps.values()) <= rank["wall_ms"] + 1e-3
    assert rank["wall_ms"] < sum(s["host"]["total"] for s in steps.values()) + gap["host_ms"]
    assert window.reports[0]["overall"]["between_steps"] == [gap]


def test_the_kineto_trace_of_such_a_window_gives_the_same_gap(tmp_path):
    window = ProfilerWindow(start_step=1, num_steps=4, torch_profiler=True, trace_dir=str(tmp_path / "traces"))
    fit(tmp_path, window, max_steps=10, train_steps=3, val_batches=2, num_sanity_val_steps=0)
    (live,) = window.reports[0]["ranks"]
    (trace,) = window.trace_files
    offline = trace_summary.summarize_trace(trace_summary.load_trace(trace), batch_size=4)
    (gap,) = offline["between_steps"]  # from the trace's validation / epoch end ranges, as `step_report.py` reads it
    assert (gap["after_step"], gap["what"]) == (2, "validation + epoch end")
    assert 0 < gap["first_fetch_ms"] < gap["host_ms"]
    assert [s["step"] for s in offline["steps"]] == [1, 2, 3, 4] and offline["steps"][2]["host"]["data"] == 0
    # The same steps' wall time on both clocks of the host, within the trace's microsecond rounding and the few
    # microseconds between a callback's perf_counter and its record_function.
    assert offline["wall_ms"] == pytest.approx(live["wall_ms"], rel=0.05)
    assert offline["wall_ms"] < sum(s["host"]["total"] for s in offline["steps"]) + gap["host_ms"]


def test_a_window_at_an_epochs_first_step_leaves_the_refill_out_live_and_in_its_kineto_trace(tmp_path):
    # Epochs of 3 steps: the window opens at step 3, the second epoch's first; its first fetch is the loader's refill.
    window = ProfilerWindow(start_step=3, num_steps=2, torch_profiler=True, trace_dir=str(tmp_path / "traces"))
    fit(tmp_path, window, max_steps=10, train_steps=3)
    (live,) = window.reports[0]["ranks"]
    (gap,) = live["between_steps"]
    assert (gap["after_step"], gap["what"]) == (2, "epoch start") and gap["host_ms"] == gap["first_fetch_ms"] > 0
    assert [s["step"] for s in live["steps"]] == [3, 4] and live["steps"][0]["host"]["data"] == 0
    assert live["steps"][1]["host"]["data"] > 0  # a later fetch stays the step's own
    assert live["wall_ms"] == pytest.approx(
        sum(s["host"]["total"] for s in live["steps"]), abs=5
    )  # the two steps and the loop's own gap between them, not the refill
    (trace,) = window.trace_files
    offline = trace_summary.summarize_trace(trace_summary.load_trace(trace), batch_size=4)
    (offline_gap,) = offline["between_steps"]  # from the trace's `epoch start` range in step 3
    assert (offline_gap["after_step"], offline_gap["what"]) == (2, "epoch start")
    assert offline_gap["host_ms"] == pytest.approx(gap["host_ms"], rel=0.05, abs=0.5)
    assert offline["steps"][0]["host"]["data"] == 0
    assert offline["wall_ms"] == pytest.approx(live["wall_ms"], rel=0.05)


def test_the_first_fetch_of_a_window_at_the_runs_first_step_is_an_epoch_start_too(tmp_path):
    window = ProfilerWindow(start_step=0, num_steps=2)
    fit(tmp_path, window, max_steps=10)
    (rank,) = window.reports[0]["ranks"]
    assert [(g["after_step"], g["what"]) for g in rank["between_steps"]] == [(-1, "epoch start")]
    assert "epoch start before step 0 (" in step_report.markdown(window.reports[0])


def test_a_save_every_n_steps_inside_the_window_is_a_listed_gap(tmp_path):
    from callbacks.resumable_checkpoint import ResumableCheckpoint

    class SlowSave(ResumableCheckpoint):
        def _save_checkpoint(self, trainer: pl.Trainer, filepath: str) -> None:
            super()._save_checkpoint(trainer, filepath)
            time.sleep(0.3)  # a large model's save: no step, and not the GPU idling

    window = ProfilerWindow(start_step=1, num_steps=3)
    save = SlowSave(dirpath=tmp_path / "ckpt", every_n_train_steps=2, save_top_k=-1)
    fit(tmp_path, window, max_steps=10, extra=[save], checkpointing=True)
    (rank,) = window.reports[0]["ranks"]
    (gap,) = rank["between_steps"]  # saved at global_step 2: after step 1, once that step's range has closed
    assert gap["after_step"] == 1 and gap["what"] == "checkpoint" and gap["host_ms"] >= 300
    assert "first_fetch_ms" not in gap  # no epoch's end: the next step's fetch is its own
    assert rank["wall_ms"] < sum(s["host"]["total"] for s in rank["steps"]) + 300


def test_gradient_accumulation_counts_every_micro_batch(tmp_path):
    window = ProfilerWindow(start_step=1, num_steps=2)
    fit(tmp_path, window, accumulate=2)
    (rank,) = window.reports[0]["ranks"]
    assert [(s["step"], s["images"]) for s in rank["steps"]] == [(1, 8), (2, 8)]


def test_report_off_records_and_writes_nothing(tmp_path):
    window = ProfilerWindow(start_step=1, num_steps=2, report=False)
    fit(tmp_path, window)
    assert not (tmp_path / "step_report").exists() and window.reports == [] and not window.timer.active


def test_window_cut_short_by_the_end_of_training_reports_its_steps_and_exports_its_trace(tmp_path):
    window = ProfilerWindow(start_step=4, num_steps=5, torch_profiler=True, trace_dir=str(tmp_path / "traces"))
    with pytest.warns(UserWarning, match="cut short"):
        trainer = fit(tmp_path, window, max_steps=6)
    assert trainer.global_step == 6
    (report,) = window.reports
    assert report["window"] == [4, 5] and [s["step"] for s in report["ranks"][0]["steps"]] == [4, 5]
    (trace,) = window.trace_files  # closed as a full window is, not dropped at teardown
    assert trace.is_file() and report["ranks"][0]["source"] == "host+kineto"


def test_a_report_that_cannot_be_written_is_a_warning_not_the_end_of_training(tmp_path, monkeypatch):
    def full_disk(*args, **kwargs):  # noqa: ANN002, ANN003
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(step_report, "write_report", full_disk)
    window = ProfilerWindow(start_step=2, num_steps=2, exit_after=False)
    with pytest.warns(UserWarning, match="step report of this window could not be written.*No space left"):
        trainer = fit(tmp_path, window, max_steps=6)
    assert trainer.global_step == 6 and window.reports == []


def test_several_windows_write_one_report_each(tmp_path):
    window = ProfilerWindow(start_step=[1, 4], num_steps=2, exit_after=False)
    fit(tmp_path, window, max_steps=7)
    assert [r["window"] for r in window.reports] == [[1, 2], [4, 5]]
    names = sorted(p.name for p in (tmp_path / "step_report").iterdir())
    assert names == sorted(f"window_{w}.{e}" for w in ("1-2", "4-5") for e in ("json", "md", "png"))


def test_exception_inside_the_window_writes_no_report(tmp_path):
    class Boom(pl.Callback):
        def on_before_backward(self, trainer, pl_module, loss):  # noqa: ANN001
            if trainer.global_step == 3:
                raise RuntimeError("boom inside the window")

    window = ProfilerWindow(start_step=2, num_steps=4)
    with pytest.raises(RuntimeError, match="boom"):
        fit(tmp_path, window, extra=[Boom()])
    assert not window.timer.active and window.reports == [] and not (tmp_path / "step_report").exists()


class SlowRank(pl.Callback):
    """Test helper for the DDP run: rank 1 spends 150 ms more per step before its optimizer step from step 3 on."""

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):  # noqa: ANN001
        if trainer.global_rank == 1 and trainer.global_step >= 3:
            time.sleep(0.15)


@pytest.mark.slow
def test_ddp_two_cpu_ranks_report_both_on_rank_0_and_flag_the_slow_one(tmp_path, run_train):
    args = [
        *ddp_synthetic_args(tmp_path), "--trainer.callbacks+=test_step_timer.SlowRank",
        "--profile.start_step", "3", "--profile.num_steps", "3", "--profile.report", "true",
    ]  # fmt: skip
    proc = run_train(args, cwd=ROOT, timeout=300, env_changes={"CUDA_INJECTION64_PATH": None})
    assert proc.returncode == 0, proc.stderr[-3000:]
    (folder,) = {p.parent for p in tmp_path.rglob("step_report/*")}
    assert sorted(p.name for p in folder.iterdir()) == ["window_3-5.json", "window_3-5.md", "window_3-5.png"]
    report = json.loads((folder / "window_3-5.json").read_text())
    assert report["world_size"] == 2 and [r["rank"] for r in report["ranks"]] == [0, 1]
    for rank in report["ranks"]:
        assert [s["step"] for s in rank["steps"]] == [3, 4, 5]
        assert all(s["images"] == 4 for s in rank["steps"])
    (slow,) = report["stragglers"]
    # The sleep lands just before or just inside the optimizer range, depending on the callbacks' order.
    assert slow["rank"] == 1 and slow["phase"] in ("optimizer", "other") and slow["excess_ms"] > 100
    assert "straggler: rank 1" in report["verdict"]
    assert "stragglers: rank 1" in proc.stderr + proc.stdout
