"""gpu_crop_kernel.py: the batch's crop, resize and flip as one Triton kernel. On the CPU the kernel runs under Triton's
interpreter (the same code, each program in NumPy); on a GPU (``-m gpu``) compiled, against the torch path and the
per-image reference."""

from __future__ import annotations

import importlib.util
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from test_gpu_decode import loader_box, make_sample, one_buffer, textured_pixels

import gpu_crop_kernel
import gpu_decode
from encoded_batch import center_crop_geometry
from gpu_decode import decode_crop_resize, decode_crop_resize_reference

pytest.importorskip("triton")

SIZE = 16  # the interpreter runs each program's loops in Python: small outputs keep the tests fast


@pytest.fixture
def interpreted(monkeypatch):
    """gpu_decode with gpu_crop_kernel loaded afresh under ``TRITON_INTERPRET=1`` (read when ``@triton.jit``
    decorates), its first-launch state reset."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    path = Path(gpu_crop_kernel.__file__)
    spec = importlib.util.spec_from_file_location("gpu_crop_kernel_interpreted", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(gpu_decode, "gpu_crop_kernel", module)
    monkeypatch.setattr(gpu_decode, "_FUSED_STATE", "unknown")
    return module


def make_batch(size: int, jpegs: bool) -> list:
    """Downscaling (up to 9 input pixels an output), upscaling, identity, tiny (3x2), crops at the edges, non-square;
    every other one mirrored; RandomResizedCrop boxes as the loader draws them; validation's center crops (downscaled
    and upscaled). With ``jpegs``, every third sample (of the larger ones) a JPEG to decode."""
    specs = [  # (width, height, (top, left, height, width))
        (300, 200, (10, 20, 60, 70)),
        (64, 40, (5, 7, 10, 12)),
        (size, size, (0, 0, size, size)),
        (3, 2, (0, 1, 2, 2)),
        (150, 60, (3, 5, 57, 145)),
        (97, 101, (50, 60, 51, 37)),
    ]
    torch.manual_seed(0)
    for k in range(3):
        width, height = 60 + 17 * k, 90 - 11 * k
        specs.append((width, height, loader_box(height, width)))
    samples = [
        make_sample(textured_pixels(width, height, seed=k), box, k % 2 == 1, jpegs and k % 3 == 0 and width > 8)
        for k, (width, height, box) in enumerate(specs)
    ]
    for k, (width, height, resize) in enumerate([(120, 80, size + 4), (40, 30, size + 4)]):
        box, geometry = center_crop_geometry(height, width, resize, size)
        pixels = textured_pixels(width, height, seed=100 + k)
        samples.append(make_sample(pixels, box, False, jpegs and k == 0, resize=geometry))
    return samples


@pytest.fixture(scope="module")
def batch() -> list:
    return make_batch(SIZE, jpegs=False)


def test_the_kernel_gives_the_per_image_reference_in_any_layout(interpreted, batch, monkeypatch):
    reference = decode_crop_resize_reference(batch, torch.device("cpu"), SIZE)
    images = [sample.data for sample in batch]
    concatenations = []
    flatten = gpu_decode._flatten_dense_tensors
    monkeypatch.setattr(
        gpu_decode, "_flatten_dense_tensors", lambda tensors: concatenations.append(1) or flatten(tensors)
    )
    # Into rows 2.. of a channels_last batch (the finished crops come first), rows 0-1 left as they were.
    whole = torch.full((len(batch) + 2, 3, SIZE, SIZE), -7.0).contiguous(memory_format=torch.channels_last)
    assert gpu_decode._crop_resize_fused(batch, images, whole[2:])
    assert concatenations  # separately allocated images: one concatenation
    assert (whole[:2] == -7.0).all()
    # ATen's weights, evaluated per output pixel in float32 rather than as two passes: float rounding only.
    difference = (whole[2:] - reference).abs()
    assert difference.max() < 2e-3 and difference.mean() < 1e-4, difference.amax((1, 2, 3))
    torch.testing.assert_close(whole[2 + 2], reference[2], atol=1e-4, rtol=0)  # the identity crop: its pixels

    concatenations.clear()
    contiguous = torch.empty((len(batch), 3, SIZE, SIZE))
    assert gpu_decode._crop_resize_fused(batch, one_buffer(images), contiguous)
    assert not concatenations  # read where the decoder wrote them
    assert torch.equal(contiguous, whole[2:])


def test_the_kernel_flips_exactly_the_flagged_samples(interpreted):
    ramp = torch.arange(40, dtype=torch.uint8).mul(6).expand(3, 30, 40).contiguous()  # left to right
    samples = [make_sample(ramp, (4, 3, 20, 33), flip, encoded=False) for flip in (False, True)]
    out = torch.empty((2, 3, SIZE, SIZE))
    assert gpu_decode._crop_resize_fused(samples, [ramp, ramp], out)
    assert (out[0, :, :, 1:] > out[0, :, :, :-1]).all() and (out[1, :, :, 1:] < out[1, :, :, :-1]).all()
    torch.testing.assert_close(out[1], out[0].flip(-1), atol=1e-4, rtol=0)


def reads_outside_the_boxes(monkeypatch, samples: list, images: list) -> list[int]:  # noqa: ANN001
    """Wraps the interpreter's loads: for each uint8 load (the image bytes; the table is int64/float32), how many of
    its addresses lie outside the box of the crop (the program's first grid index) it was read for. Reads outside a
    crop's box weigh zero and so cannot show in the pixels."""
    from triton.runtime import interpreter

    boxes = []
    for sample, image in zip(samples, images, strict=True):
        top, left, height, width = sample.box
        boxes.append((image.data_ptr(), image.shape[1] * image.shape[2], image.shape[2], top, left, height, width))
    outside = []
    load = interpreter.InterpreterBuilder.create_masked_load

    def checked_load(self, pointers, mask, *args):  # noqa: ANN001, ANN002, ANN202
        if pointers.get_element_ty().scalar.primitive_bitwidth == 8:
            start, plane, width, top, left, height, box_w = boxes[int(self.grid_idx[0])]
            offset = pointers.data[mask.data.astype(bool)].astype(np.int64) - start
            channel, rest = np.divmod(offset, plane)
            y, x = np.divmod(rest, width)
            inside = (offset >= 0) & (channel < 3) & (y >= top) & (y < top + height) & (x >= left) & (x < left + box_w)
            outside.append(int((~inside).sum()))
        return load(self, pointers, mask, *args)

    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_masked_load", checked_load)
    return outside


def fused_from_one_buffer_read_inside_the_boxes(monkeypatch, samples: list, size: int) -> torch.Tensor:  # noqa: ANN001
    """The samples' images put in one buffer and resized by the fused kernel into a NaN-filled ``(n, 3, size,
    size)``, checked: loads were seen and none outside its crop's box, every pixel written (no NaN left) and right
    against the per-image reference. Returns the output."""
    images = one_buffer([sample.data for sample in samples])
    outside = reads_outside_the_boxes(monkeypatch, samples, images)
    out = torch.full((len(samples), 3, size, size), float("nan"))
    assert gpu_decode._crop_resize_fused(samples, images, out)
    assert outside and sum(outside) == 0
    reference = decode_crop_resize_reference(samples, torch.device("cpu"), size)
    torch.testing.assert_close(out, reference, atol=2e-3, rtol=0)
    return out


def test_every_tile_of_a_larger_output_and_no_pixel_outside_the_box_is_read(interpreted, monkeypatch):
    """At 40 x 40 a crop's output is 3 x 2 tiles of 16 x 32, the last ones past its edge. Every uint8 address the
    interpreter loads is checked against the box of the crop it was read for."""
    size = 40
    samples = [  # boxes at the image's top-left and bottom-right corners, one mirrored, one upscaled; the last image
        # last in the buffer, so that a read past its box would also be past the buffer
        make_sample(textured_pixels(90, 70, seed=1), (0, 0, 61, 83), False, encoded=False),
        make_sample(textured_pixels(50, 40, seed=2), (12, 15, 28, 35), True, encoded=False),
        make_sample(textured_pixels(30, 20, seed=3), (5, 9, 15, 21), False, encoded=False),
    ]
    fused_from_one_buffer_read_inside_the_boxes(monkeypatch, samples, size)


def test_a_tiles_input_rows_in_chunks_of_any_span(interpreted, monkeypatch):
    """At 16 x 16 one tile's rows are the whole output, so the input rows it resizes along x, BLOCK_R at a time, are
    the whole box: box heights that make that span one row (a 1 x 1 box, every output its one pixel), fewer rows
    than a chunk (upscaled), a chunk, a row more, several chunks and a rest (downscaled 6 times). Each against the
    per-image reference, none read outside its box."""
    chunk = interpreted.BLOCK_R
    boxes = [(1, 1), (5, 3), (chunk - 1, 40), (chunk, chunk), (chunk + 1, 9), (2 * chunk + 3, 30), (6 * chunk + 5, 23)]
    samples = [
        make_sample(textured_pixels(width + 7, height + 4, seed=k), (3, 5, height, width), k % 2 == 1, encoded=False)
        for k, (height, width) in enumerate(boxes)
    ]
    out = fused_from_one_buffer_read_inside_the_boxes(monkeypatch, samples, SIZE)
    one_pixel = samples[0].data[:, 3:4, 5:6].float().expand(3, SIZE, SIZE)
    torch.testing.assert_close(out[0], one_pixel, atol=0, rtol=1e-6)  # the 1 x 1 box: its pixel everywhere


def test_the_row_weights_multiply_in_ieee_float32():
    """The interpreter ignores ``tl.dot``'s ``input_precision``, so only a GPU run would show TF32 (the weights and
    the rows' sums rounded to 11 significant bits, about 0.1 of 255): each of the three dots asks for IEEE float32."""
    dots = re.findall(r"tl\.dot\(([^)]*)\)", gpu_crop_kernel._crop_resize_kernel.src)
    assert len(dots) == 3 and all('input_precision="ieee"' in dot for dot in dots), dots


def test_taps_cover_the_filters_support():
    """Along an axis the weights are nonzero where ``|x + 0.5 - center| < max(scale, 1)``: for any center, those
    pixels lie within the taps the kernel visits from ``floor(center - 0.5 - support)``."""
    rng = np.random.default_rng(0)
    scale = np.concatenate([rng.uniform(0.05, 12.0, 2000), [0.5, 1.0, 2.0, 3.0]])
    center = rng.uniform(-3.0, 600.0, scale.size)
    support = np.maximum(scale, 1.0)
    first = np.floor(center - 0.5 - support)
    last_nonzero = np.ceil(center - 0.5 + support) - 1  # the largest x with x + 0.5 - center < support
    assert (first + gpu_crop_kernel.taps(scale) - 1 >= last_nonzero).all()
    assert (gpu_crop_kernel.taps(np.array([0.3, 1.0, 1.01, 4.0])) == [4, 4, 5, 10]).all()


def test_a_kernel_that_cannot_be_built_warns_once_and_the_torch_path_runs(batch, monkeypatch):
    calls = []

    def broken(*args: object) -> None:
        calls.append(1)
        raise RuntimeError("Failed to find C compiler")

    monkeypatch.setattr(gpu_decode.gpu_crop_kernel, "launch", broken)
    monkeypatch.setattr(gpu_decode, "_FUSED_STATE", "unknown")
    images = [sample.data for sample in batch]
    out = torch.empty((len(batch), 3, SIZE, SIZE))
    with pytest.warns(UserWarning, match="fused crop kernel.*C compiler.*torch ops"):
        assert not gpu_decode._crop_resize_fused(batch, images, out)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not gpu_decode._crop_resize_fused(batch, images, out)  # no second try, no second warning
    assert len(calls) == 1

    monkeypatch.setattr(gpu_decode, "_FUSED_STATE", "unknown")
    monkeypatch.setattr(gpu_decode.gpu_crop_kernel, "AVAILABLE", False)  # no Triton at all: said once too
    with pytest.warns(UserWarning, match="fused crop kernel.*Triton cannot be imported"):
        assert not gpu_decode._crop_resize_fused(batch, images, out)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not gpu_decode._crop_resize_fused(batch, images, out)
    assert len(calls) == 1


def test_an_unknown_crop_kernel_is_refused(batch, monkeypatch):
    monkeypatch.setattr(gpu_decode, "CROP_KERNEL", "cuda")
    with pytest.raises(ValueError, match="CROP_KERNEL must be 'triton' or 'torch', got 'cuda'"):
        decode_crop_resize(batch, torch.device("cpu"), SIZE)


def test_after_its_first_launch_a_kernel_error_is_raised(batch, monkeypatch):
    monkeypatch.setattr(gpu_decode, "_FUSED_STATE", "verified")
    monkeypatch.setattr(gpu_decode.gpu_crop_kernel, "launch", lambda *args: (_ for _ in ()).throw(ValueError("bad")))
    with pytest.raises(ValueError, match="bad"):
        gpu_decode._crop_resize_fused(batch, [sample.data for sample in batch], torch.empty((len(batch), 3, 16, 16)))


@pytest.mark.gpu
@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last])
def test_on_the_gpu_the_kernel_matches_the_reference_and_repeats_bit_for_bit(memory_format, monkeypatch):
    device, size = torch.device("cuda"), 48
    samples = make_batch(size, jpegs=True)
    reference = decode_crop_resize_reference(samples, device, size)  # the same nvJPEG pixels: the resize differs

    def run(kernel: str) -> torch.Tensor:
        monkeypatch.setattr(gpu_decode, "CROP_KERNEL", kernel)
        out = torch.empty((len(samples), 3, size, size), device=device, memory_format=memory_format)
        return decode_crop_resize(samples, device, size, out=out)

    fused = run("triton")
    assert gpu_decode._FUSED_STATE == "verified"
    difference = (fused - reference).abs()
    assert difference.max() < 2e-3 and difference.mean() < 1e-4  # float32 throughout (the torch path: fp16)
    torch.testing.assert_close(fused, run("torch"), atol=1.0, rtol=0)
    stream = torch.cuda.Stream(device)  # as the prefetcher runs it: batch after batch on its side stream
    with torch.cuda.stream(stream):
        again = [run("triton") for _ in range(6)]
    stream.synchronize()
    assert all(torch.equal(out, fused) for out in again)


def test_offsets_within_an_image_past_sixteen_bits(interpreted, monkeypatch):
    """The kernel's offsets within an image (row x width + column) are int32: a box whose rows lie more than 2**16
    bytes past its first pixel, in an image whose plane is over 2**17, read right (a narrower type would wrap)."""
    pixels = textured_pixels(1100, 130, seed=7)
    samples = [make_sample(pixels, (40, 150, 80, 900), flip, encoded=False) for flip in (False, True)]
    fused_from_one_buffer_read_inside_the_boxes(monkeypatch, samples, SIZE)
