"""Which errors train.py says in one line (one_line_errors.py): only Lightning's own checks name a Trainer argument,
a worker's traceback around a bad image comes down to its message, and an error from outside Lightning while the
Trainer is built keeps its traceback. The refusals as a user meets them run through train.main (test_train.py)."""

from __future__ import annotations

import pytest
import pytorch_lightning as pl
import torch
from lightning_fabric.utilities.exceptions import MisconfigurationException

import one_line_errors
from image_loading import BadImageError


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


def raised(error: Exception) -> Exception:
    """``error`` after a raise here, with its traceback (a frame of this file, not of Lightning's)."""
    try:
        raise error
    except Exception as caught:  # noqa: BLE001 - the point
        return caught


def test_lightnings_checks_of_trainer_arguments_are_a_line_and_say_what_devices_takes() -> None:
    with pytest.raises(MisconfigurationException) as zero:
        pl.Trainer(devices=0, accelerator="cpu", logger=False)
    with pytest.raises(TypeError) as negative:  # raised in Lightning: kept as a line although no Misconfiguration
        pl.Trainer(devices=-2, accelerator="cpu", logger=False)
    for error in (zero.value, negative.value):
        assert (
            one_line_errors.trainer_argument_line(error) == f"trainer: {error} (trainer.devices: a count >= 1 or auto)"
        )
    assert one_line_errors.trainer_argument_line(raised(ValueError("a bug in a plugin"))) is None
    assert (
        one_line_errors.trainer_argument_line(raised(MisconfigurationException("strategy x"))) == "trainer: strategy x"
    )


def test_only_checks_of_a_configuration_key_are_a_line_in_setup() -> None:
    said = one_line_errors.setup_error_line(raised(ValueError(" data.batch_size 100000 is larger than ... \n")))
    assert said == "data.batch_size 100000 is larger than ..."
    assert one_line_errors.setup_error_line(raised(ValueError("--ckpt_path x.ckpt ..."))) == "--ckpt_path x.ckpt ..."
    assert one_line_errors.setup_error_line(raised(ValueError("datamodule went wrong"))) is None  # not "data."


def test_a_workers_traceback_comes_down_to_the_bad_images_message() -> None:
    from_worker = BadImageError(
        "Caught BadImageError in DataLoader worker process 1.\nOriginal Traceback (most recent call last):\n"
        '  File "image_loading.py", line 90, in load_rgb\n    raise BadImageError.for_file(path, reason)\n'
        "image_loading.BadImageError: bad image /data/val/n01/x.JPEG: truncated (...)\n"
    )
    assert one_line_errors.bad_image_line(from_worker) == "bad image /data/val/n01/x.JPEG: truncated (...)"
    # Raised while another was handled (the traceback quotes both): the one that ended the worker, the last.
    during = BadImageError(
        "Caught BadImageError in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n"
        "image_loading.BadImageError: bad image a.JPEG: empty file\n\nDuring handling of the above exception, another "
        "exception occurred:\n\nimage_loading.BadImageError: bad image b.JPEG: not an image\n"
    )
    assert one_line_errors.bad_image_line(during) == "bad image b.JPEG: not an image"
    assert (
        one_line_errors.bad_image_line(BadImageError("bad image a.JPEG:\n  empty file\n"))
        == "bad image a.JPEG: empty file"
    )
