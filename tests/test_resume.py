"""``kill -9`` at random moments, then resume from last.ckpt: the run ends exactly where an uninterrupted run ends.

The application (``python train.py``: resnet18 on 32-pixel crops of a small generated dataset, CPU,
``--trainer.deterministic true``, a fixed seed, one loader worker, ``last.ckpt`` after every step) is SIGKILLed
together with its worker at moments drawn from a seeded generator: in the middle of epoch 0, in the middle of a
checkpoint save near the epoch boundary, in the middle of epoch 1. After each kill it is started again with
``--ckpt_path .../last.ckpt``, until a run finishes. An uninterrupted run of the same command is the reference:

* the final weights (and the optimizer's momentum and the LR schedule) are equal tensor by tensor;
* every step that any of the processes trained, including those trained twice because a kill came before their
  checkpoint, trained on the same images (order, crops and flips), at the same learning rate, with the same loss
  as the reference's step (``reliability_scripts/step_probe.py`` records them);
* the losses the resumed run logs (``metrics.csv``) are the reference's.

Where the kills land depends on timing; one sequence matters enough to be run deterministically as well (in this
process, stopped by ``--trainer.max_steps``): a resume from the checkpoint of an epoch's last batch, then a second
resume in the middle of the next epoch, which needs the epoch counted as started (callbacks/resumable_checkpoint.py)
or, for a checkpoint written without it, checkpoint_io's repair of Lightning's epoch progress.
"""

from __future__ import annotations

import csv
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import shapes_dataset
import train
from checkpoint_io import repair_epoch_progress

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = Path(__file__).resolve().parent / "reliability_scripts"

STEPS_PER_EPOCH = 6  # 10 classes x 5 images, batches of 8, drop_last
EPOCHS = 2
STEPS = STEPS_PER_EPOCH * EPOCHS
#: Seeds the kill moments. Which moments a seed gives also depends on the machine's speed; the assertions hold for any.
KILL_SEED = 1130
#: Fields of a step record that must equal the reference's (everything but the process id).
STEP_FIELDS = ("epoch", "batch_idx", "loss", "lr", "images", "targets")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shapes_dataset.generate(
        tmp_path_factory.mktemp("resume") / "data", train_per_class=5, val_per_class=1, image_size=32, seed=0
    )


def train_command(tiny_args: Any, data_root: Path, run_dir: Path) -> list[str]:
    callbacks = [{"class_path": "step_probe.StepRecord", "init_args": {"path": str(run_dir / "steps.jsonl")}}]
    args = tiny_args(
        data_root,
        run_dir,
        data__workers=1,
        data__batch_size=8,
        # Warmup through epoch 0 and a decay at epoch 1: the learning rate changes every step and at the epoch.
        model__warmup_epochs=1,
        model__lr_milestones="[1]",
        trainer__max_epochs=EPOCHS,
        trainer__limit_val_batches=1,
        trainer__deterministic="true",
        trainer__log_every_n_steps=1,
        trainer__logger__init_args__version="fixed",  # every resume writes to the same folder
        trainer__callbacks=json.dumps(callbacks),
        last_checkpoint__every_n_train_steps=1,
        checkpoint__save_top_k=0,  # no best-of files: only last.ckpt
    )
    return [sys.executable, str(REPO / "train.py"), "fit", *args]


def checkpoint_dir(run_dir: Path) -> Path:
    return run_dir / "logs" / "fixed" / "checkpoints"


def read_records(path: Path) -> list[dict[str, Any]]:
    """The step records of ``path``; a last line that a kill cut short is left out."""
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return records


class Training:
    """One ``python train.py`` process, in its own session: a kill takes its loader worker along."""

    def __init__(self, command: list[str], run_dir: Path, number: int) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(SCRIPTS), str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        self.log_path = run_dir / f"process{number}.log"
        self.log = open(self.log_path, "w")  # noqa: SIM115 (closed in end())
        self.process = subprocess.Popen(
            command, cwd=run_dir, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def output(self) -> str:
        self.log.flush()
        return self.log_path.read_text()[-4000:]

    def check_running(self, waiting_for: str) -> None:
        if self.process.poll() is not None:
            pytest.fail(f"the run ended (status {self.process.returncode}) before {waiting_for}:\n{self.output()}")

    def kill(self) -> None:
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def end(self) -> None:
        if self.process.poll() is None:
            self.kill()
        else:  # what the main process started may outlive it
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.log.close()


@pytest.fixture(scope="module")
def processes():
    started: list[Training] = []
    yield started
    for training in started:
        training.end()


def run_to_the_end(training: Training, timeout: float = 120) -> None:
    try:
        status = training.process.wait(timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the run did not end within {timeout} s:\n{training.output()}")
    assert status == 0, training.output()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, tiny_args, data_root: Path, processes) -> dict[str, Any]:
    """The uninterrupted run and, beside it (the two cores are otherwise half idle while a process imports), the same
    command SIGKILLed three times at seeded random moments and resumed from last.ckpt each time.

    Kills: ``("step", n)`` at a random moment of the step after step ``n`` (0-based) was trained, ``("save", n)``
    as soon as a checkpoint file is being written after step ``n`` (repeated, rarely, when the save ended first).
    """
    reference_dir = tmp_path_factory.mktemp("reference")
    reference = Training(train_command(tiny_args, data_root, reference_dir), reference_dir, 0)
    processes.append(reference)
    run_dir = tmp_path_factory.mktemp("interrupted")
    command = train_command(tiny_args, data_root, run_dir)
    steps_file, folder = run_dir / "steps.jsonl", checkpoint_dir(run_dir)
    rng = random.Random(KILL_SEED)
    plan = [
        ("step", rng.randint(1, 2)),  # in the middle of epoch 0
        ("save", rng.randint(STEPS_PER_EPOCH - 2, STEPS_PER_EPOCH)),  # a torn checkpoint near the epoch's end
        ("step", rng.randint(STEPS_PER_EPOCH + 1, STEPS - 4)),  # in the middle of epoch 1, a few steps before its end
    ]
    kills: list[dict[str, Any]] = []
    number = 0
    while plan:
        kind, after_step = plan.pop(0)
        number += 1
        resume = ["--ckpt_path", str(folder / "last.ckpt")] if (folder / "last.ckpt").exists() else []
        seen = len(read_records(steps_file))
        torn_before = set(folder.glob(".*.tmp"))
        training = Training(command + resume, run_dir, number)
        processes.append(training)
        last_step, last_seen, intervals = -1, time.monotonic(), []
        while last_step < after_step:  # wait until this process has trained step after_step
            training.check_running(f"step {after_step}")
            records = read_records(steps_file)[seen:]
            steps = [record["step"] for record in records if "step" in record]
            if steps and steps[-1] != last_step:
                now = time.monotonic()
                if last_step >= 0:
                    intervals.append(now - last_seen)
                last_step, last_seen = steps[-1], now
            time.sleep(0.002)
        if kind == "step":
            # The quickest step seen, not the last interval: one that spans an epoch's end (validation, a new loader
            # iterator) lasts several steps, and a kill drawn within it could land past the end of the run (a last
            # process that trains no step but its first logs nothing: seen once on a loaded CI machine).
            step_time = min(intervals, default=0.2)
            time.sleep(rng.random() * step_time)  # anywhere in the next step: forward, backward, optimizer, save
        else:
            while not set(folder.glob(".*.tmp")) - torn_before:
                training.check_running("a checkpoint save")
                time.sleep(0.001)
        training.kill()
        records = read_records(steps_file)[seen:]
        kills.append(
            {
                "kind": kind,
                "after_step": after_step,
                "last_step": max(record["step"] for record in records if "step" in record),
                "torn": sorted(str(path) for path in set(folder.glob(".*.tmp")) - torn_before),
            }
        )
        if kind == "save" and not kills[-1]["torn"] and number < 6:
            # The save (~80 ms) ended between the sighting of its file and the kill (a few ms): try the next one.
            plan.insert(0, ("save", after_step))
    final = Training(command + ["--ckpt_path", str(folder / "last.ckpt")], run_dir, number + 1)
    processes.append(final)
    run_to_the_end(final)
    run_to_the_end(reference)
    return {
        "reference": {"run_dir": reference_dir, "records": read_records(reference_dir / "steps.jsonl")},
        "interrupted": {"run_dir": run_dir, "records": read_records(steps_file), "kills": kills},
    }


@pytest.fixture(scope="module")
def reference(runs: dict[str, Any]) -> dict[str, Any]:
    return runs["reference"]


@pytest.fixture(scope="module")
def interrupted(runs: dict[str, Any]) -> dict[str, Any]:
    return runs["interrupted"]


def load_checkpoint(run_dir: Path) -> dict[str, Any]:
    return torch.load(checkpoint_dir(run_dir) / "last.ckpt", map_location="cpu", weights_only=False)


def test_interrupted_run_ends_with_the_weights_of_the_uninterrupted_run(reference, interrupted) -> None:
    expected, got = load_checkpoint(reference["run_dir"]), load_checkpoint(interrupted["run_dir"])
    assert expected["global_step"] == got["global_step"] == STEPS
    weights = expected["state_dict"]
    assert weights.keys() == got["state_dict"].keys()
    differing = [name for name, tensor in weights.items() if not torch.equal(tensor, got["state_dict"][name])]
    assert not differing, f"{len(differing)} of {len(weights)} tensors differ: {differing[:5]}"
    # The rest of the training state too: SGD momentum buffers, the LR schedule's position.
    (expected_optimizer,), (optimizer,) = expected["optimizer_states"], got["optimizer_states"]
    assert expected_optimizer["state"].keys() == optimizer["state"].keys()
    for index, state in expected_optimizer["state"].items():
        assert torch.equal(state["momentum_buffer"], optimizer["state"][index]["momentum_buffer"]), index
    assert expected["lr_schedulers"] == got["lr_schedulers"]


def test_every_step_after_each_resume_is_the_uninterrupted_runs_step(reference, interrupted) -> None:
    expected = {record["step"]: record for record in reference["records"] if "step" in record}
    assert sorted(expected) == list(range(STEPS))
    steps = [record for record in interrupted["records"] if "step" in record]
    for record in steps:
        want = expected[record["step"]]
        assert {f: record[f] for f in STEP_FIELDS} == {f: want[f] for f in STEP_FIELDS}, record["step"]
    assert {record["step"] for record in steps} == set(range(STEPS))
    # The first process from scratch, each of the others from the checkpoint the one before it left.
    starts = [record["start"] for record in interrupted["records"] if "start" in record]
    assert len(starts) == len(interrupted["kills"]) + 1 >= 4 and starts[0] == 0
    for kill, start in zip(interrupted["kills"], starts[1:], strict=True):
        # A kill loses at most the step in progress and the one being saved (the records of a process come before
        # its checkpoint of the same step).
        assert kill["last_step"] - 1 <= start <= kill["last_step"] + 1, (kill, starts)
    assert any(start % STEPS_PER_EPOCH for start in starts[1:]), f"no resume in the middle of an epoch: {starts}"


def test_kill_in_the_middle_of_a_save_leaves_the_previous_checkpoint(interrupted) -> None:
    starts = [record["start"] for record in interrupted["records"] if "start" in record]
    torn = [(kill, start) for kill, start in zip(interrupted["kills"], starts[1:], strict=True) if kill["torn"]]
    assert torn, f"no kill came during a save: {interrupted['kills']}"
    for kill, start in torn:
        # The save of the last step the process trained was cut: the run resumed from the step before it, which it
        # then trained again (identically: see the test above).
        assert start == kill["last_step"], (kill, start)
        for path in kill["torn"]:
            assert Path(path).name.startswith(".last.ckpt.")


def read_logged(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "logs" / "fixed" / "metrics.csv", newline="") as f:
        return [row for row in csv.DictReader(f) if row.get("train_loss")]


def check_logged_losses(run_dir: Path, reference_dir: Path) -> list[dict[str, str]]:
    """Every train_loss row ``run_dir`` logged is the row the reference logged at that step; returns the rows."""
    keys = ("epoch", "train_loss", "train_acc1", "train_acc5")  # not train_img_s: a speed
    expected = {row["step"]: {key: row[key] for key in keys} for row in read_logged(reference_dir)}
    logged = read_logged(run_dir)
    for row in logged:
        assert {key: row[key] for key in keys} == expected[row["step"]], row["step"]
    return logged


def test_resumed_run_logs_the_losses_of_the_uninterrupted_run(reference, interrupted) -> None:
    logged = check_logged_losses(interrupted["run_dir"], reference["run_dir"])
    # The rows of every process that flushed (run_logger.RunLogger keeps metrics.csv across resumes; a killed process
    # flushes nothing), ending with the last process's: one per step but its first, whose interval the module only
    # times (ImageNetClassifier.on_train_batch_end).
    last_start = [record["start"] for record in interrupted["records"] if "start" in record][-1]
    last = STEPS - last_start - 1
    assert last >= 1 and [int(row["step"]) for row in logged][-last:] == list(range(last_start + 1, STEPS))


@pytest.fixture
def main(monkeypatch: pytest.MonkeyPatch):
    """``train.main`` in this process, as ``python train.py`` would run it, with the step probe importable."""
    monkeypatch.setattr(sys, "argv", [str(REPO / "train.py")])
    monkeypatch.syspath_prepend(str(SCRIPTS))
    return train.main


def test_second_resume_after_an_epoch_end_resume_is_exact(reference, tiny_args, data_root, tmp_path, main) -> None:
    command = train_command(tiny_args, data_root, tmp_path)[2:]  # fit and its options
    last = str(checkpoint_dir(tmp_path) / "last.ckpt")
    # 1. Stops after the last batch of epoch 0: last.ckpt is the one taken in that batch's on_train_batch_end.
    main([*command, "--trainer.max_steps", str(STEPS_PER_EPOCH)])
    # 2. Resumed from it, two steps into epoch 1. Lightning 2.6 counts epoch 0 as done but never counts epoch 1 as
    #    started; ResumableCheckpoint counts it at the epoch's first batch, so epoch 1's checkpoints hold what an
    #    uninterrupted run's would.
    main([*command, "--trainer.max_steps", str(STEPS_PER_EPOCH + 2), "--ckpt_path", last])
    saved = torch.load(last, map_location="cpu", weights_only=False)
    assert saved["global_step"] == STEPS_PER_EPOCH + 2
    epochs = saved["loops"]["fit_loop"]["epoch_progress"]
    assert epochs["current"] == {"ready": 2, "started": 2, "processed": 1, "completed": 1}
    assert not repair_epoch_progress(saved)  # a consistent state is left alone
    # A checkpoint from before that fix (Lightning's own bookkeeping): resuming from it relies on the load-time repair.
    for counts in (epochs["total"], epochs["current"]):
        counts["ready"] = counts["started"] = counts["completed"]
    assert epochs["current"] == {"ready": 1, "started": 1, "processed": 1, "completed": 1}
    torch.save(saved, last)
    # 3. Resumed from that to the end (AtomicCheckpointIO repairs the progress when it loads the file).
    cli = main([*command, "--ckpt_path", last])
    assert cli.trainer.global_step == STEPS
    expected = {record["step"]: record for record in reference["records"] if "step" in record}
    steps = [record for record in read_records(tmp_path / "steps.jsonl") if "step" in record]
    assert [record["step"] for record in steps] == list(range(STEPS))
    for record in steps:  # batch_idx included: Lightning's counters went on where the interrupted run was
        assert {f: record[f] for f in STEP_FIELDS} == {f: expected[record["step"]][f] for f in STEP_FIELDS}
    # Epoch 1 ran to its end, with its validation (not cut short by a loader that ran out before Lightning expected).
    with open(tmp_path / "logs" / "fixed" / "metrics.csv", newline="") as f:
        validated = [row["epoch"] for row in csv.DictReader(f) if row.get("val_acc1")]
    assert "1" in validated
    # Every run logged what the uninterrupted run logged; metrics.csv keeps the earlier runs' rows (run_logger.py)
    # and ends with the last run's: every step but its first, whose interval the module only times.
    logged = [int(row["step"]) for row in check_logged_losses(tmp_path, reference["run_dir"])]
    assert logged[-(STEPS - (STEPS_PER_EPOCH + 2) - 1) :] == list(range(STEPS_PER_EPOCH + 3, STEPS))
    assert logged[0] < STEPS_PER_EPOCH  # the first run's rows are still there
    weights, expected_weights = load_checkpoint(tmp_path)["state_dict"], load_checkpoint(reference["run_dir"])
    assert all(torch.equal(tensor, expected_weights["state_dict"][name]) for name, tensor in weights.items())
    # Epoch 1's train_loss_epoch (the last run's, which resumed two steps into it) is the mean over the whole epoch:
    # the loss of the steps before the resume travels in last.ckpt.
    resumed, uninterrupted = epoch_losses(tmp_path), epoch_losses(reference["run_dir"])
    assert resumed["1"] == pytest.approx(uninterrupted["1"], rel=1e-6)


def epoch_losses(run_dir: Path) -> dict[str, float]:
    """The last train_loss_epoch that ``run_dir``'s metrics.csv holds for each epoch."""
    with open(run_dir / "logs" / "fixed" / "metrics.csv", newline="") as f:
        rows = [row for row in csv.DictReader(f) if row.get("train_loss_epoch")]
    return {row["epoch"]: float(row["train_loss_epoch"]) for row in rows}


def test_a_ddp_resume_inside_an_epoch_logs_the_mean_over_every_ranks_images(tiny_args, data_root, tmp_path) -> None:
    """Two CPU ranks (gloo) stopped after epoch 0's first step, resumed on three to its end: the epoch's
    train_loss_epoch is the mean over every image its steps trained on, each rank's loss from the step probe; not one
    in which rank 0's share of the first step stands for the others' too, nor one skewed by the unequal shares of the
    checkpoint's 16 images that the three ranks take up (6, 5 and 5)."""
    command = train_command(tiny_args, data_root, tmp_path)
    command += ["--trainer.strategy", "ddp", "--data.workers", "0"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SCRIPTS), str(REPO), os.environ.get("PYTHONPATH", "")]))
    last = checkpoint_dir(tmp_path) / "last.ckpt"
    # 50 images in batches of 8, drop_last: 25 a rank on two, 3 steps an epoch; 17 (one padded) on three, 2 steps.
    stop = ["--trainer.devices", "2", "--trainer.max_steps", "1"]
    resume = ["--trainer.devices", "3", "--trainer.max_steps", "2", "--ckpt_path", str(last)]
    for extra in (stop, resume):
        done = subprocess.run(
            command + extra, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        if extra is stop:
            saved = torch.load(last, map_location="cpu", weights_only=False)["train_epoch_loss"]
            assert (saved["epoch"], saved["images"], saved["ranks"]) == (0, 2 * 8, 2)
    losses = {(r["rank"], r["step"]): r["loss"] for r in read_records(tmp_path / "steps.jsonl") if "step" in r}
    assert sorted(losses) == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 1)]
    assert losses[0, 0] != pytest.approx(losses[1, 0], rel=1e-3)  # the ranks' first steps differ: the test can fail
    assert epoch_losses(tmp_path)["0"] == pytest.approx(sum(losses.values()) / len(losses), rel=1e-6)
