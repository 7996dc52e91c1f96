"""Where a run's last.ckpt goes and where Lightning's ``--ckpt_path last`` looks for it.

Lightning's ``last`` takes the newest last*.ckpt in the checkpoint callbacks' folders. A requeued job passes
``--ckpt_path last`` to go on from its latest save: these say which folder that is, whether a run's options would make
``last`` miss it (a new version folder of its own, a file name ``last`` does not match, a preemption folder it does not
search), and the newest last.ckpt among the runs of the name to advise instead. Each takes the subcommand's parsed
configuration (``config[subcommand]``), as train.py's ``ImageNetCLI`` has it; resume_checks.py words the refusals.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import config_checks


def last_checkpoint_follows_checkpoint_dirpath(section: Any) -> None:
    """``checkpoint.dirpath`` alone puts last.ckpt there too: the folder a user fixes for the checkpoints is then
    also the one ``--ckpt_path last`` looks in and the preemption handler writes to (last.ckpt otherwise stayed in
    the logger's next version_N folder, where a requeued job's ``--ckpt_path last`` finds nothing). The file names
    differ (best-*.ckpt, last.ckpt); ``last_checkpoint.dirpath`` keeps last.ckpt elsewhere."""
    best, last = section.get("checkpoint"), section.get("last_checkpoint")
    if best is not None and last is not None and best.get("dirpath") and not last.get("dirpath"):
        last.dirpath = best.dirpath


def checkpoints_in_a_new_folder(section: Any) -> bool:
    """Whether this run's last.ckpt goes to a folder of its own (the logger's next version_N), where Lightning's
    ``--ckpt_path last`` can find nothing: no ``last_checkpoint.dirpath`` (``checkpoint.dirpath`` alone sets it,
    see :func:`last_checkpoint_follows_checkpoint_dirpath`) and no fixed logger version. The preemption handler writes
    into the same folder."""
    fixed = section.get("last_checkpoint", {}).get("dirpath")
    # Without a logger, Lightning's checkpoints go to the fixed <default_root_dir>/checkpoints.
    return not fixed and not _without_logger(section) and config_checks.logger_init_args(section).get("version") is None


def what_last_would_miss(section: Any) -> str | None:
    """Why ``--ckpt_path last`` would miss the latest checkpoint (last_checkpoint's or the preemption handler's),
    or ``None``. Lightning's ``last`` looks for last*.ckpt in the checkpoint callbacks' folders only: a requeued
    job would go back to an older checkpoint, or start from scratch."""
    preemption = section.get("preemption", {})
    folder = preemption.get("dirpath")
    names = {
        "last_checkpoint.filename": f"{section.get('last_checkpoint', {}).get('filename')}.ckpt",
        "preemption.filename": preemption.get("filename") or "last.ckpt",
    }
    for key, name in names.items():
        # Lightning's test: the name starts with "last", ends with ".ckpt" (ModelCheckpoint._find_last_checkpoints).
        if not name.startswith("last") or Path(name).suffix != ".ckpt":
            return (
                f"--ckpt_path last looks for last*.ckpt files and {key} makes {name}: a requeued job would not "
                f"resume from it; leave {key} at its default, or pass the file to --ckpt_path"
            )
    callbacks = [section.get(key, {}).get("dirpath") for key in ("checkpoint", "last_checkpoint")]
    if folder and not any(d and Path(d).resolve() == Path(folder).resolve() for d in callbacks):
        return (
            f"--ckpt_path last looks in the checkpoint callbacks' folders, and preemption.dirpath {folder} is not "
            "one of them: a requeued job would not resume from its preemption checkpoint; leave "
            f"preemption.dirpath unset (it then writes into last_checkpoint's folder), or pass --last_checkpoint."
            f"dirpath {folder}"
        )
    return None


def no_last_checkpoint(section: Any, subcommand: str) -> str:
    """Why ``--ckpt_path last`` finds nothing here, and the newest last.ckpt of this run's name, if any."""
    if subcommand != "fit":
        return (
            "--ckpt_path last: this run writes into a new version folder of its own, where Lightning's 'last' "
            f"would find no checkpoint and evaluate a randomly initialized model; {newest_last_checkpoint(section)}"
        )
    return (
        "--ckpt_path last: this run writes into a new version folder of its own, so Lightning's 'last' would "
        f"find no checkpoint and start from scratch; {newest_last_checkpoint(section)}, or fix the folder for "
        "requeued jobs (--last_checkpoint.dirpath DIR, or --trainer.logger.init_args.version NAME; then "
        "--ckpt_path last resumes from it)"
    )


def newest_last_checkpoint(section: Any) -> str:
    """Advice: the newest last.ckpt among the runs of this run's name (every version folder), if any."""
    if _without_logger(section):  # no run folders of a name: the one folder was searched already
        return "pass the checkpoint file"
    root = _runs_of_this_name(section)
    found = sorted(root.glob("*/checkpoints/last.ckpt"), key=lambda p: p.stat().st_mtime)
    if not found:
        return f"pass the checkpoint file (there is no last.ckpt under {root})"
    return f"pass the file (the newest under {root}: --ckpt_path {found[-1]})"


def last_checkpoint_folder(section: Any) -> Path:
    """Where last_checkpoint writes (and Lightning's ``last`` looks), for a run whose folder is fixed."""
    # Lightning expands ~ in both (ModelCheckpoint's dirpath, Trainer.default_root_dir).
    if fixed := section.get("last_checkpoint", {}).get("dirpath"):
        return Path(fixed).expanduser()
    if _without_logger(section):
        return Path(section.trainer.get("default_root_dir") or ".").expanduser() / "checkpoints"
    version = config_checks.logger_init_args(section).get("version")
    run = version if isinstance(version, str) else f"version_{version}"  # as Lightning's CSVLogger names it
    return _runs_of_this_name(section) / run / "checkpoints"


def last_checkpoints(section: Any) -> list[Path]:
    """The files Lightning's ``--ckpt_path last`` would choose from (last*.ckpt in last_checkpoint's folder)."""
    folder = last_checkpoint_folder(section)
    return sorted(folder.glob("last*.ckpt")) if folder.is_dir() else []


def _without_logger(section: Any) -> bool:
    logger = section.trainer.get("logger")
    return logger is False or logger == []


def _runs_of_this_name(section: Any) -> Path:
    """The logger's folder of this run's name, which holds one folder per run (version_N, or a fixed version)."""
    init = config_checks.logger_init_args(section)
    return Path(str(init.get("save_dir", "runs"))) / str(init.get("name", "lightning_logs"))
