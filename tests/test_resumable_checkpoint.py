"""ResumableCheckpoint: checkpoints written after a resume resume exactly (Lightning 2.6 gaps, module docstring)."""

from __future__ import annotations

from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback, ModelCheckpoint
from pytorch_lightning.demos.boring_classes import BoringModel

from callbacks import ResumableCheckpoint

BATCHES = 4  # per epoch


class _Saves(Callback):
    """Records the loop position at every checkpoint save."""

    def __init__(self) -> None:
        self.saves: list[tuple[int, int]] = []  # (global_step, batches processed in the epoch)

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict) -> None:
        self.saves.append((trainer.global_step, trainer.fit_loop.epoch_loop.batch_progress.current.processed))


def _fit(folder: Path, ckpt: Path | None = None, accumulate: int = 1, **limits: int) -> tuple[pl.Trainer, _Saves]:
    last = ResumableCheckpoint(
        dirpath=folder, filename="last", every_n_train_steps=1, monitor=None, enable_version_counter=False
    )
    at_validation = ResumableCheckpoint(
        dirpath=folder, filename="val", monitor=None, enable_version_counter=False
    )  # no every_n_*: ModelCheckpoint saves at validation end
    saves = _Saves()
    trainer = pl.Trainer(
        accelerator="cpu",
        limit_train_batches=BATCHES,
        limit_val_batches=1,
        num_sanity_val_steps=0,
        accumulate_grad_batches=accumulate,
        callbacks=[last, at_validation, saves],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **limits,
    )
    trainer.fit(BoringModel(), ckpt_path=ckpt)
    return trainer, saves


def test_a_validation_end_checkpoint_after_an_epoch_end_resume_resumes_the_next_epoch(tmp_path: Path) -> None:
    # Stopped right after the last batch of epoch 0: last.ckpt is an epoch-end checkpoint.
    first, _ = _fit(tmp_path, max_epochs=3, max_steps=BATCHES)
    assert first.global_step == BATCHES
    # Resumed from it, epoch 1 runs to its end; its validation-end checkpoint is val.ckpt.
    second, _ = _fit(tmp_path, tmp_path / "last.ckpt", max_epochs=2)
    assert second.global_step == 2 * BATCHES
    saved = torch.load(tmp_path / "val.ckpt", weights_only=False)
    epochs = saved["loops"]["fit_loop"]["epoch_progress"]["current"]
    assert epochs["started"] == epochs["completed"] + 1 == 2  # epoch 1 in progress, as an uninterrupted run saves it
    # Resumed from val.ckpt, epoch 2 trains all its batches (Lightning alone: none, a lost epoch).
    third, _ = _fit(tmp_path, tmp_path / "val.ckpt", max_epochs=3)
    assert third.global_step == 3 * BATCHES
    assert third.current_epoch == 3


def test_no_checkpoint_inside_an_accumulated_step_after_a_resume(tmp_path: Path) -> None:
    first, saves = _fit(tmp_path, accumulate=2, max_steps=1, max_epochs=5)
    assert set(saves.saves) == {(1, 2)}  # after micro-batch 2, the end of step 1
    resumed, saves = _fit(tmp_path, tmp_path / "last.ckpt", accumulate=2, max_steps=2, max_epochs=5)
    assert resumed.global_step == 2
    # Every save after the resume ends an optimizer step (Lightning alone also saves after micro-batch 3, at step 1).
    assert saves.saves and all(processed % 2 == 0 for _, processed in saves.saves), saves.saves
    assert (1, 3) not in saves.saves


def test_state_key_is_lightnings_and_formatted_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lightning names every hook call by it: formatted at the first use, the same string every time after."""
    callback = ResumableCheckpoint(monitor="val_acc1", mode="max", every_n_train_steps=5)
    expected = ModelCheckpoint.state_key.fget(callback)  # Lightning's own formatting of the same arguments
    formatted: list[dict] = []
    generate = ModelCheckpoint._generate_state_key
    monkeypatch.setattr(
        ResumableCheckpoint, "_generate_state_key", lambda self, **kw: formatted.append(kw) or generate(self, **kw)
    )
    assert [callback.state_key for _ in range(12)] == [expected] * 12
    assert len(formatted) == 1
    assert "'every_n_train_steps': 5" in expected and expected.startswith("ResumableCheckpoint{")
