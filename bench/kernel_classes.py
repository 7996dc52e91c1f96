"""GPU time per step by kind of kernel, from Nsight Systems' kernel summary of a profiling window: how much of a step
is convolutions and GEMMs (compute-bound, cuDNN/cuBLAS) and how much the memory-bound rest (batch norm, ReLU, adds,
pooling; Triton kernels when compiled), which bounds what faster kernels of each kind could buy.

    nsys profile -s none -t cuda,nvtx --capture-range=cudaProfilerApi --capture-range-end=stop \\
        [--cuda-graph-trace=node] -o win python train.py --config ... --profile.start_step 20 --profile.num_steps 5
    nsys stats --force-export=true --report cuda_gpu_kern_sum --format csv -o win win.nsys-rep
    python bench/kernel_classes.py win_cuda_gpu_kern_sum.csv --steps 5 [--top 10]

Under CUDA graphs (``model.compile: reduce-overhead``) nsys sees the kernels inside a replayed graph only with
``--cuda-graph-trace=node``. Prints two Markdown tables: per class, ms per step, share and kernels per step; then the
longest kernels by total time.

Before and after a change, the kernel side of ``step_report.py --compare`` (which says which phase moved)::

    python bench/kernel_classes.py before_cuda_gpu_kern_sum.csv --steps 5 --compare after_cuda_gpu_kern_sum.csv

prints each class's ms a step in both, their difference and ratio, then the kernels whose time a step changed most
(``new`` and ``gone`` for kernels only one report ran: a compiled model's Triton kernels against eager ATen ones).
Kernel names are printed without their parameter lists and cut in the middle, whole where a cut name would match
another (``--full-names``: every name whole).
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
        kernels = []
        for row in reader:
            try:
                if not isinstance(row["Name"], str):
                    raise ValueError("no Name field (a row cut short)")
                kernels.append((row["Name"], float(row["Total Time (ns)"]), int(row["Instances"])))
            except (TypeError, ValueError) as error:  # a value that is no number, or none (a short row)
                raise ValueError(f"{path}, line {reader.line_num}: {error}") from error
        return kernels


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


def compare_classes(a: list[tuple[str, float, int]], b: list[tuple[str, float, int]], steps_a: int, steps_b: int
                    ) -> list[tuple[str, float, float]]:  # fmt: skip
    """``(class, A's ms a step, B's)`` for every class either ran, B's largest change first, then ``all kernels``."""
    ms_a = {label: ms for label, ms, _, _ in by_class(a, steps_a)}
    ms_b = {label: ms for label, ms, _, _ in by_class(b, steps_b)}
    rows = [(label, ms_a.get(label, 0.0), ms_b.get(label, 0.0)) for label in dict.fromkeys([*ms_a, *ms_b])]
    rows.sort(key=lambda row: -abs(row[2] - row[1]))
    return [*rows, ("all kernels", sum(ms_a.values()), sum(ms_b.values()))]


def kernel_changes(a: list[tuple[str, float, int]], b: list[tuple[str, float, int]], steps_a: int, steps_b: int,
                   top: int) -> list[tuple[str, float, float, str]]:  # fmt: skip
    """``(name, A's ms a step, B's, status)`` of the ``top`` kernels whose time a step changed most; status ``new``
    (only B ran it), ``gone`` (only A) or empty. Kernels of one name are summed (nsys lists one row per name)."""
    ms_a: dict[str, float] = {}
    ms_b: dict[str, float] = {}
    for kernels, ms, steps in ((a, ms_a, steps_a), (b, ms_b, steps_b)):
        for name, ns, _ in kernels:
            ms[name] = ms.get(name, 0.0) + ns / 1e6 / steps
    names = sorted(dict.fromkeys([*ms_a, *ms_b]), key=lambda n: -abs(ms_b.get(n, 0.0) - ms_a.get(n, 0.0)))
    return [
        (
            name,
            ms_a.get(name, 0.0),
            ms_b.get(name, 0.0),
            "new" if name not in ms_a else "gone" if name not in ms_b else "",
        )
        for name in names[:top]
    ]


def _without_parameters(name: str) -> str:
    """A demangled kernel's name without ``void`` and its parameter list (``(const T1 *, int, ...)``: template
    placeholders, the same for every kernel of a template)."""
    name = name.removeprefix("void ")
    if name.endswith(")"):
        depth = 0
        for i in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0:
                return name[:i] if i > 0 and name[i - 1] == ">" else name
    return name


def short_names(names: list[str], width: int = 90) -> list[str]:
    """``names`` within ``width`` characters where that keeps them apart: each without its parameter list, cut in the
    middle (ATen's kernels share a long prefix, ``at::native::elementwise_kernel<(int)128, (int)2, ...``, and
    Triton's end in their number); names that would then print alike are shown whole, without their parameters."""
    bare = [_without_parameters(name) for name in names]
    head = (width - 3) // 2
    cut = [b if len(b) <= width else b[:head] + "..." + b[-(width - 3 - head) :] for b in bare]
    counts = {c: cut.count(c) for c in cut}
    return [c if counts[c] == 1 else b for b, c in zip(bare, cut, strict=True)]


def _ratio(a: float, b: float) -> str:
    return f"{b / a:.3f}" if a > 0 else "-"


def _print_comparison(a: list, b: list, args: argparse.Namespace, width: int) -> None:
    steps_b = args.steps_b or args.steps
    print(f"A: {args.csv} ({args.steps} steps), B: {args.compare} ({steps_b} steps)\n")
    print("| kernels | A ms a step | B ms a step | B - A | B / A |\n|---|---|---|---|---|")
    for label, ms_a, ms_b in compare_classes(a, b, args.steps, steps_b):
        print(f"| {label} | {ms_a:.2f} | {ms_b:.2f} | {ms_b - ms_a:+.2f} | {_ratio(ms_a, ms_b)} |")
    if args.top:
        print("\n| kernels that changed most | A ms a step | B ms a step | B - A | |\n|---|---|---|---|---|")
        changes = kernel_changes(a, b, args.steps, steps_b, args.top)
        for short, (_, ms_a, ms_b, status) in zip(short_names([c[0] for c in changes], width), changes, strict=True):
            print(f"| `{short}` | {ms_a:.3f} | {ms_b:.3f} | {ms_b - ms_a:+.3f} | {status} |")


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
    p.add_argument("--top", type=int, default=10, help="longest kernels to list by total time (with --compare: the "
                   "kernels whose time changed most)")  # fmt: skip
    p.add_argument("--compare", type=Path, metavar="CSV_B", help="a second kernel summary (B) to compare the first (A) "
                   "with, class by class and kernel by kernel")  # fmt: skip
    p.add_argument("--steps-b", type=int, help="steps B's report holds, when not --steps")
    p.add_argument("--full-names", action="store_true", help="kernel names whole (without their parameter lists), "
                   "not cut to 90 characters")  # fmt: skip
    a = p.parse_args(argv)
    if a.steps < 1 or a.top < 0 or (a.steps_b is not None and a.steps_b < 1):
        p.error(f"--steps must be >= 1, as must --steps-b, and --top >= 0 (got --steps {a.steps}, --steps-b "
                f"{a.steps_b}, --top {a.top})")  # fmt: skip
    if a.steps_b is not None and a.compare is None:
        p.error("--steps-b is B's step count: it needs --compare CSV_B")
    summaries = []
    for path in (a.csv, *([a.compare] if a.compare else [])):
        try:
            kernels = read_summary(path)
        except (OSError, ValueError) as error:  # UnicodeDecodeError is a ValueError without the path
            sys.exit(f"kernel_classes: {error if str(path) in str(error) else f'{path}: {error}'}")
        if not kernels:
            sys.exit(f"kernel_classes: {path} lists no kernels (was the window captured with -t cuda?)")
        summaries.append(kernels)
    width = sys.maxsize if a.full_names else 90
    if a.compare:
        _print_comparison(*summaries, a, width)
        return 0
    kernels = summaries[0]
    rows = by_class(kernels, a.steps)
    print(f"{sum(ms for _, ms, _, _ in rows):.2f} ms of kernels a step ({a.steps} steps)\n")
    print("| kernels | ms a step | share | kernels a step |\n|---|---|---|---|")
    for label, ms, share, count in rows:
        print(f"| {label} | {ms:.2f} | {100 * share:.1f}% | {count:g} |")
    if a.top:
        print("\n| longest kernels (total) | ms a step | instances a step | class |\n|---|---|---|---|")
        longest = sorted(kernels, key=lambda k: -k[1])[: a.top]
        for short, (name, ns, count) in zip(short_names([k[0] for k in longest], width), longest, strict=True):
            print(f"| `{short}` | {ns / 1e6 / a.steps:.2f} | {count / a.steps:g} | {kernel_class(name)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
