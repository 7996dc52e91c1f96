"""The bad-image policy of the input pipeline (``data.on_bad_image``), its per-epoch count and the per-sample seed.

Decoding, and the :class:`~image_loading.BadImageError` a file that does not decode raises, are :mod:`image_loading`'s.

**The policy** (:class:`BadImagePolicy`, ``data.on_bad_image``): ``error`` (the default) lets the error stop the run.
``skip`` replaces a bad sample by the next index that loads (deterministic: the same files are replaced by the same
neighbours in every epoch and on every rerun) and reports it.

**Counting bad images per epoch with worker processes.** Workers cannot change state in the main process, and the
product rule is no per-step host sync. So the count travels with the data: :class:`BadImagePolicy` returns
``(image, target, bad)`` where ``bad`` is the tuple of ``(path, reason)`` pairs it replaced to produce this sample
(nearly always empty); :class:`BadImageCollate` wraps ``fast_collate`` and passes the bad entries of the batch
through as a third element; :class:`BadImageCounter` wraps the ``DataLoader`` in the main process, strips that third
element (so the prefetcher and the model keep seeing ``(images, targets)``), adds it to the epoch's count and warns
once per file (:class:`BadImageWarning`). All of it is host-side Python data produced by the workers: counting costs
no device work and no synchronization. The count of the epoch is complete when the loader is exhausted; the
:class:`~callbacks.bad_images.BadImageCount` callback logs it at epoch end, summed over ranks in one reduction.

**Augmentation randomness is per sample** (:class:`SeededIndex`). The training sampler hands out indices that carry
a seed drawn from ``(data seed, epoch, index)``; :class:`BadImagePolicy` seeds torch's CPU generator with it around
the sample's load and transform (and puts the generator's state back afterwards). The random crop and flip of a
sample (torchvision's ``RandomResizedCrop``/``RandomHorizontalFlip``, and the box and flip that ``data.decode: gpu``
draws with the same ``get_params``: all of them draw from that generator) are then a function of the seed, the epoch
and the index alone: not of which worker loads the sample, how many workers there are, how far ahead they prefetch,
the rank, or whether the run was resumed in the middle of the epoch. It is always on, not only for deterministic
runs: it costs about 4 us per sample (against milliseconds to decode an ImageNet JPEG), it is what makes a resumed
run see exactly the images the interrupted one would have, and it does not depend on Lightning's seeding of the
workers (``seed_everything(workers=True)``). With ``workers: 0`` the main process's generator is left as it was, so
the model's own randomness does not depend on the data either; the exception is ``workers: 0`` with
``data.decode: gpu``, where the prefetcher's thread loads samples while the training thread runs, and a CPU draw of
the training thread could fall between a sample's seeding and its restore (a GPU model draws from the CUDA
generators, which this never touches).
"""

from __future__ import annotations

import gc
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal

import torch
from torch.utils.data import Dataset

from image_loading import BadImageError, BadImageWarning
from prefetcher import LoaderProxy

OnBadImage = Literal["error", "skip"]


class SeededIndex(int):
    """A dataset index that carries the seed of its sample's random augmentation (see the module docstring).

    It is an ``int`` for everything else (indexing, arithmetic, ``int()``, JSON), so code that reads a sampler's
    indices sees plain indices; only :class:`BadImagePolicy` looks at :attr:`seed`.

    Args:
        index: The dataset index.
        seed: Seed of torch's CPU generator while this sample is loaded and transformed (0 to 2**63 - 1).
    """

    seed: int

    def __new__(cls, index: int, seed: int) -> SeededIndex:
        self = super().__new__(cls, index)
        self.seed = seed
        return self

    def __reduce__(self) -> tuple[Any, tuple[int, int]]:
        # Indices travel to the loader's worker processes pickled; keep the seed (and a compact form).
        return SeededIndex, (int(self), self.seed)

    def __repr__(self) -> str:
        return f"SeededIndex({int(self)}, seed={self.seed})"


def _sample_path(dataset: Any, index: int) -> str:
    samples = getattr(dataset, "samples", None)
    return str(samples[index][0]) if samples is not None else f"sample {index}"


IGNORED_TARGET = -1
"""The target of a sample that stands in for a bad image in evaluation: left out of the loss and the accuracies."""


class BadImagePolicy(Dataset):
    """Wraps a dataset of ``(image, target)`` samples (an ``ImageFolder``) and applies ``data.on_bad_image``.

    Samples come out as ``(image, target, bad)``: ``bad`` is a tuple of ``(path, reason)`` pairs, the files replaced
    to produce this sample, empty unless one was bad. Batch them with :class:`BadImageCollate`. A
    :class:`SeededIndex` seeds the sample's augmentation (a replacement sample is drawn with the seed of the index it
    replaces).

    Args:
        dataset: The dataset; its loader raises :class:`BadImageError` for a file it cannot decode.
        on_bad_image: ``error`` re-raises the error, which names the file and stops the run; ``skip`` replaces the
            sample by the next index that loads (wrapping around at the end).
        max_consecutive: With ``skip``, how many bad files in a row are tolerated for one sample before the run
            stops anyway: that many neighbours failing means a broken dataset or storage, not a few bad files.
        evaluation: With ``skip``, a replacement sample's target is :data:`IGNORED_TARGET`, which the metrics and
            the loss leave out: evaluation scores the images that load, each once. The replacement keeps the batch
            its size (one compiled shape) where dropping the sample would not; training keeps the neighbour's target.

    Other attributes (``classes``, ``samples``, ...) are those of ``dataset``.
    """

    def __init__(
        self, dataset: Dataset, on_bad_image: OnBadImage = "error", max_consecutive: int = 10, evaluation: bool = False
    ) -> None:
        if on_bad_image not in ("error", "skip"):
            raise ValueError(f"data.on_bad_image must be 'error' or 'skip', got {on_bad_image!r}")
        if max_consecutive < 1:
            raise ValueError(f"max_consecutive must be >= 1, got {max_consecutive}")
        self.dataset = dataset
        self.on_bad_image = on_bad_image
        self.max_consecutive = max_consecutive
        self.evaluation = evaluation

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes this wrapper does not have; guards against recursion while unpickling.
        if name == "dataset":
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def __getitem__(self, index: int) -> tuple[Any, Any, tuple[tuple[str, str], ...]]:
        seed = getattr(index, "seed", None)
        if seed is None:  # a plain index (validation, or a sampler of someone else's): the generator as it is
            return self._sample(index)
        # Only the CPU generator, which is all the augmentations draw from: torch.manual_seed would also reseed the
        # CUDA generators of a main process that loads without workers, and nothing here would put them back.
        generator = torch.default_generator
        state = generator.get_state()
        generator.manual_seed(seed)
        try:
            return self._sample(index)
        finally:
            generator.set_state(state)

    def _sample(self, index: int) -> tuple[Any, Any, tuple[tuple[str, str], ...]]:
        if self.on_bad_image == "error":
            image, target = self.dataset[index]
            return image, target, ()
        bad: list[tuple[str, str]] = []
        length = len(self)
        for attempt in range(min(self.max_consecutive + 1, length)):
            candidate = (index + attempt) % length
            try:
                image, target = self.dataset[candidate]
            except BadImageError as error:
                bad.append((error.path or _sample_path(self.dataset, candidate), error.reason or str(error)))
                continue
            if bad and self.evaluation:
                target = IGNORED_TARGET
            # Its own file only (the first tried): a bad neighbour is counted, and warned about, when its own index is
            # drawn, in this epoch on some rank; counted here too, a run of k bad files counted k(k+1)/2.
            return image, target, tuple(bad[:1])
        listed = "; ".join(f"{path}: {reason}" for path, reason in bad)
        raise BadImageError(
            f"{len(bad)} bad images in a row from index {int(index)} on ({listed}); with data.on_bad_image: skip at "
            f"most {self.max_consecutive} consecutive bad files are replaced: check the dataset and the storage",
            path=bad[0][0] if bad else None,
            reason="too many consecutive bad images",
        )


class BadImageCollate:
    """Collates ``(image, target, bad)`` samples with ``collate_fn`` and passes the bad entries through.

    Args:
        collate_fn: Collates ``(image, target)`` pairs, e.g. ``datamodule.fast_collate``.

    Returns (when called on a batch): ``(*collate_fn(pairs), bad)`` where ``bad`` is the tuple of all ``(path,
    reason)`` pairs of the batch.
    """

    def __init__(self, collate_fn: Callable[[Sequence[tuple[Any, Any]]], Sequence[Any]]) -> None:
        self.collate_fn = collate_fn

    def __call__(self, batch: Sequence[tuple[Any, Any, tuple[tuple[str, str], ...]]]) -> tuple[Any, ...]:
        pairs = [(image, target) for image, target, _ in batch]
        bad = tuple(entry for _, _, entries in batch for entry in entries)
        return (*self.collate_fn(pairs), bad)


def iter_loader(loader: Any) -> Iterator[Any]:
    """``iter(loader)``, with the garbage collector's objects frozen while a loader with workers forks them.

    A forked worker inherits every object of the training process, CUDA tensors in unreachable reference cycles
    included (a finished fit's, a profiler's); a collection in the worker would free them there, and freeing a CUDA
    tensor in a forked process aborts it ("CUDA error: initialization error" from a tensor's destructor: once on an
    H200, the four workers of a GPU test's loader dead, late in a run of every GPU test in one process). Frozen objects
    are never collected in the child; the parent collects them as usual once unfrozen. It also spares the workers the
    copy-on-write of the pages that the collector's bookkeeping would touch (Python's ``gc.freeze`` documentation).
    Frozen and unfrozen in O(1).
    """
    if not getattr(loader, "num_workers", 0):
        return iter(loader)
    frozen_before = gc.get_freeze_count()
    gc.freeze()
    try:
        return iter(loader)
    finally:
        if not frozen_before:  # objects someone else froze stay frozen
            gc.unfreeze()


class BadImageCounter(LoaderProxy):
    """Wraps a loader of ``(images, targets, bad)`` batches; yields ``(images, targets)`` and counts the bad files.

    Runs in the main process, where the batches of all workers arrive, so counts are complete whatever the number
    of workers. Proxies ``sampler``, ``batch_sampler``, ``dataset`` and ``__len__`` so that Lightning (through the
    prefetcher) sets the sampler's epoch and sizes epochs through it.

    Attributes:
        epoch_count: Bad files replaced in the current (or, once exhausted, the last) pass over the loader; reset
            when a new pass starts.
        total_count: Bad files replaced since this object was made.
        bad_files: Every bad file seen so far, with its reason.
    """

    def __init__(self, loader: Any, split: str = "train") -> None:
        self.loader = loader
        self.split = split
        self.epoch_count = 0
        self.total_count = 0
        self.bad_files: dict[str, str] = {}

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        # Reset now rather than at the first next(): a generator's body only starts running on that first call.
        self.epoch_count = 0
        return self._batches(iter_loader(self.loader))

    def _batches(self, iterator: Iterator[Sequence[Any]]) -> Iterator[tuple[Any, ...]]:
        for batch in iterator:
            *data, bad = batch
            if bad:
                self._record(bad)
            yield tuple(data)

    def _record(self, bad: Sequence[tuple[str, str]]) -> None:
        self.epoch_count += len(bad)
        self.total_count += len(bad)
        for path, reason in bad:
            if path not in self.bad_files:
                self.bad_files[path] = reason
                what = "replaces it with the next image" if self.split == "train" else "leaves it out of the metrics"
                warnings.warn(
                    f"data ({self.split}): skipping bad image {path}: {reason} "
                    f"(data.on_bad_image: skip {what}; reported once per file)",
                    BadImageWarning,
                    stacklevel=2,
                )


def find_bad_image_counter(loader: Any, max_depth: int = 4) -> BadImageCounter | None:
    """The :class:`BadImageCounter` inside ``loader``, following ``.loader`` attributes (prefetcher wrappers)."""
    for _ in range(max_depth + 1):
        if isinstance(loader, BadImageCounter):
            return loader
        loader = getattr(loader, "loader", None)
        if loader is None:
            return None
    return None
