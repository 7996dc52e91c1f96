"""nvjpeg_batched.py (``data.nvjpeg: preallocated``): the library, the struct nvJPEG fills, argument checks, and how
gpu_decode falls back to torchvision; on a GPU (``-m gpu``) the same pixels as torchvision's nvJPEG binding."""

from __future__ import annotations

import ctypes
import io
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

import gpu_decode
import nvjpeg_batched
from nvjpeg_batched import BatchedDecoder, NvjpegError, NvjpegImage


def jpeg_bytes(width: int, height: int, seed: int, progressive: bool = False) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, size=(5, 5, 3), dtype=np.uint8)
    image = Image.fromarray(coarse, "RGB").resize((width, height), Image.BICUBIC)
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=90, progressive=progressive)
    return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)


def test_the_output_struct_is_laid_out_as_nvjpeg_h_declares_it():
    # typedef struct { unsigned char *channel[4]; size_t pitch[4]; } nvjpegImage_t;
    assert ctypes.sizeof(NvjpegImage) == 8 * ctypes.sizeof(ctypes.c_void_p)
    assert NvjpegImage.pitch.offset == 4 * ctypes.sizeof(ctypes.c_void_p)


def test_the_library_torchvision_ships_loads_and_has_the_preallocate_call(monkeypatch):
    monkeypatch.delenv("NVJPEG_LIBRARY", raising=False)
    path = nvjpeg_batched.library_path()
    if not Path(path).is_file():
        pytest.skip(f"no libnvjpeg shipped with this torchvision ({path})")
    major, minor, patch = nvjpeg_batched.version()
    assert major >= 11 and minor >= 0 and patch >= 0  # the preallocate call came with CUDA 11's nvJPEG
    assert hasattr(nvjpeg_batched.library(), "nvjpegDecodeBatchedPreAllocate")


def test_a_library_that_does_not_load_names_the_path_and_the_variable(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("NVJPEG_LIBRARY", str(tmp_path / "libnvjpeg.so.missing"))
    monkeypatch.setattr(nvjpeg_batched, "_library", None)
    with pytest.raises(NvjpegError, match=r"libnvjpeg.so.missing .*set NVJPEG_LIBRARY"):
        nvjpeg_batched.library()


def test_bad_arguments_are_refused_before_any_call():
    with pytest.raises(ValueError, match="nvJPEG decodes on a CUDA device, got cpu"):
        BatchedDecoder("cpu", 256, 512, 512)
    with pytest.raises(ValueError, match="must be positive"):
        BatchedDecoder("cuda:0", 0, 512, 512)
    assert str(NvjpegError("nvjpegCreateEx", 7)) == "nvjpegCreateEx failed: NVJPEG_STATUS_ARCH_MISMATCH (7)"


class FakeDecoder:
    """Stands in for BatchedDecoder on a CPU-only machine: records what gpu_decode asks of it."""

    made: list[FakeDecoder] = []
    refuse_at: str = ""

    def __init__(self, device, batch_size, max_height, max_width):  # noqa: ANN001
        if FakeDecoder.refuse_at == "create":
            raise NvjpegError("nvjpegCreateEx", 7)
        self.batch_size, self.max_height, self.max_width, self.closed = batch_size, max_height, max_width, False
        FakeDecoder.made.append(self)

    def decode(self, data, sizes):  # noqa: ANN001, ANN201
        if FakeDecoder.refuse_at == "decode":
            raise NvjpegError("nvjpegDecodeBatched", 4)
        return [torch.zeros(3, h, w, dtype=torch.uint8) for h, w in sizes]

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def stream_of_fakes(monkeypatch):
    FakeDecoder.made, FakeDecoder.refuse_at = [], ""
    monkeypatch.setattr(nvjpeg_batched, "BatchedDecoder", FakeDecoder)
    pool = object.__new__(gpu_decode._DecodeStream)  # no CUDA stream here: only what _decode_preallocated reads
    pool.stream = SimpleNamespace(device=torch.device("cuda", 0))
    pool.preallocated, pool.preallocated_failed, pool.warned = None, False, set()
    return pool


def test_the_preallocated_decoder_is_sized_for_the_batch_and_remade_for_a_larger_one(stream_of_fakes):
    pool = stream_of_fakes
    data = [torch.zeros(10, dtype=torch.uint8)] * 3
    images = pool._decode_preallocated(data, [(375, 500), (333, 500), (600, 700)], capacity=256)
    assert [tuple(image.shape) for image in images] == [(3, 375, 500), (3, 333, 500), (3, 600, 700)]
    (first,) = FakeDecoder.made
    assert (first.batch_size, first.max_height, first.max_width) == (256, 640, 704)  # this batch's largest, by 64
    pool._decode_preallocated(data, [(100, 100)] * 3, capacity=256)
    assert len(FakeDecoder.made) == 1  # reused: no new handle, no new buffers
    pool._decode_preallocated(data * 100, [(100, 100)] * 300, capacity=300)
    assert len(FakeDecoder.made) == 2 and first.closed and FakeDecoder.made[1].batch_size == 300
    assert FakeDecoder.made[1].max_height == gpu_decode.PREALLOCATE_SIDE  # at least this side
    assert pool._decode_preallocated(data, [(0, 0)] * 3, capacity=256) is None  # no header size: torchvision


@pytest.mark.parametrize("refuse_at", ["create", "decode"])
def test_what_the_hardware_decoder_refuses_goes_to_torchvision_with_one_warning(stream_of_fakes, refuse_at):
    pool = stream_of_fakes
    FakeDecoder.refuse_at = refuse_at
    data, sizes = [torch.zeros(10, dtype=torch.uint8)], [(100, 100)]
    with pytest.warns(UserWarning, match="ARCH_MISMATCH" if refuse_at == "create" else "JPEG_NOT_SUPPORTED"):
        assert pool._decode_preallocated(data, sizes, capacity=8) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same reason warns once
        assert pool._decode_preallocated(data, sizes, capacity=8) is None
    assert len(FakeDecoder.made) == (0 if refuse_at == "create" else 1)


@pytest.mark.gpu
def test_the_preallocated_decoder_gives_torchvisions_pixels():
    from torchvision.io import ImageReadMode, decode_jpeg

    sizes = [(375, 500), (500, 375), (333, 500), (64, 80), (480, 640)]
    jpegs = [jpeg_bytes(w, h, seed) for seed, (h, w) in enumerate(sizes)]
    decoder = BatchedDecoder("cuda", batch_size=8, max_height=512, max_width=512)
    try:
        ours = decoder.decode(jpegs, sizes)
        theirs = decode_jpeg(jpegs, mode=ImageReadMode.RGB, device="cuda")
        torch.cuda.synchronize()
        for k, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            assert a.shape == b.shape and torch.equal(a, b), k
        # New sizes, a larger image than preallocated: still right.
        more = [(300, 301), (700, 900)]
        again = decoder.decode([jpeg_bytes(w, h, 10 + k) for k, (h, w) in enumerate(more)], more)
        assert [tuple(image.shape) for image in again] == [(3, 300, 301), (3, 700, 900)]
    finally:
        decoder.close()


@pytest.mark.gpu
def test_decode_batch_with_either_binding_gives_the_same_crops_and_progressive_jpegs_fall_back():
    from gpu_decode import Encoded, decode_batch, encoded_collate

    def batch(progressive: bool) -> gpu_decode.PackedBatch:
        samples = []
        for seed, (h, w) in enumerate([(375, 500), (400, 300), (333, 500)]):
            data = jpeg_bytes(w, h, seed, progressive=progressive and seed == 1)
            samples.append((Encoded(data, True, (10, 20, h // 2, w // 2), seed % 2 == 0, size=(h, w)), seed))
        return encoded_collate(samples)[0]

    for progressive in (False, True):
        with warnings.catch_warnings(record=True):
            ours = decode_batch(batch(progressive), "cuda", 64, nvjpeg="preallocated")
        theirs = decode_batch(batch(progressive), "cuda", 64)
        torch.cuda.synchronize()
        assert torch.equal(ours, theirs), progressive
