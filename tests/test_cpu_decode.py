"""``data.cpu_decoder: torchvision`` (cpu_decode.py) against the PIL path it stands in for: the same pixels within one
level (two on a few pixels of an upsampled crop), the same boxes and flips for a sample's seed, the same rules for
every file that is not a plain JPEG."""

from __future__ import annotations

import pickle
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageFile
from torch.utils.data import DataLoader
from torchvision import transforms

import cpu_decode
import image_loading
from bad_image_policy import SeededIndex
from cpu_decode import TensorImageLoader, TrainTransform, ValTransform
from datamodule import ImageNetDataModule, fast_collate, sample_seed
from encoded_batch import EncodedSampleLoader
from image_loading import BadImageError, load_rgb


def photo(height: int, width: int, seed: int) -> np.ndarray:
    """A photo-like HWC uint8 image: smooth colour gradients (what resizes average) plus fine noise, asymmetric so
    that a flip or another box shows."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    base = np.stack([255 * x / width, 255 * y / height, 128 + 100 * np.sin((x + 2 * y) / 17.0)], axis=-1)
    return np.clip(base + rng.normal(0, 12, (height, width, 3)), 0, 255).astype(np.uint8)


def save(array: np.ndarray | Image.Image, path: Path, fmt: str = "JPEG", **kwargs: object) -> Path:
    image = array if isinstance(array, Image.Image) else Image.fromarray(array)
    image.save(path, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}) | kwargs)
    return path


def as_chw(image: Image.Image) -> torch.Tensor:
    return torch.from_numpy(np.array(image, dtype=np.uint8)).permute(2, 0, 1)


def assert_within_one_level(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape and got.dtype == torch.uint8
    diff = (got.int() - want.int()).abs()
    assert diff.max().item() <= 1, f"max difference {diff.max().item()}"
    # Rounding: at most a quarter of the pixels (at downscales just above 1), a few thousandths at most scales.
    assert diff.float().mean().item() < 0.3


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Plain JPEGs: landscape, portrait, odd sizes, one smaller than the crops (upsampled) and one gray."""
    folder = tmp_path_factory.mktemp("photos")
    paths = [save(photo(h, w, i), folder / f"p{i}.JPEG") for i, (h, w) in enumerate([(90, 120), (131, 97), (40, 52)])]
    paths.append(save(Image.fromarray(photo(70, 64, 9)[..., 1]), folder / "gray.JPEG"))
    return paths


# --- the loader -------------------------------------------------------------------------------------------------
@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts torchvision's decodes (one entry of the stream's length per call)."""
    calls: list[int] = []
    real = cpu_decode.decode_jpeg

    def counted(data: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        calls.append(data.numel())
        return real(data, *args, **kwargs)

    monkeypatch.setattr(cpu_decode, "decode_jpeg", counted)
    return calls


def test_plain_jpegs_are_decoded_by_torchvision_to_pils_pixels(
    photos: list[Path], decodes: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    want = {path: as_chw(load_rgb(str(path))) for path in photos}

    def no_pil(*args: object, **kwargs: object) -> None:
        raise AssertionError("a plain JPEG reached the PIL loader")

    monkeypatch.setattr(cpu_decode, "load_rgb", no_pil)
    load = TensorImageLoader()
    for path in photos:
        image = load(str(path))
        assert isinstance(image, torch.Tensor) and torch.equal(image, want[path]), path.name
    assert len(decodes) == len(photos)


def test_other_files_reach_load_rgb_and_stay_pil_images(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rgb = photo(30, 40, 1)
    rotated = Image.fromarray(rgb)
    exif = rotated.getexif()
    exif[0x0112] = 6
    rgba = np.dstack([rgb, np.tile(np.arange(40, dtype=np.uint8) * 6, (30, 1))])
    trailing = save(rgb, tmp_path / "trailing.JPEG")
    trailing.write_bytes(trailing.read_bytes() + b"\0\0junk")
    files = {
        "cmyk": save(Image.fromarray(rgb).convert("CMYK"), tmp_path / "cmyk.JPEG"),
        "exif-rotated": save(rotated, tmp_path / "rotated.JPEG", exif=exif.tobytes()),
        "png named JPEG": save(rgb, tmp_path / "png.JPEG", "PNG"),
        "rgba png": save(Image.fromarray(rgba, "RGBA"), tmp_path / "rgba.png", "PNG"),
        "trailing bytes": trailing,
        "huge (drafted)": save(photo(1000, 2000, 2), tmp_path / "wide.JPEG"),
    }

    def not_torchvision(*args: object, **kwargs: object) -> None:
        raise AssertionError("this file must not reach torchvision's decoder")

    monkeypatch.setattr(cpu_decode, "decode_jpeg", not_torchvision)
    load = TensorImageLoader(draft_min_side=400)
    for name, path in files.items():
        image, want = load(str(path)), load_rgb(str(path), draft_min_side=400)
        assert isinstance(image, Image.Image) and np.array_equal(np.asarray(image), np.asarray(want)), name
    assert load(str(files["exif-rotated"])).size == (30, 40)  # upright, as load_rgb turns it
    assert load(str(files["huge (drafted)"])).size == (1000, 500)


def test_a_jpeg_under_twice_the_draft_side_is_decoded_whole_by_torchvision(tmp_path: Path, decodes: list[int]) -> None:
    wide = save(photo(1000, 2000, 2), tmp_path / "wide.JPEG")
    assert TensorImageLoader(draft_min_side=600)(str(wide)).shape == (3, 1000, 2000)
    assert len(decodes) == 1
    # At exactly twice the side PIL drafts it to half: that file is PIL's.
    drafted = TensorImageLoader(draft_min_side=500)(str(wide))
    assert isinstance(drafted, Image.Image) and drafted.size == (1000, 500) and len(decodes) == 1


def test_the_truncated_images_setting_is_refused_at_a_plain_jpeg_too(
    photos: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    with pytest.raises(RuntimeError, match="LOAD_TRUNCATED_IMAGES is on"):
        TensorImageLoader()(str(photos[0]))


def test_a_stream_torchvision_rejects_is_judged_by_pil(photos: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    def reject(*args: object, **kwargs: object) -> torch.Tensor:
        raise RuntimeError("Unsupported marker type")

    monkeypatch.setattr(cpu_decode, "decode_jpeg", reject)
    image = TensorImageLoader()(str(photos[0]))
    assert isinstance(image, Image.Image) and np.array_equal(np.asarray(image), np.asarray(load_rgb(str(photos[0]))))


def test_pils_limit_is_raised_before_the_header_is_read(
    tmp_path: Path, decodes: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = save(photo(64, 64, 4), tmp_path / "a.JPEG")  # 4096 pixels: PIL alone would refuse it at a limit of 1000
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    assert isinstance(TensorImageLoader()(str(path)), torch.Tensor) and len(decodes) == 1
    assert Image.MAX_IMAGE_PIXELS == image_loading.MAX_PIXELS


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("half", "truncated"),
        ("tail", "truncated"),
        ("empty", "the file is empty"),
        ("text", "not an image file"),
        ("large", "64x64 pixels is more than the 4000 pixels"),
    ],
)
def test_bad_files_raise_bad_image_error_naming_them(tmp_path: Path, content: str, reason: str) -> None:
    path = tmp_path / "n01440764" / "broken.JPEG"
    path.parent.mkdir()
    data = save(photo(64, 64, 3), path).read_bytes()
    cut = {"half": data[: len(data) // 2], "tail": data[:-2], "empty": b"", "text": b"not an image\n", "large": data}
    path.write_bytes(cut[content])
    with pytest.raises(BadImageError) as caught:
        TensorImageLoader(max_pixels=4000 if content == "large" else image_loading.MAX_PIXELS)(str(path))
    assert caught.value.path == str(path) and re.search(reason, str(caught.value), flags=re.IGNORECASE)


def test_loader_and_transforms_validate_pickle_and_name_their_options() -> None:
    with pytest.raises(ValueError, match="max_pixels must be >= 1"):
        TensorImageLoader(max_pixels=0)
    with pytest.raises(ValueError, match="draft_min_side must be >= 1 or None"):
        TensorImageLoader(draft_min_side=0)
    loader = pickle.loads(pickle.dumps(TensorImageLoader(draft_min_side=915)))
    assert repr(loader) == f"TensorImageLoader(max_pixels={loader.max_pixels}, draft_min_side=915)"
    train = pickle.loads(pickle.dumps(TrainTransform(64, (0.08, 1.0))))
    val = pickle.loads(pickle.dumps(ValTransform(73, 64)))
    assert repr(train) == "TrainTransform(size=64, scale=(0.08, 1.0), ratio=(0.75, 1.3333333333333333))"
    assert repr(val) == "ValTransform(resize_size=73, crop_size=64)"
    image = torch.randint(0, 256, (3, 80, 90), dtype=torch.uint8)
    assert train(image).shape == (3, 64, 64) and val(image).shape == (3, 64, 64)


# --- the transforms ---------------------------------------------------------------------------------------------
PIL_TRAIN = transforms.Compose([transforms.RandomResizedCrop(64, scale=(0.08, 1.0)), transforms.RandomHorizontalFlip()])


def test_train_transform_draws_torchvisions_boxes_and_flips(photos: list[Path]) -> None:
    tensor = TrainTransform(64, (0.08, 1.0))
    flips = 0
    for path in photos:
        image = load_rgb(str(path))
        for seed in range(12):
            torch.manual_seed(seed)
            want = PIL_TRAIN(image)
            torch.manual_seed(seed)
            assert_within_one_level(tensor(as_chw(image)), as_chw(want))
            # A PIL image (a file the loader left to PIL) takes PIL's own resize: the PIL path's pixels exactly.
            torch.manual_seed(seed)
            assert np.array_equal(np.asarray(tensor(image)), np.asarray(want))
            torch.manual_seed(seed)
            transforms.RandomResizedCrop.get_params(image, [0.08, 1.0], [3 / 4, 4 / 3])
            flips += bool(torch.rand(1) < 0.5)
    assert 0 < flips < 12 * len(photos)  # both branches taken, and matched


def test_an_upsampled_crop_of_noise_stays_within_two_levels() -> None:
    """Noise is the worst case for rounding: a box smaller than the output (upsampling) differs from PIL's by at
    most 2 on a few pixels; a downscale by at most 1."""
    rng = np.random.default_rng(0)
    for shape, box, size in (((100, 88), (0, 0, 100, 88), 224), ((221, 583), (50, 200, 108, 128), 224),
                             ((300, 400), (10, 20, 280, 350), 224)):  # fmt: skip
        image = Image.fromarray(rng.integers(0, 256, (*shape, 3), dtype=np.uint8))
        want = as_chw(transforms.functional.resized_crop(image, *box, [size, size]))
        got = cpu_decode.F.resized_crop(as_chw(image), *box, [size, size], antialias=True)
        diff = (got.int() - want.int()).abs()
        upsampled = box[2] < size or box[3] < size
        assert diff.max().item() <= (2 if upsampled else 1), (shape, box)
        assert diff.float().mean().item() < 0.3


def test_val_transform_matches_resize_and_center_crop(photos: list[Path]) -> None:
    pil = transforms.Compose([transforms.Resize(73), transforms.CenterCrop(64)])
    for path in photos:
        image = load_rgb(str(path))
        assert_within_one_level(ValTransform(73, 64)(as_chw(image)), as_chw(pil(image)))
        assert np.array_equal(np.asarray(ValTransform(73, 64)(image)), np.asarray(pil(image)))


# --- in the data module -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def photo_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("photo_root")
    for split, count in (("train", 6), ("val", 2)):
        for c in range(2):
            folder = root / split / f"class{c}"
            folder.mkdir(parents=True)
            for i in range(count):
                save(photo(80 + 7 * i, 100 - 5 * i, 100 * c + i + (split == "val") * 50), folder / f"{i}.JPEG")
    return root


def small_dm(root: Path, decoder: str, **kwargs: object) -> ImageNetDataModule:
    options = dict(root=str(root), batch_size=4, crop_size=48, val_resize_size=56, val_crop_size=48, prefetch_factor=1)
    return ImageNetDataModule(**(options | kwargs), cpu_decoder=decoder)


def batches(root: Path, decoder: str, workers: int, split: str) -> list[torch.Tensor]:
    dm = small_dm(root, decoder, workers=workers)
    dm.setup("fit")
    images = dm.train_set.dataset if split == "train" else dm.val_set.dataset
    want = (TensorImageLoader, TrainTransform if split == "train" else ValTransform)
    assert isinstance(images.loader, want[0]) == isinstance(images.transform, want[1]) == (decoder == "torchvision")
    loader = dm.train_dataloader() if split == "train" else dm.val_dataloader()
    out = [images for images, _ in loader]
    dm.teardown("fit")
    return out


@pytest.mark.parametrize("split", ["train", "val"])
def test_the_data_module_gives_pils_batches_within_one_level(photo_root: Path, split: str) -> None:
    pil = batches(photo_root, "pil", 0, split)
    tensor = batches(photo_root, "torchvision", 2, split)  # through worker processes and their shared memory
    assert len(pil) == len(tensor) == (3 if split == "train" else 1)
    for want, got in zip(pil, tensor, strict=True):
        assert got.dtype == want.dtype == torch.float32 and got.shape == want.shape
        # Normalized: one uint8 level is 1/std of the channel, at most 1/57.1 of ImageNet's.
        assert (got - want).abs().max().item() <= 1 / 57.0
        assert (got - want).abs().max().item() > 0  # the two decoders really differ: this is not PIL twice


def test_seeded_samples_get_the_same_crop_under_both_decoders(photo_root: Path) -> None:
    sets = {}
    for decoder in ("pil", "torchvision"):
        dm = small_dm(photo_root, decoder, workers=0)
        dm.setup("fit")
        sets[decoder] = dm.train_set
    index = SeededIndex(3, sample_seed(0, 1, 3))
    assert_within_one_level(sets["torchvision"][index][0], as_chw(sets["pil"][index][0]))


def test_a_bad_file_is_skipped_through_the_torchvision_decoder(photo_root: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    shutil.copytree(photo_root, root)
    broken = root / "train" / "class0" / "2.JPEG"
    broken.write_bytes(broken.read_bytes()[:300])
    dm = small_dm(root, "torchvision", workers=0, on_bad_image="skip")
    dm.setup("fit")
    index = dm.train_set.dataset.samples.index((str(broken), 0))
    image, target, bad = dm.train_set[index]  # the policy replaces it; the loader's counter warns, in the main process
    assert isinstance(image, torch.Tensor) and image.shape == (3, 48, 48)
    assert [path for path, _ in bad] == [str(broken)]


def test_cpu_decoder_is_validated() -> None:
    with pytest.raises(ValueError, match=r"data.cpu_decoder must be one of pil, torchvision, got 'opencv'"):
        ImageNetDataModule(cpu_decoder="opencv")


def test_fast_collate_takes_tensors_and_pil_images_and_refuses_what_does_not_fit() -> None:
    a = torch.randint(0, 256, (3, 5, 4), dtype=torch.uint8)
    b = Image.fromarray(np.random.default_rng(0).integers(0, 256, (5, 4, 3), dtype=np.uint8))
    images, targets = fast_collate([(a, 1), (b, 0)])
    assert torch.equal(images, torch.stack([a, as_chw(b)])) and targets.tolist() == [1, 0]
    with pytest.raises(ValueError, match="image 1 is 3x5, the first is 4x5"):
        fast_collate([(a, 1), (a[:, :, :3], 0)])
    with pytest.raises(ValueError, match=r"image 1 is a torch.float32 tensor of shape \(3, 5, 4\)"):
        fast_collate([(a, 1), (a.float(), 0)])
    with pytest.raises(ValueError, match=r"image 0 is a torch.uint8 tensor of shape \(1, 5, 4\)"):
        fast_collate([(a[:1], 1)])


class _Images(torch.utils.data.Dataset):
    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> tuple[object, int]:
        array = np.full((6, 5, 3), index, dtype=np.uint8)
        return (torch.from_numpy(array).permute(2, 0, 1) if self.kind == "tensor" else Image.fromarray(array)), index


def _collate_and_report_sharing(batch: list) -> tuple[torch.Tensor, bool]:
    images, _ = fast_collate(batch)
    return images, images.is_shared()


@pytest.mark.parametrize("kind", ["tensor", "pil"])
def test_a_workers_batch_is_allocated_in_shared_memory(kind: str) -> None:
    loader = DataLoader(_Images(kind), batch_size=2, num_workers=2, collate_fn=_collate_and_report_sharing)
    results = list(loader)
    assert [shared for _, shared in results] == [True, True]
    assert [images[:, 0, 0, 0].tolist() for images, _ in results] == [[0, 1], [2, 3]]
    assert not fast_collate([_Images(kind)[0]])[0].is_shared()  # in the main process: ordinary memory


def test_the_cpu_share_of_the_gpu_path_uses_the_tensor_decoder(photos: list[Path]) -> None:
    calls = []

    def counted(path: str) -> object:
        calls.append(path)
        return TensorImageLoader()(path)

    def finished(cpu_loader: object, transform: object) -> torch.Tensor:
        sample = EncodedSampleLoader(True, 64, 0.08, 73, load_rgb, 1.0, transform, cpu_loader)
        torch.manual_seed(3)
        out = sample(str(photos[1]))
        assert out.finished
        return out.data

    got = finished(counted, TrainTransform(64, (0.08, 1.0)))
    assert calls == [str(photos[1])]
    torch.manual_seed(3)
    want = TrainTransform(64, (0.08, 1.0))(TensorImageLoader()(str(photos[1])))
    assert torch.equal(got, want)
    assert_within_one_level(got, finished(None, PIL_TRAIN))  # without a cpu_loader: PIL, as before


def test_workers_pipeline_gives_each_decoders_loader_and_transforms() -> None:
    loader, train, val = cpu_decode.workers_pipeline("torchvision", 112, 64, 0.08, 73, 64)
    assert isinstance(loader, cpu_decode.TensorImageLoader) and loader.draft_min_side == 112
    assert repr(train) == "TrainTransform(size=64, scale=(0.08, 1.0), ratio=(0.75, 1.3333333333333333))"
    assert repr(val) == "ValTransform(resize_size=73, crop_size=64)"
    loader, train, val = cpu_decode.workers_pipeline("pil", None, 64, 0.5, 73, 60)
    assert type(loader) is image_loading.ImageLoader and loader.draft_min_side is None
    crop, flip = train.transforms
    assert (crop.size, crop.scale, type(flip).__name__) == ((64, 64), (0.5, 1.0), "RandomHorizontalFlip")
    resize, center = val.transforms
    assert (resize.size, center.size) == (73, (60, 60))
    with pytest.raises(ValueError, match="data.cpu_decoder must be one of pil, torchvision, got 'opencv'"):
        cpu_decode.workers_pipeline("opencv", None, 64, 0.08, 73, 64)
