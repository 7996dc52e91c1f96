"""AtomicCheckpointIO: a save killed at any point leaves the previous checkpoint intact and loadable."""

from __future__ import annotations

import io
import multiprocessing
import os
import re
import signal
import stat
import time
from pathlib import Path
from typing import Any

import fsspec
import pytest
import pytorch_lightning as pl
import torch

import checkpoint_io
from atomic_files import STALE_AFTER_S
from checkpoint_io import AtomicCheckpointIO, repair_epoch_progress

#: Exit status of a child that "died" on purpose in the middle of a save.
DIED = 37


def checkpoint(version: int) -> dict[str, Any]:
    """A 1 MB checkpoint whose every part says which version it is."""
    return {"version": version, "weights": torch.full((256 * 1024,), float(version))}


def assert_version(path: Path, version: int) -> None:
    loaded = AtomicCheckpointIO().load_checkpoint(path, weights_only=True)
    assert loaded["version"] == version
    assert torch.equal(loaded["weights"], checkpoint(version)["weights"])


def temp_files(folder: Path) -> list[Path]:
    return sorted(folder.glob(".*.tmp"))


class NaiveCheckpointIO(AtomicCheckpointIO):
    """The control: writes straight onto the target, as a plain ``torch.save(checkpoint, path)`` does."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        with open(path, "wb") as f:
            torch.save(checkpoint, f)


# --- what the child processes do ----------------------------------------------------------------------
def _serialized(obj: Any) -> bytes:
    buffer = io.BytesIO()
    _real_save(obj, buffer)
    return buffer.getvalue()


_real_save = torch.save


def _save_and_die_midway(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
    data = _serialized(obj)
    f.write(data[: len(data) // 2])
    f.flush()
    os._exit(DIED)


def _child(mode: str, path: str, naive: bool, marker: str, version2: dict[str, Any]) -> None:
    """Runs in a forked child: saves ``version2`` over ``path`` and dies in the middle, the way ``mode`` says."""
    # The OpenMP pool of the parent does not survive fork (libgomp deadlocks in the child); stay off it. The
    # checkpoint is built in the parent for the same reason.
    torch.set_num_threads(1)
    if mode == "exit-mid-write":
        torch.save = _save_and_die_midway
    elif mode == "exit-before-rename":
        checkpoint_io.os.replace = lambda *args: os._exit(DIED)  # type: ignore[assignment]
    elif mode == "sigkill-mid-write":

        def slow_save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
            data = _serialized(obj)
            chunk = 64 * 1024
            for start in range(0, len(data), chunk):
                f.write(data[start : start + chunk])
                f.flush()
                if start == 0:
                    Path(marker).touch()  # tells the parent the save is under way
                time.sleep(0.05)

        torch.save = slow_save
    io_plugin = NaiveCheckpointIO() if naive else AtomicCheckpointIO()
    io_plugin.save_checkpoint(version2, path)
    os._exit(0)  # not reached when the save is killed


def kill_during_save(tmp_path: Path, mode: str, naive: bool = False) -> tuple[Path, int]:
    """Saves version 1, then has a child process die while it saves version 2 over it; returns (path, exit code)."""
    path = tmp_path / "ckpts" / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint(checkpoint(1), path)
    marker = tmp_path / "saving"
    process = multiprocessing.get_context("fork").Process(
        target=_child, args=(mode, str(path), naive, str(marker), checkpoint(2)), daemon=True
    )
    process.start()
    if mode == "sigkill-mid-write":
        deadline = time.monotonic() + 30
        while not marker.exists():
            assert process.is_alive() and time.monotonic() < deadline, "the child never started saving"
            time.sleep(0.005)
        os.kill(process.pid, signal.SIGKILL)
    process.join(30)
    if process.exitcode is None:
        process.kill()
        pytest.fail("the child did not end")
    return path, process.exitcode


# --- tests --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["exit-mid-write", "sigkill-mid-write", "exit-before-rename"])
def test_killed_save_leaves_the_previous_checkpoint(tmp_path: Path, mode: str) -> None:
    path, exit_code = kill_during_save(tmp_path, mode)
    assert exit_code == (-signal.SIGKILL if mode == "sigkill-mid-write" else DIED)
    assert_version(path, 1)
    # The kill landed inside the save: its temporary file is there (a killed process cannot remove it), holding
    # the part of version 2 that was written.
    leftovers = temp_files(path.parent)
    assert len(leftovers) == 1 and leftovers[0].name.startswith(".last.ckpt.")
    assert leftovers[0].stat().st_size > 0
    # ... and nothing that looks for checkpoints picks it up.
    assert sorted(p.name for p in path.parent.glob("*.ckpt")) == ["last.ckpt"]


def test_the_next_save_removes_what_a_killed_save_left_once_it_is_stale(tmp_path: Path) -> None:
    path, _ = kill_during_save(tmp_path, "sigkill-mid-write")
    (left,) = temp_files(path.parent)
    alive = path.parent / f".last.ckpt.{os.getppid()}.0badc0de.tmp"  # a save in progress (its process runs)
    other = path.parent / f".best.ckpt.{left.name.split('.')[3]}.0badc0de.tmp"  # another checkpoint's
    for file in (alive, other):
        file.write_bytes(b"part")
    plugin = AtomicCheckpointIO()
    plugin.save_checkpoint(checkpoint(3), path)
    assert temp_files(path.parent) == sorted([left, alive, other])  # just killed: it may be another machine's save
    old = time.time() - STALE_AFTER_S - 1
    for file in (left, alive, other):
        os.utime(file, (old, old))
    plugin.save_checkpoint(checkpoint(4), path)
    assert temp_files(path.parent) == sorted([alive, other])
    assert_version(path, 4)


def test_the_same_kill_corrupts_a_plain_save(tmp_path: Path) -> None:
    # The control: the procedure above does catch a torn checkpoint.
    path, exit_code = kill_during_save(tmp_path, "exit-mid-write", naive=True)
    assert exit_code == DIED
    with pytest.raises(Exception, match="zip|archive|central directory|failed finding"):
        AtomicCheckpointIO().load_checkpoint(path, weights_only=True)


def test_save_load_remove(tmp_path: Path) -> None:
    path = tmp_path / "new" / "folder" / "a.ckpt"  # missing folders are made
    plugin = AtomicCheckpointIO()
    plugin.save_checkpoint(checkpoint(3), path)
    assert_version(path, 3)
    plugin.save_checkpoint(checkpoint(4), path)  # over an existing file
    assert_version(path, 4)
    assert temp_files(path.parent) == []
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask  # what a plain open() would have made
    plugin.remove_checkpoint(path)
    assert not path.exists()
    plugin.remove_checkpoint(path)  # already gone: nothing to do


def test_file_is_synced_before_the_rename_and_the_folder_after(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src: Any, dst: Any) -> None:
        events.append(("replace", str(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(checkpoint_io.os, "fsync", fsync)
    monkeypatch.setattr(checkpoint_io.os, "replace", replace)
    path = tmp_path / "b.ckpt"
    AtomicCheckpointIO().save_checkpoint(checkpoint(1), path)
    assert [kind for kind, _ in events] == ["fsync", "replace", "fsync"]
    assert Path(events[0][1]).parent == tmp_path and Path(events[0][1]).name.startswith(".b.ckpt.")
    assert events[1][1] == str(path)
    assert events[2][1] == str(tmp_path)


@pytest.mark.parametrize("kept", [0.0, 0.5])
def test_a_checkpoint_cut_short_is_said_in_a_line(tmp_path: Path, kept: float) -> None:
    path = tmp_path / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint(checkpoint(3), path)
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * kept)])  # copied or synced while it was written
    with pytest.raises(ValueError, match=rf"^--ckpt_path {re.escape(str(path))} cannot be read: it is cut short"):
        AtomicCheckpointIO().load_checkpoint(path)


def test_failed_save_removes_its_temporary_file(tmp_path: Path) -> None:
    path = tmp_path / "c.ckpt"
    plugin = AtomicCheckpointIO()
    plugin.save_checkpoint(checkpoint(1), path)
    with pytest.raises(Exception, match="pickle|lambda"):
        plugin.save_checkpoint({"version": 2, "unpicklable": lambda: None}, path)
    assert_version(path, 1)
    assert temp_files(tmp_path) == []


def test_a_name_as_long_as_a_plain_save_takes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 250 characters: the temporary name's pid and random part (about 22 more) must not push it past the limit (255).
    path = tmp_path / ("x" * 245 + ".ckpt")
    torch.save(checkpoint(0), path)  # a plain save takes it
    path.unlink()
    temporary: list[str] = []
    real_replace = os.replace
    monkeypatch.setattr(checkpoint_io.os, "replace", lambda src, dst: (temporary.append(src), real_replace(src, dst)))
    AtomicCheckpointIO().save_checkpoint(checkpoint(1), path)
    assert_version(path, 1)
    (name,) = [Path(t).name for t in temporary]
    assert len(name) == os.pathconf(tmp_path, "PC_NAME_MAX") and name.startswith(".xxxx") and name.endswith(".tmp")
    # Multi-byte characters are cut whole: 125 two-byte characters and the extension, 255 bytes.
    path = tmp_path / ("\u00e9" * 125 + ".ckpt")
    AtomicCheckpointIO().save_checkpoint(checkpoint(2), path)
    assert_version(path, 2)
    assert temp_files(tmp_path) == []


def test_storage_options_are_refused(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="storage_options"):
        AtomicCheckpointIO().save_checkpoint(checkpoint(1), tmp_path / "d.ckpt", storage_options={"x": 1})


def test_remote_paths_go_to_torch_checkpoint_io() -> None:
    url = "memory://atomic-io-test/e.ckpt"
    AtomicCheckpointIO().save_checkpoint(checkpoint(5), url)
    try:
        assert AtomicCheckpointIO().load_checkpoint(url, weights_only=True)["version"] == 5
    finally:
        fsspec.filesystem("memory").rm("/atomic-io-test", recursive=True)


@pytest.mark.parametrize("strategy", ["auto", "ddp"])
def test_trainer_uses_the_plugin(strategy: str) -> None:
    plugin = AtomicCheckpointIO()
    devices = 2 if strategy == "ddp" else 1
    trainer = pl.Trainer(
        accelerator="cpu", devices=devices, strategy=strategy, plugins=[plugin], logger=False, enable_progress_bar=False
    )
    assert trainer.strategy.checkpoint_io is plugin


# --- repair_epoch_progress ----------------------------------------------------------------------------------------
def _loops(epoch: tuple[int, int, int, int], batch: tuple[int, int, int, int]) -> dict[str, Any]:
    def counts(values: tuple[int, int, int, int]) -> dict[str, int]:
        return dict(zip(("ready", "started", "processed", "completed"), values, strict=True))

    return {
        "loops": {
            "fit_loop": {
                "epoch_progress": {"total": counts(epoch), "current": counts(epoch)},
                "epoch_loop.batch_progress": {"total": counts(batch), "current": counts(batch)},
            }
        }
    }


def test_repair_gives_a_batch_end_checkpoint_of_an_unstarted_epoch_its_start() -> None:
    # Saved after batch 2 of epoch 1 in the epoch that followed an epoch-end resume: epoch 1 was never counted started.
    checkpoint = _loops(epoch=(1, 1, 1, 1), batch=(2, 2, 2, 1))
    assert repair_epoch_progress(checkpoint)
    progress = checkpoint["loops"]["fit_loop"]["epoch_progress"]
    assert progress["current"] == progress["total"] == {"ready": 2, "started": 2, "processed": 1, "completed": 1}


@pytest.mark.parametrize(
    "epoch, batch",
    [
        ((2, 2, 1, 1), (2, 2, 2, 1)),  # an uninterrupted run's batch-end checkpoint in epoch 1
        ((2, 2, 1, 1), (4, 4, 4, 4)),  # its validation-end checkpoint
        ((2, 2, 2, 2), (4, 4, 4, 4)),  # saved after the epoch completed (trainer.save_checkpoint after fit)
    ],
)
def test_repair_leaves_consistent_progress_alone(epoch: tuple, batch: tuple) -> None:
    checkpoint = _loops(epoch, batch)
    assert not repair_epoch_progress(checkpoint)
    assert checkpoint == _loops(epoch, batch)


def test_repair_ignores_another_layout() -> None:
    assert not repair_epoch_progress({"state_dict": {}})
    assert not repair_epoch_progress({"loops": {"fit_loop": {"epoch_progress": {"current": {}}}}})
