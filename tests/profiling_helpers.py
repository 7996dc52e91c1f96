"""Test-only callbacks passed to train.py subprocesses (importable through PYTHONPATH=tests), and the command line
of the two-process CPU DDP profiling runs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytorch_lightning as pl


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
