"""PreemptionHandler and the DDP timeout: signals stop every rank at one step with a checkpoint; dead ranks end the job.

The in-process tests use a tiny module. The subprocess tests run tests/reliability_scripts/train_driver.py (the
application's model and data module on CPU) because Lightning's DDP launcher re-runs the script of the process.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
from core_probes import QUIET
from pytorch_lightning.callbacks import Callback, ModelCheckpoint
from torch.utils.data import DataLoader, Dataset, TensorDataset

import callbacks.ranges
import shapes_dataset
from callbacks.preemption import PreemptedExit, PreemptionHandler, WorkerSignalShield, _no_sigterm_broadcast
from callbacks.resumable_checkpoint import ResumableCheckpoint
from checkpoint_io import AtomicCheckpointIO
from datamodule import ImageNetDataModule
from imagenet_module import ImageNetClassifier

DRIVER = Path(__file__).resolve().parent / "reliability_scripts" / "train_driver.py"
REAPER = Path(__file__).resolve().parent / "reliability_scripts" / "reaper.py"


# --- in-process: a tiny module ------------------------------------------------------------------------
class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 2)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(self.layer(batch[0]), batch[1])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self) -> DataLoader:
        generator = torch.Generator().manual_seed(0)
        data = TensorDataset(torch.randn(64, 4, generator=generator), torch.randint(0, 2, (64,), generator=generator))
        return DataLoader(data, batch_size=2)


class SendSignal(Callback):
    """Sends ``signum`` to this process at the end of training batch ``at_batch`` (0-based, across epochs)."""

    def __init__(self, signum: int, at_batch: int) -> None:
        self.signum = signum
        self.at_batch = at_batch
        self.batches = 0
        self.sent_at_step: int | None = None
        self.shadowed_during_fit: bool | None = None

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if self.batches == self.at_batch:
            self.sent_at_step = trainer.global_step
            self.shadowed_during_fit = (
                trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor is _no_sigterm_broadcast
                and "_sigterm_notifier_fn" in vars(trainer._signal_connector)
            )
            os.kill(os.getpid(), self.signum)
        self.batches += 1


def tiny_trainer(tmp_path: Path, callbacks: list[Callback], **kwargs: Any) -> pl.Trainer:
    options: dict[str, Any] = dict(
        accelerator="cpu",
        max_epochs=3,
        **QUIET,
        default_root_dir=tmp_path,
        plugins=[AtomicCheckpointIO()],
    )
    options.update(kwargs)
    return pl.Trainer(callbacks=callbacks, **options)


def load(path: Path) -> dict[str, Any]:
    return torch.load(path, map_location="cpu", weights_only=False)


def test_sigint_saves_at_the_next_step_and_exits_130(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ranges: list[tuple[str, str | None, bool]] = []  # (push/pop, name, the checkpoint file exists)
    path = tmp_path / "ckpts" / "last.ckpt"  # the ModelCheckpoint's folder
    monkeypatch.setattr(
        callbacks.ranges,
        "nvtx",
        SimpleNamespace(
            push_range=lambda name: ranges.append(("push", name, path.exists())),
            pop_range=lambda: ranges.append(("pop", None, path.exists())),
        ),
    )
    original = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    handler = PreemptionHandler()
    sender = SendSignal(signal.SIGINT, at_batch=3)
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "ckpts", save_last=True)
    trainer = tiny_trainer(tmp_path, [handler, sender, checkpoints], enable_checkpointing=True)
    with pytest.raises(PreemptedExit) as stopped:
        trainer.fit(Tiny())
    assert stopped.value.code == 128 + signal.SIGINT == handler.exit_code
    # Sent after the handler's check of step 4, so the handler acts at the next boundary: step 5.
    assert sender.sent_at_step == 4 and handler.stopped_at_step == 5
    # The save ran inside one `checkpoint` range (Lightning's own ModelCheckpoint here makes none).
    assert ranges == [("push", "checkpoint", False), ("pop", None, True)]
    assert handler.checkpoint_path == str(path)
    saved = load(path)
    assert saved["global_step"] == 5
    model_checkpoint_state = next(iter(saved["callbacks"].values()))
    assert model_checkpoint_state["last_model_path"] == str(path)
    # Lightning's SIGTERM machinery was off during fit, and everything is back as it was afterwards.
    assert sender.shadowed_during_fit is True
    assert "_broadcast_sigterm_tensor" not in vars(trainer.fit_loop.epoch_loop)
    assert "_sigterm_notifier_fn" not in vars(trainer._signal_connector)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == original


def test_the_save_is_recorded_as_the_last_checkpoint_callbacks_own_file(tmp_path: Path) -> None:
    """train.py's last_checkpoint (filename last, no monitor) writes the file the handler writes: the saved state names
    it as that callback's file, so the resumed run's callback replaces it rather than keeping a stale path."""
    last = ResumableCheckpoint(dirpath=tmp_path / "ckpts", filename="last", monitor=None, enable_version_counter=False)
    trainer = tiny_trainer(
        tmp_path, [PreemptionHandler(), SendSignal(signal.SIGTERM, at_batch=2), last], enable_checkpointing=True
    )
    with pytest.raises(PreemptedExit):
        trainer.fit(Tiny())
    path = tmp_path / "ckpts" / "last.ckpt"
    state = next(v for k, v in load(path)["callbacks"].items() if k.startswith("ResumableCheckpoint"))
    assert state["best_model_path"] == str(path) and last.best_model_path == str(path)


@pytest.mark.parametrize("latest", ["last_checkpoint", "save_last"])
def test_the_save_goes_to_the_folder_of_the_callback_that_writes_last_ckpt_not_the_first_ones(
    tmp_path: Path, latest: str
) -> None:
    """As train.py with --checkpoint.dirpath and --last_checkpoint.dirpath apart: the best checkpoint callback comes
    first (trainer.checkpoint_callback), but a requeued job's --ckpt_path last looks where last.ckpt is written, so
    the preemption checkpoint goes there (also beside a save_last callback's last.ckpt)."""
    best = ResumableCheckpoint(dirpath=tmp_path / "best", monitor="val_loss", filename="best-{epoch}")
    if latest == "last_checkpoint":
        last = ResumableCheckpoint(
            dirpath=tmp_path / "latest", filename="last", monitor=None, enable_version_counter=False
        )
    else:
        last = ModelCheckpoint(dirpath=tmp_path / "latest", filename="step{step}", monitor=None, save_last=True)
    handler = PreemptionHandler()
    trainer = tiny_trainer(
        tmp_path, [handler, SendSignal(signal.SIGTERM, at_batch=2), best, last], enable_checkpointing=True
    )
    assert trainer.checkpoint_callback is best
    with pytest.raises(PreemptedExit):
        trainer.fit(TinyWithValidation())
    path = tmp_path / "latest" / "last.ckpt"
    # Sent after the handler's check of step 3: saved at step 4.
    assert handler.checkpoint_path == str(path) and load(path)["global_step"] == handler.stopped_at_step == 4
    assert not (tmp_path / "best").exists() and not (tmp_path / "checkpoints").exists()
    # Recorded as that callback's own file, so the resumed run's callback replaces it.
    assert (last.best_model_path if latest == "last_checkpoint" else last.last_model_path) == str(path)


def test_check_every_n_steps_and_explicit_dirpath(tmp_path: Path) -> None:
    handler = PreemptionHandler(check_every_n_steps=4, dirpath=str(tmp_path / "preempted"), filename="stop.ckpt")
    trainer = tiny_trainer(tmp_path, [handler, SendSignal(signal.SIGTERM, at_batch=4)])
    with pytest.raises(PreemptedExit) as stopped:
        trainer.fit(Tiny())
    assert stopped.value.code == 128 + signal.SIGTERM
    assert handler.stopped_at_step == 8  # the signal came at step 5; the next check is at step 8
    assert load(tmp_path / "preempted" / "stop.ckpt")["global_step"] == 8


def test_stops_only_on_optimizer_step_boundaries(tmp_path: Path) -> None:
    handler = PreemptionHandler()
    # Sent at the end of batch 3, the first of the second accumulation window of three: the next batch end (4) is
    # inside the window, the next optimizer step is at the end of batch 5.
    trainer = tiny_trainer(tmp_path, [handler, SendSignal(signal.SIGTERM, at_batch=3)], accumulate_grad_batches=3)
    with pytest.raises(PreemptedExit):
        trainer.fit(Tiny())
    saved = load(tmp_path / "checkpoints" / "last.ckpt")  # no ModelCheckpoint: <default_root_dir>/checkpoints
    assert saved["global_step"] == handler.stopped_at_step == 2
    processed = saved["loops"]["fit_loop"]["epoch_loop.batch_progress"]["total"]["processed"]
    assert processed == 6  # the end of the second window, not the batch the signal came in


class TinyWithValidation(Tiny):
    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        self.log("val_loss", torch.nn.functional.cross_entropy(self.layer(batch[0]), batch[1]))

    def val_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(torch.randn(4, 4), torch.randint(0, 2, (4,))), batch_size=2)


class Validations(Callback):
    def __init__(self) -> None:
        self.at_steps: list[int] = []

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            self.at_steps.append(trainer.global_step)


@pytest.mark.parametrize("epochs", [2, 1])
def test_a_stop_on_an_epochs_last_step_waits_for_its_validation(tmp_path: Path, epochs: int) -> None:
    # 32 steps an epoch; the signal is seen at step 32, the epoch's last. Lightning would resume a checkpoint there as
    # a finished epoch, without the epoch's validation and best checkpoint: they run before the stop, at step 33.
    handler, validations, steps = PreemptionHandler(), Validations(), TrainingSteps()
    best = ModelCheckpoint(dirpath=tmp_path / "ckpts", monitor="val_loss", filename="best-{epoch}")
    last = ModelCheckpoint(dirpath=tmp_path / "ckpts", filename="last", monitor=None, enable_version_counter=False)
    callbacks = [handler, SendSignal(signal.SIGTERM, at_batch=30), validations, best, last, steps]
    trainer = tiny_trainer(tmp_path, callbacks, enable_checkpointing=True, max_epochs=epochs)
    if epochs == 1:
        trainer.fit(TinyWithValidation())  # the epoch was the run's last: it ends as usual, with status 0
        assert handler.exit_code is None and validations.at_steps == [32]
        assert load(tmp_path / "ckpts" / "last.ckpt")["global_step"] == 32
        return
    with pytest.raises(PreemptedExit):
        trainer.fit(TinyWithValidation())
    assert validations.at_steps == [32] and (tmp_path / "ckpts" / "best-epoch=0.ckpt").exists()
    assert handler.stopped_at_step == 33 and handler.checkpoint_path == str(tmp_path / "ckpts" / "last.ckpt")
    # The handler's save at 32, the epoch end's (best and last), the stop's at 33: once each (33 was saved twice).
    assert steps.saves == [32, 32, 32, 33]
    saved = load(tmp_path / "ckpts" / "last.ckpt")
    assert (saved["global_step"], saved["epoch"]) == (33, 1)
    resumed = Validations()  # the rest of epoch 1, validated at its end
    trainer = tiny_trainer(tmp_path, [PreemptionHandler(), resumed], max_epochs=2, num_sanity_val_steps=0)
    trainer.fit(TinyWithValidation(), ckpt_path=tmp_path / "ckpts" / "last.ckpt")
    assert trainer.global_step == 64 and resumed.at_steps == [64]


class LogsAtItsBatchEnd(TinyWithValidation):
    """Logs in its own ``on_train_batch_end`` on log steps, as ImageNetClassifier logs its intervals."""

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.global_step % self.trainer.log_every_n_steps == 0:
            self.log("interval_loss", outputs["loss"], on_step=True, on_epoch=False)


class TrainingSteps(Callback):
    """Counts optimizer steps, training batches started and checkpoint saves (by the step they were taken at)."""

    def __init__(self) -> None:
        self.count = 0
        self.batches_started = 0
        self.saves: list[int] = []

    def on_before_optimizer_step(self, *args: Any) -> None:
        self.count += 1

    def on_train_batch_start(self, *args: Any) -> None:
        self.batches_started += 1

    def on_save_checkpoint(self, trainer: pl.Trainer, *args: Any) -> None:
        self.saves.append(trainer.global_step)


@pytest.mark.parametrize("max_steps", [-1, 5])
def test_the_stops_step_ends_as_usual_then_nothing_runs(tmp_path: Path, max_steps: int) -> None:
    # The signal is seen at step 5: a log step (the module logs its row after the callbacks' hooks) and a step with a
    # validation due (val_check_interval 5), or with max_steps 5 the run's last step, whose epoch would then end.
    from pytorch_lightning.loggers import CSVLogger

    handler, validations, steps = PreemptionHandler(), Validations(), TrainingSteps()
    # As train.py's last_checkpoint: it saves where max_steps ends the fit, and every 5 steps here.
    last = ResumableCheckpoint(dirpath=tmp_path / "ckpts", filename="last", monitor=None, every_n_train_steps=5)
    trainer = tiny_trainer(
        tmp_path,
        [handler, SendSignal(signal.SIGTERM, at_batch=3), validations, steps, last],
        enable_checkpointing=True,
        logger=CSVLogger(tmp_path, name="log", version=0),
        log_every_n_steps=5,
        val_check_interval=5,
        num_sanity_val_steps=0,
        max_steps=max_steps,
    )
    with pytest.raises(PreemptedExit):
        trainer.fit(LogsAtItsBatchEnd())
    assert handler.stopped_at_step == 5 and steps.count == 5 and trainer.global_step == 5
    assert validations.at_steps == []  # the validation due at step 5 did not run
    assert steps.batches_started == 5  # and no next batch started (a profiling window would have opened there)
    assert steps.saves == [5]  # the handler's save only: last_checkpoint's at this step would be a second copy
    assert handler.checkpoint_path == str(tmp_path / "ckpts" / "last.ckpt")
    rows = (tmp_path / "log" / "version_0" / "metrics.csv").read_text().splitlines()
    header = rows[0].split(",")
    logged = [dict(zip(header, row.split(","), strict=True)) for row in rows[1:]]
    # Lightning's step column counts the steps before this one: the row of step 5, written though the run stopped.
    assert [row["step"] for row in logged if row.get("interval_loss")] == ["4"]


class SignalBeforeTheFirstBatchEnds(Callback):
    """Sends ``signum`` to this process at the start of the fit's first training batch (a scheduler's signal that
    came during start-up or the first micro-batch)."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.sent = False

    def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
        if not self.sent:
            self.sent = True
            os.kill(os.getpid(), self.signum)


def test_a_signal_before_the_first_optimizer_step_stops_one_process_at_once_unsaved(tmp_path: Path) -> None:
    # A signal inside the first window of three micro-batches: no optimizer step has run, so nothing is saved (no
    # checkpoint inside an accumulated step either) and the run stops at the next micro-batch's start.
    original = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    handler = PreemptionHandler()
    trainer = tiny_trainer(
        tmp_path, [handler, SignalBeforeTheFirstBatchEnds(signal.SIGTERM)], accumulate_grad_batches=3
    )
    with pytest.raises(PreemptedExit) as stopped:
        trainer.fit(Tiny())
    assert stopped.value.code == 128 + signal.SIGTERM == handler.exit_code
    assert trainer.global_step == 0 and handler.stopped_at_step is None
    assert trainer.fit_loop.epoch_loop.batch_progress.total.completed == 1
    assert not (tmp_path / "checkpoints").exists()
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == original


class SignalDuringTheSanityCheck(Callback):
    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.sent = False
        self.sanity_batches = self.trained_batches = 0

    def on_validation_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
        self.sanity_batches += trainer.sanity_checking
        if trainer.sanity_checking and not self.sent:  # the sanity check's first batch
            self.sent = True
            os.kill(os.getpid(), self.signum)

    def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
        self.trained_batches += 1


def test_ctrl_c_during_the_sanity_check_stops_before_any_training(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    handler = PreemptionHandler()
    sender = SignalDuringTheSanityCheck(signal.SIGINT)
    trainer = tiny_trainer(tmp_path, [handler, sender], num_sanity_val_steps=2, enable_checkpointing=True)
    with pytest.raises(PreemptedExit) as stopped:
        trainer.fit(TinyWithValidation())
    assert stopped.value.code == 130
    # The handler (listed first) stopped the run at the sanity check's second batch, before that batch ran.
    assert sender.sanity_batches == 1 and sender.trained_batches == 0 and trainer.global_step == 0
    assert not list(tmp_path.rglob("*.ckpt"))
    said = capsys.readouterr().err
    assert "received SIGINT before the first training step: nothing trained in this run, nothing saved" in said


def test_run_without_signal_finishes_normally_and_restores_everything(tmp_path: Path) -> None:
    original = signal.getsignal(signal.SIGTERM)
    handler = PreemptionHandler()
    trainer = tiny_trainer(tmp_path, [handler], max_steps=3)
    trainer.fit(Tiny())
    assert handler.exit_code is None and trainer.global_step == 3
    assert not (tmp_path / "checkpoints").exists()
    assert signal.getsignal(signal.SIGTERM) == original
    assert "_broadcast_sigterm_tensor" not in vars(trainer.fit_loop.epoch_loop)


def test_a_handler_reused_for_another_fit_forgets_the_last_fits_time_limit(tmp_path: Path) -> None:
    # Under DDP a first fit that max_time stopped left "time is up" set, and the second fit (no max_time) stopped after
    # two steps on it.
    handler = PreemptionHandler()
    handler._timer, handler._time_is_up = object(), True  # as a first fit's max_time stop leaves them
    trainer = tiny_trainer(tmp_path, [handler], max_steps=3)
    trainer.fit(Tiny())
    assert trainer.global_step == 3 and handler._timer is None and handler._time_is_up is False


def test_signal_handler_repeats() -> None:
    handler = PreemptionHandler()
    handler._on_signal(signal.SIGTERM, None)
    handler._on_signal(signal.SIGTERM, None)  # a repeated SIGTERM: ignored, the stop is under way
    assert handler._signum == signal.SIGTERM
    with pytest.raises(KeyboardInterrupt):
        handler._on_signal(signal.SIGINT, None)  # Ctrl+C while stopping: abort now


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"signals": ["SIGTERM", "SIGFOO"]}, "'SIGFOO' is not a signal that can be caught"),
        ({"signals": ["SIGKILL"]}, "'SIGKILL' is not a signal that can be caught"),
        ({"signals": []}, "must name at least one signal"),
        ({"check_every_n_steps": 0}, "check_every_n_steps must be >= 1"),
        ({"filename": "a/last.ckpt"}, "plain file name"),
        ({"child_wait_s": -1}, "child_wait_s must be a number of seconds >= 0"),
        ({"child_wait_s": float("nan")}, "child_wait_s must be a number of seconds >= 0, got nan"),
        # No limit: rank 0 of a stopped job would wait for a hung child rank until the scheduler's SIGKILL.
        ({"child_wait_s": float("inf")}, "child_wait_s must be a number of seconds >= 0, got inf"),
    ],
)
def test_arguments_are_validated(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PreemptionHandler(**kwargs)


@pytest.mark.parametrize("value", [".inf", "1e999"])
def test_an_endless_child_wait_is_refused_on_the_command_line(
    value: str, shapes_root: Path, tmp_path: Path, tiny_args, refused
) -> None:
    # YAML's infinity, and a number too large for a float: both parse as inf.
    # (One step and no validation: accepted, the run would be short.)
    args = tiny_args(shapes_root, tmp_path / "runs", trainer__max_steps=1, trainer__limit_val_batches=0)
    said = refused(["fit", *args, "--preemption.child_wait_s", value])
    assert said == "error: preemption.child_wait_s must be a number of seconds >= 0, got inf"
    assert not (tmp_path / "runs").exists()


def test_ddp_timeout_is_configurable_from_the_cli(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import train

    monkeypatch.setattr(sys, "argv", ["train.py"])  # pytest's own arguments are no CLI arguments of train.py

    args = [
        "--trainer.strategy",
        "pytorch_lightning.strategies.DDPStrategy",
        "--trainer.strategy.timeout",
        "0:00:45",
        "--print_config",
    ]
    with pytest.raises(SystemExit) as done:
        train.main(args)
    assert done.value.code in (0, None)
    config = capsys.readouterr().out
    assert "class_path: pytorch_lightning.strategies.DDPStrategy" in config
    assert "timeout: 0:00:45" in config


# --- data loader workers and stop signals ------------------------------------------------------------
class IndexAndPid(Dataset):
    """Sample ``i`` is ``[i, pid of the process that loaded it]``, a little slowly, so the workers stay busy."""

    def __len__(self) -> int:
        return 40

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(0.01)
        return torch.tensor([index, os.getpid()])


def send_from_another_process(pid: int, signum: int) -> None:
    # Not from this process: a shielded worker obeys SIGTERM from the main process, its parent, and only from it.
    subprocess.run([sys.executable, "-c", f"import os; os.kill({pid}, {int(signum)})"], check=True)


def touch(folder: Path, worker_id: int) -> None:
    (folder / f"worker{worker_id}").touch()


@pytest.mark.parametrize("shielded", [True, False])
def test_worker_signal_shield(shielded: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Shutting down after a dead worker joins each worker for this long before terminating it (5 s by default).
    monkeypatch.setattr(torch.utils.data._utils, "MP_STATUS_CHECK_INTERVAL", 0.5)
    init = WorkerSignalShield(functools.partial(touch, tmp_path)) if shielded else None
    loader = DataLoader(IndexAndPid(), batch_size=2, num_workers=2, persistent_workers=True, worker_init_fn=init)
    seen: list[int] = []
    pids: set[int] = set()

    def run(loader: DataLoader) -> None:
        for k, batch in enumerate(loader):
            seen.extend(batch[:, 0].tolist())
            pids.update(batch[:, 1].tolist())
            if k == 2:  # batches 0, 1, 2 came from workers 0, 1, 0: Ctrl+C, or a scheduler signalling every process
                assert len(pids) == 2
                for pid in pids:
                    send_from_another_process(pid, signal.SIGTERM)
                    send_from_another_process(pid, signal.SIGINT)

    if not shielded:
        with pytest.raises(RuntimeError, match="DataLoader worker"):
            run(loader)
        return
    run(loader)
    assert sorted(seen) == list(range(40))  # the workers carried on
    assert sorted(path.name for path in tmp_path.iterdir()) == ["worker0", "worker1"]  # the inner init ran
    del loader  # torch's own shutdown of the workers still works
    gc.collect()
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(pid) for pid in pids)


def _shielded_wait(shield: WorkerSignalShield) -> None:
    shield(0)
    time.sleep(60)


def test_shielded_process_obeys_sigterm_from_the_main_process_only() -> None:
    # At exit the main process terminates its daemonic workers with SIGTERM: that one must still work.
    # The shield is made here, in the main process, as the data module makes it: it remembers this process.
    process = multiprocessing.get_context("fork").Process(
        target=_shielded_wait, args=(WorkerSignalShield(),), daemon=True
    )
    process.start()
    time.sleep(0.3)  # the shield is up
    send_from_another_process(process.pid, signal.SIGTERM)
    send_from_another_process(process.pid, signal.SIGINT)
    process.join(0.5)
    assert process.is_alive()
    process.terminate()  # from this process, its parent
    process.join(10)
    assert process.exitcode == -signal.SIGTERM


# --- subprocess runs of the application's model -------------------------------------------------------
@pytest.fixture(scope="module")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """10 classes, 4 train and 2 val 32-pixel images each: 10 steps per epoch at batch 4 on one process."""
    return shapes_dataset.generate(
        tmp_path_factory.mktemp("preemption") / "data", train_per_class=4, val_per_class=2, image_size=32
    )


class Run:
    """A driver process in its own session (so that the test can always kill every rank it started).

    ``reaped``: run it under reliability_scripts/reaper.py, which learns the exit status of every rank, also of a
    rank whose parent (rank 0) died, into ``<out>/exits.json``; the process is then the reaper, which ends when every
    rank has.
    """

    def __init__(self, data_root: Path, out: Path, *args: str, reaped: bool = False) -> None:
        self.out = out
        out.mkdir(parents=True)
        self.log_path = out.parent / f"{out.name}.log"
        self.log = open(self.log_path, "w")  # noqa: SIM115 (closed in stop())
        reaper = [sys.executable, str(REAPER), str(out / "exits.json")] if reaped else []
        self.process = subprocess.Popen(
            [*reaper, sys.executable, str(DRIVER), "--root", str(data_root), "--out", str(out), *args],
            cwd=out,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def output(self) -> str:
        self.log.flush()
        return self.log_path.read_text()

    def wait_for(self, *names: str, timeout: float = 90) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while not all((self.out / name).exists() for name in names):
            if self.process.poll() is not None:
                pytest.fail(
                    f"the run ended (status {self.process.returncode}) before {names}:\n{self.output()[-4000:]}"
                )
            if time.monotonic() > deadline:
                pytest.fail(f"no {names} after {timeout} s:\n{self.output()[-4000:]}")
            time.sleep(0.05)
        return [json.loads((self.out / name).read_text()) for name in names]

    def wait(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the run did not end within {timeout} s (hangs):\n{self.output()[-4000:]}")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)
        self.log.close()


@pytest.fixture
def runs(data_root: Path, tmp_path: Path):
    started: list[Run] = []

    def start(name: str, *args: str, reaped: bool = False) -> Run:
        run = Run(data_root, tmp_path / name, *args, reaped=reaped)
        started.append(run)
        return run

    yield start
    for run in started:
        run.stop()
        # Ranks that Lightning launched are in the run's session: none may outlive the test, whatever it found.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.process.pid, signal.SIGKILL)


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, does not count)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def check_boundary_checkpoint(path: Path, step: int) -> None:
    """``path`` holds step ``step``, saved after its optimizer step and before the next batch (a step boundary)."""
    saved = load(path)
    assert saved["global_step"] == step
    loops = saved["loops"]["fit_loop"]
    batches = loops["epoch_loop.batch_progress"]["total"]
    # What Lightning records for a save in on_train_batch_end, which it resumes from: the batch is processed, and
    # marked completed right after the hook.
    assert batches["ready"] == batches["started"] == batches["processed"] == batches["completed"] + 1
    optimizer_steps = loops["epoch_loop.automatic_optimization.optim_progress"]["optimizer"]["step"]["total"]
    assert optimizer_steps["completed"] == step
    assert list(path.parent.glob(".*.tmp")) == []


@pytest.mark.slow
def test_sigterm_single_process_saves_exits_143_and_resumes(runs, data_root: Path, tmp_path: Path) -> None:
    run = runs("single")
    (ready,) = run.wait_for("ready_rank0.json")
    os.kill(run.process.pid, signal.SIGTERM)
    assert run.wait(60) == 128 + signal.SIGTERM, run.output()[-4000:]
    (stop,) = run.wait_for("stop_rank0.json", timeout=1)
    assert stop["exception"] == "PreemptedExit" and stop["step"] >= ready["step"]
    assert "[rank: 0] received SIGTERM" in run.output()
    path = run.out / "checkpoints" / "last.ckpt"
    check_boundary_checkpoint(path, stop["step"])
    # It loads: resume the run from it, in this process, for two more steps.
    data = ImageNetDataModule(
        root=str(data_root), batch_size=4, workers=0, crop_size=32, min_crop_scale=0.35, val_resize_size=36,
        val_crop_size=32,
    )  # fmt: skip
    model = ImageNetClassifier(arch="resnet18", num_classes=10, lr=0.1, warmup_epochs=0, batch_size=4)
    trainer = tiny_trainer(tmp_path, [PreemptionHandler()], max_steps=stop["step"] + 2, limit_val_batches=0)
    trainer.fit(model, data, ckpt_path=str(path))
    assert trainer.global_step == stop["step"] + 2


@pytest.mark.slow
def test_sigterm_to_one_ddp_rank_stops_both_at_the_same_step(runs) -> None:
    run = runs("ddp", "--devices", "2")
    ready = run.wait_for("ready_rank0.json", "ready_rank1.json")
    os.kill(ready[1]["pid"], signal.SIGTERM)  # only rank 1 gets the signal
    assert run.wait(90) == 128 + signal.SIGTERM, run.output()[-4000:]
    stops = run.wait_for("stop_rank0.json", "stop_rank1.json", timeout=1)
    assert [stop["exception"] for stop in stops] == ["PreemptedExit", "PreemptedExit"]
    assert stops[0]["step"] == stops[1]["step"] >= ready[1]["step"]
    # Rank 1 was started by Lightning's launcher, which would kill the job on a non-zero child status.
    assert [stop["code"] for stop in stops] == [128 + signal.SIGTERM, 0]
    assert not alive(ready[1]["pid"])  # rank 0 exited after its child
    output = run.output()
    assert "[rank: 1] received SIGTERM" in output and "[rank: 0] received" not in output
    check_boundary_checkpoint(run.out / "checkpoints" / "last.ckpt", stops[0]["step"])


@pytest.mark.slow
def test_sigterm_to_one_ddp_rank_before_the_first_step_stops_both_before_it_unsaved(runs) -> None:
    # Rank 1 gets SIGTERM in on_train_start (start-up, a sanity check, a first compile): the ranks agree at the first
    # batch's start and stop there, as one process does, rather than after the first step(s) with a checkpoint.
    run = runs("ddp-early", "--devices", "2", "--signal-rank", "1")
    assert run.wait(90) == 128 + signal.SIGTERM, run.output()[-4000:]
    stops = run.wait_for("stop_rank0.json", "stop_rank1.json", timeout=1)
    assert [stop["exception"] for stop in stops] == ["PreemptedExit", "PreemptedExit"]
    assert [stop["step"] for stop in stops] == [0, 0]
    assert [stop["code"] for stop in stops] == [128 + signal.SIGTERM, 0]  # rank 1: Lightning's launcher's child
    assert not list(run.out.rglob("*.ckpt"))
    output = run.output()
    assert "[rank: 1] received SIGTERM before the first training step" in output
    assert "[rank: 0] received" not in output


@pytest.mark.slow
def test_ddp_run_without_signal_finishes_with_status_0(runs) -> None:
    # The common path: the flag is exchanged every step, across an epoch end and its validation, and the last
    # exchange is waited for and the gloo group taken down at teardown.
    run = runs("ddp-done", "--devices", "2", "--max-steps", "7")
    assert run.wait(90) == 0, run.output()[-4000:]
    assert "`max_steps=7` reached" in run.output()
    assert list(run.out.glob("stop_rank*.json")) == []


@pytest.mark.slow
def test_max_time_under_ddp_stops_every_rank_at_one_step_without_a_broadcast_per_step(runs) -> None:
    # Lightning's timer broadcast rank 0's "time is up" every step: two blocking collectives, under NCCL a host sync.
    # The ranks agree on it with the signal flag's asynchronous exchange instead.
    run = runs("ddp-time", "--devices", "2", "--max-time", "00:00:00:06")
    assert run.wait(120) == 0, run.output()[-4000:]
    ends = run.wait_for("end_rank0.json", "end_rank1.json", timeout=1)
    assert ends[0]["step"] == ends[1]["step"] > 3, ends  # stopped by the time, together, well before max_steps
    assert [end["timer_broadcasts"] for end in ends] == [0, 0]
    assert "Time limit reached (trainer.max_time)" in run.output()
    assert list(run.out.glob("stop_rank*.json")) == []  # Lightning's own stop: no exception


@pytest.mark.slow
def test_dead_ddp_rank_makes_the_other_exit_with_an_error(runs) -> None:
    run = runs("dead", "--devices", "2", "--die-rank", "1", "--die-step", "3", "--die-mode", "exit")
    status = run.wait(90)
    ended = time.time()
    (dying,) = run.wait_for("dying_rank1.json", timeout=1)
    assert status != 0, run.output()[-4000:]
    # A dead peer's connections close: gloo fails at once (or Lightning's child observer kills rank 0 within 5 s).
    assert ended - dying["time"] < 15


@pytest.mark.slow
def test_killed_ddp_rank_0_leaves_no_rank_behind(runs) -> None:
    # kill -9 of rank 0, which started rank 1 (Lightning's launcher): nothing is left to watch rank 1, which must end
    # on its own, with an error. test_gpu_reliability.py runs the same with NCCL.
    run = runs(
        "killed0", "--devices", "2", "--ready-step", "2", "--die-rank", "0", "--die-step", "3", "--die-mode", "kill",
        reaped=True,
    )  # fmt: skip
    (ready1,) = run.wait_for("ready_rank1.json")
    assert run.wait(90) == 128 + signal.SIGKILL, run.output()[-4000:]  # rank 0's status; every rank has ended
    (dying,) = run.wait_for("dying_rank0.json", timeout=1)
    exits = json.loads((run.out / "exits.json").read_text())
    rank1 = exits[str(ready1["pid"])]
    assert rank1["status"] != 0, run.output()[-4000:]
    # gloo: the dead peer's connections close, and rank 1's next collective fails at once.
    assert rank1["time"] - dying["time"] < 15, run.output()[-4000:]


@pytest.mark.slow
def test_hung_ddp_rank_makes_the_other_exit_within_the_timeout(runs) -> None:
    timeout = 20  # also bounds the start-up rendezvous, where rank 0 waits for rank 1 to import and connect
    run = runs(
        "hung",
        "--devices",
        "2",
        "--timeout-s",
        str(timeout),
        "--die-rank",
        "1",
        "--die-step",
        "3",
        "--die-mode",
        "hang",
    )
    (ready1,) = run.wait_for("ready_rank1.json")
    status = run.wait(timeout + 60)
    ended = time.time()
    (hang,) = run.wait_for("dying_rank1.json", timeout=1)
    assert status != 0, run.output()[-4000:]
    assert timeout - 1 <= ended - hang["time"] <= timeout + 20, ended - hang["time"]
    # gloo words it "Timed out waiting ...ms for recv/send operation" or "Application timeout caused pair closure".
    assert re.search("timed out|timeout", run.output(), flags=re.IGNORECASE)
    # The hung rank did not outlive the job: rank 0 killed its child on the way out.
    deadline = time.monotonic() + 5
    while alive(ready1["pid"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(ready1["pid"])


@pytest.mark.slow
def test_sigterm_to_every_process_with_workers_still_saves(runs) -> None:
    # Ctrl+C signals the whole foreground process group and SLURM every process of the job step: the data loader
    # workers get the signal too, and must leave it to the main process (datamodule: WorkerSignalShield).
    run = runs("group", "--workers", "2")
    (ready,) = run.wait_for("ready_rank0.json")
    assert len(ready["workers"]) == 2
    for pid in [ready["pid"], *ready["workers"]]:
        os.kill(pid, signal.SIGTERM)
    assert run.wait(60) == 128 + signal.SIGTERM, run.output()[-4000:]
    (stop,) = run.wait_for("stop_rank0.json", timeout=1)
    check_boundary_checkpoint(run.out / "checkpoints" / "last.ckpt", stop["step"])
