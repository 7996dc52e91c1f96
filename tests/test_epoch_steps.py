"""epoch_steps: the optimizer steps of an epoch are the ones Lightning's loop takes (a real Trainer's count)."""

from __future__ import annotations

import pytest
import pytorch_lightning as pl
from pytorch_lightning.demos.boring_classes import BoringModel

from epoch_steps import optimizer_steps_per_epoch


@pytest.mark.parametrize(("batches", "accumulate"), [(1, 1), (4, 1), (4, 2), (5, 2), (3, 4)])
def test_the_steps_are_lightnings_with_one_on_an_epochs_last_batch(batches: int, accumulate: int) -> None:
    trainer = pl.Trainer(accelerator="cpu", max_epochs=2, limit_train_batches=batches, limit_val_batches=0,
                         accumulate_grad_batches=accumulate, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    trainer.fit(BoringModel())
    assert trainer.global_step == 2 * optimizer_steps_per_epoch(batches, accumulate)
