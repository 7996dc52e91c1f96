"""DevicePrefetcher (CPU fallback here, the CUDA side-stream path under ``-m gpu``) and SyntheticBatches."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest
import torch
from lightning_fabric.utilities.data import _set_sampler_epoch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from prefetcher import (
    IMAGENET_MEAN_255,
    IMAGENET_STD_255,
    PRODUCER_THREAD_NAME,
    CopyEvents,
    DevicePrefetcher,
    SyntheticBatches,
    name_os_thread,
)

#: The ImageNet statistics on the 0..1 scale, as torchvision documents them.
MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)


def reference(images: torch.Tensor) -> torch.Tensor:
    """torchvision's ToTensor + Normalize, computed in float64: (x / 255 - mean) / std."""
    return ((images.double() / 255 - MEAN.double()) / STD.double()).float()


def uint8_batches(count: int = 3, batch: int = 4, size: int = 8, seed: int = 0) -> list[tuple[torch.Tensor, ...]]:
    generator = torch.Generator().manual_seed(seed)
    return [
        (
            torch.randint(0, 256, (batch, 3, size, size), dtype=torch.uint8, generator=generator),
            torch.randint(0, 1000, (batch,), dtype=torch.int64, generator=generator),
        )
        for _ in range(count)
    ]


def uint8_loader(length: int = 20, batch_size: int = 4, **kwargs: object) -> DataLoader:
    generator = torch.Generator().manual_seed(1)
    images = torch.randint(0, 256, (length, 3, 8, 8), dtype=torch.uint8, generator=generator)
    targets = torch.arange(length)
    return DataLoader(TensorDataset(images, targets), batch_size=batch_size, **kwargs)


def test_cpu_fallback_yields_normalized_float32_batches() -> None:
    batches = uint8_batches()
    before = [(images.clone(), targets.clone()) for images, targets in batches]
    prefetcher = DevicePrefetcher(batches, "cpu")
    assert prefetcher.stream is None and not prefetcher.is_cuda
    out = list(prefetcher)
    assert len(out) == len(batches)
    for (images, targets), (raw_images, raw_targets) in zip(out, before, strict=True):
        assert images.dtype == torch.float32 and images.device.type == "cpu"
        assert images.shape == raw_images.shape
        assert images.is_contiguous()
        torch.testing.assert_close(images, reference(raw_images), rtol=0, atol=1e-5)
        # The form the brief states: (x - mean*255) / (std*255).
        torch.testing.assert_close(images, (raw_images.float() - MEAN * 255) / (STD * 255), rtol=1e-6, atol=1e-5)
        assert targets.dtype == torch.int64
        assert torch.equal(targets, raw_targets)
    # The input batches are not modified in place.
    for (images, targets), (raw_images, raw_targets) in zip(batches, before, strict=True):
        assert torch.equal(images, raw_images) and torch.equal(targets, raw_targets)


def test_default_statistics_are_imagenet_on_the_255_scale() -> None:
    torch.testing.assert_close(torch.tensor(IMAGENET_MEAN_255), MEAN.flatten() * 255)
    torch.testing.assert_close(torch.tensor(IMAGENET_STD_255), STD.flatten() * 255)


def test_custom_statistics() -> None:
    images = torch.full((1, 3, 2, 2), 100, dtype=torch.uint8)
    images[:, 1] = 200
    ((out, _),) = DevicePrefetcher(
        [(images, torch.zeros(1, dtype=torch.int64))], "cpu", mean=(100, 0, 50), std=(1, 2, 5)
    )
    assert out[0, :, 0, 0].tolist() == [0.0, 100.0, 10.0]


def test_channels_last_option() -> None:
    batches = uint8_batches()
    plain = list(DevicePrefetcher(batches, "cpu"))
    last = list(DevicePrefetcher(batches, "cpu", channels_last=True))
    for (a, _), (b, _) in zip(plain, last, strict=True):
        assert b.is_contiguous(memory_format=torch.channels_last)
        assert not b.is_contiguous()
        assert a.is_contiguous()
        assert torch.equal(a, b)


def test_proxies_the_wrapped_loader() -> None:
    loader = uint8_loader(length=21, sampler=DistributedSampler(range(21), num_replicas=2, rank=1, shuffle=True))
    prefetcher = DevicePrefetcher(loader, torch.device("cpu"))
    assert prefetcher.sampler is loader.sampler
    assert prefetcher.batch_sampler is loader.batch_sampler
    assert prefetcher.dataset is loader.dataset
    assert len(prefetcher) == len(loader) == 3  # 11 indices (padded) in batches of 4
    # Lightning's per-epoch call reaches the sampler through the wrapper and changes the order.
    _set_sampler_epoch(prefetcher, 0)
    first = torch.cat([t for _, t in prefetcher]).tolist()
    _set_sampler_epoch(prefetcher, 5)
    assert loader.sampler.epoch == 5
    second = torch.cat([t for _, t in prefetcher]).tolist()
    assert first != second
    assert second == list(loader.sampler)  # targets are the dataset indices here


def test_proxies_of_a_plain_iterable_are_none() -> None:
    prefetcher = DevicePrefetcher(uint8_batches(count=2), "cpu")
    assert prefetcher.sampler is None and prefetcher.batch_sampler is None and prefetcher.dataset is None
    assert len(prefetcher) == 2


def test_iterating_twice_gives_the_same_epoch_again() -> None:
    prefetcher = DevicePrefetcher(uint8_loader(), "cpu")
    first = [t.tolist() for _, t in prefetcher]
    assert first == [t.tolist() for _, t in prefetcher]
    assert len(first) == 5


def test_close_ends_iterations_and_shuts_down_persistent_workers() -> None:
    loader = uint8_loader(num_workers=2, persistent_workers=True)
    prefetcher = DevicePrefetcher(loader, "cpu")
    batches = iter(prefetcher)
    next(batches)  # stopped mid-epoch, as Lightning does at max_steps
    workers = list(loader._iterator._workers)
    assert workers and all(w.is_alive() for w in workers)
    prefetcher.close()
    assert next(batches, None) is None  # the generator is closed
    assert loader._iterator is None
    for worker in workers:
        worker.join(timeout=10)
    assert not any(w.is_alive() for w in workers)
    assert len(list(prefetcher)) == len(loader)  # still usable: a later epoch starts new workers
    prefetcher.close()


def test_copy_timing_is_off_by_default_and_inert_on_cpu() -> None:
    batches = uint8_batches()
    prefetcher = DevicePrefetcher(batches, "cpu")
    assert prefetcher.timing is None
    prefetcher.timing = []
    out = list(prefetcher)
    assert prefetcher.timing == []  # no streams, no events: the copy is part of the host's data wait
    assert all(torch.equal(a, b) for (a, _), (b, _) in zip(out, DevicePrefetcher(batches, "cpu"), strict=True))


# --- SyntheticBatches --------------------------------------------------------------------------------------------
def test_synthetic_batches() -> None:
    batches = SyntheticBatches(batch_size=6, image_size=12, num_classes=5, length=4, device="cpu", seed=3)
    assert len(batches) == 4
    out = list(batches)
    assert len(out) == 4
    images, targets = out[0]
    assert images.shape == (6, 3, 12, 12) and images.dtype == torch.float32 and images.device.type == "cpu"
    assert images.is_contiguous()
    assert targets.shape == (6,) and targets.dtype == torch.int64
    assert 0 <= int(targets.min()) and int(targets.max()) < 5
    assert all(i is images and t is targets for i, t in out)  # one fixed batch: no copies
    assert abs(float(images.mean())) < 0.2 and 0.8 < float(images.std()) < 1.2  # like normalized inputs
    again = SyntheticBatches(6, 12, 5, 4, "cpu", seed=3)
    assert torch.equal(again.images, images) and torch.equal(again.targets, targets)
    assert not torch.equal(SyntheticBatches(6, 12, 5, 4, "cpu", seed=4).images, images)
    assert len(list(SyntheticBatches(6, 12, 5, 0, "cpu"))) == 0
    assert set(SyntheticBatches(256, 4, 3, 1, "cpu").targets.tolist()) == {0, 1, 2}  # the last class too


def test_synthetic_batches_channels_last() -> None:
    batches = SyntheticBatches(2, 8, 3, 1, torch.device("cpu"), channels_last=True)
    ((images, _),) = batches
    assert images.is_contiguous(memory_format=torch.channels_last) and not images.is_contiguous()


# --- CUDA --------------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("channels_last", [False, True])
def test_cuda_prefetcher_matches_the_reference(channels_last: bool) -> None:
    loader = uint8_loader(length=256, batch_size=32, pin_memory=True)
    prefetcher = DevicePrefetcher(loader, "cuda", channels_last=channels_last)
    assert prefetcher.is_cuda and prefetcher.stream is not None
    expected = list(loader)
    results = []
    for images, targets in prefetcher:
        assert images.device.type == "cuda" and images.dtype == torch.float32
        assert images.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
        # Work on the consumer stream while the next batch is copied and normalized on the side stream.
        for _ in range(20):
            images = images * 1.0
        results.append((images.cpu(), targets.cpu()))
    assert len(results) == len(expected)
    for (images, targets), (raw_images, raw_targets) in zip(results, expected, strict=True):
        torch.testing.assert_close(images, reference(raw_images), rtol=0, atol=1e-5)
        assert torch.equal(targets, raw_targets)


@pytest.mark.gpu
def test_cuda_synthetic_batches() -> None:
    batches = SyntheticBatches(4, 16, 10, 2, "cuda", channels_last=True)
    images, targets = next(iter(batches))
    assert images.device.type == "cuda" and targets.device.type == "cuda"
    assert images.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.gpu
@pytest.mark.parametrize("pin", [True, False])
def test_cuda_copy_timing_records_events_per_batch_on_the_side_stream(pin: bool) -> None:
    batches = [(i.pin_memory(), t.pin_memory()) if pin else (i, t) for i, t in uint8_batches(count=4, size=64)]
    prefetcher = DevicePrefetcher(batches, "cuda")
    list(prefetcher)  # timing off: nothing recorded
    timing: list[CopyEvents] = []
    prefetcher.timing = timing
    out = list(prefetcher)
    torch.cuda.synchronize()
    assert len(timing) == len(out) == 4
    for record in timing:
        assert record.pinned is pin and record.nbytes == 4 * 3 * 64 * 64 + 4 * 8
        assert record.start.query() and record.copied.query() and record.done.query()
        assert record.start.elapsed_time(record.copied) >= 0 and record.copied.elapsed_time(record.done) >= 0
    assert [r.issued for r in timing] == sorted(r.issued for r in timing)


def os_thread_name(native_id: int) -> str:
    return Path(f"/proc/self/task/{native_id}/comm").read_text().strip()


@pytest.mark.skipif(sys.platform != "linux", reason="thread names in /proc")
def test_a_thread_named_for_the_os_shows_its_name_in_proc() -> None:
    seen = []

    def run() -> None:
        before = os_thread_name(threading.get_native_id())
        name_os_thread("a-name-longer-than-15-bytes")
        seen.append((before, os_thread_name(threading.get_native_id())))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    ((before, after),) = seen
    assert before != after == "a-name-longer-t"  # the kernel keeps 15 bytes
    assert os_thread_name(threading.get_native_id()) != after  # only the calling thread


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_producer_thread_has_its_os_name() -> None:
    """With a decoder the batches come from a producer thread: Nsight Systems' thread rows and /proc name it."""
    names = []

    def decoder(images: torch.Tensor, device: torch.device) -> torch.Tensor:
        names.append(os_thread_name(threading.get_native_id()))
        return images.to(device, non_blocking=True).float()

    batches = list(DevicePrefetcher(uint8_batches(3), "cuda", decoder=decoder))
    assert len(batches) == 3 and names == [PRODUCER_THREAD_NAME] * 3


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_several_producers_hand_batches_out_in_order_each_on_its_own_lane_and_stream() -> None:
    """Batch i is decoded by producer i % 3, with ``lane`` = its index, on that producer's side stream and OS thread
    name; the consumer gets every batch, in the loader's order, normalized as the reference."""
    source = uint8_batches(7, batch=16, size=32)
    calls: list[tuple[int, int, str, int]] = []  # (batch, lane, OS thread name, stream)

    def decoder(images: torch.Tensor, device: torch.device, lane: int) -> torch.Tensor:
        index = next(i for i, (x, _) in enumerate(source) if x is images)
        calls.append((index, lane, os_thread_name(threading.get_native_id()), torch.cuda.current_stream().stream_id))
        return images.to(device, non_blocking=True).float()

    prefetcher = DevicePrefetcher(source, "cuda", decoder=decoder, producers=3)
    out = list(prefetcher)
    assert len(out) == 7
    for (images, targets), (reference_images, reference_targets) in zip(out, source, strict=True):
        assert torch.allclose(images.cpu(), reference(reference_images), atol=1e-5)
        assert torch.equal(targets.cpu(), reference_targets)
    streams = [s.stream_id for s in prefetcher.streams]
    assert len(set(streams)) == 3 and torch.cuda.default_stream().stream_id not in streams
    assert sorted(calls) == [(i, i % 3, f"{PRODUCER_THREAD_NAME}-{i % 3}", streams[i % 3]) for i in range(7)]


@pytest.mark.parametrize("producers", [0, 2.0, True])
def test_a_producer_count_below_one_or_not_an_integer_is_refused(producers: object) -> None:
    with pytest.raises(ValueError, match="producers must be an integer >= 1"):
        DevicePrefetcher([], "cpu", producers=producers)  # type: ignore[arg-type]


def test_producers_change_nothing_on_cpu() -> None:
    """On CPU the prefetcher runs in the caller's thread whatever ``producers`` says: same batches, no lane."""
    seen = []

    def decoder(images: torch.Tensor, device: torch.device) -> torch.Tensor:
        seen.append(threading.current_thread() is threading.main_thread())
        return images.to(device).float()

    prefetcher = DevicePrefetcher(uint8_batches(3), "cpu", decoder=decoder, producers=4)
    assert prefetcher.producers == 1 and prefetcher.streams == []
    out = list(prefetcher)
    assert seen == [True] * 3
    for (images, _), (reference_images, _) in zip(out, uint8_batches(3), strict=True):
        assert torch.allclose(images, reference(reference_images), atol=1e-5)
