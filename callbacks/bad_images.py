"""Logs how many bad images ``data.on_bad_image: skip`` replaced per epoch: ``train_bad_images``, ``val_bad_images``,
``test_bad_images``.

The counts are kept by :class:`bad_image_policy.BadImageCounter` in the main process of each rank (host-side integers,
no device work). Here they are logged once per epoch with ``reduce_fx="sum"`` and ``sync_dist=True``: one reduction
across ranks per epoch, none per step. Loaders without a counter (``source: synthetic``) log nothing.
"""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.callbacks import Callback
from typing_extensions import override  # a dependency (pyproject.toml); Lightning marks its hooks with it

from bad_image_policy import BadImageCounter, find_bad_image_counter


def _counters(loaders: Any) -> list[BadImageCounter]:
    if loaders is None:
        return []
    if isinstance(loaders, dict):
        loaders = list(loaders.values())
    elif not isinstance(loaders, (list, tuple)):
        loaders = [loaders]
    found = (find_bad_image_counter(loader) for loader in loaders if loader is not None)
    return [counter for counter in found if counter is not None]


def _log_count(pl_module: pl.LightningModule, name: str, loaders: Any) -> None:
    """Logs ``name``: the bad images the counters of ``loaders`` replaced this epoch, summed over ranks (one reduction);
    nothing for loaders without a counter."""
    counters = _counters(loaders)
    if counters:
        count = float(sum(counter.epoch_count for counter in counters))
        pl_module.log(name, count, on_step=False, on_epoch=True, reduce_fx="sum", sync_dist=True)


#: The counts this callback logs during a fit (a checkpoint callback may monitor them; config_checks.py).
TRAIN_BAD_IMAGES, VAL_BAD_IMAGES = "train_bad_images", "val_bad_images"


class BadImageCount(Callback):
    """Logs the number of bad images replaced per training epoch and per validation or test run, summed over ranks."""

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # The loader is exhausted by now, so the count is the epoch's. Every rank has a counter (one datamodule
        # configuration), so every rank takes part in the one reduction. It is lazy: rank 0's progress bar runs it in
        # its own on_train_epoch_end, the other ranks where Lightning next reads the metrics, so no on_train_epoch_end
        # hook after this one may run a collective of its own (step_metrics.py, ``StepMetrics.log_epoch_loss``).
        _log_count(pl_module, TRAIN_BAD_IMAGES, trainer.train_dataloader)

    @override
    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        _log_count(pl_module, VAL_BAD_IMAGES, trainer.val_dataloaders)

    @override
    def on_test_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        _log_count(pl_module, "test_bad_images", trainer.test_dataloaders)
