"""bench/ scripts without a GPU: the step clock and host_overhead.py's warm-up, gpu_session.sh's compile-mode suffix
and log summary, pil_decode_rate.py's statistic in one process and in several, make_jpeg_folder.py's defaults,
nvjpeg_formats.py's checks and buffer layout, crop_kernel_time.py's table (the app's) and refusals."""

from __future__ import annotations

import ast
import copy
import itertools
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torchvision

ROOT = Path(__file__).resolve().parent.parent
SESSION = ROOT / "bench" / "gpu_session.sh"


@pytest.fixture(scope="module")
def host_overhead(bench_script):
    return bench_script("host_overhead")


@pytest.fixture
def pil_decode_rate(bench_script, monkeypatch):
    module = bench_script("pil_decode_rate")
    # Under its name in sys.modules, where the pool's pickling of its functions looks them up.
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return module


@pytest.fixture(scope="module")
def make_jpeg_folder(bench_script):
    return bench_script("make_jpeg_folder")


def test_a_help_description_taken_from_a_docstrings_first_line_is_a_whole_sentence() -> None:
    # pil_decode_rate.py --help ended "...: the app's loader and training", nvjpeg_formats.py's "the kernels it runs
    # on the SMs": their first sentence goes on on the docstring's next line.
    cut = [
        script.name
        for script in sorted((ROOT / "bench").glob("*.py")) + [ROOT / "step_report.py", ROOT / "resize_dataset.py"]
        if 'description=__doc__.split("\\n")[0]' in script.read_text()
        and not ast.get_docstring(ast.parse(script.read_text())).split("\n")[0].endswith(".")
    ]
    assert cut == []


# StepClock (bench/step_clock.py), through host_overhead.py, which times Lightning with it.


def test_the_step_clock_times_the_steps_after_the_warm_up(host_overhead) -> None:
    seconds = host_overhead.run_lightning("cpu", warmup=1, steps=3)
    assert 0 < seconds < 5  # per step; not the machine's uptime


def test_a_step_clock_that_would_never_start_is_refused(host_overhead) -> None:
    """At the end of the first batch the global step is already 1: a clock waiting for step 0 never started, and
    ``seconds`` was the uptime (``perf_counter() - 0.0``)."""
    from step_clock import StepClock

    with pytest.raises(ValueError, match=r"StepClock\(0, 3\): the clock starts at the end of step first \(at least 1"):
        host_overhead.run_lightning("cpu", warmup=0, steps=3)
    with pytest.raises(ValueError, match=r"StepClock\(2, 2\)"):
        StepClock(2, 2)
    # A run whose global step skips the first one (accumulation, a resumed run): an error, not a time from 0.
    clock = StepClock(2, 4)
    cpu = SimpleNamespace(root_device=torch.device("cpu"))
    with pytest.raises(RuntimeError, match="step 4 ended, but the clock never started at the end of step 2"):
        for step in (1, 3, 4):
            clock.on_train_batch_end(SimpleNamespace(global_step=step, strategy=cpu), None)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--warmup", "0"], "--warmup 0: give at least 1 untimed step"),
        (["--steps", "0"], "--steps 0: give at least 1"),
        (["--repeat", "0"], "--repeat 0: give at least 1"),
    ],
)
def test_host_overhead_refuses_no_warm_up_or_no_timed_step(host_overhead, capsys, argv, message) -> None:
    with pytest.raises(SystemExit):
        host_overhead.main([*argv, "--variants", "lightning"])
    assert message in capsys.readouterr().err


def test_host_overhead_times_the_app_with_its_nvtx_ranges(host_overhead, monkeypatch) -> None:
    """The ranges need a profiling window; one placed past the run's end is refused before the first step (the
    variant failed on every run), so its window opens on an extra step after the timed ones."""
    from callbacks import profiler_window

    opened = []
    monkeypatch.setattr(
        profiler_window.ProfilerWindow, "_open_window", lambda self, trainer, window: opened.append(trainer.global_step)
    )
    threads = torch.get_num_threads()
    results = host_overhead.main(["--steps", "3", "--warmup", "1", "--repeat", "1", "--variants", "app_nvtx"])
    assert results["app_nvtx"] > 0
    assert torch.get_num_threads() == threads  # given back (one thread made later runs' losses differ in the 7th digit)
    assert opened == [4]  # after the timed steps 1..3 (0-based), never inside them


# bench/gpu_session.sh


def shell_function(name: str) -> str:
    """The definition of the function ``name`` in gpu_session.sh (from ``name() {`` to the first ``}`` at the start
    of a line), to run on its own: the script runs its stages when sourced."""
    found = re.search(rf"^{name}\(\) \{{.*?^\}}$", SESSION.read_text(), re.S | re.M)
    assert found, f"no function {name} in {SESSION}"
    return found.group(0)


def bash(script: str) -> str:
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True, timeout=30).stdout


def test_the_session_script_parses() -> None:
    subprocess.run(["bash", "-n", str(SESSION)], check=True, timeout=30)


@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune:tuned"])
def test_compile_puts_the_mode_before_any_option_and_leaves_raw_alone(bench_script, mode) -> None:
    """COMPILE=MODE in the resized stage: ``sed`` appended ``:MODE`` after ``+threads=N``/``+bucket_view`` and to
    ``raw``, which bench/throughput.py refuses; the producer stage put it in the right place, now both share one
    function."""
    throughput = bench_script("throughput")
    variants = (
        "app_synthetic,raw,app_folder_gpu@0.85+threads=2+bucket_view,app_folder_tv,app_folder_gpu_tv@0.5+threads=2"
    )
    got = bash(f'{shell_function("with_mode")}\nwith_mode "{mode}" "{variants}"').strip()
    assert got == (
        f"app_synthetic:{mode},raw,app_folder_gpu@0.85:{mode}+threads=2+bucket_view,app_folder_tv:{mode},"
        f"app_folder_gpu_tv@0.5:{mode}+threads=2"
    )
    for variant in got.split(","):  # each one as bench/throughput.py reads it
        throughput.split_variant(variant)
        assert throughput.compile_mode(variant)[1] == (None if variant == "raw" else mode)
    text = SESSION.read_text()
    assert 'variants=$(with_mode "$COMPILE" "$variants")' in text  # the resized stage
    assert 'child=$(with_mode "$mode" "$v")' in text  # the producer stage


def test_a_failed_stage_is_said_and_fails_the_script(tmp_path) -> None:
    """A report stage piped its run through a grep for the report (hiding the error), copied the newest report of an
    earlier call, and the script ended with "done" and status 0. Here train.py's process fails (a stand-in python3)."""
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "python3").write_text("#!/bin/sh\necho 'Traceback: the run failed' >&2\nexit 1\n")
    (shim / "python3").chmod(0o755)
    env = {"PATH": f"{shim}:/usr/bin:/bin", "HOME": str(tmp_path)}
    command = ["bash", str(SESSION), str(tmp_path / "out"), "report-synthetic"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 1
    assert "Traceback: the run failed" in done.stdout and "!!! stage report-synthetic: exit code 1" in done.stdout
    assert "no step report written" in done.stdout and ": a stage failed" in done.stdout
    assert not (tmp_path / "out" / "report-synthetic_step_report").exists()


def test_a_stage_s_summary_is_the_table_or_else_the_log_s_end(tmp_path) -> None:
    """The variants' stderr now passes through to the log: the summary shows the table (and cpu_load.py's report after
    it), not every variant's Lightning messages; a run without a table shows the end of the log, where the error or
    the threads' stacks are."""
    log = tmp_path / "throughput.txt"
    log.write_text(
        "GPU available: True (cuda), used: True\napp_synthetic x1: {'img_s': 1.0}\nUserWarning: noise\n\n"
        "| variant (resnet50) | GPUs | img/s |\n|---|---|---|\n| app_synthetic | 1 | 1 |\n\n"
        "cpu_load: 30.0 s sampled\n| cores | pid |\n"
    )
    summary = bash(f'{shell_function("table")}\ntable "{log}"')
    assert summary.splitlines() == [
        "| variant (resnet50) | GPUs | img/s |", "|---|---|---|", "| app_synthetic | 1 | 1 |", "",
        "cpu_load: 30.0 s sampled", "| cores | pid |",
    ]  # fmt: skip
    log.write_text(
        "fp16 eager: raw x1: {'img_s': 1.0}\n\n| config (resnet50) | variant |\n|---|---|\n| fp16 eager | raw |\n"
    )
    summary = bash(f'{shell_function("table")}\ntable "{log}"')  # bench/throughput.py --matrix's table
    assert summary.splitlines() == ["| config (resnet50) | variant |", "|---|---|", "| fp16 eager | raw |"]
    log.write_text("".join(f"noise {i}\n" for i in range(100)) + "variant raw on 1 GPU(s) failed with exit code 1\n")
    summary = bash(f'{shell_function("table")}\ntable "{log}"').splitlines()
    assert len(summary) == 60 and summary[-1] == "variant raw on 1 GPU(s) failed with exit code 1"


# bench/pil_decode_rate.py


def test_best_pass_rate_spans_a_pass_in_every_process(pil_decode_rate) -> None:
    one = [[(0.0, 10.0), (10.0, 12.0)]]
    assert pil_decode_rate.best_pass_rate(100, one) == 50.0  # the second pass: 100 images in 2 s
    two = [[(0.0, 10.0), (10.0, 12.0)], [(0.5, 10.5), (10.1, 12.5)]]
    assert pil_decode_rate.best_pass_rate(100, two) == 80.0  # 200 images from 10.0 to 12.5


def test_one_process_and_several_use_the_same_statistic(pil_decode_rate, monkeypatch, tmp_path) -> None:
    """A slow first pass (one-time costs) counted in N processes' rate and not in one's made "N at once / N x one core"
    look worse than it is. A stand-in decoder sleeps 50 ms an image in each process's first pass, 10 ms after it:
    sleeping processes do not compete for cores, so two at once reach twice one's rate in their best pass."""
    import cpu_decode

    paths = [tmp_path / f"{k}.JPEG" for k in range(4)]

    def pipeline(*args: object) -> tuple:
        calls = itertools.count()  # per process: each forked worker builds its own

        def load(path: str) -> str:
            time.sleep(0.05 if next(calls) < len(paths) else 0.01)
            return path

        return load, lambda image: image, None

    monkeypatch.setattr(cpu_decode, "workers_pipeline", pipeline)
    args = (224, 0.08, 256, 3, "pil")
    one = pil_decode_rate.measure_parallel(1, paths, *args)
    two = pil_decode_rate.measure_parallel(2, paths, *args)
    assert 50 < one <= 100  # 4 images in 40 ms, the best pass
    assert 1.5 < two / one <= 2.3  # all images of the first pass over the whole window gave about 0.9


def test_the_table_names_the_statistic(pil_decode_rate, tmp_path, capsys) -> None:
    # As a script: its process pool pickles its functions by module name.
    script = ROOT / "bench" / "make_jpeg_folder.py"
    options = ["--classes", "1", "--train-per-class", "3", "--val-per-class", "0", "--processes", "1"]
    subprocess.run([sys.executable, str(script), str(tmp_path), *options], check=True, timeout=60)
    for processes, head in (("1", "3 training files, one core, best of 2 passes"),
                            ("2", "3 training files, 2 processes at once, all their images over the window of the "
                                  "best of 2 passes")):  # fmt: skip
        pil_decode_rate.main(["--data", str(tmp_path), "--repeats", "2", "--processes", processes])
        out = capsys.readouterr().out
        assert f"| folder ({head}) | decoder |" in out
        assert re.search(rf"^\| {tmp_path} \| pil \| \d+ \| \d+ k \| \d+ \| 1.00 \|$", out, re.M)
    with pytest.raises(SystemExit):
        pil_decode_rate.main(["--data", str(tmp_path), "--repeats", "0"])
    assert "--repeats must be >= 1, got 0" in capsys.readouterr().err


# bench/make_jpeg_folder.py


def test_the_folder_appears_whole_and_a_full_one_is_refused(tmp_path) -> None:
    # As a script: its process pool pickles its functions by module name.
    script, root = ROOT / "bench" / "make_jpeg_folder.py", tmp_path / "jpegs"
    (tmp_path / ".jpegs.partial" / "train").mkdir(parents=True)  # an interrupted run's
    options = ["--classes", "2", "--train-per-class", "2", "--val-per-class", "1", "--processes", "1"]
    subprocess.run([sys.executable, str(script), str(root), *options], check=True, timeout=60)
    assert len(list(root.glob("train/*/*.JPEG"))) == 4 and len(list(root.glob("val/*/*.JPEG"))) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["jpegs"]
    again = subprocess.run([sys.executable, str(script), str(root)], capture_output=True, text=True, timeout=60)
    assert again.returncode == 1 and "exists and is not an empty folder" in again.stderr


def test_the_folder_is_flushed_to_disk_once_in_place(make_jpeg_folder, tmp_path, monkeypatch) -> None:
    """A benchmark run right after would otherwise share the disk with the folder's writeback."""
    from concurrent.futures import ThreadPoolExecutor

    root, seen = tmp_path / "jpegs", []
    monkeypatch.setattr(make_jpeg_folder, "ProcessPoolExecutor", ThreadPoolExecutor)  # in process: no pickling
    monkeypatch.setattr(make_jpeg_folder.os, "sync", lambda: seen.append(len(list(root.glob("*/*/*.JPEG")))))
    make_jpeg_folder.main([str(root), "--classes", "1", "--train-per-class", "2", "--val-per-class", "1"])
    assert seen == [3]  # once, with every image in the folder


def test_the_default_folder_is_one_bench_throughput_takes(make_jpeg_folder, bench_script) -> None:
    """100 classes of 64 (6,400 images) were refused by bench/throughput.py's epoch check at its defaults."""
    throughput = bench_script("throughput")
    a = make_jpeg_folder.parse(["/unused"])
    assert a.train_per_class == 400  # as bench/gpu_session.sh makes it
    for compiled in ([], ["--compile"]):  # one GPU: each epoch must hold the warm-up, the timed steps and 2 batches
        t = throughput.parse(compiled)
        assert a.classes * a.train_per_class // t.batch >= t.warmup + t.steps + 2
    assert "--train-per-class 400" in make_jpeg_folder.__doc__


@pytest.mark.parametrize(
    ("option", "value", "least"),
    [("--classes", "0", 1), ("--train-per-class", "0", 1), ("--val-per-class", "-1", 0), ("--processes", "0", 1)],
)
def test_counts_that_make_no_folder_are_refused_before_one_is_written(
    make_jpeg_folder, capsys, tmp_path, option, value, least
) -> None:
    """--train-per-class 0 divided by zero after the empty folder was already renamed into place; --classes 0 failed
    at the rename, a negative count printed "-4 JPEGs"."""
    with pytest.raises(SystemExit):
        make_jpeg_folder.main([str(tmp_path / "jpegs"), option, value])
    assert f"{option} {value}: give at least {least}" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


# bench/decode_bench.py


def test_decode_bench_rates_a_row_by_the_images_it_handles(bench_script, monkeypatch) -> None:
    """The decode-alone row decodes only a batch's JPEGs (PIL takes the rest) but was rated by the whole batch."""
    decode_bench = bench_script("decode_bench")
    clock = itertools.count()
    monkeypatch.setattr(decode_bench, "time", SimpleNamespace(perf_counter=lambda: float(next(clock))))
    a = decode_bench.parse(["--data", "/unused", "--device", "cpu", "--iters", "4", "--warmup", "0"])
    batch = [SimpleNamespace(encoded=True)] * 3 + [SimpleNamespace(encoded=False)]
    handled = []
    whole = decode_bench.time_row(handled.append, [batch], a, busy=False)
    jpegs = decode_bench.time_row(handled.append, [batch], a, False, lambda b: sum(s.encoded for s in b))
    assert len(handled) == 8 and whole["img/s"] == 16.0 and jpegs["img/s"] == 12.0  # one clock tick for 4 batches


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--batch", "0"], "--batch 0: give at least 1"),
        (["--iters", "0"], "--iters 0: give at least 1"),
        (["--batches", "0"], "--batches 0: give at least 1"),
        (["--budgets", "64,x"], "--budgets '64,x': give whole numbers of 512x512 pixel blocks"),
        (["--budgets", "0"], "--budgets '0': give whole numbers"),
    ],
)
def test_decode_bench_refuses_counts_it_cannot_time(bench_script, capsys, argv, said) -> None:
    with pytest.raises(SystemExit):
        bench_script("decode_bench").parse(["--data", "/unused", *argv])
    assert said in capsys.readouterr().err


def jpeg_folder(root: Path, count: int) -> Path:
    from PIL import Image

    for k in range(count):
        (root / "train" / f"c{k % 2}").mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (40 + k, 30), (k, 2 * k, 3 * k)).save(root / "train" / f"c{k % 2}" / f"{k}.JPEG")
    return root


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--formats", "rgb,bgr,nv12"], "--formats: unknown 'bgr', 'nv12'; valid: rgb, rgbi, yuv"),
        (["--count", "0"], "--count and --calls must be at least 1, got 0 and 10"),
        (["--calls", "0"], "--count and --calls must be at least 1, got 128 and 0"),
        (["--count", "5"], "holds 4 files in class folders, --count wants 5"),
    ],
)
def test_nvjpeg_formats_refuses_what_it_cannot_run(bench_script, capsys, tmp_path, argv, said) -> None:
    with pytest.raises(SystemExit) as exit_:
        bench_script("nvjpeg_formats").parse(["--data", str(jpeg_folder(tmp_path, 4)), *argv])
    assert exit_.value.code == 2 and said in capsys.readouterr().err


def test_nvjpeg_formats_lays_out_each_format_in_one_buffer(bench_script) -> None:
    layout = bench_script("nvjpeg_formats").layout
    sizes = [(3, 5), (2, 7)]
    assert layout(sizes, "rgb") == (87, [[(0, 5), (15, 5), (30, 5)], [(45, 7), (59, 7), (73, 7)]])
    assert layout(sizes, "yuv") == layout(sizes, "rgb")
    assert layout(sizes, "rgbi") == (87, [[(0, 15)], [(45, 21)]])


def test_nvjpeg_formats_upsamples_chroma_to_the_image_and_converts_jfif(bench_script) -> None:
    formats = bench_script("nvjpeg_formats")
    plane = torch.tensor([[10.0, 20.0], [30.0, 40.0]])
    # An odd-sized 4:2:0 image: 3 x 3 luma, 2 x 2 chroma; the last row and column of the upsampled plane are cut.
    assert formats.upsample(plane, 3, 3, "nearest").tolist() == [[10, 10, 20], [10, 10, 20], [30, 30, 40]]
    assert formats.upsample(plane, 4, 2, "nearest").tolist() == [
        [10, 20], [10, 20], [30, 40], [30, 40]]  # fmt: skip
    assert formats.upsample(plane, 4, 4, "bilinear")[1, 1].item() == pytest.approx(10 * 9 / 16 + 20 * 3 / 16 +
                                                                                  30 * 3 / 16 + 40 / 16)  # fmt: skip
    with pytest.raises(ValueError, match="upsampling 'cubic': valid are nearest, bilinear"):
        formats.upsample(plane, 4, 4, "cubic")
    # JFIF: gray stays gray; pure red's Cr (V) is 255 - 0.5 and so on (the forward transform's values).
    gray = formats.yuv_to_rgb(torch.tensor([77.0]), torch.tensor([128.0]), torch.tensor([128.0]))
    assert gray.flatten().tolist() == [77.0, 77.0, 77.0]
    red = formats.yuv_to_rgb(torch.tensor([76.245]), torch.tensor([84.972]), torch.tensor([255.5]))
    assert red.flatten().tolist() == pytest.approx([255.0, 0.0, 0.0], abs=0.01)


def test_nvjpeg_formats_compare_finds_rgb_made_from_the_planes_exact(bench_script) -> None:
    formats = bench_script("nvjpeg_formats")
    generator = torch.Generator().manual_seed(0)
    images = []
    for height, width in ((9, 13), (8, 8)):
        y = torch.randint(0, 256, (height, width), generator=generator, dtype=torch.uint8)
        chroma = [torch.randint(0, 256, (-(-height // 2), -(-width // 2)), generator=generator, dtype=torch.uint8)
                  for _ in range(2)]  # fmt: skip
        full = [formats.upsample(c.float(), height, width, "nearest") for c in chroma]
        rgb = formats.yuv_to_rgb(y.float(), *full).round().clamp(0, 255).to(torch.uint8)
        images.append((list(rgb), [y, *chroma]))
    gray = torch.randint(0, 256, (5, 6), generator=generator, dtype=torch.uint8)
    images.append(([gray, gray, gray], [gray]))
    table = formats.compare([rgb for rgb, _ in images], [yuv for _, yuv in images], size=4)
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ")[1:] for line in table.splitlines()[2:]}
    assert rows["nearest, per pixel"][:3] == ["0.00", "0.0000", "1.0000"]
    assert float(rows["nearest, resized"][0]) < 1e-3
    assert float(rows["bilinear, per pixel"][0]) > 1  # random chroma: its interpolation differs
    assert set(rows) == {f"{how}, {label}" for how in ("nearest", "bilinear")
                         for label in ("per pixel", "resized", "resized, converted after")}  # fmt: skip


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only exit")
def test_nvjpeg_formats_says_it_needs_a_gpu(tmp_path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "nvjpeg_formats.py"), "--data", str(jpeg_folder(tmp_path, 4)),
         "--count", "4"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1 and "needs a CUDA GPU" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only exit")
def test_the_cudnn_fusion_probe_says_it_needs_a_gpu() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "cudnn_fusion_probe.py")], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2 and "needs a CUDA GPU" in done.stdout and "Traceback" not in done.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only exit")
def test_the_fused_resnet_probe_says_it_needs_a_gpu() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "cudnn_fused_resnet.py")], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2 and "needs a CUDA GPU" in done.stdout and "Traceback" not in done.stderr


# cudnn_fused_resnet.py's math, without cuDNN's graphs (its op computes the same in torch): the op's backward is the
# probe's own, and the fused bottleneck must train as torchvision's does.


@pytest.mark.parametrize(("stride", "padding", "prologue"), [(1, 1, True), (2, 1, True), (1, 0, False)])
def test_the_fused_resnet_probes_conv_stats_backward_is_the_gradient(bench_script, stride, padding, prologue) -> None:
    probe = bench_script("cudnn_fused_resnet")
    generator = torch.Generator().manual_seed(0)

    def leaf(*shape: int, scale: float = 1.0) -> torch.Tensor:
        t = scale * torch.randn(*shape, generator=generator, dtype=torch.float64)
        return t.contiguous(memory_format=torch.channels_last).requires_grad_()

    x, w = leaf(2, 3, 6, 6), leaf(4, 3, 3 if padding else 1, 3 if padding else 1)
    scale, bias = leaf(1, 3, 1, 1, scale=0.5), leaf(1, 3, 1, 1, scale=0.5)
    op = probe.conv_stats  # y, its sums and sums of squares: every output's gradient reaches the inputs
    assert torch.autograd.gradcheck(lambda *a: op(*a, stride, padding, prologue), (x, scale, bias, w))
    y, total, squares = op(x, scale, bias, w, stride, padding, prologue)
    a = torch.relu(x * scale + bias) if prologue else x
    expected = torch.nn.functional.conv2d(a, w, stride=stride, padding=padding)
    torch.testing.assert_close(y, expected)
    torch.testing.assert_close(total.view(-1), expected.sum((0, 2, 3)))
    torch.testing.assert_close(squares.view(-1), (expected**2).sum((0, 2, 3)))


def test_the_fused_resnet_probes_bottleneck_trains_as_torchvisions(bench_script) -> None:
    probe = bench_script("cudnn_fused_resnet")
    torch.manual_seed(0)
    for stride, downsample in ((1, False), (2, True)):
        block = torchvision.models.resnet.Bottleneck(
            16, 4, stride=stride,
            downsample=torch.nn.Sequential(torch.nn.Conv2d(16, 16, 1, stride, bias=False), torch.nn.BatchNorm2d(16))
            if downsample else None,
        ).double()  # fmt: skip
        for bn in (block.bn1, block.bn2, block.bn3):  # not BN's initial 1 and 0: every parameter's gradient counts
            torch.nn.init.uniform_(bn.weight, 0.5, 1.5)
            torch.nn.init.uniform_(bn.bias, -0.5, 0.5)
        fused = probe.FusedBottleneck(copy.deepcopy(block), torch.float64)
        x = torch.randn(3, 16, 8, 8, dtype=torch.float64).contiguous(memory_format=torch.channels_last)
        grads = []
        for model in (block, fused):
            inp = x.clone().requires_grad_()
            out = model(inp)
            (out * torch.linspace(-1, 1, out.numel(), dtype=torch.float64).view_as(out)).sum().backward()
            grads.append((out.detach(), inp.grad, {n: p.grad for n, p in model.named_parameters()}))
        torch.testing.assert_close(grads[1][0], grads[0][0])
        torch.testing.assert_close(grads[1][1], grads[0][1])
        assert grads[1][2].keys() == grads[0][2].keys()
        for name, grad in grads[0][2].items():
            torch.testing.assert_close(grads[1][2][name], grad, msg=name)
        norms = ("bn1", "bn2", "bn3", *(("downsample.1",) if downsample else ()))
        for name in norms:  # the running statistics as BatchNorm2d's (unbiased variance)
            mine, theirs = fused.get_submodule(name), block.get_submodule(name)
            torch.testing.assert_close(mine.running_mean, theirs.running_mean)
            torch.testing.assert_close(mine.running_var, theirs.running_var)


def test_crop_kernel_time_builds_the_table_the_app_launches(bench_script, monkeypatch) -> None:
    """The benchmark times the kernel on the table it builds itself; that table must be the one
    ``gpu_decode._crop_resize_fused`` hands the kernel for separately allocated images (a column-major parameter
    array once gave errors of about 219 of 255)."""
    import gpu_crop_kernel
    import gpu_decode
    from encoded_batch import Encoded

    generator = torch.Generator().manual_seed(3)
    images = [torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=generator) for h, w in [(40, 50), (33, 21)]]
    samples = [Encoded(images[0], False, (2, 5, 30, 41), False), Encoded(images[1], False, (0, 3, 33, 9), True)]
    launched = []
    monkeypatch.setattr(gpu_decode, "_FUSED_STATE", "verified")
    monkeypatch.setattr(gpu_crop_kernel, "launch", lambda *args: launched.append(args))
    out = torch.empty((2, 3, 16, 16))
    assert gpu_decode._crop_resize_fused(samples, images, out)
    flat, table, parameters = bench_script("crop_kernel_time").build(gpu_crop_kernel, samples, images, 16)
    [(app_flat, app_table, app_parameters, _)] = launched
    assert torch.equal(flat, app_flat) and torch.equal(table, app_table)
    assert torch.equal(parameters, app_parameters) and parameters.is_contiguous()


def test_crop_kernel_time_refuses_a_kernel_of_another_table(bench_script, tmp_path) -> None:
    variant = tmp_path / "variant.py"
    text = (ROOT / "gpu_crop_kernel.py").read_text()
    variant.write_text(text.replace('"taps_x", "flip")', '"taps_x", "mirror")', 1))
    with pytest.raises(SystemExit, match="another table layout"):
        bench_script("crop_kernel_time").load_variant(str(variant), 0)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--launches", "0"], "--launches 0: give at least 1"),
        (["--batch", "0"], "--batch 0: give at least 1"),
        (["--rounds", "0"], "--rounds 0: give at least 1"),
        (["--warmup", "-1"], "--warmup -1: give at least 0"),
    ],
)
def test_crop_kernel_time_refuses_counts_it_cannot_time(bench_script, capsys, argv, said) -> None:
    with pytest.raises(SystemExit) as exit_:
        bench_script("crop_kernel_time").parse(["--data", "DIR", *argv])
    assert exit_.value.code == 2 and said in capsys.readouterr().err
