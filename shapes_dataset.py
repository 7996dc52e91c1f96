"""The embedded dataset: an ImageNet-layout folder of JPEG shapes the project generates itself.

The quickstart must train for real on a machine with no internet and no ImageNet, so the project draws its
own: ten classes, each a shape drawn in its own hue band on a noisy background, at a random position, size
and rotation. Shape *and* colour separate the classes, so a small ResNet learns them in a few CPU epochs,
while the jitter keeps the task from being a lookup table. The split is fixed by the seed: the same seed
always gives the same files.

Generation writes into a temporary sibling folder and renames it into place only when complete, so an
interrupted run never leaves a half-written dataset that a later run would mistake for a finished one.
"""

from __future__ import annotations

import glob
import json
import math
import os
import shutil
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

#: Class names, in the order ImageFolder sorts them (alphabetical), each with its base hue in degrees.
CLASSES: dict[str, int] = {
    "checker": 0,
    "circle": 36,
    "cross": 72,
    "diamond": 108,
    "hstripes": 144,
    "ring": 180,
    "square": 216,
    "star": 252,
    "triangle": 288,
    "vstripes": 324,
}

#: Written last, inside the folder, as the mark of a complete dataset.
MANIFEST = "shapes_dataset.json"


def _hsv_to_rgb(h: float, s: float, v: float) -> tuple[int, int, int]:
    h = (h % 360) / 60.0
    c = v * s
    x = c * (1 - abs(h % 2 - 1))
    r, g, b = [(c, x, 0), (x, c, 0), (0, c, x), (0, x, c), (x, 0, c), (c, 0, x)][int(h) % 6]
    m = v - c
    return tuple(int(round(255 * (ch + m))) for ch in (r, g, b))  # type: ignore[return-value]


def _polygon(cx: float, cy: float, radius: float, n: int, angle: float, inner: float | None = None) -> list:
    points = []
    steps = n * 2 if inner else n
    for k in range(steps):
        r = radius if (inner is None or k % 2 == 0) else radius * inner
        a = angle + 2 * math.pi * k / steps
        points.append((cx + r * math.cos(a), cy + r * math.sin(a)))
    return points


def draw_sample(name: str, size: int, rng: np.random.Generator) -> Image.Image:
    """Draws one image of class ``name`` (a key of :data:`CLASSES`) as an RGB PIL image ``size`` x ``size``."""
    background = rng.integers(0, 90, size=(size, size, 3), dtype=np.uint8)
    background += rng.integers(0, 40, size=(1, 1, 3), dtype=np.uint8)
    image = Image.fromarray(background, "RGB")
    draw = ImageDraw.Draw(image)
    hue = CLASSES[name] + rng.uniform(-12, 12)
    color = _hsv_to_rgb(hue, rng.uniform(0.7, 1.0), rng.uniform(0.8, 1.0))
    radius = size * rng.uniform(0.25, 0.4)
    cx = size / 2 + rng.uniform(-0.12, 0.12) * size
    cy = size / 2 + rng.uniform(-0.12, 0.12) * size
    angle = rng.uniform(0, 2 * math.pi)
    box = (cx - radius, cy - radius, cx + radius, cy + radius)
    if name == "circle":
        draw.ellipse(box, fill=color)
    elif name == "ring":
        draw.ellipse(box, outline=color, width=max(2, int(radius * 0.3)))
    elif name == "square":
        draw.polygon(_polygon(cx, cy, radius, 4, angle), fill=color)
    elif name == "diamond":
        draw.polygon(_polygon(cx, cy, radius, 4, math.pi / 4 + rng.uniform(-0.2, 0.2)), fill=color)
    elif name == "triangle":
        draw.polygon(_polygon(cx, cy, radius, 3, angle), fill=color)
    elif name == "star":
        draw.polygon(_polygon(cx, cy, radius, 5, angle, inner=0.45), fill=color)
    elif name == "cross":
        w = radius * 0.35
        draw.rectangle((cx - radius, cy - w, cx + radius, cy + w), fill=color)
        draw.rectangle((cx - w, cy - radius, cx + w, cy + radius), fill=color)
    elif name in ("hstripes", "vstripes"):
        period = max(4, int(size * rng.uniform(0.1, 0.16)))
        for k in range(0, size, period):
            if name == "hstripes":
                draw.rectangle((0, k, size, k + period // 2), fill=color)
            else:
                draw.rectangle((k, 0, k + period // 2, size), fill=color)
    elif name == "checker":
        cell = max(4, int(size * rng.uniform(0.12, 0.2)))
        for y in range(0, size, cell):
            for x in range(0, size, cell):
                if (x // cell + y // cell) % 2 == 0:
                    draw.rectangle((x, y, x + cell - 1, y + cell - 1), fill=color)
    else:
        raise ValueError(f"unknown shape class {name!r}; valid: {sorted(CLASSES)}")
    return image


def is_complete(root: str | os.PathLike) -> bool:
    """Whether ``root`` holds a finished dataset (its manifest is written last)."""
    return (Path(root) / MANIFEST).is_file()


def why_it_cannot_be_drawn(root: str | os.PathLike) -> str | None:
    """Why the dataset cannot be drawn into ``root`` (``None``: it can, or it is complete). It is drawn beside
    ``root`` and renamed onto it when finished, so ``root`` must be missing or an empty folder that a rename can
    replace (a symbolic link to a folder stands for that folder); not a mount point, not a folder of other files."""
    root = Path(root)
    target = root.resolve() if root.is_symlink() else root
    if is_complete(target) or not target.exists():
        return None
    if not target.is_dir():
        return "is a file; point data.root at a missing or empty folder"
    if any(target.iterdir()):
        return (
            f"exists and is not a generated shapes dataset (no {MANIFEST}); point data.root at an empty or missing "
            "folder, or use data.source: folder for your own images"
        )
    if os.path.ismount(target):
        return (
            "is a mount point: the dataset is drawn beside it and renamed into its place when finished, which "
            f"cannot replace a mount point; point data.root at a folder inside it, e.g. {root / 'shapes10'}"
        )
    return None


#: A staging folder not written to for this long belongs to a killed draw (one draws a class in about a second).
ABANDONED_AFTER_S = 600.0


def _remove_abandoned_drafts(root: Path) -> None:
    """Removes the staging folders (``.<name>.partial-*`` beside ``root``) of draws killed before they published."""
    now = time.time()
    for staging in root.parent.glob(glob.escape(f".{root.name}.partial-") + "*"):
        try:
            newest = max([staging.stat().st_mtime, *(p.stat().st_mtime for p in staging.rglob("*"))])
        except OSError:  # published or removed meanwhile by the process drawing it
            continue
        if now - newest >= ABANDONED_AFTER_S:
            shutil.rmtree(staging, ignore_errors=True)


def _manifest_seed(root: Path) -> int | None:
    try:
        return json.loads((root / MANIFEST).read_text()).get("seed")
    except (OSError, ValueError, AttributeError):
        return None


def generate(
    root: str | os.PathLike,
    train_per_class: int = 160,
    val_per_class: int = 40,
    image_size: int = 80,
    seed: int = 0,
    quality: int = 90,
) -> Path:
    """Writes ``root/train/<class>/*.JPEG`` and ``root/val/<class>/*.JPEG`` unless ``root`` is already complete.

    Args:
        root: Folder to create. Its parent is created if needed.
        train_per_class: Training images per class.
        val_per_class: Validation images per class.
        image_size: Side of each square image, in pixels.
        seed: Seed of the whole dataset; the same seed gives byte-identical files.
        quality: JPEG quality.

    Returns:
        The dataset folder.

    Raises:
        FileExistsError: ``root`` exists and cannot take the dataset (:func:`why_it_cannot_be_drawn`): a file, a
            folder of other files, a mount point.
    """
    given = Path(root)
    root = given.resolve() if given.is_symlink() else given  # a link to a folder: drawn into that folder
    _remove_abandoned_drafts(root)
    if is_complete(root):
        drawn_with = _manifest_seed(root)
        if drawn_with is not None and drawn_with != seed:
            # Nothing is drawn again over a finished dataset: say which data this run trains on.
            warnings.warn(
                f"{root} holds the shapes dataset drawn with seed {drawn_with}, and this run asks for seed {seed}: it "
                "trains on that one (the seed still sets the order and the crops); for the data of seed "
                f"{seed}, point data.root at a new folder",
                stacklevel=2,
            )
        return given
    problem = why_it_cannot_be_drawn(given)
    if problem:
        raise FileExistsError(f"{given} {problem}")
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{root.name}.partial-", dir=root.parent))
    try:
        rng = np.random.default_rng(seed)
        for split, count in (("train", train_per_class), ("val", val_per_class)):
            for name in CLASSES:
                folder = staging / split / name
                folder.mkdir(parents=True)
                for k in range(count):
                    draw_sample(name, image_size, rng).save(folder / f"{name}_{k:05d}.JPEG", quality=quality)
        manifest = {
            "classes": list(CLASSES),
            "train_per_class": train_per_class,
            "val_per_class": val_per_class,
            "image_size": image_size,
            "seed": seed,
        }
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        # mkdtemp makes the folder private (0700); published, it is a folder like any other (0777 less the umask), so
        # that other users, or jobs of another uid on shared storage, can read it.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(staging, 0o777 & ~umask)
        try:
            try:
                root.rmdir()  # empty (checked above); rename cannot replace a directory
            except FileNotFoundError:
                pass  # absent, or removed by another process drawing it at the same time
            os.replace(staging, root)
        except OSError:
            # Another process drew the same dataset at the same time (two runs started together, or one per node
            # on a shared file system) and published it first: theirs is as good as ours.
            if not is_complete(root):
                raise
            shutil.rmtree(staging, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return given
