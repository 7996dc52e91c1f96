"""jpeg_header.py: which JPEGs the loader's workers vouch for to nvJPEG's hardware decoder, and at what size (the GPU
tests that nvJPEG reads them alike are in test_nvjpeg_batched.py)."""

from __future__ import annotations

import io
import random

import numpy as np
import pytest
import torch
from PIL import Image

from jpeg_header import hardware_size


def jpeg_of(width: int, height: int, seed: int, **save: object) -> torch.Tensor:
    """A smooth RGB (or, with ``gray=True``, gray) JPEG as uint8 1-D bytes; ``save`` goes to PIL (quality 90)."""
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, size=(5, 5, 3), dtype=np.uint8)
    image = Image.fromarray(coarse, "RGB").resize((width, height), Image.BICUBIC)
    if save.pop("gray", False):
        image = image.convert("L")
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", **{"quality": 90, **save})
    return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)


def raw_of(width: int, height: int, seed: int = 0, **save: object) -> bytes:
    return jpeg_of(width, height, seed, **save).numpy().tobytes()


def segment_at(raw: bytes, marker: int) -> int:
    """Offset of the first segment with ``marker`` in a JPEG's header (its 0xFF byte), walking the lengths."""
    at = 2
    while raw[at + 1] != marker:
        at += 2 + int.from_bytes(raw[at + 2 : at + 4], "big")
    return at


def patched(raw: bytes, at: int, value: bytes) -> bytes:
    return raw[:at] + value + raw[at + len(value) :]


def without_segment(raw: bytes, marker: int) -> bytes:
    at = segment_at(raw, marker)
    return raw[:at] + raw[at + 2 + int.from_bytes(raw[at + 2 : at + 4], "big") :]


def with_segment(raw: bytes, marker: int, body: bytes, at: int = 2) -> bytes:
    """``raw`` with one more segment at offset ``at`` (default: right after the start-of-image marker)."""
    return raw[:at] + bytes([0xFF, marker]) + (len(body) + 2).to_bytes(2, "big") + body + raw[at:]


def resized_segment(raw: bytes, at: int, by: int) -> bytes:
    """``raw`` with the segment at ``at`` longer by ``by`` zero bytes (shorter when negative), its length to match."""
    stop = at + 2 + int.from_bytes(raw[at + 2 : at + 4], "big")
    body = raw[at + 4 : stop] + bytes(max(by, 0)) if by >= 0 else raw[at + 4 : stop + by]
    return raw[: at + 2] + (len(body) + 2).to_bytes(2, "big") + body + raw[stop:]


def renumbered(raw: bytes, ids: bytes) -> bytes:
    """``raw`` with its three components numbered ``ids``, in the frame header and in the scan header."""
    sof, sos = segment_at(raw, 0xC0), segment_at(raw, 0xDA)
    for k, id_ in enumerate(ids):
        raw = patched(patched(raw, sof + 10 + 3 * k, bytes([id_])), sos + 5 + 2 * k, bytes([id_]))
    return raw


@pytest.mark.parametrize(
    ("save", "width", "height"),
    [
        ({}, 500, 375),  # 4:2:0, PIL's default
        ({"subsampling": 0}, 301, 199),  # 4:4:4, odd sides
        ({"subsampling": 1}, 333, 500),  # 4:2:2
        ({"gray": True}, 80, 64),
        ({"optimize": True}, 640, 480),  # Huffman tables of the image's own: still baseline
        ({"restart_marker_blocks": 3}, 120, 90),  # restart intervals
        ({}, 1, 1),
    ],
)
def test_the_workers_vouch_for_baseline_jpegs_with_the_headers_size(save, width, height):
    raw = raw_of(width, height, **save)
    assert hardware_size(raw) == (height, width)
    assert hardware_size(bytearray(raw)) == (height, width) == hardware_size(memoryview(raw))


def test_what_the_standard_allows_around_the_segments_is_read_through():
    raw = raw_of(200, 150)
    sof, dqt = segment_at(raw, 0xC0), segment_at(raw, 0xDB)
    second = dqt + 69  # PIL writes a table a segment, luma then chroma: 2 + 2 + 65 bytes each
    assert raw[second : second + 2] == b"\xff\xdb"
    tables = [raw[at + 4 : at + 69] for at in (dqt, second)]
    one_dqt = with_segment(without_segment(without_segment(raw, 0xDB), 0xDB), 0xDB, b"".join(tables))
    vouched = {
        "fill bytes before a marker": raw[:sof] + b"\xff\xff\xff" + raw[sof:],
        "two quantization tables in one segment": one_dqt,
        "a comment and a restart interval": with_segment(with_segment(raw, 0xFE, b"hi"), 0xDD, b"\x00\x04"),
        "components numbered 0, 1, 2": renumbered(raw, b"\x00\x01\x02"),
        "an Adobe marker for YCbCr": with_segment(raw, 0xEE, b"Adobe\x00\x64\x00\x00\x00\x00\x01"),
    }
    for name, data in vouched.items():
        assert hardware_size(data) == (150, 200), name


def test_the_workers_leave_every_other_jpeg_to_nvjpegs_own_check():
    raw = raw_of(200, 150)
    gray = raw_of(40, 30, gray=True)
    sof, sos = segment_at(raw, 0xC0), segment_at(raw, 0xDA)
    cmyk = io.BytesIO()
    Image.new("CMYK", (40, 30)).save(cmyk, "JPEG")
    one_scan = sos + 2 + int.from_bytes(raw[sos + 2 : sos + 4], "big")
    unvouched = {
        "progressive": raw_of(200, 150, progressive=True),
        "CMYK (4 channels)": cmyk.getvalue(),
        "4 channels, no Adobe marker": without_segment(cmyk.getvalue(), 0xEE),
        "extended sequential (SOF1)": patched(raw, sof + 1, b"\xc1"),
        "12-bit samples": patched(raw, sof + 4, b"\x0c"),
        "height from a DNL marker (0 in the frame)": patched(raw, sof + 5, b"\x00\x00"),
        "frame header longer than its components": patched(raw, sof + 2, b"\x00\x12"),
        "4:4:0 (luma 1x2)": patched(raw, sof + 11, b"\x12"),
        "blue chroma not 1x1": patched(raw, sof + 14, b"\x21"),
        "red chroma not 1x1": patched(raw, sof + 17, b"\x21"),
        "components named R, G, B (RGB to libjpeg)": renumbered(raw, b"RGB"),
        "a quantization table selector above 3": patched(raw, sof + 12, b"\x04"),
        "gray sampled 2x2": patched(gray, segment_at(gray, 0xC0) + 11, b"\x22"),
        "16-bit quantization table": patched(raw, segment_at(raw, 0xDB) + 4, b"\x10"),
        "a quantization table cut short": resized_segment(raw, segment_at(raw, 0xDB), -1),
        "gray frame header longer than its one component": resized_segment(gray, segment_at(gray, 0xC0), 3),
        "arithmetic conditioning (DAC)": with_segment(raw, 0xCC, b"\x00\x10"),
        "Adobe marker: channels not YCbCr": with_segment(raw, 0xEE, b"Adobe\x00\x64\x00\x00\x00\x00\x00"),
        "Adobe marker cut short": with_segment(raw, 0xEE, b"Adobe\x00\x64"),
        "a second frame header": raw[:sof] + raw[sof:sos] + raw[sof:],
        "a frame header after the scan": raw[:-2] + raw[sof:sos] + raw[-2:],
        "a second scan": raw[:-2] + raw[sos:one_scan] + raw[-2:],
        "a scan of one component of three": patched(raw, sos + 4, b"\x01"),
        "a scan before any frame": raw[:2] + raw[sos:],
        "FF 00 where a marker should be": with_segment(raw, 0x00, b"\x00\x00"),
        "a reserved marker": with_segment(raw, 0x02, b"\x00\x00"),
        "JPG extension (C8)": with_segment(raw, 0xC8, b"\x00\x00"),
        "hierarchical (DHP)": with_segment(raw, 0xDE, b"\x00\x00"),
        "expand (EXP)": with_segment(raw, 0xDF, b"\x00"),
        "JPEG extension (F0)": with_segment(raw, 0xF0, b"\x00\x00"),
        "DNL before the scan": with_segment(raw, 0xDC, b"\x00\x10"),
        "a restart marker before the scan": raw[:sof] + b"\xff\xd0" + raw[sof:],
        "TEM before the scan": raw[:sof] + b"\xff\x01" + raw[sof:],
        "a segment length below 2": patched(raw, segment_at(raw, 0xE0) + 2, b"\x00\x01"),
        "junk between segments": raw[:sof] + b"\x00" + raw[sof:],
        "header cut before the scan": raw[:sos],
        "cut inside a segment": raw[: sof + 8],
        "not a JPEG": b"\x89PNG\r\n\x1a\n" + raw[8:],
        "empty": b"",
    }
    for name, data in unvouched.items():
        assert hardware_size(data) is None, name


def test_mangled_files_never_raise_and_a_vouched_size_is_what_pil_reads():
    """A fuzz: bytes flipped, cut, inserted or repeated in small JPEGs of every kind PIL writes."""
    rng = random.Random(0)
    seeds = [raw_of(48, 40, k, **save) for k, save in enumerate([{}, {"subsampling": 0}, {"gray": True}])]
    seeds.append(raw_of(40, 48, 3, progressive=True))
    vouched = 0
    for _ in range(3000):
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 3)):
            if not data:
                break
            at = rng.randrange(len(data))
            edit = rng.randrange(4)
            if edit == 0:
                data[at] = rng.randrange(256)
            elif edit == 1:
                del data[at:]
            elif edit == 2:
                data[at:at] = bytes([0xFF, rng.randrange(256)])
            else:
                data[at:at] = data[at : at + rng.randint(1, 20)]
        size = hardware_size(bytes(data))
        if size is None:
            continue
        vouched += 1
        try:
            header = Image.open(io.BytesIO(bytes(data)))
        except Exception:  # PIL reads no header: the workers send such a file to PIL, never to nvJPEG
            continue
        assert size == header.size[::-1] and not header.info.get("progressive"), bytes(data[:64])
    assert vouched > 300  # most edits land in the entropy-coded data and leave the header as it was
