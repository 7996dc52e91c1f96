"""Checkpoints that are either the old file or the complete new one, never a torn mix, even on a crash or power loss.

Lightning's ``TorchCheckpointIO`` serializes the whole checkpoint into memory and writes it through an fsspec
transaction: the file is moved into place complete, but nothing is flushed to the disk, so after a power loss or a
kernel crash the new name can point at a file whose data never reached the disk (zero-length or holes), and the
previous checkpoint is gone. :class:`AtomicCheckpointIO` saves local files through :func:`atomic_files.atomic_write`
instead (``torch.save`` streamed into a synced temporary file, renamed onto the target, the folder synced; what a
killed save leaves is removed by a later save), which also saves the second full copy of the checkpoint in host
memory. Remote paths (``s3://`` and other fsspec URLs) go to ``TorchCheckpointIO`` unchanged: object stores publish
an object only once it is complete.

**Loading** repairs one inconsistency of Lightning 2.6's loop progress (:func:`repair_epoch_progress`), so that a
run can be resumed mid-epoch any number of times. Resumed from a checkpoint taken after the last batch of an epoch
(``ModelCheckpoint(every_n_train_steps=...)`` whose step falls on the epoch's end), Lightning counts that epoch as
done but never counts the next one as started (nor calls ``on_train_epoch_start`` for it): its epoch progress reads
``ready == started == processed == completed`` during the whole next epoch. A checkpoint taken in that epoch then
resumes as if the epoch had not begun: Lightning restarts its batch counters at 0 (wrong ``batch_idx``, an epoch that
ends before its last batch, no validation at its end) or, from its last batch, trains the epoch a second time. The
repair gives such a checkpoint the progress an uninterrupted run would have saved at the same point (the epoch
started), recognizable because the checkpoint was taken in ``on_train_batch_end`` (a batch processed, not yet
completed), where the epoch is always in progress.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem
from lightning_fabric.utilities.types import _PATH
from pytorch_lightning.plugins.io import TorchCheckpointIO
from typing_extensions import override  # a dependency (pyproject.toml); Lightning marks its hooks with it

from atomic_files import atomic_torch_save


def repair_epoch_progress(checkpoint: dict[str, Any]) -> bool:
    """Gives ``checkpoint`` the epoch progress of an uninterrupted run where Lightning 2.6 lost it (module docstring).

    Returns:
        Whether anything was changed (in place).
    """
    fit_loop = checkpoint.get("loops", {}).get("fit_loop")
    if not isinstance(fit_loop, dict):
        return False
    epochs, batches = fit_loop.get("epoch_progress"), fit_loop.get("epoch_loop.batch_progress")
    if not isinstance(epochs, dict) or not isinstance(batches, dict):
        return False
    try:
        batch = batches["current"]
        # Taken in on_train_batch_end: the batch is processed and not yet completed. The epoch is then in progress.
        if not batch["ready"] == batch["started"] == batch["processed"] == batch["completed"] + 1:
            return False
        changed = False
        for key in ("total", "current"):
            epoch = epochs[key]
            if epoch["ready"] == epoch["started"] == epoch["processed"] == epoch["completed"]:
                epoch["ready"] = epoch["started"] = epoch["completed"] + 1
                changed = True
    except (KeyError, TypeError):  # another layout (another Lightning version): leave it to Lightning
        return False
    return changed


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` whose local saves are atomic and durable, and whose loads repair Lightning's epoch
    progress (see the module docstring).

    Register it with ``Trainer(plugins=[AtomicCheckpointIO()])``. ``remove_checkpoint`` is ``TorchCheckpointIO``'s.
    """

    @override
    def load_checkpoint(self, path: _PATH, *args: Any, **kwargs: Any) -> dict[str, Any]:
        try:
            checkpoint = super().load_checkpoint(path, *args, **kwargs)
        except (RuntimeError, EOFError) as error:
            # A file cut short (copied or synced while written, a full disk elsewhere than this app's atomic saves):
            # torch's message says "zip archive" or "ran out of input". Said in a line (train.py shows a ValueError
            # that starts with "--ckpt_path " as a parser error), where ``--ckpt_path last`` got a traceback.
            if not (isinstance(error, EOFError) or "PytorchStreamReader" in str(error)):
                raise
            said = (str(error).splitlines() or [""])[0] or type(error).__name__
            raise ValueError(
                f"--ckpt_path {path} cannot be read: it is cut short or not a checkpoint ({said}); pass an intact "
                "checkpoint file (an earlier one of the folder, e.g. best-*.ckpt)"
            ) from error
        if isinstance(checkpoint, dict):
            repair_epoch_progress(checkpoint)
        return checkpoint

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError(
                f"Trainer.save_checkpoint(..., storage_options=...) is not supported by {type(self).__name__}: "
                "it writes local files (and hands remote URLs to TorchCheckpointIO, which has no storage options)"
            )
        fs, local_path = url_to_fs(str(path))
        if not isinstance(fs, LocalFileSystem):
            super().save_checkpoint(checkpoint, path)
            return
        atomic_torch_save(checkpoint, local_path)


def why_unwritable(folder: Path) -> str | None:
    """Why files cannot be written into ``folder`` (made when the first file is), or None when they can."""
    existing = folder
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent  # a file in the way makes every path below it not exist
    if not existing.is_dir():
        return f"{existing} is a file, not a folder"
    try:  # a real folder made and removed: permission bits say nothing for root, /proc or a read-only mount
        os.rmdir(tempfile.mkdtemp(prefix=".write-check-", dir=existing))
    except OSError as error:
        return f"no folder can be made in {existing} ({error.strerror or error})"
    return None
