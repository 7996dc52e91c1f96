"""The run's CSV logger: Lightning's ``CSVLogger``, except that a resumed run keeps the metrics logged before it.

A requeued job resumes into the same run folder (``--trainer.logger.init_args.version NAME --ckpt_path last``), and
Lightning's writer deleted that folder's ``metrics.csv`` when it started: every requeue threw away the loss and
accuracy history of the segments before it. When train.py says the run resumes, the writer appends instead (with
the union of both segments' columns). Rows that the interrupted run logged after its last checkpoint stay, and the
resumed run logs those steps again.
"""

from __future__ import annotations

import csv

from lightning_fabric.utilities.rank_zero import rank_zero_only
from pytorch_lightning.loggers import CSVLogger
from pytorch_lightning.loggers.csv_logs import ExperimentWriter


class _AppendingWriter(ExperimentWriter):
    """Keeps an existing ``metrics.csv`` and continues it; its header is the columns so far."""

    def _check_log_dir_exists(self) -> None:
        if not self._fs.isfile(self.metrics_file_path):
            return
        with self._fs.open(self.metrics_file_path, "r", newline="") as file:
            header = next(csv.reader(file), [])
        # New columns in the resumed segment make the writer rewrite the file with the union as its header.
        self.metrics_keys = sorted(header)


class RunLogger(CSVLogger):
    """Lightning's ``CSVLogger`` (same arguments, same files) whose ``metrics.csv`` survives a resume.

    ``resuming`` is set by train.py when ``--ckpt_path`` is given: the run continues the one whose folder it writes
    into. A fresh run into an existing folder starts the file anew, as Lightning's does.
    """

    resuming = False

    @property
    def experiment(self) -> ExperimentWriter:  # type: ignore[override]
        if self._experiment is None and self.resuming and rank_zero_only.rank == 0:  # rank 0 writes, as Lightning's
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _AppendingWriter(log_dir=self.log_dir)
        return super().experiment
