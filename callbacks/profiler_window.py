"""The profiling window: cudaProfilerStart/Stop around chosen optimizer steps, NVTX ranges, emit_nvtx, Kineto.

apex's ``--prof N`` in Lightning, for ``nsys profile --capture-range=cudaProfilerApi`` and
``ncu --profile-from-start off``: the capture holds exactly the steps asked for, each step is an NVTX range
``step N`` with children ``data``, ``forward``, ``backward`` and ``optimizer``, and the job ends cleanly after the
last window, every rank at the same step.

Range layout of one optimizer step (gradient accumulation repeats data/forward/backward per micro-batch)::

    step N
    ├── data       fetching the next batch: worker hand-off, pinned H2D copy and normalization issued
    ├── forward    training_step: forward pass and loss
    ├── backward   loss.backward(), DDP's gradient all-reduce overlapped inside it
    └── optimizer  gradient unscale/clip hooks, optimizer.step(), scaler update

``step N`` opens where Lightning starts fetching the step's batch, so the fetch belongs to the step, and closes
after the optimizer step. Lightning does not fetch ahead from a loader with a length (the app's are), so the
``data`` range of step N takes batch N from the prefetcher, which copied it during step N-1, and issues the copy of
batch N+1: the prefetcher works one batch ahead, like the original loop's ``prefetcher.next()``.

Between two steps, what runs is named too, so that no kernel of a window that crosses an epoch's end is left
without a range::

    validation   a validation pass during fit (the epoch's end, or val_check_interval), its checkpoint included;
                 inside ``step N`` when it comes in the middle of an accumulated step
    epoch end    from the train epoch-end hooks to the next epoch's first fetch: epoch metrics reduced across ranks,
                 the epoch's checkpoint, the next epoch's sampler (the loader's refill shows in that epoch's first
                 ``data`` range, where the prefetcher starts it; the step report counts that fetch with the gap)
    checkpoint   every save of the app's checkpoint callbacks and of the preemption handler (callbacks/ranges.py),
                 also the ones after a step (``every_n_train_steps``), which run once the step's range has closed

With ``report`` on (the default), every window also ends with a step-time report (``step_report.py``): per step and
phase on the host and the GPU, per rank, and whether the input copies overlap compute, written to
``<run folder>/step_report/window_<A>-<B>.{json,md,png}`` with a short summary printed on rank 0.
"""

from __future__ import annotations

import json
import logging
import math
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback
from pytorch_lightning.profilers import Profiler
from pytorch_lightning.utilities import rank_zero_info, rank_zero_warn
from pytorch_lightning.utilities.rank_zero import rank_prefixed_message
from typing_extensions import override  # a dependency (pyproject.toml); Lightning marks its hooks with it

from callbacks.ranges import CHECKPOINT, EPOCH_END, EPOCH_START, VALIDATION, RangeStack
from callbacks.step_timer import StepTimer, trainer_setup
from checkpoint_io import why_unwritable
from epoch_steps import optimizer_steps_per_epoch
from trace_summary import SETUP_KEY

#: Lightning's console logger (INFO is shown), for what a rank other than 0 says.
_log = logging.getLogger("pytorch_lightning.profile")

#: Suffix of the action Lightning's training loop reports to ``trainer.profiler`` around each batch fetch.
FETCH_ACTION = ".train_dataloader_next"


class _FetchObserver(Profiler):
    """Stands in for ``trainer.profiler`` to learn when the training loop fetches a batch; delegates everything.

    Lightning has no callback hook before the fetch, but it reports the fetch to the profiler, whatever the
    dataloader is.
    """

    def __init__(self, inner: Profiler, on_start: Callable[[], None], on_stop: Callable[[], None]) -> None:
        self.__dict__.update(inner=inner, on_start=on_start, on_stop=on_stop)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def start(self, action_name: str) -> None:
        if action_name.endswith(FETCH_ACTION):
            self.on_start()
        self.inner.start(action_name)

    def stop(self, action_name: str) -> None:
        self.inner.stop(action_name)
        if action_name.endswith(FETCH_ACTION):
            self.on_stop()

    def summary(self) -> str:
        return self.inner.summary()


def _torch_nvtx_available() -> bool:
    """Whether ``torch.autograd.profiler.emit_nvtx`` can start here: it synchronizes CUDA first."""
    return torch.cuda.is_available()


class ProfilerWindow(Callback):
    """Opens a CUDA profiler window over chosen optimizer steps and marks every step with NVTX ranges.

    Off unless ``start_step`` is given. Nsight Systems then records just the window::

        nsys profile -s none -t cuda,nvtx --capture-range=cudaProfilerApi --capture-range-end=stop \\
            -o resnet50 python train.py --config configs/resnet50_imagenet.yaml --profile.start_step 20

    Args:
        start_step: First optimizer step (Lightning's ``global_step``, 0-based) inside the window; a list opens
            one window per entry (use ``nsys --capture-range-end=repeat``). ``null`` turns profiling off.
        num_steps: Optimizer steps per window.
        ranks: Global ranks that open the CUDA profiler window (and write Kineto traces); ``null`` means all.
        exit_after: After the last window every rank stops at the same step, skips the validation (and its
            checkpoint) that would follow, and the process exits 0; ``last.ckpt`` is saved at that step, and a run
            resumed from it trains the rest of the epoch. At an epoch's last step the epoch's own validation and
            checkpoints still run (after the capture), so it ends as any epoch does. A
            ``trainer.min_steps``/``min_epochs`` that would keep the run going, or a resumed run past the last
            window's start, is refused before the first step (a warning where the epoch's length is not known).
        nvtx: NVTX ranges ``step N`` > ``data``/``forward``/``backward``/``optimizer`` around every step (not only
            inside the window; they cost well under 1% of a step).
        emit_nvtx: ``torch.autograd.profiler.emit_nvtx`` inside the window: one NVTX range per autograd op (large
            overhead, so never outside the window).
        record_shapes: Record input shapes in the emit_nvtx ranges / the Kineto trace.
        torch_profiler: Also record a Kineto trace (``torch.profiler``) of the window, one file per global rank,
            with the same ``step N`` ranges; open it in Perfetto or TensorBoard.
        trace_dir: Folder of the Kineto traces; default ``<run folder>/traces``.
        report: At the end of each window, the step-time report: phase times per step on the host clock and (on
            CUDA) from CUDA events, the prefetcher's copies and their overlap with compute, every rank gathered on
            rank 0, written as JSON, Markdown and PNG to ``<run folder>/step_report/`` and summarized on rank 0. Costs
            nothing outside the window; inside it one event per phase boundary, and one synchronize at its end.

    Raises:
        ValueError: For a negative ``start_step``, ``num_steps < 1``, negative or repeated ``ranks``, overlapping
            windows, ``emit_nvtx`` together with ``torch_profiler``, or window options (``ranks``, ``emit_nvtx``,
            ``torch_profiler``, ``record_shapes``, ``trace_dir``) without ``start_step``; at
            setup, for a rank that is not below the world size.
    """

    def __init__(
        self,
        start_step: int | list[int] | None = None,
        num_steps: int = 10,
        ranks: list[int] | None = None,
        exit_after: bool = True,
        nvtx: bool = True,
        emit_nvtx: bool = False,
        record_shapes: bool = False,
        torch_profiler: bool = False,
        trace_dir: str | None = None,
        report: bool = True,
    ) -> None:
        starts = [] if start_step is None else [start_step] if isinstance(start_step, int) else list(start_step)
        if start_step is not None and not starts:
            # An empty list (a job script's "[$STEPS]" with STEPS unset): under nsys the run would train to its end
            # for an empty capture, as with a window no step reaches (refused in on_train_start).
            raise ValueError(
                "profile.start_step [] names no window; give the first step of one or more (20 or [20,200]), or leave "
                "it unset (null) to profile nothing"
            )
        if any(not isinstance(s, int) or s < 0 for s in starts):
            raise ValueError(f"profile.start_step must be optimizer steps >= 0 (0-based global_step), got {start_step}")
        if num_steps < 1:
            raise ValueError(f"profile.num_steps must be >= 1, got {num_steps}")
        if ranks is not None and (not ranks or any(r < 0 for r in ranks) or len(set(ranks)) != len(ranks)):
            raise ValueError(
                f"profile.ranks must be distinct global ranks >= 0 (null: every rank), got {ranks}; to profile no "
                "rank, leave profile.start_step unset"
            )
        if emit_nvtx and torch_profiler:
            raise ValueError(
                "profile.emit_nvtx and profile.torch_profiler cannot both be on: they use the same autograd profiler "
                "('Profiler is already enabled on this thread'); pick emit_nvtx for Nsight, torch_profiler for Kineto"
            )
        window_options = {"ranks": ranks is not None, "emit_nvtx": emit_nvtx, "torch_profiler": torch_profiler,
                          "record_shapes": record_shapes, "trace_dir": trace_dir is not None}  # fmt: skip
        if not starts and any(window_options.values()):
            # Without a window they would do nothing, and the run the user set up to profile would capture nothing.
            given = ", ".join(f"profile.{key}" for key, on in window_options.items() if on)
            raise ValueError(
                f"{given} set without profile.start_step: they apply to a profiling window, and there is none; "
                "set profile.start_step (the window's first optimizer step), or leave them unset"
            )
        if record_shapes and not (emit_nvtx or torch_profiler):
            raise ValueError(
                "profile.record_shapes applies to profile.emit_nvtx or profile.torch_profiler; turn one on"
            )
        if trace_dir is not None and not torch_profiler:
            # The folder of the Kineto traces only (the step report goes to the run folder's step_report/).
            raise ValueError(
                f"profile.trace_dir {trace_dir} applies to profile.torch_profiler (where its Kineto traces go); turn "
                "it on (--profile.torch_profiler true), or leave profile.trace_dir unset"
            )
        self.windows = sorted((s, s + num_steps) for s in starts)
        for (a_start, a_end), (b_start, b_end) in zip(self.windows, self.windows[1:], strict=False):
            if b_start < a_end:
                raise ValueError(
                    f"profile.start_step: windows [{a_start}, {a_end}) and [{b_start}, {b_end}) overlap "
                    f"with num_steps={num_steps}; start windows at least num_steps apart"
                )
        self.num_steps = num_steps
        self.ranks = ranks
        self.exit_after = exit_after
        self.emit_nvtx = emit_nvtx
        self.record_shapes = record_shapes
        self.torch_profiler = torch_profiler
        self.trace_dir = trace_dir
        self.report = report
        self.ranges = RangeStack(enabled=nvtx)
        self.timer = StepTimer()
        self.trace_files: list[Path] = []
        self.report_files: list[Path] = []
        self.reports: list[dict] = []  # rank 0: the report of each window, as written to JSON
        self._step: int | None = None  # the optimizer step whose range is open
        self._window: tuple[int, int] | None = None  # the window being recorded
        self._profiling_here = False  # this rank opened the CUDA profiler / emit_nvtx / Kineto for the window
        self._cuda = False
        self._emit: Any = None
        self._kineto: Any = None
        self._observer: _FetchObserver | None = None
        self._trainer: pl.Trainer | None = None
        self._rank = 0
        self._trace_dir = Path(trace_dir or "traces")
        self._report_dir = Path("step_report")
        self._warned: set[str] = set()
        self._limit_val_batches: int | float | None = None  # the trainer's, while exit_after skips validation
        self._epoch_starting = False  # the next fetch is the first of an epoch, or of this process's training
        self._last_step: int | None = None  # the run's last optimizer step, where its length is known

    @property
    def enabled(self) -> bool:
        return bool(self.windows)

    # --- setup and checks -----------------------------------------------------------------------------
    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.enabled and stage != "fit":
            # The window counts a fit's optimizer steps; an evaluation has none.
            name = getattr(stage, "value", stage)  # Lightning passes a TrainerFn, a str enum
            rank_zero_warn(f"profile.start_step applies to fit's optimizer steps; this {name} records no window")
        if not self.enabled or stage != "fit":
            return
        if self.ranks is not None and max(self.ranks) >= trainer.world_size:
            raise ValueError(
                f"profile.ranks {self.ranks} names a rank >= the world size {trainer.world_size}; "
                f"valid ranks are 0..{trainer.world_size - 1}"
            )
        self._cuda = trainer.strategy.root_device.type == "cuda"
        self._trainer = trainer
        if self.torch_profiler or self.report:
            # trainer.log_dir is a collective under DDP: resolve it here, where every rank runs, not in the window.
            run_folder = Path(trainer.log_dir or ".")
            self._trace_dir = Path(self.trace_dir) if self.trace_dir else run_folder / "traces"
            self._report_dir = run_folder / "step_report"
            unwritable = why_unwritable(self._trace_dir) if self.torch_profiler else None
            if unwritable:
                # Found now, not when the window closes after hours of training.
                raise ValueError(
                    f"profile.trace_dir: the Kineto traces go to {self._trace_dir}, and {unwritable}; pass a folder "
                    "this job can write to (--profile.trace_dir DIR)"
                )
        self._observer = _FetchObserver(trainer.profiler, self._on_fetch_start, self._on_fetch_end)
        trainer.profiler = self._observer

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self.enabled:
            return
        # The first fetch of this process refills the loader from empty, also on a resume inside an epoch (where
        # Lightning calls no on_train_epoch_start).
        self._epoch_starting = True
        total = trainer.estimated_stepping_batches
        first = trainer.global_step
        self._last_step = int(total) - 1 if 0 <= total < math.inf else None
        last_start, last_end = self.windows[-1]
        if self.exit_after and last_start < first:
            # The last window can no longer be recorded whole, so exit_after's stop would never come: this profiling
            # job would train on to trainer.max_epochs (under nsys). Before the first step, on every rank alike.
            raise ValueError(
                f"profile.start_step: this run resumes at step {first}, after the start of the last window (steps "
                f"{last_start}..{last_end - 1}), and profile.exit_after would stop it only at that window's end: it "
                f"would train to its end instead. {_a_window_that_fits(first, last_end - last_start, total)}, or "
                "--profile.exit_after false to train on without it"
            )
        if self.exit_after and (keeps_going := _minimum_past(trainer, last_end)):
            # Lightning ignores a stop before trainer.min_steps/min_epochs: the same job trained to its end.
            raise ValueError(
                f"profile.exit_after: {keeps_going} keeps the run going past the last window (steps {last_start}.."
                f"{last_end - 1}), and Lightning ignores a stop before it: this profiling job would train on to its "
                "end instead of stopping there. Lower it (Lightning makes trainer.min_epochs 1 when only "
                "trainer.min_steps is given: --trainer.min_epochs 0 then), or --profile.exit_after false to train "
                "on with it"
            )
        # Only for a known total: a loader without a length gives max_steps there (-1 when unset).
        if 0 <= total < math.inf and all(start >= total for start, _ in self.windows):
            # No window can open (a start step past max_steps, or max_epochs x limit_train_batches): the run would
            # train to its end with nothing recorded, under nsys --capture-range=cudaProfilerApi a whole run for an
            # empty report. Refused before the first step, on every rank alike (the same total everywhere).
            starts = ", ".join(str(start) for start, _ in self.windows)
            raise ValueError(
                f"profile.start_step {starts}: this run has steps 0..{int(total) - 1} (trainer.max_steps/max_epochs/"
                "limit_train_batches), so no profiling window would open and the run would train to its end with "
                f"nothing recorded; start the window below step {int(total)} or train longer"
            )
        for start, end in self.windows:
            if start < first:
                rank_zero_warn(
                    f"profile: window at steps {start}..{end - 1} starts before step {first}, where this run resumes; "
                    "it will not be recorded"
                )
            elif 0 <= total <= start:
                rank_zero_warn(
                    f"profile: window at steps {start}..{end - 1} starts after the last step of this run "
                    f"(steps 0..{int(total) - 1}: see trainer.max_steps/max_epochs/limit_train_batches); "
                    "it will not be recorded"
                )
            elif 0 <= total < end:
                rank_zero_warn(
                    f"profile: window at steps {start}..{end - 1} is cut short at the last step {int(total) - 1}"
                )

    # --- ranges ---------------------------------------------------------------------------------------
    def _begin_step(self, trainer: pl.Trainer) -> None:
        if self._step is not None:
            return
        step = trainer.global_step
        for window in self.windows:
            if window[0] == step:
                self._open_window(trainer, window)
        self._step = step
        self.ranges.push(f"step {step}")
        if self.timer.active:
            self.timer.begin(step, "step")

    def _end_step(self, trainer: pl.Trainer) -> None:
        step = self._step
        # A window the run's end cuts short closes with the run's last step (trainer.max_steps/max_epochs, or a stop
        # set before this hook: trainer.should_stop, the same on every rank), as a whole window closes with its own:
        # the validation, the epoch's end and the checkpoints after it are not captured. Where the run's length is
        # unknown, or its stop comes later, the window closes at on_train_end, with them.
        stopping = trainer.should_stop and getattr(trainer.fit_loop, "_can_stop_early", True)
        closing = self._window is not None and (step == self._window[1] - 1 or step == self._last_step or stopping)
        if closing and self._window is not None and step is not None and step < self._window[1] - 1:
            # Named by the steps it holds (its trace file and report alike), not the steps asked for.
            self._window = (self._window[0], step + 1)
        if self.timer.active and step is not None:
            self.timer.end_phases(step)
            self.timer.end(step, "step")
        if closing and self._cuda and self._profiling_here:
            # Stop only once the window's work has run on the GPU, so its last kernels are in the capture.
            torch.cuda.synchronize(trainer.strategy.root_device)
        self.ranges.close_all()
        self._step = None
        if closing:
            window = self._window
            self._close_window()
            self._write_report(trainer, window)
            if self.exit_after and step == self.windows[-1][1] - 1:
                if not getattr(trainer.fit_loop, "_can_stop_early", True):
                    rank_zero_warn(
                        f"profile: last window done at step {step}, but trainer.min_steps/min_epochs keep the run "
                        "going: exit_after does not stop it (set them below the window to stop here)"
                    )
                    return
                rank_zero_info(f"profile: last window done at step {step}; stopping every rank here (exit_after)")
                trainer.should_stop = True
                if trainer.fit_loop.epoch_loop.batch_progress.is_last_batch:
                    # The epoch's own validation and checkpoints run (after the capture): skipped, the epoch would
                    # end validated by no one, and a run resumed from its checkpoint would start the next epoch.
                    return
                # What would follow is a validation pass nobody profiles (and its checkpoint); skip it, and give the
                # setting back at the end of the fit (a validate after it in this process validates again).
                self._limit_val_batches = trainer.limit_val_batches
                trainer.limit_val_batches = 0

    def _on_fetch_start(self) -> None:
        trainer = self._trainer
        if trainer is not None and trainer.training:
            self._close_between_steps()
            self._begin_step(trainer)
            if self._epoch_starting:
                # Named on the timeline, and moved out of the step by the step report: a cost of the epoch's start.
                self._epoch_starting = False
                self.ranges.push(EPOCH_START)
                if self.timer.active and self._step is not None:
                    self.timer.epoch_start(self._step)
            self.ranges.push("data")
            self._mark("data", True)

    def _on_fetch_end(self) -> None:
        self.ranges.pop_if_top("data")
        self.ranges.pop_if_top(EPOCH_START)
        self._mark("data", False)

    def _mark(self, phase: str, begin: bool) -> None:
        if self.timer.active and self._step is not None:
            self.timer.mark(self._step, phase, begin)

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if not self.enabled:
            return
        self._close_between_steps()  # a loader that Lightning does not see fetching: the step starts here
        self._epoch_starting = False  # its first fetch, if any, was not seen: nothing to name
        self._begin_step(trainer)
        self.ranges.push("forward")
        if self.timer.active and self._step is not None:
            self.timer.add_images(self._step, batch)
            self.timer.mark(self._step, "forward", True)

    @override
    def on_before_zero_grad(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any) -> None:
        if self.enabled:
            self.ranges.pop_if_top("forward")
            self._mark("forward", False)

    @override
    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: torch.Tensor) -> None:
        if self.enabled:
            self.ranges.pop_if_top("forward")
            self._mark("forward", False)
            self.ranges.push("backward")
            self._mark("backward", True)

    @override
    def on_after_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.enabled:
            self.ranges.pop_if_top("backward")
            self._mark("backward", False)

    @override
    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any) -> None:
        if self.enabled:
            self.ranges.push("optimizer")
            self._mark("optimizer", True)

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not self.enabled or self._step is None:
            return
        if trainer.global_step > self._step:
            self._end_step(trainer)
        else:  # accumulating gradients: the step goes on with the next micro-batch
            while self.ranges.top() not in (None, f"step {self._step}"):
                self.ranges.pop(self.ranges.top())  # type: ignore[arg-type]
            if self.timer.active:
                self.timer.end_phases(self._step)

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Only inside fit: a standalone validate/test is no training timeline. The range stays open past
        # on_validation_end, where the checkpoint callbacks (called after this one) save.
        if self.enabled and trainer.state.fn == "fit" and not trainer.sanity_checking:
            self.ranges.push(VALIDATION)  # nested in the step when it runs inside an accumulated step
            if self._step is None:
                self._between_steps(trainer, VALIDATION)

    @override
    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict) -> None:
        # Every save (every rank dumps the state) between steps, e.g. every_n_train_steps after a step has closed, is
        # a gap the step report leaves out; one inside validation or an epoch's end joins that gap's name.
        if self.enabled and self._step is None:
            self._between_steps(trainer, CHECKPOINT)

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.enabled:
            self._epoch_starting = True

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Lightning runs this hook of ordinary callbacks before the module's and the checkpoints' (monitoring
        # callbacks come last), so the range holds the epoch's checkpoint and its metric reduction; it closes at the
        # next fetch, or when training ends.
        if self.enabled and self._step is None:
            self._close_between_steps()
            self.ranges.push(EPOCH_END)
            self._between_steps(trainer, EPOCH_END)

    def _between_steps(self, trainer: pl.Trainer, name: str) -> None:
        # Inside a window the step report leaves this gap out of its wall time and GPU busy fraction and lists it.
        if self.timer.active:
            self.timer.between(trainer.global_step - 1, name)

    def _close_between_steps(self) -> None:
        self.ranges.pop_if_top(EPOCH_END)
        self.ranges.pop_if_top(VALIDATION)

    def _restore_validation(self, trainer: pl.Trainer) -> None:
        """Gives the trainer back the validation that exit_after turned off for the fit's last steps."""
        if self._limit_val_batches is not None:
            trainer.limit_val_batches, self._limit_val_batches = self._limit_val_batches, None

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._restore_validation(trainer)
        if self.enabled:
            self._close_between_steps()
        # A window cut short by the end of training: close it as a full one would be (its Kineto trace exported, the
        # CUDA profiler stopped once its work ran) and report the steps it holds. Every rank gets here at the same
        # step (training ends together), so the report's gather is safe; after an exception it is not, and
        # on_exception drops the timing instead.
        window = self._window
        if window is None or self._step is not None:
            return
        if self._cuda and self._profiling_here:
            torch.cuda.synchronize(trainer.strategy.root_device)
        # Named by the steps it holds (its trace file and report alike), not the steps asked for.
        self._window = window = (window[0], max(min(window[1], trainer.global_step), window[0] + 1))
        self._close_window()
        self._write_report(trainer, window)

    # --- the window -----------------------------------------------------------------------------------
    def _open_window(self, trainer: pl.Trainer, window: tuple[int, int]) -> None:
        self._window = window
        self._rank = trainer.global_rank
        self._profiling_here = self.ranks is None or trainer.global_rank in self.ranks
        steps = window[1] - window[0]
        rank_zero_info(f"profile: window opens at step {window[0]} for {steps} step{'s' if steps != 1 else ''}")
        if self.report:  # every rank: the report covers all of them, whichever ranks capture the window
            self.timer.start(trainer, window)
        uncaptured = not self.torch_profiler and not os.environ.get("CUDA_INJECTION64_PATH")
        if trainer.global_rank == 0 and uncaptured and self._cuda:
            self._warn_once(
                "uncaptured",
                "profile: no Nsight tool is attached to this process (CUDA_INJECTION64_PATH is unset) and "
                f"profile.torch_profiler is off, so nothing records this window{self._besides_report}; launch under "
                "`nsys profile --capture-range=cudaProfilerApi ...` or `ncu --profile-from-start off ...`",
            )
        # Every rank runs on the same kind of device: what CPU leaves out is said once for the run, by rank 0, whether
        # or not it captures the window itself. The Nsight advice above is for CUDA runs.
        nvtx_left_out = self.emit_nvtx and not self._cuda and not _torch_nvtx_available()
        if trainer.global_rank == 0 and not self._cuda:
            self._warn_once(
                "cpu",
                f"profile: the run is on {trainer.strategy.root_device.type}, not CUDA: cudaProfilerStart/Stop are "
                "skipped (nsys --capture-range=cudaProfilerApi and ncu capture nothing); the NVTX ranges (a plain "
                "`nsys profile`) and the Kineto trace (profile.torch_profiler) still work (without a GPU, Kineto's "
                "own `gpuGetDeviceCount failed` line is harmless)"
                + (f"; nothing records this window now{self._besides_report}" if uncaptured else ""),
            )
        if trainer.global_rank == 0 and nvtx_left_out:
            # torch's NVTX mode starts with a CUDA synchronize, which raises without a CUDA device (or a CUDA build).
            # The app's own ranges are the nvtx package's and need no GPU; the window goes on with them.
            self._warn_once(
                "emit_nvtx",
                "profile.emit_nvtx: torch's per-op NVTX ranges need CUDA, which this machine does not have; the window "
                "goes on without them (the step and phase ranges are unchanged)",
            )
        if not self._profiling_here:
            return
        if self._cuda:
            self._check(torch.cuda.cudart().cudaProfilerStart(), "cudaProfilerStart")
        if self.emit_nvtx and not nvtx_left_out:
            self._emit = torch.autograd.profiler.emit_nvtx(record_shapes=self.record_shapes)
            self._emit.__enter__()
        if self.torch_profiler:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if self._cuda:
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self._kineto = torch.profiler.profile(activities=activities, record_shapes=self.record_shapes)
            self._kineto.start()
            # The run's settings in the trace itself, as a live step report records them: step_report.py makes a
            # report of the trace alone (copied away from its run folder) that --compare tells apart from another
            # run's by every setting, the GPU and torch included.
            self._kineto.add_metadata_json(SETUP_KEY, json.dumps(trainer_setup(trainer)))
            self.ranges.kineto = True

    def _close_window(self, export: bool = True) -> None:
        window, self._window = self._window, None
        if not self._profiling_here or window is None:
            return
        self._profiling_here = False
        # Leave in reverse order of entry, and the CUDA profiler last so that everything before is in the capture;
        # each also when what came before it failed (nothing else would stop the capture: the window is closed).
        try:
            if self._kineto is not None:
                kineto, self._kineto = self._kineto, None
                self.ranges.kineto = False
                kineto.stop()
                if export:
                    self._export(kineto, window)
        finally:
            try:
                if self._emit is not None:
                    emit, self._emit = self._emit, None
                    emit.__exit__(None, None, None)
            finally:
                if self._cuda:
                    self._check(torch.cuda.cudart().cudaProfilerStop(), "cudaProfilerStop")

    def _write_report(self, trainer: pl.Trainer, window: tuple[int, int] | None) -> None:
        """Ends the window's timing and writes the report (rank 0) from every rank's summary; all ranks call it."""
        if not self.timer.active or window is None:
            return
        summary = self.timer.finish(trainer)
        trace = next((p for p in self.trace_files if p.name == self._trace_name(window)), None)
        written = self.timer.report(trainer, summary, self._report_dir, trace)
        if written is not None:
            self.reports.append(written[0])
            self.report_files += written[1]

    def _trace_name(self, window: tuple[int, int]) -> str:
        return f"rank{self._rank}_steps{window[0]}-{window[1] - 1}.pt.trace.json"

    def _export(self, kineto: Any, window: tuple[int, int]) -> None:
        final = self._trace_dir / self._trace_name(window)
        partial = final.with_name(f".{final.name}.{os.getpid()}.partial")
        kinetos_own = partial.with_name(partial.name + ".tmp")  # libkineto writes this, then renames it to partial
        try:
            self._trace_dir.mkdir(parents=True, exist_ok=True)
            kineto.export_chrome_trace(str(partial))
            if not partial.exists():
                # libkineto reports a failed write only in its own log ("Failed to write to log file!") and returns.
                raise OSError(f"the profiler wrote no {partial.name} (a full disk?); its log says why")
            os.replace(partial, final)  # a reader never sees half a trace
        except OSError as error:
            # A full disk at the window's end: the trace is a diagnostic, and the training (and, under DDP, the other
            # ranks waiting for this one in the step report) goes on without it, and without the part it wrote.
            partial.unlink(missing_ok=True)
            kinetos_own.unlink(missing_ok=True)
            warnings.warn(f"profile: rank {self._rank} could not write the Kineto trace {final}: {error}", stacklevel=2)
            return
        self.trace_files.append(final)
        # Said by the first rank that captures (rank 0 may not: profile.ranks), once for the run.
        if self._rank == (0 if self.ranks is None else min(self.ranks)):
            said = f"profile: Kineto trace written to {final} (one per capturing rank)"
            _log.info(rank_prefixed_message(said, self._rank))

    # --- cleanup --------------------------------------------------------------------------------------
    def close(self) -> None:
        """Closes every range, emit_nvtx, the Kineto profiler and the CUDA profiler window, whatever is open."""
        self.timer.abort()
        self.ranges.close_all()
        self._step = None
        self._close_window(export=False)

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        # Also a preemption's exit at exit_after's step, where on_train_end never comes: a later validate or fit on
        # this trainer validates again.
        self._restore_validation(trainer)
        self.close()

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.close()
        if self._observer is not None and trainer.profiler is self._observer:
            trainer.profiler = self._observer.inner
        self._observer = None

    @property
    def _besides_report(self) -> str:
        return " but the step report (profile.report)" if self.report else ""

    def _check(self, status: Any, call: str) -> None:
        code = int(getattr(status, "value", status))
        if code != 0:
            self._warn_once(call, f"profile: {call}() returned CUDA error {code}")

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, stacklevel=2)


def _a_window_that_fits(first: int, length: int, total: float) -> str:
    """Advice for a window of ``length`` steps in a run resumed at step ``first`` with ``total`` steps in all (``-1``
    or infinite when not known)."""
    if not 0 <= total < math.inf:
        return f"Place the window at or after step {first} (e.g. --profile.start_step {first + 20})"
    if first + length > total:
        return (
            f"This run has steps {first}..{int(total) - 1} left, fewer than the window's {length}: train longer "
            "(trainer.max_steps/max_epochs) or shorten the window (--profile.num_steps)"
        )
    return (
        f"Start the window at a step in {first}..{int(total) - length}, so that its {length} steps fit in this run's "
        f"remaining {first}..{int(total) - 1} (e.g. --profile.start_step {min(first + 20, int(total) - length)})"
    )


def _minimum_past(trainer: pl.Trainer, end: int) -> str | None:
    """``trainer.min_steps N`` or ``trainer.min_epochs N`` when it is not yet met after step ``end - 1``, where
    exit_after stops: Lightning then trains on (its fit loop's ``_can_stop_early``, which counts the epochs done
    before the one that holds that step; Lightning sets min_epochs to 1 when only min_steps is given)."""
    min_steps = getattr(trainer, "min_steps", None) or 0
    if min_steps > end:
        return f"trainer.min_steps {min_steps} (exit_after stops the run after step {end - 1}, {end} steps done)"
    min_epochs = getattr(trainer, "min_epochs", None) or 0
    batches = getattr(trainer, "num_training_batches", math.inf)
    if min_epochs and 0 < batches < math.inf:
        steps_per_epoch = optimizer_steps_per_epoch(batches, trainer.accumulate_grad_batches)
        epoch = (end - 1) // steps_per_epoch
        if epoch < min_epochs:
            return (
                f"trainer.min_epochs {min_epochs} (the last window ends in epoch {epoch}, of {steps_per_epoch} "
                "steps each)"
            )
    return None
