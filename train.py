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

import inspect
import re
import sys
import traceback
import warnings
import zipfile
from datetime import timedelta
from importlib import metadata
from pathlib import Path
from typing import Any, NoReturn

import pytorch_lightning as pl
import torch
import yaml
from lightning_fabric.utilities.exceptions import MisconfigurationException
from pytorch_lightning.cli import LightningCLI
from pytorch_lightning.loggers import CSVLogger
from pytorch_lightning.plugins.io import TorchCheckpointIO
from pytorch_lightning.utilities import rank_zero_info, rank_zero_only, rank_zero_warn
from typing_extensions import override  # a dependency (pyproject.toml); Lightning marks its hooks with it

import apex_compat
import config_checks
import cuda_env
import legacy_checkpoint
from callbacks import ProfilerWindow
from callbacks.bad_images import BadImageCount
from callbacks.preemption import PreemptionHandler
from callbacks.resumable_checkpoint import ResumableCheckpoint
from checkpoint_io import AtomicCheckpointIO
from cli_names import SECTIONS, SUBCOMMANDS
from cli_parser import ReadableErrorsParser, tidy_console
from datamodule import ImageNetDataModule
from image_loading import BadImageError
from imagenet_module import ImageNetClassifier
from run_logger import NewRunFolder, RunLogger

try:  # Lightning's test for its model-registry checkpoint names ("registry", "registry:NAME:VERSION")
    from pytorch_lightning.utilities.model_registry import _is_registry
except ImportError:  # pragma: no cover

    def _is_registry(path: object) -> bool:
        return str(path).lower().startswith("registry")


#: The model options that only training uses (the optimizer and its schedule).
_OPTIMIZER_OPTIONS = frozenset(
    {"lr", "momentum", "weight_decay", "nesterov", "warmup_epochs", "lr_schedule", "lr_milestones", "lr_gamma",
     "fused_sgd"}
)  # fmt: skip
#: This application's folder: warnings raised from its files print without their source line.
APP_DIR = str(Path(__file__).resolve().parent)

#: The first part of every configuration key (and --ckpt_path): a ValueError or FileNotFoundError that starts with one
#: (``data.batch_size must be >= 1``) is a check of the configuration, said as the parser says its own errors.
CONFIG_SECTIONS = (*(f"{section}." for section in SECTIONS), "--ckpt_path ")


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
        _batch_limits_count_before_fractions(parser)
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
        # LightningCLI puts the checkpoint's hyperparameters over the command line's: a different --model.arch would
        # be replaced without a word, so say it instead (before anything is built).
        subcommand = self.config.get("subcommand")
        ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if ckpt_path == "last" and self._checkpoints_in_a_new_folder():
            self._refuse(self._no_last_checkpoint())
        if ckpt_path == "last" and (missed := self._what_last_would_miss()):
            self._refuse(missed)
        if ckpt_path == "last":
            found = self._last_checkpoints()
            if not found and subcommand in ("validate", "test"):
                # Lightning warns and evaluates the randomly initialized model, exit status 0.
                self._refuse(
                    f"--ckpt_path last: no last*.ckpt in {self._last_checkpoint_folder()}, so {subcommand} would "
                    f"evaluate a randomly initialized model; {self._newest_last_checkpoint()}"
                )
            newest = str(max(found, key=lambda path: path.stat().st_mtime)) if found else None  # what 'last' takes
            # A file that is no zip archive (cut short) is refused in the run, by a message that says what it is.
            if newest is not None and zipfile.is_zipfile(newest):
                checkpoint = self._lightning_checkpoint(newest)
                if subcommand == "fit":  # a requeued job whose run had finished (its folder fixed): as for a file
                    self._refuse_a_resume_past_the_end(newest, checkpoint, said_as=f"last ({newest})")
                else:
                    self._warn_of_other_validation_sizes(newest, checkpoint, subcommand)
        if ckpt_path == "best":
            self._refuse(
                "--ckpt_path best names the best checkpoint of a fit in this same process, and this process has not "
                "trained; pass the file (e.g. .../checkpoints/best-epoch....ckpt)"
            )
        if subcommand in ("validate", "test") and not ckpt_path and not self.config[subcommand].model.get("weights"):
            rank_zero_warn(
                f"{subcommand} without --ckpt_path (or model.weights) evaluates a randomly initialized model; "
                "pass --ckpt_path .../checkpoints/last.ckpt to evaluate a trained one"
            )
        if not ckpt_path:
            return super()._parse_ckpt_path()
        # Lightning's own names and remote paths (s3://...) are Lightning's to resolve, and a sharded checkpoint is a
        # folder of the strategies that write one.
        sharded = any(name in str(self.config[subcommand].trainer.strategy).lower() for name in ("fsdp", "deepspeed"))
        local = ckpt_path not in ("last", "hpc") and not _is_registry(ckpt_path) and "://" not in ckpt_path
        if local and not Path(ckpt_path).is_file() and not (sharded and Path(ckpt_path).is_dir()):
            what = "is a folder" if Path(ckpt_path).is_dir() else "does not exist"
            self._refuse(f"--ckpt_path {ckpt_path} {what}; pass a checkpoint file (e.g. .../checkpoints/last.ckpt)")
        if Path(ckpt_path).is_file():
            if not zipfile.is_zipfile(ckpt_path):
                with open(ckpt_path, "rb") as file:
                    if file.read(4) == b"PK\x03\x04":  # a zip archive's start, without its end (the directory)
                        self._refuse(
                            f"--ckpt_path {ckpt_path} is cut short: a zip archive (torch.save's format) whose end is "
                            "missing, copied or synced while it was written; pass an intact checkpoint file (an "
                            "earlier one of the folder, e.g. best-*.ckpt)"
                        )
                self._refuse_main_amp(ckpt_path)  # torch < 1.6 wrote main_amp.py's files in its older format
                self._refuse(
                    f"--ckpt_path {ckpt_path} is not a checkpoint (a checkpoint is a torch.save zip archive, "
                    "e.g. .../checkpoints/last.ckpt)"
                )
            checkpoint = self._lightning_checkpoint(ckpt_path)
            if subcommand == "fit":
                self._refuse_a_resume_past_the_end(ckpt_path, checkpoint)
            else:
                self._warn_of_other_validation_sizes(ckpt_path, checkpoint, subcommand)
            saved = checkpoint.get("hyper_parameters", {})
            asked = self.config[subcommand].model.arch
            # Only an arch the run names (the command line, a config file) is refused; left at its default, the
            # checkpoint's applies, as every other model option of the checkpoint does.
            named = "arch" in self._model_keys_on_the_command_line() | self._model_keys_in_config_files(subcommand)
            if named and saved.get("arch", asked) != asked:
                self._refuse(
                    f"--ckpt_path {ckpt_path} holds a {saved['arch']} and this run asks for model.arch {asked}; "
                    f"pass --model.arch {saved['arch']} (or a {asked} checkpoint)"
                )
        before = self.config[subcommand].model.clone()
        super()._parse_ckpt_path()
        if Path(ckpt_path).is_file():  # what LightningCLI read the checkpoint's options from
            self._settle_model_options(subcommand, before)

    def _warn_of_other_validation_sizes(self, ckpt_path: str, checkpoint: dict[str, Any], subcommand: str) -> None:
        """The validation resize and crop are the data's options, which a checkpoint does not carry over as it does
        the model's: an evaluation of a model trained at 64 pixels at the configuration's 256/224 scored something
        else (0.10 against 0.50) without a word. Evaluating at other sizes can be the point, so a warning."""
        saved = checkpoint.get("datamodule_hyper_parameters") or {}
        data = self.config[subcommand].get("data") or {}
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

    def _refuse_a_resume_past_the_end(self, ckpt_path: str, checkpoint: dict[str, Any], said_as: str = "") -> None:
        """A fit from a checkpoint at or past the run's trainer.max_steps/max_epochs trains nothing: Lightning restores
        it, says the limit is reached and exits 0. Past the limit that is a mistake (a refusal); at it, the rerun of a
        finished job (a warning). ``said_as``: how the messages name the checkpoint (``last (FILE)``), if not by
        ``ckpt_path``."""
        trainer = self.config["fit"].trainer
        steps = int(checkpoint.get("global_step", 0))
        fit_loop = checkpoint.get("loops", {}).get("fit_loop", {})
        progress = fit_loop.get("epoch_progress", {}).get("current", {})
        epochs = int(progress.get("processed", 0))  # epochs whose every batch trained
        last_batch = fit_loop.get("epoch_loop.batch_progress", {}).get("is_last_batch")
        if last_batch and epochs == progress.get("started", 0) - 1:
            epochs += 1  # saved at the end of an epoch's last batch, before the epoch's end: Lightning counts it done
        limits = [("trainer.max_steps", trainer.get("max_steps"), steps, "steps"),
                  ("trainer.max_epochs", trainer.get("max_epochs"), epochs, "epochs")]  # fmt: skip
        self._refuse_a_resume_past_the_time_limit(said_as or ckpt_path, checkpoint)
        for key, limit, done, unit in limits:
            if limit is None or limit < 0 or done < limit:
                continue
            said = (
                f"--ckpt_path {said_as or ckpt_path} has trained {done} {unit} and this run ends at {key} {limit}: "
                f"nothing would train; raise {key} to train on, or evaluate it: python train.py validate ... "
                f"--ckpt_path {ckpt_path}"
            )
            if done > limit:
                self._refuse(said)
            rank_zero_warn(said)
            self._trains_nothing_after_step = steps
            return

    def _refuse_a_resume_past_the_time_limit(self, ckpt_path: str, checkpoint: dict[str, Any]) -> None:
        """Lightning counts ``trainer.max_time`` over every resume (its Timer's elapsed time travels in the
        checkpoint): a run stopped by it and resumed with the same limit restored, trained nothing and exited 0, which
        a retry loop or a SLURM ``afterok`` takes for a finished job."""
        max_time = self.config["fit"].trainer.get("max_time")
        if max_time is None:
            return
        limit = config_checks.max_time_seconds(max_time)
        timer_state = next((v for k, v in checkpoint.get("callbacks", {}).items() if str(k).startswith("Timer")), {})
        elapsed = float(timer_state.get("time_elapsed", {}).get("train", 0.0) or 0.0)
        if limit is not None and elapsed >= limit:
            self._refuse(
                f"--ckpt_path {ckpt_path} has trained for {timedelta(seconds=int(elapsed))} and this run ends at "
                f"trainer.max_time {timedelta(seconds=int(limit))}, counted over every resume: nothing would train; "
                "raise trainer.max_time by the time this submission may take (e.g. the elapsed time plus its length)"
            )

    def _lightning_checkpoint(self, ckpt_path: str) -> dict[str, Any]:
        """The checkpoint at ``ckpt_path`` (tensors memory-mapped), refused with a parser error unless Lightning wrote
        it: Lightning would otherwise fail on every rank with ``KeyError: 'pytorch-lightning_version'``, after the
        process start-up, the data set's preparation and the model's set-up."""
        try:
            saved = torch.load(ckpt_path, weights_only=True, map_location="cpu", mmap=True)
        except Exception as error:  # noqa: BLE001 - pickled objects beyond tensors and containers, a torn archive
            self._refuse_main_amp(ckpt_path)  # one that needs full unpickling
            self._refuse(
                f"--ckpt_path {ckpt_path} cannot be read as a checkpoint ({type(error).__name__}); pass a checkpoint "
                "this application wrote (e.g. .../checkpoints/last.ckpt)"
            )
        if isinstance(saved, dict) and "pytorch-lightning_version" in saved:
            return saved
        self._refuse_main_amp(ckpt_path)
        found = f"keys {sorted(map(str, saved))[:8]}" if isinstance(saved, dict) else f"a {type(saved).__name__}"
        self._refuse(
            f"--ckpt_path {ckpt_path} is not a Lightning checkpoint (it has no 'pytorch-lightning_version' entry; "
            f"found {found}); pass a checkpoint this application wrote (e.g. .../checkpoints/last.ckpt)"
        )

    def _refuse_main_amp(self, ckpt_path: str) -> None:
        """A parser error saying how to resume a main_amp.py checkpoint, if ``ckpt_path`` is one. Its Lightning
        checkpoint depends on the run (steps per epoch, global batch), so the main_amp.py command line that resumes it
        converts it (apex_compat.py, legacy_checkpoint.py)."""
        if not legacy_checkpoint.is_legacy_checkpoint(ckpt_path):
            return
        try:
            legacy = legacy_checkpoint.load_legacy(ckpt_path, lazy=True)
        except legacy_checkpoint.CheckpointConversionError as error:
            self._refuse(f"--ckpt_path {error}")
        arch = legacy.arch or "ARCH"
        what = (
            f"--ckpt_path {ckpt_path} is a main_amp.py checkpoint ({arch}, {legacy.epoch} epochs done), not a "
            "Lightning one"
        )
        if self.config.get("subcommand") in ("validate", "test"):
            self._refuse(
                f"{what}; evaluate it with main_amp.py's flags, as its -e did: python train.py -e -a {arch} --resume "
                f"{ckpt_path} DATA_DIR (train.py options such as --trainer.devices may follow)"
            )
        self._refuse(
            f"{what}; resume it with main_amp.py's flags: python train.py -a {arch} --b BATCH --resume {ckpt_path} "
            "DATA_DIR (train.py options such as --trainer.devices may follow). That converts it for the run into "
            f"{legacy_checkpoint.converted_path(ckpt_path)}, which --ckpt_path takes afterwards"
        )

    def _settle_model_options(self, subcommand: str, before: Any) -> None:
        """After LightningCLI put the checkpoint's model options over the configuration's: the command line's own
        ``--model.KEY`` values win back (a resume that changes ``model.lr`` or ``model.lr_milestones`` gets them), the
        configuration file's are the checkpoint's (the run goes on as it was started), and ``model.weights`` is not
        read (the checkpoint's weights replace them; the file may be gone). Only for a checkpoint file here: ``last``
        may find none yet (the first submission of a requeued job starts from ``model.weights``), and Lightning reads
        ``hpc`` and remote paths later."""
        model = self.config[subcommand].model
        given = self._model_keys_on_the_command_line()
        # An evaluation does not say where its optimizer's options came from: it has none.
        unsaid = _OPTIMIZER_OPTIONS if subcommand != "fit" else frozenset()
        notes = []
        for key in sorted(given):
            if key in before and model.get(key) != before[key]:
                said = f"model.{key} {before[key]!r} from the command line (the checkpoint's: {model[key]!r})"
                if key not in unsaid:
                    notes.append(said)
                model[key] = before[key]
        # batch_size and num_classes follow the data module's (links); an arch the run named was checked before.
        for key in sorted(set(before.keys()) - given - {"batch_size", "num_classes", "weights"} - unsaid):
            if model.get(key) != before[key]:
                notes.append(f"model.{key} {model[key]!r} from the checkpoint (the configuration's: {before[key]!r})")
        if model.get("weights"):
            notes.append(f"model.weights {model.weights} not read (the checkpoint's weights replace them)")
            model.weights = None
        if notes:
            rank_zero_info("--ckpt_path: " + "; ".join(notes))

    def _model_keys_on_the_command_line(self) -> set[str]:
        """The ``model`` options written on the command line itself (``--model.lr 0.2``, ``--model.lr=0.2``,
        ``--model.lr_milestones+=100``), not those of a ``--config`` file."""
        keys = set()
        for word in self._argv:
            if word.startswith("--model."):
                keys.add(re.split(r"[.=+]", word[len("--model.") :], maxsplit=1)[0])
        return keys

    def _model_keys_in_config_files(self, subcommand: str) -> set[str]:
        """The ``model`` options that the run's ``--config`` files set."""
        keys: set[str] = set()
        for path in self.config[subcommand].get("config") or []:
            content = _config_file(str(path))
            model = content.get("model") if isinstance(content, dict) else None
            if isinstance(model, dict):
                options = model.get("init_args")
                keys |= set(options if isinstance(options, dict) else model)
        return keys

    def parse_arguments(self, parser, args) -> None:  # noqa: ANN001 (LightningCLI's signature)
        # Kept for _parse_ckpt_path: which model options the command line itself gives.
        words = sys.argv[1:] if args is None else args
        self._argv = [] if hasattr(words, "keys") else [str(word) for word in words]
        super().parse_arguments(parser, args)
        try:
            config_checks.check_parsed(self._section())
        except config_checks.ConfigError as error:
            self._refuse(str(error))
        self._last_checkpoint_follows_checkpoint_dirpath()

    def _last_checkpoint_follows_checkpoint_dirpath(self) -> None:
        """``checkpoint.dirpath`` alone puts last.ckpt there too: the folder a user fixes for the checkpoints is then
        also the one ``--ckpt_path last`` looks in and the preemption handler writes to (last.ckpt otherwise stayed in
        the logger's next version_N folder, where a requeued job's ``--ckpt_path last`` finds nothing). The file names
        differ (best-*.ckpt, last.ckpt); ``last_checkpoint.dirpath`` keeps last.ckpt elsewhere."""
        config = self._section()
        best, last = config.get("checkpoint"), config.get("last_checkpoint")
        if best is not None and last is not None and best.get("dirpath") and not last.get("dirpath"):
            last.dirpath = best.dirpath

    def _logger_args(self) -> Any:
        return config_checks.logger_init_args(self._section())

    def _checkpoints_in_a_new_folder(self) -> bool:
        """Whether this run's last.ckpt goes to a folder of its own (the logger's next version_N), where Lightning's
        ``--ckpt_path last`` can find nothing: no ``last_checkpoint.dirpath`` (``checkpoint.dirpath`` alone sets it,
        see parse_arguments) and no fixed logger version. The preemption handler writes into the same folder."""
        config = self._section()
        fixed = config.get("last_checkpoint", {}).get("dirpath")
        # Without a logger, Lightning's checkpoints go to the fixed <default_root_dir>/checkpoints.
        return not fixed and not self._without_logger() and self._logger_args().get("version") is None

    def _without_logger(self) -> bool:
        logger = self._section().trainer.get("logger")
        return logger is False or logger == []

    def _what_last_would_miss(self) -> str | None:
        """Why ``--ckpt_path last`` would miss the latest checkpoint (last_checkpoint's or the preemption handler's),
        or ``None``. Lightning's ``last`` looks for last*.ckpt in the checkpoint callbacks' folders only: a requeued
        job would go back to an older checkpoint, or start from scratch."""
        config = self._section()
        preemption = config.get("preemption", {})
        folder = preemption.get("dirpath")
        names = {
            "last_checkpoint.filename": f"{config.get('last_checkpoint', {}).get('filename')}.ckpt",
            "preemption.filename": preemption.get("filename") or "last.ckpt",
        }
        for key, name in names.items():
            # Lightning's test: the name starts with "last", ends with ".ckpt" (ModelCheckpoint._find_last_checkpoints).
            if not name.startswith("last") or Path(name).suffix != ".ckpt":
                return (
                    f"--ckpt_path last looks for last*.ckpt files and {key} makes {name}: a requeued job would not "
                    f"resume from it; leave {key} at its default, or pass the file to --ckpt_path"
                )
        callbacks = [config.get(key, {}).get("dirpath") for key in ("checkpoint", "last_checkpoint")]
        if folder and not any(d and Path(d).resolve() == Path(folder).resolve() for d in callbacks):
            return (
                f"--ckpt_path last looks in the checkpoint callbacks' folders, and preemption.dirpath {folder} is not "
                "one of them: a requeued job would not resume from its preemption checkpoint; leave "
                f"preemption.dirpath unset (it then writes into last_checkpoint's folder), or pass --last_checkpoint."
                f"dirpath {folder}"
            )
        return None

    def _no_last_checkpoint(self) -> str:
        """Why ``--ckpt_path last`` finds nothing here, and the newest last.ckpt of this run's name, if any."""
        if self.config["subcommand"] != "fit":
            return (
                "--ckpt_path last: this run writes into a new version folder of its own, where Lightning's 'last' "
                f"would find no checkpoint and evaluate a randomly initialized model; {self._newest_last_checkpoint()}"
            )
        return (
            "--ckpt_path last: this run writes into a new version folder of its own, so Lightning's 'last' would "
            f"find no checkpoint and start from scratch; {self._newest_last_checkpoint()}, or fix the folder for "
            "requeued jobs (--last_checkpoint.dirpath DIR, or --trainer.logger.init_args.version NAME; then "
            "--ckpt_path last resumes from it)"
        )

    def _newest_last_checkpoint(self) -> str:
        """Advice: the newest last.ckpt among the runs of this run's name (every version folder), if any."""
        if self._without_logger():  # no run folders of a name: the one folder was searched already
            return "pass the checkpoint file"
        root = self._runs_of_this_name()
        found = sorted(root.glob("*/checkpoints/last.ckpt"), key=lambda p: p.stat().st_mtime)
        if not found:
            return f"pass the checkpoint file (there is no last.ckpt under {root})"
        return f"pass the file (the newest under {root}: --ckpt_path {found[-1]})"

    def _runs_of_this_name(self) -> Path:
        """The logger's folder of this run's name, which holds one folder per run (version_N, or a fixed version)."""
        init = self._logger_args()
        return Path(str(init.get("save_dir", "runs"))) / str(init.get("name", "lightning_logs"))

    def _last_checkpoint_folder(self) -> Path:
        """Where last_checkpoint writes (and Lightning's ``last`` looks), for a run whose folder is fixed."""
        config = self._section()
        # Lightning expands ~ in both (ModelCheckpoint's dirpath, Trainer.default_root_dir).
        if fixed := config.get("last_checkpoint", {}).get("dirpath"):
            return Path(fixed).expanduser()
        if self._without_logger():
            return Path(config.trainer.get("default_root_dir") or ".").expanduser() / "checkpoints"
        version = self._logger_args().get("version")
        run = version if isinstance(version, str) else f"version_{version}"  # as Lightning's CSVLogger names it
        return self._runs_of_this_name() / run / "checkpoints"

    def _last_checkpoints(self) -> list[Path]:
        """The files Lightning's ``--ckpt_path last`` would choose from (last*.ckpt in last_checkpoint's folder)."""
        folder = self._last_checkpoint_folder()
        return sorted(folder.glob("last*.ckpt")) if folder.is_dir() else []

    def before_instantiate_classes(self) -> None:
        try:
            config_checks.check_before_build(self._section(), self.subcommand)
        except config_checks.ConfigError as error:
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
            said = str(error).strip()
            option = _trainer_option_named_by(error)
            if option is not None:
                said = f"trainer.{option}: {said}"
            elif not said.startswith(CONFIG_SECTIONS):
                raise
            if new_folder is not None:
                new_folder.take_back()
            self._refuse(said)

    def _new_run_folder(self) -> NewRunFolder | None:
        """The folders the logger is about to create for this run (rank 0, which writes them), if it is a CSV logger."""
        logger = self.trainer.logger
        if rank_zero_only.rank != 0 or not isinstance(logger, CSVLogger):
            return None
        return NewRunFolder(logger.log_dir)

    def instantiate_trainer(self, **kwargs: Any) -> pl.Trainer:
        if self.subcommand in ("validate", "test"):
            # validate_config.yaml: beside a fit's config.yaml when it writes into the fit's folder, not over it.
            self.save_config_kwargs = {**self.save_config_kwargs, "config_filename": f"{self.subcommand}_config.yaml"}
        try:
            trainer = super().instantiate_trainer(**kwargs)
        except (MisconfigurationException, ValueError, TypeError) as error:
            # Lightning's checks of the trainer's arguments (devices 0, an unknown strategy, max_epochs -5; devices -2
            # on the CPU is a TypeError): its message names the argument; said as the parser's errors rather than at
            # the end of a traceback. One from elsewhere (a plugin of the user's, an environment variable's parse)
            # keeps its traceback.
            raised_in = traceback.extract_tb(error.__traceback__)[-1].filename
            if not isinstance(error, MisconfigurationException) and not _in_lightning(raised_in):
                raise
            hint = ""
            if re.search(r"\bdevices\b", str(error)):  # Lightning's message does not say what is valid
                on_cpu = re.search(r"\bcpu\b|CPUAccelerator", str(error), re.IGNORECASE)
                valid = (
                    "a count >= 1 or auto" if on_cpu else "a count >= 1, -1 for every GPU, a list like [0, 1], or auto"
                )
                hint = f" (trainer.devices: {valid})"
            self._refuse(f"trainer: {error}{hint}")
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


def _config_file(path: str) -> Any:
    """The YAML content of the config file ``path``; ``None`` if it cannot be read (the parser read it already and
    said so: a file it could not read sets nothing)."""
    try:
        return yaml.safe_load(Path(path).read_text())
    except (OSError, ValueError, yaml.YAMLError):  # ValueError: a name too long for a path, say
        return None


#: Lightning's batch limits: an int counts batches, a float is a fraction of them.
BATCH_LIMITS = ("limit_train_batches", "limit_val_batches", "limit_test_batches", "limit_predict_batches")


def _batch_limits_count_before_fractions(parser: Any) -> None:
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


def _trainer_option_named_by(error: BaseException) -> str | None:
    """The ``Trainer`` argument that a check of Lightning's while it sets up the data names in backquotes
    (```val_check_interval` (1000) must be ...``), when Lightning raised ``error`` there; else ``None`` (an error
    during training keeps its traceback)."""
    frames = traceback.extract_tb(error.__traceback__) if error.__traceback__ else []
    if not frames or not _in_lightning(frames[-1].filename):
        return None
    if not any(frame.name == "setup_data" and _in_lightning(frame.filename) for frame in frames):
        return None
    options = set(inspect.signature(pl.Trainer.__init__).parameters) - {"self"}
    return next((name for name in re.findall(r"`(\w+)", str(error)) if name in options), None)


def _in_lightning(filename: str) -> bool:
    """Whether ``filename`` is a file of Lightning's packages."""
    parts = Path(filename).parts
    return "pytorch_lightning" in parts or "lightning_fabric" in parts or "lightning" in parts


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


def bad_image_line(error: BadImageError) -> str:
    """The error's message as one line: from a loader worker the message is the worker's whole traceback, whose last
    line holds it after ``BadImageError: ``."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    quoted = [line.split("BadImageError: ", 1)[1] for line in lines if "BadImageError: " in line]
    return quoted[-1] if quoted else " ".join(lines)


if __name__ == "__main__":
    try:
        main()
    except BadImageError as error:
        # One line, exit 1: the traceback through Lightning's loops and the loader says nothing the message does not
        # (a save at the step reached was said above it).
        sys.exit(f"train.py: error: {bad_image_line(error)}")
