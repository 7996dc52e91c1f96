"""The GPU decode path's GPU side, on the CPU where it runs there: packed batches decoded and the crop/resize/flip
stage (the batched one against the per-image reference). The workers' side is in tests/test_encoded_batch.py, the
host buffers' release in tests/test_buffer_release.py."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision.transforms.v2.functional as F2
from image_files import files_of_every_kind, smooth_image
from PIL import Image
from torchvision import transforms
from torchvision.io import decode_jpeg, read_file

import bad_image_policy
import gpu_decode
from buffer_release import release_pending
from datamodule import ImageNetDataModule
from encoded_batch import Encoded, EncodedSampleLoader, PackedBatch, center_crop_geometry, encoded_collate
from gpu_decode import _groups, decode_batch, decode_crop_resize, decode_crop_resize_reference
from image_loading import load_rgb
from prefetcher import normalize


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    return files_of_every_kind(tmp_path)


@pytest.mark.parametrize(("nvjpeg", "read"), [("torchvision", False), ("preallocated", True)])
def test_the_workers_read_headers_for_the_binding_that_uses_them(shapes_root, monkeypatch, nvjpeg, read):
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32")
    data = ImageNetDataModule(root=str(shapes_root), decode="gpu", nvjpeg=nvjpeg, workers=0, batch_size=4)
    monkeypatch.setattr(data, "_device", lambda: torch.device("cuda", 0))  # the GPU path's set-up, without a GPU
    data.setup("fit")
    assert data.gpu_decode
    assert data.train_set.dataset.loader.read_headers is read and data.val_set.dataset.loader.read_headers is read


def test_a_bad_validation_file_is_left_unscored_on_the_gpu_path_too(tmp_path):
    # The GPU path's samples pass through the same data.on_bad_image policy: its stand-in keeps the batch its size
    # and carries IGNORED_TARGET, which the metrics leave out.
    from torchvision import datasets

    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        for i in range(2):
            smooth_image(90, 80, seed=i).save(tmp_path / name / f"{i}.JPEG", quality=90)
    (tmp_path / "a" / "1.JPEG").write_bytes(b"junk")  # its class's last file: the stand-in is class b's first
    folder = datasets.ImageFolder(str(tmp_path), loader=EncodedSampleLoader(False, 64, 0.08, 73, load_rgb))
    policy = bad_image_policy.BadImagePolicy(folder, on_bad_image="skip", evaluation=True)
    packed, targets, bad = bad_image_policy.BadImageCollate(encoded_collate)([policy[i] for i in range(4)])
    assert targets.tolist() == [0, bad_image_policy.IGNORED_TARGET, 1, 1]
    assert len(bad) == 1 and bad[0][0].endswith("1.JPEG")
    assert decode_batch(packed, "cpu", 64).shape == (4, 3, 64, 64)


def test_validation_crops_are_torchvisions_resize_and_center_crop(files):
    val = EncodedSampleLoader(False, 64, 0.08, 73, load_rgb)
    samples = [val(str(files["jpeg"])), val(str(files["png"]))]
    images, targets = encoded_collate([(samples[0], 3), (samples[1], 5)])
    assert targets.tolist() == [3, 5] and targets.dtype == torch.int64
    out = decode_batch(images, torch.device("cpu"), 64)
    assert out.shape == (2, 3, 64, 64) and out.dtype == torch.float32
    decoded = [decode_jpeg(read_file(str(files["jpeg"]))), torch.from_numpy(np.array(load_rgb(str(files["png"]))))]
    decoded[1] = decoded[1].permute(2, 0, 1)
    for got, image in zip(out, decoded, strict=True):
        reference = F2.center_crop(F2.resize(image.float(), [73], antialias=True), [64, 64])
        # The same filter at the same positions, as two matmuls: float rounding only (measured: max 0.005 of 255).
        torch.testing.assert_close(got, reference, atol=0.02, rtol=0)


def test_flip_mirrors_the_crop(files):
    loader = EncodedSampleLoader(True, 48, 0.08, 56, load_rgb)
    sample = loader(str(files["jpeg"]))
    sample.flip = False
    plain = decode_crop_resize([sample], torch.device("cpu"), 48)
    sample.flip = True
    flipped = decode_crop_resize([sample], torch.device("cpu"), 48)
    torch.testing.assert_close(flipped, plain.flip(-1), atol=1e-3, rtol=0)


def test_gpu_decode_on_cpu_falls_back_to_pil_with_a_warning(shapes_root):
    data = ImageNetDataModule(
        root=str(shapes_root), batch_size=4, workers=0, crop_size=32, val_resize_size=36, val_crop_size=32,
        decode="gpu",
    )  # fmt: skip
    with pytest.warns(UserWarning, match="decode: gpu needs a CUDA device"):
        data.setup("fit")
    assert not data.gpu_decode
    images, _ = next(iter(data.train_dataloader()))
    assert images.shape == (4, 3, 32, 32) and images.dtype == torch.float32


# --- the split of the decode between the workers and the GPU (data.cpu_decode_share) ---------------------------------
def test_a_packed_batch_is_one_buffer_with_the_finished_crops_first(files):
    val_crop = transforms.Compose([transforms.Resize(73), transforms.CenterCrop(64)])
    on_gpu = EncodedSampleLoader(False, 64, 0.08, 73, load_rgb, read_headers=True)
    on_cpu = EncodedSampleLoader(False, 64, 0.08, 73, load_rgb, cpu_share=1.0, cpu_transform=val_crop)
    batch = [
        (on_gpu(str(files["jpeg"])), 0),  # JPEG bytes
        (on_cpu(str(files["gray"])), 1),  # finished crop
        (on_gpu(str(files["png"])), 2),  # pixels PIL decoded (not a JPEG), cropped on the device
        (on_cpu(str(files["cmyk"])), 3),
    ]
    images, targets = encoded_collate(batch)
    assert isinstance(images, PackedBatch) and images.finished == 2 and images.size == 64
    assert targets.tolist() == [1, 3, 0, 2]
    assert images.data.dtype == torch.uint8 and images.data.dim() == 1
    assert images.data.numel() == 2 * 3 * 64 * 64 + batch[0][0].data.numel() + batch[2][0].data.numel()
    finished, rest = images.unpack()
    assert torch.equal(finished[0], batch[1][0].data) and torch.equal(finished[1], batch[3][0].data)
    for got, (sent, _) in zip(rest, [batch[0], batch[2]], strict=True):  # the same samples, views of the buffer
        assert torch.equal(got.data, sent.data) and got.data.untyped_storage().data_ptr() == images.data.data_ptr()
        assert (got.encoded, got.box, got.flip) == (sent.encoded, sent.box, sent.flip)
        assert got.hardware_size == sent.hardware_size  # (200, 300) for the JPEG, None for PIL's pixels
    assert rest[0].hardware_size == (200, 300) and rest[1].hardware_size is None
    unread = dataclasses.replace(batch[0][0], hardware_size=None)  # a header the worker could not vouch for
    assert encoded_collate([(unread, 0)])[0].unpack()[1][0].hardware_size is None

    expected = torch.cat([finished.float(), decode_crop_resize(rest, torch.device("cpu"), 64)])
    out = decode_batch(images, torch.device("cpu"), 64)
    assert out.shape == (4, 3, 64, 64) and out.dtype == torch.float32
    assert torch.equal(out, expected)
    assert images.data.numel() == 0  # the host buffer is released once read
    # In the model's memory format, the prefetcher's normalization works in place: no second batch-sized buffer.
    images, _ = encoded_collate(batch)
    out = decode_batch(images, torch.device("cpu"), 64, memory_format=torch.channels_last)
    assert out.is_contiguous(memory_format=torch.channels_last) and torch.equal(out, expected)
    normalized = normalize(out, torch.zeros(1, 3, 1, 1), torch.ones(1, 3, 1, 1), torch.channels_last)
    assert normalized.data_ptr() == out.data_ptr()

    # A batch of finished crops only, one without any, and a crop size the stage does not expect.
    only_finished, _ = encoded_collate([batch[1], batch[3]])
    reference = only_finished.unpack()[0].float()
    assert torch.equal(decode_batch(only_finished, "cpu", 64), reference)
    none_finished, targets = encoded_collate([batch[0], batch[2]])
    assert none_finished.finished == 0 and targets.tolist() == [0, 2]
    assert torch.equal(decode_batch(none_finished, "cpu", 64), expected[2:])
    images, _ = encoded_collate(batch)
    with pytest.raises(ValueError, match="finished crops are 64x64, expected 48x48"):
        decode_batch(images, "cpu", 48)


def test_packed_batches_from_worker_processes_decode_as_in_the_main_process(files):
    crop = transforms.Compose([transforms.Resize(73), transforms.CenterCrop(64)])
    loader = EncodedSampleLoader(False, 64, 0.08, 73, load_rgb, cpu_share=0.5, cpu_transform=crop)
    paths = [str(path) for path in files.values()] * 3
    dataset = [(path, i) for i, path in enumerate(paths)]

    class Samples(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(dataset)

        def __getitem__(self, index: int):
            path, target = dataset[index]
            return loader(path), target

    def batches(workers: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        data = torch.utils.data.DataLoader(Samples(), batch_size=5, num_workers=workers, collate_fn=encoded_collate)
        return [(decode_batch(images, "cpu", 64), targets) for images, targets in data]

    in_workers, in_main = batches(2), batches(0)
    assert release_pending() == 0  # on the CPU every buffer goes at once
    assert len(in_workers) == len(in_main) == 3
    for (x, y), (ref_x, ref_y) in zip(in_workers, in_main, strict=True):
        assert torch.equal(y, ref_y) and torch.equal(x, ref_x)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"decode": "gpu", "cpu_decode_share": -0.1}, r"data.cpu_decode_share must be in \[0, 1\]"),
        ({"decode": "gpu", "cpu_decode_share": 2}, r"data.cpu_decode_share must be in \[0, 1\]"),
        ({"decode": "cpu", "cpu_decode_share": 0.5}, "with data.decode: cpu it has no effect"),
        ({"decode": "gpu", "nvjpeg": "dali"}, "data.nvjpeg must be one of torchvision, preallocated, got 'dali'"),
        ({"decode": "cpu", "nvjpeg": "preallocated"}, "chooses how data.decode: gpu calls nvJPEG; set data.decode"),
        ({"decode": "gpu", "decode_threads": 0}, "data.decode_threads must be an integer from 1 to 8.*got 0"),
        ({"decode": "gpu", "decode_threads": 9}, "data.decode_threads must be an integer from 1 to 8.*got 9"),
        ({"decode": "gpu", "decode_threads": True}, "data.decode_threads must be an integer from 1 to 8.*got True"),
        ({"decode": "cpu", "decode_threads": 2}, "sets the threads of data.decode: gpu; with data.decode: cpu"),
    ],
)
def test_the_data_module_refuses_a_share_that_cannot_apply(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ImageNetDataModule(root="unused", **kwargs)


# --- the batched crop/resize/flip against the per-image reference ---------------------------------------------------
def textured_pixels(width: int, height: int, seed: int) -> torch.Tensor:
    """uint8 ``(3, H, W)``: a smooth colour field plus noise, what resizing filters differ on."""
    rng = np.random.default_rng(seed)
    field = np.asarray(smooth_image(width, height, seed), dtype=np.float32)
    pixels = np.clip(field + rng.normal(0, 20, size=field.shape), 0, 255).astype(np.uint8)
    return torch.from_numpy(pixels).permute(2, 0, 1).contiguous()


def make_sample(
    pixels: torch.Tensor,
    box: tuple[int, int, int, int],
    flip: bool,
    encoded: bool,
    resize: tuple[int, int, int, int] | None = None,
) -> Encoded:
    if not encoded:
        return Encoded(pixels, False, box, flip, resize=resize)
    buffer = io.BytesIO()
    Image.fromarray(pixels.permute(1, 2, 0).numpy()).save(buffer, "JPEG", quality=90)
    data = torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)
    return Encoded(data, True, box, flip, resize=resize)


SIZE = 48


@pytest.fixture(scope="module")
def mixed_batch() -> list[Encoded]:
    """Downscaling, upscaling (crop smaller than SIZE), identity (crop of SIZE), non-square, tiny (1x1, 3x2), crops at
    every edge; every third sample a JPEG, the rest pre-decoded pixels; every other one flipped; then validation's
    center crops (Resize + CenterCrop: downscaling, upscaling, identity), a JPEG and pixels each."""
    specs = [  # (width, height, (top, left, height, width))
        (300, 200, (10, 20, 150, 250)),
        (200, 300, (0, 0, 300, 200)),
        (64, 40, (5, 7, 20, 30)),
        (SIZE, SIZE, (0, 0, SIZE, SIZE)),
        (120, 90, (90 - SIZE, 120 - SIZE, SIZE, SIZE)),
        (1, 1, (0, 0, 1, 1)),
        (3, 2, (0, 1, 2, 2)),
        (500, 60, (3, 100, 57, 390)),
        (77, 333, (200, 0, 133, 77)),
        (97, 101, (50, 60, 51, 37)),
    ]
    torch.manual_seed(0)
    for k in range(14):  # RandomResizedCrop boxes, as the training loader draws them
        width, height = 60 + 37 * k, 250 - 11 * k
        box = loader_box(height, width)
        specs.append((width, height, box))
    batch = [  # the tiny images travel decoded: nvJPEG's hardware decoder need not take a 3x2 JPEG
        make_sample(textured_pixels(width, height, seed=k), box, k % 2 == 1, encoded=k % 3 == 0 and width * height > 64)
        for k, (width, height, box) in enumerate(specs)
    ]
    for k, (width, height, resize) in enumerate([(300, 200, 56), (90, 240, 56), (40, 30, 56), (SIZE, 70, SIZE)]):
        box, geometry = center_crop_geometry(height, width, resize, SIZE)
        pixels = textured_pixels(width, height, seed=100 + k)
        batch.append(make_sample(pixels, box, False, encoded=k % 2 == 0, resize=geometry))
    return batch


def loader_box(height: int, width: int) -> tuple[int, int, int, int]:
    from torchvision import transforms

    box = transforms.RandomResizedCrop.get_params(torch.empty(0, height, width), (0.08, 1.0), (3 / 4, 4 / 3))
    return tuple(int(v) for v in box)


def test_batched_resize_matches_the_per_image_reference(mixed_batch):
    reference = decode_crop_resize_reference(mixed_batch, torch.device("cpu"), SIZE)
    out = decode_crop_resize(mixed_batch, torch.device("cpu"), SIZE)
    assert out.shape == reference.shape == (len(mixed_batch), 3, SIZE, SIZE)
    assert out.dtype == torch.float32 and out.is_contiguous()
    # The same filter (ATen's antialiased bilinear weights) as two matmuls: float rounding only. Measured (torch
    # 2.14, CPU): mean 1.3e-5, max 2.7e-4 of 255.
    difference = (out - reference).abs()
    assert difference.mean() < 5e-5 and difference.max() < 2e-3
    # The identity crop (sample 3) is copied exactly.
    torch.testing.assert_close(out[3], reference[3], atol=1e-4, rtol=0)


def test_the_banded_filter_weights_are_the_dense_ones():
    """Only the taps near each output pixel are computed and scattered: the same weights as ATen's formula evaluated
    over every input pixel, for downscaling up to 12 input pixels an output, upscaling, shifted (validation) centers,
    mirrored rows and lengths short of the padded width."""
    from gpu_decode import _filter_parameters, _filter_weights, _taps

    generator = torch.Generator().manual_seed(0)
    size, padded = 40, 480
    lengths = torch.randint(3, padded + 1, (64,), generator=generator).float()
    lengths[:4] = torch.tensor([1.0, 2.0, float(padded), 20.0])
    scale = lengths / size
    shift = torch.zeros(64)
    shift[32:] = torch.rand(32, generator=generator)  # center crops: outputs start off the box's start
    scale[32:] *= 0.8
    mirror = torch.arange(64) % 3 == 0
    parameters = torch.from_numpy(
        _filter_parameters(lengths.numpy(), scale.numpy(), shift.numpy(), mirror.numpy(), size)
    )
    banded = _filter_weights(parameters, size, padded, torch.float32, _taps(scale.max().item()))

    steps = torch.arange(size, dtype=torch.float32)
    steps = torch.where(mirror[:, None], size - 1 - steps, steps) + 0.5
    inverse = 1.0 / scale.clamp(min=1.0)
    center = (shift[:, None] + steps * scale[:, None]) * inverse[:, None]
    x = torch.arange(padded, dtype=torch.float32) + 0.5
    dense = (1 - (x * inverse[:, None, None] - center[:, :, None]).abs()).clamp(min=0)
    dense = dense.masked_fill(x >= lengths[:, None, None], 0.0)
    dense /= dense.sum(-1, keepdim=True)
    assert scale.max() > 11 and scale.min() < 1
    # float32 rounding of the two orders of evaluation: 4.3e-6 at most here; the GPU casts the weights to fp16 (~5e-4).
    torch.testing.assert_close(banded, dense, rtol=0, atol=1e-5)
    assert torch.allclose(banded.sum(-1), torch.ones(64, size))


def test_batched_resize_in_fp16_as_on_the_gpu(mixed_batch):
    reference = decode_crop_resize_reference(mixed_batch, torch.device("cpu"), SIZE)
    out = decode_crop_resize(mixed_batch, torch.device("cpu"), SIZE, dtype=torch.float16)
    # fp16 crops are exact (integers up to 255), weights carry 11 bits and the first pass is stored in fp16.
    # Measured: mean 0.025, max 0.22 of 255 (rounding to uint8, as the PIL path does, alone costs 0.25 on average).
    difference = (out - reference).abs()
    assert difference.mean() < 0.04 and difference.max() < 0.4


def test_upscaling_is_plain_bilinear_and_the_crop_is_where_the_box_says():
    pixels = textured_pixels(64, 40, seed=3)
    box = (5, 7, 20, 30)  # top, left, height, width: smaller than the output on both sides
    out = decode_crop_resize([make_sample(pixels, box, False, encoded=False)], torch.device("cpu"), SIZE)
    crop = pixels[None, :, 5:25, 7:37].float()
    expected = torch.nn.functional.interpolate(crop, size=(SIZE, SIZE), mode="bilinear", align_corners=False)
    torch.testing.assert_close(out, expected, atol=1e-3, rtol=0)


def test_both_gathers_give_the_same_pixels(mixed_batch):
    strided = decode_crop_resize(mixed_batch, torch.device("cpu"), SIZE, gather="strided")
    copied = decode_crop_resize(mixed_batch, torch.device("cpu"), SIZE, gather="copy")
    torch.testing.assert_close(strided, copied, atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="gather"):
        decode_crop_resize(mixed_batch, torch.device("cpu"), SIZE, gather="nested")


def test_flip_applies_to_exactly_the_flagged_samples():
    # A left-to-right ramp: any mirror image of it is far from it.
    ramp = torch.linspace(0, 255, 160).round().to(torch.uint8).expand(3, 90, 160).contiguous()
    ramp[1] = 255 - ramp[1]
    flags = [True, False, False, True, True, False]
    boxes = [(5, 10, 80, 140), (0, 0, 90, 160), (10, 30, 20, 25), (10, 30, 20, 25), (0, 0, 90, 160), (1, 2, 3, 4)]
    flipped = [make_sample(ramp, box, flip, encoded=False) for box, flip in zip(boxes, flags, strict=True)]
    plain = [make_sample(ramp, box, False, encoded=False) for box in boxes]
    out = decode_crop_resize(flipped, torch.device("cpu"), 32)
    unflipped = decode_crop_resize(plain, torch.device("cpu"), 32)
    for i, flag in enumerate(flags):
        expected = unflipped[i].flip(-1) if flag else unflipped[i]
        torch.testing.assert_close(out[i], expected, atol=1e-3, rtol=0)
        assert (unflipped[i].flip(-1) - unflipped[i]).abs().mean() > 2  # the crops are not mirror-symmetric


def test_groups_of_similar_crops_and_the_per_image_path_for_outliers(mixed_batch):
    reference = decode_crop_resize(mixed_batch, torch.device("cpu"), SIZE)
    # A budget that splits the batch into several groups, and sends every crop above 60x60 pixels alone to the
    # per-image path (the outliers): same pixels, same order.
    budget = 60 * 60
    boxes = [sample.box for sample in mixed_batch]
    outliers = [i for i, box in enumerate(boxes) if box[2] * box[3] > budget]
    assert 0 < len(outliers) < len(boxes) - 2
    for max_padded_pixels in (budget, 10**6, 10**9):
        for gather in ("strided", "copy"):
            out = decode_crop_resize(
                mixed_batch, torch.device("cpu"), SIZE, max_padded_pixels=max_padded_pixels, gather=gather
            )
            torch.testing.assert_close(out, reference, atol=0.01, rtol=0)
    # Into rows of a larger tensor (decode_batch's batch, finished crops first): those rows, each crop in its place.
    batch = torch.full((len(mixed_batch) + 2, 3, SIZE, SIZE), -1.0)
    out = decode_crop_resize(mixed_batch, torch.device("cpu"), SIZE, max_padded_pixels=budget, out=batch[2:])
    assert out.data_ptr() == batch[2].data_ptr()
    torch.testing.assert_close(batch[2:], reference, atol=0.01, rtol=0)
    assert (batch[:2] == -1).all()
    with pytest.raises(ValueError, match=r"out must be float32 \(28, 3, 48, 48\) on cpu, got torch.float32 \(29,"):
        decode_crop_resize(mixed_batch, torch.device("cpu"), SIZE, out=batch[1:])
    inside = [box for box in boxes if box[2] * box[3] <= budget]
    groups = _groups(inside, budget)
    assert len(groups) > 1
    assert sorted(k for members, _, _ in groups for k in members) == list(range(len(inside)))
    for members, padded_h, padded_w in groups:
        assert padded_h % 8 == 0 and padded_w % 8 == 0
        assert all(inside[k][2] <= padded_h and inside[k][3] <= padded_w for k in members)
        assert len(members) == 1 or len(members) * padded_h * padded_w <= budget
    # The whole batch fits: one group, in the batch's order, padded to the tallest (300) and widest (390) crop.
    assert _groups(boxes, 10**9) == [(list(range(len(boxes))), 304, 392)]


def one_buffer(images: list[torch.Tensor], spare: int = 0) -> list[torch.Tensor]:
    """The images as views of one flat buffer, in reverse order there, with ``spare`` bytes after the last (as
    nvjpeg_batched lays out a call's)."""
    buffer = torch.cat([image.reshape(-1) for image in reversed(images)] + [torch.zeros(spare, dtype=torch.uint8)])
    ends = np.cumsum([0] + [image.numel() for image in reversed(images)])
    views = [buffer[a:b].view(image.shape) for a, b, image in zip(ends[:-1], ends[1:], reversed(images), strict=True)]
    return views[::-1]


def test_images_decoded_into_one_buffer_are_read_there_without_a_concatenation(mixed_batch, monkeypatch):
    """As nvjpeg_batched decodes them: views of one flat buffer with spare bytes at its end. Here in reverse order, so
    that no group's images are consecutive, with grouping and outliers as above."""
    images, _ = gpu_decode._decode(mixed_batch, torch.device("cpu"))
    widest = max(image.shape[2] for image in images)

    def crop_resize(images: list[torch.Tensor], max_padded_pixels: int) -> torch.Tensor:
        out = torch.empty((len(mixed_batch), 3, SIZE, SIZE))
        return gpu_decode._crop_resize(mixed_batch, images, out, max_padded_pixels, "strided", torch.float32)

    concatenations = []
    flatten = gpu_decode._flatten_dense_tensors
    monkeypatch.setattr(
        gpu_decode, "_flatten_dense_tensors", lambda tensors: concatenations.append(1) or flatten(tensors)
    )
    for budget in (60 * 60, 10**9):  # groups and outliers; the whole batch as one group
        reference = crop_resize(images, budget)
        concatenations.clear()
        assert torch.equal(crop_resize(one_buffer(images, spare=-(-widest // 8) * 8), budget), reference)
        assert not concatenations
        # Without room for the last image's padded reads, its group (with 10**9, the whole batch; with 60 x 60, that
        # image is an outlier and no group needs the room) is concatenated and padded as before.
        assert torch.equal(crop_resize(one_buffer(images), budget), reference)
        assert bool(concatenations) == (budget == 10**9)
    assert gpu_decode._shared_buffer([images[0], images[1]], 8) is None  # separately allocated
    two = [one_buffer(images, spare=512)[0], one_buffer(images, spare=512)[1]]
    assert gpu_decode._shared_buffer(two, 8) is None  # views of two buffers
    transposed = one_buffer(images, spare=512)
    assert gpu_decode._shared_buffer([transposed[0].transpose(1, 2)], 8) is None  # not contiguous


def test_the_batched_stage_makes_a_few_dozen_torch_calls_a_group(mixed_batch):
    """Each torch call of the stage is a launch (or a view) on the producer thread and a hand-over of the GIL to and
    from the training thread, whose launches wait meanwhile: the per-crop values come from the host table, so that a
    group costs about 47 calls (94 for a batch of 128 in two groups; 188 before, thirty-seventh session)."""
    from torch.profiler import ProfilerActivity, profile

    images, _ = gpu_decode._decode(mixed_batch, torch.device("cpu"))
    out = torch.empty((len(mixed_batch), 3, SIZE, SIZE))

    def calls(budget: int) -> list[str]:
        gpu_decode._crop_resize(mixed_batch, images, out, budget, "strided", torch.float32)  # the cached aranges made
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            gpu_decode._crop_resize(mixed_batch, images, out, budget, "strided", torch.float32)
        return [event.name for event in prof.events() if event.cpu_parent is None]

    one_group = calls(10**9)
    assert len(one_group) <= 52, one_group
    assert "aten::arange" not in one_group and "aten::unsqueeze" not in one_group
    budget = 60 * 60  # groups, and the per-image path for the larger crops (crop, cast, flip, interpolate, copy)
    groups = _groups([sample.box for sample in mixed_batch if sample.box[2] * sample.box[3] <= budget], budget)
    outliers = sum(sample.box[2] * sample.box[3] > budget for sample in mixed_batch)
    assert len(groups) > 2 and len(calls(budget)) <= 52 * len(groups) + 12 * outliers


def test_the_cached_aranges_are_aranges_and_their_number_is_bounded(monkeypatch):
    monkeypatch.setattr(gpu_decode, "_ARANGES", {})
    monkeypatch.setattr(gpu_decode, "_ARANGES_KEPT", 5)
    cpu = torch.device("cpu")
    first = gpu_decode._arange(8, cpu, torch.int64)
    assert gpu_decode._arange(8, cpu, torch.int64) is first  # made once
    for n in range(1, 20):
        for dtype in (torch.int64, torch.float32):
            assert torch.equal(gpu_decode._arange(n, cpu, dtype), torch.arange(n, dtype=dtype))
            assert len(gpu_decode._ARANGES) <= 5


def test_a_batch_of_outliers_only_takes_the_per_image_path(mixed_batch):
    reference = decode_crop_resize_reference(mixed_batch, torch.device("cpu"), SIZE)
    out = decode_crop_resize(mixed_batch, torch.device("cpu"), SIZE, max_padded_pixels=0)  # no group, no table
    torch.testing.assert_close(out, reference, atol=1e-4, rtol=0)


def test_empty_batch_and_a_box_outside_its_image():
    assert decode_crop_resize([], torch.device("cpu"), 16).shape == (0, 3, 16, 16)
    sample = make_sample(textured_pixels(40, 30, seed=1), (10, 0, 25, 40), flip=False, encoded=False)
    with pytest.raises(ValueError, match="does not fit"):
        decode_crop_resize([sample], torch.device("cpu"), 16)


@pytest.mark.gpu
def test_batched_on_the_gpu_matches_the_reference_also_back_to_back_on_a_side_stream(mixed_batch):
    device = torch.device("cuda")
    reference = decode_crop_resize_reference(mixed_batch, device, SIZE)  # the same nvJPEG pixels: the resize differs
    out = decode_crop_resize(mixed_batch, device, SIZE)
    assert out.device.type == "cuda" and out.shape == reference.shape and out.dtype == torch.float32
    difference = (out - reference).abs()
    assert difference.mean() < 0.05 and difference.max() < 1.0  # fp16 (CPU fp16 measured: mean 0.025, max 0.22)
    # As the prefetcher runs it: batch after batch on a side stream, never waiting for the host. Memory reused too
    # early (nvJPEG writing what queued kernels still read) would show as differences of tens of levels.
    stream = torch.cuda.Stream(device)
    with torch.cuda.stream(stream):
        outputs = [decode_crop_resize(mixed_batch[k % 3 :], device, SIZE) for k in range(12)]
    stream.synchronize()
    for k, output in enumerate(outputs):
        difference = (output - out[k % 3 :]).abs()
        assert difference.mean() < 0.01 and difference.max() < 0.5, k


def test_host_pixels_are_staged_only_for_a_cuda_device():
    from gpu_decode import _staged

    host = torch.arange(96, dtype=torch.uint8).view(2, 3, 4, 4)
    assert _staged(host, torch.device("cpu")) is host  # the CPU path copies nothing


def test_a_packed_batch_is_staged_whole_once_and_decoded_from_the_staged_copy(files, monkeypatch):
    """On CUDA the whole buffer goes to page-locked memory in one copy, so that nvJPEG's per-image copies of the JPEG
    bytes read page-locked memory too; here the staging copies on the CPU and the decode sees what it was given."""
    import gpu_decode

    staged, seen = [], []

    def stage(host: torch.Tensor, device: torch.device) -> torch.Tensor:
        if any(host.untyped_storage().data_ptr() == copy.untyped_storage().data_ptr() for copy in staged):
            return host  # already staged, as a page-locked tensor is used as it is
        staged.append(host.clone())
        return staged[-1]

    def decode(samples, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        seen.extend(samples)
        return real(samples, *args, **kwargs)

    real = gpu_decode.decode_crop_resize
    monkeypatch.setattr(gpu_decode, "_staged", stage)
    monkeypatch.setattr(gpu_decode, "decode_crop_resize", decode)
    val_crop = transforms.Compose([transforms.Resize(73), transforms.CenterCrop(64)])
    on_gpu = EncodedSampleLoader(False, 64, 0.08, 73, load_rgb, read_headers=True)
    on_cpu = EncodedSampleLoader(False, 64, 0.08, 73, load_rgb, cpu_share=1.0, cpu_transform=val_crop)
    batch = [(on_gpu(str(files["jpeg"])), 0), (on_cpu(str(files["gray"])), 1), (on_gpu(str(files["png"])), 2)]
    images, _ = encoded_collate(batch)
    whole = images.data.clone()
    out = decode_batch(images, torch.device("cpu"), 64)
    # One copy of the whole buffer, then the crop table of the GPU stage's samples (page-locked as well).
    assert len(staged) == 2 and torch.equal(staged[0], whole) and staged[1].numel() < whole.numel()
    # The JPEG's bytes and the decoded pixels the GPU stage reads are views of that copy, not of the worker's buffer.
    assert len(seen) == 2 and all(
        sample.data.untyped_storage().data_ptr() == staged[0].untyped_storage().data_ptr() for sample in seen
    )
    assert out.shape == (3, 3, 64, 64)
    assert images.data.numel() == 0  # the worker's buffer is still released


def test_the_jpeg_bytes_stay_alive_until_nvjpegs_work_has_run(files, monkeypatch):
    """nvJPEG may copy the bytes after its call returns (on the H200 it had finished them within the call), on its own
    streams, unseen by PyTorch's page-locked allocator: they are parked with the decoded images, released only once
    the consumer stream has passed the batch's last read."""
    import gpu_decode

    parked = []

    class Lane:
        def decode(self, data, device, nvjpeg, capacity, known):  # noqa: ANN001, ANN201
            return [torch.zeros(3, 8, 8, dtype=torch.uint8) for _ in data]

        def park(self, images):  # noqa: ANN001, ANN201
            parked.append(images)

    monkeypatch.setattr(gpu_decode._DecodeStream, "of", classmethod(lambda cls, device, lane=0: Lane()))
    on_gpu = EncodedSampleLoader(True, 64, 0.08, 73, load_rgb, read_headers=True)
    samples = [on_gpu(str(files["jpeg"])) for _ in range(3)]
    images, release = gpu_decode._decode(samples, torch.device("cuda", 0), "preallocated", 8)
    assert parked == []  # nothing parked before the caller has queued its reads
    release()
    (kept,) = parked
    assert all(any(image is held for held in kept) for image in images)
    assert all(any(sample.data is held for held in kept) for sample in samples)


@pytest.mark.gpu
def test_host_pixels_are_staged_in_page_locked_memory_for_the_gpu():
    from gpu_decode import _staged

    host = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8)
    staged = _staged(host, torch.device("cuda"))
    # A copy in page-locked memory (so the copy to the device is asynchronous), the same pixels, not a view.
    assert staged.is_pinned() and not host.is_pinned()
    assert torch.equal(staged, host) and staged.data_ptr() != host.data_ptr()
    assert _staged(staged, torch.device("cuda")) is staged  # already page-locked: used as it is


def test_decode_crop_resize_refuses_an_unknown_nvjpeg_binding(mixed_batch):
    with pytest.raises(ValueError, match="nvjpeg must be one of torchvision, preallocated, got 'nvimgcodec'"):
        decode_crop_resize(mixed_batch, "cpu", SIZE, nvjpeg="nvimgcodec")
    # On the CPU the binding does not matter: torchvision decodes (nvJPEG is a GPU library).
    same = decode_crop_resize(mixed_batch, "cpu", SIZE, nvjpeg="preallocated")
    assert torch.equal(same, decode_crop_resize(mixed_batch, "cpu", SIZE))
