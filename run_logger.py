"""The run's CSV logger: Lightning's ``CSVLogger``, except that a resumed run keeps the metrics logged before it.

A requeued job resumes into the same run folder (``--trainer.logger.init_args.version NAME --ckpt_path last``), and
Lightning's writer deleted that folder's ``metrics.csv`` when it started: every requeue threw away the loss and
accuracy history of the segments before it. When train.py says the run resumes, the writer appends instead (with
the union of both segments' columns). Rows that the interrupted run logged after its last checkpoint stay, and the
resumed run logs those steps again; a last row the interrupted run left torn (killed, or a full disk, mid-write) is
dropped, not continued by the resumed run's first row.

Lightning's writer rewrites the whole file in place when a metric appears that its header lacks (the first
validation's, or a resumed segment's): a kill or a full disk during that rewrite left the header alone, the history
gone. Here the rewrite goes through a synced temporary file and a rename (:func:`atomic_files.atomic_write`), so the
file is the old one or the whole new one. A fresh run into a folder with an earlier run's file replaces it the same
way at its first rows (Lightning deleted it when its writer was made, so a run refused before its first step, or
killed before it logged, left no results at all).

``validate`` and ``test`` write ``validate_metrics.csv`` and ``validate_hparams.yaml`` (``test_*``; train.py sets
:attr:`RunLogger.file_prefix`): in a fit's folder beside its files, not over them.

:class:`NewRunFolder` takes back the run folder of a run refused before its first step (or its setup files, in a folder
that was there).
"""

from __future__ import annotations

import csv
import io
import os
import shutil
from pathlib import Path

from fsspec.implementations.local import LocalFileSystem
from lightning_fabric.utilities.rank_zero import rank_zero_only, rank_zero_warn
from pytorch_lightning.loggers import CSVLogger
from pytorch_lightning.loggers.csv_logs import ExperimentWriter

from atomic_files import atomic_write


class _AtomicRewriteWriter(ExperimentWriter):
    """Lightning's writer, whose rewrites of ``metrics.csv`` replace the file atomically: the rewrite with a wider
    header, and the replacement of an earlier run's file, which waits for this run's first rows (Lightning deleted it
    when the writer was made, so a run refused or killed before it logged anything took the earlier results with it).

    ``prefix`` goes before its file names (``validate_`` gives ``validate_metrics.csv`` and ``validate_hparams.yaml``).
    """

    def __init__(self, log_dir: str, prefix: str = "") -> None:
        # Before Lightning's __init__, which reads them (as instance attributes they shadow the class's).
        self.NAME_METRICS_FILE = prefix + ExperimentWriter.NAME_METRICS_FILE
        self.NAME_HPARAMS_FILE = prefix + ExperimentWriter.NAME_HPARAMS_FILE
        self._replaces = False  # an earlier run's file, replaced at this run's first save
        super().__init__(log_dir)

    def _check_log_dir_exists(self) -> None:
        if not isinstance(self._fs, LocalFileSystem):  # an object store: Lightning's way
            super()._check_log_dir_exists()
            return
        self._replaces = self._fs.isfile(self.metrics_file_path)
        if self._replaces:
            rank_zero_warn(f"{self.metrics_file_path}, an earlier run's, is replaced at this run's first metrics")

    def save(self) -> None:
        known = list(self.metrics_keys)
        try:
            if self._replaces and self.metrics:
                self._record_new_keys()
                self._write_whole(self.metrics_keys, self.metrics)
                self.metrics, self._replaces = [], False
                return
            super().save()
        except BaseException:
            # Lightning records new columns before it rewrites the file: after a failed rewrite, the next save would
            # append rows wider than the header. The rows themselves stay buffered for the next save.
            self.metrics_keys = known
            raise

    def _rewrite_with_new_header(self, fieldnames: list[str]) -> None:
        if not isinstance(self._fs, LocalFileSystem):  # an object store publishes a whole object anyway
            super()._rewrite_with_new_header(fieldnames)
            return
        with open(self.metrics_file_path, newline="") as file:
            rows = list(csv.DictReader(file))
        self._write_whole(fieldnames, rows)

    def _write_whole(self, fieldnames: list[str], rows: list[dict]) -> None:
        text = io.StringIO(newline="")
        writer = csv.DictWriter(text, fieldnames=fieldnames)
        writer.writeheader()
        writer.writerows(rows)
        atomic_write(self.metrics_file_path, lambda file: file.write(text.getvalue().encode()))


class _AppendingWriter(_AtomicRewriteWriter):
    """Keeps an existing ``metrics.csv`` and continues it; its header is the columns so far."""

    def _check_log_dir_exists(self) -> None:
        if not self._fs.isfile(self.metrics_file_path):
            return
        if isinstance(self._fs, LocalFileSystem):
            _drop_a_torn_last_row(Path(self.metrics_file_path))
        with self._fs.open(self.metrics_file_path, "r", newline="") as file:
            header = next(csv.reader(file), [])
        # New columns in the resumed segment make the writer rewrite the file with the union as its header.
        self.metrics_keys = sorted(header)


def _drop_a_torn_last_row(path: Path) -> None:
    """Cuts ``path`` after its last line end: the writer ends every row with one, so anything after it is a row
    whose writing was cut short, which the next row would otherwise continue."""
    with open(path, "rb+") as file:
        size = file.seek(0, os.SEEK_END)
        if size == 0:
            return
        file.seek(size - 1)
        if file.read(1) == b"\n":
            return
        file.seek(0)
        data = file.read()
        file.truncate(data.rfind(b"\n") + 1)  # a header cut short too: nothing is left, and the header is rewritten


class RunLogger(CSVLogger):
    """Lightning's ``CSVLogger`` (same arguments, same files) whose ``metrics.csv`` survives a resume.

    ``resuming`` is set by train.py when ``--ckpt_path`` is given: the run continues the one whose folder it writes
    into. A fresh run into an existing folder starts the file anew, as Lightning's does.
    """

    resuming = False
    #: Before the file names (``validate_``): set by train.py for validate and test, whose files would otherwise
    #: replace a fit's in its folder (``--trainer.logger.init_args.version NAME``): its metrics.csv and hparams.yaml.
    file_prefix = ""

    @property
    def experiment(self) -> ExperimentWriter:  # type: ignore[override]
        if self._experiment is None and rank_zero_only.rank == 0:  # rank 0 writes, as Lightning's
            self._fs.makedirs(self.root_dir, exist_ok=True)
            writer = _AppendingWriter if self.resuming else _AtomicRewriteWriter
            self._experiment = writer(log_dir=self.log_dir, prefix=self.file_prefix)
        return super().experiment


#: What a run writes into its log folder before its first step: LightningCLI's config.yaml, the logger's
#: hparams.yaml, and metrics.csv (a header at most); validate's and test's with their prefix.
_WRITTEN_BEFORE_TRAINING = frozenset(
    prefix + name for prefix in ("", "validate_", "test_") for name in ("config.yaml", "hparams.yaml", "metrics.csv")
)


class NewRunFolder:
    """The folders a run is about to create for its logs (its ``version_N`` and any parent missing so far), and the
    setup files it is about to write into a folder that exists already.

    A run refused in setup (a batch larger than the dataset, a profiled rank that does not exist) still had its
    logger create ``version_N``: every mistake left a folder behind that holds nothing, and the next run's number
    skipped it. A run refused in a fixed folder (``--trainer.logger.init_args.version NAME``, a class-name or restore
    refusal) had already replaced its ``config.yaml`` and ``hparams.yaml``, which then described a run that never
    ran beside the metrics of the one that did. :meth:`take_back` undoes both.

    Args:
        log_dir: the logger's folder for this run, before the run starts.
    """

    def __init__(self, log_dir: str | os.PathLike) -> None:
        path = Path(log_dir)
        # Deepest first: the run's folder, then each parent this run would create.
        self.created = [folder for folder in (path, *path.parents) if not folder.exists()]
        self.log_dir = path
        # The setup files of a folder that exists (a metrics file is replaced only at the first rows: not one).
        self._setup_before = {
            name: (path / name).read_bytes() if (path / name).is_file() else None
            for name in _WRITTEN_BEFORE_TRAINING
            if not name.endswith("metrics.csv") and not self.created
        }

    def take_back(self) -> bool:
        """Removes the folders this run created if they hold nothing but what a run writes before its first step, or
        puts back the setup files of the folder that was there; returns whether the run's folder is gone. A folder
        holding anything else (a checkpoint, a metrics row, a report, a file of any other name) stays. Two runs
        started at once into the same new version_N (Lightning numbers them by listing the folder) could lose each
        other's config.yaml here, never a result."""
        for name, before in self._setup_before.items():
            path = self.log_dir / name
            if before is None:
                path.unlink(missing_ok=True)
            elif not path.is_file() or path.read_bytes() != before:
                atomic_write(path, lambda file, data=before: file.write(data))
        if not self.created:
            return False
        log_dir = self.created[0]
        if log_dir.exists():
            if not _holds_only_setup_files(log_dir):
                return False
            shutil.rmtree(log_dir)
        for parent in self.created[1:]:
            try:
                parent.rmdir()  # only when empty
            except OSError:
                break
        return True


def _holds_only_setup_files(folder: Path) -> bool:
    for entry in folder.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            if any(entry.iterdir()):  # an empty checkpoints/ folder is no result
                return False
        elif entry.name not in _WRITTEN_BEFORE_TRAINING or not entry.is_file():
            return False
        elif entry.name.endswith("metrics.csv") and len(entry.read_bytes().splitlines()) > 1:
            return False
    return True
