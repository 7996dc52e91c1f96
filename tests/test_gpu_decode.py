"""The GPU decode path's logic on CPU: header sniffing, crop boxes, fallbacks, and the crop/resize/flip stage."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision.transforms.v2.functional as F2
from PIL import Image
from torchvision.io import decode_jpeg, read_file

from datamodule import ImageNetDataModule, load_rgb
from gpu_decode import EncodedSampleLoader, center_box, decode_crop_resize, encoded_collate


def smooth_image(width: int, height: int, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, size=(4, 4, 3), dtype=np.uint8)
    return Image.fromarray(coarse, "RGB").resize((width, height), Image.BICUBIC)


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    out = {}
    out["jpeg"] = tmp_path / "a.JPEG"
    smooth_image(300, 200).save(out["jpeg"], quality=95)
    out["gray"] = tmp_path / "g.JPEG"
    smooth_image(120, 160).convert("L").save(out["gray"], quality=95)
    out["cmyk"] = tmp_path / "c.JPEG"
    smooth_image(200, 150).convert("CMYK").save(out["cmyk"], quality=95)
    out["png"] = tmp_path / "p.JPEG"  # a PNG named .JPEG, as ImageNet has one
    smooth_image(180, 140).save(out["png"], format="PNG")
    out["rotated"] = tmp_path / "r.JPEG"
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees on display
    smooth_image(200, 100).save(out["rotated"], quality=95, exif=exif)
    return out


def test_jpegs_travel_encoded_and_the_rest_decoded_by_pil(files):
    loader = EncodedSampleLoader(True, 64, 0.08, 73, load_rgb)
    kinds = {name: loader(str(path)) for name, path in files.items()}
    assert kinds["jpeg"].encoded and kinds["gray"].encoded
    assert kinds["jpeg"].data.dtype == torch.uint8 and kinds["jpeg"].data.dim() == 1
    for name in ("cmyk", "png", "rotated"):
        sample = kinds[name]
        assert not sample.encoded, name
        assert sample.data.shape[0] == 3 and sample.data.dtype == torch.uint8
    # EXIF orientation applied by PIL: the 200x100 photo is 100 wide, 200 high.
    assert tuple(kinds["rotated"].data.shape[1:]) == (200, 100)


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


def test_center_box_is_resize_then_center_crop():
    assert center_box(375, 500, 256, 224) == (23, 86, 328, 328)
    assert center_box(224, 224, 224, 224) == (0, 0, 224, 224)


def test_decode_crop_resize_matches_torchvision_on_cpu(files):
    val = EncodedSampleLoader(False, 64, 0.08, 73, load_rgb)
    samples = [val(str(files["jpeg"])), val(str(files["png"]))]
    images, targets = encoded_collate([(samples[0], 3), (samples[1], 5)])
    assert targets.tolist() == [3, 5] and targets.dtype == torch.int64
    out = decode_crop_resize(images, torch.device("cpu"), 64)
    assert out.shape == (2, 3, 64, 64) and out.dtype == torch.float32
    reference = F2.center_crop(F2.resize(decode_jpeg(read_file(str(files["jpeg"]))).float(), 73, antialias=True), 64)
    assert (out[0] - reference).abs().mean() < 3.0  # same pixels up to the box's rounding


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
