"""Which errors train.py says in one line instead of a traceback, and their line.

A check of the configuration (a key's value the data, the world size or Lightning refuses) is said as the parser says
its own errors (``error: <key> ...``, exit 2) by train.py's ``ImageNetCLI``, and a bad image as ``train.py: error: bad
image ...`` (exit 1) by its ``__main__`` block: the traceback through jsonargparse, Lightning's loops or a loader
worker says nothing the message does not. Anything else keeps its traceback.
"""

from __future__ import annotations

import inspect
import re
import traceback
from pathlib import Path

import pytorch_lightning as pl
from lightning_fabric.utilities.exceptions import MisconfigurationException

from cli_names import SECTIONS
from image_loading import BadImageError

#: The first part of every configuration key (and --ckpt_path): a ValueError or FileNotFoundError that starts with one
#: (``data.batch_size must be >= 1``) is a check of the configuration, said as the parser says its own errors.
CONFIG_SECTIONS = (*(f"{section}." for section in SECTIONS), "--ckpt_path ")


def trainer_argument_line(error: Exception) -> str | None:
    """The line for an error raised while the ``Trainer`` is built: Lightning's checks of its arguments (devices 0,
    an unknown strategy, max_epochs -5; devices -2 on the CPU is a TypeError) name the argument. ``None`` for one from
    elsewhere (a plugin of the user's, an environment variable's parse), which keeps its traceback."""
    raised_in = traceback.extract_tb(error.__traceback__)[-1].filename
    if not isinstance(error, MisconfigurationException) and not in_lightning(raised_in):
        return None
    hint = ""
    if re.search(r"\bdevices\b", str(error)):  # Lightning's message does not say what is valid
        on_cpu = re.search(r"\bcpu\b|CPUAccelerator", str(error), re.IGNORECASE)
        valid = "a count >= 1 or auto" if on_cpu else "a count >= 1, -1 for every GPU, a list like [0, 1], or auto"
        hint = f" (trainer.devices: {valid})"
    return f"trainer: {error}{hint}"


def setup_error_line(error: BaseException) -> str | None:
    """The line for an error raised by a check in set-up, which needs the data or the world size (a batch larger than
    a rank's share of the images, a profiled rank past the world size), or by Lightning's own checks of a trainer
    option against the data (```val_check_interval` (1000) must be ...``, said with ``trainer.`` before it). ``None``
    for any other, which keeps its traceback."""
    said = str(error).strip()
    option = trainer_option_named_by(error)
    if option is not None:
        return f"trainer.{option}: {said}"
    return said if said.startswith(CONFIG_SECTIONS) else None


def trainer_option_named_by(error: BaseException) -> str | None:
    """The ``Trainer`` argument that a check of Lightning's while it sets up the data names in backquotes
    (```val_check_interval` (1000) must be ...``), when Lightning raised ``error`` there; else ``None`` (an error
    during training keeps its traceback)."""
    frames = traceback.extract_tb(error.__traceback__) if error.__traceback__ else []
    if not frames or not in_lightning(frames[-1].filename):
        return None
    if not any(frame.name == "setup_data" and in_lightning(frame.filename) for frame in frames):
        return None
    options = set(inspect.signature(pl.Trainer.__init__).parameters) - {"self"}
    return next((name for name in re.findall(r"`(\w+)", str(error)) if name in options), None)


def in_lightning(filename: str) -> bool:
    """Whether ``filename`` is a file of Lightning's packages."""
    parts = Path(filename).parts
    return "pytorch_lightning" in parts or "lightning_fabric" in parts or "lightning" in parts


def bad_image_line(error: BadImageError) -> str:
    """The error's message as one line: from a loader worker the message is the worker's whole traceback, whose last
    line holds it after ``BadImageError: ``."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    quoted = [line.split("BadImageError: ", 1)[1] for line in lines if "BadImageError: " in line]
    return quoted[-1] if quoted else " ".join(lines)
