"""train.py's LightningCLI settings beside its arguments, and the types its parser reads the batch limits as.

The parser's keyword arguments (the version, the descriptions ``--help`` shows, no abbreviated options), the seed, the
saved config's overwrite, no ``--optimizer``, the one-line parser errors and the run logger. :data:`CLI_SETTINGS` is
also for code that builds the CLI itself with ``run=False`` (the benchmarks).
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

import pytorch_lightning as pl
import torch

from cli_parser import ReadableErrorsParser

#: Lightning's batch limits: an int counts batches, a float is a fraction of them.
BATCH_LIMITS = ("limit_train_batches", "limit_val_batches", "limit_test_batches", "limit_predict_batches")


def batch_limits_count_before_fractions(parser: Any) -> None:
    """``trainer.limit_*_batches`` parsed as an int first, a float only when it is not a whole number written so.
    Lightning annotates them ``float | int``, and the parser takes a union's types in order: ``1`` from the command
    line or a config file became ``1.0``, every batch, where one was asked for (a smoke test became a whole ImageNet
    epoch), and the saved config.yaml then said ``1.0`` for a rerun too. ``1.0`` stays a float (every batch)."""
    for key in BATCH_LIMITS:
        action = parser._option_string_actions.get(f"--trainer.{key}")
        if action is None or not hasattr(action, "_typehint"):  # jsonargparse keeps a key's type there (4.x)
            raise RuntimeError(
                f"trainer.{key}: this jsonargparse ({metadata.version('jsonargparse')}) keeps its options' types "
                "elsewhere, so 1 would read as 1.0 (every batch); install jsonargparse 4.x (pyproject.toml)"
            )
        action._typehint = int | float | None


def version() -> str:
    """This application's version and the versions it runs on (``train.py --version``)."""
    try:
        own = metadata.version("imagenet-prof")
    except metadata.PackageNotFoundError:
        own = "(not installed)"
    return f"{own} (torch {torch.__version__}, pytorch_lightning {pl.__version__})"


#: The CLI's settings beside its arguments (also for code that builds the CLI with ``run=False``, as the benchmarks do).
CLI_SETTINGS: dict[str, Any] = {
    "seed_everything_default": 0,
    "parser_kwargs": {
        "version": version(),
        # The top-level --help: what a main_amp.py user looks for first (Lightning's default says nothing of either).
        "description": "Trains and profiles torchvision ResNets on ImageNet-style folders. fit is implied: python "
        "train.py --config configs/quickstart.yaml; validate and test take --ckpt_path. main_amp.py command lines "
        "run as they are: python train.py -a resnet50 --b 224 --opt-level O1 --prof 20 DATA_DIR. Every option: "
        "python train.py fit --help.",
        # Lightning's descriptions say "the validation set" and "the test set": both evaluate the val/ split here.
        # No abbreviations (argparse's default): --trainer.max_epoch ran as max_epochs, and --model.weight_dec on a
        # resume lost to the checkpoint's value, which the run then said came from the configuration.
        "allow_abbrev": False,
        "fit": {
            "description": "Trains on the train/ split, validating on val/ every epoch; --ckpt_path resumes.",
            "allow_abbrev": False,
        },
        "validate": {
            "description": "Evaluates a checkpoint (--ckpt_path) on the val/ split, as main_amp.py's -e did.",
            "allow_abbrev": False,
        },
        "test": {
            "description": "Evaluates a checkpoint (--ckpt_path) on the val/ split, as validate does (ImageNet's test "
            "labels are not public); its metrics are named test_*.",
            "allow_abbrev": False,
        },
    },
    # Reruns in the same run folder and DDP relaunches would otherwise abort on the config saved before.
    "save_config_kwargs": {"overwrite": True},
    # No --optimizer/--lr_scheduler: the module's recipe (SGD, lr x global batch / 256, warmup, step decay: model.*)
    # is the optimizer; LightningCLI's --optimizer replaced it silently (no warmup, no scaling) and --lr_scheduler
    # was ignored. An unknown option is refused instead.
    "auto_configure_optimizers": False,
    # Errors as one line with a suggestion, not the subcommand's whole usage above it (cli_parser.py).
    "parser_class": ReadableErrorsParser,
    "trainer_defaults": {"logger": {"class_path": "run_logger.RunLogger", "init_args": {"save_dir": "runs"}}},
}
