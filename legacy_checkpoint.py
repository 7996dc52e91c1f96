"""Checkpoints of apex's ``main_amp.py`` (``checkpoint.pth.tar``, ``model_best.pth.tar``) as Lightning checkpoints.

The original saved, after each epoch::

    {"epoch": epoch + 1, "arch": args.arch, "state_dict": model.state_dict(), "best_prec1": best_prec1,
     "optimizer": optimizer.state_dict()}

``state_dict`` carries ``module.`` prefixes when the model ran under (apex) DistributedDataParallel; ``epoch`` is the
number of finished epochs, the epoch the original resumed at. :func:`convert` turns such a file into
``<name>.lightning.ckpt`` next to it, which ``python train.py fit --ckpt_path`` resumes from (at epoch ``epoch``,
with the optimizer's momentum buffers and the learning-rate schedule at the same point) and
``python train.py validate --ckpt_path`` evaluates.

How the Lightning checkpoint is built, and why this way:

* The step counters of a Lightning checkpoint depend on the run, not only on the legacy file: the global step is
  ``epoch * steps_per_epoch``, and steps per epoch follow from the dataset size, the per-device batch, the world
  size, ``trainer.limit_train_batches`` and ``trainer.accumulate_grad_batches``; the learning rate is scaled by the
  global batch. So the conversion instantiates the application's own objects from the run's command line
  (LightningCLI with ``run=False``: the same ``ImageNetClassifier``, ``ImageNetDataModule`` and ``Trainer``
  configuration the run builds), sizes the training loader with the data module itself and Lightning's own
  ``limit_train_batches`` rule, and calls the module's own ``configure_optimizers`` through Lightning's parser.
  Nothing about the schedule or the data path is re-implemented here, so it cannot drift from the run.
* No ``Trainer.fit`` runs for the conversion: a fit would set up the strategy (a second DDP initialization under
  torchrun, a process launch with ``--trainer.devices N``) for what is arithmetic on one process. Instead the
  counters are set on the unattached trainer's real loop objects and their ``state_dict()`` is stored, so the
  ``loops`` entry has exactly the structure this Lightning version reads back.
* The counters describe a run that has finished ``epoch`` epochs and not started the next one (every epoch counter
  at ``epoch``; batch, optimizer-step and scheduler-step totals at ``epoch`` times their per-epoch counts; the
  per-epoch ``current`` counters at 0). Lightning resumes that state by starting epoch ``epoch`` from its first batch,
  as the original did, with ``global_step = epoch * steps_per_epoch``.
* Optimizer: the run's own SGD state_dict with the legacy momentum buffers put in (parameters matched by position,
  which is ``model.parameters()`` order in both programs, shapes checked). The hyperparameters (momentum, weight
  decay, learning rate) are the run's, as configured on the command line. The LR scheduler is advanced to the
  resume step (``LambdaLR`` directly, others by stepping), so its ``last_epoch``, ``_last_lr`` and the optimizer's
  current learning rate are what an uninterrupted run would have at that step.

Under torchrun every process runs the conversion entry point: local rank 0 converts, the other local ranks wait for
the file. The output is written to a temporary file in the same folder and renamed into place (``os.replace``), so
no process ever loads half a checkpoint. The file records a key of its inputs (source file, command line with the
content of its ``--config`` files and the resolved data folder, world size); a later run with the same inputs reuses
it instead of converting again.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from atomic_files import atomic_torch_save
from cli_names import LIGHTNING_SUBCOMMANDS
from epoch_steps import optimizer_steps_per_epoch

#: Key of the conversion record inside a converted checkpoint.
RECORD_KEY = "apex_main_amp"
#: Bumped when the layout of converted checkpoints changes, so older conversions are redone.
FORMAT_VERSION = 2
#: Suffixes stripped from the source name before ``.lightning.ckpt`` is appended.
_SOURCE_SUFFIXES = (".pth.tar", ".pth", ".pt", ".tar")


class CheckpointConversionError(ValueError):
    """A main_amp.py checkpoint cannot be used for the requested run; the message says why and what to do."""


@dataclass
class LegacyCheckpoint:
    """The content of a main_amp.py checkpoint.

    Attributes:
        path: The file it was read from.
        epoch: Finished epochs (the original resumed at this 0-based epoch).
        arch: The ``-a/--arch`` it was trained with, or ``None`` when the file has no ``arch`` entry.
        state_dict: The torchvision model's weights, ``module.`` prefixes removed.
        best_prec1: Best top-1 validation accuracy in percent so far, or ``None``.
        optimizer: The SGD ``state_dict``, or ``None`` when the file has none.
        amp_state: The file has apex amp's state (``'amp'``: the loss scalers), which is not carried over.
    """

    path: Path
    epoch: int
    arch: str | None
    state_dict: dict[str, torch.Tensor]
    best_prec1: float | None
    optimizer: dict[str, Any] | None
    amp_state: bool = False

    @property
    def epochs_done(self) -> str:
        """``1 epoch done``, ``3 epochs done``: the finished epochs as the app's messages say them."""
        return f"{self.epoch} epoch{'' if self.epoch == 1 else 's'} done"


# --- reading --------------------------------------------------------------------------------------------
def _torch_load(path: Path, lazy: bool = False) -> Any:
    """Loads a checkpoint on the CPU: tensors-only unpickling first, full unpickling if the file needs it.

    The original wrote these files with plain ``torch.save`` and loaded them with full unpickling; a file a user
    points ``--resume`` at is trusted as much as the original trusted it.
    """
    kwargs: dict[str, Any] = {"map_location": "cpu"}
    if lazy:
        kwargs["mmap"] = True
    try:
        return torch.load(path, weights_only=True, **kwargs)
    except RuntimeError as error:
        if lazy and "mmap" in str(error):  # pre-zipfile (torch < 1.6) serialization cannot be memory-mapped
            return _torch_load(path, lazy=False)
        raise
    except Exception:  # noqa: BLE001 - UnpicklingError and friends: objects beyond tensors and containers
        return torch.load(path, weights_only=False, **kwargs)


def load_raw(path: str | os.PathLike) -> Any:
    """The file's object as ``torch.load`` reads it (tensors memory-mapped); raises what ``torch.load`` raises."""
    return _torch_load(Path(path), lazy=True)


def legacy_parts_missing(obj: Mapping) -> list[str]:
    """What the dict ``obj`` lacks to be a main_amp.py checkpoint, said for a message (empty: nothing)."""
    lacks = [f"'{key}'" for key in ("epoch", "state_dict") if key not in obj]
    if "state_dict" in obj and not isinstance(obj["state_dict"], Mapping):
        lacks.append(f"'state_dict' as a dict (it is a {type(obj['state_dict']).__name__})")
    if not any(key in obj for key in ("arch", "optimizer", "best_prec1")):
        lacks.append("one of 'arch', 'optimizer', 'best_prec1'")
    return lacks


def _looks_legacy(obj: Any) -> bool:
    return isinstance(obj, Mapping) and "pytorch-lightning_version" not in obj and not legacy_parts_missing(obj)


def is_legacy_checkpoint(path: str | os.PathLike) -> bool:
    """True when ``path`` is a checkpoint file written by main_amp.py (not a Lightning checkpoint).

    A main_amp.py checkpoint is a dict with ``epoch``, ``state_dict`` and at least one of ``arch``, ``optimizer``,
    ``best_prec1``, and without Lightning's ``pytorch-lightning_version``. Missing or unreadable files are not.
    """
    path = Path(path)
    if not path.is_file():
        return False
    try:
        return _looks_legacy(_torch_load(path, lazy=True))
    except Exception:  # noqa: BLE001 - whatever it is, it is not a readable main_amp.py checkpoint
        return False


def is_lightning_checkpoint(path: str | os.PathLike) -> bool:
    """True when ``path`` is a readable Lightning checkpoint (it has ``pytorch-lightning_version``)."""
    path = Path(path)
    if not path.is_file():
        return False
    try:
        obj = _torch_load(path, lazy=True)
    except Exception:  # noqa: BLE001
        return False
    return isinstance(obj, Mapping) and "pytorch-lightning_version" in obj


def load_legacy(path: str | os.PathLike, lazy: bool = False) -> LegacyCheckpoint:
    """Reads a main_amp.py checkpoint.

    Args:
        path: The ``checkpoint.pth.tar`` / ``model_best.pth.tar``.
        lazy: Memory-map the tensors instead of reading them (for a look at ``epoch``/``arch``/``best_prec1``).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        CheckpointConversionError: The file is not a main_amp.py checkpoint (the message lists the keys it has).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"main_amp.py checkpoint {path} does not exist")
    obj = _torch_load(path, lazy=lazy)
    if not _looks_legacy(obj):
        found = sorted(obj) if isinstance(obj, Mapping) else type(obj).__name__
        raise CheckpointConversionError(
            f"{path} is not a main_amp.py checkpoint: expected a dict with 'epoch', 'arch', 'state_dict', "
            f"'best_prec1', 'optimizer'; found {found}"
        )
    epoch = obj["epoch"]
    if isinstance(epoch, torch.Tensor):
        epoch = int(epoch.item())
    if not isinstance(epoch, int) or epoch < 0:
        raise CheckpointConversionError(f"{path}: 'epoch' must be a finished-epoch count >= 0, got {obj['epoch']!r}")
    state = {}
    for key, value in obj["state_dict"].items():
        if not isinstance(value, torch.Tensor):
            raise CheckpointConversionError(
                f"{path}: state_dict entry {key!r} is a {type(value).__name__}, not a tensor"
            )
        state[key.removeprefix("module.")] = value
    best = obj.get("best_prec1")
    if isinstance(best, torch.Tensor):
        best = best.item()
    optimizer = obj.get("optimizer")
    if optimizer is not None and not (
        isinstance(optimizer, Mapping) and "state" in optimizer and "param_groups" in optimizer
    ):
        raise CheckpointConversionError(
            f"{path}: 'optimizer' is not an optimizer state_dict (no 'state'/'param_groups')"
        )
    return LegacyCheckpoint(
        path=path,
        epoch=epoch,
        arch=obj.get("arch"),
        state_dict=state,
        best_prec1=None if best is None else float(best),
        optimizer=optimizer,
        amp_state=obj.get("amp") is not None,
    )


def converted_path(source: str | os.PathLike) -> Path:
    """Where :func:`convert` writes: next to ``source``, ``checkpoint.pth.tar`` -> ``checkpoint.lightning.ckpt``."""
    source = Path(source)
    name = source.name
    for suffix in _SOURCE_SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)]
            break
    return source.with_name(f"{name}.lightning.ckpt")


def check_arch(legacy: LegacyCheckpoint, arch: str) -> None:
    """Raises a clear error when the checkpoint was trained with another architecture than the run builds.

    Raises:
        CheckpointConversionError: ``legacy.arch`` differs from ``arch``.
    """
    if legacy.arch is not None and legacy.arch != arch:
        raise CheckpointConversionError(
            f"{legacy.path} holds a {legacy.arch!r} model (its 'arch' entry), but this run builds {arch!r} "
            f"(-a/--arch, model.arch); run with -a {legacy.arch} to use this checkpoint"
        )


# --- building the Lightning checkpoint -----------------------------------------------------------------
def _load_weights(net: torch.nn.Module, legacy: LegacyCheckpoint) -> None:
    own = net.state_dict()
    # BatchNorm's num_batches_tracked (torch 0.4.1 on) is absent from older files: the model's own count stands, as
    # torch's BatchNorm fills it when it loads such a file.
    state = {**{k: v for k, v in own.items() if k.endswith("num_batches_tracked")}, **legacy.state_dict}
    missing = [k for k in own if k not in state]
    unexpected = [k for k in legacy.state_dict if k not in own]
    mismatched = [
        f"{k}: checkpoint {list(v.shape)}, model {list(own[k].shape)}"
        for k, v in legacy.state_dict.items()
        if k in own and v.shape != own[k].shape
    ]
    if missing or unexpected or mismatched:
        details = []
        if mismatched:
            details.append("shape mismatches: " + "; ".join(mismatched[:5]))
            head = [v.shape[0] for k, v in legacy.state_dict.items() if k == "fc.weight" and k in own]
            if head == [1000] and own["fc.weight"].shape[0] != 1000:
                details.append(
                    "(main_amp.py built torchvision's 1000-way head whatever the data folder held; here the head "
                    f"has one output per class folder of data.root ({own['fc.weight'].shape[0]}): this checkpoint "
                    "fits a data.root of 1000 classes)"
                )
            else:
                details.append(
                    "(a different classifier size means the checkpoint was trained on another number of classes "
                    "than data.root has class folders)"
                )
        if missing:
            details.append(f"missing in the checkpoint: {missing[:5]}{' ...' if len(missing) > 5 else ''}")
        if unexpected:
            details.append(f"not in the model: {unexpected[:5]}{' ...' if len(unexpected) > 5 else ''}")
        raise CheckpointConversionError(f"{legacy.path} does not fit the model: " + " ".join(details))
    net.load_state_dict(state)


def _load_optimizer_state(optimizer: torch.optim.Optimizer, legacy: LegacyCheckpoint) -> None:
    """Puts the legacy per-parameter state (momentum buffers) into ``optimizer``; its hyperparameters stay."""
    saved = legacy.optimizer
    assert saved is not None
    saved_ids = [pid for group in saved["param_groups"] for pid in group["params"]]
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if len(saved_ids) != len(params):
        raise CheckpointConversionError(
            f"{legacy.path}: the saved optimizer has {len(saved_ids)} parameters, the model has {len(params)}"
        )
    current = optimizer.state_dict()
    own_ids = [pid for group in current["param_groups"] for pid in group["params"]]
    state = {}
    for position, saved_id in enumerate(saved_ids):
        entry = saved["state"].get(saved_id)
        if entry is None:
            continue
        for name, value in entry.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != params[position].shape:
                raise CheckpointConversionError(
                    f"{legacy.path}: optimizer state {name!r} of parameter {position} is {list(value.shape)}, "
                    f"the parameter is {list(params[position].shape)}"
                )
        state[own_ids[position]] = dict(entry)
    current["state"] = state
    optimizer.load_state_dict(current)


def _advance_scheduler(scheduler: Any, steps: int) -> None:
    """Puts ``scheduler`` where it is after ``steps`` calls of ``step()`` from construction."""
    if steps <= 0:
        return
    with warnings.catch_warnings():
        # "lr_scheduler.step() before optimizer.step()": nothing is trained here.
        warnings.simplefilter("ignore", UserWarning)
        if isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR):
            # Closed form: the rate depends on last_epoch only, so jump to the step before and take one step.
            scheduler.last_epoch = steps - 1
            scheduler._step_count = steps
            scheduler.step()
        else:
            for _ in range(steps):
                scheduler.step()


def _set_fit_counters(trainer: Any, epoch: int, batches_per_epoch: int, scheduler_steps: int) -> int:
    """Sets the fit loop's progress to "``epoch`` epochs finished, the next not started"; returns the global step."""
    steps = epoch * optimizer_steps_per_epoch(batches_per_epoch, trainer.accumulate_grad_batches)
    batches = epoch * batches_per_epoch
    fit = trainer.fit_loop
    for tracker in (fit.epoch_progress.total, fit.epoch_progress.current):
        tracker.ready = tracker.started = tracker.processed = tracker.completed = epoch
    loop = fit.epoch_loop
    loop.batch_progress.total.ready = loop.batch_progress.total.started = batches
    loop.batch_progress.total.processed = loop.batch_progress.total.completed = batches
    loop.batch_progress.current.reset()
    loop.batch_progress.is_last_batch = False
    loop.scheduler_progress.total.ready = loop.scheduler_progress.total.completed = scheduler_steps
    loop.scheduler_progress.current.reset()
    optim = loop.automatic_optimization.optim_progress.optimizer
    optim.step.total.ready = optim.step.total.completed = steps
    optim.step.current.reset()
    optim.zero_grad.total.ready = optim.zero_grad.total.started = optim.zero_grad.total.completed = steps
    optim.zero_grad.current.reset()
    loop._batches_that_stepped = steps
    return steps


def build_checkpoint(legacy: LegacyCheckpoint, model: Any, datamodule: Any, trainer: Any) -> dict[str, Any]:
    """The Lightning checkpoint dict of ``legacy`` for the run that ``model``/``datamodule``/``trainer`` describe.

    Args:
        legacy: The main_amp.py checkpoint.
        model: The run's ``ImageNetClassifier`` (not attached to a trainer yet); its torchvision network is
            ``model.model``.
        datamodule: The run's ``ImageNetDataModule``.
        trainer: The run's ``Trainer``, instantiated but not fitted.

    Raises:
        CheckpointConversionError: Another architecture, weights or optimizer state that do not fit the model, an
            empty training set, or a configuration with several optimizers.
    """
    import pytorch_lightning as pl
    from pytorch_lightning.core.optimizer import _init_optimizers_and_lr_schedulers
    from pytorch_lightning.trainer.connectors.data_connector import _parse_num_batches
    from pytorch_lightning.trainer.states import RunningStage

    check_arch(legacy, model.hparams.arch)
    _load_weights(model.model, legacy)

    # The training loader exactly as the run builds it (sampler, world size, drop_last), sized by Lightning's rule.
    datamodule.trainer = trainer
    datamodule.prepare_data()
    datamodule.setup("fit")
    length = len(datamodule.train_dataloader())
    batches = _parse_num_batches(RunningStage.TRAINING, length, trainer.limit_train_batches)
    if not batches or batches == float("inf"):
        raise CheckpointConversionError(
            f"the training set gives {batches} batches per epoch (data.batch_size={datamodule.batch_size}, "
            f"world size {trainer.world_size}); the resume step epoch x steps_per_epoch needs at least one"
        )
    trainer.fit_loop.max_batches = batches  # what trainer.num_training_batches reports during fit

    model.trainer = trainer
    try:
        optimizers, scheduler_configs = _init_optimizers_and_lr_schedulers(model)
    finally:
        model.trainer = None
    if len(optimizers) != 1:
        raise CheckpointConversionError(f"the model configures {len(optimizers)} optimizers; main_amp.py had one (SGD)")
    if legacy.optimizer is not None:
        _load_optimizer_state(optimizers[0], legacy)

    steps_per_epoch = optimizer_steps_per_epoch(batches, trainer.accumulate_grad_batches)
    scheduler_steps = 0
    for config in scheduler_configs:
        done = legacy.epoch * steps_per_epoch if config.interval == "step" else legacy.epoch
        count = done // config.frequency
        _advance_scheduler(config.scheduler, count)
        scheduler_steps += count
    global_step = _set_fit_counters(trainer, legacy.epoch, int(batches), scheduler_steps)

    checkpoint: dict[str, Any] = {
        "epoch": legacy.epoch,
        "global_step": global_step,
        "pytorch-lightning_version": pl.__version__,
        "state_dict": model.state_dict(),
        "loops": {
            "fit_loop": trainer.fit_loop.state_dict(),
            "validate_loop": trainer.validate_loop.state_dict(),
            "test_loop": trainer.test_loop.state_dict(),
            "predict_loop": trainer.predict_loop.state_dict(),
        },
        "callbacks": {},
        "optimizer_states": [optimizer.state_dict() for optimizer in optimizers],
        "lr_schedulers": [config.scheduler.state_dict() for config in scheduler_configs],
    }
    for obj in (model, datamodule):
        if obj.hparams:
            if hasattr(obj, "_hparams_name"):
                checkpoint[obj.CHECKPOINT_HYPER_PARAMS_NAME] = obj._hparams_name
            checkpoint[obj.CHECKPOINT_HYPER_PARAMS_KEY] = dict(obj.hparams)
    # The module's own entries, as in every checkpoint of the run (Lightning calls the hook on each save): the units of
    # the schedule's step count (lr_schedule_units), which a resume with another global batch or epoch length maps
    # onto its own epochs. Its configure_optimizers above recorded them; the hook reads the trainer's world size.
    model.trainer = trainer
    try:
        model.on_save_checkpoint(checkpoint)
    finally:
        model.trainer = None
    # The trainer has no data module before fit: the class names (checked when the checkpoint is evaluated or resumed
    # on other data) come from the run's own.
    if (class_names := datamodule.class_names) is not None:
        checkpoint["class_names"] = class_names
    checkpoint[RECORD_KEY] = {
        "source": str(legacy.path),
        "epoch": legacy.epoch,
        "arch": legacy.arch,
        "best_prec1": legacy.best_prec1,
        "steps_per_epoch": steps_per_epoch,
        "optimizer_state": legacy.optimizer is not None,
    }
    return checkpoint


# --- the conversion entry point ------------------------------------------------------------------------
def instantiation_args(cli_argv: Sequence[str]) -> list[str]:
    """``cli_argv`` without the subcommand, ``--ckpt_path`` and the logger's options: the arguments LightningCLI takes
    with ``run=False`` and no logger (the logger decides nothing about the run's steps, and a ``--trainer.logger.*``
    key would not parse without one)."""
    args = list(cli_argv)
    if args and args[0] in LIGHTNING_SUBCOMMANDS:  # the conversion instantiates the app without one (run=False)
        args = args[1:]
    out: list[str] = []
    skip = False
    for token in args:
        name = token.split("=", 1)[0]
        left_out = name == "--ckpt_path" or name == "--trainer.logger" or name.startswith("--trainer.logger.")
        if skip:
            skip = False
        elif left_out:
            skip = "=" not in token  # its value is the next word
        else:
            out.append(token)
    return out


def instantiate_run(cli_argv: Sequence[str]) -> tuple[Any, Any, Any]:
    """Builds the run's ``(model, datamodule, trainer)`` from a train.py command line, without running anything.

    Uses train.py's own ``ImageNetCLI`` (links, forced callbacks, defaults), with no logger and no saved config.
    """
    import train  # imported here: train.py imports this module

    with warnings.catch_warnings():
        # "not recommended to provide both args and command line arguments": args is the point here.
        warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
        cli = train.ImageNetCLI(
            train.ImageNetClassifier,
            train.ImageNetDataModule,
            args=instantiation_args(cli_argv),
            run=False,
            seed_everything_default=0,
            save_config_callback=None,
            trainer_defaults={"logger": False},
        )
    return cli.model, cli.datamodule, cli.trainer


def _file_digest(path: str) -> str | None:
    """sha256 of the file's bytes; ``None`` for a file that cannot be read (the run's own parser then says why)."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def conversion_key(source: str | os.PathLike, cli_argv: Sequence[str], environ: Mapping[str, str] | None = None) -> str:
    """A digest of everything the converted checkpoint depends on: the source file, the run's arguments (with the
    content of its ``--config`` files, which the arguments name only, and its data folder resolved: a relative
    ``--data.root`` means another folder from another working directory), the world."""
    import pytorch_lightning as pl

    from cli_parser import option_values

    environ = os.environ if environ is None else environ
    stat = Path(source).stat()
    args = instantiation_args(cli_argv)
    record = {
        "format": FORMAT_VERSION,
        "lightning": pl.__version__,
        "source": str(Path(source).resolve()),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "args": args,
        "configs": [[path, _file_digest(path)] for path in option_values(args, ("--config", "-c"))],
        # Without --data.root, the configuration's root: a relative one is relative to the working directory.
        "data_root": [str(Path(root).resolve()) for root in option_values(args, ("--data.root",))] or os.getcwd(),
        "world": [environ.get(name) for name in ("WORLD_SIZE", "LOCAL_WORLD_SIZE")],
    }
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


def _stored_key(path: Path) -> str | None:
    try:
        record = _torch_load(path, lazy=True).get(RECORD_KEY) or {}
    except Exception:  # noqa: BLE001 - missing, half-replaced on a non-POSIX file system, or foreign
        return None
    return record.get("key")


def _atomic_save(checkpoint: dict[str, Any], output: Path) -> None:
    """Saves as the run's own checkpoints are saved (atomic_files.atomic_torch_save: synced temporary file, rename,
    synced folder; permissions 0666 minus the umask)."""
    try:
        atomic_torch_save(checkpoint, output)
    except OSError as error:
        if error.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise
        raise CheckpointConversionError(
            f"cannot write the converted checkpoint next to its source, in {output.parent}: {error}; "
            "copy the main_amp.py checkpoint to a writable folder and resume from the copy"
        ) from error


def convert(
    source: str | os.PathLike,
    cli_argv: Sequence[str],
    output: str | os.PathLike | None = None,
    *,
    build: Callable[[Sequence[str]], tuple[Any, Any, Any]] = instantiate_run,
    environ: Mapping[str, str] | None = None,
    timeout_s: float = 3600.0,
) -> Path:
    """Converts a main_amp.py checkpoint for the train.py run ``cli_argv`` and returns the Lightning checkpoint path.

    Args:
        source: The main_amp.py ``checkpoint.pth.tar`` / ``model_best.pth.tar``.
        cli_argv: The train.py (LightningCLI) arguments of the run, subcommand and ``--ckpt_path`` included or not.
        output: Where to write; default :func:`converted_path` (``<name>.lightning.ckpt`` next to ``source``).
        build: Builds ``(model, datamodule, trainer)`` from ``cli_argv``; default :func:`instantiate_run`.
        environ: The process environment (default ``os.environ``): ``LOCAL_RANK`` selects the writer, the world size
            enters the key.
        timeout_s: How long a process other than local rank 0 waits for local rank 0's file.

    Returns:
        The converted checkpoint's path. An existing file converted from the same inputs is reused.

    Raises:
        FileNotFoundError: ``source`` does not exist.
        CheckpointConversionError: See :func:`load_legacy` and :func:`build_checkpoint`; the output folder is not
            writable; local rank 0's file did not appear within ``timeout_s``.
    """
    environ = os.environ if environ is None else environ
    source = Path(source)
    if not source.is_file():
        raise FileNotFoundError(f"main_amp.py checkpoint {source} does not exist")
    output = Path(output) if output is not None else converted_path(source)
    key = conversion_key(source, cli_argv, environ)
    if _stored_key(output) == key:
        return output
    if int(environ.get("LOCAL_RANK", 0) or 0) != 0:
        # Local rank 0 converts; the same key means the same inputs, so its file is this process's file too.
        deadline = time.monotonic() + timeout_s
        while _stored_key(output) != key:
            if time.monotonic() > deadline:
                raise CheckpointConversionError(
                    f"local rank {environ.get('LOCAL_RANK')}: {output} was not converted by local rank 0 within "
                    f"{timeout_s:.0f} s"
                )
            time.sleep(1.0)
        return output
    legacy = load_legacy(source)
    model, datamodule, trainer = build(cli_argv)
    checkpoint = build_checkpoint(legacy, model, datamodule, trainer)
    checkpoint[RECORD_KEY]["key"] = key
    _atomic_save(checkpoint, output)
    return output
