"""The ImageNet folder layout as this app reads it: ``root/train/<class>/*`` and ``root/val/<class>/*``.

Class folders and images are the visible ones (hidden names, such as macOS's ``._*`` companions and
``.ipynb_checkpoints``, are neither); both splits must hold the same classes, at least two. A copy by
resize_dataset.py is refused until its manifest says it is complete. No Lightning here: resize_dataset.py and the
benchmarks read folders with it.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Any

from torchvision import datasets
from torchvision.datasets.folder import IMG_EXTENSIONS, has_file_allowed_extension, make_dataset
from typing_extensions import override  # a dependency (pyproject.toml)


def class_folders(folder: str | os.PathLike) -> list[str]:
    """The sorted names of the class sub-folders of ``folder``: every visible directory (hidden ones such as
    ``.ipynb_checkpoints`` are no class)."""
    return sorted(entry.name for entry in os.scandir(folder) if entry.is_dir() and not entry.name.startswith("."))


def visible_samples(
    directory: str | os.PathLike,
    class_to_idx: dict[str, int],
    extensions: tuple[str, ...] | None = IMG_EXTENSIONS,
    is_valid_file: Any = None,
    allow_empty: bool = False,
) -> list[tuple[str, int]]:
    """torchvision's ``make_dataset`` without the files under a hidden name below ``directory``: macOS's ``._*``
    companions of every photo copied from a Mac (not images: each would be a bad image) and the copies in a class's
    ``.ipynb_checkpoints`` (duplicate samples, in validation too)."""
    root = Path(directory)

    def valid(path: str) -> bool:
        if any(part.startswith(".") for part in Path(path).relative_to(root).parts):
            return False
        if is_valid_file is not None:
            return is_valid_file(path)
        return has_file_allowed_extension(path, extensions or IMG_EXTENSIONS)

    return make_dataset(str(directory), class_to_idx, is_valid_file=valid, allow_empty=allow_empty)


class VisibleImageFolder(datasets.ImageFolder):
    """``ImageFolder`` whose classes are exactly :func:`class_folders` (torchvision's also takes hidden folders,
    which would shift every label and give one past ``num_classes``) and whose samples are :func:`visible_samples`."""

    make_dataset = staticmethod(visible_samples)  # ImageFolder's hook, with its own signature

    @override
    def find_classes(self, directory: str | os.PathLike) -> tuple[list[str], dict[str, int]]:
        classes = class_folders(directory)
        if not classes:
            raise FileNotFoundError(f"Couldn't find any class folder in {directory}.")
        return classes, {name: index for index, name in enumerate(classes)}


#: What resize_dataset.py records in the copy it writes: its options and whether every file is there.
RESIZE_MANIFEST = "resize_dataset.json"


def read_resize_manifest(path: Path) -> dict:
    """The manifest resize_dataset.py wrote at ``path``: a JSON object.

    Raises:
        ValueError: ``path`` cannot be read, is not JSON, or holds JSON other than an object; the message names it.
    """
    try:
        written = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"{path} cannot be read ({error})") from None
    if not isinstance(written, dict):
        raise ValueError(f"{path} is not resize_dataset.py's manifest (a JSON object)")
    return written


def check_layout(root: str | os.PathLike) -> list[str]:
    """Checks ``root/train/<class>/`` and ``root/val/<class>/`` and returns the sorted class names.

    Raises:
        FileNotFoundError: ``root``, ``root/train`` or ``root/val`` is missing.
        ValueError: a split has no class folders, the two splits have different class sets, or ``root`` is a copy
            by resize_dataset.py that was interrupted (it would train on the files written so far).
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(
            f"data.root: {root} does not exist or is not a folder; expected an ImageNet layout "
            f"{root}/train/<class>/*.JPEG and {root}/val/<class>/*.JPEG"
        )
    manifest = root / RESIZE_MANIFEST
    if manifest.is_file():
        try:
            written = read_resize_manifest(manifest)
        except ValueError as error:
            raise ValueError(f"data.root: {error}; rerun resize_dataset.py") from None
        if written.get("complete") is not True:
            source = shlex.quote(str(written["source"])) if written.get("source") else "SOURCE"  # as the manifest says
            raise ValueError(
                f"data.root: {root} is an unfinished copy by resize_dataset.py ({manifest}: complete is not true); "
                f"run python resize_dataset.py {source} {shlex.quote(str(root))} "
                f"--short-side {written.get('short_side', 'N')} "
                f"--quality {written.get('quality', 'Q')} again to finish it (it resumes)"
            )
    classes = {}
    for split in ("train", "val"):
        folder = root / split
        if not folder.is_dir():
            what = "is a file, not a folder" if folder.exists() else "is missing"
            hint = "(for an ImageNet val set that is flat, sort it into class folders first)"
            if root.name in ("train", "val") and (root.parent / "train").is_dir() and (root.parent / "val").is_dir():
                # The commonest path mistake: data.root given as the split folder itself.
                hint = f"({root} looks like a split folder: data.root is the folder above it, {root.parent})"
            raise FileNotFoundError(
                f"data.root: {folder} {what}; expected {root}/train/<class>/ and {root}/val/<class>/ {hint}"
            )
        names = class_folders(folder)
        if not names:
            raise ValueError(f"data.root: {folder} has no class folders; expected {folder}/<class>/<image files>")
        classes[split] = names
    if classes["train"] != classes["val"]:
        only_train = sorted(set(classes["train"]) - set(classes["val"]))
        only_val = sorted(set(classes["val"]) - set(classes["train"]))
        raise ValueError(
            f"data.root: {root}/train and {root}/val have different classes "
            f"(only in train: {only_train[:10]}{' ...' if len(only_train) > 10 else ''}; "
            f"only in val: {only_val[:10]}{' ...' if len(only_val) > 10 else ''}); "
            "the class index of a label must mean the same in both splits"
        )
    if len(classes["train"]) < 2:
        # model.num_classes follows the class folders: caught here, where the user can see why.
        raise ValueError(
            f"data.root: {root / 'train'} has 1 class folder ({classes['train'][0]}); a classifier needs at least 2, "
            f"one folder per class: {root}/train/<class>/<image files>, the same in {root}/val"
        )
    return classes["train"]
