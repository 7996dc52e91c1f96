"""The learning-rate schedule of the apex ImageNet recipe, and its units across a resume.

The rate is ``model.lr`` per 256 images, scaled to the global batch; it rises linearly per step over the first
``warmup_epochs`` and is multiplied by ``lr_gamma`` at each epoch of ``lr_milestones``, or follows a cosine after the
warmup (``lr_multiplier``). The schedule counts optimizer steps, in epochs of this run's length: a resume with
another global batch, accumulation or ``limit_train_batches`` maps the checkpoint's step onto this run's epochs
(``LRSchedule``). The LightningModule (imagenet_module.py) owns one ``LRSchedule`` and calls it from its hooks.
"""

from __future__ import annotations

import math
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities import rank_zero_info, rank_zero_warn

from epoch_steps import optimizer_steps_per_epoch


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


def trainer_steps_per_epoch(trainer: pl.Trainer) -> int:
    """Optimizer steps per epoch, as the trainer will run them (limit_train_batches and accumulation included)."""
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


def cosine_end(trainer: pl.Trainer, steps_per_epoch: int) -> int:
    """The optimizer step at which the cosine schedule reaches zero: ``trainer.max_epochs`` epochs, or
    ``trainer.max_steps`` in a run bounded by steps alone (it annealed over 90 epochs before, its rate all but
    flat). The epochs first, as the step schedule's milestones: a run cut short by ``max_steps`` (profiling,
    benchmarks) or resumed with another one keeps the one curve."""
    if trainer.max_epochs is not None and trainer.max_epochs > 0:
        return trainer.max_epochs * steps_per_epoch
    if trainer.max_steps is not None and trainer.max_steps > 0:
        return trainer.max_steps
    raise ValueError(
        "model.lr_schedule cosine anneals to zero at the end of training, and this run has none: set "
        "trainer.max_epochs or trainer.max_steps"
    )


def warn_of_a_schedule_past_the_end(trainer: pl.Trainer, hparams: Any) -> None:
    """Says when a run of ``trainer.max_epochs`` ends before a milestone of its step schedule (the 90-epoch
    recipe's, left in a shorter run's config) or inside its warmup: its decays would never happen, or it would
    never reach its rate, without a word. Not for a run that ``trainer.max_steps`` cuts short (a profiling or
    benchmark job is short on purpose)."""
    epochs = trainer.max_epochs
    if trainer.max_steps not in (-1, None) or epochs in (None, -1):
        return
    h = hparams
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


def lambda_lr_scheduler(trainer: pl.Trainer) -> torch.optim.lr_scheduler.LambdaLR | None:
    """The trainer's scheduler when it is this schedule's ``LambdaLR``."""
    configs = trainer.lr_scheduler_configs
    scheduler = configs[0].scheduler if configs else None
    return scheduler if isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR) else None


def set_learning_rates(scheduler: torch.optim.lr_scheduler.LambdaLR) -> None:
    """The optimizer's rates for the scheduler's current step (what its ``step`` would have set)."""
    rates = [
        base * rule(scheduler.last_epoch) for base, rule in zip(scheduler.base_lrs, scheduler.lr_lambdas, strict=True)
    ]
    for group, rate in zip(scheduler.optimizer.param_groups, rates, strict=True):
        group["lr"] = rate
    scheduler._last_lr = rates


class LRSchedule:
    """The module's schedule: built in ``configure_optimizers``, its units saved in a checkpoint and, on a resume in
    other units, this run's rate and step set at the start of training and checked at the first batch."""

    def __init__(self) -> None:
        # The LR schedule's units: this run's optimizer steps per epoch (set in configure_optimizers), the restored
        # checkpoint's (None: no checkpoint, or one from before they were saved), and whether this run maps the
        # schedule onto its epochs at its first batch (after a resume in other units).
        self.steps_per_epoch: int | None = None
        self.saved_steps_per_epoch: int | None = None
        self.map_schedule_at_first_batch = False

    def scheduler(
        self, optimizer: torch.optim.Optimizer, trainer: pl.Trainer, hparams: Any, steps_per_epoch: int
    ) -> torch.optim.lr_scheduler.LambdaLR:
        """The per-step scheduler of ``optimizer``, in epochs of ``steps_per_epoch`` optimizer steps."""
        h = hparams
        self.steps_per_epoch = steps_per_epoch
        # The cosine's end in steps (max_epochs then plays no part); the step schedule has none.
        total_steps = cosine_end(trainer, steps_per_epoch) if h.lr_schedule == "cosine" else None
        milestones = list(h.lr_milestones)
        # A lambda, not a callable object: LambdaLR saves a callable object's attributes into the checkpoint.
        return torch.optim.lr_scheduler.LambdaLR(
            optimizer,
            lambda step: lr_multiplier(
                step, steps_per_epoch, h.warmup_epochs, h.lr_schedule, milestones, h.lr_gamma, total_steps
            ),
        )

    def save(self, checkpoint: dict[str, Any], global_batch: int) -> None:
        """The schedule's units into ``checkpoint``."""
        # The scheduler's step count is in this run's optimizer steps: a resume on other ranks, with another batch
        # size or accumulation, or another limit_train_batches, has epochs of another length (on_train_start).
        if self.steps_per_epoch is not None:
            checkpoint["lr_schedule_units"] = {"steps_per_epoch": self.steps_per_epoch, "global_batch": global_batch}

    def restore(self, checkpoint: dict[str, Any]) -> None:
        """The checkpoint's units, for ``align`` at the start of training."""
        self.saved_steps_per_epoch = checkpoint.get("lr_schedule_units", {}).get("steps_per_epoch")

    def schedule_step(self, trainer: pl.Trainer, epoch: int, batch_idx: int) -> int:
        """The scheduler's step at batch ``batch_idx`` of ``epoch``: the optimizer steps of the epochs before it and of
        this epoch's batches before it, in this run's units (each epoch then starts on its own step)."""
        assert self.steps_per_epoch is not None
        return epoch * self.steps_per_epoch + batch_idx // trainer.accumulate_grad_batches

    def align(self, trainer: pl.Trainer, hparams: Any, global_batch: int) -> None:
        """After a restore, the learning rate of this run's configuration at the checkpoint's point in training.

        Lightning restores the scheduler as the checkpoint's run left it: its base rate scaled to that run's global
        batch and its step count in that run's steps. A job requeued on half the GPUs (or with another
        ``data.batch_size``, accumulation or ``limit_train_batches``, or another ``model.lr``) would otherwise train at
        the old base rate and reach each milestone epoch at the old step count: twice as many epochs late on half the
        GPUs, at ten times the rate it should have. A resume in the same units changes nothing (bit-exact resumes).
        """
        scheduler = lambda_lr_scheduler(trainer)
        if scheduler is None:
            return
        h = hparams
        base = h.lr * global_batch / 256
        changes = []
        if not all(math.isclose(old, base, rel_tol=1e-9) for old in scheduler.base_lrs):
            changes.append(
                f"base rate {scheduler.base_lrs[0]:.6g} -> {base:.6g} (model.lr {h.lr} x global batch "
                f"{global_batch} / 256)"
            )
            scheduler.base_lrs = [base] * len(scheduler.base_lrs)
            for group in scheduler.optimizer.param_groups:
                group["initial_lr"] = base
        saved, steps_per_epoch = self.saved_steps_per_epoch, self.steps_per_epoch
        self.map_schedule_at_first_batch = bool(saved and steps_per_epoch and saved != steps_per_epoch)
        if self.map_schedule_at_first_batch:
            # Where Lightning will go on: the next epoch's start after an epoch-end checkpoint (its current epoch is
            # that one already), the restored batch count after a mid-epoch one. Checked at the first batch (below).
            restored = trainer.fit_loop.epoch_loop.batch_progress.current.processed
            first_batch = restored if trainer.fit_loop.restarted_mid_epoch else 0
            old_step = scheduler.last_epoch
            step = self.schedule_step(trainer, trainer.current_epoch, first_batch)
            changes.append(
                f"schedule step {old_step} of {saved}-step epochs -> {step} of {steps_per_epoch}-step epochs"
            )
            scheduler.last_epoch = step
        if changes:
            set_learning_rates(scheduler)
            rank_zero_info(
                f"resuming in other units than the checkpoint's run: {'; '.join(changes)}; the learning rate is now "
                f"{scheduler.optimizer.param_groups[0]['lr']:.6g}"
            )

    def on_first_batch(self, trainer: pl.Trainer, batch_idx: int) -> None:
        """After a resume in other units, the step ``align`` set checked against the batch Lightning goes on at."""
        if not self.map_schedule_at_first_batch:
            return
        self.map_schedule_at_first_batch = False
        scheduler = lambda_lr_scheduler(trainer)
        step = self.schedule_step(trainer, trainer.current_epoch, batch_idx)
        if scheduler is not None and scheduler.last_epoch != step:
            # Lightning went on elsewhere than its loops' state said in on_train_start (callbacks saw that rate at this
            # batch's start; the optimizer step uses this one).
            rank_zero_info(
                f"resuming in other units: schedule step {scheduler.last_epoch} -> {step} (epoch "
                f"{trainer.current_epoch}, batch {batch_idx})"
            )
            scheduler.last_epoch = step
            set_learning_rates(scheduler)
