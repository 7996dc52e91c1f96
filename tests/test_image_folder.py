"""image_folder: the ImageNet layout's checks, each refusal naming the folder or file and what is expected."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from image_folder import check_layout


def make_layout(root: Path, train: list[str], val: list[str]) -> Path:
    """Empty folders ``root/{train,val}/<class>``."""
    for split, names in (("train", train), ("val", val)):
        for name in names:
            (root / split / name).mkdir(parents=True)
    return root


def test_missing_root(tmp_path: Path) -> None:
    root = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError, match=re.escape(f"data.root: {root} does not exist")):
        check_layout(root)


@pytest.mark.parametrize("missing", ["train", "val"])
def test_missing_split(tmp_path: Path, missing: str) -> None:
    root = tmp_path / "data"
    (root / ("val" if missing == "train" else "train") / "a").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=re.escape(f"data.root: {root / missing} is missing")):
        check_layout(root)
    (root / missing).write_text("")  # a file where the split's folder goes: it said "is missing"
    with pytest.raises(FileNotFoundError, match=re.escape(f"data.root: {root / missing} is a file, not a folder")):
        check_layout(root)


@pytest.mark.parametrize("split", ["train", "val"])
def test_a_split_folder_given_as_the_root_names_the_folder_above(tmp_path: Path, split: str) -> None:
    for name in ("train", "val"):
        (tmp_path / "data" / name / "a").mkdir(parents=True)
    root = tmp_path / "data" / split
    said = f"({root} looks like a split folder: data.root is the folder above it, {tmp_path / 'data'})"
    with pytest.raises(FileNotFoundError, match=re.escape(said)):
        check_layout(root)
    # A folder merely named train, with no val beside it, gets the general hint.
    lone = tmp_path / "other" / "train"
    (lone / "a").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="for an ImageNet val set that is flat"):
        check_layout(lone)


def test_split_without_class_folders(tmp_path: Path) -> None:
    root = tmp_path / "data"
    (root / "train" / "a").mkdir(parents=True)
    (root / "val").mkdir()
    (root / "val" / "flat.JPEG").write_bytes(b"")
    with pytest.raises(ValueError, match=re.escape(f"{root / 'val'} has no class folders")):
        check_layout(root)


def test_a_split_with_one_class_folder_names_it(tmp_path: Path) -> None:
    # Before, the model refused "model.num_classes must be >= 2", an option the user never set.
    root = make_layout(tmp_path / "data", ["circle"], ["circle"])
    with pytest.raises(ValueError, match=re.escape(f"{root / 'train'} has 1 class folder (circle); a classifier")):
        check_layout(root)


def test_a_resize_manifest_that_cannot_be_read_is_refused(tmp_path: Path) -> None:
    root = make_layout(tmp_path / "data", ["a"], ["a"])
    (root / "resize_dataset.json").write_text('{"short_side": 256, "quali')  # cut off mid-write by hand
    with pytest.raises(ValueError, match=re.escape(f"data.root: {root / 'resize_dataset.json'} cannot be read")):
        check_layout(root)
    (root / "resize_dataset.json").write_text("[256, 90]")  # valid JSON, but not the tool's manifest
    with pytest.raises(ValueError, match=re.escape("resize_dataset.json is not resize_dataset.py's manifest")):
        check_layout(root)


def test_differing_class_sets(tmp_path: Path) -> None:
    root = make_layout(tmp_path / "data", ["a", "b", "c"], ["a", "c", "d"])
    with pytest.raises(ValueError, match=r"different classes \(only in train: \['b'\]; only in val: \['d'\]\)"):
        check_layout(root)
    assert check_layout(make_layout(tmp_path / "ok", ["b", "a"], ["a", "b"])) == ["a", "b"]
