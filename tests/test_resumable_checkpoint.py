"""ResumableCheckpoint: checkpoints written after a resume resume exactly (Lightning 2.6 gaps, module docstring)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback, ModelCheckpoint
from pytorch_lightning.demos.boring_classes import BoringModel

from callbacks import ResumableCheckpoint
from callbacks.resumable_checkpoint import resume_at_the_next_epoch

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


class _StopAtBatch(Callback):
    """Stops the fit at the end of batch ``batch_idx`` of epoch 0, as max_time's timer can (after any micro-batch)."""

    def __init__(self, batch_idx: int) -> None:
        self.batch_idx = batch_idx

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: object, outputs: object, batch: object, idx: int):
        if trainer.current_epoch == 0 and idx == self.batch_idx:
            trainer.should_stop = True


def _fit_with_last(
    folder: Path, ckpt: Path | None, *callbacks: Callback, every_n_epochs: int = 1, **options: object
) -> tuple[pl.Trainer, _Saves]:
    """A fit with ``last.ckpt`` as train.py's last_checkpoint: no every_n_train_steps, so it saves at epoch ends only
    (every ``every_n_epochs``-th)."""
    last = ResumableCheckpoint(
        dirpath=folder, filename="last", monitor=None, enable_version_counter=False, every_n_epochs=every_n_epochs
    )
    saves = _Saves()
    trainer = pl.Trainer(
        accelerator="cpu",
        limit_val_batches=1,
        num_sanity_val_steps=0,
        callbacks=[last, saves, *callbacks],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **options,
    )
    trainer.fit(BoringModel(), ckpt_path=ckpt)
    return trainer, saves


@pytest.mark.parametrize("every", [2, 3])
def test_last_is_saved_at_every_epoch_end_also_between_validations(tmp_path: Path, every: int) -> None:
    # Lightning alone saved it after validations only: with validation every 2 epochs of 3, the last epoch was lost.
    trainer, saves = _fit_with_last(
        tmp_path, None, limit_train_batches=BATCHES, max_epochs=3, check_val_every_n_epoch=every
    )
    assert saves.saves == [(BATCHES * epoch, BATCHES) for epoch in (1, 2, 3)]  # one save per epoch end
    assert torch.load(tmp_path / "last.ckpt", weights_only=False)["global_step"] == 3 * BATCHES
    resumed, _ = _fit_with_last(tmp_path, tmp_path / "last.ckpt", limit_train_batches=BATCHES, max_epochs=4)
    assert resumed.global_step == 4 * BATCHES  # the epoch end resumes as one: the next epoch, whole


def test_last_every_n_epochs_is_saved_at_those_epoch_ends_between_validations(tmp_path: Path) -> None:
    # Every 2nd epoch of 4, validation at the 3rd only: the 2nd and the 4th end unvalidated and are saved here.
    _, saves = _fit_with_last(
        tmp_path, None, every_n_epochs=2, limit_train_batches=BATCHES, max_epochs=4, check_val_every_n_epoch=3
    )
    assert saves.saves == [(BATCHES * epoch, BATCHES) for epoch in (2, 4)]


class _StopAt(Callback):
    """Stops the fit at the end of optimizer step ``step`` (1-based), as the profiler window's exit_after does."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: pl.Trainer, *args: object) -> None:
        if trainer.global_step == self.step:
            trainer.should_stop = True


@pytest.mark.parametrize("stop", ["should_stop", "max_steps"])
def test_a_fit_stopped_inside_an_epoch_resumes_the_rest_of_it(tmp_path: Path, stop: str) -> None:
    def fit(ckpt: Path | None, *callbacks: Callback, **limits: int) -> tuple[pl.Trainer, _Saves]:
        return _fit_with_last(tmp_path, ckpt, *callbacks, limit_train_batches=BATCHES, **limits)

    if stop == "should_stop":
        first, saves = fit(None, _StopAt(2), max_epochs=1)
    else:
        first, saves = fit(None, max_epochs=1, max_steps=2)
    assert first.global_step == 2
    # One save, where the stop came: after batch 2 of epoch 0's 4 (Lightning alone: at the epoch's end, as if done).
    assert saves.saves == [(2, 2)]
    resumed, _ = fit(tmp_path / "last.ckpt", max_epochs=1)
    # The resumed run trains batches 3 and 4 of epoch 0 (Lightning alone: none, the epoch counted as done).
    assert resumed.global_step == BATCHES
    assert resumed.current_epoch == 1


class _ValidatedModel(BoringModel):
    """BoringModel that logs a validation score to monitor."""

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        self.log("val_score", self.step(batch), on_epoch=True)


class _StopWithoutValidation(_StopAt):
    """Stops at the end of step ``step`` and turns the validation at the stop off, as exit_after does."""

    def on_train_batch_end(self, trainer: pl.Trainer, *args: object) -> None:
        super().on_train_batch_end(trainer, *args)
        if trainer.should_stop:
            trainer.limit_val_batches = 0


@pytest.mark.parametrize(
    ("stop", "saved"),
    [("max_steps", [4]), ("exit_after", [4]), ("should_stop", [4, 6])],  # Lightning validates at a should_stop
)
def test_a_stop_inside_an_epoch_saves_a_best_checkpoint_only_after_a_validation_there(
    tmp_path: Path, stop: str, saved: list[int]
) -> None:
    # Epoch 0 is validated at step 4, and the fit stops at step 6: without a validation there, a monitored save would
    # name and rank step 6's weights by epoch 0's score.
    best = ResumableCheckpoint(dirpath=tmp_path, filename="best-{step}", monitor="val_score", save_top_k=-1)
    limits = {"max_steps": 6} if stop == "max_steps" else {}
    stopper = {"exit_after": [_StopWithoutValidation(6)], "should_stop": [_StopAt(6)]}.get(stop, [])
    trainer = pl.Trainer(accelerator="cpu", limit_train_batches=BATCHES, limit_val_batches=1, num_sanity_val_steps=0,
                         max_epochs=5, callbacks=[best, *stopper], logger=False, enable_progress_bar=False,
                         enable_model_summary=False, **limits)  # fmt: skip
    trainer.fit(_ValidatedModel())
    assert trainer.global_step == 6
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"best-step={step}.ckpt" for step in saved]


def test_a_stop_inside_an_accumulated_step_waits_for_its_end_and_saves_there(tmp_path: Path) -> None:
    # Batches of 2 micro-batches, 8 batches an epoch: a stop after batch 4 (the first half of step 3) is held until
    # batch 5 ends step 3, saved there (Lightning alone: stopped after batch 4 and saved nothing of the epoch).
    options = {"limit_train_batches": 8, "accumulate_grad_batches": 2, "max_epochs": 1}
    first, saves = _fit_with_last(tmp_path, None, _StopAtBatch(4), **options)
    assert first.global_step == 3 and saves.saves == [(3, 6)]
    resumed, _ = _fit_with_last(tmp_path, tmp_path / "last.ckpt", **options)
    assert resumed.global_step == 4 and resumed.current_epoch == 1  # batches 6 and 7: the epoch's last step


def test_a_stop_lightning_ignores_before_min_steps_saves_nothing(tmp_path: Path) -> None:
    # Lightning trains on through a stop until min_steps (here to the epoch's end): no save at the ignored stop, nor at
    # every step after it.
    trainer, saves = _fit_with_last(tmp_path, None, _StopAtBatch(0), limit_train_batches=8, max_epochs=1, min_steps=3)
    assert trainer.global_step == 8 and saves.saves == [(8, 8)]


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


class BatchCount(Callback):
    """Counts the training batches of the fits it is part of (a class attribute: train.py instantiates it)."""

    batches = 0

    def on_train_batch_end(self, *args: object) -> None:
        BatchCount.batches += 1


def test_a_bad_image_saves_the_step_it_stopped_at_and_the_fixed_run_goes_on_from_it(
    shapes_root, tmp_path, tiny_args, monkeypatch
):
    """A corrupt JPEG stopped a fit with nothing saved since the last epoch end (on ImageNet, up to an epoch of GPU
    time); now last.ckpt holds the step the fit reached, and the run resumed after the file is fixed trains exactly
    the rest of the epoch."""
    import shutil
    import sys

    import train
    from image_loading import BadImageError

    root = tmp_path / "data"
    shutil.copytree(shapes_root, root)
    victim = sorted((root / "train").rglob("*.JPEG"))[100]
    original = victim.read_bytes()
    victim.write_bytes(b"not a JPEG")
    monkeypatch.setattr(sys, "argv", [str(Path(train.__file__))])
    job = tiny_args(root, tmp_path, trainer__limit_val_batches=0, last_checkpoint__dirpath=tmp_path / "ckpt")
    steps_per_epoch = 240 // 16

    counting = ["--trainer.callbacks+", "test_resumable_checkpoint.BatchCount"]
    BatchCount.batches = 0
    saved_at = rf"bad image: saved {tmp_path / 'ckpt' / 'last.ckpt'} at step \d+; replace or remove the file"
    with pytest.raises(BadImageError, match=victim.name), pytest.warns(UserWarning, match=saved_at):
        train.main(["fit", *job, "--trainer.max_steps", str(steps_per_epoch), *counting])
    reached = BatchCount.batches
    assert 0 < reached < steps_per_epoch  # the shuffled order put the file inside the epoch (seed 0)
    saved = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=False, map_location="cpu")
    assert saved["global_step"] == reached
    victim.write_bytes(original)
    BatchCount.batches = 0
    cli = train.main(["fit", *job, "--trainer.max_steps", str(steps_per_epoch), *counting,
                      "--ckpt_path", str(tmp_path / "ckpt" / "last.ckpt")])  # fmt: skip
    assert cli.trainer.global_step == steps_per_epoch and BatchCount.batches == steps_per_epoch - reached


def _copy_with_a_bad_file_in_batch(shapes_root: Path, tmp_path: Path, batch: int, batch_size: int) -> tuple[Path, Path]:
    """A copy of the shapes dataset under ``tmp_path/data`` whose file 5 of training batch ``batch`` (epoch 0, the data
    seed's (0) order, one rank) is corrupt: (the copy, that file)."""
    import shutil

    from datamodule import TrainSampler
    from image_folder import VisibleImageFolder

    root = tmp_path / "data"
    shutil.copytree(shapes_root, root)
    files = [path for path, _ in VisibleImageFolder(str(root / "train")).samples]
    order = TrainSampler(files, 1, 0, seed=0, batch_size=batch_size)
    order.set_epoch(0)
    victim = Path(files[list(order)[batch_size * batch + 5]])
    victim.write_bytes(b"not a JPEG")
    return root, victim


@pytest.mark.parametrize(("bad_batch", "saved_step"), [(3, None), (4, 2)])
def test_a_bad_image_inside_an_accumulated_step_saves_nothing(
    shapes_root, tmp_path, tiny_args, monkeypatch, bad_batch, saved_step
):
    """Batches of 2 accumulated: a bad file in batch 3 stops the fit after batch 2, the first half of step 1, whose
    gradients a save would lose (a resume would redo the step from batch 3 alone); in batch 4 it stops at the end of
    step 1, which is saved as global step 2."""
    import sys

    import train
    from image_loading import BadImageError

    root, victim = _copy_with_a_bad_file_in_batch(shapes_root, tmp_path, bad_batch, batch_size=16)
    monkeypatch.setattr(sys, "argv", [str(Path(train.__file__))])
    job = tiny_args(root, tmp_path, trainer__limit_val_batches=0, last_checkpoint__dirpath=tmp_path / "ckpt",
                    trainer__accumulate_grad_batches=2, trainer__max_steps=7)  # fmt: skip
    with warnings.catch_warnings(record=True) as caught, pytest.raises(BadImageError, match=victim.name):
        warnings.simplefilter("always")
        train.main(["fit", *job])
    said = [str(w.message) for w in caught if str(w.message).startswith("bad image: saved")]
    if saved_step is None:
        assert not said and not (tmp_path / "ckpt" / "last.ckpt").exists()
    else:
        assert len(said) == 1 and f"at step {saved_step};" in said[0]
        saved = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=False, map_location="cpu")
        assert saved["global_step"] == saved_step


def test_a_bad_image_in_validation_saves_nothing(shapes_root, tmp_path, tiny_args, monkeypatch):
    """Lightning resumes a save taken in validation past that validation (at an epoch's end, as a finished epoch): the
    resumed run would never validate the epoch. The last save stands, as before."""
    import shutil
    import sys

    import train
    from image_loading import BadImageError

    root = tmp_path / "data"
    shutil.copytree(shapes_root, root)
    victim = sorted((root / "val").rglob("*.JPEG"))[0]
    victim.write_bytes(b"not a JPEG")
    monkeypatch.setattr(sys, "argv", [str(Path(train.__file__))])
    job = tiny_args(root, tmp_path, last_checkpoint__dirpath=tmp_path / "ckpt")
    with pytest.raises(BadImageError, match=victim.name):
        train.main(["fit", *job, "--trainer.max_epochs", "1"])
    assert not (tmp_path / "ckpt" / "last.ckpt").exists()


class SaveSteps(Callback):
    """The global step of every checkpoint the fits it is part of saved (a class attribute: train.py makes it)."""

    steps: list[int] = []

    def on_save_checkpoint(self, trainer: pl.Trainer, *args: object) -> None:
        SaveSteps.steps.append(trainer.global_step)


@pytest.mark.parametrize(("bad_batch", "every_n_train_steps", "saves"), [(0, None, []), (2, 2, [2])])
def test_a_bad_image_saves_nothing_where_there_is_nothing_new_to_resume(
    shapes_root, tmp_path, tiny_args, monkeypatch, bad_batch, every_n_train_steps, saves
):
    """A bad file in the first batch stops the fit at step 0, with nothing trained: no step-0 last.ckpt, there is
    nothing to resume from. One in batch 2, right after last_checkpoint saved step 2 (every 2 steps): that file is
    the state the fit stopped at, and is not written a second time."""
    import sys

    import train
    from image_loading import BadImageError

    root, victim = _copy_with_a_bad_file_in_batch(shapes_root, tmp_path, bad_batch, batch_size=8)
    monkeypatch.setattr(sys, "argv", [str(Path(train.__file__))])
    job = tiny_args(root, tmp_path, data__batch_size=8, trainer__limit_val_batches=0,
                    last_checkpoint__dirpath=tmp_path / "ckpt",
                    last_checkpoint__every_n_train_steps=every_n_train_steps, trainer__max_steps=7)  # fmt: skip
    SaveSteps.steps = []
    with warnings.catch_warnings(record=True) as caught, pytest.raises(BadImageError, match=victim.name):
        warnings.simplefilter("always")
        train.main(["fit", *job, "--trainer.callbacks+", "test_resumable_checkpoint.SaveSteps"])
    assert not [str(w.message) for w in caught if str(w.message).startswith("bad image: saved")]
    assert SaveSteps.steps == saves
    last = tmp_path / "ckpt" / "last.ckpt"
    if saves:
        assert torch.load(last, weights_only=False, map_location="cpu")["global_step"] == saves[-1]
    else:
        assert not last.exists()


class _RaiseAtBatch(Callback):
    """Raises at the start of batch ``batch_idx``: a fit that ends inside an accumulated step."""

    def __init__(self, batch_idx: int) -> None:
        self.batch_idx = batch_idx

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: object, batch: object, idx: int) -> None:
        if idx == self.batch_idx:
            raise RuntimeError("the fit ends here")


def test_a_stop_held_by_a_fit_that_ended_does_not_stop_the_next_fit(tmp_path: Path) -> None:
    # A stop asked for inside an accumulated step is held until the step's end; the fit that held it ended before
    # (an error in the step's second half). The same callback in the next fit (a notebook's second trainer.fit) must
    # not take that stop for its own first step's.
    last = ResumableCheckpoint(dirpath=tmp_path, filename="last", monitor=None, enable_version_counter=False)
    options = {"accelerator": "cpu", "limit_train_batches": 8, "limit_val_batches": 0, "accumulate_grad_batches": 2,
               "max_epochs": 1, "logger": False, "enable_progress_bar": False,
               "enable_model_summary": False}  # fmt: skip
    first = pl.Trainer(callbacks=[last, _StopAtBatch(4), _RaiseAtBatch(5)], **options)
    with pytest.raises(RuntimeError, match="the fit ends here"):
        first.fit(BoringModel())
    assert first.global_step == 2 and not first.should_stop  # the stop held, waiting for step 3's end
    second = pl.Trainer(callbacks=[last], **options)
    second.fit(BoringModel())
    assert second.global_step == 4  # the whole epoch, not one step


class _ResumesAtTheNextEpoch(BoringModel):
    """Gives a restored checkpoint to ``resume_at_the_next_epoch`` as ImageNetClassifier does, and records where the
    fit goes: epoch starts and ends, each training batch."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple] = []

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        resume_at_the_next_epoch(checkpoint)

    def on_train_epoch_start(self) -> None:
        self.seen.append(("start", self.current_epoch))

    def on_train_batch_start(self, batch: object, batch_idx: int) -> None:
        self.seen.append((self.current_epoch, batch_idx, self.global_step))

    def on_train_epoch_end(self) -> None:
        self.seen.append(("end", self.current_epoch))


def _fit_at_epoch_ends(
    folder: Path, model: BoringModel, ckpt: Path | None = None, validation: int = 1, **limits: int
) -> tuple[pl.Trainer, dict]:
    """A fit saving ``last.ckpt`` at epoch ends (train.py's last_checkpoint); the loops' state it saved last."""
    last = ResumableCheckpoint(dirpath=folder, filename="last", monitor=None, enable_version_counter=False)
    trainer = pl.Trainer(accelerator="cpu", limit_train_batches=BATCHES, limit_val_batches=validation,
                         num_sanity_val_steps=0, callbacks=[last], logger=False, enable_progress_bar=False,
                         enable_model_summary=False, **limits)  # fmt: skip
    trainer.fit(model, ckpt_path=ckpt)
    return trainer, torch.load(folder / "last.ckpt", weights_only=False)["loops"]


@pytest.mark.parametrize("validation", [0, 1])
def test_an_epoch_end_checkpoint_resumed_with_max_steps_starts_the_next_epoch(tmp_path: Path, validation: int) -> None:
    """Lightning alone ran epoch 0's loop and end again: without validation one more batch in it (batch_idx 4), with
    validation none; then counted epoch 0 twice, and max_epochs 3 stopped the fit an epoch early (item 7)."""
    limits = {"max_epochs": 3, "max_steps": 3 * BATCHES}
    whole = _ResumesAtTheNextEpoch()
    _, whole_loops = _fit_at_epoch_ends(tmp_path / "whole", whole, validation=validation, **limits)
    _fit_at_epoch_ends(tmp_path, _ResumesAtTheNextEpoch(), validation=validation, max_steps=BATCHES)
    checkpoint = torch.load(tmp_path / "last.ckpt", weights_only=False)
    assert checkpoint["loops"]["fit_loop"]["epoch_progress"]["current"]["processed"] == 1  # saved at epoch 0's end
    resumed = _ResumesAtTheNextEpoch()
    trainer, loops = _fit_at_epoch_ends(tmp_path, resumed, tmp_path / "last.ckpt", validation=validation, **limits)
    assert resumed.seen == whole.seen[whole.seen.index(("start", 1)) :]  # epochs 1 and 2, whole, from their start
    assert trainer.global_step == 3 * BATCHES
    # It saved the uninterrupted run's loop state at its end, but for the logger's step count: Lightning's epoch loop,
    # restarting under max_steps, passes its validation check once before the first batch and counts a step there
    # (ImageNetClassifier sets the count to global_step at every batch start).
    for state in (loops, whole_loops):
        state["fit_loop"]["epoch_loop.state_dict"].pop("_batches_that_stepped")
    assert loops == whole_loops


def test_a_checkpoint_inside_an_epoch_or_before_its_end_is_left_as_it_is(tmp_path: Path) -> None:
    # A fit stopped inside epoch 0 (max_steps 2 of 4 batches), saved at the epoch's end by Lightning's own callback:
    # the resumed run trains the rest of the epoch.
    at_the_stop = ModelCheckpoint(dirpath=tmp_path, filename="stopped", monitor=None)
    pl.Trainer(accelerator="cpu", limit_train_batches=BATCHES, limit_val_batches=0, max_steps=2,
               callbacks=[at_the_stop], logger=False, enable_progress_bar=False,
               enable_model_summary=False).fit(BoringModel())  # fmt: skip
    stopped = torch.load(tmp_path / "stopped.ckpt", weights_only=False)
    assert stopped["loops"]["fit_loop"]["epoch_progress"]["current"]["processed"] == 1  # at the epoch's end
    # Saved at the end of a validation at the epoch's last batch: the epoch's end has not run, the resumed run runs it.
    saves = ModelCheckpoint(dirpath=tmp_path, filename="{step}", save_top_k=-1)
    pl.Trainer(accelerator="cpu", limit_train_batches=BATCHES, limit_val_batches=1, val_check_interval=BATCHES,
               max_epochs=1, num_sanity_val_steps=0, callbacks=[saves], logger=False, enable_progress_bar=False,
               enable_model_summary=False).fit(BoringModel())  # fmt: skip
    validated = torch.load(tmp_path / f"step={BATCHES}.ckpt", weights_only=False)
    assert validated["loops"]["fit_loop"]["epoch_loop.batch_progress"]["is_last_batch"]
    for checkpoint in (stopped, validated, {"state_dict": {}}):
        before = repr(checkpoint)
        assert not resume_at_the_next_epoch(checkpoint)
        assert repr(checkpoint) == before
