"""apex's ``examples/imagenet/main_amp.py`` command lines, run by train.py.

Scripts written for the original keep working with ``train.py`` in place of ``main_amp.py``::

    python train.py -a resnet50 --b 224 --deterministic --workers 4 --opt-level O1 ./data/
    nsys profile --capture-range=cudaProfilerApi python train.py -a resnet50 --b 224 --opt-level O1 --prof 20 ./data/
    python -m torch.distributed.launch --nproc_per_node=2 train.py -a resnet50 --b 224 --opt-level O1 ./data/

:func:`translate` parses the original's flags with a replica of its argparse parser (same names, defaults, types and
prefix matching, so ``--b 224`` still means ``--batch-size 224``) and returns the equivalent LightningCLI arguments,
plus notes wherever the mapping is not exact (``--opt-level O2/O3``, a static ``--loss-scale``, ``--prof``'s window).
:func:`migrate` is what train.py calls: it translates, prints the equivalent ``python train.py ...`` command (the one
to learn) and the notes once, and converts a main_amp.py ``--resume`` checkpoint into a Lightning checkpoint
(legacy_checkpoint.py).

LightningCLI options may follow the original flags and pass through unchanged (``--trainer.max_steps 10``); they
come after the translated ones, so they win. ``--config FILE`` goes first, under the translated flags.

``--pretrained`` does not download: it uses the torchvision weights file cached where torchvision itself caches it,
``$TORCH_HOME/hub/checkpoints/<arch>-<hash>.pth`` (``torch.hub.get_dir()``; ``TORCH_HOME`` defaults to
``~/.cache/torch``), preferring the file of the weights ``pretrained=True`` meant (``IMAGENET1K_V1``).
"""

from __future__ import annotations

import argparse
import difflib
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import legacy_checkpoint
from cli_names import LIGHTNING_SUBCOMMANDS, SECTIONS, SUBCOMMANDS
from cli_parser import config_files, holds_key, option_values

#: First arguments that belong to train.py's own command line.
_CLI_FIRST = ("--config", "-c", "--help", "-h", "--print_config", "--version")
#: Option prefixes of train.py's LightningCLI that may follow the original flags and pass through unchanged.
PASSTHROUGH_PREFIXES = tuple(f"--{section}." for section in SECTIONS)
_PASSTHROUGH_NAMES = ("--seed_everything", "--config", "-c")
#: The original's choices for ``--opt-level``.
OPT_LEVELS = ("O0", "O1", "O2", "O3")
#: ``--opt-level`` -> ``trainer.precision``.
PRECISION = {"O0": "32-true", "O1": "16-mixed", "O2": "16-mixed", "O3": "16-mixed"}
#: Optimizer steps in the ``--prof`` window.
_PROFILE_STEPS = 10


class MigrationError(ValueError):
    """A main_amp.py command line that train.py cannot run as asked; the message names the flag and the fix."""


#: Flags of main_amp.py's relatives (DALI's and NVIDIA's ResNet-50 scripts, apex's older examples) that this command
#: line does not take, and what does the job here.
_NO_DALI = (
    "there is no DALI here; the decode runs in the loader workers (--data.decode cpu, the default) or with nvJPEG on "
    "the GPU (--data.decode gpu)"
)
_MIXED = "use --opt-level O1 (float16 mixed precision with dynamic loss scaling)"
_LAUNCHER = "the process layout comes from the launcher (torchrun); without one, --trainer.devices N"
FOREIGN_FLAGS = {
    "--dali_cpu": _NO_DALI,
    "--dali-cpu": _NO_DALI,
    "--fp16": _MIXED,
    "--amp": _MIXED,
    "--static-loss-scale": "use --opt-level O1: its loss scaling is dynamic (see --loss-scale)",
    "--dynamic-loss-scale": "use --opt-level O1: its loss scaling is dynamic",
    "--gpu": _LAUNCHER,
    "--world-size": _LAUNCHER,
    "--dist-url": _LAUNCHER,
}


class _OriginalParser(argparse.ArgumentParser):
    """argparse as the original used it; an error is one line that names train.py's compatibility mode and, for an
    unknown flag, the nearest of the original's flags or what replaces a relative's flag."""

    _argv: list[str] = []

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> argparse.Namespace:
        self._argv = list(sys.argv[1:] if args is None else args)
        return super().parse_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        hints = []
        if message.startswith("unrecognized arguments:"):
            options = [o for action in self._actions for o in action.option_strings if o.startswith("--")]
            left = message.split(":", 1)[1].split()
            for token in left:
                name = token.split("=", 1)[0]
                if not name.startswith("-"):
                    continue
                hint = ""
                if name in FOREIGN_FLAGS:
                    hint = f"{name}: {FOREIGN_FLAGS[name]}"
                elif close := difflib.get_close_matches(name.replace("_", "-"), options, n=1, cutoff=0.6):
                    hint = f"{name}: did you mean {close[0]}?"
                value = self._value_after(token)
                if value is not None and value not in left and any(not word.startswith("-") for word in left):
                    # argparse gave the unknown flag's value to the positional DIR, and the real folder was left over
                    # (a flag that takes no value, --fp16 ./data, leaves nothing over: DIR is right there).
                    hint = f"{hint + '; ' if hint else f'{name}: '}its value {value} was read as DIR"
                if hint:
                    hints.append(hint)
        said = f"{message} ({'; '.join(hints)})" if hints else message
        self.exit(
            2,
            f"{self.prog}: error: {said}; train.py read this command line as apex main_amp.py's (`python train.py DIR "
            "-h` lists its flags, `python train.py fit --help` the app's own options)\n",
        )

    def _value_after(self, token: str) -> str | None:
        """The word after ``token`` on the command line when it is a value, not a flag (``--opt_level O1``)."""
        if "=" in token or token not in self._argv:
            return None
        position = self._argv.index(token)
        following = self._argv[position + 1] if position + 1 < len(self._argv) else None
        return following if following is not None and not following.startswith("-") else None


def _original_bool(value: str) -> str:
    """The original declared ``--channels-last`` with ``type=bool``: every non-empty string is True. Kept as the
    string here, so that the translation can say what ``--channels-last False`` did."""
    return value


#: Values of ``--channels-last`` that look like "off" but turned it on in the original (its ``type=bool``).
_FALSE_LOOKING = ("false", "0", "no", "off")


def build_parser() -> argparse.ArgumentParser:
    """A replica of main_amp.py's parser: the same flags, defaults, types and prefix matching (``--b`` works)."""
    from torchvision_models import classification_archs

    model_names = classification_archs()
    parser = _OriginalParser(
        prog="train.py",
        description="PyTorch ImageNet Training (apex main_amp.py command line, run by train.py on Lightning)",
    )
    parser.add_argument("data", metavar="DIR", help="path to dataset")
    parser.add_argument(
        "--arch",
        "-a",
        metavar="ARCH",
        default="resnet18",
        choices=model_names,
        help="model architecture: " + " | ".join(model_names) + " (default: resnet18)",
    )
    parser.add_argument(
        "-j", "--workers", default=4, type=int, metavar="N", help="number of data loading workers (default: 4)"
    )
    parser.add_argument("--epochs", default=90, type=int, metavar="N", help="number of total epochs to run")
    parser.add_argument(
        "--start-epoch", default=0, type=int, metavar="N", help="manual epoch number (useful on restarts)"
    )
    parser.add_argument(
        "-b", "--batch-size", default=256, type=int, metavar="N", help="mini-batch size per process (default: 256)"
    )
    parser.add_argument(
        "--lr",
        "--learning-rate",
        default=0.1,
        type=float,
        metavar="LR",
        help="Initial learning rate per 256 images, scaled by <global batch size>/256; warmup over 5 epochs.",
    )
    parser.add_argument("--momentum", default=0.9, type=float, metavar="M", help="momentum")
    parser.add_argument(
        "--weight-decay", "--wd", default=1e-4, type=float, metavar="W", help="weight decay (default: 1e-4)"
    )
    parser.add_argument("--print-freq", "-p", default=10, type=int, metavar="N", help="print frequency (default: 10)")
    parser.add_argument(
        "--resume", default="", type=str, metavar="PATH", help="path to latest checkpoint (default: none)"
    )
    parser.add_argument(
        "-e", "--evaluate", dest="evaluate", action="store_true", help="evaluate model on validation set"
    )
    parser.add_argument("--pretrained", dest="pretrained", action="store_true", help="use pre-trained model")
    parser.add_argument("--prof", default=-1, type=int, help="Only run 10 iterations for profiling.")
    parser.add_argument("--deterministic", action="store_true")
    # torch.distributed.launch passes --local_rank (torch < 2.0) or --local-rank (torch >= 2.0).
    parser.add_argument("--local_rank", "--local-rank", dest="local_rank", default=0, type=int)
    parser.add_argument("--sync_bn", action="store_true", help="enabling apex sync BN.")
    parser.add_argument("--opt-level", type=str)
    parser.add_argument("--keep-batchnorm-fp32", type=str, default=None)
    parser.add_argument("--loss-scale", type=str, default=None)
    parser.add_argument("--channels-last", type=_original_bool, default=False)
    return parser


def _option_strings() -> tuple[list[str], list[str]]:
    long_options, short_options = [], []
    for action in build_parser()._actions:
        for option in action.option_strings:
            (long_options if option.startswith("--") else short_options).append(option)
    return long_options, short_options


def is_apex_command_line(argv: Sequence[str]) -> bool:
    """True when ``argv`` (without the program name) is a main_amp.py command line rather than train.py's own.

    train.py's own command lines start with a subcommand (``fit``, ``validate``, ``test``, ``predict``), a top-level
    option (``--config``/``-c``, ``--help``/``-h``, ``--print_config``, ``--version``) or a LightningCLI key
    (``--trainer.*`` and the other sections of ``cli_names.SECTIONS``, ``--seed_everything``, ``--ckpt_path``). A
    main_amp.py one starts with one of the original's flags (also an unambiguous prefix such as ``--b``, or a short
    flag with its value attached such as ``-j4``) or with the positional data folder.
    """
    if not argv:
        return False
    first = argv[0]
    name = first.split("=", 1)[0]
    cli_key = name.startswith(PASSTHROUGH_PREFIXES) or name in ("--seed_everything", "--ckpt_path")
    if first in LIGHTNING_SUBCOMMANDS or name in _CLI_FIRST or cli_key:
        return False
    if not first.startswith("-"):
        return True  # the positional DIR
    return is_original_flag(first)


def is_original_flag(word: str) -> bool:
    """Whether ``word`` is one of main_amp.py's flags as its parser takes them: a long one or an unambiguous prefix of
    one (``--b``), with or without ``=VALUE``, or a short one, also with its value attached (``-j4``)."""
    long_options, short_options = _option_strings()
    if word.startswith("--"):
        name = word.split("=", 1)[0]
        return any(option.startswith(name) for option in long_options)
    return any(word.startswith(option) for option in short_options)


def unknown_first_word(argv: Sequence[str]) -> str | None:
    """Why the first word of ``argv`` is neither a subcommand nor main_amp.py's data folder, or ``None`` when it is
    one of them, or an option. A data folder exists, or main_amp.py's flags follow it (a folder the run generates);
    a word close to a subcommand's name is a typo of it either way.

    A mistyped subcommand (``train.py fitt --config configs/quickstart.yaml``) was read as main_amp.py's DIR: the
    original's defaults (batch 256, 90 epochs) replaced the config's, and a config with ``data.source: generated``
    drew its dataset into a new folder of that name and trained on it.
    """
    if not argv or argv[0].startswith("-") or argv[0] in LIGHTNING_SUBCOMMANDS or Path(argv[0]).is_dir():
        return None
    close = difflib.get_close_matches(argv[0], SUBCOMMANDS, n=1, cutoff=0.6)  # predict is refused by name later
    if not close and any(is_apex_command_line([arg]) for arg in argv[1:] if arg.startswith("-")):
        return None  # main_amp.py's flags follow: its DIR, which the run may create (data.source generated)
    hint = f"did you mean {close[0]}? " if close else ""
    return (
        f"'{argv[0]}' is neither a subcommand ({hint}valid: {', '.join(SUBCOMMANDS)}) nor an existing folder (the data "
        "folder DIR of a main_amp.py command line)"
    )


@dataclass
class Translation:
    """The result of :func:`translate_full`.

    Attributes:
        argv: train.py's LightningCLI arguments, subcommand first.
        notes: One line per inexact mapping or decision the user should know about.
        legacy_checkpoint: The main_amp.py checkpoint to convert before the run, or ``None``.
        converted_checkpoint: Where its conversion goes (the ``--ckpt_path`` in ``argv``), or ``None``.
        profile_from: ``--prof N``'s N for a training run, or ``None``: the window's first step counted from the start
            of training or of the resumed run (see :func:`shift_profile_window`).
    """

    argv: list[str]
    notes: list[str] = field(default_factory=list)
    legacy_checkpoint: Path | None = None
    converted_checkpoint: Path | None = None
    profile_from: int | None = None


def _split_passthrough(argv: Sequence[str]) -> tuple[list[str], list[str], list[str]]:
    """Separates LightningCLI options (``--trainer.x v`` or ``--trainer.x=v``) from the original's arguments.

    Returns:
        ``(original, config_args, passthrough)``: ``--config`` options are kept apart because they must come first.
    """
    original: list[str] = []
    config: list[str] = []
    passthrough: list[str] = []
    tokens = list(argv)
    i = 0
    while i < len(tokens):
        token = tokens[i]
        name = token.split("=", 1)[0]
        if name == "--ckpt_path":
            raise MigrationError("--ckpt_path cannot be combined with main_amp.py flags; resume with --resume PATH")
        if name.startswith(PASSTHROUGH_PREFIXES) or name in _PASSTHROUGH_NAMES:
            target = config if name in ("--config", "-c") else passthrough
            if "=" in token:
                target.append(token)
                i += 1
            else:
                if i + 1 >= len(tokens):
                    raise MigrationError(f"{token} needs a value (LightningCLI options take one: {token} VALUE)")
                target.extend(tokens[i : i + 2])
                i += 2
        else:
            original.append(token)
            i += 1
    return original, config, passthrough


def pretrained_weights_path(arch: str) -> Path:
    """The local torchvision weights file ``--pretrained`` uses for ``arch``.

    Searched in ``torch.hub.get_dir()/checkpoints`` (``$TORCH_HOME/hub/checkpoints``, where torchvision caches its
    downloads): first the exact file of the weights ``pretrained=True`` loaded (``IMAGENET1K_V1``, e.g.
    ``resnet50-0676ba61.pth``), then any ``<arch>-*.pth`` (alphabetically first).

    Raises:
        MigrationError: No such file; the message names the folder, the expected file and its download URL.
    """
    import torch
    import torchvision

    folder = Path(torch.hub.get_dir()) / "checkpoints"
    expected, url = None, None
    try:
        weights_enum = torchvision.models.get_model_weights(arch)
        member = getattr(weights_enum, "IMAGENET1K_V1", None) or weights_enum.DEFAULT
        url = member.url
        expected = url.rsplit("/", 1)[-1]
    except (ValueError, AttributeError, KeyError):
        pass
    if expected and (folder / expected).is_file():
        return folder / expected
    candidates = sorted(folder.glob(f"{arch}-*.pth")) if folder.is_dir() else []
    if candidates:
        return candidates[0]
    hint = f" ({expected}, from {url})" if expected else ""
    raise MigrationError(
        f"--pretrained: no local torchvision weights for {arch!r}: searched {folder}/{arch}-*.pth{hint}. There is no "
        "download here: copy the file into that folder (set TORCH_HOME to use another cache) or pass "
        "--model.weights /path/to/weights.pth"
    )


def recipe_overrides(epochs: int) -> list[str]:
    """Options that pin main_amp.py's fixed recipe where the app's defaults differ from it.

    The original: SGD on ``lr x global batch / 256``, linear warmup over 5 epochs, the rate divided by 10 at every
    multiple of 30 epochs and once more from epoch 80 (so milestones 30, 60, 80, then 90, 120, ... for longer runs),
    no label smoothing, no Nesterov; RandomResizedCrop(224, scale 0.08-1) + flip for training, Resize(256) +
    CenterCrop(224) for validation. With the app's current defaults this is empty for ``epochs <= 90``.
    """
    import inspect

    from datamodule import ImageNetDataModule
    from imagenet_module import ImageNetClassifier

    # factor = 0.1 ** (epoch // 30 + (epoch >= 80)): a decay at 30, 60 and 80, then at every multiple of 30 run.
    milestones = sorted({30, 60, 80} | {30 * k for k in range(3, (max(epochs, 1) - 1) // 30 + 1)})
    recipe = {
        ImageNetClassifier: {
            "warmup_epochs": 5,
            "lr_schedule": "step",
            "lr_milestones": milestones,
            "lr_gamma": 0.1,
            "label_smoothing": 0.0,
            "nesterov": False,
        },
        ImageNetDataModule: {"crop_size": 224, "min_crop_scale": 0.08, "val_resize_size": 256, "val_crop_size": 224},
    }
    out = []
    for cls, values in recipe.items():
        group = "model" if cls is ImageNetClassifier else "data"
        defaults = inspect.signature(cls.__init__).parameters
        for name, value in values.items():
            default = defaults[name].default if name in defaults else inspect.Parameter.empty
            if default != value:
                out += [f"--{group}.{name}", _value(value)]
    return out


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ",".join(_value(v) for v in value) + "]"
    return str(value)


def _distributed(environ: Mapping[str, str], notes: list[str]) -> list[str]:
    """Trainer options for the process layout: torch.distributed.launch/torchrun set WORLD_SIZE and friends."""
    world = int(environ.get("WORLD_SIZE", "1") or 1)
    if world <= 1:
        # The original trained on one GPU unless launched with WORLD_SIZE > 1; "auto" devices would take them all.
        return ["--trainer.accelerator", "auto", "--trainer.devices", "1"]
    local = int(environ.get("LOCAL_WORLD_SIZE", "0") or 0)
    if local <= 0:
        local = world
        notes.append(
            f"WORLD_SIZE={world} without LOCAL_WORLD_SIZE: taken as {world} processes on one node; launch with "
            "torchrun (or python -m torch.distributed.launch from torch >= 1.10) so Lightning sees every rank"
        )
    if world % local:
        raise MigrationError(f"WORLD_SIZE={world} is not a multiple of LOCAL_WORLD_SIZE={local}")
    nodes = world // local
    notes.append(
        f"distributed ({world} processes, {local} per node): Lightning runs DDP inside the launcher's processes and "
        f"does not start its own; without a launcher, `python train.py ... --trainer.devices {local}` starts them "
        "itself (one node)"
    )
    return [
        "--trainer.accelerator",
        "auto",
        "--trainer.devices",
        str(local),
        "--trainer.strategy",
        "ddp",
        "--trainer.num_nodes",
        str(nodes),
    ]


def _precision(args: argparse.Namespace, notes: list[str]) -> list[str]:
    level = args.opt_level
    keep_bn, loss_scale = args.keep_batchnorm_fp32, args.loss_scale
    if keep_bn is not None and keep_bn not in ("True", "False"):
        raise MigrationError(
            f"--keep-batchnorm-fp32 must be the string 'True' or 'False' (as apex.amp required), got {keep_bn!r}"
        )
    if loss_scale is not None and loss_scale != "dynamic":
        try:
            float(loss_scale)
        except ValueError:
            raise MigrationError(
                f"--loss-scale must be a number (static scale) or 'dynamic', got {loss_scale!r}"
            ) from None
    if level is None:
        notes.append(
            "no --opt-level: the original stopped here (apex: 'Unexpected optimization level None'); train.py uses "
            "the configured trainer.precision (default 32-true, = O0); give --opt-level O1 for mixed precision"
        )
        if keep_bn is not None or loss_scale is not None:
            notes.append("--keep-batchnorm-fp32/--loss-scale ignored without --opt-level")
        return []
    if level not in OPT_LEVELS:
        hint = " (the prefix is the letter O, not the digit zero)" if level.startswith("0") else ""
        raise MigrationError(f"--opt-level must be one of {', '.join(OPT_LEVELS)}{hint}, got {level!r}")
    precision = PRECISION[level]
    if level == "O0":
        notes.append("--opt-level O0 -> --trainer.precision 32-true: pure FP32, as the original")
    elif level == "O1":
        notes.append(
            "--opt-level O1 -> --trainer.precision 16-mixed: torch autocast to float16 with float32 weights and "
            "dynamic loss scaling (torch.amp.GradScaler), the native successor of apex O1"
        )
    elif level == "O2":
        notes.append(
            "--opt-level O2 -> --trainer.precision 16-mixed: Lightning has no O2. apex O2 cast the model to float16 "
            "(batchnorm kept float32) with float32 master weights in the optimizer and dynamic loss scaling; "
            "16-mixed keeps the weights in float32 and autocasts each op to float16, also with dynamic loss scaling: "
            "the same float16 math and float32 updates, with float32 weights in memory and per-op casts"
        )
    else:
        notes.append(
            "--opt-level O3 -> --trainer.precision 16-mixed: Lightning has no O3 and 16-mixed is not pure FP16. "
            "apex O3 ran everything in float16 (weights, optimizer, batchnorm unless --keep-batchnorm-fp32 True) "
            "without loss scaling: the 'speed of light' baseline that might not converge. 16-mixed is mixed "
            "precision (float32 weights, dynamic loss scaling). For a pure-float16 baseline append "
            "--trainer.precision 16-true (float16 weights, optimizer state and batchnorm, no loss scaling)"
        )
    if keep_bn == "True":
        notes.append(
            "--keep-batchnorm-fp32 True: already so under 16-mixed (batchnorm weights and statistics are float32; "
            "cuDNN batchnorm takes the float16 activations with them)"
            if precision != "32-true"
            else "--keep-batchnorm-fp32 True: no effect in FP32"
        )
    elif keep_bn == "False":
        notes.append(
            "--keep-batchnorm-fp32 False: not available; batchnorm weights stay float32 under 16-mixed "
            "(only --trainer.precision 16-true runs batchnorm in float16)"
        )
    if loss_scale is not None:
        if precision == "32-true":
            notes.append(f"--loss-scale {loss_scale}: ignored, FP32 needs no loss scaling (apex warned likewise)")
        elif loss_scale == "dynamic":
            notes.append("--loss-scale dynamic: the default of 16-mixed (torch.amp.GradScaler)")
        else:
            notes.append(
                f"--loss-scale {loss_scale}: Lightning has no static loss scale; 16-mixed uses dynamic scaling "
                "(torch.amp.GradScaler: starts at 65536, halves and skips the step on inf/NaN gradients, doubles "
                "after 2000 clean steps), which finds a working scale by itself"
            )
    return ["--trainer.precision", precision]


def _resume(args: argparse.Namespace, translation: Translation, arch_typed: bool = True) -> list[str]:
    """``--ckpt_path`` for ``--resume``: a Lightning checkpoint as is, a main_amp.py one after conversion.

    ``arch_typed``: ``-a`` decides the architecture (else a config file does, which the conversion checks).
    """
    notes = translation.notes
    if not args.resume:
        if args.start_epoch:
            raise MigrationError(
                f"--start-epoch {args.start_epoch} without a checkpoint to --resume has no equivalent: a Lightning "
                "run starts at epoch 0 or at its checkpoint's epoch; resume from a checkpoint instead"
            )
        return []
    path = Path(args.resume)
    if path.is_dir():
        example = path / "checkpoint.pth.tar"
        raise MigrationError(f"--resume {path} is a folder; pass the checkpoint file (e.g. {example})")
    if not path.is_file():
        # A requeued job passes --resume from its first submission on, before the file exists: so the original went
        # on from scratch, and so does this, with the note.
        if args.start_epoch:
            raise MigrationError(
                f"--resume {path}: no such file, and --start-epoch {args.start_epoch} alone cannot be honoured"
            )
        notes.append(
            f"--resume {path}: no checkpoint found there; starting from scratch, as the original did "
            "('=> no checkpoint found')"
        )
        return []
    if args.start_epoch:
        notes.append(f"--start-epoch {args.start_epoch} ignored: the checkpoint's epoch wins, as in the original")
    if legacy_checkpoint.is_lightning_checkpoint(path):
        return ["--ckpt_path", str(path)]
    if not legacy_checkpoint.is_legacy_checkpoint(path):
        try:
            raw = legacy_checkpoint.load_raw(path)
        except Exception as error:  # noqa: BLE001 - whatever torch.load says of the file, said as such
            reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise MigrationError(
                f"--resume {path}: torch.load cannot read it ({reason}): not a checkpoint, or a torn one (main_amp.py "
                "saved in place, so a run stopped while saving leaves a truncated file); resume from an earlier copy"
            ) from None
        if isinstance(raw, Mapping):
            keys = sorted(map(str, raw))
            lacks = ", ".join(legacy_checkpoint.legacy_parts_missing(raw))
            holds = f"it lacks {lacks}; its keys: {keys[:10]}{' ...' if len(keys) > 10 else ''}"
        else:
            holds = f"it holds a {type(raw).__name__}"
        raise MigrationError(
            f"--resume {path}: neither a main_amp.py checkpoint (a dict with 'epoch', 'arch', 'state_dict', "
            f"'best_prec1', 'optimizer') nor a Lightning checkpoint: {holds}"
        )
    legacy = legacy_checkpoint.load_legacy(path, lazy=True)
    try:
        if arch_typed:
            legacy_checkpoint.check_arch(legacy, args.arch)
    except legacy_checkpoint.CheckpointConversionError as error:
        raise MigrationError(f"--resume: {error}") from None
    converted = legacy_checkpoint.converted_path(path)
    translation.legacy_checkpoint, translation.converted_checkpoint = path, converted
    if legacy.optimizer is None and not args.evaluate:
        notes.append(
            f"--resume {path}: it holds no 'optimizer' entry, so SGD's momentum buffers start at zero (main_amp.py "
            "itself stopped at such a file with a KeyError)"
        )
    if legacy.amp_state:
        notes.append(
            f"--resume {path}: its apex amp state (the loss scaler's scale) is not carried over; under 16-mixed "
            "torch.amp.GradScaler starts again at 65536 and finds its scale within a few steps"
        )
    best = "" if legacy.best_prec1 is None else f", best Prec@1 {legacy.best_prec1:.3f}"
    notes.append(
        f"--resume {path} (main_amp.py checkpoint: {legacy.arch or 'arch not recorded'}, {legacy.epochs_done}"
        f"{best}) -> converted to {converted}, used as --ckpt_path"
        + (
            "; the run continues at that epoch, its checkpoints go to the run folder as last.ckpt/best-*.ckpt "
            "(resume those with --ckpt_path; the best score restarts from the first epoch after resuming)"
            if not args.evaluate
            else ""
        )
    )
    return ["--ckpt_path", str(converted)]


def _source_set(config_args: Sequence[str], passthrough: Sequence[str]) -> str | None:
    """``data.source`` as the line sets it: its last ``--data.source``, else the last ``--config`` file that has one
    (``None``: neither does; a file that cannot be read is left to the parser, which names it)."""
    if typed := option_values(passthrough, ("--data.source",)):
        return typed[-1]
    sources = [content["data"]["source"] for _, content, _ in config_files(list(config_args), os.getcwd())
               if holds_key(content, ["data", "source"])]  # fmt: skip
    return sources[-1] if sources else None


def translate_full(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> Translation:
    """Translates a main_amp.py command line; see :func:`translate`. Also says which checkpoint to convert.

    Raises:
        SystemExit: The original's parser rejects ``argv`` (exit code 2, message on stderr, as the original).
        MigrationError: A flag value train.py cannot honour (message names the flag and what is valid).
    """
    environ = os.environ if environ is None else environ
    original, config_args, passthrough = _split_passthrough(argv)
    args = build_parser().parse_args(original)
    translation = Translation(argv=[])
    notes = translation.notes
    out = ["validate" if args.evaluate else "fit", *config_args]
    # With a config file, main_amp.py's defaults and fixed recipe give way to the file: only the flags typed are
    # translated over it. Without one, the original's defaults are its recipe and every one is pinned.
    typed = _typed_flags(original) if config_args else None
    values = {
        "workers": ("--data.workers", str(args.workers)),
        "batch_size": ("--data.batch_size", str(args.batch_size)),
        "arch": ("--model.arch", args.arch),
        "lr": ("--model.lr", repr(args.lr)),
        "momentum": ("--model.momentum", repr(args.momentum)),
        "weight_decay": ("--model.weight_decay", repr(args.weight_decay)),
        "epochs": ("--trainer.max_epochs", str(args.epochs)),
        "print_freq": ("--trainer.log_every_n_steps", str(args.print_freq)),
    }
    synthetic = _source_set(config_args, passthrough) == "synthetic"
    if synthetic:
        # DIR is required by main_amp.py's syntax, and the synthetic source reads no folder: passed on, it would only
        # be warned about as an option without effect (so would -j's default: no loader workers either).
        notes.append(f"DIR {args.data} is not read: data.source synthetic trains on a fixed batch on the device")
        if "workers" not in _typed_flags(original):
            values.pop("workers")
    else:
        out += ["--data.root", args.data]
    for dest, (key, value) in values.items():
        if typed is None or dest in typed:
            out += [key, value]
    if typed is not None:
        notes.append(
            f"{' '.join(config_args)}: the file's values stand where no main_amp.py flag was typed; main_amp.py's "
            "defaults and fixed recipe (batch 256, lr 0.1, 90 epochs, 5 warmup epochs, decay at 30/60/80, 224 px "
            "crops) are not applied over it"
        )
    if typed is None or int(environ.get("WORLD_SIZE", "1") or 1) > 1:
        out += _distributed(environ, notes)
    out += _precision(args, notes)
    if args.deterministic:
        out += ["--trainer.deterministic", "true"]
        notes.append(
            "--deterministic -> --trainer.deterministic true: cudnn.benchmark off and "
            "torch.use_deterministic_algorithms(True), which makes cuDNN deterministic as the original's "
            "cudnn.deterministic=True did and also covers non-cuDNN ops (an op without a deterministic kernel "
            "raises; --trainer.deterministic warn only warns). Every rank is seeded with seed_everything 0 "
            "(the original: torch.manual_seed(local_rank))"
        )
    if args.sync_bn:
        out += ["--trainer.sync_batchnorm", "true"]
    if args.channels_last:  # the original's type=bool: any non-empty string
        out += ["--model.channels_last", "true"]
        if args.channels_last.lower() in _FALSE_LOOKING:
            notes.append(
                f"--channels-last {args.channels_last} -> --model.channels_last true: main_amp.py read the flag with "
                "type=bool, which makes every non-empty value True, so this turned channels_last ON there too; for "
                "NCHW leave the flag out"
            )
    if args.pretrained:
        if typed is not None and "arch" not in typed:
            raise MigrationError(
                f"--pretrained with {' '.join(config_args)}: give -a ARCH too; the weights file is found by the arch, "
                f"and the file's model.arch is not main_amp.py's default ({args.arch}) that -a would otherwise mean"
            )
        weights = pretrained_weights_path(args.arch)
        out += ["--model.weights", str(weights)]
        notes.append(f"--pretrained -> --model.weights {weights} (local torchvision weights; no download)")
    if args.prof >= 0:
        if args.evaluate:
            notes.append("--prof ignored with -e/--evaluate: the original profiled training iterations only")
        else:
            out += [
                "--profile.start_step",
                str(args.prof),
                "--profile.num_steps",
                str(_PROFILE_STEPS),
                "--profile.exit_after",
                "true",
            ]
            translation.profile_from = args.prof
            if args.prof == 0:
                original_did = (
                    "The original never called cudaProfilerStart with --prof 0 (its 1-based iteration counter passed "
                    "0 before the first check), so a --capture-range=cudaProfilerApi capture of it was empty, and it "
                    f"quit after iteration {_PROFILE_STEPS}"
                )
            else:
                original_did = (
                    f"The original started cudaProfilerStart at its 1-based iteration {args.prof} and quit after "
                    f"iteration {args.prof + _PROFILE_STEPS} (11 iterations, each rank on its own); for exactly those "
                    f"use --profile.start_step {args.prof - 1} --profile.num_steps 11"
                )
            notes.append(
                f"--prof {args.prof} -> profile window over optimizer steps {args.prof}.."
                f"{args.prof + _PROFILE_STEPS - 1} (0-based), then every rank stops at the same step and the "
                f"process exits 0. {original_did}. With --resume the steps count from the resumed step, as the "
                "original's counted from the resumed epoch's start. nvprof does not support compute capability >= "
                "8.0 (A100, H100, H200): use nsys profile --capture-range=cudaProfilerApi"
            )
    if typed is None:
        out += recipe_overrides(args.epochs)
    out += passthrough
    out += _resume(args, translation, arch_typed=typed is None or "arch" in typed)
    if translation.profile_from is not None and translation.legacy_checkpoint is None and "--ckpt_path" in out:
        out = shift_profile_window(out, _resumed_step(Path(out[out.index("--ckpt_path") + 1])), translation)
    if args.evaluate:
        notes.append(
            "-e/--evaluate -> validate: val_acc1/val_acc5 are fractions (0.7613), the original printed percent"
        )
    if args.local_rank:
        notes.append(
            f"--local_rank {args.local_rank} accepted and ignored: train.py takes ranks from the environment "
            "(LOCAL_RANK, RANK, WORLD_SIZE)"
        )
    translation.argv = out
    return translation


def _typed_flags(original: Sequence[str]) -> set[str]:
    """The destinations of the main_amp.py flags ``original`` names (defaults left out)."""
    parser = build_parser()
    for action in parser._actions:
        if action.option_strings:
            action.default = argparse.SUPPRESS
    return set(vars(parser.parse_args(original)))


def _resumed_step(checkpoint: Path) -> int:
    """The optimizer step a Lightning checkpoint resumes at."""
    try:
        return int(legacy_checkpoint.load_raw(checkpoint).get("global_step", 0))
    except Exception as error:  # noqa: BLE001 - read just before by the resume check; said if it fails now
        raise MigrationError(f"--resume {checkpoint}: cannot read its step for --prof ({error})") from None


def shift_profile_window(argv: list[str], resumed_step: int, translation: Translation) -> list[str]:
    """``argv`` with ``--prof N``'s window moved to N steps after ``resumed_step``, where a resumed run starts.

    The original counted ``--prof`` iterations from the start of each epoch it ran: after ``--resume``, from the
    resumed epoch's first step. A note says where the window went.
    """
    if translation.profile_from is None or not resumed_step:
        return argv
    start = resumed_step + translation.profile_from
    shifted = list(argv)
    shifted[shifted.index("--profile.start_step") + 1] = str(start)
    translation.notes.append(
        f"--prof {translation.profile_from} with --resume -> --profile.start_step {start}: {translation.profile_from} "
        f"steps after the resumed step {resumed_step}"
    )
    return shifted


def translate(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> tuple[list[str], list[str]]:
    """Translates a main_amp.py command line into train.py's LightningCLI arguments.

    Args:
        argv: The arguments after the program name, e.g. ``["-a", "resnet50", "--b", "224", "./"]``; LightningCLI
            options (``--trainer.*`` and the other sections of ``cli_names.SECTIONS``, ``--seed_everything``,
            ``--config``) may be mixed in and pass through.
        environ: The process environment (default ``os.environ``); ``WORLD_SIZE``/``LOCAL_WORLD_SIZE`` from
            torch.distributed.launch or torchrun select DDP.

    Returns:
        ``(cli_argv, notes)``: the LightningCLI arguments with the subcommand first (``fit``, or ``validate`` for
        ``-e``), and one note per mapping that is not exact.

    Raises:
        SystemExit: The original's parser rejects ``argv`` (exit code 2, as the original).
        MigrationError: A flag value train.py cannot honour.
    """
    translation = translate_full(argv, environ)
    return translation.argv, translation.notes


def format_equivalent(cli_argv: Sequence[str]) -> str:
    """The ``python train.py ...`` command that runs ``cli_argv``, shell-quoted, on one line."""
    return shlex.join(["python", "train.py", *cli_argv])


def _is_rank_zero(environ: Mapping[str, str]) -> bool:
    rank = environ.get("RANK", environ.get("LOCAL_RANK", "0")) or "0"
    return int(rank) == 0


def migrate(argv: Sequence[str], environ: Mapping[str, str] | None = None, stream: Any = None) -> list[str]:
    """What train.py does with a main_amp.py command line: translate, tell the user, convert ``--resume``.

    Prints, on rank 0 only, the equivalent ``python train.py ...`` command and the notes (to ``stream``, default
    stderr). A main_amp.py ``--resume`` checkpoint is converted to ``<name>.lightning.ckpt`` (legacy_checkpoint.py)
    for the exact run the translated arguments describe.

    Returns:
        The LightningCLI arguments for ``train.main``.

    Raises:
        SystemExit: Exit code 2 with the message on stderr, for anything the original's parser rejects or train.py
            cannot honour (an unknown flag, a missing weights file, a checkpoint of another architecture, ...).
    """
    environ = os.environ if environ is None else environ
    stream = sys.stderr if stream is None else stream
    try:
        translation = translate_full(argv, environ)
        if translation.legacy_checkpoint is not None:
            if _is_rank_zero(environ):
                print(f"train.py: converting {translation.legacy_checkpoint} for this run ...", file=stream, flush=True)
            converted = legacy_checkpoint.convert(
                translation.legacy_checkpoint, translation.argv, translation.converted_checkpoint, environ=environ
            )
            # After the conversion, which says the resumed step: the command printed is the one that runs.
            translation.argv = shift_profile_window(translation.argv, _resumed_step(converted), translation)
        if _is_rank_zero(environ):
            print(
                "train.py: main_amp.py command line translated; the equivalent train.py command is\n  "
                + format_equivalent(translation.argv),
                file=stream,
            )
            for note in translation.notes:
                print(f"  note: {note}", file=stream)
            stream.flush()
    except (MigrationError, legacy_checkpoint.CheckpointConversionError) as error:
        print(f"train.py: error: {error}", file=sys.stderr)
        raise SystemExit(2) from error
    return translation.argv
