"""The LightningModule: learning-rate schedule and scaling, model building and weights loading, metrics."""

from __future__ import annotations

import csv
import math
import re
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
import torchvision
from core_probes import QUIET, LRLog
from torch.utils.data import DataLoader, TensorDataset

import step_metrics
from bad_image_policy import IGNORED_TARGET
from datamodule import ImageNetDataModule
from imagenet_module import ImageNetClassifier
from torchvision_models import build_model


# --- the schedule in a fit (lr_multiplier alone: tests/test_lr_schedule.py) ----------------------------------------
@pytest.mark.parametrize(
    ("max_epochs", "max_steps", "end", "steps"), [(None, 6, 6, 6), (1, 6, 4, 4), (3, -1, 12, 12), (3, 6, 12, 6)]
)
def test_cosine_anneals_to_zero_at_the_end_of_training(
    max_epochs: int | None, max_steps: int, end: int, steps: int
) -> None:
    # A run bounded by max_steps alone annealed over 90 epochs: its rate all but flat. With max_epochs, the curve is
    # the epochs' whatever max_steps cuts off (a profiling run, a resume with another max_steps).
    model = ImageNetClassifier(arch="resnet18", num_classes=4, lr_schedule="cosine", warmup_epochs=0, batch_size=2)
    data = DataLoader(TensorDataset(torch.randn(8, 3, 32, 32), torch.tensor([0, 1, 2, 3] * 2)), batch_size=2)
    rates = []

    class Rates(pl.Callback):
        def on_train_batch_start(self, trainer: pl.Trainer, *args: object) -> None:
            rates.append(trainer.optimizers[0].param_groups[0]["lr"])

    trainer = pl.Trainer(
        accelerator="cpu", max_epochs=max_epochs, max_steps=max_steps, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0, callbacks=[Rates()],
    )  # fmt: skip
    trainer.fit(model, data)
    base = 0.1 * 2 / 256
    assert trainer.global_step == steps and len(rates) == steps
    expected = [base * 0.5 * (1 + math.cos(math.pi * step / end)) for step in range(steps)]
    assert rates == pytest.approx(expected)
    if steps == end:
        assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.0, abs=1e-12)  # zero at the end


def test_cosine_without_an_end_of_training_is_refused() -> None:
    model = ImageNetClassifier(arch="resnet18", num_classes=4, lr_schedule="cosine", batch_size=2)
    data = DataLoader(TensorDataset(torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 3])), batch_size=2)
    trainer = pl.Trainer(accelerator="cpu", max_epochs=-1, logger=False, enable_progress_bar=False)
    with pytest.raises(ValueError, match="set trainer.max_epochs or trainer.max_steps"):
        trainer.fit(model, data)


# --- learning-rate scaling and configure_optimizers --------------------------------------------------------------
def mocked_trainer(
    world_size: int,
    accumulate: int,
    batches: int = 10,
    max_epochs: int = 90,
    precision: str = "32-true",
    gradient_clip_val: float | None = None,
) -> SimpleNamespace:
    return SimpleNamespace(
        world_size=world_size,
        accumulate_grad_batches=accumulate,
        num_training_batches=batches,
        max_epochs=max_epochs,
        precision=precision,
        gradient_clip_val=gradient_clip_val,
    )


# (2, 3) and (1, 4): 10 batches make 4 and 3 optimizer steps an epoch, the last of them partial (Lightning steps
# at an epoch's end), so the schedule's epochs are ceil(10 / accumulate) steps long.
@pytest.mark.parametrize(("world", "accumulate"), [(1, 1), (4, 1), (8, 2), (3, 5), (2, 3), (1, 4)])
def test_base_lr_scales_with_the_global_batch(world: int, accumulate: int) -> None:
    model = ImageNetClassifier(arch="resnet18", num_classes=10, lr=0.1, batch_size=32, warmup_epochs=5)
    model._trainer = mocked_trainer(world, accumulate, batches=10)
    assert model.global_batch_size() == 32 * world * accumulate
    config = model.configure_optimizers()
    optimizer, scheduler = config["optimizer"], config["lr_scheduler"]["scheduler"]
    assert config["lr_scheduler"]["interval"] == "step"
    base = 0.1 * 32 * world * accumulate / 256
    spe = math.ceil(10 / accumulate)
    group = optimizer.param_groups[0]
    assert group["initial_lr"] == pytest.approx(base)
    assert group["lr"] == pytest.approx(base / (5 * spe))  # step 0 of the warmup
    assert (group["momentum"], group["weight_decay"], group["nesterov"]) == (0.9, 1e-4, False)
    for _ in range(5 * spe - 1):
        optimizer.step()
        scheduler.step()
    assert group["lr"] == pytest.approx(base)  # step 5*spe - 1: warmup done
    model._trainer = None
    assert model.global_batch_size() == 32  # no trainer: one process


def test_schedule_and_scaling_through_a_real_trainer(shapes_root: Path) -> None:
    """4 epochs of 2 optimizer steps of 2 accumulated batches: every step's rate is the recipe's."""
    spe, accumulate, batch = 2, 2, 8
    model = ImageNetClassifier(
        arch="resnet18", num_classes=10, lr=0.2, batch_size=batch, warmup_epochs=1, lr_milestones=[1, 2, 3]
    )
    dm = ImageNetDataModule(
        root=str(shapes_root), workers=0, batch_size=batch, crop_size=16, val_resize_size=16, val_crop_size=16
    )
    lrs = LRLog()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=4,
        limit_train_batches=spe * accumulate,
        limit_val_batches=0,
        accumulate_grad_batches=accumulate,
        callbacks=[lrs],
        **QUIET,
    )
    trainer.fit(model, dm)
    assert trainer.global_step == 4 * spe
    base = 0.2 * batch * 1 * accumulate / 256
    expected = [base * f for f in (1 / 2, 1, 0.1, 0.1, 0.01, 0.01, 0.001, 0.001)]
    assert list(lrs.lr) == list(range(4 * spe))
    assert [lrs.lr[s] for s in range(4 * spe)] == pytest.approx(expected)
    assert [lrs.epoch[s] for s in range(4 * spe)] == [0, 0, 1, 1, 2, 2, 3, 3]


# --- the SGD kernel: fused, and GradScaler's skipped steps -------------------------------------------------------
@pytest.mark.parametrize(
    ("fused_sgd", "device", "precision", "clip", "expected"),
    [
        (None, "cpu", "32-true", None, False),  # auto: torch's default off CUDA
        (None, "cuda", "bf16-mixed", None, True),
        (None, "cuda", "16-mixed", None, True),
        (None, "cuda", "16-mixed", 1.0, False),  # Lightning's mixed-precision plugin refuses clipping when fused
        (None, "cuda", "bf16-mixed", 1.0, False),
        (None, "cuda", "32-true", 1.0, True),  # no mixed-precision plugin: clipping works with the fused kernel
        (True, "cpu", "32-true", None, True),
        (False, "cuda", "16-mixed", None, False),
    ],
)
def test_fused_sgd_choice(
    fused_sgd: bool | None, device: str, precision: str, clip: float | None, expected: bool
) -> None:
    model = ImageNetClassifier(arch="resnet18", num_classes=10, batch_size=32, fused_sgd=fused_sgd)
    model._trainer = mocked_trainer(1, 1, precision=precision, gradient_clip_val=clip)
    model._device = torch.device(device, 0) if device == "cuda" else torch.device(device)  # read only: no CUDA call
    assert model._fused_sgd() is expected


def linear_classifier(**kwargs: object) -> ImageNetClassifier:
    """The module around a linear layer on 3x2x2 images: its optimizer and hooks without a ResNet's CPU time."""
    model = ImageNetClassifier(arch="resnet18", num_classes=10, batch_size=6, warmup_epochs=0, **kwargs)
    model.model = RecordingLinear(3 * 2 * 2, 10)
    return model


def random_loader(batches: int, seed: int = 0) -> DataLoader:
    generator = torch.Generator().manual_seed(seed)
    images, targets = torch.randn(batches * 6, 3, 2, 2, generator=generator), torch.randint(0, 10, (batches * 6,))
    return DataLoader(TensorDataset(images, targets), batch_size=6)


@pytest.mark.parametrize("precision", ["bf16-mixed", "32-true"])
def test_fused_sgd_and_clipping_through_a_real_trainer(precision: str) -> None:
    """Lightning's mixed-precision plugin refuses gradient clipping with a fused optimizer (at the first step, a
    RuntimeError from deep inside the loop): the module says so before training. Without that plugin it trains."""
    model = linear_classifier(fused_sgd=True)
    trainer = pl.Trainer(
        accelerator="cpu", max_steps=2, gradient_clip_val=1.0, precision=precision, limit_val_batches=0, **QUIET
    )
    if precision == "32-true":
        trainer.fit(model, random_loader(2))
        assert trainer.global_step == 2 and trainer.optimizers[0].param_groups[0]["fused"] is True
        return
    with pytest.raises(ValueError, match=rf"model.fused_sgd: true .*gradient_clip_val 1.0 under precision {precision}"):
        trainer.fit(model, random_loader(2))
    assert trainer.global_step == 0


@pytest.mark.parametrize("limit", [0, 0.0])
def test_limit_train_batches_0_is_said_as_such(limit: float) -> None:
    """No training batch an epoch leaves the LR schedule, in epochs of steps, without a unit: the message names the
    option, not an unsized loader (the loader here has a length)."""
    trainer = pl.Trainer(accelerator="cpu", max_steps=2, limit_train_batches=limit, limit_val_batches=0, **QUIET)
    with pytest.raises(ValueError) as caught:
        trainer.fit(linear_classifier(), random_loader(4))
    assert str(caught.value) == (
        "trainer.limit_train_batches 0 leaves no training batch an epoch; the LR schedule (warmup, milestones) "
        "is in epochs of training steps: use at least one batch (e.g. --trainer.limit_train_batches 1.0)"
    )


def fit_fp16_with_overflows(fused_sgd: bool, steps: int = 10) -> tuple[ImageNetClassifier, pl.Trainer, float]:
    """A linear classifier under fp16 autocast on the CPU with GradScaler starting at 2^20: the fp16 gradients of the
    first steps overflow, as a real fp16 run's do at 65536, and GradScaler must skip those steps."""
    from pytorch_lightning.plugins.precision import MixedPrecision

    torch.manual_seed(0)
    model = linear_classifier(fused_sgd=fused_sgd)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**20)
    trainer = pl.Trainer(accelerator="cpu", max_epochs=1, plugins=[MixedPrecision("16-mixed", "cpu", scaler)], **QUIET)
    trainer.fit(model, random_loader(steps))
    assert model.model.outputs[0].dtype == torch.float16  # the forward really ran in fp16
    return model, trainer, scaler.get_scale()


def test_fused_sgd_skips_overflow_steps_exactly_as_the_unfused_one() -> None:
    """fp16's first steps overflow by design. The fused kernel skips them on the device (no host sync); from zeroed
    momentum buffers the run is bit-identical to torch's unfused SGD, which GradScaler skips from the host. (torch's
    own fused SGD leaves its first-step buffers uninitialized when that step is skipped: this test then fails.)"""
    fused, fused_trainer, fused_scale = fit_fp16_with_overflows(True)
    unfused, _, unfused_scale = fit_fp16_with_overflows(False)
    optimizer = fused_trainer.optimizers[0]
    assert optimizer.param_groups[0]["fused"] and optimizer._step_supports_amp_scaling
    # 2^20 halved four times: the first four steps, the very first included, were skipped in both runs.
    assert fused_scale == unfused_scale == 2.0**16
    untrained = RecordingLinear(3 * 2 * 2, 10)
    for key, value in fused.state_dict().items():
        assert torch.equal(value, unfused.state_dict()[key]), key
    assert not torch.equal(fused.model.linear.weight, untrained.linear.weight)


class OptimizerAtFirstStep(pl.Callback):
    """The SGD flags and momentum buffers as the first training batch of the run starts (after the restore)."""

    def on_train_batch_start(self, trainer: pl.Trainer, *args: object) -> None:
        if not hasattr(self, "flags"):
            optimizer = trainer.optimizers[0]
            self.flags = (optimizer.param_groups[0]["fused"], optimizer.param_groups[0]["foreach"])
            self.buffers = [optimizer.state[p]["momentum_buffer"].clone() for p in optimizer.param_groups[0]["params"]]


@pytest.mark.parametrize(("saved_fused", "resumed_fused"), [(True, False), (False, True)])
def test_a_checkpoint_does_not_switch_the_sgd_kernel(tmp_path: Path, saved_fused: bool, resumed_fused: bool) -> None:
    """torch's load_state_dict takes the saved param_groups' "fused" and "foreach" flags: a checkpoint resumed with the
    other kernel must run the kernel this run chose (fused, or torch's default: foreach on CUDA), with the saved
    momentum."""

    def fit(fused_sgd: bool, epochs: int, ckpt: Path | None) -> tuple[pl.Trainer, OptimizerAtFirstStep]:
        probe = OptimizerAtFirstStep()
        trainer = pl.Trainer(accelerator="cpu", max_epochs=epochs, callbacks=[probe], **QUIET)
        trainer.fit(linear_classifier(fused_sgd=fused_sgd), random_loader(4), ckpt_path=ckpt)
        return trainer, probe

    first, _ = fit(saved_fused, 1, None)
    first.save_checkpoint(tmp_path / "first.ckpt")
    saved = torch.load(tmp_path / "first.ckpt", weights_only=False)["optimizer_states"][0]
    assert saved["param_groups"][0]["fused"] is (True if saved_fused else None)
    resumed, probe = fit(resumed_fused, 2, tmp_path / "first.ckpt")
    assert resumed.global_step == 8
    assert probe.flags == ((True, None) if resumed_fused else (None, None))
    saved_buffers = [saved["state"][i]["momentum_buffer"] for i in saved["param_groups"][0]["params"]]
    assert len(probe.buffers) == len(saved_buffers) == 2
    for restored, kept in zip(probe.buffers, saved_buffers, strict=True):
        assert torch.equal(restored, kept) and kept.abs().sum() > 0  # the trained momentum, not fresh zeros


@pytest.fixture(scope="module")
def training_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint Lightning wrote of this module after one step (a 10-class linear net, keys ``model.linear.*``)."""
    trainer = pl.Trainer(accelerator="cpu", max_steps=1, limit_val_batches=0, **QUIET)
    trainer.fit(linear_classifier(), random_loader(1))
    path = tmp_path_factory.mktemp("run") / "last.ckpt"
    trainer.save_checkpoint(path)
    return path


def test_weights_from_a_training_checkpoint_point_to_ckpt_path(training_checkpoint: Path, tmp_path: Path) -> None:
    """This application's own checkpoint (Lightning's, the net under ``model.``) given as model.weights: resumed with
    --ckpt_path, not a page of missing and unexpected keys. Its state_dict re-saved alone is recognized too."""
    resaved = tmp_path / "resaved.ckpt"
    torch.save({"state_dict": torch.load(training_checkpoint, weights_only=True)["state_dict"]}, resaved)
    for path in (training_checkpoint, resaved):
        with pytest.raises(ValueError) as caught:
            build_model("resnet18", 10, str(path))
        assert str(caught.value) == (
            f"model.weights: {path} is a training checkpoint of this application; resume it with --ckpt_path {path} "
            f"(or evaluate it with `train.py validate --ckpt_path {path}`)"
        )


# --- module arguments and metrics --------------------------------------------------------------------------------
def test_the_model_is_built_from_model_arch_and_model_weights(tmp_path: Path) -> None:
    """torchvision_models.build_model's checks reach the module's arguments (tests/test_torchvision_models.py)."""
    with pytest.raises(ValueError, match="model.arch: unknown architecture 'resnet19'; did you mean resnet18"):
        ImageNetClassifier(arch="resnet19")
    torch.manual_seed(0)
    torch.save(torchvision.models.resnet18(num_classes=1000).state_dict(), tmp_path / "r18.pth")
    model = ImageNetClassifier(arch="resnet18", num_classes=10, weights=str(tmp_path / "r18.pth")).model
    assert model.fc.out_features == 10
    assert torch.equal(model.conv1.weight, torch.load(tmp_path / "r18.pth")["conv1.weight"])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_classes": 1}, "model.num_classes must be >= 2"),
        ({"lr": 0.0}, "model.lr must be > 0"),
        ({"warmup_epochs": -1}, "model.warmup_epochs must be >= 0"),
        ({"lr_milestones": [60, 30]}, "model.lr_milestones must be increasing"),
        ({"lr_milestones": [0, 30]}, "model.lr_milestones must be increasing"),
        ({"lr_milestones": [30, 30]}, r"model.lr_milestones must be increasing epochs >= 1, each once, got \[30, 30\]"),
        ({"label_smoothing": 1.0}, r"model.label_smoothing must be in \[0, 1\)"),
        ({"batch_size": 0}, "model.batch_size must be >= 1"),
        ({"compile_tuning": True}, r"model.compile_tuning .*set model.compile \(default, reduce-overhead"),
        ({"momentum": -0.5}, r"model.momentum must be in \[0, 1\)"),
        ({"momentum": 1.0}, r"model.momentum must be in \[0, 1\)"),
        ({"weight_decay": -1.0}, "model.weight_decay must be >= 0"),
        ({"momentum": 0.0, "nesterov": True}, "model.nesterov needs model.momentum > 0"),
        ({"lr_gamma": -1.0}, "model.lr_gamma must be > 0"),
        ({"lr_gamma": 0.0}, "model.lr_gamma must be > 0"),
        ({"lr": float("nan")}, "model.lr must be a finite number, got nan"),  # YAML's .nan passed every bound
        ({"lr": float("inf")}, "model.lr must be a finite number, got inf"),
        ({"momentum": float("nan")}, "model.momentum must be a finite number"),
        ({"warmup_epochs": float("nan")}, "model.warmup_epochs must be a finite number"),
    ],
)
def test_invalid_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ImageNetClassifier(arch="resnet18", **kwargs)


def test_top5_is_clipped_to_three_classes() -> None:
    model = ImageNetClassifier(arch="resnet18", num_classes=3, batch_size=4)
    assert model._top_k == 3
    dm = ImageNetDataModule(
        source="synthetic", batch_size=4, crop_size=32, synthetic_num_classes=3, synthetic_val_steps=2
    )
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False
    )
    (val,) = trainer.validate(model, dm, verbose=False)
    (test,) = trainer.test(model, dm, verbose=False)
    # Top-3 of 3 classes is always right; top-1 is whatever the untrained net gives.
    assert val["val_acc5"] == 1.0 and test["test_acc5"] == 1.0
    assert val["val_acc1"] == pytest.approx(test["test_acc1"]) and math.isfinite(val["val_loss"])
    assert val["val_loss"] == pytest.approx(test["test_loss"])  # same data, separate metric objects


def test_val_and_test_loss_weigh_every_sample_equally() -> None:
    """Batches of 8 and 3: the epoch loss is the mean over the 11 samples, not the mean of the two batch means."""
    torch.manual_seed(0)
    model = ImageNetClassifier(arch="resnet18", num_classes=10).eval()
    with torch.no_grad():
        model.model.fc.weight *= 50  # confident logits: per-sample losses far apart
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(11, 3, 32, 32, generator=generator)
    targets = torch.randint(0, 10, (11,), generator=generator)
    batches = DataLoader(TensorDataset(images, targets), batch_size=8)  # 8 + 3
    with torch.no_grad():
        losses = F.cross_entropy(model(images), targets, reduction="none")
    expected = float(losses.mean())
    unweighted = float((losses[:8].mean() + losses[8:].mean()) / 2)
    assert abs(unweighted - expected) > 0.05 * expected  # the test can tell the two apart
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False
    )
    (val,) = trainer.validate(model, dataloaders=batches, verbose=False)
    (test,) = trainer.test(model, dataloaders=batches, verbose=False)
    assert val["val_loss"] == pytest.approx(expected, rel=1e-5)
    assert test["test_loss"] == pytest.approx(expected, rel=1e-5)


def test_samples_standing_in_for_bad_images_are_left_out_of_every_metric() -> None:
    """data.on_bad_image: skip gives an evaluation sample that replaced a bad image the target IGNORED_TARGET: the
    loss and both accuracies are those of the other samples alone."""
    torch.manual_seed(0)
    model = ImageNetClassifier(arch="resnet18", num_classes=10).eval()
    generator = torch.Generator().manual_seed(1)
    images = torch.randn(11, 3, 32, 32, generator=generator)
    targets = torch.randint(0, 10, (11,), generator=generator)
    with torch.no_grad():
        logits = model(images)
    ignored = torch.tensor([1, 4, 9])
    targets[ignored] = logits[ignored].argmax(1)  # scored, these three would lift the accuracy
    kept = torch.ones(11, dtype=torch.bool)
    kept[ignored] = False
    expected_acc1 = float((logits[kept].argmax(1) == targets[kept]).float().mean())
    expected_loss = float(F.cross_entropy(logits[kept], targets[kept]))
    assert expected_acc1 < float((logits.argmax(1) == targets).float().mean())  # the test can tell the two apart
    marked = targets.clone()
    marked[ignored] = IGNORED_TARGET
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False
    )
    (val,) = trainer.validate(model, dataloaders=DataLoader(TensorDataset(images, marked), batch_size=4), verbose=False)
    assert val["val_acc1"] == pytest.approx(expected_acc1)
    assert val["val_loss"] == pytest.approx(expected_loss, rel=1e-5)
    top5 = logits[kept].topk(5, dim=1).indices
    assert val["val_acc5"] == pytest.approx(float((top5 == targets[kept, None]).any(1).float().mean()))


@pytest.mark.parametrize("arch", ["googlenet", "inception_v3"])
def test_archs_with_auxiliary_heads_train_on_their_main_head(arch: str) -> None:
    """Built with their auxiliary heads, these returned a namedtuple in training: a crash at the first step."""
    model = ImageNetClassifier(arch=arch, num_classes=4)
    assert not model.model.aux_logits
    images, targets = torch.randn(4, 3, 80, 80), torch.tensor([0, 1, 2, 3])
    trainer = pl.Trainer(
        accelerator="cpu", max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, limit_val_batches=0,
    )  # fmt: skip
    before = model.model.fc.weight.detach().clone()
    trainer.fit(model, DataLoader(TensorDataset(images, targets), batch_size=2))
    assert trainer.global_step == 1 and not torch.equal(model.model.fc.weight, before)


def test_channels_last_model_and_forward() -> None:
    model = ImageNetClassifier(arch="resnet18", num_classes=10, channels_last=True)
    assert model.model.conv1.weight.is_contiguous(memory_format=torch.channels_last)
    images = torch.randn(2, 3, 32, 32).contiguous(memory_format=torch.channels_last)
    assert model(images).shape == (2, 10)


def test_momentum_nesterov_and_weight_decay_reach_the_optimizer() -> None:
    model = ImageNetClassifier(arch="resnet18", num_classes=4, momentum=0.5, nesterov=True, weight_decay=3e-4,
                               batch_size=2)  # fmt: skip
    seen = []

    class Groups(pl.Callback):
        def on_train_batch_start(self, trainer: pl.Trainer, *args: object) -> None:
            seen.extend((g["momentum"], g["nesterov"], g["weight_decay"]) for g in trainer.optimizers[0].param_groups)

    trainer = pl.Trainer(
        accelerator="cpu", max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, limit_val_batches=0, callbacks=[Groups()],
    )  # fmt: skip
    trainer.fit(model, DataLoader(TensorDataset(torch.randn(2, 3, 32, 32), torch.tensor([0, 1])), batch_size=2))
    assert seen and set(seen) == {(0.5, True, 3e-4)}


def test_label_smoothing_applies_to_training_only() -> None:
    model = ImageNetClassifier(arch="resnet18", num_classes=10, label_smoothing=0.1)
    model.model = torch.nn.Identity()  # the "images" are the logits
    logits = torch.tensor([[10.0] + [0.0] * 9, [0.0, 4.0] + [0.0] * 8])
    targets = torch.tensor([0, 1])
    plain = float(F.cross_entropy(logits, targets))
    smoothed = float(F.cross_entropy(logits, targets, label_smoothing=0.1))
    assert smoothed > plain + 0.1  # the test can tell the two apart
    assert float(model.training_step((logits, targets), 0)) == pytest.approx(smoothed)
    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    (val,) = trainer.validate(model, DataLoader(TensorDataset(logits, targets), batch_size=2), verbose=False)
    assert val["val_loss"] == pytest.approx(plain)  # validation scores the plain loss, as the original did


# --- torch.compile -----------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_compiled_model_trains_like_eager_and_saves_plain_weights(shapes_root: Path, tmp_path: Path) -> None:
    """``model.compile`` (inductor, here on the CPU): the same step as eager up to summation order, the compiled
    forward really used, and checkpoints keyed as the eager model's (no ``_orig_mod`` or second copy of the weights)."""

    def fit(compile: str | None) -> tuple[ImageNetClassifier, pl.Trainer]:
        pl.seed_everything(0)
        model = ImageNetClassifier(arch="resnet18", num_classes=10, batch_size=8, warmup_epochs=0, compile=compile)
        dm = ImageNetDataModule(
            root=str(shapes_root), workers=0, batch_size=8, crop_size=32, val_resize_size=36, val_crop_size=32
        )
        trainer = pl.Trainer(
            accelerator="cpu",
            devices=1,
            max_steps=1,
            limit_val_batches=0,
            **QUIET,
        )
        trainer.fit(model, dm)
        return model, trainer

    eager, _ = fit(None)
    torch._dynamo.reset()
    compiled, trainer = fit("default")
    assert compiled._compiled is not None
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # dynamo captured the forward
    eager_state, compiled_state = eager.state_dict(), compiled.state_dict()
    assert list(compiled_state) == list(eager_state)
    pl.seed_everything(0)
    untrained = ImageNetClassifier(arch="resnet18", num_classes=10, batch_size=8).state_dict()
    for key, value in eager_state.items():
        # Inductor sums in another order, and batch-8 BatchNorm on 1x1 maps amplifies that: the bound is relative to how
        # far the step moved each tensor (measured: at most 0.14%; 10% after 3 steps, as momentum compounds it).
        update = (value.double() - untrained[key].double()).abs().max().item()
        difference = (compiled_state[key].double() - value.double()).abs().max().item()
        assert difference <= 0.01 * update + 1e-7, (key, difference, update)
    assert (eager_state["model.fc.weight"] - untrained["model.fc.weight"]).abs().max() > 1e-4  # the steps trained
    trainer.save_checkpoint(tmp_path / "compiled.ckpt")
    saved = torch.load(tmp_path / "compiled.ckpt", weights_only=False)["state_dict"]
    assert list(saved) == list(eager_state)


def test_compiled_training_graph_keeps_static_shapes_after_a_short_validation_batch(
    shapes_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sanity check before training runs the compiled model on a full and a short validation batch (60 images in
    batches of 32: 32, then 28). torch.compile's default then marks the batch size dynamic and compiles the training
    graph that follows with a symbolic batch size (on an H200, ResNet-50 reduce-overhead ran at 5,042 img/s, and at
    6,375 with the sanity check off). Every graph must stay static. The mode's backend is swapped for one that records
    what it is given."""
    graphs: list[tuple[bool, int, list[int]]] = []  # (grad enabled, symbolic inputs, batch sizes of the images)

    def recording_backend(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        placeholders = [node.meta.get("example_value") for node in gm.graph.nodes if node.op == "placeholder"]
        symbolic = sum(isinstance(value, torch.SymInt) for value in placeholders)
        images = [t for t in example_inputs if isinstance(t, torch.Tensor) and tuple(t.shape[1:]) == (3, 32, 32)]
        graphs.append((torch.is_grad_enabled(), symbolic, [int(t.shape[0]) for t in images]))
        return gm.forward

    real_compile = torch.compile

    def compile_with_recording_backend(model: torch.nn.Module, *, mode: str | None = None, **options: object) -> object:
        assert mode == "reduce-overhead"
        return real_compile(model, backend=recording_backend, **options)

    monkeypatch.setattr(torch, "compile", compile_with_recording_backend)
    torch._dynamo.reset()
    model = ImageNetClassifier(arch="resnet18", num_classes=10, batch_size=32, compile="reduce-overhead")
    dm = ImageNetDataModule(
        root=str(shapes_root), workers=0, batch_size=32, crop_size=32, val_resize_size=36, val_crop_size=32
    )
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=1, num_sanity_val_steps=2, **QUIET)
    try:
        trainer.fit(model, dm)
    finally:
        torch._dynamo.reset()  # the recording backend's graphs stay out of the other tests' caches
    assert [(grad, batches) for grad, _, batches in graphs] == [(False, [32]), (False, [28]), (True, [32])]
    assert [symbolic for _, symbolic, _ in graphs] == [0, 0, 0]


@pytest.mark.parametrize(
    ("mode", "mode_options"),
    [("reduce-overhead", {"triton.cudagraphs": True}), ("default", {}), ("max-autotune", None)],
)
def test_compile_tuning_adds_coordinate_descent_to_the_mode_for_this_model_only(
    mode: str, mode_options: dict | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``model.compile_tuning``: torch.compile gets the mode's own options plus inductor's coordinate-descent tuning
    (it refuses a mode and options together), and torch accepts them; the process-wide inductor config is left as it
    was. Without it, the mode alone."""
    calls: list[dict] = []
    real_compile = torch.compile

    def recording_compile(model: torch.nn.Module, **kwargs: object) -> object:
        calls.append(kwargs)
        return real_compile(model, **kwargs)  # torch validates the option names and types here

    monkeypatch.setattr(torch, "compile", recording_compile)
    before = torch._inductor.config.coordinate_descent_tuning
    for tuning in (True, False):
        ImageNetClassifier(arch="resnet18", num_classes=10, compile=mode, compile_tuning=tuning).configure_model()
    tuned, plain = calls
    assert plain == {"mode": mode, "dynamic": False}
    assert set(tuned) == {"options", "dynamic"} and tuned["dynamic"] is False
    assert tuned["options"]["coordinate_descent_tuning"] is True
    if mode_options is not None:
        assert tuned["options"] == {**mode_options, "coordinate_descent_tuning": True}
    else:  # max-autotune: its own options (template search, CUDA graphs) kept, tuning already among them
        assert tuned["options"]["max_autotune"] is True and tuned["options"]["triton.cudagraphs"] is True
    assert torch._inductor.config.coordinate_descent_tuning == before


# --- the training metrics: known answers ---------------------------------------------------------------------------
class RecordingLinear(torch.nn.Module):
    """A linear classifier that keeps every output it returned, to compute the metrics the module should log."""

    def __init__(self, features: int, classes: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(features, classes)
        self.outputs: list[torch.Tensor] = []

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        logits = self.linear(images.flatten(1))
        self.outputs.append(logits.detach().clone())
        return logits


# Global steps 2, 4, 6, 8 log batches {1}, {2, 3}, {4, 5}, {6, 7} (0-based); batch 0 starts the clock. With two
# micro-batches a step, steps 2 and 4 log batches {2, 3} and {4, 5, 6, 7}: the whole first step (batches 0 and 1)
# starts the clock, not its first micro-batch alone.
@pytest.mark.parametrize(
    ("accumulate", "logs"),
    [(1, [(2, range(1, 2)), (4, range(2, 4)), (6, range(4, 6)), (8, range(6, 8))]),
     (2, [(2, range(2, 4)), (4, range(4, 8))])],
)  # fmt: skip
def test_logged_interval_and_epoch_metrics_are_means_over_their_images(accumulate, logs) -> None:
    """train_loss/acc1/acc5 every log_every_n_steps steps over the steps since the last log (the first step only starts
    the clock), and train_loss_epoch over every image of the epoch, from the logits the model actually returned."""
    torch.manual_seed(0)
    classes, batch, batches = 10, 6, 4
    images, targets = torch.randn(batches * batch, 3, 2, 2), torch.randint(0, classes, (batches * batch,))
    loader = DataLoader(TensorDataset(images, targets), batch_size=batch)  # the same order every epoch
    model = ImageNetClassifier(arch="resnet18", num_classes=classes, batch_size=batch, lr=2.0, warmup_epochs=0)
    model.model = RecordingLinear(3 * 2 * 2, classes)  # lr 2.0: the logits move from step to step
    logged: list[tuple[object, dict]] = []
    model.log_dict = lambda metrics, **_: logged.append((model.global_step, dict(metrics)))
    epoch_options: list[dict] = []
    model.log = lambda name, value, **options: (
        logged.append((name, {name: float(value)})) or epoch_options.append(options)
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        max_epochs=2,
        log_every_n_steps=2,
        accumulate_grad_batches=accumulate,
        **QUIET,
    )
    trainer.fit(model, loader)

    per_batch = []  # (mean loss, top-1 hits, top-5 hits) of each batch, in training order
    for k, logits in enumerate(model.model.outputs):
        wanted = targets[(k % batches) * batch : (k % batches + 1) * batch]
        hit = logits.topk(5, dim=1).indices == wanted[:, None]
        per_batch.append((F.cross_entropy(logits, wanted).item(), hit[:, 0].sum().item(), hit.any(dim=1).sum().item()))
    assert len(per_batch) == 2 * batches

    def means(ks: range) -> dict[str, float]:
        n = batch * len(ks)
        return {
            "train_loss": sum(per_batch[k][0] for k in ks) * batch / n,
            "train_acc1": sum(per_batch[k][1] for k in ks) / n,
            "train_acc5": sum(per_batch[k][2] for k in ks) / n,
        }

    intervals = [
        (step, {k: v for k, v in m.items() if k != "train_img_s"}) for step, m in logged if step != "train_loss_epoch"
    ]
    expected = [(step, means(ks)) for step, ks in logs]
    assert [s for s, _ in intervals] == [s for s, _ in expected]
    for (_, got), (_, want) in zip(intervals, expected, strict=True):
        assert got == pytest.approx(want, rel=1e-6)
    epochs = [m["train_loss_epoch"] for name, m in logged if name == "train_loss_epoch"]
    assert epochs == pytest.approx([means(range(0, 4))["train_loss"], means(range(4, 8))["train_loss"]], rel=1e-6)
    # Under DDP, Lightning sums each rank's mean times this weight and the weights: the mean over every rank's images.
    assert [(o["sync_dist"], o["batch_size"]) for o in epoch_options] == [(True, batches * batch)] * 2


class _FakeClock:
    """``time`` for step_metrics: ``perf_counter`` moves only when a test moves it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now


def test_the_interval_speed_leaves_out_validation_and_the_epoch_end(monkeypatch: pytest.MonkeyPatch) -> None:
    """train_img_s (and the print-freq line) count training only: a validation, and an epoch end with its
    checkpoints, stop the clocks; the first interval after them was charged with all of it."""
    clock = _FakeClock()
    monkeypatch.setattr(step_metrics, "time", clock)
    batch = 4

    class Timed(ImageNetClassifier):
        def training_step(self, batch_: Any, batch_idx: int) -> torch.Tensor:
            clock.now += 1.0  # each training step takes one second
            return super().training_step(batch_, batch_idx)

        def validation_step(self, batch_: Any, batch_idx: int) -> None:
            clock.now += 100.0  # each validation batch takes 100
            super().validation_step(batch_, batch_idx)

    class SlowEpochEnd(pl.Callback):
        def on_train_epoch_end(self, *args: object) -> None:
            clock.now += 50.0  # an epoch-end checkpoint

    model = Timed(arch="resnet18", num_classes=4, batch_size=batch, warmup_epochs=0)
    logged: list[float] = []
    model.log_dict = lambda metrics, **_: logged.append(metrics["train_img_s"])
    data = DataLoader(TensorDataset(torch.randn(16, 3, 32, 32), torch.tensor([0, 1, 2, 3] * 4)), batch_size=batch)
    trainer = pl.Trainer(
        accelerator="cpu", max_epochs=3, log_every_n_steps=2, val_check_interval=2, num_sanity_val_steps=1,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        limit_val_batches=1, callbacks=[SlowEpochEnd()],
    )  # fmt: skip
    trainer.fit(model, data, data)
    assert len(logged) == 6  # steps 2, 4, ..., 12
    assert logged == [pytest.approx(batch / 1.0)] * 6  # one second a step, every interval


@pytest.mark.parametrize(("max_steps", "steps"), [(5, [2, 4, 5]), (4, [2, 4]), (-1, [2, 4, 6, 8])])
def test_the_steps_after_the_last_logged_one_are_logged_when_max_steps_ends_the_fit(
    max_steps: int, steps: list[int], tmp_path: Path
) -> None:
    # Reaching max_steps sets no trainer.should_stop, and Lightning writes step metrics only on its log steps and at
    # a should_stop: step 5's interval (step 5 alone) was never in metrics.csv.
    model = ImageNetClassifier(arch="resnet18", num_classes=4, batch_size=2, warmup_epochs=0)
    data = DataLoader(TensorDataset(torch.randn(16, 3, 8, 8), torch.tensor([0, 1, 2, 3] * 4)), batch_size=2)
    quiet = {k: v for k, v in QUIET.items() if k != "logger"}
    logger = pl.loggers.CSVLogger(tmp_path, name="", version="")
    trainer = pl.Trainer(accelerator="cpu", max_epochs=1, max_steps=max_steps, log_every_n_steps=2,
                         limit_val_batches=0, logger=logger, **quiet)  # fmt: skip
    trainer.fit(model, data)
    with open(tmp_path / "metrics.csv", newline="") as file:
        rows = [row for row in csv.DictReader(file) if row["train_loss"]]
    assert [int(row["step"]) + 1 for row in rows] == steps  # Lightning's step column: the steps done before


def test_the_interval_speed_counts_every_micro_batch_and_the_print_line_says_the_logged_figures(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """train_img_s is the global batch's images a second (not one micro-batch's), and the print-freq line's Prec@1 and
    Prec@5 are the logged train_acc1 and train_acc5."""
    clock = _FakeClock()
    monkeypatch.setattr(step_metrics, "time", clock)
    lines: list[str] = []
    monkeypatch.setattr(step_metrics, "rank_zero_info", lines.append)

    class Timed(ImageNetClassifier):
        def training_step(self, batch_: Any, batch_idx: int) -> torch.Tensor:
            clock.now += 1.0  # each micro-batch takes one second
            return super().training_step(batch_, batch_idx)

    model = Timed(arch="resnet18", num_classes=10, batch_size=4, warmup_epochs=0)
    logged: list[dict] = []
    model.log_dict = lambda metrics, **_: logged.append({k: float(v) for k, v in metrics.items()})
    generator = torch.Generator().manual_seed(0)
    images, targets = torch.randn(32, 3, 32, 32, generator=generator), torch.arange(32) % 10
    trainer = pl.Trainer(accelerator="cpu", max_steps=4, log_every_n_steps=1, accumulate_grad_batches=2,
                         limit_val_batches=0, **QUIET)  # fmt: skip
    trainer.fit(model, DataLoader(TensorDataset(images, targets), batch_size=4))
    assert [m["train_img_s"] for m in logged] == pytest.approx([8 / 2.0] * 3)  # 2 micro-batches of 4 in 2 s
    said = [re.search(r"Prec@1 (\S+)\tPrec@5 (\S+)", line) for line in lines]
    printed = [(float(m[1]), float(m[2])) for m in said if m]
    assert printed == [(round(100 * m["train_acc1"], 3), round(100 * m["train_acc5"], 3)) for m in logged]


def test_interval_metrics_reach_the_csv_after_a_resume_with_another_accumulation(tmp_path: Path) -> None:
    """A checkpoint at step 3 (one batch a step) resumed with two batches a step falls inside a step; Lightning's own
    step counter then lagged, and the print-freq lines of steps 6 and 8 found no metrics.csv row (one, at 5)."""
    import csv

    from callbacks import ResumableCheckpoint

    generator = torch.Generator().manual_seed(0)
    images, targets = torch.randn(24, 3, 32, 32, generator=generator), torch.randint(0, 4, (24,), generator=generator)

    def fit(accumulate: int, ckpt: Path | None = None, **limits: int) -> tuple[list[int], list[int]]:
        model = ImageNetClassifier(arch="resnet18", num_classes=4, batch_size=4, warmup_epochs=0)
        ours: list[int] = []
        log_dict = model.log_dict
        model.log_dict = lambda metrics, **options: ours.append(model.global_step) or log_dict(metrics, **options)
        logger = pl.loggers.CSVLogger(tmp_path, name="logs")
        last = ResumableCheckpoint(dirpath=tmp_path, filename="last", monitor=None, enable_version_counter=False)
        trainer = pl.Trainer(
            accelerator="cpu", accumulate_grad_batches=accumulate, log_every_n_steps=2, logger=logger,
            callbacks=[last], enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0, **limits,
        )  # fmt: skip
        trainer.fit(model, DataLoader(TensorDataset(images, targets), batch_size=4), ckpt_path=ckpt)
        with open(Path(logger.log_dir) / "metrics.csv") as f:
            rows = [int(row["step"]) for row in csv.DictReader(f) if row.get("train_loss")]
        return ours, rows

    fit(1, max_steps=3)
    ours, rows = fit(2, tmp_path / "last.ckpt", max_epochs=2)
    assert ours == [6, 8]
    assert rows == [5, 7]  # Lightning's row of each (its step column counts from 0)


def logging_epoch_losses() -> tuple[ImageNetClassifier, list[tuple[int, int, float]]]:
    """A linear classifier and the (epoch, images, value) of each train_loss_epoch it logs."""
    model, logged = linear_classifier(), []
    log = model.log

    def record(name: str, value: torch.Tensor, **options: object) -> None:
        if name == "train_loss_epoch":
            logged.append((model.current_epoch, model._step_metrics.epoch_images, float(value)))
        log(name, value, **options)

    model.log = record
    return model, logged


def test_a_resume_from_an_epochs_end_logs_the_next_epochs_loss_once(tmp_path) -> None:
    """last.ckpt saved at epoch 0's end, resumed with max_steps: Lightning ran epoch 0's loop and end again, training
    one more batch in it and logging a train_loss_epoch of that batch's 6 images, then epoch 1's of its first 3 batches
    (callbacks/resumable_checkpoint.py, 7.). Epoch 1 logs its loss once, over its 4 batches, as an uninterrupted run."""
    from callbacks.resumable_checkpoint import ResumableCheckpoint

    quiet = {"enable_progress_bar": False, "enable_model_summary": False, "logger": False, "limit_val_batches": 0,
             "default_root_dir": tmp_path}  # fmt: skip
    batches = random_loader(4)  # one for all three fits: its targets come from the global generator
    torch.manual_seed(0)
    whole, whole_logged = logging_epoch_losses()
    pl.Trainer(accelerator="cpu", max_steps=8, **quiet).fit(whole, batches)
    last = ResumableCheckpoint(dirpath=tmp_path, filename="last", monitor=None, enable_version_counter=False)
    torch.manual_seed(0)
    pl.Trainer(accelerator="cpu", callbacks=[last], max_steps=4, **quiet).fit(linear_classifier(), batches)
    assert "train_epoch_loss" not in torch.load(tmp_path / "last.ckpt", weights_only=False)
    resumed, logged = logging_epoch_losses()
    pl.Trainer(accelerator="cpu", max_steps=8, **quiet).fit(resumed, batches, ckpt_path=tmp_path / "last.ckpt")
    assert [(epoch, images) for epoch, images, _ in logged] == [(1, 4 * 6)]
    assert logged == whole_logged[1:] and len(whole_logged) == 2  # the uninterrupted run's epoch 1 mean


def test_a_validation_end_checkpoint_at_an_epochs_last_batch_resumes_that_epochs_loss(tmp_path) -> None:
    """last.ckpt saved at the validation of epoch 0's last batch (val_check_interval 0.5), before the epoch's end ran:
    the resumed run runs that end (Lightning's path for this state) and logs epoch 0's loss over its 24 images, as the
    first run did, not 0.0 over none; then epoch 1's, as an uninterrupted run."""
    from callbacks.resumable_checkpoint import ResumableCheckpoint

    quiet = {"enable_progress_bar": False, "enable_model_summary": False, "logger": False, "limit_val_batches": 1,
             "num_sanity_val_steps": 0, "val_check_interval": 0.5, "default_root_dir": tmp_path}  # fmt: skip
    batches, val = random_loader(4), random_loader(1, seed=1)
    torch.manual_seed(0)
    whole, whole_logged = logging_epoch_losses()
    pl.Trainer(accelerator="cpu", max_steps=8, **quiet).fit(whole, batches, val)
    last = ResumableCheckpoint(dirpath=tmp_path, filename="last", monitor=None, enable_version_counter=False)
    torch.manual_seed(0)
    first, first_logged = logging_epoch_losses()
    pl.Trainer(accelerator="cpu", callbacks=[last], max_steps=4, **quiet).fit(first, batches, val)
    assert torch.load(tmp_path / "last.ckpt", weights_only=False)["train_epoch_loss"]["images"] == 24
    resumed, logged = logging_epoch_losses()
    pl.Trainer(accelerator="cpu", max_steps=8, **quiet).fit(resumed, batches, val, ckpt_path=tmp_path / "last.ckpt")
    assert [(epoch, images) for epoch, images, _ in whole_logged] == [(0, 24), (1, 24)]
    assert first_logged == whole_logged[:1]
    assert logged == whole_logged  # epoch 0's end run again, with the first run's mean; then epoch 1


def test_milestones_past_max_epochs_are_said_and_a_max_steps_run_is_left_alone() -> None:
    with pytest.warns(UserWarning, match=r"model.lr_milestones \[300\] at or past trainer.max_epochs 2: the learning"):
        pl.Trainer(accelerator="cpu", max_epochs=2, **QUIET).fit(
            linear_classifier(lr_milestones=[1, 300]), random_loader(2)
        )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        short_on_purpose = pl.Trainer(accelerator="cpu", max_steps=2, **QUIET)
        short_on_purpose.fit(linear_classifier(lr_milestones=[300]), random_loader(2))
    assert not [w for w in caught if "lr_milestones" in str(w.message)]


def test_a_warmup_longer_than_the_run_is_said_and_cosine_milestones_are_not() -> None:
    model = ImageNetClassifier(arch="resnet18", num_classes=10, batch_size=6, warmup_epochs=5, lr_schedule="cosine")
    model.model = RecordingLinear(3 * 2 * 2, 10)  # lr_milestones left at the recipe's [30, 60, 80]: cosine ignores them
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pl.Trainer(accelerator="cpu", max_epochs=2, **QUIET).fit(model, random_loader(2))
    said = [str(w.message) for w in caught]
    assert any(m.startswith("model.warmup_epochs 5 is longer than trainer.max_epochs 2: the run ends") for m in said)
    assert not [m for m in said if "lr_milestones" in m]


def test_a_checkpoint_at_a_validation_inside_an_epoch_carries_the_epochs_loss_so_far(tmp_path) -> None:
    # Validation every 2 of the epoch's 4 batches: its checkpoint at step 2 is a mid-epoch one; the one at step 4 comes
    # before the epoch's end, which a run resumed from it runs: it carries the whole epoch's loss.
    saves = pl.callbacks.ModelCheckpoint(dirpath=tmp_path, filename="{step}", save_top_k=-1)
    options = {"logger": False, "enable_progress_bar": False, "enable_model_summary": False}
    trainer = pl.Trainer(accelerator="cpu", max_epochs=1, val_check_interval=2, num_sanity_val_steps=0,
                         callbacks=[saves], **options)  # fmt: skip
    trainer.fit(linear_classifier(), random_loader(4), random_loader(1))
    mid, end = (torch.load(tmp_path / f"step={step}.ckpt", weights_only=False) for step in (2, 4))
    assert mid["train_epoch_loss"]["images"] == 2 * 6 and mid["train_epoch_loss"]["epoch"] == 0
    assert end["train_epoch_loss"]["images"] == 4 * 6 and end["train_epoch_loss"]["epoch"] == 0


def test_a_module_fitted_again_from_inside_an_epoch_saves_the_epochs_loss(tmp_path) -> None:
    """The same module object fitted a second time, from a checkpoint inside an epoch (Lightning then skips
    on_train_epoch_start): its checkpoints there carry the epoch's loss so far, though the first fit logged an epoch."""
    options = {"logger": False, "enable_progress_bar": False, "enable_model_summary": False, "limit_val_batches": 0,
               "default_root_dir": tmp_path}  # fmt: skip
    every_step = {"filename": "{step}", "save_top_k": -1, "every_n_train_steps": 1, "monitor": None}
    first = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "a", **every_step)
    pl.Trainer(accelerator="cpu", max_steps=2, callbacks=[first], **options).fit(linear_classifier(), random_loader(4))
    model = linear_classifier()
    pl.Trainer(accelerator="cpu", max_epochs=1, **options).fit(model, random_loader(4))  # an epoch's loss logged
    again = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "b", **every_step)
    pl.Trainer(accelerator="cpu", max_steps=3, callbacks=[again], **options).fit(
        model, random_loader(4), ckpt_path=tmp_path / "a" / "step=2.ckpt"
    )
    saved = torch.load(tmp_path / "b" / "step=3.ckpt", weights_only=False).get("train_epoch_loss")
    assert saved is not None and (saved["epoch"], saved["images"]) == (0, 3 * 6)


@pytest.mark.parametrize(
    ("milestones", "warmup", "said"),
    [
        ([2], 0, ["lr_milestones [2] at or past"]),  # the decay would come at epoch 2's start, which never runs
        ([1], 0, []),  # decays for the last epoch
        ([1], 2, []),  # the warmup reaches the base rate on the run's last step
        ([1], 2.5, ["warmup_epochs 2.5 is longer"]),
    ],
)
def test_the_schedule_warnings_boundaries(milestones: list[int], warmup: float, said: list[str]) -> None:
    """A 2-epoch run: which milestones and warmups are the last ones that still take effect."""
    model = linear_classifier(lr_milestones=milestones)
    model.hparams.warmup_epochs = warmup
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pl.Trainer(accelerator="cpu", max_epochs=2, **QUIET).fit(model, random_loader(2))
    schedule = [m for m in (str(w.message) for w in caught) if m.startswith(("model.lr_milest", "model.warmup"))]
    assert len(schedule) == len(said) and all(f"model.{s}" in m for s, m in zip(said, schedule, strict=True))


def test_log_every_n_steps_0_logs_no_interval_and_still_the_epoch_mean() -> None:
    """Lightning takes ``trainer.log_every_n_steps 0`` as no step logging; the module's interval check divided by it."""
    torch.manual_seed(0)
    images, targets = torch.randn(24, 3, 2, 2), torch.randint(0, 10, (24,))
    model = ImageNetClassifier(arch="resnet18", num_classes=10, batch_size=6, warmup_epochs=0)
    model.model = RecordingLinear(3 * 2 * 2, 10)
    intervals: list[dict] = []
    epoch_means: list[float] = []
    model.log_dict = lambda metrics, **_: intervals.append(metrics)
    model.log = lambda name, value, **_: epoch_means.append(float(value))
    trainer = pl.Trainer(accelerator="cpu", max_epochs=1, log_every_n_steps=0, **QUIET)
    trainer.fit(model, DataLoader(TensorDataset(images, targets), batch_size=6))
    assert trainer.global_step == 4 and intervals == []
    outputs = model.model.outputs
    losses = [F.cross_entropy(logits, targets[6 * k : 6 * k + 6]).item() for k, logits in enumerate(outputs)]
    assert epoch_means == pytest.approx([sum(losses) / 4], rel=1e-6)


# --- resuming a checkpoint of another model ------------------------------------------------------------------------
def test_resuming_a_checkpoint_of_another_class_count_asks_for_its_data(training_checkpoint: Path) -> None:
    """Only the class count differs (it follows the data): the advice is the checkpoint's data, not --model.arch."""
    model = ImageNetClassifier(arch="resnet18", num_classes=12, batch_size=6, warmup_epochs=0)
    model.model = RecordingLinear(3 * 2 * 2, 12)
    trainer = pl.Trainer(accelerator="cpu", max_steps=2, limit_val_batches=0, **QUIET)
    with pytest.raises(ValueError) as caught:
        trainer.fit(model, random_loader(2), ckpt_path=training_checkpoint)
    assert str(caught.value) == (
        f"--ckpt_path {training_checkpoint} holds resnet18 trained on 10 classes, and this run's data has 12 classes "
        "(model.num_classes follows the data); use the data it was trained on (a data.root with 10 class folders)"
    )
    # With synthetic data its class count is an option; another arch is what --model.arch fixes.
    model._trainer = SimpleNamespace(ckpt_path="x.ckpt", datamodule=SimpleNamespace(source="synthetic"))
    with pytest.raises(ValueError, match=r"a data.root with 10 class folders, or --data.synthetic_num_classes 10\)$"):
        model.on_load_checkpoint({"hyper_parameters": {"arch": "resnet18", "num_classes": 10}})
    with pytest.raises(ValueError) as caught:
        model.on_load_checkpoint({"hyper_parameters": {"arch": "resnet50", "num_classes": 12}})
    assert str(caught.value) == (
        "--ckpt_path x.ckpt holds resnet50 with 12 classes, this run builds resnet18 with 12 classes; pass "
        "--model.arch resnet50"
    )
    with pytest.raises(ValueError, match=r"pass --model.arch resnet50 and the data it was trained on \(a data.root"):
        model.on_load_checkpoint({"hyper_parameters": {"arch": "resnet50", "num_classes": 10}})
