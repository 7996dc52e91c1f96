"""The checks of a run's options that need neither the data nor a checkpoint, made before anything is built.

Each refuses with a :class:`ConfigError` whose message names the key, the value and what is valid; train.py's
``ImageNetCLI`` says it as the parser says its own errors (one line, exit 2). Lightning takes many of these values as
given and fails on them late (a checkpoint file name's format after the first epoch and its validation, a
``val_check_interval`` of 0 after the first step) or in a traceback that names no section (ModelCheckpoint's own
checks), or does something else than asked (an empty path is the current folder).
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import re
from pathlib import Path
from typing import Any

import torch
from lightning_fabric.utilities.exceptions import MisconfigurationException
from pytorch_lightning.callbacks import Timer
from pytorch_lightning.utilities import rank_zero_warn

import shapes_dataset
from callbacks.bad_images import TRAIN_BAD_IMAGES, VAL_BAD_IMAGES
from callbacks.resumable_checkpoint import ResumableCheckpoint
from checkpoint_io import why_unwritable
from imagenet_module import LOGGED_METRICS

#: The keys that name a file or folder: an empty string is refused.
PATH_KEYS = (
    "ckpt_path", "data.root", "model.weights", "trainer.default_root_dir", "trainer.logger.init_args.save_dir",
    "checkpoint.dirpath", "last_checkpoint.dirpath", "preemption.dirpath", "profile.trace_dir",
)  # fmt: skip
#: The checkpoint folders a fit writes to (``None``: the logger's run folder).
FIT_OUTPUT_FOLDERS = ("checkpoint.dirpath", "last_checkpoint.dirpath", "preemption.dirpath")


class ConfigError(ValueError):
    """An option that would fail later or do something else than asked; the message names it."""


def check_parsed(config: Any) -> None:
    """Right after the parse, before LightningCLI reads a checkpoint or seeds: empty paths, ``~`` in the paths
    (expanded in ``config``) and the seed's range. ``config``: the subcommand's."""
    for key in PATH_KEYS:
        *parents, name = key.split(".")
        parent = config
        for part in parents:
            parent = parent.get(part) if hasattr(parent, "get") else None
        value = parent.get(name) if hasattr(parent, "get") else None
        if not isinstance(value, str):
            continue
        if not value.strip():
            # An unset $VAR in a job script: the current folder to Lightning (last.ckpt landed there), no file to
            # torchvision (model.weights "" trained from random weights).
            option = "--ckpt_path" if key == "ckpt_path" else key
            raise ConfigError(
                f"{option} is an empty string (an unset environment variable?): give a path, or leave it out for its "
                "default"
            )
        # ~ is the home folder, as Lightning's checkpoint paths have it: for this app's own reads of the paths too
        # (the logger's metrics rewrite, --ckpt_path last's search, the data folder), and in the saved config.
        parent[name] = os.path.expanduser(value)
    # LightningCLI seeds before the classes are built, from a value it does not check: a traceback.
    seed = config.get("seed_everything")
    if not isinstance(seed, bool) and isinstance(seed, int) and not 0 <= seed <= 2**32 - 1:
        raise ConfigError(
            f"seed_everything must be in 0..4294967295 (numpy's seeds), or true for a random one; got {seed}"
        )


def check_before_build(config: Any, subcommand: str | None) -> None:
    """Before the classes are built: every check below for ``subcommand`` (``None``: fit), on its ``config``."""
    _check_sections(config)
    _check_folders(config, subcommand)
    _check_checkpoint_options(config)
    if subcommand in (None, "fit"):
        _check_training_options(config)
    _check_trainer(config.trainer)


def _check_sections(config: Any) -> None:
    """A config file's section whose keys are all commented out (``profile:`` then ``#  start_step: 20``) is a
    YAML null, which the parser takes: it reached the checks below as an AttributeError."""
    for key in ("trainer", "profile", "checkpoint", "last_checkpoint", "preemption"):
        if key in config and config.get(key) is None:
            raise ConfigError(
                f"{key}: the section is empty (null) in a config file: every key under it commented out? Remove "
                f"the line '{key}:' or give it keys"
            )


def logger_init_args(config: Any) -> Any:
    """The ``init_args`` of the configuration's ``trainer.logger`` (empty without a logger, or with several)."""
    return _init_args(config.trainer.get("logger"))


def _init_args(value: Any) -> Any:
    """The ``init_args`` of a ``class_path`` value of the configuration (empty for a name, a list or none)."""
    return value.get("init_args", {}) if hasattr(value, "get") else {}


def _check_folders(config: Any, subcommand: str | None) -> None:
    """Every folder the run will write to must be one it can write to: found now, not at the first checkpoint
    save after an epoch of training (or when the profiling window closes)."""
    init = logger_init_args(config)
    folders = {"trainer.default_root_dir": config.trainer.get("default_root_dir"),
               "trainer.logger.init_args.save_dir": init.get("save_dir")}  # fmt: skip
    if subcommand in (None, "fit"):
        folders |= {key: config.get(key.split(".")[0], {}).get("dirpath") for key in FIT_OUTPUT_FOLDERS}
        if config.get("profile", {}).get("torch_profiler"):
            folders["profile.trace_dir"] = config.profile.get("trace_dir")
    root = config.get("data", {}).get("root")
    if config.get("data", {}).get("source") == "generated" and root and not shapes_dataset.is_complete(root):
        folders["data.root"] = root  # drawn there (a complete one, on read-only storage too, is only read)
    for key, folder in folders.items():
        if not folder or "://" in str(folder):  # unset, or a remote filesystem (fsspec) Lightning writes to
            continue
        unwritable = why_unwritable(Path(str(folder)))
        if unwritable:
            raise ConfigError(f"{key} {folder}: {unwritable}; pass a folder this job can write to")
    if "data.root" in folders:
        problem = shapes_dataset.why_it_cannot_be_drawn(str(root))
        if problem:
            raise ConfigError(f"data.root {root} {problem} (data.source: generated draws the dataset there)")


def _check_checkpoint_options(config: Any) -> None:
    """The checkpoint sections' values that Lightning's ModelCheckpoint refuses when the classes are built, there
    in a traceback that does not say which of the two sections is wrong (``every_n_train_steps=-1``, every_n_*
    and train_time_interval together, ``save_top_k 3`` without a monitor): a callback built here first, each
    refusal prefixed with its section. For every subcommand: validate and test build them too."""
    for section in ("checkpoint", "last_checkpoint"):
        options = config.get(section)
        if options is None:
            continue
        if options.get("mode") not in (None, "min", "max"):
            raise ConfigError(f"{section}.mode must be min or max, got {options.get('mode')!r}")
        if options.get("save_top_k") is not None and options.get("save_top_k") < -1:
            raise ConfigError(f"{section}.save_top_k must be >= -1 (-1: every checkpoint), got {options['save_top_k']}")
        arguments = options.as_dict() if hasattr(options, "as_dict") else dict(options)
        try:
            ResumableCheckpoint(**arguments)
        except (MisconfigurationException, ValueError, TypeError) as error:
            raise ConfigError(f"{section}: {error}") from None


def _check_training_options(config: Any) -> None:
    """Options that Lightning takes as given and that fail (or train wrong) only later: a monitored metric the
    module never logs fails after the first epoch and its validation; a negative clip value turns the gradient
    around; no accumulation divides by zero in the learning-rate schedule."""
    trainer = config.trainer
    clip = trainer.get("gradient_clip_val")
    if clip is not None and not clip >= 0:  # NaN included
        raise ConfigError(f"trainer.gradient_clip_val must be >= 0 (0 or null: no clipping), got {clip}")
    accumulate = trainer.get("accumulate_grad_batches")
    if accumulate is not None and accumulate < 1:
        raise ConfigError(f"trainer.accumulate_grad_batches must be >= 1 (1: a step per batch), got {accumulate}")
    # Both divide by their value: a ZeroDivisionError after the first step or in the sanity check.
    interval = trainer.get("val_check_interval")
    # A number of batches or a fraction; a time ("00:00:10:00", {minutes: 10}) is Lightning's to check.
    if isinstance(interval, int | float) and not isinstance(interval, bool) and not interval > 0:
        raise ConfigError(
            f"trainer.val_check_interval must be > 0 (an int: every N batches; a float: that fraction of an "
            f"epoch), got {interval}; to validate less often, trainer.check_val_every_n_epoch"
        )
    every = trainer.get("check_val_every_n_epoch")
    if every is not None and every < 1:
        raise ConfigError(
            f"trainer.check_val_every_n_epoch must be >= 1 (or null with an int val_check_interval), got {every}; "
            "no validation: --trainer.limit_val_batches 0"
        )
    max_time = trainer.get("max_time")
    if max_time is not None:
        limit = max_time_seconds(max_time)
        if limit is None:  # Lightning's own words named neither the key nor, for a dict, what it takes
            raise ConfigError(
                f"trainer.max_time {max_time!r} is not a duration: give DD:HH:MM:SS (e.g. 00:12:00:00) or a mapping "
                "of days, hours, minutes, seconds ({hours: 12})"
            )
        if limit <= 0:
            raise ConfigError(
                f"trainer.max_time must be more than 0 (DD:HH:MM:SS, or {{minutes: N}}), got {max_time}: nothing "
                "would train"
            )
    # Metrics logged by callbacks of the user's own could be monitored too: then a warning, not a refusal.
    theirs = bool(trainer.get("callbacks"))
    known = (*LOGGED_METRICS, TRAIN_BAD_IMAGES, VAL_BAD_IMAGES)
    for section in ("checkpoint", "last_checkpoint"):
        options = config.get(section) or {}
        if problem := _filename_format_problem(options.get("filename") or ""):
            raise ConfigError(
                f"{section}.filename {options['filename']!r}: {problem}; a metric is a float (e.g. "
                "{val_acc1:.4f}), epoch and step are ints (e.g. {epoch:03d})"
            )
        names = [(f"{section}.monitor", options.get("monitor"))]
        names += [(f"{section}.filename", name) for name in _placeholders(options.get("filename") or "")]
        for key, name in names:
            if name is None or name in known or name in ("epoch", "step"):  # Lightning gives a callback both
                continue
            # The closest name, the first listed among equals (val_acc: val_acc1, not val_acc5).
            score = {k: difflib.SequenceMatcher(None, name, k).ratio() for k in known}
            close = max(known, key=lambda k: (score[k], -known.index(k)))
            guess = f"; did you mean {close!r}?" if score[close] >= 0.6 else ""
            logged = ", ".join(LOGGED_METRICS)
            said = f"{key} names {name!r}, which this module does not log{guess} (it logs: {logged})"
            if not theirs:
                raise ConfigError(said)
            rank_zero_warn(said + "; fine if a callback of trainer.callbacks logs it")


def max_time_seconds(max_time: Any) -> float | None:
    """``trainer.max_time`` (``DD:HH:MM:SS``, a dict of timedelta's keys, a timedelta) in seconds, as Lightning's Timer
    reads it; ``None`` for a value it refuses."""
    try:
        return Timer(duration=max_time)._duration
    except (MisconfigurationException, TypeError, ValueError, OverflowError):  # Overflow: days past timedelta's
        return None


def _check_trainer(trainer: Any) -> None:
    """The trainer's options that Lightning refuses in a traceback or on which it trains otherwise than asked."""
    if trainer.get("enable_checkpointing") is False:
        raise ConfigError(
            "trainer.enable_checkpointing false: this app always adds its two checkpoint callbacks (checkpoint: "
            "the best by val_acc1; last_checkpoint: last.ckpt, which resumes exactly), which Lightning then "
            "refuses; to save no checkpoint, --checkpoint.save_top_k 0 --last_checkpoint.save_top_k 0"
        )
    strategy = trainer.get("strategy")
    if isinstance(strategy, str):
        start_method = "spawn" if "spawn" in strategy else None
    else:
        start_method = _init_args(strategy).get("start_method")
    if start_method in ("spawn", "forkserver"):
        # Lightning then pickles the trainer, the model and the data module to start each rank, and the data module
        # holds its live prefetchers: a 40-line pickling traceback once the ranks start.
        named = strategy if isinstance(strategy, str) else f"with start_method {start_method}"
        raise ConfigError(
            f"trainer.strategy {named}: a {start_method} start pickles the trainer and the data module for each "
            "rank, and this app's data module holds its live prefetchers; use --trainer.strategy ddp (Lightning "
            "starts each rank by running train.py again), or torchrun"
        )
    deterministic = trainer.get("deterministic")
    if trainer.get("benchmark") and deterministic:
        # PyTorch ignores cudnn.deterministic when benchmark is on, and Lightning only warns: the run would not be
        # deterministic as asked (cuDNN's timed algorithm choice can differ from run to run).
        named = str(deterministic).lower() if isinstance(deterministic, bool) else deterministic
        raise ConfigError(
            f"trainer.benchmark true with trainer.deterministic {named}: cuDNN's timed "
            "algorithm choice would make the run nondeterministic; set trainer.benchmark null (the default: on, "
            "off with deterministic) or false"
        )
    precision = str(trainer.precision)
    if precision.startswith("transformer-engine") and importlib.util.find_spec("transformer_engine") is None:
        raise ConfigError(
            f"trainer.precision {precision} needs NVIDIA Transformer Engine, which is not installed; valid here: "
            "bf16-mixed, 16-mixed (CUDA), 32-true"
        )
    accelerator = str(trainer.accelerator)
    mps = accelerator == "gpu" and torch.backends.mps.is_available()  # Lightning's "gpu" is also Apple's
    if accelerator in ("gpu", "cuda") and not torch.cuda.is_available() and not mps:
        raise ConfigError(
            f"trainer.accelerator {accelerator} needs a CUDA GPU and this machine shows none "
            "(torch.cuda.is_available() is False); pass --trainer.accelerator cpu (or auto)"
        )
    on_cpu = accelerator == "cpu" or (accelerator == "auto" and not torch.cuda.is_available())
    if on_cpu and precision == "16-true":
        rank_zero_warn(
            "trainer.precision 16-true on the CPU: fp16 convolutions are slower there than fp32 (2 quickstart "
            "steps on 2 cores: 33 s against 16 s, start-up included); bf16-mixed or 32-true for CPU runs"
        )
    if on_cpu and precision in ("16-mixed", "16"):
        # Lightning would warn and silently train in bf16 instead: a different run than the one asked for.
        raise ConfigError(
            f"trainer.precision {precision} (fp16 autocast) needs a CUDA GPU and this run is on the CPU; "
            "valid here: bf16-mixed, 32-true"
        )


#: A ``{name}`` or ``{name:format}`` field of a ModelCheckpoint file name.
_FIELD = re.compile(r"\{([^{}:]+)(?::([^{}]*))?\}")


def _filename_format_problem(filename: str) -> str | None:
    """What fails when Lightning formats a checkpoint ``filename`` (its ``{name:format}`` fields: ints for epoch and
    step, float tensors for metrics), or ``None``. Found after the first epoch and its validation otherwise."""
    for match in _FIELD.finditer(filename):
        name, spec = match.group(1).strip(), match.group(2) or ""
        value = 0 if name in ("epoch", "step") else 0.5
        try:
            format(value, spec)
        except (ValueError, TypeError) as error:
            return f"{match.group(0)} cannot format {'an int' if isinstance(value, int) else 'a float'} ({error})"
    rest = _FIELD.sub("", filename)
    if "{" in rest or "}" in rest:
        return "a { or } that opens or closes no {name} field"
    return None


def _placeholders(filename: str) -> list[str]:
    """The metric names of a ``ModelCheckpoint`` file name's ``{name}`` and ``{name:format}`` fields."""
    return [match.group(1).strip() for match in _FIELD.finditer(filename)]
