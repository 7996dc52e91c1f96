"""Test-only callbacks for the core suite, importable by the subprocesses of the tests (PYTHONPATH=tests).

They write what each rank saw to JSON files, so a test can check the data sharding and the learning-rate schedule
of a run it started through the real CLI, in this process or in a ``python train.py`` subprocess.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.callbacks import Callback

#: Trainer options of a test run that writes and prints nothing it was not asked for.
QUIET = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False, "enable_model_summary": False}


class SeenData(Callback):
    """Writes, per rank and stage, the sampler's indices and the targets of every batch the module received.

    File ``<out_dir>/<stage>_rank<global rank>.json``: ``{"indices": [...], "targets": [...], "world_size": n,
    "epoch_indices": [[...], ...]}``, where ``indices`` are the sampler's indices of the last epoch (or validation
    run), ``targets`` the targets of its batches in order and ``epoch_indices`` the indices of every epoch so far;
    for training also ``losses``, ``[loss, images]`` of each batch of the epoch (the loss ``training_step`` returned).
    Rank 0 also writes the validation metrics to ``<out_dir>/val_metrics.json``.
    """

    def __init__(self, out_dir: str) -> None:
        self.out_dir = Path(out_dir)
        self._seen: dict[str, dict[str, Any]] = {}

    def _start(self, trainer: pl.Trainer, stage: str, loader: Any) -> None:
        indices = [int(i) for i in loader.sampler]
        epochs = self._seen.get(stage, {}).get("epoch_indices", [])
        self._seen[stage] = {
            "indices": indices,
            "targets": [],
            "world_size": trainer.world_size,
            "epoch_indices": [*epochs, indices],
        }

    def _batch(self, stage: str, batch: Any) -> None:
        self._seen[stage]["targets"].extend(int(t) for t in batch[1].tolist())

    def _write(self, trainer: pl.Trainer, stage: str) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.out_dir / f"{stage}_rank{trainer.global_rank}.json"
        path.write_text(json.dumps(self._seen[stage]))

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._start(trainer, "train", trainer.train_dataloader)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, idx: int) -> None:
        self._batch("train", batch)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, idx: int
    ) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self._seen["train"].setdefault("losses", []).append([float(loss), len(batch[1])])

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._write(trainer, "train")

    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._start(trainer, "val", trainer.val_dataloaders)

    def on_validation_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, idx: int, dataloader_idx: int = 0
    ) -> None:
        if not trainer.sanity_checking:
            self._batch("val", batch)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        self._write(trainer, "val")
        if trainer.global_rank == 0:
            metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val_")}
            (self.out_dir / "val_metrics.json").write_text(json.dumps(metrics))


class LRLog(Callback):
    """Records the learning rate and epoch of every optimizer step this process runs, keyed by ``global_step``.

    The rate is read in ``on_train_batch_start``: the one the coming optimizer step uses.
    """

    def __init__(self) -> None:
        self.lr: dict[int, float] = {}
        self.epoch: dict[int, int] = {}

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, idx: int) -> None:
        self.lr[trainer.global_step] = trainer.optimizers[0].param_groups[0]["lr"]
        self.epoch[trainer.global_step] = trainer.current_epoch


class SlowFailure(Callback):
    """Holds rank 0 for ``seconds`` when the run fails, before the app's own ``on_exception`` (this callback comes
    first in ``--trainer.callbacks``): the other ranks, which failed alike, reach their message first."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if trainer.global_rank == 0:
            time.sleep(self.seconds)
