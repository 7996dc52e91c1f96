"""The LightningModule: a torchvision classifier trained with the ImageNet recipe of apex's main_amp.py.

Recipe: SGD with momentum and weight decay; the learning rate is ``lr`` per 256 images, scaled to the global batch
(per-device batch x devices x gradient accumulation); it rises linearly per step over the first ``warmup_epochs``
and is multiplied by ``lr_gamma`` at each epoch of ``lr_milestones`` (30, 60, 80), or follows a cosine after the
warmup (lr_schedule.py).

Metrics avoid host syncs in the hot loop (step_metrics.py): one in-place add a step on the device, reduced across
ranks only at log steps and epoch ends.

The schedule and the training metrics each live in a helper the module owns (``LRSchedule``, ``StepMetrics``); the
hooks, which Lightning calls on the module, call them.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from typing_extensions import override  # a dependency (pyproject.toml); Lightning marks its hooks with it

from bad_image_policy import IGNORED_TARGET
from callbacks.resumable_checkpoint import resume_at_the_next_epoch
from lr_schedule import LRSchedule, lr_multiplier, trainer_steps_per_epoch, warn_of_a_schedule_past_the_end
from step_metrics import LOGGED_METRICS, StepMetrics, WeightedMean
from torchvision_models import build_model

# Re-exported: other modules and tests import them from here (config_checks.py LOGGED_METRICS, tests lr_multiplier).
__all__ = ["LOGGED_METRICS", "MIXED_PRECISIONS", "ImageNetClassifier", "WeightedMean", "lr_multiplier"]

#: Trainer precisions that run through Lightning's MixedPrecision plugin (autocast; GradScaler for 16-mixed).
MIXED_PRECISIONS = ("16-mixed", "bf16-mixed")


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
        repeated_or_back = any(b <= a for a, b in zip(lr_milestones, lr_milestones[1:], strict=False))
        if repeated_or_back or any(m < 1 for m in lr_milestones):
            # Strictly: a milestone given twice would multiply the rate by lr_gamma twice at that epoch (x0.01).
            raise ValueError(f"model.lr_milestones must be increasing epochs >= 1, each once, got {lr_milestones}")
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
        self._step_metrics = StepMetrics()  # the training steps' sums on the device and the speed's clocks
        self._lr_schedule = LRSchedule()  # the schedule's units across a resume

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
        self._lr_schedule.restore(checkpoint)
        self._step_metrics.restore_epoch_loss(checkpoint)
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
        return getattr(data, "class_names", None)

    @override
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._lr_schedule.save(checkpoint, self.global_batch_size())
        if (names := self._class_names()) is not None:
            checkpoint["class_names"] = names  # checked when the checkpoint is evaluated or resumed on other data
        self._step_metrics.save_epoch_loss(checkpoint, self._trainer, self.current_epoch)

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
        schedule = self._lr_schedule.scheduler(optimizer, self.trainer, h, trainer_steps_per_epoch(self.trainer))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step", "frequency": 1}}

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
    def setup(self, stage: str) -> None:
        if stage == "fit":  # under DDP: the group that sums the epoch's loss over the ranks for a checkpoint
            self._step_metrics.open_save_group(self.trainer)

    @override
    def teardown(self, stage: str) -> None:
        if stage == "fit":
            self._step_metrics.close_save_group()

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
        self._lr_schedule.align(self.trainer, h, self.global_batch_size())
        warn_of_a_schedule_past_the_end(self.trainer, h)
        self._step_metrics.start_fit(self.global_step)

    @override
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self._step_metrics.on_batch_start(self.trainer, self.global_step, self.current_epoch)
        self._lr_schedule.on_first_batch(self.trainer, batch_idx)

    # --- steps ----------------------------------------------------------------------------------------
    def _loss(self, logits: torch.Tensor, targets: torch.Tensor, smoothing: float = 0.0) -> torch.Tensor:
        return F.cross_entropy(logits.float(), targets, label_smoothing=smoothing)

    @override
    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        images, targets = batch
        logits = self(images)
        loss = self._loss(logits, targets, self.hparams.label_smoothing)
        self._step_metrics.add_step(loss, logits, targets, self._top_k)
        return loss

    @override
    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._step_metrics.on_batch_end(self, batch_idx)

    @override
    def on_validation_start(self) -> None:
        self._step_metrics.pause_clocks(self.trainer, "validation")

    @override
    def on_validation_end(self) -> None:
        # After the callbacks' on_validation_end (Lightning calls the module's last): the checkpoints saved there too.
        self._step_metrics.resume_clocks("validation")

    @override
    def on_train_epoch_start(self) -> None:
        self._step_metrics.start_epoch()

    @override
    def on_train_epoch_end(self) -> None:
        self._step_metrics.log_epoch_loss(self)

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
