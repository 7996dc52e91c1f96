"""Robust image decoding (image_loading.py); the bad-image policy is tested in tests/test_bad_image_policy.py.

Every quirky image is made here with PIL (or byte by byte, for what PIL cannot write), never downloaded.
"""

from __future__ import annotations

import re
import struct
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest
from image_files import noise_jpeg
from PIL import Image, ImageFile
from torchvision import datasets, transforms

import image_loading
from image_loading import (
    BadImageError,
    ImageLoader,
    load_rgb,
    min_decode_side,
)


# --- helpers ------------------------------------------------------------------------------------------
def png_bytes(array: np.ndarray, color_type: int, bit_depth: int, size: tuple[int, int] | None = None) -> bytes:
    """A PNG written byte by byte (PIL cannot write 16-bit RGB); ``size`` overrides the header's width, height."""
    height, width = array.shape[:2]
    dtype = ">u2" if bit_depth == 16 else "u1"
    raw = b"".join(b"\x00" + array[y].astype(dtype).tobytes() for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    width, height = size or (width, height)
    header = struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def save(image: Image.Image, path: Path, fmt: str, **kwargs: object) -> Path:
    image.save(path, format=fmt, **kwargs)
    return path


def pixels(image: Image.Image) -> np.ndarray:
    assert image.mode == "RGB"
    return np.asarray(image).astype(np.int64)


# --- valid but quirky images --------------------------------------------------------------------------
def test_cmyk_jpeg_loads_as_rgb(tmp_path: Path) -> None:
    rgb = Image.new("RGB", (40, 30), (200, 30, 60))
    image = load_rgb(str(save(rgb.convert("CMYK"), tmp_path / "cmyk.JPEG", "JPEG", quality=95)))
    assert image.size == (40, 30)
    assert np.abs(pixels(image) - [200, 30, 60]).max() <= 6


def test_grayscale_jpeg_loads_as_three_equal_channels(tmp_path: Path) -> None:
    image = load_rgb(str(save(Image.new("L", (20, 10), 100), tmp_path / "gray.JPEG", "JPEG", quality=95)))
    values = pixels(image)
    assert values.shape == (10, 20, 3)
    assert np.abs(values - 100).max() <= 2
    assert (values[..., 0] == values[..., 2]).all()


def test_png_named_jpeg_loads_by_content(tmp_path: Path) -> None:
    array = np.arange(8 * 6 * 3, dtype=np.uint8).reshape(6, 8, 3)
    path = save(Image.fromarray(array), tmp_path / "n02105855_2933.JPEG", "PNG")
    np.testing.assert_array_equal(np.asarray(load_rgb(str(path))), array)


def test_rgba_png_is_composited_on_white_not_stripped(tmp_path: Path) -> None:
    rgba = np.zeros((1, 3, 4), dtype=np.uint8)
    rgba[0, 0] = (0, 0, 0, 0)  # fully transparent black: stripping alpha would give black
    rgba[0, 1] = (255, 0, 0, 255)  # opaque red
    rgba[0, 2] = (0, 0, 255, 128)  # half-transparent blue over white
    image = load_rgb(str(save(Image.fromarray(rgba, "RGBA"), tmp_path / "rgba.png", "PNG")))
    values = pixels(image)[0]
    assert values[0].tolist() == [255, 255, 255]
    assert values[1].tolist() == [255, 0, 0]
    assert np.abs(values[2] - [127, 127, 255]).max() <= 1


def test_gray_alpha_png_is_composited(tmp_path: Path) -> None:
    la = Image.fromarray(np.array([[[0, 0], [0, 255]]], dtype=np.uint8), "LA")
    values = pixels(load_rgb(str(save(la, tmp_path / "la.png", "PNG"))))[0]
    assert values.tolist() == [[255, 255, 255], [0, 0, 0]]


def test_palette_png_with_and_without_transparency(tmp_path: Path) -> None:
    palette = [10, 20, 30, 200, 100, 50] + [0] * (256 * 3 - 6)
    indices = np.array([[0, 1, 1]], dtype=np.uint8)
    opaque = Image.fromarray(indices, "P")
    opaque.putpalette(palette)
    values = pixels(load_rgb(str(save(opaque, tmp_path / "p.png", "PNG"))))[0]
    assert values.tolist() == [[10, 20, 30], [200, 100, 50], [200, 100, 50]]
    transparent = opaque.copy()
    transparent.info["transparency"] = 0  # index 0 is transparent
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # PIL warns if palette transparency is converted straight to RGB
        values = pixels(load_rgb(str(save(transparent, tmp_path / "pt.png", "PNG", transparency=0))))[0]
    assert values.tolist() == [[255, 255, 255], [200, 100, 50], [200, 100, 50]]


@pytest.mark.parametrize("kind", ["rgb", "gray", "gray16"])
def test_one_transparent_colour_is_composited_on_white(tmp_path: Path, kind: str) -> None:
    # tRNS with a single colour (no alpha channel): pixels of that colour are transparent in RGB, 8-bit and 16-bit
    # gray PNGs alike; the others keep their values.
    path = tmp_path / f"{kind}.png"
    if kind == "rgb":
        array = np.array([[[0, 0, 0], [200, 10, 10]]], dtype=np.uint8)
        Image.fromarray(array, "RGB").save(path, transparency=(0, 0, 0))
        kept = [200, 10, 10]
    elif kind == "gray":
        Image.fromarray(np.array([[0, 200]], dtype=np.uint8), "L").save(path, transparency=0)
        kept = [200] * 3
    else:
        Image.fromarray(np.array([[0, 50000]], dtype=np.uint16)).save(path, transparency=0)
        assert Image.open(path).mode.startswith("I;16")
        kept = [195] * 3  # 50000 of 65535, on the 8-bit scale
    assert "transparency" in Image.open(path).info
    assert pixels(load_rgb(str(path)))[0].tolist() == [[255, 255, 255], kept]


def test_16bit_grayscale_png_is_scaled_not_clipped(tmp_path: Path) -> None:
    values16 = np.array([[0, 257, 32768, 65535, 1000]], dtype=np.uint16)
    path = tmp_path / "gray16.png"
    path.write_bytes(png_bytes(values16, color_type=0, bit_depth=16))
    assert Image.open(path).mode.startswith("I;16")  # what the conversion has to handle
    values = pixels(load_rgb(str(path)))[0, :, 0]
    assert values.tolist() == [0, 1, 128, 255, 4]  # PIL's convert("RGB") would give 0, 255, 255, 255, 255


def test_mode_i_tiff_is_scaled_as_16_bit(tmp_path: Path) -> None:
    image = Image.fromarray(np.array([[0, 65535, 32768, 70000]], dtype=np.int32))
    assert image.mode == "I"
    values = pixels(load_rgb(str(save(image, tmp_path / "i32.tif", "TIFF"))))[0, :, 0]
    assert values.tolist() == [0, 255, 128, 255]


def test_16bit_rgb_png_keeps_its_colours(tmp_path: Path) -> None:
    rgb16 = np.array([[[0, 32768, 65535], [65535, 0, 0]]], dtype=np.uint16)
    path = tmp_path / "rgb16.png"
    path.write_bytes(png_bytes(rgb16, color_type=2, bit_depth=16))
    assert pixels(load_rgb(str(path)))[0].tolist() == [[0, 128, 255], [255, 0, 0]]


def test_bilevel_png(tmp_path: Path) -> None:
    image = Image.fromarray(np.array([[0, 255]], dtype=np.uint8)).convert("1")
    assert pixels(load_rgb(str(save(image, tmp_path / "b.png", "PNG"))))[0].tolist() == [[0, 0, 0], [255, 255, 255]]


def test_exif_orientation_is_applied(tmp_path: Path) -> None:
    array = np.zeros((30, 40, 3), dtype=np.uint8)
    array[:10, :10] = (255, 0, 0)  # red block in the stored top-left corner
    image = Image.fromarray(array)
    exif = image.getexif()
    exif[0x0112] = 6  # "rotate 90 degrees clockwise to display"
    loaded = load_rgb(str(save(image, tmp_path / "rotated.JPEG", "JPEG", quality=95, exif=exif.tobytes())))
    assert loaded.size == (30, 40)  # portrait, as displayed
    values = pixels(loaded)
    assert values[:10, -10:, 0].mean() > 200  # clockwise rotation moves the top-left corner to the top-right
    assert values[:10, :10, 0].mean() < 50


def test_image_smaller_than_the_crop_loads_and_is_upsampled(tmp_path: Path) -> None:
    image = load_rgb(str(save(Image.new("RGB", (5, 3), (1, 2, 3)), tmp_path / "tiny.png", "PNG")))
    assert image.size == (5, 3)
    crop = transforms.RandomResizedCrop(32, scale=(0.35, 1.0))(image)
    assert crop.size == (32, 32)


def test_8k_jpeg_loads_and_draft_decodes_it_smaller(tmp_path: Path) -> None:
    side = 8192
    row = (np.arange(side) % 256).astype(np.uint8)
    path = save(Image.fromarray(np.ascontiguousarray(np.broadcast_to(row, (side, side)))), tmp_path / "8k.JPEG", "JPEG")
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        full = load_rgb(str(path))
    assert full.size == (side, side)
    del full
    drafted = load_rgb(str(path), draft_min_side=915)
    assert drafted.size == (1024, 1024)  # the largest power-of-two reduction that keeps >= 915


def test_draft_only_for_images_at_least_twice_the_needed_side(tmp_path: Path) -> None:
    wide = save(Image.new("RGB", (2000, 1000), (9, 9, 9)), tmp_path / "wide.JPEG", "JPEG")
    assert load_rgb(str(wide), draft_min_side=400).size == (1000, 500)  # short side stays >= 400
    small = save(Image.new("RGB", (700, 700), (9, 9, 9)), tmp_path / "small.JPEG", "JPEG")
    assert load_rgb(str(small), draft_min_side=400).size == (700, 700)
    png = save(Image.new("RGB", (2000, 1000), (9, 9, 9)), tmp_path / "wide.png", "PNG")
    assert load_rgb(str(png), draft_min_side=400).size == (2000, 1000)  # only JPEG decoders can draft


def test_min_decode_side() -> None:
    assert min_decode_side(224, 0.08, 256) == 915
    assert min_decode_side(64, 0.35, 73) == 125
    assert min_decode_side(32, 1.0, 512) == 512
    with pytest.raises(ValueError, match="min_crop_scale"):
        min_decode_side(224, 0.0, 256)


def test_pil_limit_is_raised_to_the_loaders_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = noise_jpeg(tmp_path / "a.JPEG", size=64)  # 4096 pixels
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    with pytest.raises(Image.DecompressionBombError):
        Image.open(path)  # PIL alone refuses it (more than twice its limit)
    assert load_rgb(str(path)).size == (64, 64)
    assert Image.MAX_IMAGE_PIXELS == image_loading.MAX_PIXELS
    with pytest.raises(BadImageError, match=r"64x64 pixels is more than the 4000 pixels"):
        load_rgb(str(path), max_pixels=4000)


def test_image_over_the_bound_is_refused_before_decoding(tmp_path: Path) -> None:
    path = tmp_path / "huge.png"
    path.write_bytes(png_bytes(np.zeros((1, 1), np.uint8), color_type=0, bit_depth=8, size=(20000, 20000)))
    # Between the bound and twice it PIL warns first (a possible decompression bomb); the loader then refuses.
    with pytest.warns(Image.DecompressionBombWarning), pytest.raises(BadImageError, match=r"huge\.png: 20000x20000"):
        load_rgb(str(path))


# --- undecodable files --------------------------------------------------------------------------------
def _truncated_tail(path: Path) -> None:
    data = noise_jpeg(path).read_bytes()
    path.write_bytes(data[:-2])  # only the end-of-image marker missing


def _truncated_half(path: Path) -> None:
    data = noise_jpeg(path).read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _empty(path: Path) -> None:
    path.write_bytes(b"")


def _text(path: Path) -> None:
    path.write_text("this is not an image\n")


def _folder(path: Path) -> None:
    path.mkdir()


def _corrupt_png(path: Path) -> None:
    data = bytearray(png_bytes(np.arange(64 * 64, dtype=np.uint8).reshape(64, 64) % 251, 0, 8))
    data[60] ^= 0xFF  # inside the IDAT data: the chunk's CRC no longer matches
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (_truncated_tail, "truncated"),
        (_truncated_half, "truncated"),
        (_empty, "the file is empty"),
        (_text, "not an image file"),
        (_folder, "IsADirectoryError"),
        (_corrupt_png, "crc|broken|error"),
    ],
    ids=["truncated-tail", "truncated-half", "empty", "text", "folder", "corrupt-png"],
)
def test_undecodable_file_raises_bad_image_error_naming_it(tmp_path: Path, make, reason: str) -> None:
    path = tmp_path / "n01440764" / "broken_0001.JPEG"
    path.parent.mkdir()
    make(path)
    with pytest.raises(BadImageError) as caught:
        load_rgb(str(path))
    message = str(caught.value)
    assert str(path) in message
    assert caught.value.path == str(path)
    assert re.search(reason, message, flags=re.IGNORECASE), message


def test_unreadable_file_raises_bad_image_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests run as root, which reads any file: the permission error is simulated where the loader opens files.
    path = noise_jpeg(tmp_path / "locked.JPEG")

    def refuse(file: str, mode: str = "r", *args: object, **kwargs: object) -> object:
        raise PermissionError(13, "Permission denied", str(file))

    monkeypatch.setattr(image_loading, "open", refuse, raising=False)
    with pytest.raises(BadImageError, match=r"locked\.JPEG: PermissionError: Permission denied"):
        load_rgb(str(path))


def test_truncated_images_setting_on_is_a_configuration_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "t.JPEG"
    _truncated_half(path)
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    with pytest.raises(RuntimeError, match="LOAD_TRUNCATED_IMAGES is on"):
        load_rgb(str(path))


def test_bad_image_error_survives_pickling() -> None:
    import pickle

    error = pickle.loads(pickle.dumps(BadImageError.for_file("/d/x.JPEG", "the file is empty")))
    assert (error.path, error.reason) == ("/d/x.JPEG", "the file is empty")
    assert "/d/x.JPEG: the file is empty" in str(error)


# --- class folders ------------------------------------------------------------------------------------
def test_image_folder_ignores_non_image_files(tmp_path: Path) -> None:
    for name in ("cat", "dog"):
        folder = tmp_path / name
        folder.mkdir()
        noise_jpeg(folder / f"{name}_1.JPEG")
        save(Image.new("RGB", (8, 8)), folder / f"{name}_2.PNG", "PNG")  # extensions match case-insensitively
        (folder / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1")
        (folder / "Thumbs.db").write_bytes(b"\xd0\xcf\x11\xe0")
        (folder / "notes.txt").write_text("labelled by hand\n")
    dataset = datasets.ImageFolder(str(tmp_path), loader=ImageLoader())
    names = sorted(Path(path).name for path, _ in dataset.samples)
    assert names == ["cat_1.JPEG", "cat_2.PNG", "dog_1.JPEG", "dog_2.PNG"]
    image, target = dataset[0]
    assert image.mode == "RGB" and target == 0


def test_image_loader_validates_and_pickles() -> None:
    import pickle

    with pytest.raises(ValueError, match="draft_min_side must be >= 1 or None"):
        ImageLoader(draft_min_side=0)
    loader = pickle.loads(pickle.dumps(ImageLoader(max_pixels=123, draft_min_side=7)))
    assert (loader.max_pixels, loader.draft_min_side) == (123, 7)
