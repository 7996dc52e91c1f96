"""The data side: fast_collate, samplers, dataset layout checks and the loaders of ImageNetDataModule on the CPU."""

from __future__ import annotations

import json
import logging
import os
import pickle
import re
import shutil
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from lightning_fabric.utilities.data import _set_sampler_epoch
from lightning_fabric.utilities.types import _Stateful
from PIL import Image
from torch.utils.data import DistributedSampler

from bad_image_policy import IGNORED_TARGET, SeededIndex
from datamodule import ImageNetDataModule, ShardSampler, TrainSampler, fast_collate, sample_seed
from prefetcher import DevicePrefetcher, SyntheticBatches
from shapes_dataset import MANIFEST

NUM_CLASSES = 10


def sizes(root: Path) -> tuple[int, int]:
    """Train and val images of a generated dataset."""
    manifest = json.loads((root / MANIFEST).read_text())
    return manifest["train_per_class"] * NUM_CLASSES, manifest["val_per_class"] * NUM_CLASSES


def pattern(height: int, width: int, seed: int) -> np.ndarray:
    """An HWC uint8 array whose every (y, x, channel) value is distinct within the image."""
    values = np.arange(height * width * 3, dtype=np.int64).reshape(height, width, 3)
    return ((values * 7 + seed * 31) % 251).astype(np.uint8)


def small_dm(root: Path, **kwargs: object) -> ImageNetDataModule:
    options = dict(root=str(root), workers=0, batch_size=8, crop_size=32, val_resize_size=36, val_crop_size=32)
    options.update(kwargs)
    return ImageNetDataModule(**options)


def fake_trainer(world_size: int = 1, rank: int = 0) -> SimpleNamespace:
    """What the data module reads from its trainer: world size, global rank and the root device."""
    return SimpleNamespace(
        world_size=world_size, global_rank=rank, strategy=SimpleNamespace(root_device=torch.device("cpu"))
    )


# --- fast_collate -----------------------------------------------------------------------------------------------
def test_fast_collate_rgb_layout_dtype_and_targets() -> None:
    height, width = 5, 7
    arrays = [pattern(height, width, seed) for seed in range(3)]
    batch = [(Image.fromarray(a), target) for a, target in zip(arrays, (4, 0, 9), strict=True)]
    images, targets = fast_collate(batch)
    assert images.dtype == torch.uint8
    assert images.shape == (3, 3, height, width)
    assert images.is_contiguous()
    assert targets.dtype == torch.int64
    assert targets.tolist() == [4, 0, 9]
    for i, array in enumerate(arrays):
        # NCHW: images[n, c, y, x] is pixel (y, x), channel c, of image n.
        assert torch.equal(images[i], torch.from_numpy(array).permute(2, 0, 1))
    # One asymmetric pixel spelled out: row 1, column 6 of image 2.
    assert images[2, :, 1, 6].tolist() == arrays[2][1, 6].tolist()


def test_fast_collate_single_red_pixel_lands_in_channel_0() -> None:
    array = np.zeros((4, 6, 3), dtype=np.uint8)
    array[3, 1] = (200, 0, 0)  # red pixel at y=3, x=1
    images, _ = fast_collate([(Image.fromarray(array), 0)])
    assert images[0, 0, 3, 1] == 200
    assert images.sum() == 200


def test_fast_collate_broadcasts_grayscale_and_accepts_arrays() -> None:
    gray = pattern(4, 6, 1)[:, :, 0]
    rgba = np.concatenate([pattern(4, 6, 2), np.full((4, 6, 1), 255, np.uint8)], axis=2)
    rgb_array = pattern(4, 6, 3)
    gray_image = Image.fromarray(gray)
    assert gray_image.mode == "L"
    images, targets = fast_collate([(gray_image, 1), (rgba, 2), (rgb_array, 3)])
    assert images.shape == (3, 3, 4, 6)
    for channel in range(3):
        assert torch.equal(images[0, channel], torch.from_numpy(gray))
    assert torch.equal(images[1], torch.from_numpy(rgba[:, :, :3]).permute(2, 0, 1))  # alpha dropped
    assert torch.equal(images[2], torch.from_numpy(rgb_array).permute(2, 0, 1))
    assert targets.tolist() == [1, 2, 3]


def test_fast_collate_mismatched_sizes_error() -> None:
    batch = [(Image.new("RGB", (3, 2)), 0), (Image.new("RGB", (3, 2)), 1), (Image.new("RGB", (4, 2)), 2)]
    with pytest.raises(ValueError, match=r"image 2 is 4x2, the first is 3x2.*one size"):
        fast_collate(batch)


# --- samplers ----------------------------------------------------------------------------------------------------
def test_skip_scores_each_validation_image_that_loads_once(shapes_root: Path, tmp_path: Path) -> None:
    root = tmp_path / "copy"
    shutil.copytree(shapes_root, root)
    classes = sorted(p.name for p in (root / "val").iterdir())
    # The last file of a class: its replacement, the next class's first image, would have been scored twice and
    # under that class.
    bad = sorted((root / "val" / classes[0]).iterdir())[-1]
    bad.write_bytes(b"junk")
    dm = small_dm(root, batch_size=4, on_bad_image="skip")
    dm.trainer = fake_trainer()
    dm.setup("validate")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batches = list(dm.val_dataloader())
    targets = torch.cat([t for _, t in batches]).tolist()
    assert {len(t) for _, t in batches[:-1]} == {4}  # full batches: one compiled shape
    assert targets.count(IGNORED_TARGET) == 1
    scored = [t for t in targets if t != IGNORED_TARGET]
    expected = [i for i, c in enumerate(classes) for _ in range(len(list((root / "val" / c).iterdir())))]
    expected.remove(0)  # the bad image of class 0
    assert sorted(scored) == expected
    assert any("leaves it out of the metrics" in str(w.message) for w in caught)


@pytest.mark.parametrize("length", [0, 1, 7, 60, 61])
@pytest.mark.parametrize("replicas", [1, 2, 3, 8])
def test_shard_sampler_covers_every_index_once_without_padding(length: int, replicas: int) -> None:
    shards = [list(ShardSampler(length, replicas, rank)) for rank in range(replicas)]
    assert sorted(i for shard in shards for i in shard) == list(range(length))
    for rank, shard in enumerate(shards):
        assert len(ShardSampler(length, replicas, rank)) == len(shard)
        assert shard == sorted(shard)
    assert max(len(s) for s in shards) - min(len(s) for s in shards) <= 1


def test_a_val_split_smaller_than_the_world_is_refused_on_every_rank(shapes_root: Path) -> None:
    images = sizes(shapes_root)[1]
    for rank in (0, images):  # the first and the last rank of one image too many: the same refusal, in setup
        dm = small_dm(shapes_root, batch_size=1)
        dm.trainer = fake_trainer(world_size=images + 1, rank=rank)
        for stage in ("fit", "validate"):
            with pytest.raises(ValueError, match=rf"holds {images} images for {images + 1} ranks; every rank needs"):
                dm.setup(stage)
    dm = small_dm(shapes_root, batch_size=1)
    dm.trainer = fake_trainer(world_size=images, rank=images - 1)  # one image each: fine
    dm.setup("fit")
    assert len(dm.val_dataloader().sampler) == 1


def test_an_eval_fraction_that_leaves_a_rank_no_batch_is_refused_on_every_rank(shapes_root: Path) -> None:
    # 60 val images on 7 ranks: shards of 9 and 8 images, 2 and 1 batches of 8. Lightning would take int(2 x 0.5) = 1
    # batch on some ranks and int(1 x 0.5) = 0 (an error) on the others, which the rest would wait for.
    images = sizes(shapes_root)[1]
    assert images == 60
    for rank in (0, 6):
        for key in ("limit_val_batches", "limit_test_batches"):
            dm = small_dm(shapes_root, batch_size=8)
            dm.trainer = fake_trainer(world_size=7, rank=rank)
            setattr(dm.trainer, key, 0.5)
            with pytest.raises(
                ValueError,
                match=rf"trainer.{key} 0.5 of .* leaves no batch on a rank: its smallest "
                r"shard has 1 batch\(es\) of data.batch_size 8 on 7 rank\(s\); use at least 1",
            ):
                dm.setup("validate")
    dm = small_dm(shapes_root, batch_size=8)
    dm.trainer = fake_trainer(world_size=7, rank=6)
    dm.trainer.limit_val_batches, dm.trainer.limit_test_batches = 1.0, 2  # the whole split; a number of batches
    dm.setup("validate")
    # 5 ranks: shards of 12 images, a full batch of 8 and a partial one of 4, which Lightning counts: 0.5 takes 1.
    dm = small_dm(shapes_root, batch_size=8)
    dm.trainer = fake_trainer(world_size=5, rank=4)
    dm.trainer.limit_val_batches = 0.5
    dm.setup("validate")


def test_the_training_shards_are_even_and_disjoint_without_padding() -> None:
    # 240 images on 7 ranks: 34 each (238), the last 2 dropped. Padded, a rank would train on another's images twice.
    shards = [list(TrainSampler(list(range(240)), 7, rank, seed=0, batch_size=4)) for rank in range(7)]
    assert {len(shard) for shard in shards} == {34}
    every = [int(i) for shard in shards for i in shard]
    assert len(set(every)) == len(every) == 238


def test_a_train_split_without_one_batch_per_rank_is_refused_naming_the_folder(shapes_root: Path) -> None:
    images = sizes(shapes_root)[0]
    dm = small_dm(shapes_root, batch_size=images // 2 + 1)
    dm.trainer = fake_trainer(world_size=2, rank=1)
    folder = shapes_root / "train"
    with pytest.raises(
        ValueError,
        match=rf"data.root: {re.escape(str(folder))} holds {images} images, fewer than one "
        rf"batch of data.batch_size {images // 2 + 1} for each of 2 rank\(s\); lower data.batch_size",
    ):
        dm.setup("fit")
    dm = small_dm(shapes_root, batch_size=images // 2)  # exactly one batch each
    dm.trainer = fake_trainer(world_size=2, rank=1)
    dm.setup("fit")
    assert len(dm.train_dataloader()) == 1


def test_train_loader_uses_distributed_sampler_whose_epoch_is_set_through_the_prefetcher(shapes_root: Path) -> None:
    loaders = []
    for rank in range(2):
        dm = small_dm(shapes_root)
        dm.trainer = fake_trainer(world_size=2, rank=rank)
        dm.setup("fit")
        loaders.append(dm.train_dataloader())
    for loader in loaders:
        assert isinstance(loader, DevicePrefetcher)
        assert isinstance(loader.sampler, DistributedSampler)
    orders = {}
    for epoch in (0, 1):
        for rank, loader in enumerate(loaders):
            _set_sampler_epoch(loader, epoch)  # what Lightning's fit loop calls at every epoch start
            assert loader.sampler.epoch == epoch
            orders[epoch, rank] = list(loader.sampler)
        # Two ranks: disjoint halves of the training set, the same size.
        assert not set(orders[epoch, 0]) & set(orders[epoch, 1])
        assert len(orders[epoch, 0]) == len(orders[epoch, 1]) == sizes(shapes_root)[0] // 2
    assert orders[0, 0] != orders[1, 0]
    assert sorted(orders[0, 0] + orders[0, 1]) == sorted(orders[1, 0] + orders[1, 1])
    # The loader follows the sampler: the targets of the epoch-1 batches are those of the sampler's indices.
    loader = loaders[0]
    targets = torch.cat([t for _, t in loader]).tolist()
    expected = [loader.dataset.targets[i] for i in orders[1, 0]]
    assert targets == expected[: len(loader) * 8]
    assert len(loader) == len(orders[1, 0]) // 8  # drop_last: every rank steps the same number of times


def test_single_process_train_order_depends_on_seed_and_epoch_only(shapes_root: Path) -> None:
    def order(seed: int, epoch: int) -> list[int]:
        dm = small_dm(shapes_root, seed=seed)
        dm.trainer = fake_trainer()
        dm.setup("fit")
        loader = dm.train_dataloader()
        _set_sampler_epoch(loader, epoch)
        return list(loader.sampler)

    assert order(0, 3) == order(0, 3)
    assert order(0, 3) != order(0, 4)
    assert order(0, 3) != order(1, 3)
    assert sorted(order(0, 3)) == list(range(sizes(shapes_root)[0]))


def test_train_sampler_resumes_its_epoch_after_the_batches_done(shapes_root: Path) -> None:
    dm = small_dm(shapes_root)
    dm.trainer = fake_trainer(world_size=2, rank=1)
    dm.setup("fit")
    sampler = dm.train_dataloader().sampler
    assert isinstance(sampler, TrainSampler) and sampler.batch_size == 8
    whole = {}
    for epoch in (0, 1, 2):
        sampler.set_epoch(epoch)
        whole[epoch] = list(sampler)
    sampler.resume_at(1, 3)
    for epoch in (0, 1, 2):
        sampler.set_epoch(epoch)
        # Epoch 1 goes on after its first 3 batches (of 8 on this rank); the others are whole. The length stays the
        # whole epoch's: Lightning sizes epochs (and the LR schedule) with it and counts the 3 batches as done.
        assert list(sampler) == (whole[1][3 * 8 :] if epoch == 1 else whole[epoch])
        assert len(sampler) == len(whole[epoch]) == sizes(shapes_root)[0] // 2
    # Every index carries the seed of its augmentation: a function of (seed, epoch, index), not of the rank.
    sampler.set_epoch(2)
    for index in sampler:
        assert isinstance(index, SeededIndex) and index.seed == sample_seed(0, 2, int(index))
    assert len({sample_seed(0, epoch, 5) for epoch in range(3)} | {sample_seed(1, 0, 5)}) == 4


def fake_fitting_trainer(epoch: int, processed: int, world_size: int = 1, epoch_batches: int = 30) -> SimpleNamespace:
    """A fake trainer in the middle of a fit: epoch ``epoch``, ``processed`` of its ``epoch_batches`` batches done."""
    progress = SimpleNamespace(current=SimpleNamespace(processed=processed))
    trainer = fake_trainer(world_size=world_size)
    trainer.state = SimpleNamespace(fn="fit")
    trainer.current_epoch = epoch
    trainer.fit_loop = SimpleNamespace(epoch_loop=SimpleNamespace(batch_progress=progress))
    trainer.num_training_batches = epoch_batches
    return trainer


def test_checkpoint_state_resumes_the_training_order(shapes_root: Path) -> None:
    saving = small_dm(shapes_root)
    saving.trainer = fake_fitting_trainer(epoch=2, processed=4)
    state = saving.state_dict()
    assert state == {
        "train_position": {"epoch": 2, "batches": 4, "batch_size": 8, "world_size": 1, "cpu_decoder": "torchvision",
                           "epoch_batches": 30}
    }  # fmt: skip
    saving.trainer.state.fn = "validate"
    assert saving.state_dict() == {}  # only a fit has a position (Lightning then saves no entry)

    # Lightning: setup, then the restore (load_state_dict), then train_dataloader (or, for a loader built while
    # configuring the optimizers, before the restore: then the restore moves the existing sampler).
    for built_before in (False, True):
        dm = small_dm(shapes_root)
        dm.trainer = fake_trainer()
        dm.setup("fit")
        loader = dm.train_dataloader() if built_before else None
        dm.load_state_dict(state)
        loader = loader or dm.train_dataloader()
        _set_sampler_epoch(loader, 2)
        assert len(list(loader)) == len(loader) - 4
        assert len(loader) == sizes(shapes_root)[0] // 8
    # A later fit without a checkpoint starts at the first batch.
    dm.setup("fit")
    loader = dm.train_dataloader()
    _set_sampler_epoch(loader, 2)
    assert len(list(loader)) == len(loader)
    # Lightning's test of a resumable loader: without it, it warns on every mid-epoch resume that the epoch restarts.
    assert isinstance(loader, _Stateful) and not isinstance(dm.val_dataloader(), _Stateful)


def test_resume_with_another_batch_size_or_world_size_warns(shapes_root: Path) -> None:
    dm = small_dm(shapes_root, batch_size=4)
    dm.trainer = fake_trainer(world_size=2)
    dm.setup("fit")
    position = {"epoch": 1, "batches": 2, "batch_size": 8, "world_size": 1}
    with pytest.warns(UserWarning, match="not exactly the interrupted run's"):
        dm.load_state_dict({"train_position": position})
    loader = dm.train_dataloader()
    _set_sampler_epoch(loader, 1)
    assert len(list(loader)) == len(loader) - 2  # Lightning counts 2 batches as done: the epoch keeps its length
    # A checkpoint of the epoch's end (every batch of the checkpoint's run trained): the resumed run starts the next
    # epoch, exactly, and says nothing.
    done = len(dm.train_set) // 8
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dm.load_state_dict({"train_position": position | {"batches": done}})
        # The end of an epoch that trainer.limit_train_batches cut short, as Lightning counted its batches.
        dm.load_state_dict({"train_position": position | {"batches": 3, "epoch_batches": 3}})
        # A checkpoint from before epoch_batches was saved, at the end of an epoch of two ranks: each rank's share.
        two_ranks = {"epoch": 1, "batches": len(dm.train_set) // 2 // 8, "batch_size": 8, "world_size": 2}
        dm.load_state_dict({"train_position": two_ranks})
    assert not [w for w in caught if "not exactly" in str(w.message)]
    with pytest.warns(UserWarning, match="not exactly the interrupted run's"):
        dm.load_state_dict({"train_position": position | {"batches": 2, "epoch_batches": 3}})
    # validate and test restore the checkpoint too, and resume nothing: nothing to say.
    dm.trainer.state = SimpleNamespace(fn="validate")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dm.load_state_dict({"train_position": position | {"cpu_decoder": "pil"}})
    assert not caught


def test_resume_with_another_decoder_warns_and_an_old_checkpoint_counts_as_pil(shapes_root: Path) -> None:
    position = {"epoch": 1, "batches": 2, "batch_size": 8, "world_size": 1}
    for saved, now, warns in (("pil", "torchvision", True), (None, "torchvision", True), (None, "pil", False),
                              ("torchvision", "torchvision", False)):  # fmt: skip
        dm = small_dm(shapes_root, cpu_decoder=now)
        dm.trainer = fake_trainer()
        dm.setup("fit")
        state = {"train_position": position | ({"cpu_decoder": saved} if saved else {})}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            dm.load_state_dict(state)
        messages = [str(w.message) for w in caught if "data.cpu_decoder" in str(w.message)]
        assert messages == ([f"resuming with data.cpu_decoder {now}; the checkpoint's run decoded with {saved or 'pil'}"
                             f": crops differ from the interrupted run's by a level or two in some pixels; set "
                             f"data.cpu_decoder {saved or 'pil'} to continue it exactly"] if warns else [])  # fmt: skip


def epoch_batches(dm: ImageNetDataModule, epoch: int) -> list[torch.Tensor]:
    loader = dm.train_dataloader()
    _set_sampler_epoch(loader, epoch)
    return [images for images, _ in loader]


def test_augmentation_depends_on_seed_epoch_and_index_only(shapes_root: Path) -> None:
    batches = {}
    for workers in (0, 2):
        dm = small_dm(shapes_root, workers=workers, min_crop_scale=0.2, prefetch_factor=1)
        dm.setup("fit")
        torch.manual_seed(workers)  # the main process's generator does not matter either
        batches[workers] = epoch_batches(dm, 1)
    # Which worker loads a sample, and how many there are, changes nothing.
    assert all(torch.equal(a, b) for a, b in zip(batches[0], batches[2], strict=True))

    dm = small_dm(shapes_root, min_crop_scale=0.2)
    dm.setup("fit")
    dataset = dm.train_set
    before = torch.get_rng_state()
    first = np.asarray(dataset[SeededIndex(5, sample_seed(0, 1, 5))][0])
    again = np.asarray(dataset[SeededIndex(5, sample_seed(0, 1, 5))][0])
    other_epoch = np.asarray(dataset[SeededIndex(5, sample_seed(0, 2, 5))][0])
    assert np.array_equal(first, again) and not np.array_equal(first, other_epoch)
    # The main process's generator is as it was (workers: 0 loads here): the model's randomness is its own.
    assert torch.equal(torch.get_rng_state(), before)
    # A plain index (validation, another sampler) draws from the generator as it is.
    torch.manual_seed(1)
    plain = [np.asarray(dataset[5][0]) for _ in range(4)]
    assert any(not np.array_equal(plain[0], image) for image in plain[1:])


def test_seeded_index_is_an_int_that_keeps_its_seed_through_pickling() -> None:
    index = SeededIndex(7, 123)
    assert index == 7 and int(index) == 7 and index + 1 == 8 and [0, 1, 2, 3, 4, 5, 6, 7][index] == 7
    assert json.dumps([index]) == "[7]" and hash(index) == hash(7)
    copy = pickle.loads(pickle.dumps(index))
    assert isinstance(copy, SeededIndex) and (copy, copy.seed) == (7, 123)


def test_val_loader_shards_without_padding_and_yields_normalized_batches(shapes_root: Path) -> None:
    seen = []
    for rank in range(2):
        dm = small_dm(shapes_root, batch_size=7)
        dm.trainer = fake_trainer(world_size=2, rank=rank)
        dm.setup("validate")
        assert dm.train_set is None  # validate builds only what it needs
        loader = dm.val_dataloader()
        assert isinstance(loader.sampler, ShardSampler)
        batches = list(loader)
        assert len(batches) == len(loader)
        for images, targets in batches:
            assert images.dtype == torch.float32 and images.shape[1:] == (3, 32, 32)
            assert targets.dtype == torch.int64
        targets = torch.cat([t for _, t in batches]).tolist()
        assert targets == [loader.dataset.targets[i] for i in loader.sampler]
        seen.append(list(loader.sampler))
    assert sorted(seen[0] + seen[1]) == list(range(sizes(shapes_root)[1]))
    # The test stage evaluates the val split.
    assert dm.test_dataloader().sampler.indices == dm.val_dataloader().sampler.indices


def test_test_says_it_evaluates_val_and_that_a_test_folder_is_not_read(
    shapes_root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "with_test"
    shutil.copytree(shapes_root, root)
    dm = small_dm(root, batch_size=7)
    dm.trainer = fake_trainer()
    dm.setup("test")
    with caplog.at_level(logging.INFO), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dm.test_dataloader()
    assert f"test evaluates {root / 'val'}, as validate does" in caplog.text
    assert not [w for w in caught if "is not read" in str(w.message)]
    (root / "test").mkdir()  # empty: nothing to say
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dm.test_dataloader()
    assert not [w for w in caught if "is not read" in str(w.message)]
    shutil.rmtree(root / "test")
    shutil.copytree(root / "val", root / "test")  # labelled images of its own that test would not score
    with pytest.warns(UserWarning, match=re.escape(f"{root / 'test'} is not read: test evaluates {root / 'val'}")):
        dm.test_dataloader()
    # What the warning advises works: a folder of two links scores test/.
    links = tmp_path / "links"
    links.mkdir()
    (links / "train").symlink_to(root / "train")
    (links / "val").symlink_to(root / "test")
    scored = small_dm(links, batch_size=7)
    scored.trainer = fake_trainer()
    scored.setup("test")
    assert len(scored.test_dataloader().dataset) == len(dm.val_set)


def test_val_batches_are_center_crops_normalized_by_imagenets_mean_and_std(shapes_root: Path) -> None:
    # Every other test of the normalization compares the data module with itself (two decoders through one
    # normalization) or tests the prefetcher alone: swapped mean and std passed them all.
    from torchvision.io import ImageReadMode, decode_image
    from torchvision.transforms.v2 import functional as F2

    dm = small_dm(shapes_root, batch_size=5)
    dm.trainer = fake_trainer()
    dm.setup("validate")
    loader = dm.val_dataloader()
    images, targets = next(iter(loader))
    mean = torch.tensor([0.485, 0.456, 0.406])[:, None, None] * 255
    std = torch.tensor([0.229, 0.224, 0.225])[:, None, None] * 255
    for k, index in enumerate(list(loader.sampler)[:5]):
        path, target = loader.dataset.samples[index]
        pixels = decode_image(path, mode=ImageReadMode.RGB)
        crop = F2.center_crop(F2.resize(pixels, [36], antialias=True), [32, 32])
        assert torch.allclose(images[k], (crop.float() - mean) / std, atol=1e-5), path
        assert targets[k] == target


@pytest.mark.parametrize("seed_workers", ["0", "1"])
def test_seed_everything_workers_seeds_each_worker_by_its_rank(
    shapes_root: Path, monkeypatch: pytest.MonkeyPatch, seed_workers: str
) -> None:
    from lightning_fabric.utilities.seed import pl_worker_init_function

    from bad_image_policy import find_bad_image_counter

    monkeypatch.setenv("PL_SEED_WORKERS", seed_workers)  # what seed_everything(workers=True) sets
    dm = small_dm(shapes_root, workers=1)
    dm.trainer = fake_trainer(world_size=2, rank=1)
    dm.setup("fit")
    init = find_bad_image_counter(dm.train_dataloader()).loader.worker_init_fn.inner  # inside the signal shield
    if seed_workers == "1":
        assert init.func is pl_worker_init_function and init.keywords == {"rank": 1}
    else:
        assert init is None


def test_without_trainer_the_loaders_are_single_process_on_cpu(shapes_root: Path) -> None:
    dm = small_dm(shapes_root, channels_last=True)
    assert dm.classes[0] == "checker" and dm.num_classes == NUM_CLASSES
    dm.setup("fit")
    loader = dm.train_dataloader()
    assert loader.sampler.num_replicas == 1
    images, targets = next(iter(loader))
    assert images.device.type == "cpu" and images.shape == (8, 3, 32, 32)
    assert images.is_contiguous(memory_format=torch.channels_last)
    assert int(targets.max()) < NUM_CLASSES


def test_synthetic_source_needs_no_files(tmp_path: Path) -> None:
    dm = ImageNetDataModule(
        root=str(tmp_path / "absent"),
        source="synthetic",
        batch_size=4,
        crop_size=16,
        synthetic_num_classes=7,
        synthetic_train_steps=3,
        synthetic_val_steps=2,
    )
    assert dm.num_classes == 7
    assert dm.class_names is None  # numbers only: a checkpoint records no class names for synthetic data
    dm.setup("fit")
    train_loader, val_loader = dm.train_dataloader(), dm.val_dataloader()
    assert isinstance(train_loader, SyntheticBatches)
    assert (len(train_loader), len(val_loader)) == (3, 2)
    images, targets = next(iter(train_loader))
    assert images.shape == (4, 3, 16, 16) and int(targets.max()) < 7
    assert not torch.equal(next(iter(val_loader))[0], images)  # validation is not the one batch it trains on


def test_hidden_folders_and_files_are_neither_classes_nor_samples(shapes_root: Path, tmp_path: Path) -> None:
    # A Jupyter checkpoint folder (hidden) inside each split and inside a class, and macOS's "._" companion of a
    # photo (not an image): no class, no label shift, no duplicate sample, no bad image.
    root = tmp_path / "data"
    for split in ("train", "val"):
        for name in ("circle", "square"):
            shutil.copytree(shapes_root / split / name, root / split / name)
        first = sorted((root / split / "circle").iterdir())[0]
        for hidden in (root / split / ".ipynb_checkpoints", root / split / "circle" / ".ipynb_checkpoints"):
            hidden.mkdir()
            shutil.copy(first, hidden / "copy.JPEG")
        (root / split / "square" / f"._{first.name}").write_bytes(b"\x00\x05\x16\x07\x00\x02\x00\x00Mac OS X")
    dm = small_dm(root)
    assert dm.classes == ["circle", "square"]
    dm.setup("fit")
    for split, images in (("train", dm.train_set), ("val", dm.val_set)):
        visible = sorted(str(p) for p in (root / split).glob("[!.]*/[!.]*.JPEG"))
        assert sorted(path for path, _ in images.samples) == visible
        assert images.classes == ["circle", "square"]
        assert sorted(set(images.targets)) == [0, 1]


def test_generated_source_draws_the_dataset_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import shapes_dataset

    calls = []
    real_generate = shapes_dataset.generate

    def small_generate(root, seed=0, **kwargs):  # noqa: ANN001
        calls.append(seed)
        return real_generate(root, train_per_class=2, val_per_class=1, image_size=16, seed=seed)

    monkeypatch.setattr(shapes_dataset, "generate", small_generate)
    dm = small_dm(tmp_path / "shapes", source="generated", crop_size=16, val_resize_size=16, val_crop_size=16, seed=3)
    assert dm.num_classes == len(shapes_dataset.CLASSES)  # known before anything is drawn
    with pytest.raises(FileNotFoundError, match="no complete generated dataset"):
        dm.setup("fit")
    with caplog.at_level(logging.INFO):
        dm.prepare_data()
    # Where it is drawn is said, with the whole path: a mistyped data.root shows at once.
    said = f"drawing the embedded shapes dataset into {(tmp_path / 'shapes').absolute()} (first use"
    assert said in caplog.text
    dm.setup("fit")
    assert calls == [3]
    assert len(dm.train_set) == 2 * NUM_CLASSES and dm.train_set.classes == list(shapes_dataset.CLASSES)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        dm.prepare_data()  # a finished dataset: read, not drawn, and nothing said
    assert calls == [3, 3] and "drawing" not in caplog.text


def test_a_finished_dataset_of_another_seed_is_kept_and_said(tmp_path: Path) -> None:
    import shapes_dataset

    small = {"train_per_class": 2, "val_per_class": 1, "image_size": 16}
    root = shapes_dataset.generate(tmp_path / "shapes", seed=0, **small)
    before = sorted((p.name, p.stat().st_mtime_ns) for p in root.rglob("*.JPEG"))
    with pytest.warns(UserWarning, match=r"drawn with seed 0, and this run asks for seed 5: it trains on that one"):
        shapes_dataset.generate(root, seed=5, **small)
    assert sorted((p.name, p.stat().st_mtime_ns) for p in root.rglob("*.JPEG")) == before  # not drawn again
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        shapes_dataset.generate(root, seed=0, **small)  # its own seed: nothing to say


def test_a_dataset_drawn_by_another_process_meanwhile_is_taken(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Two runs (or two nodes on a shared file system) draw the dataset at once: the other one publishes first, ours
    # then finds the folder taken and keeps theirs (before: "Directory not empty" and a failed start).
    import shapes_dataset

    root, real_replace = tmp_path / "shapes", os.replace
    small = {"train_per_class": 2, "val_per_class": 1, "image_size": 16}

    def the_other_process_first(source: Path, target: Path) -> None:
        monkeypatch.setattr(shapes_dataset.os, "replace", real_replace)
        shapes_dataset.generate(root, **small)
        real_replace(source, target)

    monkeypatch.setattr(shapes_dataset.os, "replace", the_other_process_first)
    assert shapes_dataset.generate(root, **small) == root
    assert shapes_dataset.is_complete(root)
    assert [p.name for p in tmp_path.iterdir()] == ["shapes"]  # our staging folder is gone

    # An empty folder there at the start, removed by the other process while ours drew: ours publishes.
    emptied = tmp_path / "emptied"
    emptied.mkdir()
    real_draw = shapes_dataset.draw_sample

    def remove_it_meanwhile(*args: object) -> object:
        if emptied.exists():
            emptied.rmdir()
        return real_draw(*args)

    monkeypatch.setattr(shapes_dataset.os, "replace", real_replace)
    monkeypatch.setattr(shapes_dataset, "draw_sample", remove_it_meanwhile)
    assert shapes_dataset.is_complete(shapes_dataset.generate(emptied, **small))
    monkeypatch.setattr(shapes_dataset, "draw_sample", real_draw)

    # A folder that something else filled meanwhile, without a dataset in it, is still an error.
    def something_else_first(source: Path, target: Path) -> None:
        target.mkdir()
        (target / "notes.txt").touch()
        real_replace(source, target)

    monkeypatch.setattr(shapes_dataset.os, "replace", something_else_first)
    with pytest.raises(OSError):
        shapes_dataset.generate(tmp_path / "taken", **small)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["emptied", "shapes", "taken"]


# --- bad roots ---------------------------------------------------------------------------------------------------
def make_layout(root: Path, train: list[str], val: list[str], source: Path | None = None) -> Path:
    """Folders ``root/{train,val}/<class>``, each with one JPEG copied from ``source`` (empty without one)."""
    for split, names in (("train", train), ("val", val)):
        for name in names:
            folder = root / split / name
            folder.mkdir(parents=True)
            if source is not None:
                shutil.copy(next((source / "val" / "circle").iterdir()), folder / "a.JPEG")
    return root


def test_empty_class_folder_fails_in_setup_naming_the_folder(tmp_path: Path, shapes_root: Path) -> None:
    root = make_layout(tmp_path / "data", ["a", "b"], ["a", "b"], source=shapes_root)
    for image in (root / "train" / "b").iterdir():
        image.unlink()
    dm = small_dm(root)
    assert dm.num_classes == 2  # the layout itself is fine
    with pytest.raises(
        FileNotFoundError, match=r"data.root: .*classes b\b.*every class folder under " + re.escape(str(root / "train"))
    ):
        dm.setup("fit")


def test_bad_roots_fail_through_the_cli_before_training(
    tmp_path: Path, shapes_root: Path, tiny_args, monkeypatch: pytest.MonkeyPatch, refused
) -> None:
    run = tmp_path / "run"
    # Missing root: while the CLI links data.num_classes into the model.
    assert f"error: data.root: {tmp_path / 'absent'} does not exist" in refused(
        ["fit", *tiny_args(tmp_path / "absent", run)]
    )
    # Differing class sets.
    root = make_layout(tmp_path / "differ", ["a", "b"], ["a", "c"], source=shapes_root)
    assert f"{root}/train and {root}/val have different classes" in refused(["fit", *tiny_args(root, run)])
    # Empty class folder: in setup, before any step, said in one line, and no run folder is left.
    root = make_layout(tmp_path / "empty", ["a", "b"], ["a", "b"], source=shapes_root)
    (root / "val" / "b" / "a.JPEG").unlink()
    said = refused(["fit", *tiny_args(root, run, data__batch_size=2)])
    assert said.startswith("error: data.root: Found no valid file for the classes b; every class folder under ")
    assert not run.exists()


@pytest.mark.slow
def test_bad_root_through_train_py_exits_nonzero_naming_the_path(tmp_path: Path, tiny_args, run_train) -> None:
    root = tmp_path / "data"
    (root / "train" / "a").mkdir(parents=True)
    result = run_train(["fit", *tiny_args(root, tmp_path / "run")], cwd=tmp_path, timeout=120)
    assert result.returncode != 0
    assert f"data.root: {root / 'val'} is missing" in result.stderr
    assert not list(tmp_path.rglob("*.ckpt"))


# --- argument checks ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": 0}, "data.batch_size must be >= 1"),
        ({"source": "synthetic", "synthetic_num_classes": 1}, "data.synthetic_num_classes must be >= 2"),
        ({"synthetic_val_steps": 0}, r"data.synthetic_train_steps, .* must be >= 1, got 100, 0, "),
        ({"workers": -1}, "data.workers must be >= 0"),
        ({"val_resize_size": 32, "val_crop_size": 48}, r"data.val_crop_size \(48\) is larger"),
        ({"min_crop_scale": 0.0}, "data.min_crop_scale must be in"),
        ({"crop_size": 0}, "must be >= 1"),
        # torch's sampler seeds with seed + epoch: 2**64 - 1 crashed at the second epoch's start.
        ({"seed": 2**64 - 1}, r"data.seed must be in 0\.\.9223372036854775807, got 18446744073709551615"),
        ({"seed": -1}, r"data.seed must be in 0\.\."),
    ],
)
def test_invalid_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ImageNetDataModule(**kwargs)


def test_a_root_under_home_is_the_home_folders(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert ImageNetDataModule(root="~/imagenet").root == tmp_path / "imagenet"


def test_a_prefetch_factor_without_workers_is_said() -> None:
    with pytest.warns(UserWarning, match="data.prefetch_factor 4 has no effect with data.workers 0"):
        ImageNetDataModule(root="unused", workers=0, prefetch_factor=4)


def test_options_the_source_does_not_read_are_said() -> None:
    # --data.source synthetic over a folder's configuration: its folder, loader and decode options do nothing.
    said = "data.source synthetic does not read data.root x, data.workers 0, data.val_crop_size 64, data.decode gpu: "
    with pytest.warns(UserWarning, match=re.escape(said + "options of folder and generated data")):
        ImageNetDataModule(root="x", source="synthetic", workers=0, val_crop_size=64, decode="gpu")
    for source in ("folder", "generated"):
        with pytest.warns(
            UserWarning, match=re.escape(f"data.source {source} does not read data.synthetic_val_steps 3:")
        ):
            ImageNetDataModule(root="unused", source=source, synthetic_val_steps=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # what each source reads, and the defaults of what it does not, say nothing
        ImageNetDataModule(source="synthetic", batch_size=4, crop_size=32, synthetic_num_classes=3, seed=2)
        ImageNetDataModule(root="unused", source="folder", workers=2, decode="gpu", cpu_decode_share=0.5)
        ImageNetDataModule(root=Path("data/imagenet"), source="synthetic")  # the default folder, as a Path
    with pytest.warns(UserWarning, match=re.escape("data.source synthetic does not read data.root elsewhere:")):
        ImageNetDataModule(root=Path("elsewhere"), source="synthetic")


def test_teardown_closes_the_loaders_it_made_and_their_workers(shapes_root: Path) -> None:
    dm = small_dm(shapes_root, workers=1)
    dm.trainer = fake_trainer()
    dm.setup("fit")
    train_loader, val_loader = dm.train_dataloader(), dm.val_dataloader()
    batches = iter(train_loader)
    next(batches)
    next(iter(val_loader))
    inner = [loader.loader.loader for loader in (train_loader, val_loader)]  # prefetcher -> bad-image counter -> loader
    assert all(loader._iterator is not None for loader in inner)
    dm.teardown("fit")
    assert next(batches, None) is None
    assert all(loader._iterator is None for loader in inner)


def test_batches_already_on_the_device_are_not_moved_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The prefetcher (or the synthetic source) hands out batches on the device: Lightning's own transfer, a copy call
    per tensor, is skipped for them; a batch elsewhere still moves."""
    import pytorch_lightning as pl

    dm = small_dm(tmp_path)
    moved = []
    real = pl.LightningDataModule.transfer_batch_to_device
    monkeypatch.setattr(
        pl.LightningDataModule,
        "transfer_batch_to_device",
        lambda self, batch, device, idx: moved.append(device) or real(self, batch, device, idx),
    )
    batch = (torch.zeros(2, 3, 4, 4), torch.zeros(2, dtype=torch.long))
    assert dm.transfer_batch_to_device(batch, torch.device("cpu"), 0) is batch
    assert moved == []
    images, targets = dm.transfer_batch_to_device(batch, torch.device("meta"), 0)
    assert moved == [torch.device("meta")] and images.device.type == targets.device.type == "meta"
