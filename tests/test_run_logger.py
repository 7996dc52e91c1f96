"""run_logger.py: a requeued job resuming into its fixed run folder keeps the metrics of the segments before it
(Lightning's CSVLogger deleted metrics.csv when the resumed run started); a fresh run into that folder starts anew,
at its first rows (before them the earlier file stays). A run refused before its first step leaves no run folder
behind."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

import train
from run_logger import NewRunFolder, RunLogger

REPO = Path(__file__).resolve().parent.parent


def steps_logged(folder: Path) -> list[int]:
    with (folder / "metrics.csv").open(newline="") as file:
        return sorted({int(row["step"]) for row in csv.DictReader(file) if row.get("train_loss")})


def test_a_requeued_job_keeps_the_metrics_of_its_earlier_segments(shapes_root, tmp_path, tiny_args, monkeypatch):
    monkeypatch.setattr(sys, "argv", [str(REPO / "train.py")])
    job = tiny_args(shapes_root, tmp_path, trainer__limit_val_batches=0, trainer__log_every_n_steps=1,
                    trainer__logger__init_args__version="fixed")  # fmt: skip
    folder = tmp_path / "logs" / "fixed"
    first = train.main(["fit", *job, "--trainer.max_steps", "3", "--ckpt_path", "last"])
    assert isinstance(first.trainer.logger, RunLogger)
    assert steps_logged(folder) == [1, 2]  # the first step starts the interval
    train.main(["fit", *job, "--trainer.max_steps", "6", "--ckpt_path", "last"])
    # Both segments' rows: before, only the second's (4, 5) were left.
    assert steps_logged(folder) == [1, 2, 4, 5]
    header = (folder / "metrics.csv").read_text().splitlines()[0].split(",")
    assert len(header) == len(set(header)) and "train_loss" in header


def test_a_fresh_run_into_the_same_folder_starts_its_metrics_anew(shapes_root, tmp_path, tiny_args, monkeypatch):
    monkeypatch.setattr(sys, "argv", [str(REPO / "train.py")])
    job = tiny_args(shapes_root, tmp_path, trainer__limit_val_batches=0, trainer__log_every_n_steps=1,
                    trainer__logger__init_args__version="fixed")  # fmt: skip
    folder = tmp_path / "logs" / "fixed"
    train.main(["fit", *job, "--trainer.max_steps", "3"])
    with pytest.warns(UserWarning, match="an earlier run's, is replaced at this run's first metrics"):
        train.main(["fit", *job, "--trainer.max_steps", "2"])  # no checkpoint: no continuation
    assert steps_logged(folder) == [1]


@pytest.mark.parametrize("prefix", ["", "validate_"])
def test_an_earlier_runs_file_is_replaced_whole_at_the_first_rows_not_when_the_run_starts(tmp_path, prefix):
    """A run refused in setup, or killed before it logged, deleted the earlier run's metrics and wrote none."""
    (tmp_path / "run").mkdir()
    earlier = tmp_path / "run" / f"{prefix}metrics.csv"
    earlier.write_text("epoch,step,val_acc1\n0,9,0.5\n")
    logger = RunLogger(save_dir=str(tmp_path), name="", version="run")
    logger.file_prefix = prefix
    with pytest.warns(UserWarning, match="is replaced at this run's first metrics"):
        writer = logger.experiment
    assert earlier.read_text() == "epoch,step,val_acc1\n0,9,0.5\n"  # refused here: the earlier results stay
    writer.log_metrics({"val_acc5": 0.75}, step=0)
    writer.save()
    assert earlier.read_text().splitlines() == ["step,val_acc5", "0,0.75"]  # the new run's alone
    writer.log_metrics({"val_acc5": 0.5}, step=1)
    writer.save()
    assert earlier.read_text().splitlines() == ["step,val_acc5", "0,0.75", "1,0.5"]


def test_a_new_run_folder_holding_only_setup_files_is_taken_back_with_its_new_parents(tmp_path):
    log_dir = tmp_path / "runs" / "name" / "version_0"
    folder = NewRunFolder(log_dir)
    assert folder.created == [log_dir, log_dir.parent, log_dir.parent.parent]
    (log_dir / "checkpoints").mkdir(parents=True)
    (log_dir / "config.yaml").write_text("model: {}\n")
    (log_dir / "metrics.csv").write_text("epoch,step\n")  # a header, no row
    assert folder.take_back()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "result",
    [("checkpoints/last.ckpt", b"weights"), ("metrics.csv", b"epoch,step\n0,1\n"), ("step_report/r.json", b"{}")],
)
def test_a_run_folder_holding_a_result_stays(tmp_path, result):
    log_dir = tmp_path / "runs" / "version_0"
    folder = NewRunFolder(log_dir)
    path = log_dir / result[0]
    path.parent.mkdir(parents=True)
    path.write_bytes(result[1])
    assert not folder.take_back()
    assert path.read_bytes() == result[1]


def test_a_refused_run_puts_back_the_setup_files_of_a_folder_that_was_there(tmp_path):
    """A refusal after the config was saved (a restore's, in a fixed folder) left config.yaml describing a run that
    never ran beside the earlier run's metrics."""
    log_dir = tmp_path / "fixed"
    log_dir.mkdir()
    (log_dir / "config.yaml").write_text("data: {root: trained}\n")
    (log_dir / "metrics.csv").write_text("epoch,step\n0,1\n")
    folder = NewRunFolder(log_dir)
    (log_dir / "config.yaml").write_text("data: {root: refused}\n")  # what the refused run saved in its setup
    (log_dir / "validate_config.yaml").write_text("data: {root: refused}\n")
    assert not folder.take_back()  # the folder stays
    assert (log_dir / "config.yaml").read_text() == "data: {root: trained}\n"
    assert sorted(p.name for p in log_dir.iterdir()) == ["config.yaml", "metrics.csv"]


def test_folders_that_were_there_before_the_run_stay(tmp_path):
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "version_0").mkdir()
    assert not NewRunFolder(tmp_path / "runs" / "version_0").take_back()  # not this run's
    folder = NewRunFolder(tmp_path / "runs" / "version_1")
    (tmp_path / "runs" / "version_1").mkdir()
    assert folder.take_back()
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["version_0"]


# --- metrics.csv is never left torn ----------------------------------------------------------------------------------
def read_rows(path: Path) -> list[list[str]]:
    with path.open(newline="") as file:
        return list(csv.reader(file))


def test_a_failed_rewrite_for_a_new_column_keeps_the_file_as_it_was(tmp_path, monkeypatch):
    logger = RunLogger(tmp_path, name="run", version=0)
    writer = logger.experiment
    for step in range(3):
        writer.log_metrics({"train_loss": 2.0 - step}, step)
    writer.save()
    path = Path(writer.metrics_file_path)
    before = path.read_bytes()
    # The first validation adds columns: the file is rewritten with the wider header, and the disk fills meanwhile.
    writer.log_metrics({"val_acc1": 0.5}, 3)

    def full_disk(self, rows):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(csv.DictWriter, "writerows", full_disk)
    with pytest.raises(OSError, match="No space left"):
        writer.save()
    assert path.read_bytes() == before  # Lightning's in-place rewrite left the header alone
    assert [p.name for p in path.parent.iterdir()] == ["metrics.csv"]  # no temporary file left behind
    monkeypatch.undo()
    writer.save()  # the next save (the rows are still buffered) writes them under the wider header
    rows = read_rows(path)
    assert rows[0] == ["step", "train_loss", "val_acc1"] and len(rows) == 5 and rows[4] == ["3", "", "0.5"]


def test_a_resumed_run_drops_the_torn_last_row_of_the_run_before(tmp_path):
    folder = tmp_path / "run" / "fixed"
    folder.mkdir(parents=True)
    (folder / "metrics.csv").write_text("step,train_loss\n0,2.5\n1,2.25\n2,2.")  # killed while writing step 2
    logger = RunLogger(tmp_path, name="run", version="fixed")
    logger.resuming = True
    writer = logger.experiment
    writer.log_metrics({"train_loss": 2.0}, 2)
    writer.save()
    # Continued, the resumed row would have been appended to the torn one: "2,2.2,2.0" (three fields).
    assert read_rows(folder / "metrics.csv") == [["step", "train_loss"], ["0", "2.5"], ["1", "2.25"], ["2", "2.0"]]
