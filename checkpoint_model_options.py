"""Which model options a run from a checkpoint takes: the checkpoint's, or the run's own.

LightningCLI puts a checkpoint's hyperparameters over the configuration's without a word. train.py's ``ImageNetCLI``
gives the command line's own ``--model.KEY`` values back after it (a resume that changes ``model.lr`` gets it), says
which options came from where, and refuses an arch the run names that the checkpoint does not hold (resume_checks.py).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from pytorch_lightning.utilities import rank_zero_info

from config_yaml import read_mapping, section_options

#: The model options that only training uses (the optimizer and its schedule).
OPTIMIZER_OPTIONS = frozenset(
    {"lr", "momentum", "weight_decay", "nesterov", "warmup_epochs", "lr_schedule", "lr_milestones", "lr_gamma",
     "fused_sgd"}
)  # fmt: skip


def settle_model_options(model: Any, before: Any, argv: Sequence[str], subcommand: str) -> None:
    """After LightningCLI put the checkpoint's model options over the configuration's: the command line's own
    ``--model.KEY`` values win back (a resume that changes ``model.lr`` or ``model.lr_milestones`` gets them), the
    configuration file's are the checkpoint's (the run goes on as it was started), and ``model.weights`` is not
    read (the checkpoint's weights replace them; the file may be gone). Only for a checkpoint file here: ``last``
    may find none yet (the first submission of a requeued job starts from ``model.weights``), and Lightning reads
    ``hpc`` and remote paths later.

    Args:
        model: The subcommand's ``model`` options after LightningCLI read the checkpoint's; changed in place.
        before: A copy of them from before.
        argv: The command line's words (without the program's name).
        subcommand: ``fit``, ``validate`` or ``test``.
    """
    given = model_keys_on_the_command_line(argv)
    # An evaluation does not say where its optimizer's options came from: it has none.
    unsaid = OPTIMIZER_OPTIONS if subcommand != "fit" else frozenset()
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


def model_keys_on_the_command_line(argv: Sequence[str]) -> set[str]:
    """The ``model`` options written on the command line itself (``--model.lr 0.2``, ``--model.lr=0.2``,
    ``--model.lr_milestones+=100``), not those of a ``--config`` file."""
    keys = set()
    for word in argv:
        if word.startswith("--model."):
            keys.add(re.split(r"[.=+]", word[len("--model.") :], maxsplit=1)[0])
    return keys


def model_keys_in_config_files(section: Any) -> set[str]:
    """The ``model`` options that the run's ``--config`` files set (``section``: the subcommand's configuration)."""
    keys: set[str] = set()
    for path in section.get("config") or []:
        keys |= set(section_options(read_mapping(str(path)), "model"))
    return keys
