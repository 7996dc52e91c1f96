"""GPU time per step by kind of kernel, from Nsight Systems' kernel summary of a profiling window: how much of a step
is convolutions and GEMMs (compute-bound, cuDNN/cuBLAS) and how much the memory-bound rest (batch norm, ReLU, adds,
pooling; Triton kernels when compiled), which bounds what faster kernels of each kind could buy.

    nsys profile -s none -t cuda,nvtx --capture-range=cudaProfilerApi --capture-range-end=stop \\
        [--cuda-graph-trace=node] -o win python train.py --config ... --profile.start_step 20 --profile.num_steps 5
    nsys stats --report cuda_gpu_kern_sum --format csv -o win win.nsys-rep
    python bench/kernel_classes.py win_cuda_gpu_kern_sum.csv --steps 5 [--top 10]

Under CUDA graphs (``model.compile: reduce-overhead``) nsys sees the kernels inside a replayed graph only with
``--cuda-graph-trace=node``. Prints two Markdown tables: per class, ms per step, share and kernels per step; then the
longest kernels by total time.
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from pathlib import Path

CONV = "conv/GEMM (cuDNN, cuBLAS, Triton templates)"
TRITON_REDUCTION = "Triton reductions (batch norm statistics, their backward)"
TRITON_POINTWISE = "Triton pointwise (normalize, ReLU, adds, pooling)"
BATCH_NORM = "batch norm (ATen, cuDNN)"
POOLING = "pooling (ATen)"
OPTIMIZER = "optimizer and other foreach work (ATen)"
ELEMENTWISE = "elementwise and reductions (ATen)"
#: (class, pattern on the kernel's name), first match wins. Triton's kernels first: their names spell the ATen ops
#: they fuse ("..._native_batch_norm_..._convolution_backward_..."), and its conv/GEMM templates (``triton_tem_``,
#: under max-autotune) are convolutions. cuDNN's own batch norm (``bn_fw_tr_1C11_...``: NCHW, fp32) before the rest
#: of cuDNN; cuBLASLt's ``nvjet`` kernels with cuDNN's (an H200 ResNet-50 step launched 28 of them, far more than its
#: one fc layer's three GEMMs: most likely cuDNN 9 running 1x1 convolutions on them).
#: ``multi_tensor`` is the fused/foreach optimizer, and also AMP's unscale and other foreach work.
CLASSES = (
    (CONV, r"^triton_tem_"),
    (TRITON_REDUCTION, r"^triton_(red|per)_"),
    (TRITON_POINTWISE, r"^triton_"),
    (BATCH_NORM, r"batch_norm|(^|::)bn_(fw|bw)_"),
    (CONV, r"xmma|cutlass|implicit_gemm|nvjet|gemm|dgrad|wgrad|fprop|winograd|fft|cudnn|conv2d|convolve"
           r"|nhwcAddPadding|nchwToNhwc|nhwcToNchw"),
    (POOLING, r"pool"),
    (OPTIMIZER, r"multi_tensor|sgd|Sgd"),
    (ELEMENTWISE, r"elementwise|reduce_kernel|vectorized"),
)  # fmt: skip
OTHER = "other"
COLUMNS = ("Total Time (ns)", "Instances", "Name")


def kernel_class(name: str) -> str:
    """The class of a kernel (``OTHER`` when no pattern matches)."""
    return next((label for label, pattern in CLASSES if re.search(pattern, name)), OTHER)


def read_summary(path: Path) -> list[tuple[str, float, int]]:
    """``(name, total ns, instances)`` per kernel of a ``nsys stats --report cuda_gpu_kern_sum --format csv`` file."""
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or ())]
        if missing:
            raise ValueError(
                f"{path}: no column {', '.join(missing)}; expected the CSV of `nsys stats --report cuda_gpu_kern_sum "
                "--format csv`"
            )
        return [(row["Name"], float(row["Total Time (ns)"]), int(row["Instances"])) for row in reader]


def by_class(kernels: list[tuple[str, float, int]], steps: int) -> list[tuple[str, float, float, float]]:
    """``(class, ms per step, share of the kernel time, kernels per step)``, largest first."""
    total_ns = sum(ns for _, ns, _ in kernels)
    sums: dict[str, list[float]] = {}
    for name, ns, count in kernels:
        entry = sums.setdefault(kernel_class(name), [0.0, 0.0])
        entry[0] += ns
        entry[1] += count
    rows = [(label, ns / 1e6 / steps, ns / total_ns if total_ns else 0.0, n / steps) for label, (ns, n) in sums.items()]
    return sorted(rows, key=lambda row: -row[1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("csv", type=Path, help="nsys stats --report cuda_gpu_kern_sum --format csv output")
    p.add_argument(
        "--steps",
        type=int,
        default=1,
        help="training steps the report holds (the window's length); nsys sums every process it traced, so for a "
        "report of N ranks give steps x N for the time a step per GPU",
    )
    p.add_argument("--top", type=int, default=10, help="longest kernels to list by total time")
    a = p.parse_args(argv)
    if a.steps < 1 or a.top < 0:
        p.error(f"--steps must be >= 1 and --top >= 0 (got {a.steps}, {a.top})")
    try:
        kernels = read_summary(a.csv)
    except (OSError, ValueError) as error:
        sys.exit(f"kernel_classes: {error}")
    if not kernels:
        sys.exit(f"kernel_classes: {a.csv} lists no kernels (was the window captured with -t cuda?)")
    rows = by_class(kernels, a.steps)
    print(f"{sum(ms for _, ms, _, _ in rows):.2f} ms of kernels a step ({a.steps} steps)\n")
    print("| kernels | ms a step | share | kernels a step |\n|---|---|---|---|")
    for label, ms, share, count in rows:
        print(f"| {label} | {ms:.2f} | {100 * share:.1f}% | {count:g} |")
    if a.top:
        print("\n| longest kernels (total) | ms a step | instances a step | class |\n|---|---|---|---|")
        for name, ns, count in sorted(kernels, key=lambda k: -k[1])[: a.top]:
            short = name if len(name) <= 90 else name[:87] + "..."
            print(f"| `{short}` | {ns / 1e6 / a.steps:.2f} | {count / a.steps:g} | {kernel_class(name)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
