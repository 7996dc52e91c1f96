"""GPU tests of the input path and the profiling window: run on a CUDA machine with ``python -m pytest -m gpu``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from core_probes import QUIET

import shapes_dataset
from callbacks import ProfilerWindow
from datamodule import ImageNetDataModule, fast_collate
from imagenet_module import ImageNetClassifier
from prefetcher import IMAGENET_MEAN_255, IMAGENET_STD_255, DevicePrefetcher

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _uint8_batches(count: int, size: int = 64, batch: int = 16, seed: int = 0) -> list:
    generator = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        images = torch.randint(0, 256, (batch, 3, size, size), dtype=torch.uint8, generator=generator)
        out.append((images.pin_memory(), torch.randint(0, 1000, (batch,), generator=generator).pin_memory()))
    return out


def test_prefetched_batches_equal_cpu_reference_bit_for_bit():
    batches = _uint8_batches(6)
    on_gpu = list(DevicePrefetcher(batches, "cuda"))
    on_cpu = list(DevicePrefetcher(batches, "cpu"))
    assert len(on_gpu) == len(on_cpu) == 6
    for (gx, gy), (cx, cy) in zip(on_gpu, on_cpu, strict=True):
        assert gx.device.type == "cuda" and gx.dtype == torch.float32
        # Both sides run the same IEEE ops (sub, div) in float32: equal bit for bit.
        assert torch.equal(gx.cpu(), cx)
        assert torch.equal(gy.cpu(), cy)


def _copy_as_decoder(images: torch.Tensor, device: torch.device, lane: int = 0) -> torch.Tensor:
    """A decoder for the prefetcher's threaded path (what gpu_decode.decode_batch is to it): the batch as float32 on
    the device, made on the producer thread's side stream."""
    return images.to(device, non_blocking=True).float()


@pytest.mark.parametrize(
    ("decoder", "producers"),
    [(None, 1), (_copy_as_decoder, 1), (_copy_as_decoder, 2)],
    ids=["copy", "producer-thread", "two-producer-threads"],
)
def test_record_stream_keeps_batch_memory_valid_while_consumer_lags(decoder, producers):
    batches = _uint8_batches(12, size=128, batch=32, seed=1)
    reference = [DevicePrefetcher([b], "cpu").__iter__().__next__()[0].double().sum().item() for b in batches]
    delay = torch.randn(4096, 4096, device="cuda")
    sums = []
    for images, _ in DevicePrefetcher(batches, "cuda", decoder=decoder, producers=producers):
        # Keep the consumer stream busy so that the side stream runs ahead: without record_stream the allocator may
        # hand this batch's memory to the next copy before the sum below reads it.
        for _ in range(4):
            delay = delay @ delay
            delay /= delay.norm()
        sums.append(images.double().sum())
        del images
    torch.cuda.synchronize()
    assert [s.item() for s in sums] == pytest.approx(reference, rel=1e-12)


def test_channels_last_reaches_the_model(tmp_path: Path):
    root = shapes_dataset.generate(tmp_path / "shapes", train_per_class=4, val_per_class=2, image_size=40)
    seen = []
    for source in ("folder", "synthetic"):
        data = ImageNetDataModule(
            root=str(root),
            source=source,
            batch_size=8,
            workers=0,
            crop_size=32,
            val_resize_size=36,
            val_crop_size=32,
            channels_last=True,
            synthetic_num_classes=10,
            synthetic_train_steps=3,
        )
        model = ImageNetClassifier(arch="resnet18", num_classes=10, batch_size=8, channels_last=True)
        model.model.conv1.register_forward_hook(
            lambda module, inputs, output: seen.append(
                (
                    inputs[0].is_contiguous(memory_format=torch.channels_last),
                    module.weight.is_contiguous(memory_format=torch.channels_last),
                    inputs[0].device.type,
                )
            )
        )
        trainer = pl.Trainer(
            accelerator="gpu",
            devices=1,
            max_steps=2,
            limit_val_batches=0,
            **QUIET,
        )
        trainer.fit(model, data)
    assert seen and all(s == (True, True, "cuda") for s in seen)


class _PinnedBatches(pl.LightningDataModule):
    """Pinned uint8 batches already in memory behind the app's prefetcher: the data path is never the bottleneck."""

    def __init__(self, batch: int = 128) -> None:
        super().__init__()
        self.batch = batch

    def train_dataloader(self) -> DevicePrefetcher:
        batches = _uint8_batches(4, size=224, batch=self.batch) * 5
        return DevicePrefetcher(batches, "cuda", channels_last=True)


class _ComputeStream(pl.Callback):
    """Notes, at every training step, whether the step runs on torch's default stream: its convolutions are launched
    there, and the copies, on no stream a convolution runs on, are then not on it."""

    def __init__(self) -> None:
        self.on_default: list[bool] = []

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args) -> None:  # noqa: ANN002
        self.on_default.append(torch.cuda.current_stream() == torch.cuda.default_stream())


class _ComputeStreamBusy(pl.Callback):
    """Queues ~20 ms of GPU work on the compute stream at the end of every step, before the next step's fetch issues
    the following batch's copy.

    Whether the copy overlaps the model's own kernels depends on whether the host runs ahead of the GPU, and under the
    Kineto profiler's per-op overhead it may not (two H200 runs measured 0% that way, while nsys, lighter, measured
    82%). With the compute stream busy at the moment of the fetch, the copy overlaps compute exactly when the
    prefetcher issues it on its own stream without waiting for the compute stream or the host: what is tested here.
    """

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args) -> None:  # noqa: ANN002
        torch.cuda._sleep(40_000_000)  # clock cycles: ~20 ms at the H200's ~2 GHz


def test_kineto_trace_shows_pinned_copies_on_a_side_stream_overlapping_compute(tmp_path: Path):
    data = _PinnedBatches()
    model = ImageNetClassifier(arch="resnet50", num_classes=1000, batch_size=128, channels_last=True)
    window = ProfilerWindow(start_step=6, num_steps=3, torch_profiler=True, trace_dir=str(tmp_path / "traces"))
    stream = _ComputeStream()
    events = _fit_and_read_trace(model, data, "bf16-mixed", [_ComputeStreamBusy(), stream, window])
    copies, compute = _copies_and_compute_kernels(events)
    assert stream.on_default and all(stream.on_default)  # the step's stream is the default one
    overlapped = sum(_overlaps(c, compute) for c in copies)
    print(f"H2D copies overlapping compute: {overlapped} of {len(copies)}")
    assert overlapped >= len(copies) // 2, f"only {overlapped} of {len(copies)} H2D copies overlap compute kernels"
    user = [e["name"] for e in events if e.get("cat") == "user_annotation"]
    assert [n for n in user if n.startswith("step ")] == ["step 6", "step 7", "step 8"]


def test_kineto_trace_shows_the_copies_overlapping_the_models_own_kernels(tmp_path: Path, monkeypatch):
    """Without queued stand-in work: in fp32 without TF32 a ResNet-50 step of 256 images is long enough on the GPU
    for the host, under Kineto's per-op overhead, to run ahead of it, so each next batch's copy is issued while the
    model's own kernels (convolutions, batch norms, the optimizer's) still run, as in a real run."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    data = _PinnedBatches(batch=256)
    model = ImageNetClassifier(arch="resnet50", num_classes=1000, batch_size=256, channels_last=True)
    window = ProfilerWindow(start_step=6, num_steps=3, torch_profiler=True, trace_dir=str(tmp_path / "traces"))
    events = _fit_and_read_trace(model, data, "32-true", [window])
    copies, compute = _copies_and_compute_kernels(events)
    overlapped = sum(_overlaps(c, compute) for c in copies)
    print(f"H2D copies overlapping the model's kernels: {overlapped} of {len(copies)}")
    assert overlapped >= len(copies) // 2, f"only {overlapped} of {len(copies)} H2D copies overlap the model's kernels"


def _fit_and_read_trace(model: pl.LightningModule, data: pl.LightningDataModule, precision: str, callbacks: list):
    """Fits with a window of steps 6-8 (its ``ProfilerWindow`` last in ``callbacks``) and returns the trace's events."""
    window = callbacks[-1]
    trainer = pl.Trainer(
        accelerator="gpu",
        devices=1,
        precision=precision,
        max_steps=20,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        callbacks=callbacks,
    )
    trainer.fit(model, data)
    assert trainer.global_step == 9  # exit_after: stopped right after the window
    (trace,) = window.trace_files
    return json.loads(Path(trace).read_text())["traceEvents"]


def _copies_and_compute_kernels(events: list[dict]) -> tuple[list[dict], list[dict]]:
    """The trace's host-to-device copies, checked to be from pinned memory and on streams no convolution or GEMM runs
    on, and the kernels on every other stream (fp32 cuDNN and cuBLAS run some on streams of their own)."""
    copies = [e for e in events if e.get("cat") == "gpu_memcpy" and "HtoD" in e["name"]]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    assert copies and kernels
    assert all("Pinned" in e["name"] for e in copies), {e["name"] for e in copies}
    compute_streams = {e["args"]["stream"] for e in kernels if "gemm" in e["name"] or "conv" in e["name"].lower()}
    copy_streams = {e["args"]["stream"] for e in copies}
    assert compute_streams and not copy_streams & compute_streams, (copy_streams, compute_streams)
    return copies, [k for k in kernels if k["args"]["stream"] not in copy_streams]


def _overlaps(copy: dict, kernels: list[dict]) -> bool:
    start, end = copy["ts"], copy["ts"] + copy["dur"]
    return any(k["ts"] < end and k["ts"] + k["dur"] > start for k in kernels)


def test_fast_collate_batches_pin_and_normalize_on_gpu():
    from PIL import Image

    images = [(Image.new("RGB", (8, 8), (10 * i, 20, 30)), i) for i in range(4)]
    batch = fast_collate(images)
    ((x, y),) = list(DevicePrefetcher([(batch[0].pin_memory(), batch[1].pin_memory())], "cuda"))
    mean = torch.tensor(IMAGENET_MEAN_255).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD_255).view(1, 3, 1, 1)
    assert torch.equal(x.cpu(), (batch[0].float() - mean) / std)
    assert y.tolist() == [0, 1, 2, 3]


def test_gpu_decode_matches_cpu_decode(tmp_path: Path):
    from encoded_batch import EncodedSampleLoader
    from gpu_decode import decode_crop_resize
    from image_loading import load_rgb

    root = shapes_dataset.generate(tmp_path / "shapes", train_per_class=2, val_per_class=1, image_size=120)
    val = EncodedSampleLoader(False, 96, 0.08, 110, load_rgb)
    samples = [val(str(p)) for p in sorted(root.glob("train/*/*.JPEG"))]
    on_gpu = decode_crop_resize(samples, torch.device("cuda"), 96)
    on_cpu = decode_crop_resize(samples, torch.device("cpu"), 96)
    assert on_gpu.device.type == "cuda" and on_gpu.shape == on_cpu.shape == (len(samples), 3, 96, 96)
    # nvJPEG and libjpeg-turbo upsample 4:2:0 chroma differently; on these saturated, sharp-edged shapes the mean
    # difference measured 3.5 levels (H200, torch 2.11). A wrong crop, flip or channel order is off by tens.
    assert (on_gpu.cpu() - on_cpu).abs().mean() < 5.0


def test_gpu_validation_crop_is_torchvisions_resize_and_center_crop():
    import torchvision.transforms.v2.functional as F2

    from encoded_batch import Encoded, center_crop_geometry
    from gpu_decode import decode_crop_resize

    generator = torch.Generator().manual_seed(0)
    samples, references = [], []
    for height, width in [(375, 500), (500, 333), (200, 200), (180, 240), (256, 1200)]:
        pixels = torch.randint(0, 256, (3, height, width), dtype=torch.uint8, generator=generator)  # noise: the worst
        box, resize = center_crop_geometry(height, width, 256, 224)
        samples.append(Encoded(pixels, False, box, False, resize=resize))
        whole = F2.resize(pixels.cuda().float(), [256], antialias=True)
        references.append(F2.center_crop(whole, [224, 224]))
    out = decode_crop_resize(samples, torch.device("cuda"), 224)
    difference = (out - torch.stack(references)).abs()
    # fp16 matmuls (weights to 11 bits, the first pass stored in fp16): on the CPU in fp16 the same batch measures a
    # mean of 0.027 and a max of 0.21 of 255. The box rounded to whole source pixels that this path used before was
    # off by 21 on average on this noise (by 0.4-1.4 on smooth photos).
    assert difference.mean() < 0.1 and difference.max() < 1.0


def test_split_decode_copies_the_finished_crops_exactly_and_decodes_the_rest(tmp_path: Path):
    from functools import partial

    from torchvision import transforms

    from buffer_release import release_pending
    from encoded_batch import EncodedSampleLoader, encoded_collate
    from gpu_decode import decode_batch
    from image_loading import load_rgb

    root = shapes_dataset.generate(tmp_path / "shapes", train_per_class=3, val_per_class=1, image_size=120)
    crop = transforms.Compose([transforms.Resize(110), transforms.CenterCrop(96)])
    loader = EncodedSampleLoader(False, 96, 0.08, 110, load_rgb, cpu_share=0.5, cpu_transform=crop)
    samples = [(loader(str(p)), i) for i, p in enumerate(sorted(root.glob("train/*/*.JPEG")))]
    batch, reference = encoded_collate(samples), encoded_collate(samples)  # decode_batch releases what it decodes
    finished = batch[0].finished
    assert 0 < finished < len(samples)
    decoder = partial(decode_batch, size=96)
    ((gx, gy),) = list(DevicePrefetcher([batch], "cuda", decoder=decoder))
    ((cx, cy),) = list(DevicePrefetcher([reference], "cpu", decoder=decoder))
    torch.cuda.synchronize()
    assert release_pending(wait=True) == 0  # the host buffer goes back once the work queued on it is done
    assert batch[0].data.numel() == 0
    assert torch.equal(gy.cpu(), cy)
    assert torch.equal(gx[:finished].cpu(), cx[:finished])  # copied and normalized, bit for bit
    # nvJPEG against libjpeg-turbo (see test_gpu_decode_matches_cpu_decode), in normalized units (std ~57 levels).
    assert (gx[finished:].cpu() - cx[finished:]).abs().mean() < 5.0 / 57


def _jpeg_batch(tmp_path: Path):
    """A packed batch of 30 JPEGs (no finished crops)."""
    from encoded_batch import EncodedSampleLoader, encoded_collate
    from image_loading import load_rgb

    root = shapes_dataset.generate(tmp_path / "shapes", train_per_class=3, val_per_class=1, image_size=120)
    loader = EncodedSampleLoader(False, 96, 0.08, 110, load_rgb, read_headers=True)
    return encoded_collate([(loader(str(p)), i) for i, p in enumerate(sorted(root.glob("train/*/*.JPEG")))])[0]


def test_nvjpeg_reads_the_jpeg_bytes_from_page_locked_memory(tmp_path: Path):
    """decode_batch stages the packed batch in page-locked memory, so nvJPEG's own copies of the JPEG bytes (one per
    image) are DMA transfers, not pageable copies the driver stages while the call holds the thread; the crop table
    goes the same way. Every host-to-device copy of the call is from page-locked memory."""
    from torch.profiler import ProfilerActivity, profile

    from gpu_decode import decode_batch

    decode_batch(_jpeg_batch(tmp_path / "warm-up"), "cuda", 96, nvjpeg="preallocated")  # the decoder made
    batch = _jpeg_batch(tmp_path)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as trace:
        decode_batch(batch, "cuda", 96, nvjpeg="preallocated")
        torch.cuda.synchronize()
    copies = [e.name for e in trace.events() if e.device_type == torch.autograd.DeviceType.CUDA and "HtoD" in e.name]
    assert len(copies) >= 30, copies  # one per JPEG at least: nvJPEG's copies are in the trace
    assert all("Pinned" in name for name in copies), sorted(set(copies))


@pytest.mark.parametrize("cpu_decode_share", [0.0, 0.5])
def test_gpu_decode_trains_with_files_nvjpeg_should_not_get(tmp_path: Path, cpu_decode_share: float):
    from PIL import Image

    root = shapes_dataset.generate(tmp_path / "shapes", train_per_class=12, val_per_class=3, image_size=96)
    first_class = sorted((root / "train").iterdir())[0]
    Image.new("RGB", (90, 70), (200, 30, 30)).convert("CMYK").save(first_class / "cmyk.JPEG", quality=90)
    Image.new("RGB", (90, 70), (30, 200, 30)).save(first_class / "png_named.JPEG", format="PNG")
    data = ImageNetDataModule(
        root=str(root), batch_size=16, workers=2, crop_size=64, val_resize_size=73, val_crop_size=64,
        channels_last=True, decode="gpu", cpu_decode_share=cpu_decode_share,
    )  # fmt: skip
    model = ImageNetClassifier(arch="resnet18", num_classes=10, batch_size=16, channels_last=True)
    trainer = pl.Trainer(accelerator="gpu", devices=1, max_epochs=2, **QUIET)
    trainer.fit(model, data)
    assert data.gpu_decode
    assert trainer.global_step == 2 * (122 // 16)
    assert 0.0 <= trainer.callback_metrics["val_acc1"].item() <= 1.0


@pytest.mark.parametrize("nvjpeg", ["torchvision", "preallocated"])
def test_two_decode_threads_give_the_batches_of_one(tmp_path: Path, nvjpeg: str):
    """data.decode_threads 2: the same batches in the same order as one thread (each thread its own stream and
    nvJPEG decoder), the finished crops of the CPU share included; two epochs, so the threads start twice."""
    from types import SimpleNamespace

    from lightning_fabric.utilities.data import _set_sampler_epoch

    root = shapes_dataset.generate(tmp_path / "shapes", train_per_class=12, val_per_class=2, image_size=96)
    trainer = SimpleNamespace(world_size=1, global_rank=0, strategy=SimpleNamespace(root_device=torch.device("cuda")))
    epochs = {}
    for threads in (1, 2):
        data = ImageNetDataModule(
            root=str(root), batch_size=16, workers=2, crop_size=64, val_resize_size=73, val_crop_size=64,
            channels_last=True, decode="gpu", cpu_decode_share=0.3, nvjpeg=nvjpeg, decode_threads=threads,
        )  # fmt: skip
        data.trainer = trainer
        data.setup("fit")
        loader = data.train_dataloader()
        assert loader.producers == threads and len(loader.streams) == threads
        epochs[threads] = []
        for epoch in (0, 1):
            _set_sampler_epoch(loader, epoch)
            epochs[threads].append([(x.cpu(), y.cpu()) for x, y in loader])
        data.teardown("fit")
    for one, two in zip(epochs[1], epochs[2], strict=True):
        assert len(one) == len(two) == 120 // 16
        for (x1, y1), (x2, y2) in zip(one, two, strict=True):
            assert torch.equal(y1, y2)
            # The same kernels on other streams; the fp16 resize's matmuls may pick other cuBLAS kernels there.
            torch.testing.assert_close(x2, x1, rtol=0, atol=1e-3)
    assert not torch.equal(epochs[1][0][0][0], epochs[1][1][0][0])  # the epochs differ: the sampler's epoch reached


def test_gpu_fit_with_two_decode_threads(tmp_path: Path):
    root = shapes_dataset.generate(tmp_path / "shapes", train_per_class=12, val_per_class=3, image_size=96)
    data = ImageNetDataModule(
        root=str(root), batch_size=16, workers=2, crop_size=64, val_resize_size=73, val_crop_size=64,
        channels_last=True, decode="gpu", nvjpeg="preallocated", decode_threads=2,
    )  # fmt: skip
    model = ImageNetClassifier(arch="resnet18", num_classes=10, batch_size=16, channels_last=True)
    trainer = pl.Trainer(accelerator="gpu", devices=1, max_epochs=2, **QUIET)
    trainer.fit(model, data)
    assert trainer.global_step == 2 * (120 // 16)
    assert 0.0 <= trainer.callback_metrics["val_acc1"].item() <= 1.0


class _NoSyncWindow(pl.Callback):
    """Makes the synchronizing CUDA calls torch detects raise (``torch.cuda.set_sync_debug_mode("error")``, a prototype
    that does not detect every kind) from the start to the end of training batches ``first``..``last``: forward,
    backward, the optimizer step and GradScaler's update."""

    def __init__(self, first: int, last: int) -> None:
        self.first, self.last, self.checked = first, last, 0

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch, batch_idx: int) -> None:  # noqa: ANN001
        if self.first <= batch_idx <= self.last:
            torch.cuda.set_sync_debug_mode("error")

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args) -> None:  # noqa: ANN002
        if torch.cuda.get_sync_debug_mode():
            torch.cuda.set_sync_debug_mode(0)
            self.checked += 1


class _NoSyncValidation(pl.Callback):
    """``_NoSyncWindow`` for validation batches (from the second on: the first holds cuDNN's warm-up)."""

    def __init__(self) -> None:
        self.checked = 0

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:  # noqa: ANN001
        if batch_idx >= 1:
            torch.cuda.set_sync_debug_mode("error")

    def on_validation_batch_end(self, trainer, pl_module, *args, **kwargs) -> None:  # noqa: ANN001, ANN002, ANN003
        if torch.cuda.get_sync_debug_mode():
            torch.cuda.set_sync_debug_mode(0)
            self.checked += 1


def test_validation_steps_make_no_host_sync():
    """The metrics' updates stay on the device (torchmetrics' accuracy with an ignore_index drops samples by boolean
    indexing: a sync each step)."""
    data = ImageNetDataModule(
        root="unused", source="synthetic", batch_size=32, crop_size=64, synthetic_num_classes=10, synthetic_val_steps=5
    )
    model = ImageNetClassifier(arch="resnet18", num_classes=10, batch_size=32, channels_last=True)
    window = _NoSyncValidation()
    trainer = pl.Trainer(accelerator="gpu", devices=1, precision="bf16-mixed", callbacks=[window], **QUIET)
    try:
        (val,) = trainer.validate(model, data, verbose=False)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert window.checked == 4 and 0.0 <= val["val_acc1"] <= 1.0


@pytest.mark.parametrize(
    ("precision", "fused_sgd", "syncs"),
    [("16-mixed", None, False), ("bf16-mixed", None, False), ("16-mixed", False, True)],
)
def test_training_steps_make_no_host_sync(precision: str, fused_sgd: bool | None, syncs: bool):
    """No step waits for the host to read a value back: under 16-mixed the fused SGD (the default on CUDA) skips
    overflow steps on the device. The unfused SGD, where GradScaler reads its overflow check back each step, shows
    that the window catches a sync."""
    data = ImageNetDataModule(
        root="unused",
        source="synthetic",
        batch_size=32,
        crop_size=64,
        synthetic_num_classes=10,
        synthetic_train_steps=8,
    )
    model = ImageNetClassifier(arch="resnet18", num_classes=10, batch_size=32, channels_last=True, fused_sgd=fused_sgd)
    window = _NoSyncWindow(3, 6)
    trainer = pl.Trainer(
        accelerator="gpu",
        devices=1,
        precision=precision,
        max_steps=8,
        log_every_n_steps=100,
        callbacks=[window],
        **QUIET,
    )
    try:
        if syncs:
            with pytest.raises(RuntimeError, match="synchroniz"):
                trainer.fit(model, data)
        else:
            trainer.fit(model, data)
            assert window.checked == 4
            assert all(torch.isfinite(p).all() for p in model.parameters())
    finally:
        torch.cuda.set_sync_debug_mode(0)
