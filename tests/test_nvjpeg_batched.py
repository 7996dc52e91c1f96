"""nvjpeg_batched.py (``data.nvjpeg: preallocated``): the library, the struct nvJPEG fills, argument checks, and how
gpu_decode falls back to torchvision; on a GPU (``-m gpu``) the same pixels as torchvision's nvJPEG binding."""

from __future__ import annotations

import ctypes
import io
import threading
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from PIL import Image
from test_jpeg_header import jpeg_of

import gpu_decode
import jpeg_header
import nvjpeg_batched
from nvjpeg_batched import BatchedDecoder, NvjpegError, NvjpegImage


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
    known: list[object] = []
    refuse_at: str = ""

    def __init__(self, device, batch_size, max_height, max_width):  # noqa: ANN001
        if FakeDecoder.refuse_at == "create":
            raise NvjpegError("nvjpegCreateEx", 7)
        self.batch_size, self.max_height, self.max_width, self.closed = batch_size, max_height, max_width, False
        FakeDecoder.made.append(self)

    def decode(self, data, known=None):  # noqa: ANN001, ANN201
        FakeDecoder.known.append(known)
        if FakeDecoder.refuse_at == "decode":
            raise NvjpegError("nvjpegDecodeBatched", 6)
        assert not self.closed, "decoded with a closed decoder"
        return [torch.zeros(3, 4, 4, dtype=torch.uint8) for _ in data]

    def inherit(self, old: FakeDecoder) -> None:
        self.inherited = old

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def stream_of_fakes(monkeypatch):
    FakeDecoder.made, FakeDecoder.known, FakeDecoder.refuse_at = [], [], ""
    monkeypatch.setattr(nvjpeg_batched, "BatchedDecoder", FakeDecoder)
    pool = object.__new__(gpu_decode._DecodeStream)  # no CUDA stream here: only what _decode_preallocated reads
    pool.stream = SimpleNamespace(device=torch.device("cuda", 0))
    pool.preallocated, pool.preallocated_failed, pool.warned = None, False, set()
    pool.preallocated_lock = threading.Lock()
    return pool


def test_the_preallocated_decoder_is_sized_for_the_batch_and_remade_for_a_larger_one(stream_of_fakes):
    pool = stream_of_fakes
    data = [torch.zeros(10, dtype=torch.uint8)] * 3
    assert len(pool._decode_preallocated(data, capacity=256)) == 3
    (first,) = FakeDecoder.made
    side = gpu_decode.PREALLOCATE_SIDE
    assert (first.batch_size, first.max_height, first.max_width) == (256, side, side)
    pool._decode_preallocated(data, capacity=256)
    assert len(FakeDecoder.made) == 1  # reused: no new handle, no new buffers
    first.max_height = 2 * side  # as if made larger: a remade decoder keeps what the old one held
    pool._decode_preallocated(data * 100, capacity=100)
    assert len(FakeDecoder.made) == 2 and first.closed
    assert FakeDecoder.made[1].inherited is first  # it goes on with what the first learned of the workers' sizes
    assert (FakeDecoder.made[1].batch_size, FakeDecoder.made[1].max_height) == (300, 2 * side)


def test_two_producer_threads_never_decode_with_a_decoder_the_other_closed(stream_of_fakes):
    pool, errors = stream_of_fakes, []

    def produce(count: int) -> None:
        try:
            for _ in range(200):
                pool._decode_preallocated([torch.zeros(1, dtype=torch.uint8)] * count, capacity=count)
        except AssertionError as error:  # FakeDecoder.decode on a closed decoder
            errors.append(error)

    threads = [threading.Thread(target=produce, args=(count,)) for count in (8, 16, 8, 32)]
    [thread.start() for thread in threads]
    [thread.join() for thread in threads]
    assert not errors
    assert all(decoder.closed for decoder in FakeDecoder.made[:-1]) and not FakeDecoder.made[-1].closed


@pytest.mark.parametrize("refuse_at", ["create", "decode"])
def test_what_the_hardware_decoder_refuses_goes_to_torchvision_with_one_warning(stream_of_fakes, refuse_at):
    pool = stream_of_fakes
    FakeDecoder.refuse_at = refuse_at
    data = [torch.zeros(10, dtype=torch.uint8)]
    with pytest.warns(UserWarning, match="ARCH_MISMATCH" if refuse_at == "create" else "EXECUTION_FAILED"):
        assert pool._decode_preallocated(data, capacity=8) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same reason warns once
        assert pool._decode_preallocated(data, capacity=8) is None
    assert len(FakeDecoder.made) == (0 if refuse_at == "create" else 1)


def test_the_sizes_the_workers_read_reach_the_decoder(stream_of_fakes):
    pool = stream_of_fakes
    data, known = [torch.zeros(10, dtype=torch.uint8)] * 2, [(375, 500), None]
    pool._decode_preallocated(data, capacity=8, known=known)
    pool._decode_preallocated(data, capacity=8)
    assert FakeDecoder.known == [known, None]


def test_sizes_for_other_jpegs_than_the_call_has_are_refused():
    decoder = object.__new__(BatchedDecoder)  # the check comes before any nvJPEG call
    with pytest.raises(ValueError, match="1 sizes for 2 JPEGs"):
        decoder.decode([torch.zeros(4, dtype=torch.uint8)] * 2, known=[(8, 8)])


def reading_headers(nvjpeg_reads: list[tuple[int, int] | None]) -> tuple[BatchedDecoder, list[int]]:
    """A decoder whose nvJPEG reads JPEG ``k``'s header as ``nvjpeg_reads[k]``, and the list of headers it read."""
    decoder, read = object.__new__(BatchedDecoder), []
    decoder.checked, decoder.trust_known = 0, True
    decoder._inspect = lambda k, jpeg: read.append(k) or nvjpeg_reads[k]
    return decoder, read


def test_the_workers_sizes_are_checked_against_nvjpegs_at_first_then_trusted(monkeypatch):
    monkeypatch.setattr(nvjpeg_batched, "CHECKED_SIZES", 5)
    jpegs, sizes = [torch.zeros(4, dtype=torch.uint8)] * 3, [(10, 20), None, (30, 40)]
    decoder, read = reading_headers(sizes)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert decoder._sizes(jpegs, [None] * 3) == (sizes, False)  # nothing from the workers: nothing compared
        assert decoder._sizes(jpegs, sizes) == (sizes, False) and decoder._sizes(jpegs, sizes) == (sizes, False)
        assert read == [0, 1, 2] * 3 and decoder.checked == 4
        read.clear()
        assert decoder._sizes(jpegs, sizes) == (sizes, False) and decoder.checked == 6  # 5 reached in this call
        read.clear()
        assert decoder._sizes(jpegs, sizes) == (sizes, True) and read == [1]  # only the one the workers left
        read.clear()
        assert decoder._sizes(jpegs, [None] * 3) == (sizes, False) and read == [0, 1, 2]  # none from the workers
        read.clear()
        assert decoder._sizes(jpegs, None) == (sizes, False) and read == [0, 1, 2]  # no sizes from the workers


@pytest.mark.parametrize("nvjpeg_reads", [[(10, 20), None, (31, 40)], [(10, 20), None, None]])
def test_sizes_nvjpeg_reads_otherwise_end_the_trust_with_a_warning(nvjpeg_reads):
    jpegs, known = [torch.zeros(4, dtype=torch.uint8)] * 3, [(10, 20), None, (30, 40)]
    decoder, read = reading_headers(nvjpeg_reads)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        decoder._sizes(jpegs, [(10, 20), None, None])  # a first call that agrees
    with pytest.warns(UserWarning, match=r"JPEG 2 of a batch as .*, the loader's workers as \(30, 40\)"):
        assert decoder._sizes(jpegs, known) == (nvjpeg_reads, False)  # nvJPEG's reading counts
    read.clear()
    remade, _ = reading_headers(nvjpeg_reads)
    remade.inherit(decoder)  # a decoder remade larger does not trust them again
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # it warns once
        for _ in range(3):
            assert decoder._sizes(jpegs, known) == (nvjpeg_reads, False)
            assert remade._sizes(jpegs, known) == (nvjpeg_reads, False)
    assert read == [0, 1, 2] * 3 and not remade.trust_known


def test_known_sizes_must_be_what_a_frame_header_can_say():
    decoder, _ = reading_headers([None])
    decoder.checked = nvjpeg_batched.CHECKED_SIZES  # trusted from here on
    jpeg = [torch.zeros(4, dtype=torch.uint8)]
    assert decoder._sizes(jpeg, [(65535, 1)]) == ([(65535, 1)], True)
    for bad in [(0, 5), (5, 65536), (5.0, 5), [5, 5], (5, 5, 5), (-1, 5)]:
        with pytest.raises(ValueError, match=r"JPEG 0: known size .* is not a \(height, width\) of ints from 1"):
            decoder._sizes(jpeg, [bad])


@pytest.mark.gpu
def test_the_shipped_library_has_every_call_on_the_gpu_machine():
    path = nvjpeg_batched.library_path()
    assert Path(path).is_file(), f"no libnvjpeg beside torchvision ({path}): data.nvjpeg preallocated falls back"
    assert nvjpeg_batched.version()[0] >= 11


@pytest.mark.gpu
def test_the_preallocated_decoder_gives_torchvisions_pixels():
    from torchvision.io import ImageReadMode, decode_jpeg

    jpegs = [
        jpeg_of(301, 199, 6),  # odd sides: the next image's planes start at an odd offset of the buffer
        jpeg_of(500, 375, 0),
        jpeg_of(375, 500, 1, subsampling=0),  # 4:4:4
        jpeg_of(500, 333, 2, subsampling=1),  # 4:2:2
        jpeg_of(80, 64, 3, gray=True),
        jpeg_of(640, 480, 4),  # larger than preallocated
        jpeg_of(300, 200, 5, progressive=True),  # not for the hardware decoder: None
    ]
    decoder = BatchedDecoder("cuda", batch_size=8, max_height=512, max_width=512)
    try:
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):  # decoded on a side stream, read on the default one after a wait
            ours = decoder.decode(jpegs)
        torch.cuda.current_stream().wait_stream(side)
        copies = [None if image is None else image.clone() for image in ours]  # read at once, in stream order
        theirs = decode_jpeg(jpegs, mode=ImageReadMode.RGB, device="cuda")
        assert copies[-1] is None
        for k, (a, b) in enumerate(zip(copies[:-1], theirs[:-1], strict=True)):
            assert a is not None, f"the hardware decoder refused JPEG {k}"
            assert a.shape == b.shape and torch.equal(a, b), k
        more = [jpeg_of(301, 300, 10), jpeg_of(900, 700, 11)]  # new sizes, back to back on the same state
        for a, b in zip(decoder.decode(more), decode_jpeg(more, mode=ImageReadMode.RGB, device="cuda"), strict=True):
            assert a is not None and torch.equal(a, b)
    finally:
        decoder.close()
    with pytest.raises(NvjpegError, match="decode after close"):
        decoder.decode(jpegs)


@pytest.mark.gpu
def test_image_info_gives_each_components_size_and_the_subsampling():
    # nvjpegChromaSubsampling_t: 4:4:4 0, 4:2:2 1, 4:2:0 2, gray 6; chroma planes round up (odd sides)
    decoder = BatchedDecoder("cuda", batch_size=1, max_height=64, max_width=64)
    try:
        assert decoder.image_info(0, jpeg_of(301, 199, 0)) == ([(199, 301), (100, 151), (100, 151)], 2)
        assert decoder.image_info(1, jpeg_of(301, 199, 1, subsampling=0)) == ([(199, 301)] * 3, 0)
        assert decoder.image_info(2, jpeg_of(301, 199, 2, subsampling=1)) == ([(199, 301), (199, 151), (199, 151)], 1)
        assert decoder.image_info(3, jpeg_of(80, 64, 3, gray=True)) == ([(64, 80)], 6)
        with pytest.raises(NvjpegError, match=r"nvjpegGetImageInfo \(JPEG 4\) failed"):
            decoder.image_info(4, torch.zeros(100, dtype=torch.uint8))
        with pytest.raises(ValueError, match="JPEG 5: expected contiguous uint8 1-D bytes on the CPU"):
            decoder.image_info(5, jpeg_of(8, 8, 5).cuda())
    finally:
        decoder.close()


def variety() -> list[torch.Tensor]:
    """JPEGs of every kind hardware_size vouches for, from one pixel to 4096 x 3072 and 8192 x 16, and a progressive
    one it does not."""
    kinds = [{}, {"subsampling": 0}, {"subsampling": 1}, {"gray": True}, {"optimize": True}, {"quality": 100}]
    kinds += [{"quality": 5}, {"restart_marker_blocks": 1}, {"restart_marker_rows": 2}, {"progressive": True}]
    sides = [(1, 1), (2, 3), (7, 5), (8, 8), (17, 9), (16, 8192), (4096, 3072), (301, 199), (500, 375)]
    return [jpeg_of(w, h, k, **kinds[k % len(kinds)]) for k, (w, h) in enumerate(sides * 2)] + [
        jpeg_of(w, h, k, **save) for k, save in enumerate(kinds) for w, h in [(333, 500)]
    ]


@pytest.mark.gpu
def test_what_the_workers_vouch_for_nvjpegs_hardware_decoder_takes_at_that_size():
    jpegs = variety()
    read = [jpeg_header.hardware_size(jpeg.numpy().tobytes()) for jpeg in jpegs]
    decoder = BatchedDecoder("cuda", batch_size=len(jpegs), max_height=512, max_width=512)
    try:
        nvjpegs = [decoder._inspect(k, jpeg) for k, jpeg in enumerate(jpegs)]
    finally:
        decoder.close()
    vouched = [k for k, size in enumerate(read) if size is not None]
    progressive = [k for k, jpeg in enumerate(jpegs) if Image.open(io.BytesIO(jpeg.numpy())).info.get("progressive")]
    assert len(progressive) == 2 and vouched == [k for k in range(len(jpegs)) if k not in progressive]
    for k in vouched:
        assert nvjpegs[k] == read[k], f"JPEG {k}: the workers read {read[k]}, nvJPEG {nvjpegs[k]}"


@pytest.mark.gpu
def test_the_sizes_the_workers_read_give_the_same_pixels_without_nvjpegs_header_calls(monkeypatch):
    jpegs = variety()
    known = [jpeg_header.hardware_size(jpeg.numpy().tobytes()) for jpeg in jpegs]
    monkeypatch.setattr(nvjpeg_batched, "CHECKED_SIZES", sum(size is not None for size in known))  # one call
    decoder = BatchedDecoder("cuda", batch_size=len(jpegs), max_height=512, max_width=512)
    try:
        theirs = [None if image is None else image.clone() for image in decoder.decode(jpegs)]
        inspected = []
        inspect = decoder._inspect
        monkeypatch.setattr(decoder, "_inspect", lambda k, jpeg: inspected.append(k) or inspect(k, jpeg))
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # nvJPEG reads the headers as the workers did
            decoder.decode(jpegs, known)  # checked against nvJPEG's own reading first
        assert decoder.trust_known and inspected == list(range(len(jpegs)))
        inspected.clear()
        ours = decoder.decode(jpegs, known)
        assert inspected == [k for k, size in enumerate(known) if size is None]  # the progressive ones only
        for k, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            assert (a is None) == (b is None) and (a is None or torch.equal(a, b)), k
    finally:
        decoder.close()


class FailingBatches:
    """The library, but its batched decode fails with EXECUTION_FAILED."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib

    def __getattr__(self, name: str) -> object:
        return (lambda *args: 6) if name == "nvjpegDecodeBatched" else getattr(self.lib, name)


@pytest.mark.gpu
def test_a_failed_batch_with_the_workers_sizes_ends_the_trust(monkeypatch):
    jpegs = [jpeg_of(64, 48, k) for k in range(4)]
    known = [jpeg_header.hardware_size(jpeg.numpy().tobytes()) for jpeg in jpegs]
    decoder = BatchedDecoder("cuda", batch_size=4, max_height=64, max_width=64)
    try:
        decoder.checked = nvjpeg_batched.CHECKED_SIZES  # trusted
        decoder.lib = FailingBatches(decoder.lib)
        with pytest.warns(UserWarning, match="sizes the loader's workers read failed; nvJPEG reads every header"):
            with pytest.raises(NvjpegError, match="EXECUTION_FAILED"):
                decoder.decode(jpegs, known)
        assert not decoder.trust_known
        decoder.lib = decoder.lib.lib
        assert all(image is not None for image in decoder.decode(jpegs, known))  # decodes on, nvJPEG reading
    finally:
        decoder.close()


@pytest.mark.gpu
def test_a_remade_decoder_keeps_decoding_right():
    from torchvision.io import ImageReadMode, decode_jpeg

    pool = gpu_decode._DecodeStream(torch.device("cuda", torch.cuda.current_device()))  # its own: a fresh decoder
    sizes = [(375, 500), (500, 375), (333, 500), (199, 301), (480, 640), (64, 80), (400, 400), (300, 200)]
    jpegs = [jpeg_of(w, h, 20 + k) for k, (h, w) in enumerate(sizes)]
    with torch.cuda.stream(pool.stream):
        first = pool._decode_preallocated(jpegs[:3], capacity=3)
        made = pool.preallocated
        second = pool._decode_preallocated(jpegs, capacity=3)  # more JPEGs than it holds: remade, the old closed
    assert pool.preallocated is not made and pool.preallocated.batch_size == 8 and not made.handle
    torch.cuda.synchronize()
    theirs = decode_jpeg(jpegs, mode=ImageReadMode.RGB, device="cuda")
    for ours, count in ((first, 3), (second, 8)):
        assert len(ours) == count and all(torch.equal(a, b) for a, b in zip(ours, theirs[:count], strict=True))
    pool.preallocated.close()


@pytest.mark.gpu
def test_decode_batch_with_the_preallocated_decoder_gives_torchvisions_crops(monkeypatch):
    from encoded_batch import Encoded, PackedBatch, encoded_collate
    from gpu_decode import decode_batch

    pool = gpu_decode._DecodeStream.of(torch.device("cuda", torch.cuda.current_device()))
    pool.preallocated_failed, pool.warned = False, set()
    concatenations = []
    flatten = gpu_decode._flatten_dense_tensors
    monkeypatch.setattr(
        gpu_decode, "_flatten_dense_tensors", lambda tensors: concatenations.append(1) or flatten(tensors)
    )

    def batch(progressive: bool, read: bool = False) -> PackedBatch:
        samples = []
        for seed, (h, w) in enumerate([(375, 500), (400, 300), (333, 500)]):
            data = jpeg_of(w, h, seed, progressive=progressive and seed == 1)
            known = jpeg_header.hardware_size(data.numpy().tobytes()) if read else None  # as a worker reads it
            samples.append((Encoded(data, True, (10, 20, h // 2, w // 2), seed % 2 == 0, hardware_size=known), seed))
        return encoded_collate(samples)[0]

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ours = decode_batch(batch(False), "cuda", 64, nvjpeg="preallocated")
    assert pool.preallocated is not None and not caught  # the own decoder ran, nothing fell back
    assert not concatenations  # the crops were read from the decoder's buffer, where nvJPEG wrote them
    assert torch.equal(ours, decode_batch(batch(False), "cuda", 64))
    assert concatenations  # torchvision's images are separate tensors
    assert torch.equal(decode_batch(batch(False, read=True), "cuda", 64, nvjpeg="preallocated"), ours)
    with pytest.warns(UserWarning, match="not for nvJPEG's hardware decoder"):
        ours = decode_batch(batch(True), "cuda", 64, nvjpeg="preallocated")
    assert torch.equal(ours, decode_batch(batch(True), "cuda", 64))  # the progressive one by torchvision
    assert torch.equal(decode_batch(batch(True, read=True), "cuda", 64, nvjpeg="preallocated"), ours)
