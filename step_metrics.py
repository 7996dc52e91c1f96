"""What the LightningModule logs, without a host sync in the hot loop.

Per-step training values are added into one device buffer (one in-place add a step), the periodic train line (loss,
top-1, top-5, images/s, like the original's print_freq line) is reduced across ranks only every
``trainer.log_every_n_steps`` steps, the same steps on every rank, and ``train_loss_epoch`` once per epoch
(``StepMetrics``, which the module owns and calls from its hooks). Validation and test accuracy and loss are
``WeightedMean`` metrics that synchronize once, at the end.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from pytorch_lightning.utilities import rank_zero_info
from torchmetrics import Metric
from typing_extensions import override

from callbacks.ranges import METRICS, app_range
from callbacks.resumable_checkpoint import inside_the_epoch
from ddp_groups import new_gloo_group

if TYPE_CHECKING:
    from imagenet_module import ImageNetClassifier

#: What the module logs: every log_every_n_steps steps (train_*), per training epoch (train_loss_epoch), per
#: validation (val_*); what a checkpoint callback may monitor or name in its file name (config_checks.py checks it).
LOGGED_METRICS = (
    "train_loss", "train_acc1", "train_acc5", "train_img_s", "train_loss_epoch", "val_loss", "val_acc1", "val_acc5"
)  # fmt: skip


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


def totals_over_ranks(trainer: pl.Trainer, sums: torch.Tensor, images: int) -> torch.Tensor:
    """``sums`` followed by their image count, summed over every rank (a collective: call on all ranks, in batch
    hooks only, see ``StepMetrics.log_epoch_loss``)."""
    totals = torch.cat((sums, sums.new_tensor([images])))
    if trainer.world_size > 1:
        totals = trainer.strategy.reduce(totals, reduce_op="sum")
    return totals


class StepMetrics:
    """The training steps' metrics: the log interval's and the epoch's sums on the device, the images they cover, and
    the clocks of the interval's and the job's speed."""

    def __init__(self) -> None:
        # Running sums kept on the device, one in-place add per step: [loss x n, top-1 hits, top-5 hits] of the current
        # log interval, then loss x n of the current epoch. Float64: exact counts over a whole ImageNet epoch. The
        # images they cover are counted on the host, where each batch's size is known without a read-back.
        self.sums = torch.zeros(4, dtype=torch.float64)
        self.interval_images = 0
        self.epoch_images = 0
        self.job_start: tuple[float, int] | None = None  # (time, step) where the job's speed is counted from
        self.interval_start: float | None = None
        self.interval_step = 0
        self.paused_at: float | None = None  # when the clocks above stopped for a validation or an epoch's end
        self.paused_for = ""
        self.last_global_step = -1
        # The restored checkpoint's share of its epoch's loss (save_epoch_loss), taken up at the first batch, or at the
        # epoch's end when the resumed run starts there.
        self.saved_epoch_loss: dict[str, Any] | None = None
        self.epoch_loss_logged = False  # train_loss_epoch logged for the current epoch: a checkpoint now needs none
        # Under DDP, the gloo group that sums the epoch's loss over the ranks for a checkpoint (open_save_group).
        self.save_group: Any = None

    def open_save_group(self, trainer: pl.Trainer) -> None:
        """At a fit's setup, under DDP: the process group of ``save_epoch_loss``'s sum over the ranks.

        Its own gloo group, used by nothing else: a checkpoint's sum then cannot pair with another collective of the
        default group, such as the progress bar's reduce of epoch metrics, which rank 0 alone runs at an epoch's end,
        where a checkpoint may be saved next. Every rank makes it at the same point (a collective itself).
        """
        # A group left by an earlier fit that raised (Lightning runs no teardown hook then) may belong to a process
        # group since destroyed: made anew.
        self.close_save_group()
        if trainer.world_size > 1 and dist.is_available() and dist.is_initialized():
            self.save_group = new_gloo_group(trainer)  # a rank that never reaches a save: bounded by DDP's timeout

    def close_save_group(self) -> None:
        """At a fit's teardown: the group of ``open_save_group`` taken down."""
        group, self.save_group = self.save_group, None
        if group is not None:
            try:
                dist.destroy_process_group(group)
            except (RuntimeError, ValueError):
                pass  # its world was taken down already, and the group with it

    def start_fit(self, global_step: int) -> None:
        """At the fit's start: the log interval starts at the end of this fit's first optimizer step."""
        # The first step is warm-up (cudnn benchmarking, compilation); with gradient accumulation the interval starts
        # after its last micro-batch, not its first.
        self.last_global_step, self.interval_start, self.paused_at = global_step, None, None
        # A module fitted again (a resume inside an epoch skips on_train_epoch_start): the last fit's logged epoch does
        # not keep this fit's checkpoints from saving their epoch's loss.
        self.epoch_loss_logged = False

    def add_step(self, loss: torch.Tensor, logits: torch.Tensor, targets: torch.Tensor, top_k: int) -> None:
        """A training batch's loss and top-1 / top-``top_k`` hits added into the sums, without a host sync."""
        with torch.no_grad():
            n = targets.numel()
            hit = logits.topk(top_k, dim=1).indices == targets[:, None]
            hits = torch.stack((hit[:, 0], hit.any(dim=1))).sum(dim=1)
            # The batch size travels as a kernel argument: no host-to-device copy, no sync. A handful of launches per
            # step (the host's time per step is what a GPU waits for after each sync, e.g. fp16's overflow check).
            weighted = loss.detach().reshape(1) * n
            if self.sums.device != weighted.device:
                self.sums = self.sums.to(weighted.device)
            self.sums += torch.cat((weighted, hits, weighted))
            self.interval_images += n
            self.epoch_images += n

    def on_batch_start(self, trainer: pl.Trainer, global_step: int, current_epoch: int) -> None:
        """At a training batch's start: Lightning's step counter kept up, and a restored epoch loss taken up."""
        loop = trainer.fit_loop.epoch_loop
        if loop._batches_that_stepped != global_step:
            # Lightning writes step metrics when its own step counter is due; a resume with another
            # accumulate_grad_batches whose checkpoint falls inside one of the new steps leaves that counter behind the
            # optimizer steps (its restore skips an increment), and the print-freq lines (due by global_step) found no
            # row in metrics.csv. Equal otherwise at every batch start.
            loop._batches_that_stepped = global_step
        # A resume inside the epoch the checkpoint was saved in (Lightning then skips on_train_epoch_start):
        # train_loss_epoch goes on from the loss of the steps before it. A checkpoint saved after the epoch's end holds
        # none (save_epoch_loss): the run starts the next epoch, and its sums start at zero.
        self._take_up_the_saved_epoch_loss(trainer, current_epoch)

    def _take_up_the_saved_epoch_loss(self, trainer: pl.Trainer, current_epoch: int) -> None:
        saved, self.saved_epoch_loss = self.saved_epoch_loss, None
        if saved is None or saved.get("epoch") != current_epoch:
            return
        total, images = float(saved["sum"]), int(saved["images"])
        if "ranks" in saved:
            # The sums of every rank of the saving run (save_epoch_loss): this rank takes its share of the images and
            # the loss in proportion, so that the ranks' shares add up to the checkpoint's, on any number of ranks.
            # The DDP sampler gives every rank as many images; rank 0 takes what does not divide (log_epoch_loss
            # weighs each rank's mean by its count).
            world, rank = trainer.world_size, trainer.global_rank
            share = images // world + (images % world if rank == 0 else 0)
            total, images = (total * share / images if images else 0.0), share
        self.sums[3] = total
        self.epoch_images = images

    def on_batch_end(self, module: ImageNetClassifier, batch_idx: int) -> None:
        """At a training batch's end: the interval logged at a log step; the clocks stopped after an epoch's last."""
        self.log_step(module, batch_idx)
        if not inside_the_epoch(module.trainer):
            # The epoch's last step: from here to the next epoch's start (its validation, its end's checkpoints, which
            # Lightning runs after this hook) is not training.
            self.pause_clocks(module.trainer, "epoch end")

    def log_step(self, module: ImageNetClassifier, batch_idx: int) -> None:
        step = module.global_step
        if step == self.last_global_step:
            return  # still accumulating gradients: no optimizer step yet
        self.last_global_step = step
        if self.interval_start is None:
            self.interval_start, self.interval_step = time.perf_counter(), step
            self.job_start = (self.interval_start, step)
            with app_range(METRICS):  # the first step's sums are left out: it holds the warm-up (cudnn, compile)
                self.sums[:3].zero_()
            self.interval_images = 0
            return
        # The same condition on every rank at the same step: Lightning writes step metrics on exactly these steps
        # (none with log_every_n_steps 0; the epoch's train_loss_epoch is still logged), and at a step where the fit
        # stops (trainer.should_stop: exit_after, max_time, early stopping; decided alike on every rank), where it
        # wrote the last interval's row a second time: the stop's own, shorter interval instead. Reaching max_steps
        # sets no should_stop: without its own row, the steps after the last logged one were never logged.
        trainer = module.trainer
        every = trainer.log_every_n_steps
        max_steps = trainer.max_steps
        stopping = (trainer.should_stop and getattr(trainer.fit_loop, "_can_stop_early", True)) or (
            0 <= max_steps <= step
        )
        if every <= 0 or (step % every != 0 and not stopping):
            return
        # Lightning writes step metrics on its log steps and when should_stop is set (its should_update_logs, after
        # this hook); the row of a max_steps end is neither, and is written here, at the step Lightning would use.
        epoch_loop = trainer.fit_loop.epoch_loop
        lightning_writes = (epoch_loop._batches_that_stepped + 1) % every == 0 or trainer.should_stop
        # Named on the timeline: the step's range has closed (callbacks run first), and this is the interval's sync.
        with app_range(METRICS):
            self.log_interval(module, step, batch_idx, write=not lightning_writes)

    def log_interval(self, module: ImageNetClassifier, step: int, batch_idx: int, write: bool = False) -> None:
        """The interval's metrics, reduced over every rank (its one host sync), logged and printed; the sums reset.
        ``write``: to the loggers now, at a step where Lightning would not write them."""
        totals = totals_over_ranks(module.trainer, self.sums[:3], self.interval_images)
        loss_sum, correct, correct5, count = totals.tolist()  # the interval's one host sync
        now = time.perf_counter()
        batch = module.global_batch_size()
        interval_time = (now - self.interval_start) / max(step - self.interval_step, 1)
        assert self.job_start is not None
        job_time = (now - self.job_start[0]) / max(step - self.job_start[1], 1)
        count = max(count, 1)
        metrics = {
            "train_loss": loss_sum / count,
            "train_acc1": correct / count,
            "train_acc5": correct5 / count,
            "train_img_s": batch / interval_time,
        }
        module.log_dict(metrics, on_step=True, on_epoch=False)
        trainer = module.trainer
        if write:
            trainer._logger_connector.log_metrics(metrics)
        # The original's print_freq line (apex main_amp.py), reduced over all ranks, printed by rank 0.
        rank_zero_info(
            f"Epoch: [{module.current_epoch}][{batch_idx + 1}/{trainer.num_training_batches}]\t"
            f"Time {interval_time:.3f} ({job_time:.3f})\tSpeed {batch / interval_time:.3f} ({batch / job_time:.3f})\t"
            f"Loss {loss_sum / count:.4f}\tPrec@1 {100 * correct / count:.3f}\tPrec@5 {100 * correct5 / count:.3f}"
        )
        self.sums[:3].zero_()
        self.interval_images = 0
        self.interval_start, self.interval_step = now, step

    # The interval's and the job's clocks stop for a validation and over an epoch's end (its checkpoints included), as
    # the original's timer did (restarted at each train() call): train_img_s and the print-freq line are training
    # speed, not the first interval after a validation charged with all of it. The next epoch's first batch counts.
    def pause_clocks(self, trainer: pl.Trainer, reason: str) -> None:
        if self.interval_start is not None and self.paused_at is None and not trainer.sanity_checking:
            self.paused_at, self.paused_for = time.perf_counter(), reason

    def resume_clocks(self, reason: str) -> None:
        if self.paused_at is None or self.paused_for != reason:
            return
        paused = time.perf_counter() - self.paused_at
        self.paused_at = None
        if self.interval_start is not None and self.job_start is not None:
            self.interval_start += paused
            self.job_start = (self.job_start[0] + paused, self.job_start[1])

    def start_epoch(self) -> None:
        """At a training epoch's start: the clocks go on, the epoch's loss starts at zero."""
        self.resume_clocks("epoch end")
        self.sums[3:].zero_()
        self.epoch_images = 0
        self.epoch_loss_logged = False

    def log_epoch_loss(self, module: ImageNetClassifier) -> None:
        """``train_loss_epoch``: the mean over every image of the epoch, all ranks together."""
        # This rank's mean, weighted by its image count, which Lightning's sync_dist sums over the ranks with the
        # weighted values (two barriers and two small all-reduces an epoch, where Lightning reduces every epoch metric).
        # The count as a float: Lightning averages the ranks' counts, and an integer count's average is truncated
        # (gloo, and AVG under NCCL), which is off where the counts differ (a resume on another number of ranks gives
        # rank 0 the remainder of the checkpoint's images: 16 images resumed on 3 ranks logged a mean 2.6% high).
        # No collective of the module's own here: under DDP the progress bar, on rank 0 only, reduces the callbacks'
        # epoch metrics (train_bad_images) before this hook, so a collective here met another one on the other ranks
        # (a crash or a hang at the first epoch's end).
        # A checkpoint saved at the validation of an epoch's last batch, before the epoch's end: the resumed run starts
        # at that end (no batch before it), whose loss is the checkpoint's.
        self._take_up_the_saved_epoch_loss(module.trainer, module.current_epoch)
        images = self.epoch_images
        mean = self.sums[3] / max(images, 1)
        # max(images, 1): an epoch without images logs 0 (every rank has as many images under the DDP sampler).
        weight = float(max(images, 1))
        module.log("train_loss_epoch", mean.float(), on_step=False, on_epoch=True, sync_dist=True, batch_size=weight)
        self.epoch_loss_logged = True

    def save_epoch_loss(self, checkpoint: dict[str, Any], trainer: pl.Trainer | None, epoch: int) -> None:
        """The epoch's loss so far into ``checkpoint``, for train_loss_epoch after a resume before the epoch's end.

        Under DDP a collective of every rank on ``save_group``: Lightning's ``save_checkpoint`` runs this hook on every
        rank (and ends with a barrier, so every rank calls it for every save); ``ranks`` records that the sums are every
        rank's.
        """
        # Not once the epoch's end logged it: the resumed run starts the next epoch, its loss from zero. Before that
        # end, also at the validation of the epoch's last batch: the resumed run starts at the epoch's end. The same
        # decision on every rank (the flag is set in the same hook everywhere).
        if trainer is None or trainer.state.fn != "fit" or self.epoch_loss_logged:
            return
        # One small copy to the host, at a checkpoint only. Rank 0 writes the file, so it holds the sum over every
        # rank: the resumed run's epoch mean is then the uninterrupted run's (rank 0's own share stood for each
        # rank's before, an estimate).
        saved: dict[str, Any] = {"epoch": epoch, "sum": float(self.sums[3]), "images": self.epoch_images}
        if self.save_group is not None:
            totals = torch.tensor([saved["sum"], saved["images"]], dtype=torch.float64)
            dist.all_reduce(totals, group=self.save_group)
            saved.update(sum=totals[0].item(), images=int(totals[1].item()), ranks=dist.get_world_size(self.save_group))
        elif trainer.world_size == 1:
            saved["ranks"] = 1
        # Else (a save on several ranks outside a fit's setup and teardown): this rank's share, without "ranks", which
        # every rank takes as its own on resume, as checkpoints from before the sum over the ranks.
        checkpoint["train_epoch_loss"] = saved

    def restore_epoch_loss(self, checkpoint: dict[str, Any]) -> None:
        """The checkpoint's epoch loss so far, taken up at the first batch (``on_batch_start``), each rank its share."""
        self.saved_epoch_loss = checkpoint.get("train_epoch_loss")
