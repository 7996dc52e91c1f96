"""What a ``--ckpt_path`` is checked against before anything starts.

Lightning takes the path as given and fails on it late: after the process start-up, the data set's preparation and the
model's set-up, on every rank, in a traceback (a folder, a file cut short, a main_amp.py checkpoint, a pickle that is no
Lightning checkpoint), or not at all (a fit past the run's end trains nothing and exits 0; ``validate --ckpt_path last``
that finds nothing evaluates a randomly initialized model). :func:`check_ckpt_path` refuses those with a
:class:`config_checks.ConfigError` whose message names the path and what to pass instead, which train.py's
``ImageNetCLI`` says as the parser says its own errors (one line, exit 2), and warns of what may be meant (a rerun of a
finished job, other validation sizes than the checkpoint's fit).
"""

from __future__ import annotations

import zipfile
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from pytorch_lightning.utilities import rank_zero_warn

import config_checks
import last_checkpoint_lookup
import legacy_checkpoint
from checkpoint_model_options import model_keys_in_config_files, model_keys_on_the_command_line
from config_checks import ConfigError

try:  # Lightning's test for its model-registry checkpoint names ("registry", "registry:NAME:VERSION")
    from pytorch_lightning.utilities.model_registry import _is_registry
except ImportError:  # pragma: no cover

    def _is_registry(path: object) -> bool:
        return str(path).lower().startswith("registry")


def check_ckpt_path(config: Any, argv: Sequence[str]) -> int | None:
    """Checks the run's ``--ckpt_path`` (and its absence) before LightningCLI reads the checkpoint's options.

    LightningCLI puts the checkpoint's hyperparameters over the command line's: a different ``--model.arch`` would be
    replaced without a word, so it is refused instead (before anything is built).

    Args:
        config: The parsed configuration, the subcommand's under its name (none when the CLI runs none).
        argv: The command line's words (without the program's name): the ``--model.*`` options it names itself.

    Returns:
        The global step of a fit's checkpoint that already reached the run's ``max_steps``/``max_epochs`` (warned of):
        the fit trains nothing from it. ``None`` otherwise.

    Raises:
        ConfigError: A path Lightning would fail on, or one that would do something else than asked.
    """
    subcommand = config.get("subcommand")
    ckpt_path = config[subcommand].get("ckpt_path") if subcommand else None
    trains_nothing_after_step = None
    if ckpt_path == "last":
        trains_nothing_after_step = _check_last(config[subcommand], subcommand)
    if ckpt_path == "best":
        raise ConfigError(
            "--ckpt_path best names the best checkpoint of a fit in this same process, and this process has not "
            "trained; pass the file (e.g. .../checkpoints/best-epoch....ckpt)"
        )
    if subcommand in ("validate", "test") and not ckpt_path and not config[subcommand].model.get("weights"):
        rank_zero_warn(
            f"{subcommand} without --ckpt_path (or model.weights) evaluates a randomly initialized model; "
            "pass --ckpt_path .../checkpoints/last.ckpt to evaluate a trained one"
        )
    if not ckpt_path:
        return trains_nothing_after_step
    section = config[subcommand]
    # Lightning's own names and remote paths (s3://...) are Lightning's to resolve, and a sharded checkpoint is a
    # folder of the strategies that write one.
    sharded = any(name in str(section.trainer.strategy).lower() for name in ("fsdp", "deepspeed"))
    local = ckpt_path not in ("last", "hpc") and not _is_registry(ckpt_path) and "://" not in ckpt_path
    if local and not Path(ckpt_path).is_file() and not (sharded and Path(ckpt_path).is_dir()):
        what = "is a folder" if Path(ckpt_path).is_dir() else "does not exist"
        raise ConfigError(f"--ckpt_path {ckpt_path} {what}; pass a checkpoint file (e.g. .../checkpoints/last.ckpt)")
    if Path(ckpt_path).is_file():
        if not zipfile.is_zipfile(ckpt_path):
            with open(ckpt_path, "rb") as file:
                if file.read(4) == b"PK\x03\x04":  # a zip archive's start, without its end (the directory)
                    raise ConfigError(
                        f"--ckpt_path {ckpt_path} is cut short: a zip archive (torch.save's format) whose end is "
                        "missing, copied or synced while it was written; pass an intact checkpoint file (an "
                        "earlier one of the folder, e.g. best-*.ckpt)"
                    )
            _refuse_main_amp(ckpt_path, subcommand)  # torch < 1.6 wrote main_amp.py's files in its older format
            raise ConfigError(
                f"--ckpt_path {ckpt_path} is not a checkpoint (a checkpoint is a torch.save zip archive, "
                "e.g. .../checkpoints/last.ckpt)"
            )
        checkpoint = _lightning_checkpoint(ckpt_path, subcommand)
        if subcommand == "fit":
            at_the_end = _refuse_a_resume_past_the_end(section.trainer, ckpt_path, checkpoint)
            if at_the_end is not None:
                trains_nothing_after_step = at_the_end
        else:
            _warn_of_other_validation_sizes(section, ckpt_path, checkpoint, subcommand)
        saved = checkpoint.get("hyper_parameters", {})
        asked = section.model.arch
        # Only an arch the run names (the command line, a config file) is refused; left at its default, the
        # checkpoint's applies, as every other model option of the checkpoint does.
        named = "arch" in model_keys_on_the_command_line(argv) | model_keys_in_config_files(section)
        if named and saved.get("arch", asked) != asked:
            raise ConfigError(
                f"--ckpt_path {ckpt_path} holds a {saved['arch']} and this run asks for model.arch {asked}; "
                f"pass --model.arch {saved['arch']} (or a {asked} checkpoint)"
            )
    return trains_nothing_after_step


def _check_last(section: Any, subcommand: str) -> int | None:
    """``--ckpt_path last``: refused where it would find nothing or miss the latest state, and the file it takes
    checked as a named file is. Returns what :func:`check_ckpt_path` does."""
    if last_checkpoint_lookup.checkpoints_in_a_new_folder(section):
        raise ConfigError(last_checkpoint_lookup.no_last_checkpoint(section, subcommand))
    if missed := last_checkpoint_lookup.what_last_would_miss(section):
        raise ConfigError(missed)
    found = last_checkpoint_lookup.last_checkpoints(section)
    if not found and subcommand in ("validate", "test"):
        # Lightning warns and evaluates the randomly initialized model, exit status 0.
        raise ConfigError(
            f"--ckpt_path last: no last*.ckpt in {last_checkpoint_lookup.last_checkpoint_folder(section)}, so "
            f"{subcommand} would evaluate a randomly initialized model; "
            f"{last_checkpoint_lookup.newest_last_checkpoint(section)}"
        )
    newest = str(max(found, key=lambda path: path.stat().st_mtime)) if found else None  # what 'last' takes
    # A file that is no zip archive (cut short) is refused in the run, by a message that says what it is.
    if newest is None or not zipfile.is_zipfile(newest):
        return None
    checkpoint = _lightning_checkpoint(newest, subcommand)
    if subcommand == "fit":  # a requeued job whose run had finished (its folder fixed): as for a file
        return _refuse_a_resume_past_the_end(section.trainer, newest, checkpoint, said_as=f"last ({newest})")
    _warn_of_other_validation_sizes(section, newest, checkpoint, subcommand)
    return None


def _warn_of_other_validation_sizes(section: Any, ckpt_path: str, checkpoint: dict[str, Any], subcommand: str) -> None:
    """The validation resize and crop are the data's options, which a checkpoint does not carry over as it does
    the model's: an evaluation of a model trained at 64 pixels at the configuration's 256/224 scored something
    else (0.10 against 0.50) without a word. Evaluating at other sizes can be the point, so a warning."""
    saved = checkpoint.get("datamodule_hyper_parameters") or {}
    data = section.get("data") or {}
    differ = [
        f"data.{key} {data.get(key)} (its fit's: {saved[key]})"
        for key in ("val_resize_size", "val_crop_size")
        if key in saved and data.get(key) is not None and data.get(key) != saved[key]
    ]
    if differ:
        rank_zero_warn(
            f"--ckpt_path {ckpt_path} was validated at other sizes than this {subcommand}'s: {'; '.join(differ)}; "
            "pass its fit's to evaluate it as it was validated"
        )


def _refuse_a_resume_past_the_end(
    trainer: Any, ckpt_path: str, checkpoint: dict[str, Any], said_as: str = ""
) -> int | None:
    """A fit from a checkpoint at or past the run's trainer.max_steps/max_epochs trains nothing: Lightning restores
    it, says the limit is reached and exits 0. Past the limit that is a mistake (a refusal); at it, the rerun of a
    finished job (a warning), and the checkpoint's global step is returned (else ``None``). ``trainer``: the fit's
    trainer options; ``said_as``: how the messages name the checkpoint (``last (FILE)``), if not by ``ckpt_path``."""
    steps = int(checkpoint.get("global_step", 0))
    fit_loop = checkpoint.get("loops", {}).get("fit_loop", {})
    progress = fit_loop.get("epoch_progress", {}).get("current", {})
    epochs = int(progress.get("processed", 0))  # epochs whose every batch trained
    last_batch = fit_loop.get("epoch_loop.batch_progress", {}).get("is_last_batch")
    if last_batch and epochs == progress.get("started", 0) - 1:
        epochs += 1  # saved at the end of an epoch's last batch, before the epoch's end: Lightning counts it done
    limits = [("trainer.max_steps", trainer.get("max_steps"), steps, "steps"),
              ("trainer.max_epochs", trainer.get("max_epochs"), epochs, "epochs")]  # fmt: skip
    _refuse_a_resume_past_the_time_limit(trainer, said_as or ckpt_path, checkpoint)
    for key, limit, done, unit in limits:
        if limit is None or limit < 0 or done < limit:
            continue
        said = (
            f"--ckpt_path {said_as or ckpt_path} has trained {done} {unit} and this run ends at {key} {limit}: "
            f"nothing would train; raise {key} to train on, or evaluate it: python train.py validate ... "
            f"--ckpt_path {ckpt_path}"
        )
        if done > limit:
            raise ConfigError(said)
        rank_zero_warn(said)
        return steps
    return None


def _refuse_a_resume_past_the_time_limit(trainer: Any, ckpt_path: str, checkpoint: dict[str, Any]) -> None:
    """Lightning counts ``trainer.max_time`` over every resume (its Timer's elapsed time travels in the
    checkpoint): a run stopped by it and resumed with the same limit restored, trained nothing and exited 0, which
    a retry loop or a SLURM ``afterok`` takes for a finished job."""
    max_time = trainer.get("max_time")
    if max_time is None:
        return
    limit = config_checks.max_time_seconds(max_time)
    timer_state = next((v for k, v in checkpoint.get("callbacks", {}).items() if str(k).startswith("Timer")), {})
    elapsed = float(timer_state.get("time_elapsed", {}).get("train", 0.0) or 0.0)
    if limit is not None and elapsed >= limit:
        raise ConfigError(
            f"--ckpt_path {ckpt_path} has trained for {timedelta(seconds=int(elapsed))} and this run ends at "
            f"trainer.max_time {timedelta(seconds=int(limit))}, counted over every resume: nothing would train; "
            "raise trainer.max_time by the time this submission may take (e.g. the elapsed time plus its length)"
        )


def _lightning_checkpoint(ckpt_path: str, subcommand: str) -> dict[str, Any]:
    """The checkpoint at ``ckpt_path`` (tensors memory-mapped), refused unless Lightning wrote it: Lightning would
    otherwise fail on every rank with ``KeyError: 'pytorch-lightning_version'``, after the process start-up, the data
    set's preparation and the model's set-up."""
    try:
        saved = torch.load(ckpt_path, weights_only=True, map_location="cpu", mmap=True)
    except Exception as error:  # noqa: BLE001 - pickled objects beyond tensors and containers, a torn archive
        _refuse_main_amp(ckpt_path, subcommand)  # one that needs full unpickling
        raise ConfigError(
            f"--ckpt_path {ckpt_path} cannot be read as a checkpoint ({type(error).__name__}); pass a checkpoint "
            "this application wrote (e.g. .../checkpoints/last.ckpt)"
        ) from error
    if isinstance(saved, dict) and "pytorch-lightning_version" in saved:
        return saved
    _refuse_main_amp(ckpt_path, subcommand)
    found = f"keys {sorted(map(str, saved))[:8]}" if isinstance(saved, dict) else f"a {type(saved).__name__}"
    raise ConfigError(
        f"--ckpt_path {ckpt_path} is not a Lightning checkpoint (it has no 'pytorch-lightning_version' entry; "
        f"found {found}); pass a checkpoint this application wrote (e.g. .../checkpoints/last.ckpt)"
    )


def _refuse_main_amp(ckpt_path: str, subcommand: str) -> None:
    """Refuses a main_amp.py checkpoint, saying how to resume it, if ``ckpt_path`` is one. Its Lightning checkpoint
    depends on the run (steps per epoch, global batch), so the main_amp.py command line that resumes it converts it
    (apex_compat.py, legacy_checkpoint.py)."""
    if not legacy_checkpoint.is_legacy_checkpoint(ckpt_path):
        return
    try:
        legacy = legacy_checkpoint.load_legacy(ckpt_path, lazy=True)
    except legacy_checkpoint.CheckpointConversionError as error:
        raise ConfigError(f"--ckpt_path {error}") from error
    arch = legacy.arch or "ARCH"
    what = f"--ckpt_path {ckpt_path} is a main_amp.py checkpoint ({arch}, {legacy.epochs_done}), not a Lightning one"
    if subcommand in ("validate", "test"):
        raise ConfigError(
            f"{what}; evaluate it with main_amp.py's flags, as its -e did: python train.py -e -a {arch} --resume "
            f"{ckpt_path} DATA_DIR (train.py options such as --trainer.devices may follow)"
        )
    raise ConfigError(
        f"{what}; resume it with main_amp.py's flags: python train.py -a {arch} --b BATCH --resume {ckpt_path} "
        "DATA_DIR (train.py options such as --trainer.devices may follow). That converts it for the run into "
        f"{legacy_checkpoint.converted_path(ckpt_path)}, which --ckpt_path takes afterwards"
    )
