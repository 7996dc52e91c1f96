"""step_metrics alone: the weighted mean of val/test, the speed's clocks, a restored epoch loss taken up, the
epoch's loss of a checkpoint summed over two gloo ranks.

The logged figures in a real fit (interval and epoch means, train_img_s, the print-freq line, metrics.csv rows) are
tested with the module (tests/test_imagenet_module.py).
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import free_port

import step_metrics
from step_metrics import StepMetrics, WeightedMean


class _FakeClock:
    """``time`` for step_metrics: ``perf_counter`` moves only when a test moves it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now


def test_weighted_mean_leaves_out_weight_0_and_weighs_the_rest() -> None:
    mean = WeightedMean()
    mean.update(torch.tensor([1.0, 100.0]), torch.tensor([1.0, 0.0]))  # 100: a sample standing in for a bad image
    mean.update(torch.tensor([4.0]), torch.tensor([2.0]))
    assert float(mean.compute()) == pytest.approx((1.0 + 4.0 * 2) / 3)


def test_the_clocks_stop_and_go_on_for_the_same_reason_only(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _FakeClock()
    monkeypatch.setattr(step_metrics, "time", clock)
    training = SimpleNamespace(sanity_checking=False)
    metrics = StepMetrics()
    metrics.pause_clocks(training, "validation")  # before the first interval: nothing to stop
    assert metrics.paused_at is None
    metrics.interval_start, metrics.job_start = clock.now, (clock.now, 1)
    metrics.pause_clocks(SimpleNamespace(sanity_checking=True), "validation")  # the sanity check is no pause
    assert metrics.paused_at is None
    metrics.pause_clocks(training, "epoch end")
    clock.now += 50.0
    metrics.resume_clocks("validation")  # another reason: still stopped
    assert metrics.paused_at is not None
    metrics.start_epoch()  # goes on after an epoch's end
    assert metrics.paused_at is None
    assert metrics.interval_start == 1050.0 and metrics.job_start == (1050.0, 1)


@pytest.mark.parametrize(("epoch", "taken_up"), [(3, True), (4, False)])
def test_a_restored_epoch_loss_is_taken_up_at_the_first_batch_of_its_epoch_only(epoch: int, taken_up: bool) -> None:
    metrics = StepMetrics()
    metrics.restore_epoch_loss({"train_epoch_loss": {"epoch": 3, "sum": 12.5, "images": 5}})
    trainer = SimpleNamespace(fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(_batches_that_stepped=7)))
    metrics.on_batch_start(trainer, global_step=7, current_epoch=epoch)
    assert (float(metrics.sums[3]), metrics.epoch_images) == ((12.5, 5) if taken_up else (0.0, 0))
    metrics.sums[3], metrics.epoch_images = 0.0, 0
    metrics.on_batch_start(trainer, global_step=7, current_epoch=epoch)  # once: the next batch adds its own
    assert (float(metrics.sums[3]), metrics.epoch_images) == (0.0, 0)


def batch_start_trainer(world_size: int, global_rank: int) -> SimpleNamespace:
    """What ``StepMetrics.on_batch_start`` reads of a trainer at global step 7."""
    loop = SimpleNamespace(epoch_loop=SimpleNamespace(_batches_that_stepped=7))
    return SimpleNamespace(fit_loop=loop, world_size=world_size, global_rank=global_rank)


@pytest.mark.parametrize(
    ("world_size", "shares"),
    [(1, [(30.0, 7)]), (2, [(30.0 * 4 / 7, 4), (30.0 * 3 / 7, 3)]), (3, [(30.0 * 3 / 7, 3), *[(30.0 * 2 / 7, 2)] * 2])],
)
def test_every_ranks_saved_epoch_loss_is_shared_out_over_the_resumed_ranks(world_size: int, shares: list) -> None:
    """Sums of every rank (``ranks`` in the checkpoint), resumed on any number of ranks: each takes its share of the
    images, rank 0 the remainder, and of the loss in proportion; the shares add up to the checkpoint's sums."""
    taken = []
    for rank in range(world_size):
        metrics = StepMetrics()
        metrics.restore_epoch_loss({"train_epoch_loss": {"epoch": 3, "sum": 30.0, "images": 7, "ranks": 2}})
        metrics.on_batch_start(batch_start_trainer(world_size, rank), global_step=7, current_epoch=3)
        taken.append((float(metrics.sums[3]), metrics.epoch_images))
    assert taken == [pytest.approx(share) for share in shares]
    assert sum(t for t, _ in taken) == pytest.approx(30.0) and sum(n for _, n in taken) == 7


def test_a_checkpoint_of_one_ranks_share_is_each_ranks_own_on_resume() -> None:
    """A checkpoint without ``ranks`` (saved before the sum over the ranks): every rank resumes with it as its own."""
    for rank in (0, 1):
        metrics = StepMetrics()
        metrics.restore_epoch_loss({"train_epoch_loss": {"epoch": 3, "sum": 12.5, "images": 5}})
        metrics.on_batch_start(batch_start_trainer(2, rank), global_step=7, current_epoch=3)
        assert (float(metrics.sums[3]), metrics.epoch_images) == (12.5, 5)


def save_trainer(world_size: int) -> SimpleNamespace:
    """What ``StepMetrics.open_save_group`` and ``save_epoch_loss`` read of a fitting trainer."""
    return SimpleNamespace(world_size=world_size, state=SimpleNamespace(fn="fit"), strategy=SimpleNamespace())


def test_one_device_saves_its_epoch_loss_as_every_ranks() -> None:
    metrics = StepMetrics()
    metrics.open_save_group(save_trainer(1))  # nothing to open on one device
    assert metrics.save_group is None
    metrics.sums[3], metrics.epoch_images = 6.0, 8
    checkpoint: dict = {}
    metrics.save_epoch_loss(checkpoint, save_trainer(1), epoch=2)
    assert checkpoint["train_epoch_loss"] == {"epoch": 2, "sum": 6.0, "images": 8, "ranks": 1}


def _save_on_two_ranks(rank: int, port: int, out: str) -> None:
    """One of two gloo ranks: its own epoch sums, two checkpoints' and one after the epoch's end, then the group made
    anew over a leftover one, taken down, and taken down after the world itself."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    metrics, trainer = StepMetrics(), save_trainer(2)
    metrics.open_save_group(trainer)
    assert metrics.save_group is not None
    saved = []
    for images in (8, 16):  # rank r's loss x images is (r + 1) x images: the checkpoint holds 3 x images in all
        metrics.sums[3], metrics.epoch_images = float((rank + 1) * images), images
        checkpoint: dict = {}
        metrics.save_epoch_loss(checkpoint, trainer, epoch=0)
        saved.append(checkpoint["train_epoch_loss"])
    metrics.epoch_loss_logged = True  # after the epoch's end: no loss saved, and no collective either
    checkpoint = {}
    metrics.save_epoch_loss(checkpoint, trainer, epoch=0)
    assert "train_epoch_loss" not in checkpoint
    first = metrics.save_group
    metrics.open_save_group(trainer)  # a group left by an earlier fit (one that raised: no teardown) is made anew
    assert metrics.save_group is not None and metrics.save_group is not first
    metrics.close_save_group()
    assert metrics.save_group is None
    metrics.open_save_group(trainer)
    dist.destroy_process_group()  # the world taken down before the module's teardown: its group went with it
    metrics.close_save_group()
    assert metrics.save_group is None
    torch.save(saved, os.path.join(out, f"rank{rank}.pt"))


def test_ddp_ranks_save_the_sum_of_every_ranks_epoch_loss(tmp_path) -> None:
    """Two gloo processes: each checkpoint's epoch loss is the sum of both ranks' loss and images, on both ranks (rank 0
    writes the file), marked as the sums of 2 ranks."""
    mp.spawn(_save_on_two_ranks, args=(free_port(), str(tmp_path)), nprocs=2)
    for rank in (0, 1):
        assert torch.load(tmp_path / f"rank{rank}.pt") == [
            {"epoch": 0, "sum": 24.0, "images": 16, "ranks": 2},
            {"epoch": 0, "sum": 48.0, "images": 32, "ranks": 2},
        ]
