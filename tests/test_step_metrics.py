"""step_metrics alone: the weighted mean of val/test, the speed's clocks, a restored epoch loss taken up.

The logged figures in a real fit (interval and epoch means, train_img_s, the print-freq line, metrics.csv rows) are
tested with the module (tests/test_imagenet_module.py).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

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
