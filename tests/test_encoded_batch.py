"""The GPU decode path's worker side: what travels encoded and what PIL decodes, the headers the workers vouch for,
the crop boxes and the validation geometry, the share of files the workers finish."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision.transforms.v2.functional as F2
from image_files import files_of_every_kind
from PIL import Image
from torchvision import transforms

import encoded_batch
import image_loading
from encoded_batch import EncodedSampleLoader, center_crop_geometry, decoded_on_cpu
from image_loading import load_rgb


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    return files_of_every_kind(tmp_path)


def test_jpegs_travel_encoded_and_the_rest_decoded_by_pil(files):
    loader = EncodedSampleLoader(True, 64, 0.08, 73, load_rgb, read_headers=True)
    kinds = {name: loader(str(path)) for name, path in files.items()}
    assert kinds["jpeg"].encoded and kinds["gray"].encoded
    assert kinds["jpeg"].data.dtype == torch.uint8 and kinds["jpeg"].data.dim() == 1
    # The worker read the headers for nvJPEG's hardware decoder: (height, width), so the producer need not.
    assert kinds["jpeg"].hardware_size == (200, 300) and kinds["gray"].hardware_size == (160, 120)
    assert all(kinds[name].hardware_size is None for name in ("cmyk", "png", "rotated"))
    unread = EncodedSampleLoader(True, 64, 0.08, 73, load_rgb)(str(files["jpeg"]))  # data.nvjpeg: torchvision
    assert unread.encoded and unread.hardware_size is None
    for name in ("cmyk", "png", "rotated"):
        sample = kinds[name]
        assert not sample.encoded, name
        assert sample.data.shape[0] == 3 and sample.data.dtype == torch.uint8
    # EXIF orientation applied by PIL: the 200x100 photo is 100 wide, 200 high.
    assert tuple(kinds["rotated"].data.shape[1:]) == (200, 100)


def test_a_header_size_pil_reads_otherwise_is_not_vouched_for(files, monkeypatch):
    monkeypatch.setattr(encoded_batch, "hardware_size", lambda raw: (201, 300))  # PIL reads 200 x 300
    sample = EncodedSampleLoader(True, 64, 0.08, 73, load_rgb, read_headers=True)(str(files["jpeg"]))
    assert sample.encoded and sample.hardware_size is None


def test_pils_limit_is_raised_before_the_worker_reads_a_header(files, monkeypatch):
    # 300 x 200 pixels: PIL alone would refuse the header at a limit of 1000 and the file would lose the GPU path.
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    assert EncodedSampleLoader(True, 64, 0.08, 73, load_rgb)(str(files["jpeg"])).encoded
    assert Image.MAX_IMAGE_PIXELS == image_loading.MAX_PIXELS


def test_jpegs_the_pil_loader_would_reduce_or_refuse_are_its_to_decode(files):
    # 300 x 200: with a reduced-size decode from a short side of 80 on, PIL decodes it at a quarter (75 x 50), as
    # decode: cpu does, instead of nvJPEG at full size; over the loader's pixel limit it is refused naming the file.
    drafted = EncodedSampleLoader(True, 64, 0.08, 73, image_loading.ImageLoader(draft_min_side=40))(str(files["jpeg"]))
    assert not drafted.encoded and tuple(drafted.data.shape) == (3, 50, 75)
    full = EncodedSampleLoader(True, 64, 0.08, 73, image_loading.ImageLoader(draft_min_side=101))(str(files["jpeg"]))
    assert full.encoded
    small_limit = image_loading.ImageLoader(max_pixels=300 * 200 - 1)
    with pytest.raises(image_loading.BadImageError, match=r"a\.JPEG"):
        EncodedSampleLoader(True, 64, 0.08, 73, small_limit)(str(files["jpeg"]))


def test_train_boxes_fit_the_image_and_follow_the_seed(files):
    loader = EncodedSampleLoader(True, 64, 0.25, 73, load_rgb)
    torch.manual_seed(0)
    first = [loader(str(files["jpeg"])) for _ in range(50)]
    torch.manual_seed(0)
    again = [loader(str(files["jpeg"])) for _ in range(50)]
    assert [(s.box, s.flip) for s in first] == [(s.box, s.flip) for s in again]
    for sample in first:
        top, left, height, width = sample.box
        assert 0 <= top and 0 <= left and top + height <= 200 and left + width <= 300
        assert height * width >= 0.25 * 300 * 200 * 0.99 or (height, width) == (200, 200)
    assert {s.flip for s in first} == {True, False}


@pytest.mark.parametrize(
    ("height", "width", "resize", "crop"),
    [(375, 500, 256, 224), (500, 375, 256, 224), (333, 500, 256, 224), (224, 224, 224, 224), (100, 640, 73, 64),
     (1000, 61, 56, 48), (57, 61, 73, 64), (64, 64, 64, 64), (3, 2, 4, 3)],
)  # fmt: skip
def test_center_crop_geometry_is_torchvisions_resize_and_center_crop(height, width, resize, crop):
    box, (resized_h, resized_w, into_y, into_x) = center_crop_geometry(height, width, resize, crop)
    # Resize's output size and CenterCrop's offset, read off torchvision itself (the values of ``index`` name their
    # position).
    assert F2.resize(torch.zeros(1, height, width), [resize], antialias=True).shape[1:] == (resized_h, resized_w)
    index = torch.arange(resized_h * resized_w, dtype=torch.float32).view(1, resized_h, resized_w)
    first = int(F2.center_crop(index, [crop, crop])[0, 0, 0])
    assert (into_y, into_x) == divmod(first, resized_w)
    # The box holds every source pixel with a weight in the crop, and little more: a pixel outside it changes nothing.
    top, left, box_h, box_w = box
    assert 0 <= top and 0 <= left and top + box_h <= height and left + box_w <= width
    image = torch.rand(1, 3, height, width) * 255
    changed = image.clone()
    outside = torch.ones(height, width, dtype=torch.bool)
    outside[top : top + box_h, left : left + box_w] = False
    changed[..., outside] = 1000.0

    def val(x: torch.Tensor) -> torch.Tensor:
        return F2.center_crop(F2.resize(x, [resize], antialias=True), [crop, crop])

    assert torch.equal(val(image), val(changed))
    # The crop's share of the image, plus the filter's support on each side (at least a pixel) and a margin.
    scale_h, scale_w = max(height / resized_h, 1.0), max(width / resized_w, 1.0)
    assert box_h <= crop * height / resized_h + 2 * scale_h + 3
    assert box_w <= crop * width / resized_w + 2 * scale_w + 3


def test_center_crop_geometry_refuses_a_crop_larger_than_the_resize():
    with pytest.raises(ValueError, match="crop <= resize"):
        center_crop_geometry(300, 200, 64, 73)


def test_the_cpu_share_is_a_fixed_set_of_files_of_the_asked_size():
    paths = [f"/data/train/n{c:08d}/n{c:08d}_{i}.JPEG" for c in range(40) for i in range(100)]
    for share in (0.25, 0.7):
        chosen = [decoded_on_cpu(path, share) for path in paths]
        assert abs(sum(chosen) / len(paths) - share) < 0.03, share
        assert chosen == [decoded_on_cpu(path, share) for path in paths]  # the same in every worker, epoch and run
    # The class folder and file name decide, not where the dataset is mounted.
    moved = [path.replace("/data/train/", "/mnt/nfs/imagenet/train/") for path in paths]
    assert [decoded_on_cpu(path, 0.7) for path in moved] == [decoded_on_cpu(path, 0.7) for path in paths]
    # A larger share keeps the files of a smaller one: raising it moves files from the GPU to the CPU, no reshuffle.
    assert all(decoded_on_cpu(path, 0.7) for path in paths if decoded_on_cpu(path, 0.25))
    assert not any(decoded_on_cpu(path, 0.0) for path in paths)
    assert all(decoded_on_cpu(path, 1.0) for path in paths)


def test_files_of_the_cpu_share_are_what_decode_cpu_makes_of_them(files):
    crop = transforms.Compose([transforms.RandomResizedCrop(64, scale=(0.08, 1.0)), transforms.RandomHorizontalFlip()])
    loader = EncodedSampleLoader(True, 64, 0.08, 73, load_rgb, cpu_share=1.0, cpu_transform=crop)
    for name, path in files.items():  # JPEGs and the files nvJPEG never gets alike
        for seed in range(4):
            torch.manual_seed(seed)
            sample = loader(str(path))
            torch.manual_seed(seed)
            expected = np.asarray(crop(load_rgb(str(path)))).transpose(2, 0, 1)
            assert sample.finished and not sample.encoded and not sample.flip, name
            assert sample.box == (0, 0, 64, 64)
            assert torch.equal(sample.data, torch.from_numpy(np.ascontiguousarray(expected))), (name, seed)


def test_a_cpu_transform_of_the_wrong_size_and_a_bad_share_are_refused(files):
    too_small = transforms.CenterCrop(32)
    loader = EncodedSampleLoader(False, 64, 0.08, 73, load_rgb, cpu_share=1.0, cpu_transform=too_small)
    with pytest.raises(ValueError, match=r"a\.JPEG: the CPU transform gave 32x32, the batch needs 64x64"):
        loader(str(files["jpeg"]))
    with pytest.raises(ValueError, match="cpu_share must be in"):
        EncodedSampleLoader(False, 64, 0.08, 73, load_rgb, cpu_share=1.5, cpu_transform=too_small)
    with pytest.raises(ValueError, match="needs the cpu_transform"):
        EncodedSampleLoader(False, 64, 0.08, 73, load_rgb, cpu_share=0.5)
