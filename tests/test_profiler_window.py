"""The profiling window on CPU: NVTX range names/nesting/order, window placement, emit_nvtx, Kineto, exit, errors."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
from profiling_helpers import ddp_synthetic_args, fit_with_window

import callbacks.profiler_window
import callbacks.ranges
import shapes_dataset
from callbacks import ProfilerWindow

ROOT = Path(__file__).resolve().parent.parent


class NvtxRecorder:
    """Stands in for the ``nvtx`` module: records push/pop calls in order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str | None]] = []

    def push_range(self, message=None, **_):  # noqa: ANN001
        self.events.append(("push", message))

    def pop_range(self, **_):  # noqa: ANN003
        self.events.append(("pop", None))

    def tree(self) -> list:
        """Nested ``(name, children)`` tuples; fails on an unbalanced pop."""
        root: list = []
        stack = [root]
        for kind, name in self.events:
            if kind == "push":
                node = (name, [])
                stack[-1].append(node)
                stack.append(node[1])
            else:
                assert len(stack) > 1, "pop without push"
                stack.pop()
        return root

    def balanced(self) -> bool:
        return sum(1 if k == "push" else -1 for k, _ in self.events) == 0


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> NvtxRecorder:
    rec = NvtxRecorder()
    monkeypatch.setattr(callbacks.ranges, "nvtx", rec)
    monkeypatch.delenv("CUDA_INJECTION64_PATH", raising=False)
    return rec


def fit(tmp_path: Path, window: ProfilerWindow, max_steps: int = 6, **kwargs: Any) -> pl.Trainer:
    return fit_with_window(tmp_path, window, max_steps, **kwargs)


def test_step_ranges_nest_phases_in_order_and_exit_after_the_window(tmp_path, recorder):
    with pytest.warns(UserWarning, match="not CUDA"):
        trainer = fit(tmp_path, ProfilerWindow(start_step=2, num_steps=2), max_steps=10)
    assert trainer.global_step == 4  # steps 0..3 ran; exit_after stopped right after the window (steps 2, 3)
    tree = recorder.tree()
    # Lightning ends the epoch after the stop too (its hooks, metrics, checkpoint): that is named as well. After the
    # first step the module resets its metric sums (the first step is warm-up), in a range of its own; at the stop it
    # logs the interval the stop cuts short (the module's hook runs after the window's, which closed the step).
    assert [name for name, _ in tree] == ["step 0", "metrics", "step 1", "step 2", "step 3", "metrics", "epoch end"]
    steps = [(name, children) for name, children in tree if name.startswith("step")]
    # The epoch's first fetch (the loader refilling) is named inside the first step.
    (_, first), *rest = steps
    assert [(c, [g for g, _ in grandchildren]) for c, grandchildren in first] == [
        ("epoch start", ["data"]), ("forward", []), ("backward", []), ("optimizer", [])
    ]  # fmt: skip
    for name, children in rest:
        assert [c for c, _ in children] == ["data", "forward", "backward", "optimizer"], name
        assert all(grandchildren == [] for _, grandchildren in children)
    assert recorder.balanced()


def test_the_first_fetch_after_a_resume_inside_an_epoch_is_named_an_epoch_start(tmp_path, recorder):
    # Lightning calls no on_train_epoch_start on a resume inside an epoch, but the loader refills from empty there too.
    saves = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=1, save_top_k=-1)
    fit(tmp_path, ProfilerWindow(), max_steps=1, train_steps=5, extra=[saves], checkpointing=True)
    (checkpoint,) = (tmp_path / "ckpt").iterdir()  # after step 0, inside the first epoch
    recorder.events.clear()

    class EpochStarts(pl.Callback):
        calls = 0

        def on_train_epoch_start(self, *_: Any) -> None:
            EpochStarts.calls += 1

    fit(tmp_path, ProfilerWindow(start_step=1, num_steps=1, report=False), max_steps=4, train_steps=5,
        extra=[EpochStarts()], ckpt_path=str(checkpoint))  # fmt: skip
    assert EpochStarts.calls == 0  # Lightning goes on inside the epoch
    steps = {name: [c for c, _ in children] for name, children in recorder.tree() if name.startswith("step")}
    assert list(steps) == ["step 1"]  # the resumed run's first step, the window's one
    assert steps["step 1"][0] == "epoch start"
    assert recorder.balanced()


def test_the_metrics_reduction_of_every_log_step_has_its_range(tmp_path, recorder, monkeypatch):
    # Lightning calls the module's on_train_batch_end after the callbacks' (the step's range is closed): the
    # reduction's kernels, all-reduce and host sync ran in no range (an nsys check with log_every_n_steps 5 counted
    # 2 kernels outside every range a log step). Now each is in `metrics`.
    import step_metrics

    reduced_inside: list[list[str]] = []
    original = step_metrics.totals_over_ranks

    def recording(trainer, sums, images):  # noqa: ANN001, ANN202
        reduced_inside.append([name for kind, name in recorder.events if kind == "push"][-1:])
        return original(trainer, sums, images)

    monkeypatch.setattr(step_metrics, "totals_over_ranks", recording)
    fit(tmp_path, ProfilerWindow(start_step=5, num_steps=1), max_steps=10, log_every_n_steps=2)
    top = [name for name, _ in recorder.tree()]
    # global_step 2, 4, 6 are log steps: after steps 1, 3 and 5; after step 0 the sums are reset.
    assert top == ["step 0", "metrics", "step 1", "metrics", "step 2", "step 3", "metrics", "step 4", "step 5",
                   "metrics", "epoch end"]  # fmt: skip
    assert reduced_inside == [["metrics"]] * 3
    assert recorder.balanced()


def test_work_between_steps_is_named_validation_and_epoch_end(tmp_path, recorder):
    """A window across epoch ends: validation (with the checkpoint it triggers) and the epoch's end get their own
    ranges, so every kernel of the capture has a range (the 4-GPU nsys check found 48 a rank without one)."""
    from callbacks.resumable_checkpoint import ResumableCheckpoint

    window = ProfilerWindow(start_step=1, num_steps=5)
    saved_inside: dict[str, list[list[str]]] = {"train epoch end": [], "validation end": []}

    class RecordingCheckpoint(ResumableCheckpoint):  # the app's checkpoint class
        def _save_checkpoint(self, trainer: pl.Trainer, filepath: str) -> None:
            when = "train epoch end" if self._save_on_train_epoch_end else "validation end"
            saved_inside[when].append(window.ranges.names)
            super()._save_checkpoint(trainer, filepath)

    # Lightning's two moments to save: at the train epoch's end (its default with validation every epoch) and at
    # the validation's end; checkpoint callbacks run after every other callback's hook.
    class AtEpochEnd(RecordingCheckpoint):  # a class each: Lightning keys checkpoint callbacks by class and options
        pass

    at_epoch_end = AtEpochEnd(dirpath=tmp_path / "a", save_top_k=-1, save_on_train_epoch_end=True)
    at_validation_end = RecordingCheckpoint(dirpath=tmp_path / "b", save_top_k=-1, save_on_train_epoch_end=False)
    with pytest.warns(UserWarning, match="not CUDA"):
        trainer = fit(tmp_path, window, max_steps=20, extra=[at_epoch_end, at_validation_end], checkpointing=True,
                      train_steps=4, val_batches=1, num_sanity_val_steps=1)  # fmt: skip
    assert trainer.global_step == 6  # exit_after: the window's steps 1..5, then stop
    top = [name for name, _ in recorder.tree()]
    # Epochs of 4 steps: validation then the epoch's end after step 3, the epoch's end after the stop at step 5 (inside
    # epoch 1); the sanity check has no range.
    assert top == ["step 0", "metrics", "step 1", "step 2", "step 3", "validation", "epoch end", "step 4", "step 5",
                   "checkpoint", "checkpoint", "metrics", "epoch end"]  # fmt: skip
    # The next epoch's first fetch is named in its first step.
    assert [c for c, _ in dict(recorder.tree())["step 4"]][0] == "epoch start"
    # Each save inside a range. At the stop inside epoch 1 each saves where it stopped (ResumableCheckpoint: a
    # `checkpoint` range between the steps), exit_after skips validation, and the epoch still ends, saving nothing.
    assert saved_inside == {"train epoch end": [["epoch end"], []], "validation end": [["validation"], []]}
    # Each save is also a `checkpoint` range of its own, inside the range it runs in.
    between = [(name, [c for c, _ in children]) for name, children in recorder.tree() if not name.startswith("step")]
    assert between == [("metrics", []), ("validation", ["checkpoint"]), ("epoch end", ["checkpoint"]),
                       ("checkpoint", []), ("checkpoint", []), ("metrics", []), ("epoch end", [])]  # fmt: skip
    assert recorder.balanced()


def test_validation_inside_an_accumulated_step_nests_in_it_and_validate_alone_has_no_range(tmp_path, recorder):
    # Two micro-batches a step, validation every 3 batches: after the first micro-batch of step 1.
    fit(tmp_path, ProfilerWindow(start_step=1, num_steps=2, report=False), max_steps=3, accumulate=2, train_steps=6,
        val_batches=1, val_check_interval=3, num_sanity_val_steps=0)  # fmt: skip
    tree = dict(recorder.tree())
    assert [c for c, _ in tree["step 1"]] == ["data", "forward", "backward", "validation", "data", "forward",
                                              "backward", "optimizer"]  # fmt: skip
    assert recorder.balanced()
    recorder.events.clear()
    # trainer.validate: no training timeline, no range, and a window asked for is said to record nothing
    with pytest.warns(UserWarning, match="profile.start_step applies to fit's optimizer steps; this validate records"):
        fit(tmp_path, ProfilerWindow(start_step=0), max_steps=1, val_batches=1, stage="validate")
    assert recorder.events == []


def test_the_checkpoint_range_is_balanced_when_a_save_raises(recorder):
    from callbacks.ranges import checkpoint_range

    with pytest.raises(OSError, match="disk full"), checkpoint_range():
        raise OSError(28, "disk full")
    assert recorder.events == [("push", "checkpoint"), ("pop", None)]


def test_the_checkpoint_range_is_in_a_kineto_trace(recorder):
    from callbacks.ranges import checkpoint_range

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as trace:
        with checkpoint_range():
            torch.ones(4).add_(1)
    (event,) = [e for e in trace.events() if e.name == "checkpoint"]
    assert any(e.name == "aten::add_" and e.cpu_parent is event for e in trace.events())
    assert recorder.events == [("push", "checkpoint"), ("pop", None)]


def test_gradient_accumulation_counts_optimizer_steps(tmp_path, recorder):
    trainer = fit(tmp_path, ProfilerWindow(start_step=1, num_steps=1), max_steps=10, accumulate=2)
    assert trainer.global_step == 2
    tree = recorder.tree()
    assert [name for name, _ in tree] == ["step 0", "metrics", "step 1", "metrics", "epoch end"]
    for name, children in tree:
        if name.startswith("step"):
            first = "epoch start" if name == "step 0" else "data"  # the epoch's first fetch is named
            names = [c for c, _ in children]
            assert names == [first, "forward", "backward", "data", "forward", "backward", "optimizer"]


def test_data_range_wraps_the_real_loader_fetch(tmp_path, recorder):
    root = shapes_dataset.generate(tmp_path / "shapes", train_per_class=4, val_per_class=2, image_size=40)
    trainer = fit(tmp_path, ProfilerWindow(start_step=1, num_steps=2), max_steps=10, folder=root)
    assert trainer.global_step == 3
    steps = [children for name, children in recorder.tree() if name.startswith("step")]
    assert [[(c, [g for g, _ in grand]) for c, grand in children][0] for children in steps] == [
        ("epoch start", ["data"]), ("data", []), ("data", [])
    ]  # fmt: skip


def test_emit_nvtx_is_entered_and_exited_only_around_the_window(tmp_path, recorder, monkeypatch):
    calls = []

    class FakeEmit:
        def __init__(self, record_shapes: bool = False) -> None:
            self.record_shapes = record_shapes

        def __enter__(self):
            calls.append(("enter", id(self), step_of(), self.record_shapes))
            return self

        def __exit__(self, *exc):
            calls.append(("exit", id(self), step_of(), self.record_shapes))

    def step_of() -> str | None:
        opened = [n for k, n in recorder.events if k == "push" and n.startswith("step")]
        return opened[-1] if opened else None

    monkeypatch.setattr(torch.autograd.profiler, "emit_nvtx", FakeEmit)
    monkeypatch.setattr(callbacks.profiler_window, "_torch_nvtx_available", lambda: True)  # the fake needs no CUDA
    fit(tmp_path, ProfilerWindow(start_step=2, num_steps=3, emit_nvtx=True, record_shapes=True), max_steps=10)
    assert [c[0] for c in calls] == ["enter", "exit"]
    assert calls[0][1] == calls[1][1]  # the same object
    assert calls[0][2] == "step 1" and calls[1][2] == "step 4"  # entered before step 2's range, left after step 4's
    assert calls[0][3] is True


def test_the_real_emit_nvtx_on_a_cpu_run_never_stops_the_training(tmp_path, recorder):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = fit(
            tmp_path, ProfilerWindow(start_step=2, num_steps=2, emit_nvtx=True, exit_after=False), max_steps=6
        )
    assert trainer.global_step == 6
    assert [n for k, n in recorder.events if k == "push" and n.startswith("step")] == [f"step {i}" for i in range(6)]
    said = [str(w.message) for w in caught if "profile.emit_nvtx" in str(w.message)]
    # Without CUDA torch's NVTX mode cannot start, and that is said once; with it (a CPU run on a GPU machine) it runs.
    assert len(said) == (0 if torch.cuda.is_available() else 1)
    assert all("the window goes on without them" in message for message in said)


def test_emit_nvtx_is_left_out_without_cuda_also_on_a_cpu_only_build(tmp_path, recorder, monkeypatch):
    entered = []
    monkeypatch.setattr(callbacks.profiler_window, "_torch_nvtx_available", lambda: False)  # e.g. a CPU-only build
    monkeypatch.setattr(torch.autograd.profiler, "emit_nvtx", lambda **_: entered.append(1))
    with pytest.warns(UserWarning, match="torch's per-op NVTX ranges need CUDA"):
        trainer = fit(
            tmp_path, ProfilerWindow(start_step=1, num_steps=2, emit_nvtx=True, exit_after=False), max_steps=4
        )
    assert trainer.global_step == 4 and not entered


def test_several_windows_without_exit(tmp_path, recorder):
    window = ProfilerWindow(start_step=[1, 4], num_steps=1, exit_after=False, torch_profiler=True)
    trainer = fit(tmp_path, window, max_steps=6)
    assert trainer.global_step == 6
    names = [Path(p).name for p in window.trace_files]
    assert names == ["rank0_steps1-1.pt.trace.json", "rank0_steps4-4.pt.trace.json"]


def test_windows_num_steps_apart_are_recorded_back_to_back_and_one_step_closer_is_refused(tmp_path, recorder):
    # Adjacent windows ([1, 3) and [3, 5)) do not overlap: the first closes at the end of step 2 and the second opens
    # at the start of step 3, each with its own Kineto trace and step report.
    window = ProfilerWindow(start_step=[3, 1], num_steps=2, torch_profiler=True)
    trainer = fit(tmp_path, window, max_steps=10)
    assert trainer.global_step == 5  # exit_after: after the second window
    assert [p.name for p in window.trace_files] == ["rank0_steps1-2.pt.trace.json", "rank0_steps3-4.pt.trace.json"]
    for trace, steps in zip(window.trace_files, (["step 1", "step 2"], ["step 3", "step 4"]), strict=True):
        user = [e["name"] for e in json.loads(trace.read_text())["traceEvents"] if e.get("cat") == "user_annotation"]
        assert [n for n in user if n.startswith("step ")] == steps
    assert [[s["step"] for s in r["ranks"][0]["steps"]] for r in window.reports] == [[1, 2], [3, 4]]
    assert recorder.balanced()
    # One step closer, the second window's first step is the first one's last.
    with pytest.raises(ValueError, match=re.escape("windows [0, 10) and [9, 19) overlap with num_steps=10")):
        ProfilerWindow(start_step=[0, 9], num_steps=10)
    assert ProfilerWindow(start_step=[0, 10], num_steps=10).windows == [(0, 10), (10, 20)]


def test_kineto_trace_covers_exactly_the_window(tmp_path, recorder):
    window = ProfilerWindow(start_step=2, num_steps=3, torch_profiler=True)
    fit(tmp_path, window, max_steps=10)
    (trace,) = window.trace_files
    assert trace.parent == tmp_path / "traces" or trace.parent.name == "traces"
    events = json.loads(trace.read_text())["traceEvents"]
    user = [e["name"] for e in events if e.get("cat") == "user_annotation"]
    assert [n for n in user if n.startswith("step ")] == ["step 2", "step 3", "step 4"]
    assert user.count("forward") == user.count("backward") == user.count("optimizer") == 3
    assert not list(trace.parent.glob(".*partial"))


def test_a_window_cut_short_by_the_end_of_training_is_named_by_the_steps_it_holds(tmp_path, recorder):
    window = ProfilerWindow(start_step=3, num_steps=5, torch_profiler=True)
    with pytest.warns(UserWarning, match="cut short at the last step 4"):
        fit(tmp_path, window, max_steps=5)
    (trace,) = window.trace_files
    assert trace.name == "rank0_steps3-4.pt.trace.json"
    events = json.loads(trace.read_text())["traceEvents"]
    assert [e["name"] for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("step ")] == [
        "step 3", "step 4",
    ]  # fmt: skip
    # Closed with the run's last step, as a whole window closes with its own: what the fit's end runs after it (the
    # epoch's end, the stop's metrics row) is not in the capture.
    names = {e["name"] for e in events if e.get("cat") == "user_annotation"}
    assert {"data", "forward", "backward", "optimizer"} <= names
    assert not names & {"validation", "epoch end", "checkpoint", "metrics"}
    assert sorted(p.name for p in window.report_files) == ["window_3-4.json", "window_3-4.md", "window_3-4.png"]
    assert window.reports[0]["ranks"][0]["source"] == "host+kineto"  # the report found its trace


class _StopAfter(pl.Callback):
    """Sets ``trainer.should_stop`` at the end of optimizer step ``step`` (as a preemption or a time limit does)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: pl.Trainer, *args: object) -> None:
        if trainer.global_step == self.step + 1:
            trainer.should_stop = True


def test_a_window_a_stop_cuts_short_closes_with_the_stops_step(tmp_path, recorder):
    """A stop set before the window's hook (a callback ahead of it) at step 4 of a window of steps 3..7: the trace
    holds steps 3 and 4, not the epoch's end and the metrics row that follow the stop."""
    window = ProfilerWindow(start_step=3, num_steps=5, torch_profiler=True)
    trainer = fit_with_window(tmp_path, _StopAfter(4), 20, extra=[window])  # the stop's hook runs first
    assert trainer.global_step == 5
    (trace,) = window.trace_files
    assert trace.name == "rank0_steps3-4.pt.trace.json"
    names = {e["name"] for e in json.loads(trace.read_text())["traceEvents"] if e.get("cat") == "user_annotation"}
    assert {"step 3", "step 4", "forward"} <= names and not names & {"epoch end", "metrics", "step 5"}


def test_a_window_after_the_last_step_warns_and_no_window_at_all_is_refused(tmp_path, recorder):
    # One of two windows out of reach: the other is recorded.
    with pytest.warns(UserWarning, match="starts after the last step"):
        trainer = fit(tmp_path, ProfilerWindow(start_step=[1, 50], num_steps=1, report=False), max_steps=3)
    assert trainer.global_step == 3 and "step 1" in [name for name, _ in recorder.tree()]
    # None within reach: a whole run (under nsys) for nothing; refused before the first step.
    recorder.events.clear()
    with pytest.raises(ValueError, match=r"this run has steps 0\.\.2 .* no profiling window would open"):
        fit(tmp_path, ProfilerWindow(start_step=50), max_steps=3)
    assert not any(name and name.startswith("step") for _, name in recorder.events)


def test_a_loader_without_a_length_is_not_refused(tmp_path, recorder):
    # Lightning's estimated_stepping_batches is max_steps (-1 unset) for such a loader: no total to check against.
    from pytorch_lightning.demos.boring_classes import BoringModel
    from torch.utils.data import DataLoader, IterableDataset

    class Stream(IterableDataset):
        def __iter__(self):  # noqa: ANN204
            return iter(torch.randn(8, 32))

    class Model(BoringModel):
        def train_dataloader(self) -> DataLoader:
            return DataLoader(Stream(), batch_size=2)

    trainer = pl.Trainer(accelerator="cpu", max_epochs=2, callbacks=[ProfilerWindow(start_step=1, num_steps=1,
                         report=False)], logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, limit_val_batches=0)  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(Model())
    assert "step 1" in [name for name, _ in recorder.tree()]  # the window opened (exit_after stopped there)
    assert not [w for w in caught if "cut short" in str(w.message) or "after the last step" in str(w.message)]


def test_nothing_captures_the_window_is_said_once(tmp_path, recorder):
    with pytest.warns(UserWarning) as record:
        fit(tmp_path, ProfilerWindow(start_step=[1, 3], num_steps=1), max_steps=10)
    said = [str(w.message) for w in record if str(w.message).startswith("profile:")]
    # On a CPU run one warning says it all; the advice to launch under nsys's cudaProfilerApi range is for CUDA runs.
    assert len(said) == 1 and "the run is on cpu, not CUDA" in said[0]
    assert "nothing records this window now but the step report (profile.report)" in said[0]
    assert "launch under" not in said[0]


def test_a_cuda_run_that_nothing_captures_is_told_how_to_launch(tmp_path, recorder, monkeypatch):
    class OnCuda(ProfilerWindow):  # the CUDA branch of the window, its CUDA calls stood in for
        def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
            super().setup(trainer, pl_module, stage)
            self._cuda = True

    profiler_calls = []
    cudart = SimpleNamespace(
        cudaProfilerStart=lambda: profiler_calls.append("start") or 0,
        cudaProfilerStop=lambda: profiler_calls.append("stop") or 0,
    )
    monkeypatch.setattr(torch.cuda, "cudart", lambda: cudart)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *_: None)
    monkeypatch.delenv("CUDA_INJECTION64_PATH", raising=False)
    with pytest.warns(UserWarning) as record:
        fit(tmp_path, OnCuda(start_step=[1, 3], num_steps=1), max_steps=10)
    said = [str(w.message) for w in record if str(w.message).startswith("profile:")]
    assert len(said) == 1 and "launch under `nsys profile --capture-range=cudaProfilerApi" in said[0]
    assert profiler_calls == ["start", "stop"] * 2


@pytest.mark.gpu
def test_torchs_own_emit_nvtx_on_a_gpu_is_on_for_the_windows_steps_only(tmp_path, recorder):
    """The other emit_nvtx tests use a stand-in or run on a CPU, where the window leaves it out."""
    states = []

    class Probe(pl.Callback):
        def on_before_backward(self, trainer: pl.Trainer, *args: object) -> None:
            states.append((trainer.global_step, torch.autograd._profiler_enabled()))

    window = ProfilerWindow(start_step=2, num_steps=2, emit_nvtx=True, record_shapes=True, exit_after=False)
    trainer = fit(tmp_path, window, max_steps=6, extra=[Probe()], accelerator="gpu")
    assert trainer.global_step == 6 and window._emit is None
    assert states == [(0, False), (1, False), (2, True), (3, True), (4, False), (5, False)]


def test_exception_inside_the_window_closes_everything(tmp_path, recorder, monkeypatch):
    exits = []

    class FakeEmit:
        def __init__(self, record_shapes: bool = False) -> None:
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            exits.append(True)

    class Boom(pl.Callback):
        def on_before_backward(self, trainer, pl_module, loss):  # noqa: ANN001
            if trainer.global_step == 3:
                raise RuntimeError("boom inside the window")

    monkeypatch.setattr(torch.autograd.profiler, "emit_nvtx", FakeEmit)
    monkeypatch.setattr(callbacks.profiler_window, "_torch_nvtx_available", lambda: True)
    window = ProfilerWindow(start_step=2, num_steps=4, emit_nvtx=True)
    with pytest.raises(RuntimeError, match="boom"):
        fit(tmp_path, window, max_steps=10, extra=[Boom()])
    assert recorder.balanced()  # every pushed range popped, innermost first
    assert recorder.events[-1] == ("pop", None)
    assert exits == [True]
    assert window.ranges.names == []


def test_a_trace_that_cannot_be_written_is_a_warning_and_the_cuda_capture_still_stops(tmp_path, recorder, monkeypatch):
    class OnCuda(ProfilerWindow):  # the CUDA branch of the window, its CUDA calls stood in for
        def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
            super().setup(trainer, pl_module, stage)
            self._cuda = True

    profiler_calls: list[str] = []
    cudart = SimpleNamespace(
        cudaProfilerStart=lambda: profiler_calls.append("start") or 0,
        cudaProfilerStop=lambda: profiler_calls.append("stop") or 0,
    )
    monkeypatch.setattr(torch.cuda, "cudart", lambda: cudart)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *_: None)

    def disk_full(self: Any, path: str) -> None:
        Path(path).write_text("half a trace")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch.profiler.profile, "export_chrome_trace", disk_full)
    window = OnCuda(start_step=1, num_steps=2, torch_profiler=True, exit_after=False, trace_dir=str(tmp_path / "t"))
    with pytest.warns(UserWarning, match=r"could not write the Kineto trace .*rank0_steps1-2.*No space left"):
        trainer = fit(tmp_path, window, max_steps=5)
    assert trainer.global_step == 5  # trained on
    assert profiler_calls == ["start", "stop"]
    assert list((tmp_path / "t").iterdir()) == []  # no half-written trace left
    assert window.trace_files == [] and recorder.balanced()


def test_a_trace_libkineto_failed_to_write_is_a_warning_and_leaves_nothing(tmp_path, recorder, monkeypatch):
    def kineto_on_a_full_disk(self: Any, path: str) -> None:
        # libkineto writes <path>.tmp, renames it to <path> when done, and on a failed write only logs it.
        Path(path + ".tmp").write_text("half a trace")

    monkeypatch.setattr(torch.profiler.profile, "export_chrome_trace", kineto_on_a_full_disk)
    window = ProfilerWindow(start_step=1, num_steps=2, torch_profiler=True, exit_after=False, trace_dir=str(tmp_path))
    with pytest.warns(UserWarning, match=r"could not write the Kineto trace .*rank0_steps1-2.*wrote no .*full disk"):
        trainer = fit(tmp_path / "run", window, max_steps=4)
    assert trainer.global_step == 4 and window.trace_files == []
    assert [p.name for p in tmp_path.iterdir()] == ["run"]  # neither the trace nor libkineto's part of it


def test_a_trace_dir_that_cannot_be_written_is_refused_before_the_first_step(tmp_path, recorder):
    (tmp_path / "a_file").write_text("")
    window = ProfilerWindow(start_step=50, torch_profiler=True, trace_dir=str(tmp_path / "a_file" / "traces"))
    with pytest.raises(ValueError, match=r"profile.trace_dir: .*a_file is a file, not a folder"):
        fit(tmp_path, window, max_steps=60)
    assert recorder.events == []


def test_exception_with_kineto_stops_the_profiler(tmp_path, recorder):
    class Boom(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):  # noqa: ANN001
            if trainer.global_step == 2:
                raise RuntimeError("boom")

    window = ProfilerWindow(start_step=1, num_steps=3, torch_profiler=True)
    with pytest.raises(RuntimeError, match="boom"):
        fit(tmp_path, window, max_steps=10, extra=[Boom()])
    assert not torch.autograd.profiler._is_profiler_enabled
    assert recorder.balanced()
    # A fresh profiler can start: the aborted one let go of the thread.
    with torch.profiler.profile():
        torch.ones(1) + 1


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"start_step": -1}, "start_step must be"),
        ({"start_step": []}, r"profile\.start_step \[\] names no window; give the first step of one or more"),
        ({"start_step": 5, "num_steps": 0}, "num_steps must be >= 1"),
        ({"start_step": [10, 15], "num_steps": 10}, "overlap"),
        ({"start_step": 5, "emit_nvtx": True, "torch_profiler": True}, "cannot both be on"),
        ({"emit_nvtx": True}, "profile.emit_nvtx set without profile.start_step"),
        ({"ranks": [0]}, "profile.ranks set without profile.start_step"),
        ({"trace_dir": "t", "torch_profiler": True}, "profile.torch_profiler, profile.trace_dir set without"),
        ({"start_step": 1, "ranks": [-1]}, "ranks must be"),
        ({"start_step": 1, "ranks": []}, "ranks must be"),
        ({"start_step": 1, "ranks": [0, 0]}, r"profile\.ranks must be distinct .*got \[0, 0\]"),
        ({"start_step": 1, "record_shapes": True}, "record_shapes applies"),
        ({"start_step": 1, "trace_dir": "t"}, r"profile\.trace_dir t applies to profile\.torch_profiler .*turn it on"),
    ],
)
def test_nonsense_is_rejected_at_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ProfilerWindow(**kwargs)


def test_exit_after_under_min_steps_or_min_epochs_is_refused_before_training(tmp_path, recorder):
    """Lightning ignores a stop before trainer.min_steps/min_epochs: the profiling job trained on to its end, and said
    so only after the window. Refused before the first step, as a resume past the window is."""
    window = dict(start_step=1, num_steps=2, report=False)  # steps 1..2: exit_after stops after step 2, at step 3
    with pytest.raises(ValueError, match=re.escape(
        "profile.exit_after: trainer.min_steps 8 (exit_after stops the run after step 2, 3 steps done) keeps the run "
        "going past the last window (steps 1..2)"
    )):  # fmt: skip
        fit(tmp_path, ProfilerWindow(**window), max_steps=8, min_steps=8, train_steps=4)
    assert not recorder.events  # no step ran
    with pytest.raises(ValueError, match=re.escape(
        "trainer.min_epochs 1 (the last window ends in epoch 0, of 4 steps each) keeps the run going"
    )):  # fmt: skip
        fit(tmp_path, ProfilerWindow(**window), max_steps=8, min_epochs=1, train_steps=4)
    # Lightning makes min_epochs 1 once min_steps is set: met at step 3 of 4 an epoch, that still keeps it going, and
    # lowering min_steps would not help.
    with pytest.raises(ValueError, match=re.escape(
        "trainer.min_epochs 1 (the last window ends in epoch 0, of 4 steps each) keeps the run going past the last "
        "window (steps 1..2), and Lightning ignores a stop before it: this profiling job would train on to its end "
        "instead of stopping there. Lower it (Lightning makes trainer.min_epochs 1 when only trainer.min_steps is "
        "given: --trainer.min_epochs 0 then)"
    )):  # fmt: skip
        fit(tmp_path, ProfilerWindow(**window), max_steps=8, min_steps=3, train_steps=4)
    # Met at the stop: min_steps at the step it stops at, min_epochs by the epochs before the window's (4 batches of 2
    # accumulated: 2 steps an epoch, and the window at step 2 is in epoch 1).
    later = dict(start_step=2, num_steps=1, report=False)
    assert fit(tmp_path, ProfilerWindow(**later), max_steps=8, min_steps=3, train_steps=2).global_step == 3
    trainer = fit(tmp_path, ProfilerWindow(**later), max_steps=8, min_epochs=1, train_steps=4, accumulate=2)
    assert trainer.global_step == 3
    assert fit(tmp_path, ProfilerWindow(**window, exit_after=False), max_steps=4, min_steps=4).global_step == 4


def test_exit_after_under_a_minimum_not_foreseen_says_so_and_leaves_validation_on(tmp_path, recorder, monkeypatch):
    # The check before training needs the epoch's length (a loader without one): where it could not tell, Lightning
    # trains on through the stop, and exit_after neither claims to stop nor turns validation off.
    monkeypatch.setattr(callbacks.profiler_window, "_minimum_past", lambda trainer, end: None)
    window = ProfilerWindow(start_step=1, num_steps=2, report=False)
    with pytest.warns(UserWarning, match="min_steps/min_epochs keep the run going: exit_after does not stop it"):
        trainer = fit(tmp_path, window, max_steps=8, min_steps=8, train_steps=4, val_batches=1)
    assert trainer.global_step == 8 and trainer.limit_val_batches == 1


def test_exit_after_gives_the_validation_setting_back_at_the_end(tmp_path, recorder):
    trainer = fit(tmp_path, ProfilerWindow(start_step=1, num_steps=2, report=False), max_steps=8, val_batches=1)
    assert trainer.global_step == 3 and trainer.limit_val_batches == 1  # stopped after the window; validation back


def test_exit_after_gives_the_validation_setting_back_when_the_fit_ends_in_an_exception(tmp_path, recorder):
    # A preemption's exit (or any error) at exit_after's step: Lightning skips on_train_end, which gave it back.
    class FailsAtTheWindowsEnd(pl.Callback):
        trainer: pl.Trainer | None = None

        def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
            if trainer.limit_val_batches == 0:  # the window closed at this step, and exit_after turned validation off
                self.trainer = trainer
                raise RuntimeError("stopped here")

    failing = FailsAtTheWindowsEnd()
    with pytest.raises(RuntimeError, match="stopped here"):
        fit(tmp_path, ProfilerWindow(start_step=1, num_steps=2, report=False), max_steps=8, val_batches=1,
            extra=[failing])  # fmt: skip
    assert failing.trainer is not None and failing.trainer.limit_val_batches == 1 and recorder.balanced()


def test_exit_after_at_an_epochs_last_step_keeps_that_epochs_validation(tmp_path, recorder):
    class Validations(pl.Callback):
        steps: list[int] = []

        def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            if not trainer.sanity_checking:
                Validations.steps.append(trainer.global_step)

    # The window ends at step 3, the last of epoch 0 (4 steps an epoch): the stop comes at the epoch's end, whose
    # validation runs (skipped, that epoch would end validated by no one, and a resume would start the next epoch).
    window = ProfilerWindow(start_step=2, num_steps=2, report=False)
    trainer = fit(tmp_path, window, max_steps=12, train_steps=4, val_batches=1, extra=[Validations()])
    assert trainer.global_step == 4 and Validations.steps == [4]
    # Inside an epoch the stop still skips validation (the window at 1..2 ends at step 2 of 4).
    Validations.steps = []
    trainer = fit(tmp_path, ProfilerWindow(start_step=1, num_steps=2, report=False), max_steps=12, train_steps=4,
                  val_batches=1, extra=[Validations()])  # fmt: skip
    assert trainer.global_step == 3 and Validations.steps == []


def test_a_resume_past_the_last_windows_start_with_exit_after_is_refused_before_training():
    # Resumed at step 5 (a requeued profiling job, or main_amp's --prof with --resume): the window at 3..12 cannot be
    # recorded whole, and exit_after would never stop the run; without exit_after it only warns.
    resumed = SimpleNamespace(global_step=5, estimated_stepping_batches=100)
    with pytest.raises(ValueError, match=r"resumes at step 5, after the start of the last window \(steps 3\.\.12\)"):
        ProfilerWindow(start_step=3).on_train_start(resumed, None)
    # The window it suggests fits in the run (it said step 25 also where the run ends before it).
    for total, advice in [
        (
            100,
            "Start the window at a step in 5..90, so that its 10 steps fit in this run's remaining 5..99 (e.g. "
            "--profile.start_step 25)",
        ),
        (
            30,
            "Start the window at a step in 5..20, so that its 10 steps fit in this run's remaining 5..29 (e.g. "
            "--profile.start_step 20)",
        ),
        (12, "This run has steps 5..11 left, fewer than the window's 10: train longer"),
        (-1, "Place the window at or after step 5 (e.g. --profile.start_step 25)"),
    ]:
        with pytest.raises(ValueError, match=re.escape(advice)):
            ProfilerWindow(start_step=3).on_train_start(
                SimpleNamespace(global_step=5, estimated_stepping_batches=total), None
            )
    with pytest.warns(UserWarning, match="starts before step 5, where this run resumes"):
        ProfilerWindow(start_step=3, exit_after=False).on_train_start(resumed, None)
    ProfilerWindow(start_step=[1, 20]).on_train_start(resumed, None)  # the last window is still ahead


def test_a_window_ending_on_the_runs_last_step_is_not_said_to_be_cut_short():
    window = ProfilerWindow(start_step=2, num_steps=3)  # steps 2..4
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        window.on_train_start(SimpleNamespace(global_step=0, estimated_stepping_batches=5), None)  # steps 0..4
    with pytest.warns(UserWarning, match=r"window at steps 2\.\.4 is cut short at the last step 3"):
        ProfilerWindow(start_step=2, num_steps=3).on_train_start(
            SimpleNamespace(global_step=0, estimated_stepping_batches=4), None
        )


def test_rank_beyond_world_size_fails_at_setup(tmp_path, recorder):
    with pytest.raises(ValueError, match=r"valid ranks are 0\.\.0"):
        fit(tmp_path, ProfilerWindow(start_step=1, ranks=[1]), max_steps=3)


def test_cli_rejects_a_negative_start_before_training(tmp_path, refused, monkeypatch):
    monkeypatch.chdir(tmp_path)  # whatever the run would write lands here, not in the repository
    said = refused(
        ["--config", str(ROOT / "configs" / "quickstart.yaml"), "--profile.start_step", "-2", "--data.source",
         "synthetic", "--trainer.default_root_dir", str(tmp_path), "--trainer.logger.init_args.save_dir", str(tmp_path)]
    )  # fmt: skip
    assert "profile.start_step must be" in said
    assert not list(tmp_path.iterdir())  # refused before any folder


@pytest.mark.slow
def test_ddp_two_cpu_ranks_stop_together_and_write_one_trace_each(tmp_path, run_train):
    args = [
        *ddp_synthetic_args(tmp_path), "--trainer.callbacks+=profiling_helpers.FinalStepRecorder",
        "--profile.start_step", "3", "--profile.num_steps", "2", "--profile.torch_profiler", "true",
    ]  # fmt: skip
    env_changes = {"FINAL_STEP_DIR": str(tmp_path), "CUDA_INJECTION64_PATH": None}
    proc = run_train(args, cwd=ROOT, timeout=240, env_changes=env_changes)
    assert proc.returncode == 0, proc.stderr[-3000:]
    finals = {int(p.stem.removeprefix("rank")): json.loads(p.read_text()) for p in tmp_path.glob("rank*.json")}
    assert finals == {0: {"global_step": 5}, 1: {"global_step": 5}}
    # What a CPU run leaves out of the window is said once for the run, not once per rank.
    assert proc.stderr.count("not CUDA: cudaProfilerStart/Stop are skipped") == 1, proc.stderr[-3000:]
    # Where the traces went is said once, by rank 0 (the first rank that captures), not by every rank.
    assert proc.stderr.count("profile: Kineto trace written to") == 1, proc.stderr[-3000:]
    assert proc.stderr.count("[rank: 0] profile: Kineto trace written to") == 1, proc.stderr[-3000:]
    traces = sorted(p.name for p in tmp_path.rglob("*.pt.trace.json"))
    assert traces == ["rank0_steps3-4.pt.trace.json", "rank1_steps3-4.pt.trace.json"]
    for trace in tmp_path.rglob("*.pt.trace.json"):
        events = json.loads(trace.read_text())["traceEvents"]
        steps = [e["name"] for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("step ")]
        assert steps == ["step 3", "step 4"]
    # The step report (profile.report, on by default) of both ranks, written once, by rank 0, beside the traces.
    (report,) = tmp_path.rglob("step_report/window_3-4.json")
    assert report.parent.parent == next(tmp_path.rglob("traces")).parent
    ranks = json.loads(report.read_text())["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["source"] == "host+kineto" for r in ranks)


@pytest.mark.slow
def test_ddp_with_profile_ranks_1_only_rank_1_writes_a_trace_and_says_where(tmp_path, run_train):
    # profile.ranks [1]: rank 0 records nothing, so the line that says where the traces went comes from rank 1.
    args = [
        *ddp_synthetic_args(tmp_path), "--profile.start_step", "2", "--profile.num_steps", "1",
        "--profile.torch_profiler", "true", "--profile.ranks", "[1]", "--profile.report", "false",
    ]  # fmt: skip
    proc = run_train(args, cwd=ROOT, timeout=240, env_changes={"CUDA_INJECTION64_PATH": None})
    assert proc.returncode == 0, proc.stderr[-3000:]
    (trace,) = tmp_path.rglob("*.pt.trace.json")
    assert trace.name == "rank1_steps2-2.pt.trace.json"
    assert proc.stderr.count("profile: Kineto trace written to") == 1, proc.stderr[-3000:]
    assert f"[rank: 1] profile: Kineto trace written to {trace} (one per capturing rank)" in proc.stderr
