"""shapes_dataset.py: where the embedded dataset can be drawn, and what it is published as."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

import shapes_dataset

SMALL = {"train_per_class": 2, "val_per_class": 1, "image_size": 16}


def test_another_seed_draws_other_images(tmp_path: Path) -> None:
    """data.seed picks the generated dataset (the docs' promise): not only the warning of another seed's folder."""
    first = shapes_dataset.generate(tmp_path / "a", train_per_class=1, val_per_class=1, image_size=16, seed=0)
    other = shapes_dataset.generate(tmp_path / "b", train_per_class=1, val_per_class=1, image_size=16, seed=1)
    name = "train/circle/circle_00000.JPEG"
    assert (first / name).read_bytes() != (other / name).read_bytes()


def test_a_link_to_an_empty_folder_gets_the_dataset_in_that_folder(tmp_path: Path) -> None:
    (tmp_path / "storage" / "empty").mkdir(parents=True)
    link = tmp_path / "shapes10"
    link.symlink_to(tmp_path / "storage" / "empty")
    assert shapes_dataset.why_it_cannot_be_drawn(link) is None
    assert shapes_dataset.generate(link, **SMALL) == link  # it failed with NotADirectoryError after drawing
    assert link.is_symlink() and shapes_dataset.is_complete(link)
    assert shapes_dataset.is_complete(tmp_path / "storage" / "empty")
    assert sorted(p.name for p in (tmp_path / "storage").iterdir()) == ["empty"]  # no staging folder left


def test_a_folder_that_cannot_take_the_dataset_is_refused_before_drawing(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "file").write_text("")
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "a.JPEG").write_text("")
    (tmp_path / "mounted").mkdir()
    real_ismount = os.path.ismount
    monkeypatch.setattr(shapes_dataset.os.path, "ismount", lambda p: Path(p).name == "mounted" or real_ismount(p))
    drawn = []
    monkeypatch.setattr(shapes_dataset, "draw_sample", lambda *a: drawn.append(a))
    for name, message in [
        ("file", "is a file"),
        ("photos", "is not a generated shapes dataset"),
        ("mounted", r"is a mount point: .*a folder inside it, e.g. .*mounted/shapes10"),
    ]:
        assert shapes_dataset.why_it_cannot_be_drawn(tmp_path / name) is not None
        with pytest.raises(FileExistsError, match=message):
            shapes_dataset.generate(tmp_path / name, **SMALL)
    assert drawn == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "mounted", "photos"]


def test_the_published_dataset_is_readable_by_others_as_the_umask_allows(tmp_path: Path) -> None:
    previous = os.umask(0o022)
    try:
        root = shapes_dataset.generate(tmp_path / "shapes10", **SMALL)
    finally:
        os.umask(previous)
    assert stat.S_IMODE(root.stat().st_mode) == 0o755  # mkdtemp's 0700 before


def test_the_staging_folders_of_killed_draws_are_removed_once_abandoned(tmp_path: Path) -> None:
    root = tmp_path / "shapes10"
    killed = tmp_path / ".shapes10.partial-abc123"  # a draw killed half-way
    image = killed / "train" / "circle" / "circle_00000.JPEG"
    image.parent.mkdir(parents=True)
    image.write_bytes(b"jpeg")
    drawing = tmp_path / ".shapes10.partial-def456"  # another process drawing now
    drawing.mkdir()
    other = tmp_path / ".other.partial-abc123"  # another dataset's
    other.mkdir()
    old = time.time() - shapes_dataset.ABANDONED_AFTER_S - 1
    for path in (killed, killed / "train", image.parent, image, other):
        os.utime(path, (old, old))
    shapes_dataset.generate(root, **SMALL)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".other.partial-abc123",
        ".shapes10.partial-def456",
        "shapes10",
    ]
