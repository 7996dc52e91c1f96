"""run_logger.py: a requeued job resuming into its fixed run folder keeps the metrics of the segments before it
(Lightning's CSVLogger deleted metrics.csv when the resumed run started); a fresh run into that folder starts anew."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

import train
from run_logger import RunLogger

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
    with pytest.warns(UserWarning, match="will be deleted"):  # Lightning's own: no checkpoint, no continuation
        train.main(["fit", *job, "--trainer.max_steps", "2"])
    assert steps_logged(folder) == [1]
