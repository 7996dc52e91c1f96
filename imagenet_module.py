"""The LightningModule: a torchvision classifier trained with the ImageNet recipe of apex's main_amp.py.

Recipe: SGD with momentum and weight decay; the learning rate is ``lr`` per 256 images, scaled to the global batch
(per-device batch x devices x gradient accumulation); it rises linearly per step over the first ``warmup_epochs``
and is multiplied by ``lr_gamma`` at each epoch of ``lr_milestones`` (30, 60, 80), or follows a cosine after the
warmup.

Metrics avoid host syncs in the hot loop: per-step training values are added into one device buffer (one in-place
add a step), the periodic train line (loss, top-1, top-5, images/s, like the original's print_freq line) is reduced
across ranks only every ``trainer.log_every_n_steps`` steps, the same steps on every rank, ``train_loss_epoch`` once
per epoch, and validation accuracy and loss are torchmetrics objects that synchronize once, at the end.
"""

from __future__ import annotations

import math
import time
from typing import Any, Literal

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from pytorch_lightning.utilities import rank_zero_info, rank_zero_warn
from torchmetrics import Metric
from typing_extensions import override  # a dependency (pyproject.toml); Lightning marks its hooks with it

from bad_image_policy import IGNORED_TARGET
from callbacks.ranges import METRICS, app_range
from callbacks.resumable_checkpoint import inside_the_epoch, resume_at_the_next_epoch
from epoch_steps import optimizer_steps_per_epoch
from torchvision_models import build_model

#: Trainer precisions that run through Lightning's MixedPrecision plugin (autocast; GradScaler for 16-mixed).
MIXED_PRECISIONS = ("16-mixed", "bf16-mixed")


class WeightedMean(Metric):
    """The weighted mean of the values seen, summed across ranks at ``compute``; no host sync in ``update``.

    torchmetrics' ``MeanMetric`` drops the weights under ``nan_strategy="disable"`` (1.9: its NaN check, which would
    sync with the host each step, is also where it keeps them).
    """

    full_state_update = False

    def __init__(self) -> None:
        super().__init__()
        self.add_state("total", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("weight", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")

    @override
    def update(self, values: torch.Tensor, weights: torch.Tensor) -> None:
        self.total += (values.double() * weights.double()).sum()
        self.weight += weights.double().sum()

    @override
    def compute(self) -> torch.Tensor:
        return (self.total / self.weight).float()


#: What the module logs: every log_every_n_steps steps (train_*), per training epoch (train_loss_epoch), per
#: validation (val_*); what a checkpoint callback may monitor or name in its file name (config_checks.py checks it).
LOGGED_METRICS = (
    "train_loss", "train_acc1", "train_acc5", "train_img_s", "train_loss_epoch", "val_loss", "val_acc1", "val_acc5"
)  # fmt: skip


def lr_multiplier(
    step: int,
    steps_per_epoch: int,
    warmup_epochs: float,
    schedule: str,
    milestones: list[int],
    gamma: float,
    total_steps: int | None = None,
) -> float:
    """The factor applied to the scaled base learning rate at optimizer step ``step`` (0-based).

    The cosine schedule reaches zero at ``total_steps`` (required for it; the step schedule ignores it).

    Warmup is linear per step: ``(1 + step) / (warmup_epochs * steps_per_epoch)`` while ``step`` is inside the
    warmup, so the first step uses a small but non-zero rate and the last warmup step reaches the full rate. apex's
    main_amp.py computed ``(1 + i + epoch * steps_per_epoch)`` with its 1-based ``i``: one step ahead of this, from
    twice this first rate to ``1 + 1 / warmup_steps`` of the full rate at its last warmup step.
    """
    epoch = step // steps_per_epoch
    warmup_steps = warmup_epochs * steps_per_epoch
    if schedule == "cosine":
        if total_steps is None:
            raise ValueError("lr_multiplier: the cosine schedule needs total_steps")
        total = max(total_steps - warmup_steps, 1)
        progress = min(max(step - warmup_steps, 0) / total, 1.0)
        factor = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:
        factor = gamma ** sum(epoch >= m for m in milestones)
    if step < warmup_steps:
        factor *= (1 + step) / warmup_steps
    return factor


class ImageNetClassifier(pl.LightningModule):
    """A torchvision image classifier with the apex ImageNet recipe.

    Args:
        arch: Any torchvision classification model name (``resnet50``, ``resnet18``, ``wide_resnet50_2``, ...).
        num_classes: Number of output classes (linked from ``data.num_classes``).
        weights: Local torchvision ``state_dict`` file to start from (there is no download). A head of another
            class count is re-initialized.
        lr: Learning rate per 256 images; the rate used is ``lr * global_batch / 256``.
        momentum: SGD momentum.
        weight_decay: SGD weight decay (L2), applied to all parameters as in the original.
        nesterov: Use Nesterov momentum.
        warmup_epochs: Epochs of linear per-step warmup (0 disables it).
        lr_schedule: ``step`` (multiply by ``lr_gamma`` at each of ``lr_milestones``) or ``cosine`` (to zero at
            ``trainer.max_epochs``; at ``trainer.max_steps`` in a run bounded by steps alone).
        lr_milestones: Epochs at which the step schedule decays.
        lr_gamma: Decay factor of the step schedule.
        label_smoothing: Label smoothing of the cross-entropy loss.
        batch_size: Per-device batch size (linked from ``data.batch_size``), for the learning-rate scaling.
        channels_last: Run the model in channels_last memory format (tensor cores want NHWC).
        compile: ``torch.compile`` the model with this mode (``default``, ``reduce-overhead``, ``max-autotune``,
            ``max-autotune-no-cudagraphs``), or ``null`` for eager. Shapes are static: each batch shape (training,
            validation, a short last batch) gets its own graph. ``reduce-overhead`` is the recipe the configs recommend;
            ``max-autotune`` trained ResNet-50 about 5% faster on an H200 (two calls, not side by side) but
            compiled for about seven minutes.
        compile_tuning: Tune the launch configuration of every Triton kernel the compile generates by coordinate
            descent, at the kernel's first run (inductor's ``coordinate_descent_tuning``: the part of ``max-autotune``
            that is not its conv/GEMM template search; those modes include it). On an H200, ResNet-50 bf16 under
            ``reduce-overhead`` trained at 7,264 img/s with it against 6,936 without, side by side (1.047; 1.048 in
            another call; ``max-autotune`` gave 7,244 on another machine), for 150-200 s more before the first step
            (about half of ``max-autotune``'s extra: it took 405 s, against about 60 s untuned). Each validation shape
            tunes its own kernels too. Needs ``compile``.
        fused_sgd: The SGD kernel. ``true``: torch's fused SGD, one kernel for the whole update; under ``16-mixed``
            it also takes GradScaler's overflow check: a step with inf/NaN gradients is skipped on the GPU, so no
            step waits for the host to read the check back (the unfused optimizer syncs once per step for it).
            ``false``: torch's default SGD (foreach on CUDA). ``null`` (default): fused on CUDA, except with
            ``trainer.gradient_clip_val`` under ``16-mixed`` or ``bf16-mixed`` (Lightning's mixed-precision plugin
            refuses clipping with an optimizer that unscales inside its step).
    """

    def __init__(
        self,
        arch: str = "resnet50",
        num_classes: int = 1000,
        weights: str | None = None,
        lr: float = 0.1,
        momentum: float = 0.9,
        weight_decay: float = 1e-4,
        nesterov: bool = False,
        warmup_epochs: float = 5,
        lr_schedule: Literal["step", "cosine"] = "step",
        lr_milestones: list[int] = [30, 60, 80],  # noqa: B006 (jsonargparse needs a plain default)
        lr_gamma: float = 0.1,
        label_smoothing: float = 0.0,
        batch_size: int = 256,
        channels_last: bool = False,
        compile: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] | None = None,
        compile_tuning: bool = False,
        fused_sgd: bool | None = None,
    ) -> None:
        super().__init__()
        if num_classes < 2:
            raise ValueError(f"model.num_classes must be >= 2 (a classifier needs two classes), got {num_classes}")
        # A NaN passes every comparison below, and YAML writes one as .nan: each bound is checked finite first.
        numbers = {"lr": lr, "momentum": momentum, "weight_decay": weight_decay, "warmup_epochs": warmup_epochs,
                   "lr_gamma": lr_gamma, "label_smoothing": label_smoothing}  # fmt: skip
        for key, value in numbers.items():
            if not math.isfinite(value):
                raise ValueError(f"model.{key} must be a finite number, got {value}")
        if lr <= 0:
            raise ValueError(f"model.lr must be > 0, got {lr}")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"model.momentum must be in [0, 1) (the recipe's: 0.9), got {momentum}")
        if weight_decay < 0:
            raise ValueError(f"model.weight_decay must be >= 0 (the recipe's: 1e-4), got {weight_decay}")
        if nesterov and momentum == 0:
            raise ValueError("model.nesterov needs model.momentum > 0 (Nesterov momentum of no momentum is plain SGD)")
        if warmup_epochs < 0:
            raise ValueError(f"model.warmup_epochs must be >= 0, got {warmup_epochs}")
        if lr_gamma <= 0:
            raise ValueError(
                f"model.lr_gamma must be > 0 (the step schedule multiplies the rate by it; the recipe's: 0.1), got "
                f"{lr_gamma}"
            )
        if sorted(lr_milestones) != list(lr_milestones) or any(m < 1 for m in lr_milestones):
            raise ValueError(f"model.lr_milestones must be increasing epochs >= 1, got {lr_milestones}")
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"model.label_smoothing must be in [0, 1), got {label_smoothing}")
        if batch_size < 1:
            raise ValueError(f"model.batch_size must be >= 1, got {batch_size}")
        if compile_tuning and not compile:
            raise ValueError(
                "model.compile_tuning tunes the kernels of a compiled model: set model.compile (default, "
                "reduce-overhead, max-autotune or max-autotune-no-cudagraphs), or model.compile_tuning false"
            )
        self.save_hyperparameters()
        self.model = build_model(arch, num_classes, weights)
        if channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)
        self.channels_last = channels_last
        top_k = min(5, num_classes)
        # One metric object per stage: sharing one between val and test mixes their states. Argument validation and
        # the NaN check are off because each reads a value back to the host: a sync on every step.
        # Each a weighted mean of per-image values (hit or loss), weight 0 for a sample standing in for a bad image
        # (data.on_bad_image: skip; target IGNORED_TARGET). Not torchmetrics' accuracy with ignore_index: its top-1
        # path drops those samples by boolean indexing, a host sync on every step (on a GPU).
        self._top_k = top_k
        self.val_acc1, self.val_acc5, self.val_loss = WeightedMean(), WeightedMean(), WeightedMean()
        self.test_acc1, self.test_acc5, self.test_loss = WeightedMean(), WeightedMean(), WeightedMean()
        # Kept out of the module tree (plain __dict__ entry): registering the compiled wrapper would put every weight
        # into the state_dict twice, under a second prefix.
        self.__dict__["_compiled"] = None
        # Running sums kept on the device, one in-place add per step: [loss x n, top-1 hits, top-5 hits] of the current
        # log interval, then loss x n of the current epoch. Float64: exact counts over a whole ImageNet epoch. The
        # images they cover are counted on the host, where each batch's size is known without a read-back.
        self._sums = torch.zeros(4, dtype=torch.float64)
        self._interval_images = 0
        self._epoch_images = 0
        self._job_start: tuple[float, int] | None = None  # (time, step) where the job's speed is counted from
        self._interval_start: float | None = None
        self._interval_step = 0
        self._paused_at: float | None = None  # when the clocks above stopped for a validation or an epoch's end
        self._paused_for = ""
        self._last_global_step = -1
        # The LR schedule's units: this run's optimizer steps per epoch (set in configure_optimizers), the restored
        # checkpoint's (None: no checkpoint, or one from before they were saved), and whether this run maps the
        # schedule onto its epochs at its first batch (after a resume in other units).
        self._steps_per_epoch: int | None = None
        self._saved_steps_per_epoch: int | None = None
        self._map_schedule_at_first_batch = False
        # The restored checkpoint's share of its epoch's loss (on_save_checkpoint), taken up at the first batch.
        self._saved_epoch_loss: dict[str, Any] | None = None

    # --- model ----------------------------------------------------------------------------------------
    @override
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Before Lightning loads the weights: a mismatch would otherwise surface as a page of state_dict key errors.
        saved = checkpoint.get("hyper_parameters", {})
        arch, classes = self.hparams.arch, self.hparams.num_classes
        saved_arch, saved_classes = saved.get("arch", arch), saved.get("num_classes", classes)
        path = getattr(self._trainer, "ckpt_path", None) or "the checkpoint"
        data = f"the data it was trained on (a data.root with {saved_classes} class folders"
        if getattr(getattr(self._trainer, "datamodule", None), "source", None) == "synthetic":
            data += f", or --data.synthetic_num_classes {saved_classes}"
        data += ")"
        if saved_arch != arch:
            also = f" and {data}" if saved_classes != classes else ""
            raise ValueError(
                f"--ckpt_path {path} holds {saved_arch} with {saved_classes} classes, this run builds {arch} with "
                f"{classes} classes; pass --model.arch {saved_arch}{also}"
            )
        if saved_classes != classes:
            # model.num_classes is not an option of its own: it follows the data (data.num_classes), so the data is
            # what has to change. A head of another size cannot take the checkpoint's weights.
            raise ValueError(
                f"--ckpt_path {path} holds {saved_arch} trained on {saved_classes} classes, and this run's data has "
                f"{classes} classes (model.num_classes follows the data); use {data}"
            )
        self._refuse_other_class_names(checkpoint.get("class_names"), path)
        self._saved_steps_per_epoch = checkpoint.get("lr_schedule_units", {}).get("steps_per_epoch")
        self._saved_epoch_loss = checkpoint.get("train_epoch_loss")
        # Before Lightning restores its loops from the checkpoint: one saved at an epoch's end resumes at the next
        # epoch's start, also with trainer.max_steps, where Lightning ran the finished epoch's loop and end again (an
        # extra batch, train_loss_epoch logged twice, the epoch counted twice; callbacks/resumable_checkpoint.py, 7.).
        resume_at_the_next_epoch(checkpoint)

    def _refuse_other_class_names(self, saved: list[str] | None, path: str) -> None:
        """The same count of classes under other names (a folder renamed, added or left out) moves the labels: an
        evaluation would score against the wrong ones and a resume train on them, without a word."""
        names = self._class_names()
        if not saved or names is None or list(saved) == names:
            return
        label = next((i for i, (a, b) in enumerate(zip(saved, names, strict=False)) if a != b), len(names))
        there, here = (f"{x[label]!r}" if label < len(x) else "none" for x in (saved, names))
        raise ValueError(
            f"--ckpt_path {path} was trained with other class names: label {label} is {there} there and {here} in "
            "this run's data.root (class folders in sorted order give the labels); use the data it was trained on, "
            "with its class folders' names"
        )

    def _class_names(self) -> list[str] | None:
        """The class folders' names in label order, when the run's data has named classes (not synthetic data)."""
        data = getattr(self._trainer, "datamodule", None)
        if data is None or getattr(data, "source", None) not in ("folder", "generated"):
            return None
        return list(data.classes)

    @override
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # The scheduler's step count is in this run's optimizer steps: a resume on other ranks, with another batch
        # size or accumulation, or another limit_train_batches, has epochs of another length (on_train_start).
        if self._steps_per_epoch is not None:
            checkpoint["lr_schedule_units"] = {
                "steps_per_epoch": self._steps_per_epoch,
                "global_batch": self.global_batch_size(),
            }
        if (names := self._class_names()) is not None:
            checkpoint["class_names"] = names  # checked when the checkpoint is evaluated or resumed on other data
        # The epoch's loss so far, for train_loss_epoch after a resume inside the epoch (one small copy to the host, at
        # a checkpoint only). Under DDP rank 0 writes the file: every rank resumes with rank 0's share, an estimate of
        # its own; on one device the resumed epoch logs the uninterrupted run's mean. Not after the epoch's last batch:
        # the resumed run starts the next epoch, its loss from zero.
        trainer = self._trainer
        if trainer is not None and trainer.state.fn == "fit" and inside_the_epoch(trainer):
            checkpoint["train_epoch_loss"] = {
                "epoch": self.current_epoch,
                "sum": float(self._sums[3]),
                "images": self._epoch_images,
            }

    @override
    def configure_model(self) -> None:
        if self.hparams.compile and self._compiled is None:
            # dynamic=False: otherwise the sanity check's short last validation batch makes torch.compile mark the
            # batch size dynamic, and the training graph, compiled after it, runs symbolic-shape kernels: ResNet-50
            # reduce-overhead on an H200 ran at 5,042 img/s, and at 6,375 with the sanity check off (bench/RESULTS.md,
            # tenth session).
            mode = self.hparams.compile
            if self.hparams.get("compile_tuning"):
                # torch.compile takes a mode or options, not both: the mode's own options plus the tuning. Options, not
                # the global inductor config: the setting travels with this model's kernels and nothing else.
                options = {**torch._inductor.list_mode_options(mode, False), "coordinate_descent_tuning": True}
                compiled = torch.compile(self.model, options=options, dynamic=False)
            else:
                compiled = torch.compile(self.model, mode=mode, dynamic=False)
            self.__dict__["_compiled"] = compiled

    @override
    def forward(self, images: torch.Tensor) -> torch.Tensor:
        # Not ``self._compiled or self.model``: the truth value of a compiled module calls its ``__len__``, which
        # torch's OptimizedModule refuses for a module without one (a ResNet).
        compiled = self._compiled
        return (self.model if compiled is None else compiled)(images)

    # --- optimization ---------------------------------------------------------------------------------
    def global_batch_size(self) -> int:
        trainer = self._trainer
        world = trainer.world_size if trainer is not None else 1
        accumulate = trainer.accumulate_grad_batches if trainer is not None else 1
        return self.hparams.batch_size * world * accumulate

    def steps_per_epoch(self) -> int:
        """Optimizer steps per epoch, as the trainer will run them (limit_train_batches and accumulation included)."""
        trainer = self.trainer
        if trainer.num_training_batches == float("inf"):
            trainer.fit_loop.setup_data()
        batches = trainer.num_training_batches
        if batches == float("inf") or batches < 1:
            if trainer.limit_train_batches == 0:
                # Lightning takes 0 as "skip training" and sets no loader up: its batch count stays inf, as for an
                # unsized loader. A fraction that rounds to no batch it refuses itself, naming the option.
                raise ValueError(
                    f"trainer.limit_train_batches {trainer.limit_train_batches:g} leaves no training batch an epoch; "
                    "the LR schedule (warmup, milestones) is in epochs of training steps: use at least one batch (e.g. "
                    "--trainer.limit_train_batches 1.0)"
                )
            if batches == float("inf"):
                raise ValueError("the training data has no length; the per-epoch LR schedule needs a sized loader")
            raise ValueError(
                "the training data has no batch an epoch; the LR schedule (warmup, milestones) is in epochs of "
                "training steps: give a training loader of at least one batch"
            )
        return optimizer_steps_per_epoch(batches, trainer.accumulate_grad_batches)

    @override
    def configure_optimizers(self) -> Any:
        h = self.hparams
        base_lr = h.lr * self.global_batch_size() / 256
        fused = self._fused_sgd()
        optimizer = torch.optim.SGD(
            self.parameters(),
            lr=base_lr,
            momentum=h.momentum,
            weight_decay=h.weight_decay,
            nesterov=h.nesterov,
            fused=True if fused else None,  # not False: with an explicit False torch runs its per-tensor loop
        )
        steps_per_epoch = self._steps_per_epoch = self.steps_per_epoch()
        # The cosine's end in steps (max_epochs then plays no part); the step schedule has none.
        total_steps = self._cosine_end(steps_per_epoch) if h.lr_schedule == "cosine" else None
        milestones = list(h.lr_milestones)
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer,
            lambda step: lr_multiplier(
                step, steps_per_epoch, h.warmup_epochs, h.lr_schedule, milestones, h.lr_gamma, total_steps
            ),
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step", "frequency": 1}}

    def _cosine_end(self, steps_per_epoch: int) -> int:
        """The optimizer step at which the cosine schedule reaches zero: ``trainer.max_epochs`` epochs, or
        ``trainer.max_steps`` in a run bounded by steps alone (it annealed over 90 epochs before, its rate all but
        flat). The epochs first, as the step schedule's milestones: a run cut short by ``max_steps`` (profiling,
        benchmarks) or resumed with another one keeps the one curve."""
        trainer = self.trainer
        if trainer.max_epochs is not None and trainer.max_epochs > 0:
            return trainer.max_epochs * steps_per_epoch
        if trainer.max_steps is not None and trainer.max_steps > 0:
            return trainer.max_steps
        raise ValueError(
            "model.lr_schedule cosine anneals to zero at the end of training, and this run has none: set "
            "trainer.max_epochs or trainer.max_steps"
        )

    def _fused_sgd(self) -> bool:
        """Whether this run's SGD is fused (``fused_sgd``, resolved for the device, precision and clipping)."""
        trainer = self.trainer
        clipping = bool(trainer.gradient_clip_val) and trainer.precision in MIXED_PRECISIONS
        if self.hparams.fused_sgd is None:
            return self.device.type == "cuda" and not clipping
        if self.hparams.fused_sgd and clipping:
            raise ValueError(
                f"model.fused_sgd: true cannot be combined with trainer.gradient_clip_val "
                f"{trainer.gradient_clip_val} under precision {trainer.precision} (Lightning's mixed-precision plugin "
                "refuses clipping with an optimizer that unscales inside its step); set model.fused_sgd: false, or "
                "null to choose"
            )
        return bool(self.hparams.fused_sgd)

    @override
    def on_train_start(self) -> None:
        # After Lightning restored the optimizer: a checkpoint's param_groups carry the "fused" flag of the run that
        # saved it, and loading them would silently switch the kernel (a foreach group under an optimizer that told
        # GradScaler it skips overflow steps itself would apply them).
        fused, h = self._fused_sgd(), self.hparams
        for optimizer in self.trainer.optimizers:
            if not isinstance(optimizer, torch.optim.SGD):
                continue
            for group in optimizer.param_groups:
                # None, not False, for the unfused kernel: torch then picks foreach on CUDA; with an explicit False
                # (on either flag) it runs its per-tensor loop.
                group["fused"], group["foreach"] = (True if fused else None), None
                # The checkpoint's groups carry its run's values; this run's (a --model.weight_decay given with
                # --ckpt_path) are the ones it was asked for. The same values on an exact resume.
                group["momentum"], group["weight_decay"], group["nesterov"] = h.momentum, h.weight_decay, h.nesterov
                if not group["momentum"]:
                    continue
                # Zero momentum buffers before the first step. torch's fused SGD creates them with empty_like on its
                # first step and then skips the whole kernel when GradScaler found inf/NaN gradients, which fp16
                # training's first steps do by design: the buffers kept uninitialized memory and the weights blew
                # up a step later (val_loss NaN on an H200). From zero, the first step is torch's: 0.9 x 0 + g = g.
                for param in group["params"]:
                    state = optimizer.state[param]
                    if state.get("momentum_buffer") is None:
                        state["momentum_buffer"] = torch.zeros_like(param, memory_format=torch.preserve_format)
        self._align_lr_schedule()
        self._warn_of_a_schedule_past_the_end()
        # The log interval starts at the end of this fit's first optimizer step (the first step is warm-up: cudnn
        # benchmarking, compilation); with gradient accumulation that is after its last micro-batch, not its first.
        self._last_global_step, self._interval_start, self._paused_at = self.global_step, None, None

    def _warn_of_a_schedule_past_the_end(self) -> None:
        """Says when a run of ``trainer.max_epochs`` ends before a milestone of its step schedule (the 90-epoch
        recipe's, left in a shorter run's config) or inside its warmup: its decays would never happen, or it would
        never reach its rate, without a word. Not for a run that ``trainer.max_steps`` cuts short (a profiling or
        benchmark job is short on purpose)."""
        trainer = self.trainer
        epochs = trainer.max_epochs
        if trainer.max_steps not in (-1, None) or epochs in (None, -1):
            return
        h = self.hparams
        late = [m for m in h.lr_milestones if m >= epochs] if h.lr_schedule == "step" else []  # cosine ignores them
        if late:
            rank_zero_warn(
                f"model.lr_milestones {late} at or past trainer.max_epochs {epochs}: the learning rate never decays "
                "there; lower them, or train longer"
            )
        if h.warmup_epochs > epochs:
            rank_zero_warn(
                f"model.warmup_epochs {h.warmup_epochs} is longer than trainer.max_epochs {epochs}: the run ends "
                f"before the learning rate reaches model.lr x global batch / 256; lower model.warmup_epochs, or train "
                "longer"
            )

    def _lr_scheduler(self) -> torch.optim.lr_scheduler.LambdaLR | None:
        configs = self.trainer.lr_scheduler_configs
        scheduler = configs[0].scheduler if configs else None
        return scheduler if isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR) else None

    def _align_lr_schedule(self) -> None:
        """After a restore, the learning rate of this run's configuration at the checkpoint's point in training.

        Lightning restores the scheduler as the checkpoint's run left it: its base rate scaled to that run's global
        batch and its step count in that run's steps. A job requeued on half the GPUs (or with another
        ``data.batch_size``, accumulation or ``limit_train_batches``, or another ``model.lr``) would otherwise train at
        the old base rate and reach each milestone epoch at the old step count: twice as many epochs late on half the
        GPUs, at ten times the rate it should have. A resume in the same units changes nothing (bit-exact resumes).
        """
        scheduler = self._lr_scheduler()
        if scheduler is None:
            return
        h = self.hparams
        base = h.lr * self.global_batch_size() / 256
        changes = []
        if not all(math.isclose(old, base, rel_tol=1e-9) for old in scheduler.base_lrs):
            changes.append(
                f"base rate {scheduler.base_lrs[0]:.6g} -> {base:.6g} (model.lr {h.lr} x global batch "
                f"{self.global_batch_size()} / 256)"
            )
            scheduler.base_lrs = [base] * len(scheduler.base_lrs)
            for group in scheduler.optimizer.param_groups:
                group["initial_lr"] = base
        saved, steps_per_epoch = self._saved_steps_per_epoch, self._steps_per_epoch
        self._map_schedule_at_first_batch = bool(saved and steps_per_epoch and saved != steps_per_epoch)
        if self._map_schedule_at_first_batch:
            # Where Lightning will go on: the next epoch's start after an epoch-end checkpoint (its current epoch is
            # that one already), the restored batch count after a mid-epoch one. Checked at the first batch (below).
            trainer = self.trainer
            restored = trainer.fit_loop.epoch_loop.batch_progress.current.processed
            first_batch = restored if trainer.fit_loop.restarted_mid_epoch else 0
            old_step = scheduler.last_epoch
            step = self._schedule_step(trainer.current_epoch, first_batch)
            changes.append(
                f"schedule step {old_step} of {saved}-step epochs -> {step} of {steps_per_epoch}-step epochs"
            )
            scheduler.last_epoch = step
        if changes:
            self._set_learning_rates(scheduler)
            rank_zero_info(
                f"resuming in other units than the checkpoint's run: {'; '.join(changes)}; the learning rate is now "
                f"{scheduler.optimizer.param_groups[0]['lr']:.6g}"
            )

    def _schedule_step(self, epoch: int, batch_idx: int) -> int:
        """The scheduler's step at batch ``batch_idx`` of ``epoch``: the optimizer steps of the epochs before it and of
        this epoch's batches before it, in this run's units (each epoch then starts on its own step)."""
        assert self._steps_per_epoch is not None
        return epoch * self._steps_per_epoch + batch_idx // self.trainer.accumulate_grad_batches

    @override
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        loop = self.trainer.fit_loop.epoch_loop
        if loop._batches_that_stepped != self.global_step:
            # Lightning writes step metrics when its own step counter is due; a resume with another
            # accumulate_grad_batches whose checkpoint falls inside one of the new steps leaves that counter behind the
            # optimizer steps (its restore skips an increment), and the print-freq lines (due by global_step) found no
            # row in metrics.csv. Equal otherwise at every batch start.
            loop._batches_that_stepped = self.global_step
        saved, self._saved_epoch_loss = self._saved_epoch_loss, None
        if saved is not None and saved.get("epoch") == self.current_epoch:
            # A resume inside the epoch the checkpoint was saved in (Lightning then skips on_train_epoch_start):
            # train_loss_epoch goes on from the loss of the steps before it. A checkpoint at or after an epoch's last
            # batch holds none (on_save_checkpoint): the run starts the next epoch, and its sums start at zero.
            self._sums[3] = float(saved["sum"])
            self._epoch_images = int(saved["images"])
        if not self._map_schedule_at_first_batch:
            return
        self._map_schedule_at_first_batch = False
        scheduler = self._lr_scheduler()
        step = self._schedule_step(self.trainer.current_epoch, batch_idx)
        if scheduler is not None and scheduler.last_epoch != step:
            # Lightning went on elsewhere than its loops' state said in on_train_start (callbacks saw that rate at this
            # batch's start; the optimizer step uses this one).
            rank_zero_info(
                f"resuming in other units: schedule step {scheduler.last_epoch} -> {step} (epoch "
                f"{self.trainer.current_epoch}, batch {batch_idx})"
            )
            scheduler.last_epoch = step
            self._set_learning_rates(scheduler)

    @staticmethod
    def _set_learning_rates(scheduler: torch.optim.lr_scheduler.LambdaLR) -> None:
        """The optimizer's rates for the scheduler's current step (what its ``step`` would have set)."""
        rates = [
            base * rule(scheduler.last_epoch)
            for base, rule in zip(scheduler.base_lrs, scheduler.lr_lambdas, strict=True)
        ]
        for group, rate in zip(scheduler.optimizer.param_groups, rates, strict=True):
            group["lr"] = rate
        scheduler._last_lr = rates

    # --- steps ----------------------------------------------------------------------------------------
    def _loss(self, logits: torch.Tensor, targets: torch.Tensor, smoothing: float = 0.0) -> torch.Tensor:
        return F.cross_entropy(logits.float(), targets, label_smoothing=smoothing)

    @override
    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        images, targets = batch
        logits = self(images)
        loss = self._loss(logits, targets, self.hparams.label_smoothing)
        with torch.no_grad():
            n = targets.numel()
            hit = logits.topk(self._top_k, dim=1).indices == targets[:, None]
            hits = torch.stack((hit[:, 0], hit.any(dim=1))).sum(dim=1)
            # The batch size travels as a kernel argument: no host-to-device copy, no sync. A handful of launches per
            # step (the host's time per step is what a GPU waits for after each sync, e.g. fp16's overflow check).
            weighted = loss.detach().reshape(1) * n
            if self._sums.device != weighted.device:
                self._sums = self._sums.to(weighted.device)
            self._sums += torch.cat((weighted, hits, weighted))
            self._interval_images += n
            self._epoch_images += n
        return loss

    def _log_step(self, batch_idx: int) -> None:
        step = self.global_step
        if step == self._last_global_step:
            return  # still accumulating gradients: no optimizer step yet
        self._last_global_step = step
        if self._interval_start is None:
            self._interval_start, self._interval_step = time.perf_counter(), step
            self._job_start = (self._interval_start, step)
            with app_range(METRICS):  # the first step's sums are left out: it holds the warm-up (cudnn, compile)
                self._sums[:3].zero_()
            self._interval_images = 0
            return
        # The same condition on every rank at the same step: Lightning writes step metrics on exactly these steps
        # (none with log_every_n_steps 0; the epoch's train_loss_epoch is still logged), and at a step where the fit
        # stops (trainer.should_stop: exit_after, max_time, early stopping; decided alike on every rank), where it
        # wrote the last interval's row a second time: the stop's own, shorter interval instead. Reaching max_steps
        # sets no should_stop: without its own row, the steps after the last logged one were never logged.
        every = self.trainer.log_every_n_steps
        max_steps = self.trainer.max_steps
        stopping = (self.trainer.should_stop and getattr(self.trainer.fit_loop, "_can_stop_early", True)) or (
            0 <= max_steps <= step
        )
        if every <= 0 or (step % every != 0 and not stopping):
            return
        # Lightning writes step metrics on its log steps and when should_stop is set (its should_update_logs, after
        # this hook); the row of a max_steps end is neither, and is written here, at the step Lightning would use.
        epoch_loop = self.trainer.fit_loop.epoch_loop
        lightning_writes = (epoch_loop._batches_that_stepped + 1) % every == 0 or self.trainer.should_stop
        # Named on the timeline: the step's range has closed (callbacks run first), and this is the interval's sync.
        with app_range(METRICS):
            self._log_interval(step, batch_idx, write=not lightning_writes)

    @override
    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._log_step(batch_idx)
        if not inside_the_epoch(self.trainer):
            # The epoch's last step: from here to the next epoch's start (its validation, its end's checkpoints, which
            # Lightning runs after this hook) is not training.
            self._pause_clocks("epoch end")

    def _log_interval(self, step: int, batch_idx: int, write: bool = False) -> None:
        """The interval's metrics, reduced over every rank (its one host sync), logged and printed; the sums reset.
        ``write``: to the loggers now, at a step where Lightning would not write them."""
        totals = self._totals_over_ranks(self._sums[:3], self._interval_images)
        loss_sum, correct, correct5, count = totals.tolist()  # the interval's one host sync
        now = time.perf_counter()
        batch = self.global_batch_size()
        interval_time = (now - self._interval_start) / max(step - self._interval_step, 1)
        assert self._job_start is not None
        job_time = (now - self._job_start[0]) / max(step - self._job_start[1], 1)
        count = max(count, 1)
        metrics = {
            "train_loss": loss_sum / count,
            "train_acc1": correct / count,
            "train_acc5": correct5 / count,
            "train_img_s": batch / interval_time,
        }
        self.log_dict(metrics, on_step=True, on_epoch=False)
        if write:
            self.trainer._logger_connector.log_metrics(metrics)
        # The original's print_freq line (apex main_amp.py), reduced over all ranks, printed by rank 0.
        rank_zero_info(
            f"Epoch: [{self.current_epoch}][{batch_idx + 1}/{self.trainer.num_training_batches}]\t"
            f"Time {interval_time:.3f} ({job_time:.3f})\tSpeed {batch / interval_time:.3f} ({batch / job_time:.3f})\t"
            f"Loss {loss_sum / count:.4f}\tPrec@1 {100 * correct / count:.3f}\tPrec@5 {100 * correct5 / count:.3f}"
        )
        self._sums[:3].zero_()
        self._interval_images = 0
        self._interval_start, self._interval_step = now, step

    def _totals_over_ranks(self, sums: torch.Tensor, images: int) -> torch.Tensor:
        """``sums`` followed by their image count, summed over every rank (a collective: call on all ranks, in batch
        hooks only, see ``on_train_epoch_end``)."""
        totals = torch.cat((sums, sums.new_tensor([images])))
        if self.trainer.world_size > 1:
            totals = self.trainer.strategy.reduce(totals, reduce_op="sum")
        return totals

    # The interval's and the job's clocks stop for a validation and over an epoch's end (its checkpoints included), as
    # the original's timer did (restarted at each train() call): train_img_s and the print-freq line are training
    # speed, not the first interval after a validation charged with all of it. The next epoch's first batch counts.
    def _pause_clocks(self, reason: str) -> None:
        if self._interval_start is not None and self._paused_at is None and not self.trainer.sanity_checking:
            self._paused_at, self._paused_for = time.perf_counter(), reason

    def _resume_clocks(self, reason: str) -> None:
        if self._paused_at is None or self._paused_for != reason:
            return
        paused = time.perf_counter() - self._paused_at
        self._paused_at = None
        if self._interval_start is not None and self._job_start is not None:
            self._interval_start += paused
            self._job_start = (self._job_start[0] + paused, self._job_start[1])

    @override
    def on_validation_start(self) -> None:
        self._pause_clocks("validation")

    @override
    def on_validation_end(self) -> None:
        # After the callbacks' on_validation_end (Lightning calls the module's last): the checkpoints saved there too.
        self._resume_clocks("validation")

    @override
    def on_train_epoch_start(self) -> None:
        self._resume_clocks("epoch end")
        self._sums[3:].zero_()
        self._epoch_images = 0

    @override
    def on_train_epoch_end(self) -> None:
        # The mean over every image of the epoch, all ranks together: this rank's mean, weighted by its image count,
        # which Lightning's sync_dist sums over the ranks with the weighted values (two barriers and two small
        # all-reduces an epoch, where Lightning reduces every epoch metric; exact while every rank has as many
        # images, as the DDP sampler gives them, since the count is averaged as an integer under NCCL).
        # No collective of the module's own here: under DDP the progress bar, on rank 0 only, reduces the callbacks'
        # epoch metrics (train_bad_images) before this hook, so a collective here met another one on the other ranks
        # (a crash or a hang at the first epoch's end).
        images = self._epoch_images
        mean = self._sums[3] / max(images, 1)
        # max(images, 1): an epoch without images logs 0 (every rank has as many images under the DDP sampler).
        self.log(
            "train_loss_epoch", mean.float(), on_step=False, on_epoch=True, sync_dist=True, batch_size=max(images, 1)
        )

    def _evaluate(self, batch: tuple[torch.Tensor, torch.Tensor], prefix: str) -> None:
        images, targets = batch
        logits = self(images)
        # Per image, so that the last, smaller batch of a shard counts less (or the loss would depend on the batch size
        # and on the number of ranks), and a sample standing in for a bad image counts not at all (weight 0, its loss
        # 0): no host sync for either.
        losses = F.cross_entropy(logits.float(), targets, reduction="none", ignore_index=IGNORED_TARGET)
        scored = (targets != IGNORED_TARGET).to(losses.dtype)
        hit = logits.topk(self._top_k, dim=1).indices == targets[:, None]
        acc1, acc5, mean_loss = (getattr(self, f"{prefix}_{name}") for name in ("acc1", "acc5", "loss"))
        acc1.update(hit[:, 0].to(losses.dtype), scored)
        acc5.update(hit.any(dim=1).to(losses.dtype), scored)
        mean_loss.update(losses.detach(), scored)
        # Metric objects: Lightning calls compute() (one cross-rank sync) at epoch end, not per step.
        self.log(f"{prefix}_loss", mean_loss, on_step=False, on_epoch=True, prog_bar=True)
        self.log(f"{prefix}_acc1", acc1, on_step=False, on_epoch=True, prog_bar=True)
        self.log(f"{prefix}_acc5", acc5, on_step=False, on_epoch=True)

    @override
    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "val")

    @override
    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "test")
