"""Host time per training step: the plain loop, bare Lightning, and the app as train.py builds it, with a tiny model.

    python bench/host_overhead.py                    # CPU: microseconds of Python per step, layer by layer
    python bench/host_overhead.py --device cuda      # the same with CUDA launches (a host-bound loop on purpose)

The model is one linear layer on 8x8 images, so the step time is the loop's own cost: what the host spends per step
on the framework, the module's hooks and metrics, the callbacks and the data path. On a GPU that cost is hidden while
the host runs ahead of the device (ResNet-50 in bf16: the app is within 1% of the plain loop); it shows as idle GPU
time after every host sync, such as fp16's GradScaler overflow check, and in small, launch-bound models.

Variants, each timed ``--repeat`` times in this process (the fastest is printed; the loop warms up first):
    raw          zero_grad, forward, cross entropy, backward, SGD step, on one cached batch
    lightning    a minimal LightningModule (the loss only) and a Trainer with everything off
    app          train.py's CLI (every forced callback, the CSV logger, the synthetic data module) with the tiny model
                 in place of the ResNet: the module's step metrics, its hooks, the prefetcher's synthetic batches
    app_nvtx     as app, with the profiling window's NVTX step and phase ranges on (its window opens on one more step
                 after the timed ones: the ranges' cost, not the window's)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import pytorch_lightning as pl
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from step_clock import StepClock  # noqa: E402 (bench/, the script's own folder)

IMAGE, CLASSES, BATCH = 8, 10, 4


def tiny_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * IMAGE * IMAGE, CLASSES))


def run_raw(device: str, warmup: int, steps: int) -> float:
    model = tiny_model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    images = torch.randn(BATCH, 3, IMAGE, IMAGE, device=device)
    targets = torch.randint(0, CLASSES, (BATCH,), device=device)
    for step in range(warmup + steps):
        if step == warmup:
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(images), targets).backward()
        optimizer.step()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps


class MinimalModule(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.model = tiny_model()

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        images, targets = batch
        return torch.nn.functional.cross_entropy(self.model(images), targets)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)


class RepeatedBatch:
    """One batch, ``length`` times: a sized iterable, so Lightning adds no collation or worker machinery. It lives on
    ``device`` from the start, as the raw loop's and the app's synthetic batch do: a host-to-device copy every step
    would be charged to Lightning."""

    def __init__(self, length: int, device: str) -> None:
        self.batch = (
            torch.randn(BATCH, 3, IMAGE, IMAGE, device=device),
            torch.randint(0, CLASSES, (BATCH,), device=device),
        )
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __iter__(self):  # noqa: ANN204
        return iter([self.batch] * self.length)


def run_lightning(device: str, warmup: int, steps: int) -> float:
    clock = StepClock(warmup, warmup + steps)
    trainer = pl.Trainer(
        accelerator="gpu" if device == "cuda" else "cpu",
        devices=1,
        max_steps=warmup + steps,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[clock],
    )
    trainer.fit(MinimalModule(), RepeatedBatch(warmup + steps + 1, device))
    return clock.seconds / steps


def run_app(device: str, warmup: int, steps: int, nvtx: bool) -> float:
    import train

    # The NVTX ranges come with a profiling window (none without one); it opens on one step after the timed ones, so
    # they carry the ranges' cost and not the window's (cudaProfilerStart and the synchronize at its end).
    total = warmup + steps + nvtx
    with tempfile.TemporaryDirectory() as run_dir:
        args = [
            "--trainer.accelerator", "gpu" if device == "cuda" else "cpu", "--trainer.devices", "1",
            "--trainer.max_steps", str(total), "--trainer.limit_val_batches", "0",
            "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
            "--trainer.default_root_dir", run_dir, "--trainer.logger.init_args.save_dir", run_dir,
            "--model.arch", "resnet18",  # replaced below: the module's code path, not the ResNet's compute
            "--data.source", "synthetic", "--data.batch_size", str(BATCH), "--data.crop_size", str(IMAGE),
            "--data.synthetic_num_classes", str(CLASSES), "--data.synthetic_train_steps", str(total + 1),
        ]  # fmt: skip
        if nvtx:
            args += ["--profile.start_step", str(warmup + steps), "--profile.num_steps", "1"]
            args += ["--profile.report", "false"]
        cli = train.ImageNetCLI(
            train.ImageNetClassifier, train.ImageNetDataModule, args=args, run=False, **train.CLI_SETTINGS
        )
        cli.model.model = tiny_model()
        clock = StepClock(warmup, warmup + steps)
        cli.trainer.callbacks.append(clock)
        cli.trainer.fit(cli.model, cli.datamodule)
    return clock.seconds / steps


def main(argv: list[str] | None = None) -> dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--steps", type=int, default=300, help="timed steps per repeat")
    p.add_argument("--warmup", type=int, default=30, help="untimed steps first, at least 1 (default %(default)s)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--variants", default="raw,lightning,app,app_nvtx")
    a = p.parse_args(argv)
    # The clock starts at the end of step --warmup (StepClock counts steps from 1), and the first steps carry the
    # one-time costs (CUDA's start-up, the first launches) that the timed ones must not.
    if a.warmup < 1:
        p.error(f"--warmup {a.warmup}: give at least 1 untimed step (the clock starts at the end of step --warmup)")
    if a.steps < 1:
        p.error(f"--steps {a.steps}: give at least 1 timed step")
    if a.repeat < 1:
        p.error(f"--repeat {a.repeat}: give at least 1 (the fastest of the repeats is printed)")
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: no CUDA device here")
    runners: dict[str, Callable[[], float]] = {
        "raw": lambda: run_raw(a.device, a.warmup, a.steps),
        "lightning": lambda: run_lightning(a.device, a.warmup, a.steps),
        "app": lambda: run_app(a.device, a.warmup, a.steps, nvtx=False),
        "app_nvtx": lambda: run_app(a.device, a.warmup, a.steps, nvtx=True),
    }
    variants = a.variants.split(",")
    unknown = sorted(set(variants) - set(runners))
    if unknown:
        sys.exit(f"unknown variant(s) {unknown}; valid: {sorted(runners)}")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the loop's cost, not intra-op parallelism over a tiny tensor
    results: dict[str, float] = {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Lightning's advice about workers and logging intervals, every repeat
            for variant in variants:
                results[variant] = min(runners[variant]() for _ in range(a.repeat))
    finally:
        # Given back: a caller in the same process (the test suite) would train on one thread, with another float
        # summation order than its other runs.
        torch.set_num_threads(threads)
    print(f"\n| variant ({a.device}, batch {BATCH} of {IMAGE}x{IMAGE}, linear model) | us/step | over previous |")
    print("|---|---|---|")
    previous = None
    for variant, seconds in results.items():
        extra = "-" if previous is None else f"{(seconds - previous) * 1e6:+.0f}"
        print(f"| {variant} | {seconds * 1e6:.0f} | {extra} |")
        previous = seconds
    return results


if __name__ == "__main__":
    main()
