"""Which model options a run from a checkpoint takes (checkpoint_model_options.py), on parsed options as LightningCLI
leaves them: the command line's own win back over the checkpoint's, a config file's do not, ``model.weights`` is not
read, and each change is said. A resume through train.main: test_train.py."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from jsonargparse import Namespace

from checkpoint_model_options import model_keys_in_config_files, model_keys_on_the_command_line, settle_model_options


def test_the_command_lines_model_keys_in_each_way_of_writing_them() -> None:
    argv = ["fit", "--model.lr", "0.2", "--model.momentum=0.8", "--model.lr_milestones+=100", "--model.init_args.x",
            "--config", "a.yaml", "--data.batch_size", "8", "model.arch"]  # fmt: skip
    assert model_keys_on_the_command_line(argv) == {"lr", "momentum", "lr_milestones", "init_args"}


def test_the_config_files_model_keys_plain_or_under_init_args_and_unreadable_files_set_none(tmp_path: Path) -> None:
    plain, nested, broken = tmp_path / "plain.yaml", tmp_path / "nested.yaml", tmp_path / "broken.yaml"
    plain.write_text("model:\n  arch: resnet50\n  lr: 0.1\ndata:\n  workers: 2\n")
    nested.write_text("model:\n  class_path: imagenet_module.ImageNetClassifier\n  init_args:\n    warmup_epochs: 1\n")
    broken.write_text("model: [unclosed\n")
    section = Namespace(config=[str(plain), str(nested), str(broken), str(tmp_path / "gone.yaml")])
    assert model_keys_in_config_files(section) == {"arch", "lr", "warmup_epochs"}
    assert model_keys_in_config_files(Namespace(config=None)) == set()


@pytest.fixture
def notes(caplog: pytest.LogCaptureFixture):
    """The ``--ckpt_path:`` note that settle_model_options logs (none: ``[]``)."""
    caplog.set_level(logging.INFO, logger="pytorch_lightning.utilities.rank_zero")

    def said() -> list[str]:
        return [record.getMessage() for record in caplog.records if record.getMessage().startswith("--ckpt_path:")]

    return said


def test_the_command_lines_options_win_back_and_each_change_is_said(notes) -> None:
    before = Namespace(arch="resnet18", lr=0.2, warmup_epochs=5, batch_size=8, num_classes=10, weights="start.pth")
    model = Namespace(arch="resnet18", lr=0.05, warmup_epochs=1, batch_size=256, num_classes=1000, weights="start.pth")
    settle_model_options(model, before, ["--model.lr", "0.2"], "fit")
    assert model == Namespace(arch="resnet18", lr=0.2, warmup_epochs=1, batch_size=256, num_classes=1000, weights=None)
    assert notes() == [
        "--ckpt_path: model.lr 0.2 from the command line (the checkpoint's: 0.05); model.warmup_epochs 1 from the "
        "checkpoint (the configuration's: 5); model.weights start.pth not read (the checkpoint's weights replace them)"
    ]


def test_an_evaluation_says_nothing_of_its_optimizers_options(notes) -> None:
    before = Namespace(arch="resnet18", lr=0.2, momentum=0.9, channels_last=False)
    model = Namespace(arch="resnet18", lr=0.05, momentum=0.8, channels_last=True)
    settle_model_options(model, before, ["--model.lr=0.2"], "validate")
    assert (model.lr, model.momentum, model.channels_last) == (0.2, 0.8, True)  # the command line's lr still wins
    assert notes() == ["--ckpt_path: model.channels_last True from the checkpoint (the configuration's: False)"]
    settle_model_options(Namespace(lr=0.1), Namespace(lr=0.1), [], "fit")
    assert len(notes()) == 1  # nothing changed: no note
