"""``ModelCheckpoint`` whose checkpoints resume exactly, also after a resume (two gaps of Lightning 2.6).

1. **No checkpoint in the middle of an optimizer step after a resume.** ``ModelCheckpoint`` skips a save when it
   already saved at the current ``global_step``, but it does not keep that step across a restart: in a run resumed
   with gradient accumulation, the first micro-batch's ``on_train_batch_end`` (same ``global_step`` as the restored
   checkpoint, ``every_n_train_steps`` due) writes a checkpoint after one micro-batch of the next step. Resumed from
   that file, the accumulated gradient of that micro-batch is gone (gradients are not saved) and the step is built from
   the remaining micro-batches alone. Here a batch that did not complete an optimizer step (``global_step``
   unchanged) saves nothing, which is what an uninterrupted run does anyway; validation-end saves are untouched.
2. **The epoch after an epoch-end resume counts as started.** Resumed from a checkpoint taken after the last batch
   of an epoch, Lightning runs the next epoch without counting it as started (its epoch progress reads
   ``ready == completed`` during the epoch; it also skips ``on_train_epoch_start``). Every checkpoint written in that
   epoch would carry that state, and a run resumed from one of them restarts the epoch's batch count, skips the rest
   of the epoch, or trains it twice, depending on where it was taken: at a batch end, at validation end, or at the
   epoch end. During a training batch an uninterrupted run always has ``ready == started == completed + 1``; this
   sets exactly that at the first batch of such an epoch, before any checkpoint of it is written (Lightning runs
   checkpoint callbacks last). ``checkpoint_io.repair_epoch_progress`` repairs the batch-end checkpoints written
   before this existed.

Both are no-ops in a run that was not resumed.

3. **A run stopped inside an epoch saves the step it stopped at, not an epoch end.** When something stops the fit in
   the middle of an epoch (``profile.exit_after``, ``trainer.max_steps``, ``trainer.max_time``), Lightning still runs
   the epoch's end, and ``ModelCheckpoint`` saves there with the loops' epoch-end state: a run resumed from it counts
   the epoch as done, skips its remaining batches and leaves the LR schedule that much out of step with the epochs.
   Here the unmonitored checkpoint (``last.ckpt``) saves at the batch end where the stop was decided, the state of a
   mid-epoch checkpoint (the resumed run trains the rest of the epoch), and does not save at such an epoch end. The
   monitored one saves there only after a validation at that step (Lightning runs one at some stops): otherwise its
   metric is an earlier validation's, and would name and rank weights it never measured. A stop asked for inside an
   accumulated step (``max_time``'s timer checks after every micro-batch) waits for that step's end.

``train.py`` uses this class for ``--checkpoint.*`` and
``--last_checkpoint.*``; every other argument is ``ModelCheckpoint``'s.

4. **Its state key is computed once.** Lightning names every callback hook call by the callback's ``state_key``, which
   ``ModelCheckpoint`` formats anew from its arguments each time: six hooks a step, for each of the two checkpoint
   callbacks, about 14 us of host time per step on a 2-core CPU (1.2 us an access). The arguments it is made
   of are fixed once ``__init__`` returns.

5. **The unmonitored checkpoint is saved at every epoch end.** ``ModelCheckpoint`` saves after a validation when the
   run has one and at epoch ends only when it has none, so with ``check_val_every_n_epoch`` > 1 ``last.ckpt`` fell up
   to that many epochs minus one behind (a run's last epochs were in no file). Here an epoch end without a validation
   saves the unmonitored checkpoint (every ``every_n_epochs``); the monitored one has no new score there.

6. **Nothing more at a preemption's step.** The preemption handler saves ``last.ckpt`` at the step where the ranks
   agree to stop, and the run exits once Lightning has logged that step (callbacks/preemption.py); a save of either
   checkpoint at that step (``every_n_train_steps`` due, or the step ``max_steps`` or a window's ``exit_after`` ends
   the fit at) would only spend the grace period on a second copy.

7. **An epoch-end checkpoint resumes at the next epoch's start, also with ``trainer.max_steps``.** Checkpoints saved at
   an epoch's end (``on_train_epoch_end``) hold the fit loop's epoch progress at ``ready == started == processed ==
   completed + 1`` (the end begun, not finished), the batch progress at the epoch's last batch. Resumed without
   ``max_steps``, Lightning takes that for a finished epoch and starts the next one. With ``max_steps`` set,
   ``_FitLoop.restarting`` is on for every step-based run (``... or self._iteration_based_training()``) and the same
   state reads "restarted on epoch end": Lightning runs the finished epoch's loop again, without
   ``on_train_epoch_start``, and ends that epoch a second time. Without validation its epoch loop waits for a
   validation that never comes and trains one more batch in the finished epoch (``batch_idx`` = the epoch's length,
   the loader's first batch again); with validation it trains none. Either way the second end runs every
   ``on_train_epoch_end`` hook (``train_loss_epoch`` logged again over the 0 or 1 batch the resumed run saw by then,
   the checkpoints saved again) and counts the epoch processed twice: from there on ``processed`` is one ahead of
   ``completed``, so samplers get the wrong epoch (``set_epoch``) and a ``max_epochs`` given with ``max_steps`` ends
   the fit an epoch early (resumed from the first epoch's end with ``max_epochs`` 2, it trained no epoch of its own).
   Lightning issue #19617 is one case of it. :func:`resume_at_the_next_epoch` gives such a checkpoint the loops' state
   at the next epoch's start before Lightning restores them; ``ImageNetClassifier.on_load_checkpoint`` calls it, so it
   holds for every fit of the module, with or without this callback.
"""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.utilities import rank_zero_warn
from typing_extensions import override  # a dependency (pyproject.toml); Lightning marks its hooks with it

from callbacks.preemption import PreemptionHandler
from callbacks.ranges import checkpoint_range
from image_loading import BadImageError


class ResumableCheckpoint(ModelCheckpoint):
    """:class:`~pytorch_lightning.callbacks.ModelCheckpoint` that keeps resumed runs exact (see the module docstring).

    Takes ``ModelCheckpoint``'s arguments.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._step_before_batch: int | None = None
        self._stop_after_the_step = False  # a stop asked for inside an accumulated step, held until its end
        self._validated_step: int | None = None  # the global step of the last validation (not the sanity check)
        self._state_key: str | None = None

    @property
    @override
    def state_key(self) -> str:
        if self._state_key is None:
            self._state_key = super().state_key
        return self._state_key

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._stop_after_the_step = False  # not from an earlier fit with this callback

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._step_before_batch = trainer.global_step
        progress = trainer.fit_loop.epoch_progress
        for counts in (progress.total, progress.current):
            if counts.ready == counts.completed:  # an epoch being trained that Lightning did not count as started
                counts.ready = counts.started = counts.completed + 1

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        # Checkpoint callbacks run after every other callback's hook (Lightning orders them last), so a stop decided in
        # this batch end (the profiler window's exit_after, max_time's timer) is already set. Every rank decides the
        # same (the timer broadcasts its decision).
        if trainer.global_step == self._step_before_batch:
            # A micro-batch inside an accumulated step: the optimizer did not step, there is nothing to save. A stop
            # asked for here waits for the step's end, where there is (Lightning would stop now, with the step's
            # gradients half accumulated and no checkpoint of the epoch's progress).
            if trainer.should_stop and inside_the_epoch(trainer):
                trainer.should_stop, self._stop_after_the_step = False, True
            return
        if any(isinstance(c, PreemptionHandler) and c.stops_at(trainer) for c in trainer.callbacks):
            return  # item 6: the preemption handler saved this step into last.ckpt, and the run exits
        if self._stop_after_the_step:
            trainer.should_stop, self._stop_after_the_step = True, False
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        # Lightning keeps training through a stop until min_epochs and min_steps are done.
        can_stop = getattr(trainer.fit_loop, "_can_stop_early", True)
        stopping = (trainer.should_stop and can_stop) or 0 <= trainer.max_steps <= trainer.global_step
        if (
            self.monitor is None
            and stopping
            and inside_the_epoch(trainer)
            and not self._should_skip_saving_checkpoint(trainer)
        ):
            self._save_here(trainer)

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        # A file that cannot be decoded ends the fit where a training batch is fetched, between two optimizer steps
        # (the prefetcher's error surfaces at the next fetch). The training state is whole there: saved, the fixed
        # file and a resume go on from this step instead of from the last save, an epoch earlier at worst. Not in
        # validation: Lightning resumes a save from there past the validation (at an epoch's end, as a finished
        # epoch), which would never run. One process only: under DDP the other ranks wait in a collective, and a
        # save, a collective too, would hang.
        if not (
            self.monitor is None
            and isinstance(exception, BadImageError)
            and trainer.world_size == 1
            and trainer.state.fn == "fit"
            and not trainer.sanity_checking
            and not trainer.validating
            and trainer.global_step > self._last_global_step_saved
            and trainer.global_step != self._step_before_batch  # not inside an accumulated step
        ):
            return
        self._save_here(trainer)
        path = self.best_model_path or self.last_model_path
        rank_zero_warn(
            f"bad image: saved {path} at step {trainer.global_step}; replace or remove the file (or set "
            f"data.on_bad_image: skip) and resume with --ckpt_path {path}"
        )

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._validated_step = trainer.global_step
        super().on_validation_end(trainer, pl_module)

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if inside_the_epoch(trainer):
            if self.monitor is None:
                return  # the fit stopped before the epoch's last batch: not an epoch end to resume from (see above)
            if self._validated_step != trainer.global_step:
                # No validation at this stop (exit_after skips it, max_steps runs none): the metric at hand is an
                # earlier validation's, and would name and rank these weights by a score they never had.
                return
        if (
            self.monitor is None
            and self._validated_step != trainer.global_step
            and not self._should_save_on_train_epoch_end(trainer)
            and not self._should_skip_saving_checkpoint(trainer)
            and self._every_n_epochs >= 1
            and (trainer.current_epoch + 1) % self._every_n_epochs == 0
        ):
            # ModelCheckpoint saves after validation when it runs, at epoch ends only when validation never runs; with
            # check_val_every_n_epoch > 1 (or a val_check_interval in steps) the epochs between validations ended
            # unsaved: last.ckpt stayed up to N - 1 epochs behind, and a run's last epochs were lost with it. This
            # epoch's end had no validation (it runs before this hook), so it is saved here. (5.)
            self._save_here(trainer)
            return
        super().on_train_epoch_end(trainer, pl_module)

    def _save_here(self, trainer: pl.Trainer) -> None:
        """The callback's saves (top-k and last) at this point, as at a batch end where it is due."""
        candidates = self._monitor_candidates(trainer)
        self._save_topk_checkpoint(trainer, candidates)
        self._save_last_checkpoint(trainer, candidates)

    @override
    def _save_checkpoint(self, trainer: pl.Trainer, filepath: str) -> None:
        # Named on the timeline: a save runs after the step's range has closed, and copies the whole state to the host.
        with checkpoint_range():
            super()._save_checkpoint(trainer, filepath)


def inside_the_epoch(trainer: pl.Trainer) -> bool:
    """Whether the epoch's batches done so far (the current one included) are fewer than the epoch has (False for a
    loader without a length: its epoch ends where it ends)."""
    done = trainer.fit_loop.epoch_loop.batch_progress.current.processed
    return done < trainer.num_training_batches != float("inf")


def resume_at_the_next_epoch(checkpoint: dict[str, Any]) -> bool:
    """Gives an epoch-end ``checkpoint`` the loops' state at the next epoch's start (item 7 of the module docstring):
    the epoch completed, the per-epoch counters reset as the epoch loop resets them for a new epoch. Both of Lightning's
    resume paths then start the next epoch as an uninterrupted run does (``on_train_epoch_start``, ``batch_idx`` 0, the
    sampler's epoch) and save its loop state, but for one count: under ``max_steps`` the restarting epoch loop passes
    its validation check once before the first batch and counts a logger step there (``_batches_that_stepped``, which
    ``ImageNetClassifier.on_train_batch_start`` sets back to ``global_step``).

    Left as they are: a checkpoint of a fit stopped inside an epoch (not at its last batch: the resumed run trains the
    rest of it) and one saved at a validation's end (the epoch's end has not run: the resumed run runs it).

    Returns:
        Whether anything was changed (in place).
    """
    fit_loop = checkpoint.get("loops", {}).get("fit_loop")
    if not isinstance(fit_loop, dict):
        return False
    try:
        epochs, batches = fit_loop["epoch_progress"], fit_loop["epoch_loop.batch_progress"]
        ended = all(
            epochs[key]["ready"] == epochs[key]["started"] == epochs[key]["processed"] == epochs[key]["completed"] + 1
            for key in ("total", "current")
        )
        last_batch_done = batches["is_last_batch"] is True and (
            batches["current"]["processed"] == batches["current"]["completed"]
        )
        # What TrainingEpochLoop.reset does at an epoch's start when not restarting: the counts of the epoch's batches,
        # scheduler and optimizer steps start again; validation's total counts the epoch's validation batches.
        optimizer = fit_loop["epoch_loop.automatic_optimization.optim_progress"]["optimizer"]
        restart = [
            batches["current"],
            fit_loop["epoch_loop.scheduler_progress"]["current"],
            *(counts["current"] for counts in optimizer.values()),
            fit_loop["epoch_loop.val_loop.batch_progress"]["total"],
        ]
    except (KeyError, TypeError, AttributeError):  # another layout (another Lightning version): leave it to Lightning
        return False
    if not (ended and last_batch_done and all(isinstance(counts, dict) for counts in restart)):
        return False
    for key in ("total", "current"):
        epochs[key]["completed"] = epochs[key]["processed"]
    for counts in restart:
        counts.update(dict.fromkeys(counts, 0))
    batches["is_last_batch"] = False
    return True
