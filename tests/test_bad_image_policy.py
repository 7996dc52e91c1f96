"""The bad-image policy, its per-epoch count and the loader's fork (bad_image_policy.py, callbacks/bad_images.py).

Bad files are made byte by byte (empty, text, a truncated JPEG), never downloaded.
"""

from __future__ import annotations

import contextlib
import csv
import gc
import signal
import warnings
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from image_files import noise_jpeg
from torch.utils.data import DataLoader, SequentialSampler
from torchvision import datasets, transforms

from bad_image_policy import (
    IGNORED_TARGET,
    BadImageCollate,
    BadImageCounter,
    BadImagePolicy,
    SeededIndex,
    find_bad_image_counter,
)
from callbacks.bad_images import BadImageCount
from datamodule import fast_collate
from image_loading import BadImageError, BadImageWarning, ImageLoader


@contextlib.contextmanager
def deadline(seconds: int):
    """Fails the test instead of hanging it: SIGALRM raises in the main thread after ``seconds``."""

    def expire(signum: int, frame: object) -> None:
        raise TimeoutError(f"still running after {seconds} s: the data loader hangs")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# --- the policy ---------------------------------------------------------------------------------------
@pytest.fixture
def folder_with_bad(tmp_path: Path) -> tuple[Path, list[str]]:
    """One class folder of 12 images (sorted names); indices 3, 7 and 11 (the last) are bad files."""
    folder = tmp_path / "data" / "only"
    folder.mkdir(parents=True)
    bad = []
    for i in range(12):
        path = folder / f"img_{i:02d}.JPEG"
        if i in (3, 7, 11):
            if i == 3:
                path.write_bytes(b"")
            elif i == 7:
                path.write_text("this is not an image\n")
            else:
                data = noise_jpeg(path).read_bytes()
                path.write_bytes(data[: len(data) // 2])  # truncated
            bad.append(str(path))
        else:
            noise_jpeg(path, size=16, seed=i)
    return tmp_path / "data", bad


def tagged_folder(root: Path) -> datasets.ImageFolder:
    """ImageFolder whose targets are the file indices, so a test can tell which file a sample came from."""
    dataset = datasets.ImageFolder(str(root), loader=ImageLoader(), transform=transforms.CenterCrop(16))
    dataset.samples = [(path, i) for i, (path, _) in enumerate(dataset.samples)]
    return dataset


def test_error_policy_raises_naming_the_file(folder_with_bad: tuple[Path, list[str]]) -> None:
    root, bad = folder_with_bad
    dataset = BadImagePolicy(tagged_folder(root), on_bad_image="error")
    assert dataset[2][1:] == (2, ())
    with pytest.raises(BadImageError, match=r"img_03\.JPEG: the file is empty"):
        dataset[3]


def test_skip_policy_replaces_with_the_next_index_deterministically(folder_with_bad: tuple[Path, list[str]]) -> None:
    root, bad = folder_with_bad
    dataset = BadImagePolicy(tagged_folder(root), on_bad_image="skip")
    image, target, replaced = dataset[3]
    assert target == 4 and image.size == (16, 16)
    assert replaced == ((bad[0], "the file is empty"),)
    assert dataset[3][1:] == (4, replaced)  # the same replacement every time
    assert dataset[11][1] == 0  # the last index wraps around to the first
    assert dataset[4][1:] == (4, ())
    assert dataset.classes == ["only"]  # the wrapped dataset's attributes show through


def test_skip_policy_in_evaluation_keeps_the_batch_size_and_scores_the_replacement_not_at_all(
    folder_with_bad: tuple[Path, list[str]],
) -> None:
    root, bad = folder_with_bad
    dataset = BadImagePolicy(tagged_folder(root), on_bad_image="skip", evaluation=True)
    image, target, replaced = dataset[3]
    # The next image stands in (one batch shape) but is not scored twice: its target says "ignore".
    assert image.size == (16, 16) and target == IGNORED_TARGET and replaced == ((bad[0], "the file is empty"),)
    assert dataset[4][1:] == (4, ())  # the neighbour itself is scored once, at its own index
    targets = [dataset[i][1] for i in range(len(dataset))]
    assert targets == [0, 1, 2, IGNORED_TARGET, 4, 5, 6, IGNORED_TARGET, 8, 9, 10, IGNORED_TARGET]


def test_skip_policy_gives_up_on_a_run_of_bad_files(folder_with_bad: tuple[Path, list[str]]) -> None:
    root, _ = folder_with_bad
    dataset = BadImagePolicy(tagged_folder(root), on_bad_image="skip", max_consecutive=1)
    assert dataset[3][1] == 4  # one bad file: replaced
    Path(dataset.samples[4][0]).write_bytes(b"")  # 3 and 4: a run of two, one more than max_consecutive
    with pytest.raises(BadImageError, match="^2 bad images in a row from index 3 on"):
        dataset[3]


def test_a_seeded_sample_leaves_the_main_processs_generator_as_it_was_also_when_it_raises(
    folder_with_bad: tuple[Path, list[str]],
) -> None:
    """With workers: 0 the samples load in the training process: the model's draws (dropout, a random init) after a
    seeded sample must be those it would have made without it, also after a sample that raised."""
    root, bad = folder_with_bad
    folder = tagged_folder(root)
    folder.transform = transforms.RandomCrop(8)  # the sample draws from the generator, as the augmentations do
    dataset = BadImagePolicy(folder, on_bad_image="error")
    with torch.random.fork_rng(devices=[]):  # the other tests' generator as it was
        torch.manual_seed(1234)
        state = torch.get_rng_state()
        expected = torch.rand(8)
        torch.set_rng_state(state)
        first = dataset[SeededIndex(2, 99)][0]
        assert torch.equal(torch.rand(8), expected)
        torch.set_rng_state(state)
        with pytest.raises(BadImageError, match=r"img_03\.JPEG"):
            dataset[SeededIndex(3, 99)]  # seeded, then raised
        assert torch.equal(torch.rand(8), expected)
        # The seed alone picks the crop, whatever the generator's state before.
        torch.manual_seed(5678)
        assert dataset[SeededIndex(2, 99)][0] == first


def test_policy_validates_its_arguments() -> None:
    with pytest.raises(ValueError, match="data.on_bad_image must be 'error' or 'skip', got 'ignore'"):
        BadImagePolicy([], on_bad_image="ignore")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_consecutive must be >= 1"):
        BadImagePolicy([], max_consecutive=0)


def skip_loader(root: Path, workers: int, batch_size: int = 4, split: str = "train") -> BadImageCounter:
    """The data module's loader of ``split`` (``train`` or ``val``) with ``data.on_bad_image: skip``."""
    dataset = BadImagePolicy(tagged_folder(root), on_bad_image="skip", evaluation=split != "train")
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=SequentialSampler(dataset),
        num_workers=workers,
        collate_fn=BadImageCollate(fast_collate),
        persistent_workers=workers > 0,
    )
    return BadImageCounter(loader, split)


@pytest.mark.parametrize(
    ("split", "what"), [("train", "replaces it with the next image"), ("val", "leaves it out of the metrics")]
)
def test_the_warning_says_what_skip_does_with_the_image_in_its_split(
    folder_with_bad: tuple[Path, list[str]], split: str, what: str
) -> None:
    root, bad = folder_with_bad
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        targets = torch.cat([targets for _, targets in skip_loader(root, workers=0, split=split)]).tolist()
    # What the warning says is what happened: the neighbour trained on in its place, or nothing scored for it.
    assert targets[3] == (4 if split == "train" else IGNORED_TARGET)
    reported = [str(w.message) for w in caught if issubclass(w.category, BadImageWarning)]
    assert len(reported) == 3
    assert reported[0] == (
        f"data ({split}): skipping bad image {bad[0]}: the file is empty (data.on_bad_image: skip {what}; reported "
        "once per file)"
    )


def test_counts_per_epoch_with_two_workers_and_warns_once_per_file(folder_with_bad: tuple[Path, list[str]]) -> None:
    root, bad = folder_with_bad
    counter = skip_loader(root, workers=2)
    assert len(counter) == 3 and isinstance(counter.sampler, SequentialSampler) and len(counter.dataset) == 12
    with deadline(60), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for epoch in range(2):
            targets = []
            for batch in counter:
                assert len(batch) == 2  # (images, targets): what the prefetcher and the model expect
                images, batch_targets = batch
                assert images.dtype == torch.uint8 and images.shape[1:] == (3, 16, 16)
                targets += batch_targets.tolist()
            assert targets == [0, 1, 2, 4, 4, 5, 6, 8, 8, 9, 10, 0], epoch
            assert counter.epoch_count == 3, epoch
    assert counter.total_count == 6
    assert sorted(counter.bad_files) == sorted(bad)
    reported = [str(w.message) for w in caught if issubclass(w.category, BadImageWarning)]
    assert len(reported) == 3  # once per file, not once per epoch
    assert all(any(path in message for message in reported) for path in bad)


def test_bad_files_in_a_row_count_once_each(folder_with_bad: tuple[Path, list[str]]) -> None:
    """Each sample also reported the bad neighbours it skipped, which counted again when their own index came: three
    in a row counted 3 + 2 + 1."""
    root, bad = folder_with_bad
    for i in (4, 5):  # with 3: three bad files in a row
        (root / "only" / f"img_{i:02d}.JPEG").write_bytes(b"")
    counter = skip_loader(root, workers=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert sum(len(targets) for _, targets in counter) == 12
    assert counter.epoch_count == 5 and len(counter.bad_files) == 5  # 3, 4, 5, 7 and 11
    assert len([w for w in caught if issubclass(w.category, BadImageWarning)]) == 5


def test_error_in_a_worker_reaches_the_main_process_naming_the_file(
    folder_with_bad: tuple[Path, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # After a worker error, torch joins each worker for MP_STATUS_CHECK_INTERVAL (5 s) before terminating it; a
    # shorter interval keeps the test fast and still checks that the shutdown ends. (At process exit torch skips the
    # join: the workers are daemons.)
    monkeypatch.setattr(torch.utils.data._utils, "MP_STATUS_CHECK_INTERVAL", 0.5)
    root, bad = folder_with_bad
    dataset = BadImagePolicy(tagged_folder(root), on_bad_image="error")
    loader = DataLoader(
        dataset, batch_size=2, num_workers=2, collate_fn=BadImageCollate(fast_collate), persistent_workers=True
    )
    with deadline(60):
        with pytest.raises(BadImageError) as caught:
            for _ in BadImageCounter(loader):
                pass
        message = str(caught.value)
        del caught, loader  # the traceback holds the iterator; dropping both shuts the workers down
        gc.collect()
    assert "Caught BadImageError in DataLoader worker process" in message
    assert f"{bad[0]}: the file is empty" in message


def test_find_bad_image_counter_through_wrappers(folder_with_bad: tuple[Path, list[str]]) -> None:
    counter = skip_loader(folder_with_bad[0], workers=0)

    class Wrapper:
        def __init__(self, loader: object) -> None:
            self.loader = loader

    assert find_bad_image_counter(Wrapper(Wrapper(counter))) is counter
    assert find_bad_image_counter(Wrapper(object())) is None
    assert find_bad_image_counter(None) is None


# --- per-epoch logging in a Lightning run -------------------------------------------------------------
class _Flat(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(3 * 16 * 16, 16)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        images, targets = batch
        return torch.nn.functional.cross_entropy(self.layer(images.float().flatten(1) / 255), targets)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self.training_step(batch, batch_idx)

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self.training_step(batch, batch_idx)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_bad_image_count_logs_per_epoch(folder_with_bad: tuple[Path, list[str]], tmp_path: Path) -> None:
    root, _ = folder_with_bad
    trainer = pl.Trainer(
        accelerator="cpu",
        max_epochs=2,
        logger=pl.loggers.CSVLogger(tmp_path, name="logs"),
        callbacks=[BadImageCount()],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        log_every_n_steps=1,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(_Flat(), skip_loader(root, workers=0), skip_loader(root, workers=0, batch_size=6))
    assert trainer.callback_metrics["train_bad_images"].item() == 3
    assert trainer.callback_metrics["val_bad_images"].item() == 3
    with open(Path(trainer.logger.log_dir) / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    for key in ("train_bad_images", "val_bad_images"):
        assert [float(row[key]) for row in rows if row.get(key)] == [3.0, 3.0], key  # one value per epoch
    trainer.test(_Flat(), skip_loader(root, workers=0, batch_size=6), verbose=False)  # counted there too
    assert trainer.callback_metrics["test_bad_images"].item() == 3


class _FreezeCount(torch.utils.data.Dataset):
    """Each item is the worker's ``gc.get_freeze_count()``: above 0 where the objects were frozen at the fork."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int, tuple]:
        import gc

        return torch.tensor(gc.get_freeze_count()), index, ()


@pytest.mark.parametrize("workers", [0, 2])
def test_workers_fork_with_the_parents_objects_frozen_and_the_parent_unfrozen_after(workers: int) -> None:
    import gc

    loader = torch.utils.data.DataLoader(
        _FreezeCount(), batch_size=2, num_workers=workers, multiprocessing_context="fork" if workers else None,
        collate_fn=lambda batch: (torch.stack([b[0] for b in batch]), [b[1] for b in batch], ()),
    )  # fmt: skip
    assert gc.get_freeze_count() == 0
    counts = torch.cat([images for images, _ in BadImageCounter(loader)])
    assert gc.get_freeze_count() == 0  # the parent collects as before
    if workers:
        assert (counts > 0).all()  # nothing the worker inherited is collected there
    else:
        assert (counts == 0).all()  # no fork: nothing frozen


def test_objects_someone_else_froze_stay_frozen() -> None:
    import gc

    loader = torch.utils.data.DataLoader(
        _FreezeCount(), batch_size=2, num_workers=2, multiprocessing_context="fork",
        collate_fn=lambda batch: (torch.stack([b[0] for b in batch]), [b[1] for b in batch], ()),
    )  # fmt: skip
    gc.freeze()  # as a server that freezes its startup objects before forking would
    try:
        for _ in BadImageCounter(loader):
            pass
        assert gc.get_freeze_count() > 0  # not unfrozen behind its owner's back (a few frozen objects died)
    finally:
        gc.unfreeze()
