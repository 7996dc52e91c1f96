"""What a ``--ckpt_path`` is checked against before anything starts (resume_checks.py), on parsed options and small
checkpoints written here: a fit at or past the run's end (epochs counted as Lightning counts them, steps, the time
limit over every resume), ``last`` checked as a named file is, an arch the run names, files that are no Lightning
checkpoint. The refusals as a user meets them (exit 2, one line) run through train.main: test_train.py and
test_checkpoint_folders.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from jsonargparse import Namespace

from config_checks import ConfigError
from resume_checks import check_ckpt_path


def checkpoint(path: Path, steps: int = 12, processed: int = 2, started: int = 2, last_batch: bool = False,
               elapsed: float = 0.0, arch: str = "resnet18") -> Path:  # fmt: skip
    """A Lightning checkpoint's entries that the checks read, saved at ``path``."""
    torch.save(
        {
            "pytorch-lightning_version": "2.6.0",
            "global_step": steps,
            "loops": {
                "fit_loop": {
                    "epoch_progress": {"current": {"processed": processed, "started": started}},
                    "epoch_loop.batch_progress": {"is_last_batch": last_batch},
                }
            },  # fmt: skip
            "callbacks": {"Timer": {"time_elapsed": {"train": elapsed}}},
            "hyper_parameters": {"arch": arch},
            "datamodule_hyper_parameters": {"val_resize_size": 73, "val_crop_size": 64},
        },
        path,
    )
    return path


def run(
    subcommand: str,
    ckpt_path: object,
    *,
    max_epochs: int = -1,
    max_steps: int = -1,
    max_time: object = None,
    arch: str = "resnet18",
    last_dirpath: str | None = None,
    val_sizes: tuple[int, int] = (73, 64),
) -> Namespace:
    """The parsed options of ``subcommand`` with ``--ckpt_path ckpt_path``."""
    logger = Namespace(class_path="run_logger.RunLogger", init_args=Namespace(save_dir="runs", version="fixed"))
    section = Namespace(
        ckpt_path=ckpt_path,
        config=None,
        model=Namespace(arch=arch, weights=None),
        data=Namespace(val_resize_size=val_sizes[0], val_crop_size=val_sizes[1]),
        trainer=Namespace(
            strategy="auto",
            max_epochs=max_epochs,
            max_steps=max_steps,
            max_time=max_time,
            logger=logger,
            default_root_dir=None,
        ),  # fmt: skip
        checkpoint=Namespace(dirpath=None),
        last_checkpoint=Namespace(filename="last", dirpath=last_dirpath),
        preemption=Namespace(dirpath=None, filename=None),
    )
    return Namespace(subcommand=subcommand, **{subcommand: section})


def test_an_epoch_ended_on_its_last_batch_counts_as_done(tmp_path: Path) -> None:
    # Saved after the last batch of the second epoch, before its end: Lightning counts two epochs done.
    at_last_batch = checkpoint(tmp_path / "a.ckpt", steps=12, processed=1, started=2, last_batch=True)
    with pytest.warns(UserWarning, match=r"has trained 2 epochs and this run ends at trainer.max_epochs 2: nothing"):
        assert check_ckpt_path(run("fit", str(at_last_batch), max_epochs=2), []) == 12
    with pytest.raises(ConfigError, match=r"has trained 2 epochs and this run ends at trainer.max_epochs 1: nothing"):
        check_ckpt_path(run("fit", str(at_last_batch), max_epochs=1), [])
    in_the_epoch = checkpoint(tmp_path / "b.ckpt", steps=9, processed=1, started=2, last_batch=False)
    assert check_ckpt_path(run("fit", str(in_the_epoch), max_epochs=2), []) is None  # one epoch to finish


def test_steps_and_the_time_limit_over_every_resume_end_a_run(tmp_path: Path) -> None:
    path = checkpoint(tmp_path / "a.ckpt", steps=12, processed=2, elapsed=3600.0)
    with pytest.raises(ConfigError, match=r"has trained 12 steps and this run ends at trainer.max_steps 10"):
        check_ckpt_path(run("fit", str(path), max_steps=10), [])
    with pytest.raises(ConfigError, match=r"has trained for 1:00:00 and this run ends at trainer.max_time 0:59:00"):
        check_ckpt_path(run("fit", str(path), max_epochs=90, max_time="00:00:59:00"), [])
    with pytest.raises(ConfigError, match=r"has trained for 1:00:00 and this run ends at trainer.max_time 1:00:00"):
        check_ckpt_path(run("fit", str(path), max_epochs=90, max_time={"hours": 1}), [])  # stopped by it, same limit
    assert check_ckpt_path(run("fit", str(path), max_steps=13, max_time={"hours": 2}), []) is None


def test_last_is_checked_as_the_file_it_takes(tmp_path: Path) -> None:
    checkpoint(tmp_path / "last.ckpt", steps=12, processed=2)
    with pytest.raises(ConfigError, match=rf"--ckpt_path last \({tmp_path / 'last.ckpt'}\) has trained 2 epochs"):
        check_ckpt_path(run("fit", "last", max_epochs=1, last_dirpath=str(tmp_path)), [])
    with pytest.warns(UserWarning, match=r"validated at other sizes than this validate's: data.val_crop_size 56"):
        check_ckpt_path(run("validate", "last", last_dirpath=str(tmp_path), val_sizes=(73, 56)), [])
    with pytest.raises(ConfigError, match=r"no last\*.ckpt in .*empty, so test would evaluate a randomly"):
        check_ckpt_path(run("test", "last", last_dirpath=str(tmp_path / "empty")), [])
    # A fit's first submission of a requeued job: nothing there yet, Lightning starts from scratch.
    assert check_ckpt_path(run("fit", "last", last_dirpath=str(tmp_path / "empty")), []) is None


def test_only_an_arch_the_run_names_is_held_against_the_checkpoints(tmp_path: Path) -> None:
    path = str(checkpoint(tmp_path / "a.ckpt", arch="resnet18"))
    with pytest.raises(ConfigError, match=r"holds a resnet18 and this run asks for model.arch resnet50; pass --model"):
        check_ckpt_path(run("validate", path, arch="resnet50"), ["validate", "--model.arch", "resnet50"])
    assert check_ckpt_path(run("validate", path, arch="resnet50"), ["validate", "--ckpt_path", path]) is None


def test_files_lightning_did_not_write_and_names_it_cannot_take(tmp_path: Path) -> None:
    torch.save({"state_dict": {}, "epoch": 3}, tmp_path / "weights.pth")
    with pytest.raises(ConfigError, match=r"is not a Lightning checkpoint .*found keys \['epoch', 'state_dict'\]"):
        check_ckpt_path(run("fit", str(tmp_path / "weights.pth")), [])
    with pytest.raises(ConfigError, match=r"--ckpt_path best names the best checkpoint of a fit in this same process"):
        check_ckpt_path(run("test", "best"), [])
    with pytest.raises(ConfigError, match=rf"--ckpt_path {tmp_path} is a folder; pass a checkpoint file"):
        check_ckpt_path(run("fit", str(tmp_path)), [])
    for passed_on in ("hpc", "s3://bucket/last.ckpt", "registry:model:v1"):  # Lightning's to resolve
        assert check_ckpt_path(run("fit", passed_on), []) is None


def test_an_evaluation_of_no_checkpoint_is_warned_of() -> None:
    with pytest.warns(UserWarning, match=r"validate without --ckpt_path \(or model.weights\) evaluates a randomly"):
        assert check_ckpt_path(run("validate", None), []) is None
    assert check_ckpt_path(Namespace(fit=None), []) is None  # the CLI built without a subcommand (run=False)
