"""What a JPEG's header says, read in Python by the loader's workers: :func:`hardware_size` for ``data.nvjpeg:
preallocated`` (nvjpeg_batched.py), so that the producer thread does not read each header again through nvJPEG."""

from __future__ import annotations

import re
import struct

#: Luma sampling factors (horizontal, vertical) of the YCbCr layouts :func:`hardware_size` vouches for, chroma at
#: (1, 1): 4:4:4, 4:2:2 and 4:2:0, the ones nvJPEG's hardware decoder took on an H200 (``-m gpu`` test). The others
#: it may take (4:4:0, 4:1:1, 4:1:0) stay with nvJPEG's own check: no test file of those could be made here.
_HARDWARE_LUMA = frozenset({(1, 1), (2, 1), (2, 2)})
#: Component identifiers of YCbCr frames as libjpeg and most encoders write them; others (``R``, ``G``, ``B``) may
#: mean RGB to a decoder.
_YCBCR_IDS = frozenset({(1, 2, 3), (0, 1, 2)})
#: Segments read past by their length: DHT, DQT (checked), DRI, COM, APP0-APP15 (APP14 checked). Any other marker
#: before the scan (another frame type, arithmetic conditioning, DNL, hierarchical, reserved codes, ``FF 00``) gives
#: None: a decoder may read such bytes otherwise than this walk does (libjpeg skips an ``FF 00`` and looks further).
_SKIPPED = frozenset({0xC4, 0xDB, 0xDD, 0xFE, *range(0xE0, 0xF0)})
#: Markers that must not follow the first scan of a baseline single-scan JPEG: a frame, a scan, DNL, DAC, DHP, EXP.
_AFTER_SCAN = re.compile(rb"\xff[\xc0-\xc3\xc5-\xcf\xda\xdc\xde\xdf]")
_ADOBE_YCBCR = 1  # the Adobe marker's transform for YCbCr; 0 means the three channels are stored as they are


def hardware_size(raw: bytes | bytearray | memoryview) -> tuple[int, int] | None:
    """(height, width) of a JPEG that nvJPEG's hardware decoder takes, read from its header in Python; None when this
    reading cannot vouch for it (then :meth:`nvjpeg_batched.BatchedDecoder.decode` asks nvJPEG, as for any JPEG).

    The loader's workers call it, so that the producer thread does not read each header again through nvJPEG with
    the GIL held: 256 headers took 7.8 ms of each batch on an H200 (bench/RESULTS.md, nineteenth session). It vouches
    only for what it can read completely: a baseline (SOF0) Huffman JPEG of 8-bit samples and 8-bit quantization
    tables, gray or YCbCr (component ids 1-3 or 0-2) at 4:4:4, 4:2:2 or 4:2:0, the height in the frame header, one
    scan of every component, and before that scan nothing but the segments of :data:`_SKIPPED`; no frame, scan or DNL
    marker after it. The walk never raises: bytes it cannot read give None. It costs a worker about 90 us for a 170
    KB file on a 2-core x86 (most of it the search for markers after the scan, in C).
    """
    view = memoryview(raw).cast("B")
    end = len(view)
    if end < 4 or view[0] != 0xFF or view[1] != 0xD8:
        return None
    frame: tuple[int, int, int] | None = None
    at = 2
    while at + 4 <= end:
        if view[at] != 0xFF:
            return None
        marker = view[at + 1]
        if marker == 0xFF:  # a fill byte before the marker
            at += 1
            continue
        stop = at + 2 + ((view[at + 2] << 8) | view[at + 3])
        if stop > end:
            return None
        segment = view[at + 4 : stop]
        if marker == 0xDA:  # start of scan: the header is over
            if frame is None or len(segment) < 1 or segment[0] != frame[2] or _AFTER_SCAN.search(view, stop):
                return None
            return frame[0], frame[1]
        if marker == 0xC0:
            if frame is not None:
                return None
            frame = _baseline_frame(segment)
            if frame is None:
                return None
        elif marker == 0xDB:  # quantization tables: 65 bytes each at 8-bit precision (the high nibble 0)
            if len(segment) % 65 or any(segment[k] >> 4 for k in range(0, len(segment), 65)):
                return None
        elif marker == 0xEE and bytes(segment[:5]) == b"Adobe" and (len(segment) < 12 or segment[11] != _ADOBE_YCBCR):
            return None
        elif marker not in _SKIPPED:
            return None
        at = stop
    return None


def _baseline_frame(segment: memoryview) -> tuple[int, int, int] | None:
    """(height, width, components) from a SOF0 segment (after its length) when its samples and layout are the
    hardware's."""
    if len(segment) < 6:
        return None
    precision, height, width, components = struct.unpack_from(">BHHB", segment)
    if precision != 8 or height < 1 or width < 1 or components not in (1, 3) or len(segment) != 6 + 3 * components:
        return None
    ids, sampling, tables = tuple(segment[6::3]), tuple(segment[7::3]), tuple(segment[8::3])
    if max(tables) > 3:
        return None
    if components == 1:
        return (height, width, 1) if sampling[0] == 0x11 else None
    if ids not in _YCBCR_IDS or sampling[1:] != (0x11, 0x11):
        return None
    return (height, width, 3) if (sampling[0] >> 4, sampling[0] & 0x0F) in _HARDWARE_LUMA else None
