"""Which errors train.py says in one line (one_line_errors.py): only Lightning's own checks name a Trainer argument.
The refusals as a user meets them run through train.main (test_train.py)."""

from __future__ import annotations

import pytest
import pytorch_lightning as pl
import torch

import one_line_errors


def test_only_lightnings_data_setup_checks_become_one_line_errors() -> None:
    """A Lightning error during training keeps its traceback, even when it names a Trainer argument in backquotes."""
    from torch.utils.data import DataLoader, TensorDataset

    class Linear(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 2)

        def training_step(self, batch, batch_idx):  # noqa: ANN001, ANN201
            return self.layer(batch[0]).sum()

        def configure_optimizers(self):  # noqa: ANN201
            return torch.optim.SGD(self.parameters(), lr=0.1)

    loader = DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=2)
    quiet = {"accelerator": "cpu", "logger": False, "enable_checkpointing": False, "enable_progress_bar": False,
             "enable_model_summary": False}  # fmt: skip

    class LogsInFitStart(Linear):
        def on_fit_start(self) -> None:
            self.log("x", 1.0)  # Lightning: "You can't `self.log()` inside `on_fit_start`"

    with pytest.raises(Exception) as during_training:
        pl.Trainer(max_steps=1, **quiet).fit(LogsInFitStart(), loader)
    assert "`" in str(during_training.value) and one_line_errors.trainer_option_named_by(during_training.value) is None
    with pytest.raises(ValueError) as at_setup:
        pl.Trainer(max_steps=1, val_check_interval=1000, **quiet).fit(Linear(), loader, loader)
    assert one_line_errors.trainer_option_named_by(at_setup.value) == "val_check_interval"
