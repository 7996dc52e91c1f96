"""Files that are either the old file or the complete new one, never a torn mix, even on a crash or power loss.

:func:`atomic_write` (checkpoints, metrics.csv's rewrite, the step reports, resize_dataset.py's manifest):

1. the content is written into a temporary file in the target's folder (same filesystem, so the rename below is
   atomic), streamed by the caller's writer (``torch.save`` streams a checkpoint without a second copy in memory);
2. ``flush`` + ``os.fsync``: the data is on the disk before any name points at it;
3. ``os.replace`` onto the target: one atomic step from the old file to the new one, for every reader;
4. ``fsync`` of the folder: the rename itself survives a crash.

If anything fails before the rename (a serialization error, a full disk, an exception), the temporary file is
removed and the target is untouched. A process killed with SIGKILL mid-write cannot clean up: it leaves a hidden
``.<name>.<pid>.<random>.tmp`` next to the target (``<name>`` shortened where the whole would exceed the folder's
longest file name), which nothing reads (``ModelCheckpoint`` and ``--ckpt_path last`` only look at ``*.ckpt``
files). The next write of the same name removes such a file once it is :data:`STALE_AFTER_S` old and its process no
longer runs on this machine, so that kills do not pile up checkpoint-sized files.

No torch and no Lightning at import: the report tools (step_report.py) use it too.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

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


def temporary_name(name: str, folder: Path, suffix: str) -> str:
    """``.<name><suffix>`` in ``folder``, with ``<name>`` shortened as far as needed to fit the folder's longest file
    name: a target name that a plain write accepts must not fail here for the characters this adds. ``suffix`` is
    ASCII (a pid, a random part, an extension)."""
    room = _longest_name(folder) - len(f".{suffix}")  # ASCII: as many bytes as characters
    encoded = os.fsencode(name)  # the limit counts bytes
    if len(encoded) > room:
        name = encoded[:room].decode(sys.getfilesystemencoding(), "ignore")  # a character cut in two is left out
    return f".{name}{suffix}"


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save(obj, path)`` through a synced temporary file and an atomic rename (see the module docstring)."""
    import torch  # here: the report tools write through this module without torch

    atomic_write(path, lambda file: torch.save(obj, file))


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], Any]) -> None:
    """``write(file)`` into a synced temporary file in ``path``'s folder, then renamed onto ``path`` (the module
    docstring's sequence): ``path`` is the old file or the whole new one, never a part."""
    target = Path(path)
    folder = target.parent
    folder.mkdir(parents=True, exist_ok=True)
    temp = folder / temporary_name(target.name, folder, f".{os.getpid()}.{secrets.token_hex(4)}.tmp")
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
