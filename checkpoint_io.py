"""Checkpoints that are either the old file or the complete new one, never a torn mix, even on a crash or power loss.

Lightning's ``TorchCheckpointIO`` serializes the whole checkpoint into memory and writes it through an fsspec
transaction: the file is moved into place complete, but nothing is flushed to the disk, so after a power loss or a
kernel crash the new name can point at a file whose data never reached the disk (zero-length or holes), and the
previous checkpoint is gone. :class:`AtomicCheckpointIO` makes the sequence durable on local filesystems:

1. ``torch.save`` streams into a temporary file in the target's folder (same filesystem, so the rename below is
   atomic; streaming instead of an in-memory copy saves a second full copy of the checkpoint in host memory);
2. ``flush`` + ``os.fsync``: the data is on the disk before any name points at it;
3. ``os.replace`` onto the target: one atomic step from the old file to the new one, for every reader;
4. ``fsync`` of the folder: the rename itself survives a crash.

If anything fails before the rename (serialization error, full disk, an exception), the temporary file is removed
and the target is untouched. A process killed with SIGKILL mid-save cannot clean up: it leaves a hidden
``.<name>.<pid>.<random>.tmp`` next to the target (``<name>`` shortened where the whole would exceed the folder's
longest file name), which nothing reads (``ModelCheckpoint`` and ``--ckpt_path last`` only look at ``*.ckpt``
files). The next save of the same name removes such a file once it is :data:`STALE_AFTER_S` old and its process no
longer runs on this machine, so that kills do not pile up checkpoint-sized files. Remote paths (``s3://`` and other
fsspec URLs) go to ``TorchCheckpointIO`` unchanged: object stores publish an object only once it is complete.

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

import contextlib
import errno
import os
import secrets
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import torch
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem
from lightning_fabric.utilities.types import _PATH
from pytorch_lightning.plugins.io import TorchCheckpointIO
from typing_extensions import override  # a dependency (pyproject.toml); Lightning marks its hooks with it

#: errno values of ``fsync`` on a folder that mean "not supported by this filesystem", not "failed".
_DIR_FSYNC_UNSUPPORTED = {errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EBADF}


def fsync_dir(folder: str | os.PathLike) -> None:
    """Flushes ``folder``'s entries (a rename into it) to the disk; a no-op where folders cannot be synced."""
    if os.name == "nt":  # pragma: no cover - Windows cannot open a folder as a file; NTFS journals renames.
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as error:
        if error.errno not in _DIR_FSYNC_UNSUPPORTED:
            raise
    finally:
        os.close(fd)


#: Age after which a temporary file of a save whose process is gone is removed (a save in progress on another machine
#: of a shared filesystem, whose process this machine cannot see, keeps writing to its file well within this).
STALE_AFTER_S = 600.0


def _longest_name(folder: Path) -> int:
    """The longest file name ``folder``'s filesystem takes, in bytes."""
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (AttributeError, ValueError, OSError):  # no pathconf (Windows), or no limit to report
        return 255


def _temporary_name(name: str, folder: Path) -> str:
    """``.<name>.<pid>.<random>.tmp``, with ``<name>`` shortened as far as needed to fit the folder's longest file
    name: a target name that a plain save accepts must not fail here for the 22 or so characters this adds."""
    suffix = f".{os.getpid()}.{secrets.token_hex(4)}.tmp"
    room = _longest_name(folder) - len(f".{suffix}")  # ASCII: as many bytes as characters
    encoded = os.fsencode(name)  # the limit counts bytes
    if len(encoded) > room:
        name = encoded[:room].decode(sys.getfilesystemencoding(), "ignore")  # a character cut in two is left out
    return f".{name}{suffix}"


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save(obj, path)`` through a synced temporary file and an atomic rename (see the module docstring)."""
    atomic_write(path, lambda file: torch.save(obj, file))


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], Any]) -> None:
    """``write(file)`` into a synced temporary file in ``path``'s folder, then renamed onto ``path`` (the module
    docstring's sequence): ``path`` is the old file or the whole new one, never a part."""
    target = Path(path)
    folder = target.parent
    folder.mkdir(parents=True, exist_ok=True)
    temp = folder / _temporary_name(target.name, folder)
    # O_EXCL: never write through a name someone else made; 0o666 & umask gives the permissions open() would.
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        try:
            f = os.fdopen(fd, "wb")
        except BaseException:
            os.close(fd)
            raise
        with f:  # closes the descriptor, also on error
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    fsync_dir(folder)
    remove_stale_temporaries(target)


def remove_stale_temporaries(target: Path) -> list[Path]:
    """Removes the temporary files of earlier saves of ``target`` that a kill left behind (their process gone, not
    written for :data:`STALE_AFTER_S`); returns them."""
    longest = _longest_name(target.parent)
    removed = []
    now = time.time()
    for candidate in target.parent.glob(".*.*.*.tmp"):
        name, pid, _, _ = candidate.name[1:].rsplit(".", 3)
        # Its own name, or the name shortened to fit (by as many characters as that save's pid had digits).
        shortened = len(os.fsencode(candidate.name)) >= longest - 3 and target.name.startswith(name)
        if not (name == target.name or shortened) or not pid.isdigit():
            continue
        if int(pid) == os.getpid() or _runs(int(pid)):
            continue
        with contextlib.suppress(OSError):  # gone meanwhile, or not ours to remove
            if now - candidate.stat().st_mtime >= STALE_AFTER_S:
                candidate.unlink()
                removed.append(candidate)
    return removed


def _runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process (EPERM): it runs
        return True
    return True


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
