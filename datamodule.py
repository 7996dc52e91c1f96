"""ImageNet-layout data for Lightning: ImageFolder splits, ``fast_collate`` to uint8 NCHW, device-side normalization.

Workers decode and augment (``data.cpu_decoder``: torchvision's decoder on uint8 tensors, or PIL) and hand over uint8
batches (no ``ToTensor``: a float32 batch is four times the bytes to pin and copy). The ``DevicePrefetcher``
(prefetcher.py) copies the next batch to the GPU on a side stream and normalizes it there while the current one
computes. ``source: synthetic`` replaces all of it with a fixed batch on the device; ``source: generated`` trains on a
small dataset this project draws itself (shapes_dataset.py).

**Exact resume in the middle of an epoch.** Lightning 2.6 restores its loop counters from a checkpoint but starts the
epoch's data loader from the beginning again (unless the loader is "stateful"), so a run resumed from a mid-epoch
``last.ckpt`` would train on the first batches of the epoch a second time and never see the last ones. Here the
training order is a function of ``(seed, epoch)`` (:class:`TrainSampler`), and the data module's checkpoint state
(:meth:`ImageNetDataModule.state_dict`, saved by Lightning with every checkpoint) records the epoch and how many of
its batches were done. On resume the sampler serves that epoch from the next batch on, and the augmentation of every
sample is seeded from ``(seed, epoch, index)`` (:class:`~bad_image_policy.SeededIndex`): the resumed
run sees exactly the batches, crops and flips the uninterrupted run would have, and with ``trainer.deterministic``
ends with the same weights bit for bit. The epoch's length (``len`` of the loader), the sampler's epoch and the
learning-rate schedule are those of the uninterrupted run. The position is per rank in batches, so it is exact for a
resume with the same batch size and number of ranks (anything else is warned about). A second resume within the
epoch after an epoch-end resume also needs checkpoint_io.py's repair of Lightning's epoch progress.
"""

from __future__ import annotations

import hashlib
import inspect
import math
import os
import weakref
from collections.abc import Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pytorch_lightning as pl
import torch
from lightning_fabric.utilities.seed import pl_worker_init_function
from pytorch_lightning.utilities import rank_zero_info, rank_zero_warn
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler
from torchvision.datasets.folder import IMG_EXTENSIONS
from typing_extensions import override  # a dependency (pyproject.toml); Lightning marks its hooks with it

import cpu_decode
import cuda_env
import shapes_dataset
from bad_image_policy import BadImageCollate, BadImageCounter, BadImagePolicy, SeededIndex
from callbacks.preemption import WorkerSignalShield
from encoded_batch import EncodedSampleLoader, encoded_collate
from gpu_decode import NVJPEG_BINDINGS, decode_batch
from image_folder import VisibleImageFolder, check_layout
from image_loading import ImageLoader, min_decode_side
from prefetcher import IMAGENET_MEAN_255, IMAGENET_STD_255, DevicePrefetcher, SyntheticBatches


def fast_collate(batch: Sequence[tuple[Any, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Stacks PIL images, HWC uint8 arrays or ``(3, H, W)`` uint8 tensors (``data.cpu_decoder: torchvision``, which
    also passes PIL images through for files other than plain JPEGs) into one uint8 NCHW tensor, and targets into
    int64.

    Grayscale images (PIL mode ``L`` or 2-D arrays) are broadcast to three channels. All images must share one size,
    which the crop transforms guarantee. In a loader worker the batch is allocated in shared memory, as torch's default
    collate does, so that sending it to the main process does not copy it there first.

    Returns:
        ``(images, targets)``: ``images`` is ``uint8`` of shape ``(N, 3, H, W)``, contiguous; ``targets`` is ``int64``.
    """
    targets = torch.tensor([target for _, target in batch], dtype=torch.int64)
    images = out = None
    height = width = 0
    for i, (image, _) in enumerate(batch):
        if isinstance(image, torch.Tensor):
            array, size = None, tuple(image.shape[-2:])
            if image.dtype != torch.uint8 or image.dim() != 3 or image.shape[0] != 3:
                raise ValueError(
                    f"fast_collate: image {i} is a {image.dtype} tensor of shape {tuple(image.shape)}; tensor images "
                    "must be (3, H, W) uint8"
                )
        else:
            array = np.asarray(image, dtype=np.uint8)
            size = array.shape[:2]
        if images is None:
            height, width = size
            images = _batch_buffer((len(batch), 3, height, width))
            # Written through a NumPy view of the batch: the arrays of PIL images are read-only, and torch.from_numpy
            # on them warns (non-writable tensor) in every worker.
            out = images.numpy()
        if size != (height, width):
            raise ValueError(
                f"fast_collate: image {i} is {size[1]}x{size[0]}, the first is {width}x{height}; all images of a "
                "batch must have one size (crop them first)"
            )
        if array is None:
            images[i].copy_(image)
        else:
            # HWC -> CHW; a single gray channel (2-D array) broadcasts over the three.
            out[i] = array if array.ndim == 2 else array[:, :, :3].transpose(2, 0, 1)
    assert images is not None, "fast_collate: an empty batch"
    return images, targets


def _batch_buffer(shape: tuple[int, ...]) -> torch.Tensor:
    """An uninitialized uint8 tensor for a batch; in a loader worker in shared memory, as torch's default collate
    allocates it, so that sending the batch to the main process does not copy it there first."""
    if torch.utils.data.get_worker_info() is None:
        return torch.empty(shape, dtype=torch.uint8)
    storage = torch.UntypedStorage._new_shared(math.prod(shape))
    return torch.empty(0, dtype=torch.uint8).set_(storage).view(shape)


class ShardSampler(Sampler[int]):
    """Every ``num_replicas``-th index starting at ``rank``, in order, without padding.

    Evaluation must see each sample exactly once across ranks for metrics to equal a single-process run;
    ``DistributedSampler`` pads the last shard with repeats instead.
    """

    def __init__(self, length: int, num_replicas: int, rank: int) -> None:
        self.indices = range(rank, length, num_replicas)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """The seed of sample ``index``'s augmentation in ``epoch``: 63 well-mixed bits of ``(seed, epoch, index)``."""
    digest = hashlib.blake2b(f"{seed}:{epoch}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class TrainSampler(DistributedSampler):
    """The training order: ``DistributedSampler``'s shuffle of ``(seed, epoch)``, ``drop_last``, and two additions.

    * Every index comes out as a :class:`~bad_image_policy.SeededIndex` carrying :func:`sample_seed` of
      ``(seed, epoch, index)``, which seeds that sample's augmentation.
    * :meth:`resume_at` ``(epoch, batches)``: iterating epoch ``epoch`` starts after its first ``batches`` batches of
      ``batch_size`` (what the interrupted run had done); other epochs are whole. ``len`` stays the whole epoch's:
      Lightning sizes the epoch and the LR schedule with it, and counts the skipped batches as done.

    Also used for one process (``num_replicas=1``): the order is then a function of ``(seed, epoch)`` alone.
    """

    def __init__(self, dataset: Dataset, num_replicas: int, rank: int, seed: int, batch_size: int) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed, drop_last=True)
        self.batch_size = batch_size
        self.resume_epoch: int | None = None
        self.resume_batches = 0

    def resume_at(self, epoch: int, batches: int) -> None:
        """Epoch ``epoch`` starts at batch ``batches`` (0-based) of this rank's order."""
        self.resume_epoch, self.resume_batches = epoch, batches

    @override
    def __iter__(self) -> Iterator[int]:
        indices = list(super().__iter__())
        if self.epoch == self.resume_epoch:
            indices = indices[self.resume_batches * self.batch_size :]
        seed, epoch = self.seed, self.epoch
        # Lazily: the loader asks for a few batches at a time, and ImageNet has 1.28 M indices.
        return (SeededIndex(index, sample_seed(seed, epoch, index)) for index in indices)


class _TrainLoader(DevicePrefetcher):
    """The training prefetcher, marked resumable for Lightning (``state_dict``/``load_state_dict``).

    The position itself is restored by the data module (:meth:`ImageNetDataModule.load_state_dict`), before the
    loader exists or at least before it is iterated. Lightning would hand a loader its state only if it built the
    loader after restoring its loops, which this application does not do (the model sizes its LR schedule with the
    loader in ``configure_optimizers``, before the loops are restored). Without the mark Lightning warns on every
    mid-epoch resume that the loader restarts the epoch, which it no longer does.
    """

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        pass


#: The options that only files are read with (synthetic batches are drawn on the device at data.crop_size), and those
#: that only synthetic data reads.
_FILE_OPTIONS = ("root", "workers", "prefetch_factor", "min_crop_scale", "val_resize_size", "val_crop_size", "decode",
                 "cpu_decode_share", "nvjpeg", "decode_threads", "cpu_decoder", "on_bad_image")  # fmt: skip
_SYNTHETIC_OPTIONS = ("synthetic_num_classes", "synthetic_train_steps", "synthetic_val_steps")


def _options_the_source_ignores(source: str, values: Any) -> list[str]:
    """``data.KEY VALUE`` for each option given a value other than its default that ``source`` does not read: a
    ``--data.source synthetic`` over a folder's configuration, or ``synthetic_train_steps`` left in one for files."""
    defaults = inspect.signature(ImageNetDataModule.__init__).parameters
    unread = _FILE_OPTIONS if source == "synthetic" else _SYNTHETIC_OPTIONS
    return [f"data.{name} {values[name]}" for name in unread if not _is_default(values[name], defaults[name].default)]


def _is_default(value: Any, default: Any) -> bool:
    # A root given as a Path from Python code is the default when it names the same folder.
    if isinstance(value, os.PathLike) and isinstance(default, str):
        return Path(value) == Path(default)
    return value == default


class ImageNetDataModule(pl.LightningDataModule):
    """ImageNet-style folders (or synthetic/generated data) batched as uint8 and normalized on the device.

    Args:
        root: Dataset folder with ``train/<class>/*`` and ``val/<class>/*``. With ``source: generated`` the folder
            the embedded dataset is written to on first use.
        source: ``folder`` reads ``root``; ``generated`` first draws the embedded shapes dataset into ``root``;
            ``synthetic`` uses a fixed random batch on the device (the compute ceiling, no files).
        batch_size: Images per device per step (the global batch is this times the number of devices).
        workers: Data loader worker processes per device.
        crop_size: Training crop (RandomResizedCrop) side in pixels.
        min_crop_scale: Smallest area fraction RandomResizedCrop may keep.
        val_resize_size: Validation images are resized so their short side is this, then center-cropped.
        val_crop_size: Validation center-crop side in pixels.
        channels_last: Hand batches out in channels_last format (set from ``model.channels_last``).
        prefetch_factor: Batches each worker loads ahead.
        synthetic_num_classes: Number of classes with ``source: synthetic``.
        synthetic_train_steps: Batches per training epoch with ``source: synthetic``.
        synthetic_val_steps: Batches per validation run with ``source: synthetic``.
        decode: Where JPEGs are decoded: ``cpu`` (in the workers, by ``cpu_decoder``) or ``gpu`` (the workers only read
            files and draw the crop; nvJPEG decodes and the GPU crops, resizes and flips on the prefetcher's side
            stream; see gpu_decode.py). ``gpu`` on a CPU-only run falls back to ``cpu`` with a warning.
        cpu_decode_share: With ``decode: gpu``, the share of the files (a fixed set, chosen by a hash of the path) that
            the workers still decode and crop, as ``decode: cpu`` would (by ``cpu_decoder``); the GPU path takes the
            rest. The GPU path's host work runs on one thread of the training process, the workers' in theirs: a share
            that keeps both busy feeds the GPU best (README, "Feeding the GPU"). 0 sends every JPEG to the GPU path. On
            an H200 with 16 cores, 0.5 with ``nvjpeg: preallocated`` fed compiled ResNet-50 the original JPEGs at
            0.957 of synthetic data (with ``CUDA_DEVICE_MAX_CONNECTIONS=32``, which train.py sets; 0.748 with CUDA's
            default 8: cuda_env.py).
        nvjpeg: With ``decode: gpu``, how nvJPEG is called: ``torchvision`` (``torchvision.io.decode_jpeg``) or
            ``preallocated`` (nvjpeg_batched.py: its own handle on the hardware decoder, buffers sized once for the
            batch, so that images of new sizes do not make nvJPEG free device memory, which waits for the whole GPU).
            ``preallocated`` falls back to torchvision, with a warning, where the GPU has no JPEG hardware decoder, and
            for the JPEGs that decoder does not take (progressive ones). Off by default: a ctypes binding; in training
            on an H200 it was 1.022 times as fast as torchvision's (compiled, the originals, split 0.5, one run;
            README).
        decode_threads: With ``decode: gpu``, how many threads of the training process decode batches at once (1 to 8),
            each with its own side stream (and, with ``nvjpeg: preallocated``, its own nvJPEG decoder); batches still
            come in the sampler's order. On an H200 with 32 hardware queues a second thread gave compiled ResNet-50
            nothing and eager ResNet-18 with every JPEG on the GPU 1.14 times the speed on average (four pairs; none
            with the split at 0.3; README, "Feeding the GPU"). Each more thread costs GPU memory: up to two more
            batches in flight (float32, about 154 MB each at 256 x 224 x 224), its decoded images until their crops
            are read and, with ``nvjpeg: preallocated``, its own decoder's buffers (about 200 MB at batch 256);
            measured, 0.36-0.62 GiB more peak per thread. torchvision's binding has one decoder for all threads and
            decodes one call at a time, so there only the crop stage overlaps.
        cpu_decoder: What decodes and crops the images the workers decode (all of them with ``decode: cpu``, the
            ``cpu_decode_share`` with ``decode: gpu``): ``torchvision`` (uint8 tensors: ``torchvision.io.decode_jpeg``,
            libjpeg-turbo as PIL, and torch's vectorized antialiased resize; the same boxes and flips, pixels within a
            level or two of PIL's; files other than plain JPEGs still go through PIL; see cpu_decode.py)
            or ``pil`` (PIL images, as the original). On an H200 machine's 16 cores ``torchvision`` fed compiled
            ResNet-50 at 0.989 of synthetic data from a pre-resized copy, where ``pil`` reached 0.685 (README).
        on_bad_image: An image file that cannot be decoded (truncated, empty, not an image, unreadable): ``error``
            stops the run with a message naming the file; ``skip`` replaces a training sample with the next image
            that loads and leaves a validation image out of the metrics (each image that loads counts once), warns
            once per file and counts them (logged per epoch as ``train_bad_images``/``val_bad_images``).
        seed: Seed of the training-order shuffle (epoch-dependent through ``set_epoch``) and of the generated data.
    """

    def __init__(
        self,
        root: str = "data/imagenet",
        source: Literal["folder", "generated", "synthetic"] = "folder",
        batch_size: int = 256,
        workers: int = 8,
        crop_size: int = 224,
        min_crop_scale: float = 0.08,
        val_resize_size: int = 256,
        val_crop_size: int = 224,
        channels_last: bool = False,
        prefetch_factor: int = 2,
        synthetic_num_classes: int = 1000,
        synthetic_train_steps: int = 100,
        synthetic_val_steps: int = 10,
        decode: Literal["cpu", "gpu"] = "cpu",
        cpu_decode_share: float = 0.0,
        nvjpeg: Literal["torchvision", "preallocated"] = "torchvision",
        decode_threads: int = 1,
        cpu_decoder: Literal["pil", "torchvision"] = "torchvision",
        on_bad_image: Literal["error", "skip"] = "error",
        seed: int = 0,
    ) -> None:
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"data.batch_size must be >= 1, got {batch_size}")
        if workers < 0:
            raise ValueError(f"data.workers must be >= 0 (0 loads in the main process), got {workers}")
        if min(crop_size, val_resize_size, val_crop_size) < 1:
            raise ValueError(
                f"data.crop_size, data.val_resize_size and data.val_crop_size must be >= 1, got "
                f"{crop_size}, {val_resize_size}, {val_crop_size}"
            )
        if val_crop_size > val_resize_size:
            raise ValueError(
                f"data.val_crop_size ({val_crop_size}) is larger than data.val_resize_size ({val_resize_size}); "
                "the center crop must fit in the resized image (the ImageNet recipe uses 224 of 256)"
            )
        if not 0.0 < min_crop_scale <= 1.0:
            raise ValueError(f"data.min_crop_scale must be in (0, 1], got {min_crop_scale}")
        if synthetic_num_classes < 2:
            raise ValueError(
                f"data.synthetic_num_classes must be >= 2 (a classifier needs two classes), got {synthetic_num_classes}"
            )
        if min(synthetic_train_steps, synthetic_val_steps, prefetch_factor) < 1:
            raise ValueError(
                "data.synthetic_train_steps, data.synthetic_val_steps and data.prefetch_factor must be >= 1, got "
                f"{synthetic_train_steps}, {synthetic_val_steps}, {prefetch_factor}"
            )
        if workers == 0 and prefetch_factor != 2 and source != "synthetic":
            rank_zero_warn(
                f"data.prefetch_factor {prefetch_factor} has no effect with data.workers 0: the main process loads "
                "each batch when it is needed; give data.workers to load ahead"
            )
        if not 0.0 <= cpu_decode_share <= 1.0:
            raise ValueError(
                f"data.cpu_decode_share must be in [0, 1] (the share of files the workers decode), got "
                f"{cpu_decode_share}"
            )
        if cpu_decode_share > 0.0 and decode != "gpu":
            raise ValueError(
                f"data.cpu_decode_share ({cpu_decode_share}) splits the decode of data.decode: gpu between the "
                f"workers and the GPU; with data.decode: {decode} it has no effect: set data.decode: gpu or leave it 0"
            )
        if nvjpeg not in NVJPEG_BINDINGS:
            raise ValueError(f"data.nvjpeg must be one of {', '.join(NVJPEG_BINDINGS)}, got {nvjpeg!r}")
        if nvjpeg != "torchvision" and decode != "gpu":
            raise ValueError(f"data.nvjpeg: {nvjpeg} chooses how data.decode: gpu calls nvJPEG; set data.decode: gpu")
        if isinstance(decode_threads, bool) or not isinstance(decode_threads, int) or not 1 <= decode_threads <= 8:
            raise ValueError(
                f"data.decode_threads must be an integer from 1 to 8 (threads that feed nvJPEG and the GPU crop), got "
                f"{decode_threads!r}"
            )
        if decode_threads != 1 and decode != "gpu":
            raise ValueError(
                f"data.decode_threads: {decode_threads} sets the threads of data.decode: gpu; with data.decode: "
                f"{decode} the workers decode: set data.decode: gpu or leave it 1"
            )
        if cpu_decoder not in cpu_decode.CPU_DECODERS:
            raise ValueError(
                f"data.cpu_decoder must be one of {', '.join(cpu_decode.CPU_DECODERS)}, got {cpu_decoder!r}"
            )
        if on_bad_image not in ("error", "skip"):
            raise ValueError(f"data.on_bad_image must be 'error' or 'skip', got {on_bad_image!r}")
        if isinstance(seed, bool) or not 0 <= seed <= 2**63 - 1:
            # torch's samplers seed a generator with seed + epoch: past 2**64 - 1 a crash at an epoch's start.
            raise ValueError(f"data.seed must be in 0..{2**63 - 1}, got {seed}")
        self.save_hyperparameters()
        if unread := _options_the_source_ignores(source, self.hparams):
            other = "folder and generated" if source == "synthetic" else "synthetic"
            rank_zero_warn(
                f"data.source {source} does not read {', '.join(unread)}: options of {other} data, which have no "
                "effect on this run"
            )
        self.root = Path(root).expanduser()
        self.source = source
        self.batch_size = batch_size
        self.workers = workers
        self.channels_last = channels_last
        self.gpu_decode = False  # decided in setup, once the device is known
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None
        self._classes: list[str] | None = None
        self._train_sampler: TrainSampler | None = None
        self._prefetchers: weakref.WeakSet[DevicePrefetcher] = weakref.WeakSet()  # closed in teardown
        self._resume_at: tuple[int, int] | None = None  # (epoch, batches done in it) from a checkpoint

    # --- what the model needs to know -----------------------------------------------------------------
    @property
    def classes(self) -> list[str]:
        """Class names in label order (checked from disk for ``source: folder``)."""
        if self._classes is None:
            if self.source == "synthetic":
                self._classes = [str(i) for i in range(self.hparams.synthetic_num_classes)]
            elif self.source == "generated":
                self._classes = list(shapes_dataset.CLASSES)
            else:
                self._classes = check_layout(self.root)
        return self._classes

    @property
    def class_names(self) -> list[str] | None:
        """The class folders' names in label order, which a checkpoint records; None for synthetic data, whose classes
        are numbers only."""
        return None if self.source == "synthetic" else list(self.classes)

    @property
    def num_classes(self) -> int:
        """Number of classes; linked into ``model.num_classes`` by the CLI."""
        return len(self.classes)

    # --- Lightning hooks ------------------------------------------------------------------------------
    @override
    def prepare_data(self) -> None:
        # Runs once per node (local rank 0) before the others set up, so the dataset is drawn exactly once.
        if self.source == "generated":
            if not shapes_dataset.is_complete(self.root):
                # Said, so that a mistyped data.root is seen at once, not found later as a stray dataset folder.
                rank_zero_info(
                    f"data.source generated: drawing the embedded shapes dataset into {self.root.absolute()} (first "
                    "use; later runs with this data.root read it)"
                )
            shapes_dataset.generate(self.root, seed=self.hparams.seed)

    @override
    def setup(self, stage: str) -> None:
        # Lightning calls setup before it restores a checkpoint: a fit without one starts at the first batch, also
        # when this data module resumed an earlier fit.
        self._resume_at = None
        if self.source == "synthetic":
            return
        if self.source == "generated" and not shapes_dataset.is_complete(self.root):
            raise FileNotFoundError(
                f"data.root: {self.root} holds no complete generated dataset; prepare_data did not run"
            )
        classes = check_layout(self.root)
        if self.source == "folder" and self._classes is not None and classes != self._classes:
            raise ValueError(f"data.root: the class folders of {self.root} changed since the model was built")
        self._classes = classes
        h = self.hparams
        self.gpu_decode = h.decode == "gpu" and self._device().type == "cuda"
        if h.decode == "gpu" and not self.gpu_decode:
            rank_zero_warn(
                f"data.decode: gpu needs a CUDA device, this run is on {self._device().type}; decoding in the workers "
                f"(data.cpu_decoder {h.cpu_decoder})"
            )
        if self.gpu_decode and (connections := cuda_env.connections()) < cuda_env.CONNECTIONS:
            rank_zero_warn(
                f"data.decode: gpu with {cuda_env.MAX_CONNECTIONS}={connections}: nvJPEG's streams share "
                "hardware queues with the training step and its calls wait behind it (on an H200, 10 times as long). "
                f"train.py sets {cuda_env.CONNECTIONS} unless the environment sets it; set "
                f"{cuda_env.MAX_CONNECTIONS}={cuda_env.CONNECTIONS} before CUDA starts (see cuda_env.py)"
            )
        # JPEGs at least twice as large as any crop needs are decoded at a reduced size: no crop upsamples.
        draft = min_decode_side(h.crop_size, h.min_crop_scale, h.val_resize_size)
        pil_loader = ImageLoader(draft_min_side=draft)
        cpu_loader, normalize_free_train, normalize_free_val = cpu_decode.workers_pipeline(
            h.cpu_decoder, draft, h.crop_size, h.min_crop_scale, h.val_resize_size, h.val_crop_size
        )
        if self.gpu_decode:
            # The files of the CPU share are decoded and cropped by the very transforms of decode: cpu.
            share = h.cpu_decode_share
            read_headers = h.nvjpeg == "preallocated"  # the binding that uses the workers' header reading

            def encoded(train: bool, crop: int, transform: Any) -> EncodedSampleLoader:
                return EncodedSampleLoader(train, crop, h.min_crop_scale, h.val_resize_size, pil_loader, share,
                                           transform, cpu_loader, read_headers)  # fmt: skip

            if stage == "fit":
                self.train_set = self._image_folder("train", None, encoded(True, h.crop_size, normalize_free_train))
            self.val_set = self._image_folder("val", None, encoded(False, h.val_crop_size, normalize_free_val))
            return
        if stage == "fit":
            self.train_set = self._image_folder("train", normalize_free_train, cpu_loader)
        self.val_set = self._image_folder("val", normalize_free_val, cpu_loader)

    def _image_folder(self, split: str, transform: Any, loader: Any) -> BadImagePolicy:
        folder = self.root / split
        try:
            images = VisibleImageFolder(str(folder), transform=transform, loader=loader)
        except FileNotFoundError as error:
            # torchvision's message names the class but not the fix.
            raise FileNotFoundError(
                f"data.root: {str(error).rstrip('. ')}; every class folder under {folder} needs at least one image "
                f"with one of the extensions {', '.join(IMG_EXTENSIONS)}"
            ) from error
        world = self._world()[0]
        if split == "val":
            if len(images) < world:
                # In setup, before any step: a rank without a validation batch would skip validation while the others
                # run it, and their checkpoint decisions would part ways (a hang). Every rank sees this and refuses.
                raise ValueError(
                    f"data.root: {folder} holds {len(images)} images for {world} ranks; every rank needs at least one "
                    f"(add validation images or run on at most {len(images)} devices)"
                )
            self._check_eval_fractions(folder, len(images), world)
        if split == "train" and len(images) // world < self.batch_size:
            # The sampler gives each rank len // world images and drops the last partial batch: no training step.
            raise ValueError(
                f"data.root: {folder} holds {len(images)} images, fewer than one batch of data.batch_size "
                f"{self.batch_size} for each of {world} rank(s); lower data.batch_size (at most "
                f"{max(len(images) // world, 1)} here) or add images"
            )
        return BadImagePolicy(images, on_bad_image=self.hparams.on_bad_image, evaluation=split == "val")

    @override
    def train_dataloader(self) -> Any:
        if self.source == "synthetic":
            return self._synthetic(self.hparams.synthetic_train_steps, seed=self.hparams.seed)
        assert self.train_set is not None, "setup('fit') must run first"
        world, rank = self._world()
        # DistributedSampler also for one process: the order is then a function of (seed, epoch) alone, which makes
        # a resumed run see the same epochs as an uninterrupted one. drop_last keeps every rank at the same step count.
        sampler = TrainSampler(self.train_set, world, rank, self.hparams.seed, self.batch_size)
        if self._resume_at is not None:
            sampler.resume_at(*self._resume_at)
        self._train_sampler = sampler
        loader = self._loader(self.train_set, sampler, drop_last=True)
        return self._wrap(loader, self.hparams.crop_size, "train", prefetcher=_TrainLoader)

    @override
    def val_dataloader(self) -> Any:
        if self.source == "synthetic":
            return self._synthetic(self.hparams.synthetic_val_steps, seed=self.hparams.seed + 1)
        assert self.val_set is not None, "setup() must run first"
        world, rank = self._world()
        loader = self._loader(self.val_set, ShardSampler(len(self.val_set), world, rank), drop_last=False)
        return self._wrap(loader, self.hparams.val_crop_size, "val")

    @override
    def test_dataloader(self) -> Any:
        # ImageNet's test labels are not public: "test" evaluates the val split, as the original's -e did.
        if self.source != "synthetic":
            rank_zero_info(f"test evaluates {self.root / 'val'}, as validate does (its metrics named test_*)")
            test = self.root / "test"
            if test.is_dir() and any(entry.is_dir() for entry in test.iterdir()):
                rank_zero_warn(
                    f"{test} is not read: test evaluates {self.root / 'val'}; to score the images of test/, pass "
                    f"--data.root a folder holding links train -> {self.root / 'train'} and val -> {test}"
                )
        return self.val_dataloader()

    @override
    def teardown(self, stage: str) -> None:
        # Lightning cannot see the DataLoaders behind the prefetchers to shut their persistent workers down itself.
        for prefetcher in list(self._prefetchers):
            prefetcher.close()
        self._prefetchers.clear()

    @override
    def state_dict(self) -> dict[str, Any]:
        """Where training is in its epoch, saved by Lightning in every checkpoint of a fit (see the module docstring).

        ``train_position``: the epoch, the batches of it this rank has done (what Lightning resumes after: a checkpoint
        taken in ``on_train_batch_end`` counts its batch as done, one taken inside a step does not), and the batch
        size and number of ranks they were counted in, and the workers' decoder.
        """
        trainer = self.trainer
        fit_loop = getattr(trainer, "fit_loop", None)
        if fit_loop is None or self.source == "synthetic" or trainer.state.fn != "fit":
            return {}
        return {
            "train_position": {
                "epoch": trainer.current_epoch,
                "batches": fit_loop.epoch_loop.batch_progress.current.processed,
                "batch_size": self.batch_size,
                "world_size": trainer.world_size,
                "cpu_decoder": self.hparams.cpu_decoder,
                # Lightning's count of the epoch's batches: limit_train_batches included.
                "epoch_batches": trainer.num_training_batches,
            }
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resumes the training order where the checkpoint's run was (Lightning calls it before training starts)."""
        position = state_dict.get("train_position")
        state = getattr(self.trainer, "state", None)
        if not position or getattr(state, "fn", "fit") != "fit":  # validate and test resume no training order
            return
        world = self._world()[0]
        changed = (position["batch_size"], position["world_size"]) != (self.batch_size, world)
        if changed and not self._epoch_was_done(position):
            rank_zero_warn(
                f"resuming epoch {position['epoch']} after batch {position['batches']} with data.batch_size "
                f"{self.batch_size} on {world} rank(s); the checkpoint was taken with {position['batch_size']} on "
                f"{position['world_size']}: the rest of this epoch is not exactly the interrupted run's (the next "
                "epochs are)"
            )
        # A checkpoint from before data.cpu_decoder existed was taken by a run that decoded with PIL.
        decoder = position.get("cpu_decoder", "pil")
        if decoder != self.hparams.cpu_decoder:
            rank_zero_warn(
                f"resuming with data.cpu_decoder {self.hparams.cpu_decoder}; the checkpoint's run decoded with "
                f"{decoder}: crops differ from the interrupted run's by a level or two in some pixels; set "
                f"data.cpu_decoder {decoder} to continue it exactly"
            )
        self._resume_at = (int(position["epoch"]), int(position["batches"]))
        if self._train_sampler is not None:  # the loader was built before the restore
            self._train_sampler.resume_at(*self._resume_at)

    @override
    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        # Batches arrive on the device already (prefetcher or synthetic); a second transfer would be a no-op copy
        # call per tensor at best. Anything else falls back to Lightning's move.
        if isinstance(batch, (tuple, list)) and all(isinstance(t, torch.Tensor) and t.device == device for t in batch):
            return batch
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    # --- helpers --------------------------------------------------------------------------------------
    def _epoch_was_done(self, position: dict[str, Any]) -> bool:
        """Whether the checkpoint's run had trained every batch of its epoch (a checkpoint of an epoch's end: the
        resumed run starts the next epoch, whatever its batch size)."""
        epoch_batches = position.get("epoch_batches")
        if isinstance(epoch_batches, int):  # saved since the count included trainer.limit_train_batches
            return int(position["batches"]) >= epoch_batches
        if self.train_set is None:
            return False
        per_rank = len(self.train_set) // int(position["world_size"])
        return int(position["batches"]) >= per_rank // int(position["batch_size"])

    def _check_eval_fractions(self, folder: Path, images: int, world: int) -> None:
        """Refuses a ``trainer.limit_val_batches``/``limit_test_batches`` fraction that leaves a rank no batch.

        The val split's shards differ by up to one image (no padding, :class:`ShardSampler`), so their batch counts
        can differ by one, and Lightning takes ``int(batches x fraction)`` of each: 0 on a smaller shard is an error on
        that rank alone while the others validate and wait for it (a hang). Every rank checks the smallest shard.
        """
        fewest = math.ceil((images // world) / self.batch_size)  # batches of the smallest shard
        for key in ("limit_val_batches", "limit_test_batches"):
            fraction = getattr(self.trainer, key, None) if self.trainer is not None else None
            if isinstance(fraction, float) and 0.0 < fraction < 1.0 and int(fewest * fraction) == 0:
                raise ValueError(
                    f"trainer.{key} {fraction} of {folder}'s batches leaves no batch on a rank: its smallest shard has "
                    f"{fewest} batch(es) of data.batch_size {self.batch_size} on {world} rank(s); use at least "
                    f"{1 / fewest:.4g}, or a whole number of batches (--trainer.{key} 1)"
                )

    def _world(self) -> tuple[int, int]:
        trainer = self.trainer
        if trainer is None:
            return 1, 0
        return trainer.world_size, trainer.global_rank

    def _device(self) -> torch.device:
        return self.trainer.strategy.root_device if self.trainer is not None else torch.device("cpu")

    def _loader(self, dataset: Dataset, sampler: Sampler, drop_last: bool) -> DataLoader:
        workers = self.workers
        worker_init_fn = None
        if workers > 0 and int(os.environ.get("PL_SEED_WORKERS", 0)):
            # seed_everything(workers=True): distinct, reproducible seeds per worker and rank.
            worker_init_fn = partial(pl_worker_init_function, rank=self._world()[1])
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            sampler=sampler,
            num_workers=workers,
            # Batches are (images, targets, bad files); BadImageCounter strips the third in the main process.
            collate_fn=BadImageCollate(encoded_collate if self.gpu_decode else fast_collate),
            # Not for the GPU decode path: nvJPEG reads the JPEG bytes from any host memory, and the pin thread would
            # drop the shared-memory batch with the GIL held (buffer_release.release_host_buffer frees it without).
            pin_memory=self._device().type == "cuda" and not self.gpu_decode,
            drop_last=drop_last,
            persistent_workers=workers > 0,
            prefetch_factor=self.hparams.prefetch_factor if workers > 0 else None,
            # Workers leave SIGINT/SIGTERM to the main process, which stops at a step boundary (callbacks/preemption).
            worker_init_fn=WorkerSignalShield(worker_init_fn) if workers > 0 else None,
        )

    def _wrap(
        self, loader: DataLoader, size: int, split: str, prefetcher: type[DevicePrefetcher] = DevicePrefetcher
    ) -> DevicePrefetcher:
        decoder = None
        if self.gpu_decode:
            # Decoded straight into the model's memory format: normalizing then needs no second batch-sized buffer.
            memory_format = torch.channels_last if self.channels_last else torch.contiguous_format
            decoder = partial(decode_batch, size=size, nvjpeg=self.hparams.nvjpeg, memory_format=memory_format)
        counted = BadImageCounter(loader, split)  # callbacks.bad_images.BadImageCount logs its per-epoch count
        wrapped = prefetcher(
            counted,
            self._device(),
            IMAGENET_MEAN_255,
            IMAGENET_STD_255,
            self.channels_last,
            decoder=decoder,
            producers=self.hparams.decode_threads,
        )
        self._prefetchers.add(wrapped)
        return wrapped

    def _synthetic(self, length: int, seed: int) -> SyntheticBatches:
        h = self.hparams
        return SyntheticBatches(
            self.batch_size, h.crop_size, h.synthetic_num_classes, length, self._device(), self.channels_last, seed
        )
