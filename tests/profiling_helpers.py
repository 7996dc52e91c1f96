"""Test-only callbacks passed to train.py subprocesses (importable through PYTHONPATH=tests)."""

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
