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

With both ``rgb`` and ``yuv`` among ``--formats``, a second table compares the two outputs of the same JPEGs: the RGB
that JFIF's YCbCr conversion (:func:`yuv_to_rgb`) gives from the YUV planes, their chroma upsampled by nearest
neighbour or bilinearly (:func:`upsample`), against nvJPEG's own RGB, pixel by pixel and after a 224 x 224 antialiased
resize of the whole image; and, resized, the conversion done after the resize (linear, so the planes can be resized
first and only the output converted) without the per-pixel rounding and clamping. It says how closely a crop kernel
reading the YUV planes would reproduce what the app reads now. On an H200 (fortieth session, 128 JPEGs, 4:2:0):
nearest chroma gives nvJPEG's RGB on 99.99% of the values (max 1), bilinear up to 96 off; converted after the resize,
up to 25.6 off (mean 0.42).
"""

from __future__ import annotations

import argparse
import ctypes
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FORMATS = {"rgb": 3, "rgbi": 5, "yuv": 1}  # nvjpegOutputFormat_t
PREALLOCATE_SIDE = 512
WARMUP = 3
#: Side of the resize the second table compares after (the app's crop size).
COMPARE_SIZE = 224
#: How :func:`upsample` may bring a chroma plane to the image's size.
UPSAMPLING = ("nearest", "bilinear")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
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
        components = [probe.image_info(k, jpeg)[0] for k, jpeg in enumerate(jpegs)]
    finally:
        probe.close()
    refused = [str(chosen[k]) for k, size in enumerate(sizes) if size is None]
    if refused:
        sys.exit(f"nvjpeg_formats.py: the hardware decoder does not take {len(refused)} of the files: {refused[:3]}")
    lib, stream = nb.library(), torch.cuda.current_stream()
    data = (ctypes.c_void_p * a.count)(*[jpeg.data_ptr() for jpeg in jpegs])
    lengths = (ctypes.c_size_t * a.count)(*[jpeg.numel() for jpeg in jpegs])
    print("| output | wall ms a call | SM kernels a call | copies a call |\n|---|---|---|---|")
    outputs: dict[str, Any] = {}
    for name in a.formats:
        fmt = FORMATS[name]
        # The app's decoder makes the handle, state and parser (and frees them); only the preallocation's format is
        # this script's own: BatchedDecoder preallocates for planar RGB, what the app decodes to.
        decoder = nb.BatchedDecoder("cuda", a.count, PREALLOCATE_SIDE, PREALLOCATE_SIDE, preallocate=False)
        try:
            handle, state = decoder.handle, decoder.state
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
            outputs[name] = (out, planes)
        finally:
            decoder.close()

    if "rgb" in outputs and "yuv" in outputs:
        rgb = [_plane_views(*outputs["rgb"], k, [size] * 3) for k, size in enumerate(sizes)]
        yuv = [_plane_views(*outputs["yuv"], k, components[k]) for k in range(a.count)]
        print(f"\n{compare(rgb, yuv)}")


def _plane_views(out, planes, k: int, shapes: list[tuple[int, int]]) -> list:
    """Image ``k``'s planes in the buffer ``out`` as ``(height, width)`` views of their rows (pitch apart)."""
    views = []
    for (offset, pitch), (height, width) in zip(planes[k], shapes, strict=False):
        views.append(out[offset : offset + height * pitch].view(height, pitch)[:, :width])
    return views


def upsample(plane, height: int, width: int, how: str):
    """A chroma plane (float ``(h, w)``) brought to ``height x width``: each sample repeated over the luma pixels it
    covers (``nearest``) or interpolated between sample centers (``bilinear``, libjpeg's "fancy" upsampling at 2x)."""
    import torch.nn.functional as F

    factor_y, factor_x = -(-height // plane.shape[0]), -(-width // plane.shape[1])
    if how == "nearest":
        full = plane.repeat_interleave(factor_y, 0).repeat_interleave(factor_x, 1)
    elif how == "bilinear":
        size = (plane.shape[0] * factor_y, plane.shape[1] * factor_x)
        full = F.interpolate(plane[None, None], size=size, mode="bilinear", align_corners=False)[0, 0]
    else:
        raise ValueError(f"upsampling {how!r}: valid are {', '.join(UPSAMPLING)}")
    return full[:height, :width]


def yuv_to_rgb(y, cb, cr):
    """JFIF's YCbCr to RGB (full range, BT.601 weights) of float planes of one size, neither rounded nor clamped."""
    import torch

    cb, cr = cb - 128.0, cr - 128.0
    return torch.stack((y + 1.402 * cr, y - 0.344136 * cb - 0.714136 * cr, y + 1.772 * cb))


def _full_yuv(yuv: list, how: str):
    """Float ``(3, H, W)`` Y, Cb, Cr of one image, the chroma upsampled ``how`` (a gray image: Cb = Cr = 128)."""
    import torch

    y = yuv[0].float()
    if len(yuv) == 1:
        return torch.stack((y, torch.full_like(y, 128.0), torch.full_like(y, 128.0)))
    return torch.stack([y, *(upsample(plane.float(), *y.shape, how) for plane in yuv[1:3])])


def compare(rgb: list, yuv: list, size: int = COMPARE_SIZE) -> str:
    """A Markdown table: how far RGB converted from each image's planes ``yuv`` is from nvJPEG's ``rgb``, over all
    images (pixels of 0..255): per pixel (rounded and clamped to uint8, as nvJPEG's output is) and after an antialiased
    resize of the whole image to ``size`` (of the per-pixel conversion, and of the conversion after the resize)."""
    import torch
    import torch.nn.functional as F

    def resized(image):
        return F.interpolate(image[None], size=(size, size), mode="bilinear", antialias=True)[0]

    rows = {}
    for how in UPSAMPLING:
        pixel, small, linear = [], [], []
        for reference, planes in zip(rgb, yuv, strict=True):
            reference = torch.stack(reference).float()
            full = _full_yuv(planes, how)
            converted = yuv_to_rgb(*full).round().clamp(0, 255)
            pixel.append((converted - reference).abs().flatten())
            target = resized(reference)
            small.append((resized(converted) - target).abs().flatten())
            linear.append((yuv_to_rgb(*resized(full)).clamp(0, 255) - target).abs().flatten())
        for label, diffs in (("per pixel", pixel), ("resized", small), ("resized, converted after", linear)):
            d = torch.cat(diffs)
            rows[f"{how}, {label}"] = (d.max().item(), d.mean().item(), (d == 0).float().mean().item(),
                                       (d <= 1).float().mean().item())  # fmt: skip
    lines = ["| chroma upsampling, compared | max | mean | exact | within 1 |", "|---|---|---|---|---|"]
    lines += [f"| {name} | {m:.2f} | {mean:.4f} | {exact:.4f} | {one:.4f} |" for name, (m, mean, exact, one) in
              rows.items()]  # fmt: skip
    return "\n".join(lines)


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
