"""Training throughput of the app against the plain PyTorch loop, side by side in one run, on one machine.

Each variant runs in its own process (a fresh CUDA context and clean peak-memory counters) and prints one JSON
line; the parent prints a Markdown table with ratios to the plain loop.

    python bench/throughput.py --arch resnet50 --precision bf16 --channels-last            # eager
    python bench/throughput.py --arch resnet50 --precision fp16 --channels-last --compile
    python bench/throughput.py ... --compile --variants raw,app_synthetic,app_synthetic:max-autotune-no-cudagraphs
    python bench/throughput.py ... --compile --variants app_synthetic:reduce-overhead,app_folder_gpu@0.8:reduce-overhead
    python bench/throughput.py ... --variants raw,app_synthetic,app_nvtx,app_folder --data /data/jpegs
    python bench/throughput.py ... --gpus 1,2 --launcher torchrun      # DDP scaling, each variant on 1 and 2 GPUs
    taskset -c 0-15 python bench/throughput.py ... --workers 14 --variants app_synthetic,app_folder_gpu@0.7
    python bench/throughput.py ... --compile --inductor conv_1x1_as_mm=true --child app_synthetic:reduce-overhead
    python bench/throughput.py --arch resnet50 --channels-last --data /data/jpegs \
        --matrix fp16:eager,bf16:eager,fp16:reduce-overhead,bf16:reduce-overhead \
        --variants raw,app_synthetic,app_folder_gpu_preallocated_tv@0.5      # every configuration in one table

Variants:
    raw            the plain loop (.carry/raw_loop.py, or --raw-loop PATH): synthetic data on the GPU
    app_synthetic  the app (ImageNetClassifier + ImageNetDataModule(source=synthetic) + Trainer), same config
    app_synthetic_foreach  the same with model.fused_sgd=false: torch's default SGD (foreach on CUDA), as the plain
                   loop steps (under fp16, GradScaler then reads its overflow check back to the host every step)
    app_nvtx       as app_synthetic with the profiling callback's NVTX step/phase ranges on: the cost of the ranges
                   outside a window (its window opens on one more step, after the timed ones)
    app_folder     the app on a JPEG folder (--data): PIL decode + crop in the workers, the prefetcher's copy
    app_folder_tv  the same with data.cpu_decoder=torchvision: torchvision's decode and torch's uint8 resize in the
                   workers (cpu_decode.py) instead of PIL's
    app_folder_gpu the app on the same folder with data.decode=gpu: nvJPEG decode + crop/resize/flip on the GPU
    app_folder_gpu@S  the same with data.cpu_decode_share=S: the workers decode that share of the files with PIL
                   (data.cpu_decoder=pil in every app_folder_gpu row but the next, as the rows measured before that
                   option)
    app_folder_gpu_tv@S  the split with data.cpu_decoder=torchvision: the workers' share decoded by torchvision
                   (_tv also after _preallocated: app_folder_gpu_preallocated_tv@S); without @S the same as
                   app_folder_gpu (the files nvJPEG must not get are not plain JPEGs: PIL decodes them either way)
    app_folder_gpu_pageable[@S]  the same, with the batch's host memory left pageable (gpu_decode._staged bypassed):
                   the finished crops, the JPEG bytes nvJPEG copies and the crop table go to the GPU from the worker's
                   buffer, as before they were staged in page-locked memory: that change side by side
    app_folder_gpu_preallocated[@S]  app_folder_gpu[@S] with data.nvjpeg=preallocated (nvjpeg_batched.py's decoder)
    app_folder_gpu_onegroup[@S]  app_folder_gpu[@S] with the crop's torch ops (as +torchcrop) resizing the whole batch
                   as one group, padded to its largest crop (gpu_decode.MAX_PADDED_PIXELS 256 x 512 x 512, the old
                   default, which never split a batch of 256)
    APP_VARIANT+threads=N  an app_folder_gpu variant with data.decode_threads=N: N threads decode batches at once
                   (producer_threads.py), e.g. app_folder_gpu_preallocated_tv@0.5:reduce-overhead+threads=2; on any
                   GPU count
    APP_VARIANT+torchcrop  an app_folder_gpu variant whose GPU crop, resize and flip run as batched torch ops (about 47
                   a group of crops; gpu_decode.CROP_KERNEL = torch) instead of gpu_crop_kernel.py's one Triton launch
                   a batch, e.g. app_folder_gpu_preallocated_tv@0.5+torchcrop next to app_folder_gpu_preallocated_tv@0.5
    APP_VARIANT+OPTION[+OPTION]  an app variant with options of torch's DistributedDataParallel (under DDP only):
                   +bucket_view (gradient_as_bucket_view: gradients are views into the all-reduce buckets, no copy),
                   +static_graph, +bucket_mb=N (bucket_cap_mb, torch's default 25), e.g. app_synthetic+bucket_view;
                   on 1 GPU (no DDP) such a variant listed after its base shows the base's row, marked "(= base)"
    APP_VARIANT:MODE  an app variant compiled with torch.compile mode MODE (under --compile only): default,
                   reduce-overhead (CUDA graphs), max-autotune, max-autotune-no-cudagraphs (ImageNetClassifier's
                   model.compile); without one an app variant under --compile uses default. The plain loop always
                   compiles with the default mode: raw takes no suffix. e.g. app_synthetic:reduce-overhead next to
                   app_synthetic; a folder row is compared with the app_synthetic row of its own mode if listed
    APP_VARIANT:MODE:tuned  the same with model.compile_tuning (inductor's coordinate-descent tuning of each Triton
                   kernel at its first run), e.g. app_synthetic:reduce-overhead:tuned next to
                   app_synthetic:reduce-overhead

    Order: NAME[@SHARE][:MODE[:tuned]][+OPTION...], e.g. app_folder_gpu@0.85:reduce-overhead+bucket_view. The full
    string names the row in the table.

``--matrix PRECISION:eager|PRECISION:MODE[:tuned],...`` runs every variant in each configuration (precision, and
eager or compiled with that torch.compile mode, the plain loop with the default one, as under --compile), one
after the other, and prints one table with a config column; each configuration's ratios are to its own raw and
app_synthetic rows. It stands for --precision and --compile, and the variants then take no ``:MODE``.

``--rounds N`` runs the variant list N times, each round in another order (rotated by one place, so that each variant
takes each place once in N rounds of N variants), and the table gives each row's median run (ratios between medians)
and every round's img/s in a last column. One run of a JPEG row is a weak figure: on an H200 the same fp16 eager
JPEG variant gave 4,320 and 5,690 img/s in two runs of one call, and a variant's place in the order seemed to move
it (bench/RESULTS.md, thirty-fifth session). A rotation changes each variant's place, not the variant before it
(but at the wrap), so an effect of the previous run is not balanced out. An odd N gives a true median; with an even
N the row is the lower of the two middle runs. Each round costs the whole list's time again. A variant listed twice runs
twice a round, and its one row is likewise the median of its runs.

``--inductor KEY=VALUE`` sets a ``torch._inductor.config`` option in every variant's process (one run per setting,
so settings compare as one process after the other). On ResNet-50 under ``reduce-overhead`` none of
``conv_1x1_as_mm``, ``aggressive_fusion`` and ``triton.enable_pdl`` beat the default's two runs, and PDL was 1.1-1.4%
slower (bench/RESULTS.md, fifteenth session).

Every process of a run (the plain loop's too) gets ``CUDA_DEVICE_MAX_CONNECTIONS`` from the environment, else the
app's 32 (cuda_env.py, as train.py sets it); the table names the value. ``CUDA_DEVICE_MAX_CONNECTIONS=8 python
bench/throughput.py ...`` runs with CUDA's default, for the comparison.

Memory: "peak GiB" is ``torch.cuda.max_memory_allocated`` (torch's caching allocator: what the tensors held at
their peak); "device GiB" is what the device had in use at the end of the timed steps (``cudaMemGetInfo``: the CUDA
context, the allocator's reserved pool, cuDNN's and nvJPEG's own buffers, which the first leaves out), the plain
loop's after its last step (under DDP after its ``destroy_process_group``, which frees NCCL's buffers: read the
column on one GPU).

Timing: steps after ``--warmup`` are timed between two ``torch.cuda.synchronize()`` calls, as raw_loop.py does. The
warm-up (default 20 steps eager, 60 compiled) is the same for every variant of a run whatever its compile mode, so that
the rows compare alike; under --matrix, for every variant of a configuration (20 in an eager one, 60 in a compiled one,
unless --warmup gives one count for all). Compilation happens in the warm-up and is not timed. max-autotune benchmarks
kernel choices while it compiles: on an H200 ResNet-50's variant took 405 s from the start of ``trainer.fit`` to the end
of its 110 steps, and in another call it did not finish in the roughly 440 s left (bench/RESULTS.md, eleventh session);
``reduce-overhead:tuned`` took 212-258 s, ``reduce-overhead`` 58-77 s (twelfth session). Allow for that in the time
limits around the run (``BENCH_STACKS_AFTER_S`` applies to each variant's process and prints its threads' stacks;
bench/gpu_session.sh's STAGE_TIMEOUT to the whole run). ``BENCH_STACKS_EVERY_S`` instead prints them at every such
interval and does not exit: to follow a long compile. Each variant's stderr passes through to this script's stderr as it
is written (its stdout is read for the result), so the stacks show while the variant runs, and stay in the log when a
time limit around the run stops it. Under DDP (``--gpus N`` with N > 1) the plain loop always runs under torchrun; the
app runs under Lightning's own launcher (``--launcher lightning``: it re-executes this script per rank) or under
torchrun. Images/s count all GPUs; "scaling" is img/s on N GPUs / (N x img/s of the same variant on 1 GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RAW_LOOP = ROOT / ".carry" / "raw_loop.py"  # what ../shared/device/prepare.sh puts there
PRECISIONS = {"fp32": "32-true", "tf32": "32-true", "fp16": "16-mixed", "bf16": "bf16-mixed"}
VARIANTS = (
    "raw",
    "app_synthetic",
    "app_synthetic_foreach",
    "app_nvtx",
    "app_folder",
    "app_folder_tv",
    "app_folder_gpu",
    "app_folder_gpu_tv",
    "app_folder_gpu_pageable",
    "app_folder_gpu_preallocated",
    "app_folder_gpu_preallocated_tv",
    "app_folder_gpu_onegroup",
)


DDP_OPTIONS = ("bucket_view", "static_graph", "bucket_mb=N")
# ImageNetClassifier's ``compile`` modes (torch.compile's ``mode``); tests/test_throughput_bench.py checks they match.
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def ddp_options(variant: str) -> tuple[str, dict]:
    """``app_synthetic+bucket_view+bucket_mb=50`` -> ``("app_synthetic", {"gradient_as_bucket_view": True,
    "bucket_cap_mb": 50.0})``: the variant without its DDP options, and the keyword arguments for torch's DDP.
    A compile mode stays with the variant (``app_synthetic:reduce-overhead+bucket_view`` ->
    ``app_synthetic:reduce-overhead``): it comes before the options; so do ``+threads=N`` (:func:`decode_threads`)
    and ``+torchcrop`` (:func:`crop_kernel`), which are no DDP options."""
    variant, *options = variant.split("+")
    if options and not variant.startswith("app_"):
        raise ValueError(f"options {'+'.join(options)!r}: only app variants take them, not {variant!r}")
    kwargs: dict = {}
    for option in options:
        key, eq, value = option.partition("=")
        if key == "threads" or option == "torchcrop":
            variant += "+" + option  # checked by decode_threads, crop_kernel
        elif option == "bucket_view":
            kwargs["gradient_as_bucket_view"] = True
        elif option == "static_graph":
            kwargs["static_graph"] = True
        elif key == "bucket_mb" and eq and value.replace(".", "", 1).isdigit() and float(value) > 0:
            kwargs["bucket_cap_mb"] = float(value)
        else:
            hint = " (a :MODE suffix goes before the +options)" if ":" in option else ""
            raise ValueError(
                f"unknown DDP option {option!r} in {variant}+...; valid: {', '.join(DDP_OPTIONS)} (N > 0){hint}"
            )
    return variant, kwargs


def decode_threads(variant: str) -> tuple[str, int]:
    """``app_folder_gpu@0.5:reduce-overhead+threads=2+bucket_view`` -> ``("app_folder_gpu@0.5:reduce-overhead
    +bucket_view", 2)``: the variant without ``+threads=N`` and its data.decode_threads (1 without one). Only
    ``app_folder_gpu`` variants take it, N from 1 to 8 (the data module's range), once."""
    head, *options = variant.split("+")
    counts = [option.partition("=")[2] for option in options if option.partition("=")[0] == "threads"]
    if not counts:
        return variant, 1
    if len(counts) > 1 or not counts[0].isdigit() or not 1 <= int(counts[0]) <= 8:
        raise ValueError(f"variant {variant!r}: one +threads=N with N from 1 to 8 (data.decode_threads)")
    if not head.startswith("app_folder_gpu"):
        raise ValueError(f"variant {variant!r}: +threads=N (data.decode_threads) applies to app_folder_gpu variants")
    rest = [option for option in options if option.partition("=")[0] != "threads"]
    return "+".join([head, *rest]), int(counts[0])


def crop_kernel(variant: str) -> tuple[str, str]:
    """``app_folder_gpu@0.5+torchcrop+threads=2`` -> ``("app_folder_gpu@0.5+threads=2", "torch")``: the variant
    without ``+torchcrop`` and its ``gpu_decode.CROP_KERNEL`` (``triton``, the default, without one). Only
    ``app_folder_gpu`` variants take it, once."""
    head, *options = variant.split("+")
    if "torchcrop" not in options:
        return variant, "triton"
    if options.count("torchcrop") > 1 or not head.startswith("app_folder_gpu"):
        raise ValueError(f"variant {variant!r}: +torchcrop (the GPU crop's torch ops) applies once to app_folder_gpu")
    return "+".join([head, *(option for option in options if option != "torchcrop")]), "torch"


def compile_mode(variant: str) -> tuple[str, str | None]:
    """``app_folder_gpu@0.85:reduce-overhead+bucket_view`` -> ``("app_folder_gpu@0.85+bucket_view",
    "reduce-overhead")``: the variant without its torch.compile mode, and the mode (None without a ``:MODE``
    suffix), with ``:tuned`` if it has one. Only app variants take one, and only one of ``COMPILE_MODES``."""
    head, plus, options = variant.partition("+")
    name, colon, mode = head.partition(":")
    if not colon:
        return variant, None
    base, tuned_colon, tuned = mode.partition(":")
    if base not in COMPILE_MODES:
        hint = " (order: NAME[@SHARE][:MODE[:tuned]][+OPTION...])" if "@" in mode else ""
        raise ValueError(f"variant {variant!r}: unknown compile mode {base!r}; valid: {', '.join(COMPILE_MODES)}{hint}")
    if tuned_colon and tuned != "tuned":
        hint = " (order: NAME[@SHARE][:MODE[:tuned]][+OPTION...])" if "@" in tuned else ""
        raise ValueError(
            f"variant {variant!r}: after the compile mode only ':tuned' (model.compile_tuning), not {tuned!r}{hint}"
        )
    if not name.startswith("app_"):
        raise ValueError(
            f"variant {variant!r}: only app variants take a compile mode; the plain loop always compiles with "
            "torch.compile's default mode"
        )
    return name + plus + options, mode


def split_variant(variant: str) -> tuple[str, float]:
    """``app_folder_gpu@0.7`` -> ``("app_folder_gpu", 0.7)``; any other variant has a CPU decode share of 0.
    Options after ``+`` (``ddp_options``, ``decode_threads``, ``crop_kernel``) and a compile mode after ``:``
    (``compile_mode``) are checked and left out."""
    name, at, share = compile_mode(decode_threads(crop_kernel(ddp_options(variant)[0])[0])[0])[0].partition("@")
    if name not in VARIANTS or (at and not name.startswith("app_folder_gpu")):
        raise ValueError(
            f"unknown variant {variant!r}; valid: {', '.join(VARIANTS)}, "
            "app_folder_gpu[_tv|_pageable|_preallocated|_preallocated_tv|_onegroup]@SHARE"
        )
    try:
        value = float(share) if at else 0.0
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"variant {variant!r}: the CPU decode share after '@' must be a number in [0, 1]")
    return name, value


def workers_decoder(name: str) -> str:
    """The ``data.cpu_decoder`` of app variant ``name`` (without ``@``, ``:`` or ``+`` suffixes): explicit in every
    row, because the rows before that option decoded with PIL; the ``_tv`` rows (``app_folder_tv``, and the split's
    CPU share in ``app_folder_gpu[_preallocated]_tv``) are the torchvision decoder."""
    return "torchvision" if name.endswith("_tv") else "pil"


def default_workers(gpus: int) -> int:
    """``--workers`` when not given: each GPU's share of the cores this process may run on (its CPU affinity:
    ``taskset -c 0-15`` gives 16 whatever the machine has), less two for its rank's training thread and the
    prefetcher's producer, at least 1; as bench/gpu_session.sh's split, resized and producer stages pick them (CORES-2
    on one GPU) and its ddp stage (cores per GPU minus two; its eager and compile stages give every core)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // gpus - 2)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    # No abbreviations: the parent passes its arguments on to each variant's process without --matrix, which an
    # abbreviation (--mat) would have kept.
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    p.add_argument("--arch", default="resnet50")
    p.add_argument("--batch", type=int, default=256, help="per GPU")
    p.add_argument("--precision", choices=sorted(PRECISIONS), help="default bf16")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--compile", action="store_true")
    p.add_argument(
        "--matrix",
        help="comma-separated configurations PRECISION:eager or PRECISION:MODE[:tuned] (a torch.compile mode: "
        f"{', '.join(COMPILE_MODES)}), every variant run in each and one table printed, e.g. "
        "fp16:eager,bf16:eager,fp16:reduce-overhead,bf16:reduce-overhead; instead of --precision and --compile",
    )
    p.add_argument("--steps", type=int, default=50, help="timed steps")
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run the variant list this many times, rotated by one place each round; the table gives each row's "
        "median run (the lower middle one for an even count: give an odd one) and every round's img/s",
    )
    p.add_argument(
        "--warmup",
        type=int,
        help="untimed steps first, at least 1 (default 20 eager, 60 compiled: on an H200 the compiled fp16 app ran at "
        "0.865 of the plain loop after 20 steps, and at the loop's speed after 60; bench/RESULTS.md)",
    )
    p.add_argument("--data", help="JPEG folder (ImageNet layout) for app_folder")
    p.add_argument(
        "--workers",
        type=int,
        help="loader workers per GPU (data.workers) of the folder rows; default: the cores this process may run on "
        "(its CPU affinity, as taskset sets it) divided by the run's largest --gpus count, minus two per GPU for its "
        "training thread and producer, at least 1 (as gpu_session.sh's split stages pick them; here "
        f"{default_workers(1)} on 1 GPU)",
    )
    p.add_argument("--variants", default="raw,app_synthetic,app_nvtx")
    p.add_argument("--gpus", default="1", help="comma-separated GPU counts to run every variant on, e.g. 1,2")
    p.add_argument("--launcher", default="lightning", choices=["lightning", "torchrun"], help="app under DDP")
    p.add_argument(
        "--raw-loop",
        default=os.environ.get("RAW_LOOP") or str(RAW_LOOP),
        help="the plain PyTorch loop of the raw variant (not shipped: the lab's reference loop, which "
        "../shared/device/prepare.sh puts in .carry/; default: $RAW_LOOP if set, which bench/gpu_session.sh's stages "
        "pass on, else %(default)s)",
    )
    p.add_argument(
        "--inductor",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set torch._inductor.config KEY (dotted, e.g. triton.enable_pdl) to the JSON VALUE in every variant's "
        "process, the plain loop's too (repeatable; under --compile): e.g. --inductor conv_1x1_as_mm=true",
    )
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    a.configs = []
    if a.matrix is not None:
        if a.child:
            p.error("--matrix runs the variants itself: a variant's process (--child) takes --precision and --compile")
        if a.compile or a.precision:
            p.error(
                "--matrix gives each configuration's precision and compile mode: leave out --precision and --compile"
            )
        if a.inductor:
            p.error("--matrix takes no --inductor (one inductor setting per run: run it with --compile)")
        try:
            a.configs = matrix_configs(a.matrix)
        except ValueError as error:
            p.error(str(error))
    a.precision = a.precision or "bf16"
    if a.warmup is None:
        # Under --matrix each configuration's processes take their own default; the parent's checks the longest.
        compiled = a.compile or any(mode for _, mode in a.configs)
        a.warmup = 60 if compiled else 20
    # StepClock starts at the end of step --warmup, counted from 1; the warm-up also holds cudnn's benchmarking of
    # its kernel choices and, compiled, the compilation, none of which may be timed.
    if a.warmup < 1:
        p.error(f"--warmup {a.warmup}: give at least 1 untimed step (cudnn's benchmarking and compilation run there)")
    if a.steps < 1:
        p.error(f"--steps {a.steps}: give at least 1 timed step")
    if a.rounds < 1:
        p.error(f"--rounds {a.rounds}: give at least 1 (each round runs every variant once)")
    if a.rounds > 1 and a.child:
        p.error("--rounds repeats the variants' processes: a variant's process (--child) runs once")
    if a.batch < 1:
        p.error(f"--batch {a.batch}: give at least 1 image per GPU")
    try:
        a.gpu_counts = [int(g) for g in a.gpus.split(",")]
    except ValueError:
        a.gpu_counts = []
    if not a.gpu_counts or min(a.gpu_counts) < 1:
        p.error(f"--gpus {a.gpus!r}: give comma-separated GPU counts of at least 1, e.g. 1,2")
    if a.workers is None:
        # Per process: under DDP every rank starts its own workers. A variant run alone (--child) on several GPUs
        # has its count in BENCH_GPUS (the parent's children have the parent's --gpus too).
        gpus = max(a.gpu_counts + ([int(os.environ.get("BENCH_GPUS", "1"))] if a.child else []))
        a.workers = default_workers(gpus)
    try:
        a.inductor_options = inductor_options(a.inductor)
    except ValueError as error:
        p.error(str(error))
    if a.inductor and not a.compile:
        p.error("--inductor sets torch.compile's inductor options: add --compile")
    return a


def matrix_configs(text: str) -> list[tuple[str, str | None]]:
    """``"fp16:eager,bf16:reduce-overhead:tuned"`` -> ``[("fp16", None), ("bf16", "reduce-overhead:tuned")]``: each
    configuration's precision and compile mode (None: eager)."""
    configs: list[tuple[str, str | None]] = []
    for item in text.split(","):
        precision, colon, mode = item.partition(":")
        base, _, tuned = mode.partition(":")
        if (
            precision not in PRECISIONS
            or not colon
            or (mode != "eager" and base not in COMPILE_MODES)
            or (tuned and (mode == "eager" or tuned != "tuned"))
        ):
            raise ValueError(
                f"--matrix {item!r}: give PRECISION:eager or PRECISION:MODE[:tuned], PRECISION one of "
                f"{', '.join(sorted(PRECISIONS))}, MODE one of {', '.join(COMPILE_MODES)}; e.g. fp16:eager,bf16:default"
            )
        config = (precision, None if mode == "eager" else mode)
        if config in configs:
            raise ValueError(f"--matrix {item!r} is listed twice")
        configs.append(config)
    return configs


def config_label(precision: str, mode: str | None) -> str:
    """A configuration's name in the table: ``fp16 eager``, ``bf16 reduce-overhead``."""
    return f"{precision} {mode or 'eager'}"


def with_compile_mode(variant: str, mode: str | None) -> str:
    """App variant ``variant`` compiled with ``mode`` (``:MODE`` before any ``+option``); the plain loop (which
    compiles with the default mode) and an eager configuration (``mode`` None) leave it as it is."""
    if mode is None or not variant.startswith("app_"):
        return variant
    head, plus, options = variant.partition("+")
    return f"{head}:{mode}{plus}{options}"


def inductor_options(pairs: list[str]) -> dict:
    """``["triton.enable_pdl=true"]`` -> ``{"triton.enable_pdl": True}``, each key checked against this torch's
    ``torch._inductor.config``."""
    import torch

    options = {}
    for pair in pairs:
        key, eq, text = pair.partition("=")
        if not eq or not key:
            raise ValueError(f"--inductor {pair!r}: give KEY=VALUE, e.g. conv_1x1_as_mm=true")
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            raise ValueError(f'--inductor {pair!r}: VALUE must be JSON (true, 1, 0.5, "text")') from None
        owner, leaf = _inductor_slot(key)
        if owner is None or not hasattr(owner, leaf):
            raise ValueError(
                f"--inductor {pair!r}: torch {torch.__version__} has no inductor option {key!r} (its options: "
                "python -c 'import torch; print(torch._inductor.list_options())')"
            )
        options[key] = value
    return options


def _inductor_slot(key: str) -> tuple[object | None, str]:
    """``"triton.enable_pdl"`` -> ``(torch._inductor.config.triton, "enable_pdl")``; the owner is None when a part
    before the last does not exist."""
    import torch._inductor.config as config

    owner: object | None = config
    *parents, leaf = key.split(".")
    for name in parents:
        owner = getattr(owner, name, None)
    return owner, leaf


def apply_inductor_options(options: dict) -> None:
    """Sets each option (checked by :func:`inductor_options`) on ``torch._inductor.config`` (process-wide: the
    variant's compile reads it)."""
    for key, value in options.items():
        owner, leaf = _inductor_slot(key)
        setattr(owner, leaf, value)


def cuda_devices() -> int:
    """The CUDA devices this process sees (0 without CUDA)."""
    import torch

    return torch.cuda.device_count()


def check_machine(a: argparse.Namespace, variants: list[str], gpus: int) -> None:
    """Exits unless this machine can run ``variants`` on ``gpus`` GPUs: found before the first variant runs, not in
    a later variant's own process after the earlier ones (minutes each, compiled)."""
    if "raw" in variants and not Path(a.raw_loop).is_file():
        sys.exit(
            f"--raw-loop {a.raw_loop} does not exist: the raw variant runs a plain PyTorch loop that this repository "
            "does not ship; pass its path with --raw-loop (or RAW_LOOP=PATH in the environment, also for "
            "bench/gpu_session.sh), or leave raw out of --variants"
        )
    if all(variant == "raw" for variant in variants):
        return  # the plain loop (not this repository's) says itself what it needs
    have = cuda_devices()
    if have == 0:
        sys.exit(
            "no CUDA device here: bench/throughput.py measures training on GPUs (bench/host_overhead.py measures the "
            "host's cost per step on a CPU)"
        )
    if have < gpus:
        sys.exit(f"--gpus {a.gpus}: this machine has {have} CUDA device(s); give GPU counts up to {have}")


def run_raw(a: argparse.Namespace) -> dict:
    import torch

    argv = ["raw_loop.py", "--arch", a.arch, "--batch", str(a.batch), "--precision", a.precision]
    argv += ["--steps", str(a.steps), "--warmup", str(a.warmup)]
    argv += ["--channels-last"] * a.channels_last + ["--compile"] * a.compile
    sys.argv = argv
    start = time.perf_counter()
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        runpy.run_path(a.raw_loop, run_name="__main__")
    lines = out.getvalue().strip().splitlines()
    if not lines:  # ranks other than 0 print nothing
        return {}
    result = json.loads(lines[-1])
    result["peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30
    if torch.cuda.is_available():  # (the tests run a stand-in loop without one)
        from step_clock import device_in_use_gib  # bench/, this script's folder

        # What the device has in use after the loop's last step (torch's cache kept; under DDP its process group is
        # destroyed first), as the app's row reads it when its clock stops (step_clock.StepClock), before Lightning's
        # teardown empties torch's cache.
        result["device_mem_gib"] = device_in_use_gib()
    result["wall_s"] = time.perf_counter() - start
    return result


def app_compile_mode(variant: str, compiled: bool) -> str | None:
    """How app variant ``variant`` compiles: its ``:MODE`` (``MODE:tuned`` with model.compile_tuning), else "default"
    under ``--compile``, else None (eager). A mode without ``--compile`` is refused."""
    mode = compile_mode(variant)[1]
    if mode and not compiled:
        raise ValueError(f"variant {variant!r}: a compile mode (:MODE) needs --compile")
    return (mode or "default") if compiled else None


def run_app(a: argparse.Namespace, variant: str) -> dict:
    import pytorch_lightning as pl
    import torch
    from pytorch_lightning.strategies import DDPStrategy

    sys.path.insert(0, str(ROOT))
    from step_clock import StepClock  # bench/, this script's folder

    import cuda_env
    from callbacks import ProfilerWindow
    from callbacks.preemption import PreemptionHandler
    from datamodule import ImageNetDataModule
    from imagenet_module import ImageNetClassifier

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = a.precision != "fp32"

    name, cpu_share = split_variant(variant)
    ddp_kwargs = ddp_options(variant)[1]
    threads = decode_threads(variant)[1]
    mode = app_compile_mode(variant, a.compile)
    compile_as, _, tuned = (mode or "").partition(":")
    folder = name.startswith("app_folder")
    if name.endswith("_pageable"):
        import gpu_decode

        gpu_decode._staged = lambda host, device: host  # the copy from the worker's (pageable) buffer, as it was
    if crop_kernel(variant)[1] != "triton":
        import gpu_decode

        gpu_decode.CROP_KERNEL = crop_kernel(variant)[1]
    if name.endswith("_onegroup"):
        import gpu_decode

        gpu_decode.MAX_PADDED_PIXELS = 256 * 512 * 512  # every batch of 256 up to 512 x 512 px crops in one group
        gpu_decode.CROP_KERNEL = "torch"  # the fused kernel has no groups
    # Each source is given only the options it reads (the data module warns of the others).
    if folder:
        source_options = dict(
            source="folder",
            root=a.data,
            workers=a.workers,
            decode="gpu" if name.startswith("app_folder_gpu") else "cpu",
            cpu_decode_share=cpu_share,
            nvjpeg="preallocated" if "_preallocated" in name else "torchvision",
            decode_threads=threads,
            cpu_decoder=workers_decoder(name),
        )
    else:
        steps = a.warmup + a.steps + 5  # app_nvtx's window step included
        source_options = dict(source="synthetic", synthetic_num_classes=1000, synthetic_train_steps=steps)
    data = ImageNetDataModule(batch_size=a.batch, channels_last=a.channels_last, **source_options)
    model = ImageNetClassifier(
        arch=a.arch,
        num_classes=data.num_classes,
        batch_size=a.batch,
        channels_last=a.channels_last,
        compile=compile_as or None,
        compile_tuning=bool(tuned),
        fused_sgd=False if name.endswith("_foreach") else None,
    )
    timer = StepClock(a.warmup, a.warmup + a.steps)
    # As train.py always has it: it also replaces Lightning's per-step sigterm broadcast, a host sync under DDP.
    callbacks: list[pl.Callback] = [timer, PreemptionHandler()]
    nvtx = name == "app_nvtx"
    if nvtx:
        # The ranges come with a profiling window (none without one, and a window past the run's end is refused): one
        # step after the timed ones, so that they carry the ranges' cost and not the window's.
        callbacks.append(ProfilerWindow(start_step=a.warmup + a.steps, num_steps=1, nvtx=True, report=False))
    gpus = int(os.environ.get("BENCH_GPUS", "1"))
    strategy: str | DDPStrategy = "auto"
    if gpus > 1:
        strategy = DDPStrategy(**ddp_kwargs) if ddp_kwargs else "ddp"
    trainer = pl.Trainer(
        accelerator="gpu",
        devices=gpus,
        strategy=strategy,
        precision=PRECISIONS[a.precision],
        max_steps=a.warmup + a.steps + nvtx,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        benchmark=True,
        callbacks=callbacks,
    )
    start = time.perf_counter()
    trainer.fit(model, data)
    if trainer.global_rank != 0:
        return {}
    dt = timer.seconds
    return {
        "gpus": gpus,
        "arch": a.arch,
        "precision": a.precision,
        "channels_last": a.channels_last,
        "compile": mode or False,  # the mode (truthy) or False: still reads as "compiled?"
        "batch_per_gpu": a.batch,
        "img_s": round(a.steps * a.batch * gpus / dt, 1),
        "ms_per_step": round(dt * 1000 / a.steps, 2),
        "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30,
        "device_mem_gib": timer.device_in_use_gib,
        "wall_s": time.perf_counter() - start,
        "device_connections": cuda_env.connections(),
    }


def check_epoch_room(data: str, gpus: int, batch: int, warmup: int, steps: int) -> None:
    """Exits unless every GPU's first epoch of ``data`` holds the warm-up and the timed steps.

    At an epoch's end the loader's workers run dry and refill from empty (the next epoch's first batch is decoded
    after the last one is consumed): a stall of about one batch's decode per worker, inside the timed window it is
    not throughput. The sampler and the loader drop the remainder, so each GPU sees ``images // gpus // batch``
    batches an epoch. Images are counted as the app's dataset finds them (``image_folder.visible_samples``: visible
    class folders and files, torchvision's extensions, sub-folders included).
    """
    sys.path.insert(0, str(ROOT))
    from image_folder import check_layout, class_folders, visible_samples

    train, val = Path(data) / "train", Path(data) / "val"
    try:
        check_layout(data)  # what the app's data setup checks first, in each variant's process
    except (OSError, ValueError) as error:
        sys.exit(f"--data {data}: {str(error).removeprefix('data.root: ')} (bench/make_jpeg_folder.py writes one)")
    classes = {name: i for i, name in enumerate(class_folders(train))}
    # The app's setup also refuses a validation class folder without an image, even with validation off.
    val_samples = visible_samples(val, classes, allow_empty=True)
    in_val = {target for _, target in val_samples}
    empty = [name for name, target in classes.items() if target not in in_val]
    if empty:
        sys.exit(
            f"--data {data}: {len(empty)} class folder(s) of {val} hold no image (first: {empty[0]}); the app "
            "refuses that at its data setup: give every class a validation image (bench/make_jpeg_folder.py "
            "--val-per-class)"
        )
    if len(val_samples) < gpus:  # every rank validates a shard of at least one image
        sys.exit(
            f"--data {data}: {val} holds {len(val_samples)} image(s), fewer than the {gpus} GPUs (ranks) the app "
            "shards it over; give more validation images (bench/make_jpeg_folder.py --val-per-class)"
        )
    images = len(visible_samples(train, classes, allow_empty=True))
    batches = images // gpus // batch
    # Two batches of margin: the prefetcher, and with data.decode gpu the producer thread, hold batches ahead.
    if batches < warmup + steps + 2:
        need = (warmup + steps + 2) * batch * gpus
        sys.exit(
            f"--data {data}: {images} training images give {batches} batches of {batch} per GPU and epoch on {gpus} "
            f"GPU(s); the {warmup} warm-up and {steps} timed steps would cross an epoch's end, where the loader "
            f"refills from empty. Use at least {need} images (bench/make_jpeg_folder.py --train-per-class), or fewer "
            "--steps, --warmup or GPUs"
        )


def main(argv: list[str] | None = None) -> None:
    a = parse(argv)
    every, after = os.environ.get("BENCH_STACKS_EVERY_S"), os.environ.get("BENCH_STACKS_AFTER_S")
    if a.child and (every or after):
        import faulthandler

        # Every thread's stack: at each interval, to see where a slow variant spends its time (a long compile), or
        # once, and then exit, so that a variant that hangs does not eat the whole device call.
        faulthandler.dump_traceback_later(float(every or after), repeat=bool(every), exit=not every)
    sys.path.insert(0, str(ROOT))
    import cuda_env
    from cli_parser import tidy_console

    tidy_console(str(ROOT))  # the console as train.py leaves it (no Lightning advert or pytree notice per variant)
    # As train.py does, before CUDA starts; a value in the environment is kept. The parent's reaches every variant's
    # process, the plain loop's too (one value per run, named in the table); a variant run alone sets its own.
    try:
        connections = cuda_env.request()
    except ValueError as error:
        sys.exit(str(error))
    if a.child:
        # A variant run alone (``--child``, e.g. under bench/producer_timing.py) gets the parent's check of the
        # folder too, on the GPU count its parent or the caller set.
        try:
            folder = split_variant(a.child)[0].startswith("app_folder")
        except ValueError as error:
            sys.exit(f"--child: {error}")
        if folder and not a.data:
            sys.exit("app_folder needs --data PATH (an ImageNet-layout JPEG folder: bench/make_jpeg_folder.py)")
        gpus = int(os.environ.get("BENCH_GPUS", "1"))
        check_machine(a, [a.child], gpus)
        if folder:
            check_epoch_room(a.data, gpus, a.batch, a.warmup, a.steps)
        apply_inductor_options(a.inductor_options)
        result = run_raw(a) if a.child == "raw" else run_app(a, a.child)
        if result:
            print("RESULT " + json.dumps(result), flush=True)
        return
    # A variant's process runs once: the rounds are this process's.
    args = without_option(list(argv if argv is not None else sys.argv[1:]), "--rounds")
    gpu_counts = a.gpu_counts
    try:
        [split_variant(variant) for variant in a.variants.split(",")]
    except ValueError as error:
        sys.exit(f"--variants: {error}")
    folders = [v for v in a.variants.split(",") if v.startswith("app_folder")]
    if max(gpu_counts) == 1 and any(ddp_options(variant)[1] for variant in a.variants.split(",")):
        sys.exit("--variants: DDP options (+...) need --gpus with a count above 1")
    moded = [v for v in a.variants.split(",") if compile_mode(v)[1]]
    if moded and a.configs:
        sys.exit(f"--variants: under --matrix each configuration gives the compile mode; leave out :MODE in {moded[0]}")
    if moded and not a.compile:
        sys.exit(f"--variants: compile modes (:MODE) need --compile: {', '.join(moded)}")
    if folders and not a.data:
        sys.exit("app_folder needs --data PATH (an ImageNet-layout JPEG folder: bench/make_jpeg_folder.py)")
    check_machine(a, a.variants.split(","), max(gpu_counts))
    if folders:  # the most GPUs give each the fewest batches an epoch: one count of the folder, one check
        check_epoch_room(a.data, max(gpu_counts), a.batch, a.warmup, a.steps)
    blocks = []
    # One pass without --matrix (the command line's own precision and compile options), else one per configuration.
    for config in a.configs or [None]:
        label, child_args = "", args
        if config is not None:
            label = config_label(*config)
            child_args = [*without_option(args, "--matrix"), "--precision", config[0]] + ["--compile"] * bool(config[1])
        try:
            blocks.append((label, run_variants(a, child_args, config[1] if config else None, label)))
        except SystemExit:
            if blocks:  # a later configuration failed (or a time limit is near): the finished ones are not lost
                print("\nThe configurations that finished:\n" + "\n".join(matrix_table(blocks, "so far")), flush=True)
            raise
    config = f"{a.arch}, "
    if not a.configs:
        config += f"{a.precision}, "
    config += f"{'channels_last' if a.channels_last else 'NCHW'}, "
    if not a.configs:
        config += f"{'compiled' if a.compile else 'eager'}, "
    config += f"batch {a.batch}/GPU"
    config += "".join(f", inductor {key}={json.dumps(value)}" for key, value in a.inductor_options.items())
    config += f", {cuda_env.MAX_CONNECTIONS}={connections}"
    if a.rounds > 1:
        config += f", median of {a.rounds} rounds in rotated orders"
    if max(gpu_counts) > 1:
        config += f", app DDP via {a.launcher}"
    print()
    print("\n".join(matrix_table(blocks, config) if a.configs else table(blocks[0][1], config)))


def without_option(args: list[str], option: str) -> list[str]:
    """``args`` without ``option`` and its value (``--matrix X`` or ``--matrix=X``)."""
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg == option:
            skip = True
        elif not arg.startswith(option + "="):
            out.append(arg)
    return out


def run_variants(a: argparse.Namespace, child_args: list[str], mode: str | None, label: str) -> dict:
    """Every variant of ``a.variants`` on every GPU count, each in its own process started with ``child_args``, the
    app variants compiled with ``mode`` (a --matrix configuration's; None: as the variant says), ``a.rounds`` times in
    rotated orders: (variant, GPUs) -> its result (the median run of its rounds, the lower middle one of an even
    count, with each round's img/s in ``rounds_img_s`` when there are several), in the list's order."""
    variants = a.variants.split(",")
    rows: dict[tuple[str, int], dict] = {}
    for gpus in a.gpu_counts:
        # One GPU runs without DDP: a variant with DDP options listed after its base is the base's row there.
        same_as = {}
        if gpus == 1:
            bases = {v: ddp_options(v)[0] for v in variants}
            same_as = {v: b for v, b in bases.items() if b != v and b in variants[: variants.index(v)]}
        runs: dict[str, list[dict]] = {}
        try:
            for round_ in range(a.rounds):
                shift = round_ % len(variants)
                for variant in variants[shift:] + variants[:shift]:
                    if variant not in same_as:
                        result = run_variant(a, child_args, mode, label, variant, gpus, round_)
                        runs.setdefault(variant, []).append(result)
        except SystemExit:
            if runs and a.rounds > 1:  # the rounds that finished are not lost with the one that failed
                _rows_of(variants, gpus, runs, {v: b for v, b in same_as.items() if b in runs}, rows)
                print(f"\n{label or 'The'} runs that finished:\n" + "\n".join(table(rows, "so far")), flush=True)
            raise
        _rows_of(variants, gpus, runs, same_as, rows)
    return rows


def _rows_of(variants: list[str], gpus: int, runs: dict[str, list[dict]], same_as: dict[str, str], rows: dict) -> None:
    """Adds each variant's row on ``gpus`` GPU(s) to ``rows``: the median of its ``runs``, or its base's row
    (``same_as``); a variant with neither (its round had not come when a run failed) gets none."""
    for variant in variants:
        if variant not in runs and variant not in same_as:
            continue  # not run (a failed round stopped the list)
        if variant in same_as:
            rows[variant, gpus] = {**rows[same_as[variant], gpus], "same_as": same_as[variant]}
            continue
        results = runs[variant]
        # median_low of the runs' rates: one real run's figures (its ms/step and memory with its img/s).
        rows[variant, gpus] = dict(sorted(results, key=lambda r: r["img_s"])[(len(results) - 1) // 2])
        if len(results) > 1:  # several rounds, or a variant listed more than once
            rows[variant, gpus]["rounds_img_s"] = [r["img_s"] for r in results]


def run_variant(
    a: argparse.Namespace, child_args: list[str], mode: str | None, label: str, variant: str, gpus: int, round_: int
) -> dict:
    """``variant``'s result on ``gpus`` GPU(s), from its own process (round ``round_`` of ``a.rounds``)."""
    cmd = [sys.executable, __file__, *child_args, "--child", with_compile_mode(variant, mode)]
    if gpus > 1 and (variant == "raw" or a.launcher == "torchrun"):
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={gpus}",
            *cmd[1:],
        ]
    # stdout carries the RESULT line; stderr passes through as the variant writes it (BENCH_STACKS_EVERY_S's
    # stacks during a long compile, and what a variant printed before a time limit around the run killed it).
    proc = subprocess.run(
        cmd, stdout=subprocess.PIPE, stderr=None, text=True, env={**os.environ, "BENCH_GPUS": str(gpus)}
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    where = f"{label}: " if label else ""
    which = f" (round {round_ + 1} of {a.rounds})" if a.rounds > 1 else ""
    if proc.returncode != 0 or not lines:
        print(proc.stdout[-3000:], file=sys.stderr)  # its stderr (every thread's stack) is already there
        sys.exit(f"{where}variant {variant} on {gpus} GPU(s){which} failed with exit code {proc.returncode}")
    result = json.loads(lines[-1][len("RESULT ") :])
    print(f"{where}{variant} x{gpus}{which}: {result}", flush=True)
    return result


COLUMNS = (
    "GPUs",
    "img/s",
    "ms/step",
    "vs raw",
    "vs synthetic",
    "scaling",
    "peak GiB",
    "peak vs raw",
    "device GiB",
    "device vs raw",
)
#: The last column of a run with --rounds above 1: each round's img/s of the row, in the rounds' order.
ROUNDS_COLUMN = "img/s each round"


def table(rows: dict[tuple[str, int], dict], config: str) -> list[str]:
    """The Markdown table of ``rows`` ((variant, GPUs) -> result): ratios to the plain loop and, for the JPEG-folder
    rows, to the app on synthetic data (the input path's own cost), at the same GPU count; scaling against 1 GPU.
    A folder row with a compile mode is compared with the synthetic row of that mode (``app_synthetic:MODE``) if
    there is one, else with plain ``app_synthetic``; one without, with ``app_synthetic`` (else ``:default``, the
    same mode under --compile)."""
    rounds = _has_rounds([rows])
    columns = COLUMNS + (ROUNDS_COLUMN,) * rounds
    lines = [f"| variant ({config}) | {' | '.join(columns)} |", "|---" * (1 + len(columns)) + "|"]
    return lines + [f"| {' | '.join(cells)} |" for cells in row_cells(rows, rounds)]


def matrix_table(blocks: list[tuple[str, dict[tuple[str, int], dict]]], config: str) -> list[str]:
    """One table of every --matrix configuration's rows (``(label, rows)`` each, as :func:`table` takes them), with
    the configuration in the first column; each row's ratios are to its own configuration's rows."""
    rounds = _has_rounds([rows for _, rows in blocks])
    columns = COLUMNS + (ROUNDS_COLUMN,) * rounds
    lines = [f"| config ({config}) | variant | {' | '.join(columns)} |", "|---" * (2 + len(columns)) + "|"]
    return lines + [f"| {label} | {' | '.join(cells)} |" for label, rows in blocks for cells in row_cells(rows, rounds)]


def _has_rounds(blocks: list[dict[tuple[str, int], dict]]) -> bool:
    return any("rounds_img_s" in r for rows in blocks for r in rows.values())


def row_cells(rows: dict[tuple[str, int], dict], rounds: bool = False) -> list[list[str]]:
    """Each row's name and :data:`COLUMNS` cells (see :func:`table`), and with ``rounds`` its img/s in each round
    (its one run's where it has one: a failed round stopped the others)."""
    out = []
    for (variant, gpus), r in rows.items():
        base, synthetic, one = rows.get(("raw", gpus)), synthetic_row(rows, variant, gpus), rows.get((variant, 1))
        ratio = f"{r['img_s'] / base['img_s']:.3f}" if base else "-"
        vs_synthetic = (
            f"{r['img_s'] / synthetic['img_s']:.3f}" if synthetic and variant.startswith("app_folder") else "-"
        )
        mem = f"{r['peak_mem_gib'] / base['peak_mem_gib']:.3f}" if base else "-"
        scaling = f"{r['img_s'] / (gpus * one['img_s']):.3f}" if one and gpus > 1 else "-"
        device = r.get("device_mem_gib")
        device_ratio = "-"
        if device is not None and base and base.get("device_mem_gib"):
            device_ratio = f"{device / base['device_mem_gib']:.3f}"
        name = f"{variant} (= {r['same_as']})" if r.get("same_as") else variant
        out.append(
            [
                name,
                str(gpus),
                f"{r['img_s']:,.0f}",
                str(r["ms_per_step"]),
                ratio,
                vs_synthetic,
                scaling,
                f"{r['peak_mem_gib']:.2f}",
                mem,
                "-" if device is None else f"{device:.2f}",
                device_ratio,
            ]
            + ([" / ".join(f"{x:,.0f}" for x in r.get("rounds_img_s", [r["img_s"]]))] if rounds else [])
        )
    return out


def synthetic_row(rows: dict[tuple[str, int], dict], variant: str, gpus: int) -> dict | None:
    """The ``app_synthetic`` row on ``gpus`` GPU(s) to compare ``variant`` with: that of ``variant``'s compile mode
    where listed, else the plain one."""
    mode = compile_mode(variant)[1]
    names = [f"app_synthetic:{mode}", "app_synthetic"] if mode else ["app_synthetic", "app_synthetic:default"]
    return next((rows[name, gpus] for name in names if (name, gpus) in rows), None)


if __name__ == "__main__":
    main()
