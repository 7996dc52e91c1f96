"""Where last.ckpt goes, and what ``--ckpt_path`` accepts: a requeued job's ``--ckpt_path last`` resumes from the
newest state, the preemption checkpoint included; a file Lightning cannot resume from is refused before anything starts.

The runs are ``train.main`` in this process (resnet18 on 32-pixel crops, 6 steps an epoch); a callback of this module
sends SIGTERM to the process, which the preemption handler turns into a checkpoint and ``PreemptedExit``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
import torchvision
from pytorch_lightning.callbacks import Callback

import train
from callbacks.preemption import PreemptedExit

REPO = Path(train.__file__).resolve().parent


class SigtermAt(Callback):
    """Sends SIGTERM to this process at the end of the training batch that completes optimizer step ``step``."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


@pytest.fixture
def main(monkeypatch: pytest.MonkeyPatch):
    """``train.main`` with the process arguments of ``python train.py`` (not pytest's)."""
    monkeypatch.setattr(sys, "argv", [str(REPO / "train.py")])
    return train.main


def callbacks(*specs: tuple[str, dict]) -> list[str]:
    value = [{"class_path": path, "init_args": init} for path, init in specs]
    return ["--trainer.callbacks", json.dumps(value)]


def sigterm_at(step: int) -> list[str]:
    return callbacks((f"{__name__}.SigtermAt", {"step": step}))


def first_step(cli: train.ImageNetCLI) -> int:
    """The global step this run's first training batch started at (where it resumed)."""
    lr_log = next(c for c in cli.trainer.callbacks if type(c).__name__ == "LRLog")
    return min(lr_log.lr)


def saved_step(path: Path) -> int:
    return torch.load(path, map_location="cpu", weights_only=True)["global_step"]


@pytest.fixture
def args(shapes_root: Path, tmp_path: Path, tiny_args) -> list[str]:
    return tiny_args(
        shapes_root,
        tmp_path / "runs",
        data__batch_size=8,
        trainer__limit_train_batches=6,
        trainer__limit_val_batches=1,
        trainer__max_epochs=3,
    )


def test_preemption_goes_where_last_checkpoint_writes_and_last_finds_it(args, tmp_path: Path, main) -> None:
    # Only last_checkpoint's folder is fixed: the preemption checkpoint (step 3) goes there, over the callback's step-2
    # last.ckpt, not into the best checkpoint callback's version_0 folder, which a requeued job never sees again.
    fixed = tmp_path / "fixed"
    job = [*args, "--last_checkpoint.dirpath", str(fixed), "--last_checkpoint.every_n_train_steps", "2"]
    with pytest.raises(PreemptedExit) as stopped:
        main(["fit", *job, *sigterm_at(3)])
    assert stopped.value.code == 128 + signal.SIGTERM
    assert saved_step(fixed / "last.ckpt") == 3
    assert list((tmp_path / "runs").rglob("last.ckpt")) == []
    lr_log = callbacks(("core_probes.LRLog", {}))
    requeued = main(["fit", *job, *lr_log, "--trainer.max_steps", "4", "--ckpt_path", "last"])
    assert first_step(requeued) == 3 and requeued.trainer.global_step == 4


def test_checkpoint_dirpath_alone_holds_last_ckpt_too(args, tmp_path: Path, main) -> None:
    # Only checkpoint.dirpath: last_checkpoint follows it, so last.ckpt (the preemption's, then the callback's at the
    # stop) is where the next submission's --ckpt_path last looks, beside the best checkpoints.
    best = tmp_path / "best"
    job = [*args, "--checkpoint.dirpath", str(best), *callbacks(("core_probes.LRLog", {}))]
    with pytest.raises(PreemptedExit):
        main(["fit", *job, *sigterm_at(3), "--ckpt_path", "last"])  # the first submission: nothing there yet
    assert saved_step(best / "last.ckpt") == 3
    second = main(["fit", *job, "--trainer.max_steps", "8", "--ckpt_path", "last"])
    assert first_step(second) == 3 and second.trainer.global_step == 8
    assert saved_step(best / "last.ckpt") == 8 and list(best.glob("best-epoch000-*.ckpt"))
    third = main(["fit", *job, "--trainer.max_steps", "9", "--ckpt_path", "last"])
    assert first_step(third) == 8
    # Its own last_checkpoint.dirpath keeps last.ckpt elsewhere.
    elsewhere = tmp_path / "latest"
    cli = main(["fit", *job, "--trainer.max_steps", "1", "--last_checkpoint.dirpath", str(elsewhere)])
    assert [c.dirpath for c in cli.trainer.checkpoint_callbacks] == [str(best.resolve()), str(elsewhere.resolve())]


def test_ckpt_path_last_is_refused_where_it_would_miss_the_latest_state(args, tmp_path: Path, refused) -> None:
    # No fixed folder for last.ckpt (the logger's next version_N): the error names the options that fix it.
    said = refused(["fit", *args, "--ckpt_path", "last"])
    assert "--ckpt_path last: this run writes into a new version folder of its own" in said
    assert "(--last_checkpoint.dirpath DIR, or --trainer.logger.init_args.version NAME;" in said
    fixed = ["--last_checkpoint.dirpath", str(tmp_path / "fixed")]
    # A preemption checkpoint that Lightning's 'last' would not look at.
    said = refused(["fit", *args, *fixed, "--preemption.dirpath", str(tmp_path / "stop"), "--ckpt_path", "last"])
    assert f"preemption.dirpath {tmp_path / 'stop'} is not one of them" in said
    assert f"--last_checkpoint.dirpath {tmp_path / 'stop'}" in said
    said = refused(["fit", *args, *fixed, "--preemption.filename", "stop.ckpt", "--ckpt_path", "last"])
    assert "preemption.filename makes stop.ckpt: a requeued job would not resume from it" in said
    said = refused(["fit", *args, *fixed, "--last_checkpoint.filename", "latest", "--ckpt_path", "last"])
    assert "last_checkpoint.filename makes latest.ckpt" in said
    assert not (tmp_path / "runs").exists()  # refused before any run folder


def test_validate_last_looks_where_lightning_does_home_expanded_and_without_a_logger(
    args, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refused
) -> None:
    """Lightning expands ~ in last_checkpoint.dirpath and trainer.default_root_dir: validate --ckpt_path last was
    refused there though Lightning would find the checkpoint; without a logger the advice named runs/lightning_logs."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home" / "ck").mkdir(parents=True)
    said = refused(["validate", *args, "--last_checkpoint.dirpath", "~/ck", "--ckpt_path", "last"])
    assert f"no last*.ckpt in {tmp_path / 'home' / 'ck'}, so validate would evaluate" in said
    torch.save({"pytorch-lightning_version": pl.__version__, "state_dict": {}}, tmp_path / "home" / "ck" / "last.ckpt")
    asked: list[str] = []
    monkeypatch.setattr(pl.Trainer, "validate", lambda self, *a, ckpt_path=None, **k: asked.append(ckpt_path))
    main_args = ["validate", *args, "--last_checkpoint.dirpath", "~/ck", "--ckpt_path", "last"]
    train.main(main_args)  # found: Lightning's to load
    assert asked == ["last"]
    root = str(tmp_path / "root")
    said = refused(["validate", *args, "--trainer.logger", "false", "--trainer.default_root_dir", root,
                    "--ckpt_path", "last"])  # fmt: skip
    assert said.endswith(f"no last*.ckpt in {tmp_path / 'root' / 'checkpoints'}, so validate would evaluate a "
                         "randomly initialized model; pass the checkpoint file")  # fmt: skip


# --- --ckpt_path files that are not Lightning checkpoints -------------------------------------------------------
def test_a_main_amp_checkpoint_is_refused_saying_how_to_convert_it(args, tmp_path: Path, refused) -> None:
    model = torchvision.models.resnet18(num_classes=10)
    legacy = tmp_path / "checkpoint.pth.tar"
    state = {"module." + k: v for k, v in model.state_dict().items()}
    torch.save({"epoch": 3, "arch": "resnet18", "state_dict": state, "best_prec1": 12.5}, legacy)
    said = refused(["fit", *args, "--ckpt_path", str(legacy)])
    assert f"--ckpt_path {legacy} is a main_amp.py checkpoint (resnet18, 3 epochs done), not a Lightning one" in said
    assert f"python train.py -a resnet18 --b BATCH --resume {legacy} DATA_DIR" in said
    assert str(tmp_path / "checkpoint.lightning.ckpt") in said
    # To evaluate it, main_amp.py's own evaluation: -e (without it the command line above trains).
    said = refused(["validate", *args, "--ckpt_path", str(legacy)])
    assert f"as its -e did: python train.py -e -a resnet18 --resume {legacy} DATA_DIR" in said
    # Any other torch.save file: named, with what it holds.
    other = tmp_path / "weights.pth"
    torch.save(model.state_dict(), other)
    said = refused(["validate", *args, "--ckpt_path", str(other)])
    assert f"--ckpt_path {other} is not a Lightning checkpoint (it has no 'pytorch-lightning_version' entry" in said
    assert not (tmp_path / "runs").exists()
