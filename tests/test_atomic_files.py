"""atomic_files: a file is the old one or the whole new one; what a killed write leaves is removed once stale.

The kills themselves (a save killed mid-write, before the rename) are in tests/test_checkpoint_io.py, through the
checkpoint plugin that writes with this module."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

import atomic_files
from atomic_files import STALE_AFTER_S, atomic_write, remove_stale_temporaries, temporary_name


def temp_files(folder: Path) -> list[Path]:
    return sorted(folder.glob(".*.tmp"))


def test_a_write_replaces_the_file_whole_and_a_failed_one_leaves_it(tmp_path: Path) -> None:
    target = tmp_path / "new" / "metrics.csv"  # missing folders are made
    atomic_write(target, lambda file: file.write(b"a,b\n1,2\n"))
    assert target.read_bytes() == b"a,b\n1,2\n"

    def fails_midway(file) -> None:  # noqa: ANN001
        file.write(b"a,b,c\n")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        atomic_write(target, fails_midway)
    assert target.read_bytes() == b"a,b\n1,2\n" and temp_files(target.parent) == []


def test_the_data_is_synced_before_the_rename_and_the_folder_after(tmp_path: Path, monkeypatch) -> None:
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(atomic_files.os, "fsync", lambda fd: (events.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(atomic_files.os, "replace", lambda a, b: (events.append("replace"), real_replace(a, b))[1])
    atomic_write(tmp_path / "r.json", lambda file: file.write(b"{}"))
    assert events == ["fsync", "replace", "fsync"]


def test_writing_needs_no_torch_or_lightning() -> None:
    """step_report.py (plain-data analysis) and legacy_checkpoint.py's reading half import it."""
    import subprocess

    code = "import sys, atomic_files; print(sorted(m for m in ('torch', 'pytorch_lightning') if m in sys.modules))"
    root = Path(atomic_files.__file__).parent
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_stale_temporaries_of_a_long_name_are_found_whatever_their_pids_length(tmp_path: Path) -> None:
    path = tmp_path / ("x" * 240 + ".ckpt")  # a write's temporary name is shortened to fit 255 bytes
    old = time.time() - STALE_AFTER_S - 1
    left = []

    def gone(pids: range) -> int:
        return next(pid for pid in pids if not Path(f"/proc/{pid}").exists())

    for pid in (gone(range(99, 9, -1)), gone(range(4_000_000, 3_000_000, -1))):  # dead; another length than ours
        suffix = f".{pid}.0badc0de.tmp"
        left.append(tmp_path / f".{path.name[: 255 - len(suffix) - 1]}{suffix}")
        left[-1].write_bytes(b"part")
        os.utime(left[-1], (old, old))
    assert sorted(remove_stale_temporaries(path)) == sorted(left)
    assert temp_files(tmp_path) == []


def test_stale_temporaries_of_a_long_non_ascii_name_are_found_and_another_targets_kept(tmp_path: Path) -> None:
    # 120 two-byte characters: the shortened name is cut inside a character, which is left out (254 bytes, not 255).
    path, other = tmp_path / ("é" * 120 + ".ckpt"), tmp_path / ("ê" * 120 + ".ckpt")
    old = time.time() - STALE_AFTER_S - 1
    pid = next(pid for pid in range(999, 99, -1) if not Path(f"/proc/{pid}").exists())  # three digits: an odd room
    made = []
    for target in (path, other):
        made.append(tmp_path / temporary_name(target.name, tmp_path, f".{pid}.0badc0de.tmp"))
        made[-1].write_bytes(b"part")
        os.utime(made[-1], (old, old))
    assert len(os.fsencode(made[0].name)) == 254
    assert remove_stale_temporaries(path) == [made[0]]  # the other target's stays for its own next save
    assert temp_files(tmp_path) == [made[1]]
