"""Test-only callbacks passed to train.py subprocesses (importable through PYTHONPATH=tests), the command line of the
two-process CPU DDP profiling runs, and the in-process CPU fit the profiling tests share."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
from core_probes import QUIET


class FinalStepRecorder(pl.Callback):
    """Writes ``$FINAL_STEP_DIR/rank{R}.json`` with the global step each rank ended training at."""

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        out = Path(os.environ["FINAL_STEP_DIR"]) / f"rank{trainer.global_rank}.json"
        out.write_text(json.dumps({"global_step": trainer.global_step}))


def ddp_synthetic_args(run_dir: Path) -> list[str]:
    """``train.py fit`` arguments (run from the repository root) of a two-process CPU DDP run of resnet18 on 30
    synthetic steps, everything written under ``run_dir``; the tests add their callbacks and ``--profile.*``."""
    return [
        "fit", "--config", "configs/quickstart.yaml",
        "--data.source", "synthetic", "--data.synthetic_num_classes", "10", "--data.synthetic_train_steps", "30",
        "--data.batch_size", "4", "--data.crop_size", "32", "--model.arch", "resnet18",
        "--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.strategy", "ddp",
        "--trainer.max_steps", "30", "--trainer.limit_val_batches", "0", "--trainer.enable_progress_bar", "false",
        "--trainer.default_root_dir", str(run_dir), "--trainer.logger.init_args.save_dir", str(run_dir),
    ]  # fmt: skip


def fit_with_window(
    tmp_path: Path,
    window: pl.Callback,
    max_steps: int,
    accumulate: int = 1,
    extra: tuple | list = (),
    folder: Path | None = None,
    checkpointing: bool = False,
    train_steps: int = 20,
    val_batches: int = 0,
    stage: str = "fit",
    ckpt_path: str | None = None,
    **trainer_kwargs: Any,
) -> pl.Trainer:
    """resnet18 on the CPU for ``max_steps`` steps of 4 images (synthetic, ``train_steps`` batches an epoch, or the
    JPEG ``folder``) with ``window`` (a ProfilerWindow) and ``extra`` callbacks; ``val_batches`` validation batches
    (none by default); ``checkpointing`` for checkpoint callbacks in ``extra``; ``stage`` ``validate`` runs
    ``trainer.validate`` instead of fit, from ``ckpt_path`` if given; ``trainer_kwargs`` go to the Trainer."""
    from datamodule import ImageNetDataModule
    from imagenet_module import ImageNetClassifier

    data = ImageNetDataModule(
        root=str(folder or tmp_path),
        source="folder" if folder else "synthetic",
        batch_size=4,
        workers=0,
        crop_size=32,
        val_resize_size=36,
        val_crop_size=32,
        synthetic_num_classes=10,
        synthetic_train_steps=train_steps,
        synthetic_val_steps=max(1, val_batches),
    )
    model = ImageNetClassifier(arch="resnet18", num_classes=10, batch_size=4)
    trainer = pl.Trainer(
        **{
            "accelerator": "cpu",
            "devices": 1,
            "max_steps": max_steps,
            "limit_val_batches": val_batches,
            "accumulate_grad_batches": accumulate,
            "callbacks": [window, *extra],
            "default_root_dir": str(tmp_path),
            **QUIET,
            "enable_checkpointing": checkpointing,
            **trainer_kwargs,
        }
    )
    (trainer.fit if stage == "fit" else trainer.validate)(model, data, ckpt_path=ckpt_path)
    return trainer
