"""nvJPEG's hardware batched decoder in several output formats: each call's wall time, the kernels it runs on the SMs
and its copies, side by side.

    python bench/nvjpeg_formats.py --data DIR [--count 128] [--calls 10] [--formats rgb,rgbi,yuv,rgb]

Decodes the same ``--count`` JPEGs of ``DIR/train`` (page-locked, as gpu_decode.py stages them) with a handle of its
own on the hardware backend, its buffers preallocated for ``--count`` images of 512 x 512 (as ``data.nvjpeg:
preallocated``), in each format of ``--formats`` in turn: three untimed calls, ``--calls`` timed ones (each waits for
its stream), then ``--calls`` under the Kineto profiler. One Markdown table: the median wall time of a call, the kernels
a call ran on the SMs (count, GPU ms, names) and its copies and memsets (kind, count, GPU ms).

``rgb`` is planar RGB, what the app decodes to; ``rgbi`` interleaved RGB; ``yuv`` the JPEG's own planes (each given a
full-size plane here). On an H200 (bench/RESULTS.md, thirty-seventh session), 128 JPEGs of 300-500 px: planar and
interleaved RGB ran one ``rgba2rgb`` kernel per image on the SMs (0.37-0.39 ms a call), YUV none but three
device-to-device copies per image (0.70 ms), its call 1.0-1.3 ms longer: the figures of the session script this one was
made from (the same calls, mean wall times). This script, on another H200 (thirty-ninth session): rgb 5.15 and 5.13 ms
a call, 128 ``rgba2rgb`` 0.38 ms; rgbi 5.10, 0.38 ms; yuv 6.03, none, 384 device-to-device copies 0.71 ms.
"""

from __future__ import annotations

import argparse
import ctypes
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FORMATS = {"rgb": 3, "rgbi": 5, "yuv": 1}  # nvjpegOutputFormat_t
PREALLOCATE_SIDE = 512
WARMUP = 3


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="JPEG folder: DIR/train/<class>/*.JPEG (bench/make_jpeg_folder.py)")
    p.add_argument("--count", type=int, default=128, help="JPEGs per call")
    p.add_argument("--calls", type=int, default=10, help="timed calls per format (after three untimed)")
    p.add_argument("--formats", default="rgb,rgbi,yuv,rgb", help=f"comma-separated, of {', '.join(FORMATS)}")
    p.add_argument("--seed", type=int, default=1, help="which JPEGs of the folder")
    a = p.parse_args(argv)
    if a.count < 1 or a.calls < 1:
        p.error(f"--count and --calls must be at least 1, got {a.count} and {a.calls}")
    a.formats = a.formats.split(",")
    unknown = [name for name in a.formats if name not in FORMATS]
    if unknown:
        p.error(f"--formats: unknown {', '.join(map(repr, unknown))}; valid: {', '.join(FORMATS)}")
    sys.path.insert(0, str(ROOT))
    from resize_dataset import image_files  # the training images as the app's dataset finds them

    a.files = [Path(a.data) / name for name in image_files(Path(a.data), ("train",))]
    if len(a.files) < a.count:
        p.error(f"--data: {Path(a.data, 'train')} holds {len(a.files)} files in class folders, --count wants {a.count}")
    return a


def layout(sizes: list[tuple[int, int]], name: str) -> tuple[int, list[list[tuple[int, int]]]]:
    """Bytes of one output buffer for images of ``sizes`` (height, width) in format ``name``, and each image's planes
    as (offset, pitch): three planes of ``height x width`` (``rgb``, ``yuv``: nvJPEG writes the subsampled chroma
    planes into the first rows of theirs) or one of ``height x 3 width`` (``rgbi``)."""
    offset, planes = 0, []
    for height, width in sizes:
        if name == "rgbi":
            planes.append([(offset, 3 * width)])
        else:
            planes.append([(offset + c * height * width, width) for c in range(3)])
        offset += 3 * height * width
    return offset, planes


def main(argv: list[str] | None = None) -> None:
    a = parse(argv)
    import torch
    from torch.profiler import ProfilerActivity, profile

    import nvjpeg_batched as nb  # ROOT is on the path since parse

    if not torch.cuda.is_available():
        sys.exit("nvjpeg_formats.py: needs a CUDA GPU with nvJPEG's hardware decoder (A100, H100, H200)")
    chosen = random.Random(a.seed).sample(a.files, a.count)
    jpegs = [torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.uint8).pin_memory() for path in chosen]
    probe = nb.BatchedDecoder("cuda", a.count, PREALLOCATE_SIDE, PREALLOCATE_SIDE)
    try:
        sizes = [probe._inspect(k, jpeg) for k, jpeg in enumerate(jpegs)]
    finally:
        probe.close()
    refused = [str(chosen[k]) for k, size in enumerate(sizes) if size is None]
    if refused:
        sys.exit(f"nvjpeg_formats.py: the hardware decoder does not take {len(refused)} of the files: {refused[:3]}")
    lib, stream = nb.library(), torch.cuda.current_stream()
    data = (ctypes.c_void_p * a.count)(*[jpeg.data_ptr() for jpeg in jpegs])
    lengths = (ctypes.c_size_t * a.count)(*[jpeg.numel() for jpeg in jpegs])
    print("| output | wall ms a call | SM kernels a call | copies a call |\n|---|---|---|---|")
    for name in a.formats:
        fmt = FORMATS[name]
        handle, state = ctypes.c_void_p(), ctypes.c_void_p()
        nb._check("nvjpegCreateEx", lib.nvjpegCreateEx(nb.BACKEND_HARDWARE, None, None, 0, ctypes.byref(handle)))
        try:
            nb._check("nvjpegJpegStateCreate", lib.nvjpegJpegStateCreate(handle, ctypes.byref(state)))
            nb._check("nvjpegDecodeBatchedPreAllocate", lib.nvjpegDecodeBatchedPreAllocate(
                handle, state, a.count, PREALLOCATE_SIDE, PREALLOCATE_SIDE, nb.CSS_444, fmt
            ))  # fmt: skip
            total, planes = layout(sizes, name)  # type: ignore[arg-type]
            out = torch.empty(total, dtype=torch.uint8, device="cuda")
            images = (nb.NvjpegImage * a.count)()
            for row, image_planes in enumerate(planes):
                for c, (offset, pitch) in enumerate(image_planes):
                    images[row].channel[c], images[row].pitch[c] = out.data_ptr() + offset, pitch

            call = (lib, nb, handle, state, a.count, fmt, data, lengths, images, stream)
            for _ in range(WARMUP):
                _decode(*call)
            walls = []
            for _ in range(a.calls):
                start = time.perf_counter()
                _decode(*call)
                walls.append((time.perf_counter() - start) * 1e3)
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(a.calls):
                    _decode(*call)
            print(f"| {name} | {statistics.median(walls):.2f} | {_summary(prof, a.calls, copies=False)} | "
                  f"{_summary(prof, a.calls, copies=True)} |")  # fmt: skip
        finally:
            if state:
                lib.nvjpegJpegStateDestroy(state)
            lib.nvjpegDestroy(handle)


def _decode(lib, nb, handle, state, count, fmt, data, lengths, images, stream) -> None:
    """One batched call in format ``fmt``, waited for: the state's buffers are reused by the next call."""
    nb._check("nvjpegDecodeBatchedInitialize", lib.nvjpegDecodeBatchedInitialize(handle, state, count, 1, fmt))
    nb._check("nvjpegDecodeBatched", lib.nvjpegDecodeBatched(
        handle, state, ctypes.cast(data, ctypes.c_void_p), ctypes.cast(lengths, ctypes.c_void_p), images,
        ctypes.c_void_p(stream.cuda_stream),
    ))  # fmt: skip
    stream.synchronize()


def _summary(prof, calls: int, copies: bool) -> str:
    """The profiled GPU activities a call, kernels or else copies and memsets: count and GPU ms by name."""
    import torch

    by_name: dict[str, list[float]] = {}
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        if ("emcpy" in event.name or "emset" in event.name) == copies:
            entry = by_name.setdefault(event.name[:60], [0, 0.0])
            entry[0] += 1
            entry[1] += event.device_time
    if not by_name:
        return "none"
    return "; ".join(f"{name}: {count / calls:g}, {us / calls / 1e3:.3f} ms" for name, (count, us) in by_name.items())


if __name__ == "__main__":
    main()
