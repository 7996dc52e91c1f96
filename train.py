"""Train, validate or test a torchvision classifier on ImageNet-style folders, ready to be profiled.

    python train.py --config configs/quickstart.yaml             # fit is implied
    python train.py fit --config configs/resnet50_imagenet.yaml --data.root /data/imagenet --trainer.devices 8
    python train.py validate --config configs/resnet50_imagenet.yaml --ckpt_path runs/.../last.ckpt
    python train.py fit --print_config                           # every key, with its default
    python train.py fit --config ... --trainer.devices 8 --trainer.strategy DDPStrategy \
        --trainer.strategy.timeout 0:10:00                       # a lost rank fails the job within 10 minutes
    python train.py -a resnet50 --b 224 --opt-level O1 --prof 20 /data/imagenet   # apex main_amp.py flags work too

Every option lives in the config and can be overridden on the command line (``--model.arch resnet18``).
"""

from __future__ import annotations

import sys
import time
import warnings
from pathlib import Path
from typing import Any, NoReturn

import pytorch_lightning as pl
import torch
from lightning_fabric.utilities.exceptions import MisconfigurationException
from pytorch_lightning.cli import LightningCLI
from pytorch_lightning.loggers import CSVLogger
from pytorch_lightning.plugins.io import TorchCheckpointIO
from pytorch_lightning.utilities import rank_zero_only
from typing_extensions import override  # a dependency (pyproject.toml); Lightning marks its hooks with it

import apex_compat
import config_checks
import cuda_env
import last_checkpoint_lookup
import resume_checks
from callbacks import ProfilerWindow
from callbacks.bad_images import BadImageCount
from callbacks.preemption import PreemptionHandler
from callbacks.resumable_checkpoint import ResumableCheckpoint
from checkpoint_io import AtomicCheckpointIO
from checkpoint_model_options import settle_model_options
from cli_names import SUBCOMMANDS
from cli_parser import tidy_console
from cli_settings import CLI_SETTINGS, batch_limits_count_before_fractions
from config_checks import ConfigError
from datamodule import ImageNetDataModule
from image_loading import BadImageError
from imagenet_module import ImageNetClassifier
from one_line_errors import CONFIG_SECTIONS, bad_image_line, setup_error_line, trainer_argument_line
from run_logger import NewRunFolder, RunLogger

#: This application's folder: warnings raised from its files print without their source line.
APP_DIR = str(Path(__file__).resolve().parent)
#: How long a rank > 0 waits for rank 0 to say a refusal they both hit in the run, before saying it itself: longer
#: than the ranks are apart at a check (a checkpoint's load at most), short beside a job's start-up.
RANK_ZERO_FIRST_S = 10.0


class ImageNetCLI(LightningCLI):
    """LightningCLI with the links this application needs and its always-available callbacks."""

    #: The global step of a fit's checkpoint that already reached the run's max_steps/max_epochs (warned of; set in
    #: _parse_ckpt_path): the fit trains nothing from it, and its new run folder is taken back.
    _trains_nothing_after_step: int | None = None

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        # No predict: the data module has no prediction split, so the subcommand could only fail.
        return {name: skip for name, skip in LightningCLI.subcommands().items() if name in SUBCOMMANDS}

    def _add_subcommands(self, parser, **kwargs: Any) -> None:  # noqa: ANN001 (LightningArgumentParser)
        super()._add_subcommands(parser, **kwargs)
        # The list in --help takes Lightning's docstrings ("the test set"); the subcommands' own descriptions instead.
        for action in parser._actions:
            for choice in getattr(action, "_choices_actions", []):
                choice.help = kwargs.get(choice.dest, {}).get("description", choice.help)

    def add_arguments_to_parser(self, parser) -> None:  # noqa: ANN001 (LightningArgumentParser)
        batch_limits_count_before_fractions(parser)
        parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate")
        parser.link_arguments("data.batch_size", "model.batch_size")
        parser.link_arguments("model.channels_last", "data.channels_last")
        parser.add_lightning_class_args(ResumableCheckpoint, "checkpoint")
        parser.set_defaults(
            {
                "checkpoint.monitor": "val_acc1",
                "checkpoint.mode": "max",
                "checkpoint.save_last": False,
                "checkpoint.filename": "best-epoch{epoch:03d}-acc1{val_acc1:.4f}",
                "checkpoint.auto_insert_metric_name": False,
            }
        )
        # Lightning 2.6 writes save_last's last.ckpt only when a top-k checkpoint is saved at the same step, so with a
        # monitored metric last.ckpt would be the best state, not the latest, and a resume would go back in time.
        # A second, unmonitored checkpoint named "last" is always the latest state.
        parser.add_lightning_class_args(ResumableCheckpoint, "last_checkpoint")
        parser.set_defaults(
            {
                "last_checkpoint.filename": "last",
                "last_checkpoint.monitor": None,
                "last_checkpoint.save_top_k": 1,
                "last_checkpoint.enable_version_counter": False,
            }
        )
        parser.add_lightning_class_args(ProfilerWindow, "profile")
        # Always on: SIGTERM/SIGINT save last.ckpt (into last_checkpoint's folder, where --ckpt_path last looks) at a
        # step all ranks agree on and exit 128+signal.
        parser.add_lightning_class_args(PreemptionHandler, "preemption")
        # Always on: train_bad_images / val_bad_images per epoch (non-zero only with data.on_bad_image: skip).
        parser.add_lightning_class_args(BadImageCount, "bad_images")

    def _section(self) -> Any:
        """The parsed configuration of the subcommand (the whole of it when the CLI runs none, ``run=False``)."""
        subcommand = self.config.get("subcommand")
        return self.config[subcommand] if subcommand else self.config

    def _refuse(self, message: str) -> NoReturn:
        """Exits as the parser does on its own errors (status 2, one line), through the subcommand's parser: its usage
        and ``--help`` (``train.py fit --help``) are the ones that list the keys."""
        subcommand = self.config.get("subcommand") if getattr(self, "config", None) else None
        getattr(self, "_subcommand_parsers", {}).get(subcommand, self.parser).error(message)

    def _parse_ckpt_path(self) -> None:
        # LightningCLI puts the checkpoint's hyperparameters over the command line's: what --ckpt_path names (or its
        # absence) is checked first, before anything is built (resume_checks.py).
        try:
            self._trains_nothing_after_step = resume_checks.check_ckpt_path(self.config, self._argv)
        except ConfigError as error:
            self._refuse(str(error))
        subcommand = self.config.get("subcommand")
        ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if not ckpt_path:
            return super()._parse_ckpt_path()
        before = self.config[subcommand].model.clone()
        super()._parse_ckpt_path()
        if Path(ckpt_path).is_file():  # what LightningCLI read the checkpoint's options from
            section = self.config[subcommand]
            settle_model_options(section.model, before, self._argv, subcommand)
            # The parse-time link model.channels_last -> data.channels_last, applied again to the value the model
            # settled on: the two would otherwise differ and Lightning refuses the run after set-up, in a traceback
            # ("Error while merging hparams").
            section.data.channels_last = section.model.channels_last

    def parse_arguments(self, parser, args) -> None:  # noqa: ANN001 (LightningCLI's signature)
        # Kept for _parse_ckpt_path: which model options the command line itself gives.
        words = sys.argv[1:] if args is None else args
        self._argv = [] if hasattr(words, "keys") else [str(word) for word in words]
        super().parse_arguments(parser, args)
        try:
            config_checks.check_parsed(self._section())
        except ConfigError as error:
            self._refuse(str(error))
        last_checkpoint_lookup.last_checkpoint_follows_checkpoint_dirpath(self._section())

    def before_instantiate_classes(self) -> None:
        try:
            config_checks.check_before_build(self._section(), self.subcommand)
        except ConfigError as error:
            self._refuse(str(error))

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except (ValueError, FileNotFoundError) as error:
            # The classes check their arguments (data.root's layout included), each message naming its key and what is
            # valid: say it as the parser says its own errors (exit 2), not at the end of a traceback through
            # jsonargparse. Anything else raises.
            if not str(error).startswith(CONFIG_SECTIONS):
                raise
            self._refuse(str(error))

    @override
    def _run_subcommand(self, subcommand: str) -> None:
        new_folder = self._new_run_folder()
        try:
            with warnings.catch_warnings():
                if subcommand != "fit":
                    # Lightning's note that the checkpoint callbacks' best scores are not reloaded into a new folder
                    # concerns a fit that goes on; validate and test save nothing.
                    warnings.filterwarnings("ignore", message="The dirpath has changed from")
                super()._run_subcommand(subcommand)
            if new_folder is not None and self.trainer.global_step == self._trains_nothing_after_step:
                # The rerun of a finished job: a run folder holding only the setup files of a run that trained
                # nothing would be taken for a run (and the next run's number would skip it).
                new_folder.take_back()
        except (ValueError, FileNotFoundError, MisconfigurationException) as error:
            # The checks that need the data or the world size run in setup (a batch larger than a rank's share of the
            # images, a profiled rank past the world size): said as instantiate_classes says the others, and the
            # run folder the logger made for the refused run taken back (it holds the config at most). So are
            # Lightning's own checks of a trainer option against the data (`val_check_interval` (1000) must be ...).
            said = setup_error_line(error)
            if said is None:
                raise
            if new_folder is not None:
                new_folder.take_back()
            self._let_rank_zero_say_it()
            self._refuse(said)

    def _let_rank_zero_say_it(self) -> None:
        """On a rank > 0, holds back a refusal raised in the run for up to :data:`RANK_ZERO_FIRST_S`.

        Under DDP every rank runs the checks of set-up and of the restore, and with the same configuration and
        checkpoint they refuse alike: each printed the same message to the one terminal, once per rank that got to it
        before rank 0 killed it (its ``PreemptionHandler.on_exception`` kills the child ranks of Lightning's launcher
        when it fails; torchrun kills the other workers when one fails). Held back here, such a rank is killed
        unheard. A rank > 0 that exited at once instead, silently, could get rank 0 killed before it printed
        (Lightning's launcher kills rank 0 when a child exits non-zero), and the job would say nothing. A refusal of
        this rank alone (rank 0 went on: a file only its node lacks) is said after the wait.
        """
        if self.trainer.global_rank > 0:
            time.sleep(RANK_ZERO_FIRST_S)

    def _new_run_folder(self) -> NewRunFolder | None:
        """What this run is about to write before its first step (rank 0 writes it): the CSV logger's folder, or,
        without a logger, the config file Lightning saves into ``trainer.default_root_dir``."""
        logger = self.trainer.logger
        if rank_zero_only.rank != 0:
            return None
        if isinstance(logger, CSVLogger):
            return NewRunFolder(logger.log_dir)
        return NewRunFolder(self.trainer.default_root_dir) if logger is None else None

    def instantiate_trainer(self, **kwargs: Any) -> pl.Trainer:
        if self.subcommand in ("validate", "test"):
            # validate_config.yaml: beside a fit's config.yaml when it writes into the fit's folder, not over it.
            self.save_config_kwargs = {**self.save_config_kwargs, "config_filename": f"{self.subcommand}_config.yaml"}
        try:
            trainer = super().instantiate_trainer(**kwargs)
        except (MisconfigurationException, ValueError, TypeError) as error:
            # Lightning's checks of the trainer's arguments name the argument: said as the parser's errors rather than
            # at the end of a traceback. One from elsewhere keeps its traceback (one_line_errors.py).
            said = trainer_argument_line(error)
            if said is None:
                raise
            self._refuse(said)
        options = self._section().trainer
        if options.get("benchmark") is None and not options.get("deterministic"):
            # cuDNN times its algorithms once per convolution shape and keeps the fastest: training's shapes are fixed
            # (the last partial batch is dropped; validation's adds one shape). torch's default is off, and Lightning
            # leaves it so for a null benchmark, which stays null in config.yaml so that a rerun of it with
            # deterministic set is not refused; with deterministic Lightning keeps it off (the two conflict).
            torch.backends.cudnn.benchmark = True
        # Checkpoints are always written atomically and durably (checkpoint_io.py), unless a CheckpointIO plugin of
        # the user's own replaced Lightning's default.
        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:
            trainer.strategy.checkpoint_io = AtomicCheckpointIO()
        for logger in trainer.loggers:
            if not isinstance(logger, RunLogger):
                continue
            if self.subcommand in ("validate", "test"):
                # Beside a fit's files when it writes into the fit's folder, not over them.
                logger.file_prefix = f"{self.subcommand}_"
            elif self._section().get("ckpt_path"):
                # A fit from a checkpoint continues the one before it: its metrics.csv keeps the earlier rows.
                logger.resuming = True
        return trainer


def with_default_subcommand(argv: list[str]) -> list[str]:
    """Prepends ``fit`` unless the first argument is a word (a subcommand, or ``predict``, which the parser then
    refuses by name; main() has taken any other word for main_amp.py's data folder) or a top-level help/version flag."""
    if argv and (not argv[0].startswith("-") or argv[0] in ("-h", "--help", "--version")):
        return argv
    return ["fit", *argv]


def main(argv: list[str] | None = None) -> ImageNetCLI:
    """Runs the CLI on ``argv`` (default: the process arguments) and returns it."""
    # Before anything starts CUDA: nvJPEG's streams otherwise queue behind the training step (cuda_env.py).
    try:
        cuda_env.request()
    except ValueError as error:
        sys.exit(f"train.py: {error}")
    tidy_console(APP_DIR)
    args = list(sys.argv[1:] if argv is None else argv)
    mistyped = apex_compat.unknown_first_word(args)
    if mistyped:
        sys.stderr.write(f"train.py: error: {mistyped}\n")
        sys.exit(2)
    if apex_compat.is_apex_command_line(args):
        # main_amp.py flags: translated (the equivalent command and notes printed once, on rank 0); a main_amp.py
        # --resume checkpoint is converted to <name>.lightning.ckpt beside it.
        args = apex_compat.migrate(args)
    args = with_default_subcommand(args)
    if argv is None:
        # Rewrite the process arguments rather than pass args=: Lightning's DDP launcher re-runs sys.argv for the
        # other ranks, and they must parse exactly what rank 0 parsed.
        sys.argv[1:] = args
    return ImageNetCLI(ImageNetClassifier, ImageNetDataModule, args=None if argv is None else args, **CLI_SETTINGS)


def close_progress_bars() -> None:
    """Closes the progress bars an error left open, the innermost (highest position) first. A validation bar closed
    after the main bar clears its line and moves the cursor back up to the column its blanks reached, so the next line
    would start there, not at the line's start."""
    from tqdm import tqdm

    for bar in sorted(getattr(tqdm, "_instances", ()), key=lambda bar: -abs(getattr(bar, "pos", 0) or 0)):
        bar.close()


if __name__ == "__main__":
    try:
        main()
    except BadImageError as error:
        # One line, exit 1: the traceback through Lightning's loops and the loader says nothing the message does not
        # (a save at the step reached was said above it). Lightning leaves its progress bars open when an error ends
        # the run: closed first, so that the line starts a line of its own, not the end of the bar's.
        close_progress_bars()
        sys.exit(f"train.py: error: {bad_image_line(error)}")
