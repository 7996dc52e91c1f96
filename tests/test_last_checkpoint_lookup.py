"""Where a run's last.ckpt goes and where ``--ckpt_path last`` looks (last_checkpoint_lookup.py), on parsed options:
the folder for a fixed version, a run without a logger, ``~`` expanded; the options that would make ``last`` miss the
latest state; the newest last.ckpt of the run's name advised. Through train.main and real runs:
test_checkpoint_folders.py and test_train.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from jsonargparse import Namespace

import last_checkpoint_lookup as lookup


def section(logger: object = None, **callbacks: dict) -> Namespace:
    """A subcommand's parsed options with ``trainer.logger`` and the checkpoint callbacks' options given."""
    if logger is None:
        logger = Namespace(class_path="run_logger.RunLogger", init_args=Namespace(save_dir="runs", version=None))
    options = {"checkpoint": {}, "last_checkpoint": {"filename": "last"}, "preemption": {}} | callbacks
    return Namespace(trainer=Namespace(logger=logger, default_root_dir=None),
                     **{key: Namespace(**value) for key, value in options.items()})  # fmt: skip


def logger(**init_args: object) -> Namespace:
    return Namespace(class_path="run_logger.RunLogger", init_args=Namespace(**init_args))


def test_the_folder_last_looks_in_for_a_fixed_version_a_fixed_folder_and_no_logger(monkeypatch) -> None:
    monkeypatch.setenv("HOME", "/home/u")
    fixed = section(logger(save_dir="logs", name="r50", version="requeued"))
    assert lookup.last_checkpoint_folder(fixed) == Path("logs/r50/requeued/checkpoints")
    assert lookup.last_checkpoint_folder(section(logger(version=3))) == Path(
        "runs/lightning_logs/version_3/checkpoints"
    )
    assert lookup.last_checkpoint_folder(section(last_checkpoint={"dirpath": "~/ck"})) == Path("/home/u/ck")
    without = section(logger=False)
    without.trainer.default_root_dir = "~/root"
    assert lookup.last_checkpoint_folder(without) == Path("/home/u/root/checkpoints")
    assert not lookup.checkpoints_in_a_new_folder(without) and not lookup.checkpoints_in_a_new_folder(fixed)
    assert lookup.checkpoints_in_a_new_folder(section(logger(save_dir="logs")))


def test_checkpoint_dirpath_alone_takes_last_ckpt_along() -> None:
    alone = section(checkpoint={"dirpath": "ck"}, last_checkpoint={"dirpath": None})
    lookup.last_checkpoint_follows_checkpoint_dirpath(alone)
    assert alone.last_checkpoint.dirpath == "ck"
    both = section(checkpoint={"dirpath": "ck"}, last_checkpoint={"dirpath": "elsewhere"})
    lookup.last_checkpoint_follows_checkpoint_dirpath(both)
    assert both.last_checkpoint.dirpath == "elsewhere"


@pytest.mark.parametrize(
    ("callbacks", "said"),
    [
        ({"last_checkpoint": {"filename": "latest"}}, "last_checkpoint.filename makes latest.ckpt"),
        ({"preemption": {"filename": "stop.ckpt"}}, "preemption.filename makes stop.ckpt"),
        ({"preemption": {"filename": "last.pt"}}, "preemption.filename makes last.pt"),
        ({"preemption": {"dirpath": "pre"}}, "preemption.dirpath pre is not one of them"),
    ],
)
def test_options_that_make_last_miss_the_latest_state_are_named(callbacks: dict, said: str) -> None:
    assert said in lookup.what_last_would_miss(section(**callbacks))


def test_nothing_is_missed_at_the_defaults_or_with_the_preemption_folder_a_callbacks(tmp_path: Path) -> None:
    assert lookup.what_last_would_miss(section()) is None
    same = section(preemption={"dirpath": str(tmp_path / "ck")}, last_checkpoint={"filename": "last", "dirpath":
                   str(tmp_path / "x" / ".." / "ck")})  # fmt: skip
    assert lookup.what_last_would_miss(same) is None


def test_the_newest_last_ckpt_of_the_runs_name_is_advised(tmp_path: Path) -> None:
    runs = section(logger(save_dir=str(tmp_path), name="r50"))
    assert (
        lookup.newest_last_checkpoint(runs)
        == f"pass the checkpoint file (there is no last.ckpt under {tmp_path / 'r50'})"
    )
    for age, run in enumerate(["version_1", "requeued", "version_0"]):
        (tmp_path / "r50" / run / "checkpoints").mkdir(parents=True)
        (tmp_path / "r50" / run / "checkpoints" / "last.ckpt").write_bytes(b"")
        os.utime(tmp_path / "r50" / run / "checkpoints" / "last.ckpt", (1000 + age, 1000 + age))
    newest = tmp_path / "r50" / "version_0" / "checkpoints" / "last.ckpt"
    advice = f"pass the file (the newest under {tmp_path / 'r50'}: --ckpt_path {newest})"
    assert lookup.newest_last_checkpoint(runs) == advice
    assert lookup.no_last_checkpoint(runs, "validate").endswith(f"a randomly initialized model; {advice}")
    assert "start from scratch" in lookup.no_last_checkpoint(runs, "fit")
    assert lookup.newest_last_checkpoint(section(logger=False)) == "pass the checkpoint file"


def test_last_chooses_among_last_star_ckpt_of_its_folder(tmp_path: Path) -> None:
    fixed = section(last_checkpoint={"filename": "last", "dirpath": str(tmp_path)})
    assert lookup.last_checkpoints(section(last_checkpoint={"dirpath": str(tmp_path / "none")})) == []
    for name in ("last.ckpt", "last-v1.ckpt", "best.ckpt", "last.pt"):
        (tmp_path / name).write_bytes(b"")
    assert lookup.last_checkpoints(fixed) == [tmp_path / "last-v1.ckpt", tmp_path / "last.ckpt"]
