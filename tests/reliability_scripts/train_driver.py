"""A small training run of the application's model and data module, for the preemption and dead-rank tests.

    python train_driver.py --root DATA --out OUT [--devices 2] [--ready-step 3] [--die-rank 1 --die-step 3 ...]
    python train_driver.py --accelerator gpu --devices 2 ...     # NCCL: the tests of test_gpu_reliability.py

It builds the Trainer the way train.py does where it matters here (AtomicCheckpointIO, PreemptionHandler, a
ModelCheckpoint with save_last, DDPStrategy with a timeout for 2 devices: gloo on CPU, NCCL on GPUs) and trains
resnet18 on 32-pixel crops until it is stopped. ``--die-mode``: ``exit`` (``os._exit(3)``), ``kill`` (SIGKILL to
itself: no cleanup, like ``kill -9`` or the OOM killer) or ``hang``. Lightning's DDP launcher re-runs this script
(sys.argv) for rank 1, so it is a script, not a test. It writes, under OUT:

* ``ready_rank<r>.json`` once rank r has done ``--ready-step`` optimizer steps: ``{"pid", "step", "workers"}``
  (``workers``: the pids of its data loader workers);
* with ``--signal-rank r``: rank r sends itself SIGTERM when training starts (before the first step);
* ``dying_rank<r>.json`` just before rank r dies or hangs on purpose: ``{"time", "step"}``;
* ``stop_rank<r>.json`` when fit ends with an exception: ``{"exception", "code", "step", "time"}``;
* checkpoints under ``OUT/checkpoints``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from datetime import timedelta
from multiprocessing import active_children
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: the application modules

import pytorch_lightning as pl  # noqa: E402
from pytorch_lightning.callbacks import Callback, ModelCheckpoint  # noqa: E402
from pytorch_lightning.strategies import DDPStrategy  # noqa: E402

from callbacks.preemption import PreemptionHandler  # noqa: E402
from checkpoint_io import AtomicCheckpointIO  # noqa: E402
from datamodule import ImageNetDataModule  # noqa: E402
from imagenet_module import ImageNetClassifier  # noqa: E402


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Writes through a rename, so a polling test never reads half a file."""
    temp = path.with_suffix(".part")
    temp.write_text(json.dumps(data))
    os.replace(temp, path)


class Probe(Callback):
    """Reports progress, dies or hangs on purpose, and records how fit ended (see the module docstring)."""

    def __init__(
        self, out: Path, ready_step: int, die_rank: int, die_step: int, die_mode: str, signal_rank: int = -1
    ) -> None:
        self.out = out
        self.signal_rank = signal_rank
        self.ready_step = ready_step
        self.die_rank = die_rank
        self.die_step = die_step
        self.die_mode = die_mode
        self.ready = False

    def _maybe_die(self, trainer: pl.Trainer) -> None:
        if trainer.global_rank == self.die_rank and trainer.global_step == self.die_step:
            write_json(self.out / f"dying_rank{trainer.global_rank}.json", {"time": time.time(), "step": self.die_step})
            if self.die_mode == "exit":
                os._exit(3)
            if self.die_mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(3600)  # "hang": a rank stuck outside any collective, e.g. on a dead file system

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.global_rank == self.signal_rank:
            os.kill(os.getpid(), signal.SIGTERM)  # a scheduler's signal during start-up, before the first step
        # Counts the strategy's broadcasts made by Lightning's max_time timer (a blocking collective each, which it
        # made every step).
        self.timer_broadcasts = 0
        strategy, broadcast = trainer.strategy, trainer.strategy.broadcast

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.timer_broadcasts += sys._getframe(1).f_code.co_name == "_check_time_remaining"
            return broadcast(*args, **kwargs)

        strategy.broadcast = counted

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, idx: int) -> None:
        self._maybe_die(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        write_json(
            self.out / f"end_rank{trainer.global_rank}.json",
            {"step": trainer.global_step, "timer_broadcasts": self.timer_broadcasts},
        )

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, idx: int
    ) -> None:
        if not self.ready and trainer.global_step >= self.ready_step:
            self.ready = True
            workers = [child.pid for child in active_children()]  # the data loader workers
            ready = {"pid": os.getpid(), "step": trainer.global_step, "workers": workers}
            write_json(self.out / f"ready_rank{trainer.global_rank}.json", ready)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        write_json(
            self.out / f"stop_rank{trainer.global_rank}.json",
            {
                "exception": type(exception).__name__,
                "code": getattr(exception, "code", None),
                "step": trainer.global_step,
                "time": time.time(),
            },
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--root", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--accelerator", choices=["cpu", "gpu"], default="cpu")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--timeout-s", type=float, default=60.0, help="DDP timeout (2 devices)")
    parser.add_argument("--ready-step", type=int, default=3)
    parser.add_argument("--die-rank", type=int, default=-1)
    parser.add_argument("--die-step", type=int, default=-1)
    parser.add_argument("--die-mode", choices=["exit", "kill", "hang"], default="exit")
    parser.add_argument("--max-steps", type=int, default=2000, help="a bound in case a stop never comes")
    parser.add_argument("--workers", type=int, default=0, help="data loader worker processes")
    parser.add_argument("--max-time", default=None, help="trainer.max_time, DD:HH:MM:SS")
    parser.add_argument("--signal-rank", type=int, default=-1, help="this rank gets SIGTERM when training starts")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    data = ImageNetDataModule(
        root=args.root,
        source="folder",
        batch_size=4,
        workers=args.workers,
        crop_size=32,
        min_crop_scale=0.35,
        val_resize_size=36,
        val_crop_size=32,
    )
    model = ImageNetClassifier(arch="resnet18", num_classes=data.num_classes, lr=0.1, warmup_epochs=0, batch_size=4)
    strategy: Any = "auto"
    if args.devices > 1:
        strategy = DDPStrategy(timeout=timedelta(seconds=args.timeout_s))
    trainer = pl.Trainer(
        accelerator=args.accelerator,
        devices=args.devices,
        strategy=strategy,
        plugins=[AtomicCheckpointIO()],
        callbacks=[
            PreemptionHandler(),
            # Only the folder and the "last" naming matter here; no epoch-end files (90 MB each for resnet18).
            ModelCheckpoint(dirpath=out / "checkpoints", save_top_k=0, save_last=True),
            Probe(out, args.ready_step, args.die_rank, args.die_step, args.die_mode, args.signal_rank),
        ],
        max_epochs=-1,
        max_steps=args.max_steps,
        max_time=args.max_time,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        log_every_n_steps=2,
    )
    trainer.fit(model, data)


if __name__ == "__main__":
    main()
