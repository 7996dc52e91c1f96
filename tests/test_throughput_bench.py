"""bench/throughput.py without a GPU: its table's ratios on known figures; a folder row without data is refused."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from types import SimpleNamespace

import pytest


@pytest.fixture(scope="module")
def throughput(bench_script):
    return bench_script("throughput")


@pytest.fixture(autouse=True)
def gpu_machine(throughput, monkeypatch, tmp_path):
    """The machine the parent checks before the first variant (its processes are stubbed here): two GPUs and the
    plain loop in place."""
    loop = tmp_path / "raw_loop_stand_in.py"
    loop.write_text("raise SystemExit('the stand-in plain loop is not run by these tests')\n")
    monkeypatch.setattr(throughput, "RAW_LOOP", loop)
    monkeypatch.setattr(throughput, "cuda_devices", lambda: 2)


def row(img_s: float, ms: float, peak: float) -> dict:
    return {"img_s": img_s, "ms_per_step": ms, "peak_mem_gib": peak}


def stub_children(monkeypatch, img_s: Callable[[list, dict], float] = lambda cmd, env: 5000.0) -> list:
    """Replaces the variants' processes: each prints a RESULT with ``img_s(cmd, env)``. Returns the list the calls'
    ``(cmd, env)`` go into, in order."""
    calls: list[tuple[list, dict]] = []

    def fake_run(cmd, stdout, stderr, text, env):  # noqa: ANN001
        assert stdout == subprocess.PIPE and stderr is None  # the result read, the variant's stderr passed through
        calls.append((cmd, env))
        result = {"img_s": img_s(cmd, env), "ms_per_step": 1.0, "peak_mem_gib": 11.0}
        return SimpleNamespace(returncode=0, stdout="RESULT " + json.dumps(result) + "\n", stderr="")

    monkeypatch.setattr(subprocess, "run", fake_run)
    return calls


def image_folder(root, classes: int = 3, per_class: int = 20):  # noqa: ANN001, ANN201
    """``root/train/c<i>/<k>.JPEG`` and one ``root/val/c<i>/0.JPEG``, empty files: the epoch check counts files, it
    does not open them."""
    for c in range(classes):
        (root / "train" / f"c{c}").mkdir(parents=True)
        (root / "val" / f"c{c}").mkdir(parents=True)
        (root / "val" / f"c{c}" / "0.JPEG").touch()
        for i in range(per_class):
            (root / "train" / f"c{c}" / f"{i}.JPEG").touch()
    return root


def child(cmd: list) -> str:
    """The variant a process was started for."""
    return cmd[cmd.index("--child") + 1]


def test_table_gives_ratios_to_the_plain_loop_to_synthetic_and_scaling(throughput) -> None:
    # The 2x H200 bf16 eager figures of bench/RESULTS.md (third session).
    rows = {
        ("raw", 1): row(4684, 54.66, 11.01),
        ("app_synthetic", 1): row(4657, 54.97, 11.01),
        ("app_folder_gpu", 1): row(3235, 79.14, 12.21),
        ("raw", 2): row(9143, 56.0, 11.20),
        ("app_synthetic", 2): row(8828, 58.0, 11.19),
    }
    lines = throughput.table(rows, "resnet50, bf16")
    header, _, *body = ([c.strip() for c in line.strip("|").split("|")] for line in lines)
    assert header[:3] == ["variant (resnet50, bf16)", "GPUs", "img/s"]
    cells = {(c[0], int(c[1])): dict(zip(header, c, strict=True)) for c in body}

    def cell(variant: str, gpus: int, column: str) -> str:
        return cells[variant, gpus][column]

    assert cell("app_synthetic", 1, "vs raw") == "0.994"
    assert cell("app_synthetic", 1, "vs synthetic") == "-"  # only the folder rows: the input path's own cost
    assert cell("app_folder_gpu", 1, "vs synthetic") == "0.695"
    assert cell("app_folder_gpu", 1, "vs raw") == "0.691"
    assert cell("app_folder_gpu", 1, "peak vs raw") == "1.109"
    assert cell("raw", 2, "scaling") == "0.976"
    assert cell("app_synthetic", 2, "scaling") == "0.948"
    assert cell("app_synthetic", 2, "img/s") == "8,828"
    assert cell("raw", 1, "scaling") == "-"
    assert len(lines) == 2 + len(rows)


def test_a_folder_variant_without_data_is_refused_before_any_run(throughput) -> None:
    with pytest.raises(SystemExit, match="app_folder needs --data PATH"):
        throughput.main(["--variants", "app_folder_gpu"])


def test_split_variants_carry_their_cpu_share_and_bad_ones_are_refused(throughput) -> None:
    assert throughput.split_variant("app_folder_gpu@0.7") == ("app_folder_gpu", 0.7)
    assert throughput.split_variant("app_folder_gpu") == ("app_folder_gpu", 0.0)
    assert throughput.split_variant("app_folder_gpu_pageable@0.85") == ("app_folder_gpu_pageable", 0.85)
    # Without finished crops the JPEG bytes and the crop table still go pageable: a variant of its own.
    assert throughput.split_variant("app_folder_gpu_pageable") == ("app_folder_gpu_pageable", 0.0)
    assert throughput.split_variant("app_folder_gpu_onegroup") == ("app_folder_gpu_onegroup", 0.0)
    assert throughput.split_variant("raw") == ("raw", 0.0)
    for bad, message in [
        ("app_folder@0.5", "unknown variant 'app_folder@0.5'"),
        ("app_folder_gpu@1.5", r"must be a number in \[0, 1\]"),
        ("app_folder_gpu@half", r"must be a number in \[0, 1\]"),
        ("app_sythetic", "unknown variant 'app_sythetic'; valid: raw, app_synthetic"),
    ]:
        with pytest.raises(ValueError, match=message):
            throughput.split_variant(bad)
    # Refused by main before any variant runs.
    with pytest.raises(SystemExit, match="--variants: unknown variant 'app_sythetic'"):
        throughput.main(["--variants", "raw,app_sythetic"])


def test_ddp_options_become_ddp_keyword_arguments_and_bad_ones_are_refused(throughput) -> None:
    assert throughput.ddp_options("app_synthetic") == ("app_synthetic", {})
    assert throughput.ddp_options("app_synthetic+bucket_view+static_graph+bucket_mb=50") == (
        "app_synthetic",
        {"gradient_as_bucket_view": True, "static_graph": True, "bucket_cap_mb": 50.0},
    )
    assert throughput.split_variant("app_folder_gpu@0.85+bucket_view") == ("app_folder_gpu", 0.85)
    for bad, message in [
        ("raw+bucket_view", "only app variants take them, not 'raw'"),
        ("app_synthetic+bucket", "unknown DDP option 'bucket' in app_synthetic"),
        ("app_synthetic+bucket_mb=0", "unknown DDP option 'bucket_mb=0'.*N > 0"),
        ("app_synthetic+bucket_mb=", "unknown DDP option 'bucket_mb='"),
    ]:
        with pytest.raises(ValueError, match=message):
            throughput.ddp_options(bad)
    with pytest.raises(SystemExit, match="--variants: unknown DDP option 'bucket'"):
        throughput.main(["--gpus", "1,2", "--variants", "app_synthetic+bucket"])
    with pytest.raises(SystemExit, match=r"DDP options \(\+\.\.\.\) need --gpus with a count above 1"):
        throughput.main(["--variants", "app_synthetic,app_synthetic+bucket_view"])


def test_an_option_variant_reuses_its_base_row_on_one_gpu_and_runs_under_ddp(throughput, monkeypatch, capsys) -> None:
    img_s = {
        ("app_synthetic", "1"): 6000.0,
        ("app_synthetic", "2"): 11300.0,
        ("app_synthetic+bucket_view", "2"): 11500.0,
    }
    calls = stub_children(monkeypatch, lambda cmd, env: img_s[child(cmd), env["BENCH_GPUS"]])
    throughput.main(
        ["--gpus", "1,2", "--launcher", "torchrun", "--variants", "app_synthetic,app_synthetic+bucket_view"]
    )
    runs = [(child(cmd), env["BENCH_GPUS"], "torch.distributed.run" in cmd) for cmd, env in calls]
    # Three runs, not four: on one GPU there is no DDP for the option to change.
    assert runs == [
        ("app_synthetic", "1", False),
        ("app_synthetic", "2", True),
        ("app_synthetic+bucket_view", "2", True),
    ]
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| app")]
    assert table[1].startswith("| app_synthetic+bucket_view (= app_synthetic) | 1 | 6,000 |")
    assert table[3].startswith("| app_synthetic+bucket_view | 2 | 11,500 |") and "| 0.958 |" in table[3]


def test_a_threads_option_sets_the_decode_threads_of_a_gpu_decode_row_on_any_gpu_count(
    throughput, monkeypatch, capsys
) -> None:
    variant = "app_folder_gpu_preallocated_tv@0.5:reduce-overhead+threads=2"
    assert throughput.decode_threads(variant) == ("app_folder_gpu_preallocated_tv@0.5:reduce-overhead", 2)
    assert throughput.decode_threads("app_folder_gpu@0.5") == ("app_folder_gpu@0.5", 1)
    assert throughput.decode_threads("app_folder_gpu+threads=3+bucket_view") == ("app_folder_gpu+bucket_view", 3)
    assert throughput.ddp_options(variant + "+bucket_view") == (variant, {"gradient_as_bucket_view": True})
    assert throughput.split_variant(variant) == ("app_folder_gpu_preallocated_tv", 0.5)
    assert throughput.compile_mode(throughput.decode_threads(variant)[0])[1] == "reduce-overhead"
    for bad, message in [
        ("app_folder_gpu+threads=0", "one \\+threads=N with N from 1 to 8"),
        ("app_folder_gpu+threads=9", "one \\+threads=N with N from 1 to 8"),
        ("app_folder_gpu+threads=two", "one \\+threads=N with N from 1 to 8"),
        ("app_folder_gpu+threads=2+threads=3", "one \\+threads=N with N from 1 to 8"),
        ("app_folder+threads=2", "applies to app_folder_gpu variants"),
        ("app_synthetic+threads=2", "applies to app_folder_gpu variants"),
    ]:
        with pytest.raises(ValueError, match=message):
            throughput.split_variant(bad)

    # On one GPU the row runs (it is no DDP option), as its own process, next to the one-thread row.
    monkeypatch.setattr(throughput, "check_epoch_room", lambda *args: None)
    calls = stub_children(monkeypatch)
    throughput.main(["--data", "/unused", "--variants", "app_folder_gpu@0.5,app_folder_gpu@0.5+threads=2"])
    assert [child(cmd) for cmd, _ in calls] == ["app_folder_gpu@0.5", "app_folder_gpu@0.5+threads=2"]
    assert "| app_folder_gpu@0.5+threads=2 | 1 | 5,000 |" in capsys.readouterr().out

    # The variant's process hands the count to the data module.
    import datamodule

    class Built(Exception):
        pass

    def recorder(**kwargs: object) -> None:
        raise Built(kwargs)

    monkeypatch.setattr(datamodule, "ImageNetDataModule", recorder)
    with pytest.raises(Built) as built:
        throughput.run_app(throughput.parse(["--data", "/unused", "--compile"]), variant)
    kwargs = built.value.args[0]
    assert kwargs["decode_threads"] == 2 and kwargs["nvjpeg"] == "preallocated" and kwargs["cpu_decode_share"] == 0.5


def test_compiled_runs_warm_up_longer_unless_told(throughput) -> None:
    assert throughput.parse([]).warmup == 20
    assert throughput.parse(["--compile"]).warmup == 60
    assert throughput.parse(["--compile", "--warmup", "5"]).warmup == 5


def test_a_folder_whose_epoch_ends_inside_the_timed_steps_is_refused(throughput, tmp_path) -> None:
    """2 GPUs halve each GPU's epoch: on the bench's 30,000-image folder the 20 + 50 steps of batch 256 crossed an
    epoch's end there (58 batches per GPU), and not on 1 GPU (117)."""
    image_folder(tmp_path, classes=3, per_class=20)
    (tmp_path / "train" / "c0" / "notes.txt").touch()  # not an image: not counted
    (tmp_path / "train" / ".ipynb_checkpoints").mkdir()  # hidden: no class, as for the app's dataset
    for i in range(30):
        (tmp_path / "train" / ".ipynb_checkpoints" / f"{i}.JPEG").touch()
    throughput.check_epoch_room(str(tmp_path), gpus=1, batch=4, warmup=2, steps=11)  # 60 // 4 = 15 = 2 + 11 + 2
    with pytest.raises(SystemExit, match=r"60 training images give 7 batches of 4 per GPU and epoch on 2 GPU\(s\)"):
        throughput.check_epoch_room(str(tmp_path), gpus=2, batch=4, warmup=2, steps=11)
    with pytest.raises(SystemExit, match=r"would cross an epoch's end.* at least 120 images"):
        throughput.main(["--variants", "raw,app_folder_gpu@0.85", "--data", str(tmp_path), "--batch", "4",
                         "--warmup", "2", "--steps", "11", "--gpus", "1,2"])  # fmt: skip
    with pytest.raises(SystemExit, match=r"--data .*missing: .*missing does not exist or is not a folder"):
        throughput.check_epoch_room(str(tmp_path / "missing"), gpus=1, batch=4, warmup=2, steps=11)


def test_a_folder_the_apps_data_setup_would_refuse_is_refused_before_any_run(throughput, monkeypatch, tmp_path) -> None:
    """A folder from make_jpeg_folder.py --val-per-class 0 passed the epoch check, and every app_folder variant then
    failed in its own process (after the variants before it)."""
    image_folder(tmp_path)
    (tmp_path / "val" / "c1" / "0.JPEG").unlink()
    calls = stub_children(monkeypatch)
    with pytest.raises(SystemExit, match=r"1 class folder\(s\) of .*val hold no image \(first: c1\).*--val-per-class"):
        throughput.main(["--variants", "raw,app_folder", "--data", str(tmp_path), "--batch", "4", "--steps", "2"])
    (tmp_path / "val" / "c1" / "0.JPEG").touch()
    # Three validation images: the app gives each of four ranks a shard of at least one.
    with pytest.raises(SystemExit, match=r"val holds 3 image\(s\), fewer than the 4 GPUs"):
        throughput.check_epoch_room(str(tmp_path), gpus=4, batch=1, warmup=1, steps=1)
    (tmp_path / "val" / "c2").rename(tmp_path / "val" / "c9")
    with pytest.raises(SystemExit, match=r"val .*have different classes|class"):
        throughput.check_epoch_room(str(tmp_path), gpus=1, batch=4, warmup=2, steps=2)
    assert calls == []


@pytest.mark.parametrize(
    ("devices", "argv", "child_argv", "message"),
    [
        (0, ["--variants", "app_synthetic"], ["--child", "app_synthetic"], "no CUDA device here: bench/throughput.py"),
        (1, ["--gpus", "1,2", "--variants", "app_synthetic"], ["--gpus", "2", "--child", "app_synthetic"],
         r"--gpus 2?,?1?,?2?: this machine has 1 CUDA device\(s\)"),
        (2, ["--variants", "app_synthetic,raw", "--raw-loop", "/nonexistent/raw_loop.py"],
         ["--raw-loop", "/nonexistent/raw_loop.py", "--child", "raw"], "--raw-loop /nonexistent/raw_loop.py does not"),
    ],
)  # fmt: skip
def test_what_the_machine_lacks_is_said_before_the_first_variant_runs(
    throughput, monkeypatch, devices, argv, child_argv, message
) -> None:
    monkeypatch.setattr(throughput, "cuda_devices", lambda: devices)
    calls = stub_children(monkeypatch)
    with pytest.raises(SystemExit, match=message):
        throughput.main(argv)
    assert calls == []  # not after app_synthetic's run (minutes, compiled)
    monkeypatch.setenv("BENCH_GPUS", "2" if "--gpus" in child_argv else "1")
    ran = []
    monkeypatch.setattr(throughput, "run_app", lambda a, variant: ran.append(variant) or {})
    with pytest.raises(SystemExit, match=message):  # a variant run alone checks it too
        throughput.main(child_argv)
    assert ran == []


def test_the_nvtx_variant_opens_its_window_after_the_timed_steps(throughput, monkeypatch) -> None:
    """The app_nvtx row, run for real on the CPU (ResNet-18, batch 2): its window (the ranges come with one) used to
    start past the run's end, which the profiling callback refuses before the first step."""
    import pytorch_lightning as pl

    from callbacks import profiler_window

    opened = []
    monkeypatch.setattr(
        profiler_window.ProfilerWindow, "_open_window", lambda self, trainer, window: opened.append(trainer.global_step)
    )
    real_trainer = pl.Trainer
    monkeypatch.setattr(pl, "Trainer", lambda **kwargs: real_trainer(**{**kwargs, "accelerator": "cpu"}))
    a = throughput.parse(["--arch", "resnet18", "--batch", "2", "--precision", "fp32", "--warmup", "1", "--steps", "2"])
    result = throughput.run_app(a, "app_nvtx")
    assert result["img_s"] > 0
    assert opened == [3]  # the timed steps are 1 and 2 (0-based); the window is the run's one extra step


def test_compile_modes_are_those_of_the_classifier(throughput) -> None:
    import typing

    from imagenet_module import ImageNetClassifier

    hint = typing.get_type_hints(ImageNetClassifier.__init__)["compile"]
    literal = next(arg for arg in typing.get_args(hint) if arg is not type(None))
    assert throughput.COMPILE_MODES == typing.get_args(literal)


def test_a_torchcrop_option_sets_the_crop_kernel_of_a_gpu_decode_row(throughput) -> None:
    variant = "app_folder_gpu_preallocated_tv@0.5+torchcrop+threads=2"
    assert throughput.crop_kernel(variant) == ("app_folder_gpu_preallocated_tv@0.5+threads=2", "torch")
    assert throughput.crop_kernel("app_folder_gpu@0.5") == ("app_folder_gpu@0.5", "triton")
    assert throughput.ddp_options(variant) == (variant, {})  # no DDP option: its own row on one GPU too
    assert throughput.split_variant(variant) == ("app_folder_gpu_preallocated_tv", 0.5)
    assert throughput.decode_threads(throughput.crop_kernel(variant)[0])[1] == 2
    for bad in ("app_folder+torchcrop", "app_synthetic+torchcrop", "app_folder_gpu+torchcrop+torchcrop"):
        with pytest.raises(ValueError, match="torchcrop.*applies once to app_folder_gpu"):
            throughput.split_variant(bad)


def test_compile_mode_suffixes_parse_with_share_and_ddp_options(throughput) -> None:
    assert throughput.compile_mode("app_synthetic") == ("app_synthetic", None)
    assert throughput.compile_mode("raw") == ("raw", None)
    for mode in ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"):
        assert throughput.compile_mode(f"app_synthetic:{mode}") == ("app_synthetic", mode)
        assert throughput.compile_mode(f"app_synthetic:{mode}:tuned") == ("app_synthetic", f"{mode}:tuned")
    # NAME[@SHARE][:MODE][+OPTION...]: each helper strips its own part and keeps the others.
    full = "app_folder_gpu@0.85:reduce-overhead+bucket_view+bucket_mb=50"
    assert throughput.compile_mode(full) == ("app_folder_gpu@0.85+bucket_view+bucket_mb=50", "reduce-overhead")
    assert throughput.ddp_options(full) == (
        "app_folder_gpu@0.85:reduce-overhead",
        {"gradient_as_bucket_view": True, "bucket_cap_mb": 50.0},
    )
    assert throughput.split_variant(full) == ("app_folder_gpu", 0.85)
    assert throughput.split_variant("app_folder_gpu_pageable@0.7:max-autotune") == ("app_folder_gpu_pageable", 0.7)
    assert throughput.split_variant("app_synthetic_foreach:max-autotune-no-cudagraphs") == ("app_synthetic_foreach", 0)
    tuned = "app_folder_gpu@0.85:reduce-overhead:tuned+bucket_view"
    assert throughput.compile_mode(tuned) == ("app_folder_gpu@0.85+bucket_view", "reduce-overhead:tuned")
    assert throughput.split_variant(tuned) == ("app_folder_gpu", 0.85)


def test_bad_compile_modes_and_a_mode_on_raw_are_refused(throughput) -> None:
    valid = "valid: default, reduce-overhead, max-autotune, max-autotune-no-cudagraphs"
    for bad, message in [
        ("app_synthetic:max_autotune", f"'app_synthetic:max_autotune': unknown compile mode 'max_autotune'; {valid}"),
        ("app_synthetic:", "unknown compile mode ''"),
        ("app_synthetic:default:default", "after the compile mode only ':tuned' .*, not 'default'"),
        ("app_synthetic:tuned", "unknown compile mode 'tuned'"),
        ("app_synthetic:reduce-overhead:", "after the compile mode only ':tuned'"),
        ("app_folder:reduce-overhead:tuned@0.7", r"not 'tuned@0.7' \(order: NAME\[@SHARE\]\[:MODE\[:tuned\]\]"),
        ("app_folder_gpu:reduce-overhead@0.7", r"order: NAME\[@SHARE\]\[:MODE\[:tuned\]\]\[\+OPTION\.\.\.\]"),
        ("raw:default", "variant 'raw:default': only app variants take a compile mode; the plain loop always"),
        ("app_sythetic:default", "unknown variant 'app_sythetic:default'"),
        ("app_synthetic+bucket_view:reduce-overhead", r"a :MODE suffix goes before the \+options"),
    ]:  # fmt: skip
        with pytest.raises(ValueError, match=message):
            throughput.split_variant(bad)
    # Refused by main before any variant runs, as the other variant errors.
    with pytest.raises(
        SystemExit, match=f"--variants: variant 'app_synthetic:fast': unknown compile mode 'fast'; {valid}"
    ):
        throughput.main(["--compile", "--variants", "raw,app_synthetic:fast"])
    with pytest.raises(SystemExit, match="--variants: variant 'raw:reduce-overhead': only app variants"):
        throughput.main(["--compile", "--variants", "raw:reduce-overhead,app_synthetic"])


def test_a_compile_mode_needs_compile(throughput, monkeypatch) -> None:
    runs = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kwargs: runs.append(cmd))
    with pytest.raises(SystemExit, match=r"--variants: compile modes \(:MODE\) need --compile: app_synthetic:default$"):
        throughput.main(["--variants", "raw,app_synthetic,app_synthetic:default"])
    assert runs == []
    with pytest.raises(ValueError, match=r"'app_synthetic:max-autotune': a compile mode \(:MODE\) needs --compile"):
        throughput.app_compile_mode("app_synthetic:max-autotune", compiled=False)
    assert throughput.app_compile_mode("app_synthetic:max-autotune", compiled=True) == "max-autotune"
    assert throughput.app_compile_mode("app_synthetic", compiled=True) == "default"
    assert throughput.app_compile_mode("app_synthetic", compiled=False) is None


@pytest.mark.parametrize(
    ("argv", "variant", "compile_kwarg", "tuning", "fused_sgd"),
    [
        (["--compile"], "app_synthetic:max-autotune-no-cudagraphs", "max-autotune-no-cudagraphs", False, None),
        (["--compile"], "app_synthetic_foreach:reduce-overhead+bucket_view", "reduce-overhead", False, False),
        (["--compile"], "app_synthetic:reduce-overhead:tuned", "reduce-overhead", True, None),
        (["--compile"], "app_synthetic", "default", False, None),
        ([], "app_synthetic", None, False, None),
    ],
)
def test_the_app_is_built_with_the_variants_compile_mode_and_its_result_records_it(
    throughput, monkeypatch, argv, variant, compile_kwarg, tuning, fused_sgd
) -> None:
    """run_app with the classifier and the Trainer replaced: what ImageNetClassifier gets, what the JSON says."""
    import pytorch_lightning as pl
    import torch

    import imagenet_module

    # run_app sets both TF32 flags: registered here so that they are restored after the test.
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", torch.backends.cuda.matmul.allow_tf32)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", torch.backends.cudnn.allow_tf32)
    built = []

    class FakeClassifier:
        def __init__(self, **kwargs) -> None:  # noqa: ANN003
            built.append(kwargs)

    class FakeTrainer:
        global_rank = 0

        def __init__(self, callbacks, **kwargs) -> None:  # noqa: ANN001, ANN003
            self.clock = callbacks[0]

        def fit(self, model, data) -> None:  # noqa: ANN001
            self.clock.seconds = 2.0  # the StepClock's timed steps

    monkeypatch.setattr(imagenet_module, "ImageNetClassifier", FakeClassifier)
    monkeypatch.setattr(pl, "Trainer", FakeTrainer)
    a = throughput.parse([*argv, "--batch", "8", "--steps", "10", "--arch", "resnet18"])
    result = throughput.run_app(a, variant)
    assert len(built) == 1
    assert built[0]["compile"] == compile_kwarg
    assert built[0]["compile_tuning"] is tuning
    assert built[0]["fused_sgd"] is fused_sgd
    assert result["compile"] == (f"{compile_kwarg}:tuned" if tuning else compile_kwarg or False)
    assert bool(result["compile"]) is bool(argv)  # still reads as "compiled?"
    assert result["img_s"] == 40.0  # 10 steps x 8 images in 2 s


def test_compile_modes_run_side_by_side_as_their_own_rows(throughput, monkeypatch, capsys) -> None:
    img_s = {"raw": 5000.0, "app_synthetic": 4900.0, "app_synthetic:reduce-overhead": 5250.0}
    img_s["app_synthetic:reduce-overhead+bucket_view"] = 5300.0
    calls = stub_children(monkeypatch, lambda cmd, env: img_s[child(cmd)] * int(env["BENCH_GPUS"]))
    variants = "raw,app_synthetic,app_synthetic:reduce-overhead,app_synthetic:reduce-overhead+bucket_view"
    throughput.main(["--compile", "--gpus", "1,2", "--variants", variants])
    runs = [(child(cmd), env["BENCH_GPUS"], "--compile" in cmd) for cmd, env in calls]
    # On 1 GPU the +option variant is its base's row: the base keeps the compile mode.
    assert runs == [
        ("raw", "1", True),
        ("app_synthetic", "1", True),
        ("app_synthetic:reduce-overhead", "1", True),
        *((variant, "2", True) for variant in variants.split(",")),
    ]
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| app")]
    assert table[0].startswith("| app_synthetic | 1 | 4,900 |") and "| 0.980 |" in table[0]
    assert table[1].startswith("| app_synthetic:reduce-overhead | 1 | 5,250 |") and "| 1.050 |" in table[1]
    assert table[2].startswith(
        "| app_synthetic:reduce-overhead+bucket_view (= app_synthetic:reduce-overhead) | 1 | 5,250 |"
    )
    assert table[5].startswith("| app_synthetic:reduce-overhead+bucket_view | 2 | 10,600 |") and "| 1.060 |" in table[5]


def test_folder_rows_are_compared_with_the_synthetic_row_of_their_compile_mode(throughput) -> None:
    rows = {
        ("raw", 1): row(5000, 50.0, 11.0),
        ("app_synthetic", 1): row(4900, 51.0, 11.0),
        ("app_synthetic:reduce-overhead", 1): row(5200, 49.0, 12.0),
        ("app_folder_gpu@0.85", 1): row(3920, 65.0, 12.0),
        ("app_folder_gpu@0.85:reduce-overhead", 1): row(4680, 54.0, 13.0),
        ("app_folder_gpu:max-autotune", 1): row(3675, 70.0, 12.0),  # no app_synthetic:max-autotune row
        ("app_synthetic:reduce-overhead", 2): row(10000, 51.0, 12.0),
        ("app_folder_gpu@0.85:reduce-overhead", 2): row(9000, 57.0, 13.0),
        ("app_folder_gpu", 2): row(9500, 54.0, 13.0),  # no plain app_synthetic row on 2 GPUs
    }
    lines = throughput.table(rows, "resnet50, bf16")
    header, _, *body = ([c.strip() for c in line.strip("|").split("|")] for line in lines)
    vs_synthetic = {(c[0], int(c[1])): c[header.index("vs synthetic")] for c in body}
    assert vs_synthetic["app_folder_gpu@0.85", 1] == "0.800"  # / app_synthetic
    assert vs_synthetic["app_folder_gpu@0.85:reduce-overhead", 1] == "0.900"  # / app_synthetic:reduce-overhead
    assert vs_synthetic["app_folder_gpu:max-autotune", 1] == "0.750"  # / app_synthetic: none of its own mode
    assert vs_synthetic["app_folder_gpu@0.85:reduce-overhead", 2] == "0.900"  # at the same GPU count
    assert vs_synthetic["app_folder_gpu", 2] == "-"  # a different mode is not the plain row's stand-in
    assert vs_synthetic["app_synthetic:reduce-overhead", 1] == "-"
    # A row with no suffix under --compile is compiled in the default mode: ":default" stands in for it.
    rows = {("app_synthetic:default", 1): row(5000, 50.0, 11.0), ("app_folder_gpu", 1): row(4000, 60.0, 12.0)}
    assert "| 0.800 |" in throughput.table(rows, "compiled")[-1]


def test_every_row_names_its_workers_decoder(throughput) -> None:
    # The rows before data.cpu_decoder decoded with PIL; only the _tv rows run the torchvision decoder.
    for variant, decoder in (("app_folder", "pil"), ("app_folder_tv:reduce-overhead", "torchvision"),
                             ("app_folder_gpu@0.7", "pil"), ("app_folder_gpu_tv@0.6:reduce-overhead", "torchvision"),
                             ("app_folder_gpu_preallocated_tv@0.5", "torchvision"),
                             ("app_folder_gpu_preallocated@0.5", "pil"),
                             ("app_synthetic", "pil")):  # fmt: skip
        assert throughput.workers_decoder(throughput.split_variant(variant)[0]) == decoder


def test_inductor_options_are_checked_passed_to_every_child_and_set_there(throughput, monkeypatch, capsys) -> None:
    import torch._inductor.config as config

    a = throughput.parse(["--compile", "--inductor", "conv_1x1_as_mm=true", "--inductor", "triton.enable_pdl=1"])
    assert a.inductor_options == {"conv_1x1_as_mm": True, "triton.enable_pdl": 1}
    for argv, message in (
        (["--compile", "--inductor", "no_such_option=1"], "has no inductor option 'no_such_option'"),
        (["--compile", "--inductor", "triton.nope=1"], "has no inductor option 'triton.nope'"),
        (["--compile", "--inductor", "conv_1x1_as_mm=yes"], "VALUE must be JSON"),
        (["--compile", "--inductor", "conv_1x1_as_mm"], "give KEY=VALUE"),
        (["--inductor", "conv_1x1_as_mm=true"], "add --compile"),
    ):
        with pytest.raises(SystemExit):
            throughput.parse(argv)
        assert message in capsys.readouterr().err

    # Set in the child's process, where the compile reads them (restored after the test).
    monkeypatch.setattr(config, "conv_1x1_as_mm", False)
    monkeypatch.setattr(config.triton, "enable_pdl", False)
    throughput.apply_inductor_options(a.inductor_options)
    assert config.conv_1x1_as_mm is True and config.triton.enable_pdl == 1

    # The parent forwards them to every variant's process and names them in the table's header.
    calls = stub_children(monkeypatch)
    throughput.main(["--compile", "--inductor", "conv_1x1_as_mm=true", "--variants", "raw,app_synthetic"])
    commands = [cmd for cmd, _ in calls]
    assert len(commands) == 2 and all(cmd[cmd.index("--inductor") + 1] == "conv_1x1_as_mm=true" for cmd in commands)
    assert (
        "compiled, batch 256/GPU, inductor conv_1x1_as_mm=true, CUDA_DEVICE_MAX_CONNECTIONS=" in capsys.readouterr().out
    )


@pytest.mark.parametrize("chosen", [None, "8"])
def test_every_variant_gets_the_app_s_device_connections_or_the_environment_s(
    throughput, monkeypatch, capsys, chosen
) -> None:
    if chosen is not None:
        monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", chosen)
    calls = stub_children(monkeypatch)
    throughput.main(["--variants", "raw,app_synthetic"])
    envs = [env for _, env in calls]
    expected = chosen or "32"
    assert [env["CUDA_DEVICE_MAX_CONNECTIONS"] for env in envs] == [expected, expected]  # the plain loop's too
    assert f"batch 256/GPU, CUDA_DEVICE_MAX_CONNECTIONS={expected})" in capsys.readouterr().out


def test_a_variant_s_process_asks_for_the_connections_itself(throughput, monkeypatch, capsys) -> None:
    """A child run on its own (bench/producer_timing.py runs one in its process) sets the variable before CUDA."""
    import os

    monkeypatch.setattr(throughput, "run_raw", lambda a: {"asked": os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS")})
    throughput.main(["--child", "raw"])
    assert 'RESULT {"asked": "32"}' in capsys.readouterr().out


def test_a_device_connections_value_cuda_does_not_take_stops_the_run(throughput, monkeypatch) -> None:
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "64")
    with pytest.raises(SystemExit, match="CUDA_DEVICE_MAX_CONNECTIONS='64': CUDA takes a whole number from 1 to 32"):
        throughput.main(["--variants", "raw"])


def test_the_raw_variant_without_the_plain_loop_names_the_option(throughput, tmp_path) -> None:
    with pytest.raises(SystemExit) as stopped:
        throughput.main(["--child", "raw", "--raw-loop", str(tmp_path / "raw_loop.py")])
    said = str(stopped.value)
    assert f"--raw-loop {tmp_path / 'raw_loop.py'} does not exist" in said and "leave raw out of --variants" in said


def test_the_plain_loop_s_path_comes_from_raw_loop_in_the_environment(throughput, tmp_path, monkeypatch) -> None:
    # bench/gpu_session.sh's stages run the raw row without --raw-loop: RAW_LOOP is how a user without .carry/ gives it.
    monkeypatch.setenv("RAW_LOOP", str(tmp_path / "lab" / "loop.py"))
    with pytest.raises(SystemExit, match=re.escape(f"--raw-loop {tmp_path / 'lab' / 'loop.py'} does not exist")):
        throughput.main(["--child", "raw"])
    assert throughput.parse(["--raw-loop", "given.py"]).raw_loop == "given.py"  # the option still wins


@pytest.mark.parametrize("argv", [["--warmup", "0"], ["--compile", "--warmup", "-1"], ["--steps", "0"]])
def test_no_warm_up_or_no_timed_step_is_refused(throughput, capsys, argv) -> None:
    """StepClock starts at the end of step --warmup, counted from 1: with 0 it never started, and the img/s came from
    the machine's uptime."""
    with pytest.raises(SystemExit):
        throughput.parse(argv)
    err = capsys.readouterr().err
    option, value = argv[-2:]
    assert f"{option} {value}: give at least 1" in err
    with pytest.raises(SystemExit):
        throughput.main(["--variants", "app_synthetic", *argv])
    assert throughput.parse(["--warmup", "1", "--steps", "1"]).warmup == 1


def test_a_variant_run_alone_checks_its_folder_s_epoch_too(throughput, monkeypatch, tmp_path) -> None:
    """``--child app_folder...`` (as bench/producer_timing.py runs it, or by hand) gets the parent's epoch check, on
    the GPU count of BENCH_GPUS (1 without it)."""
    image_folder(tmp_path)  # 60 images: 15 batches of 4 on one GPU, 7 on two
    ran = []
    monkeypatch.setattr(throughput, "run_app", lambda a, variant: ran.append(variant) or {})
    argv = ["--data", str(tmp_path), "--batch", "4", "--warmup", "2", "--steps", "11", "--workers", "1"]
    monkeypatch.delenv("BENCH_GPUS", raising=False)
    throughput.main([*argv, "--child", "app_folder_gpu_preallocated"])  # 15 = 2 + 11 + 2: room
    assert ran == ["app_folder_gpu_preallocated"]
    monkeypatch.setenv("BENCH_GPUS", "2")
    with pytest.raises(SystemExit, match=r"60 training images give 7 batches of 4 per GPU and epoch on 2 GPU\(s\)"):
        throughput.main([*argv, "--child", "app_folder_gpu_preallocated"])
    monkeypatch.delenv("BENCH_GPUS")
    with pytest.raises(SystemExit, match=r"would cross an epoch's end.* at least 64 images"):
        throughput.main([*argv, "--warmup", "3", "--compile", "--child", "app_folder:default"])  # 3 + 11 + 2 > 15
    with pytest.raises(SystemExit, match="app_folder needs --data PATH"):
        throughput.main(["--child", "app_folder_tv"])
    with pytest.raises(SystemExit, match="--child: unknown variant 'app_foldr'"):
        throughput.main(["--child", "app_foldr"])
    throughput.main([*argv, "--steps", "500", "--child", "app_synthetic"])  # no folder: nothing to check
    assert ran == ["app_folder_gpu_preallocated", "app_synthetic"]


def test_a_variant_s_stderr_passes_through_as_it_runs(throughput, monkeypatch, tmp_path, capfd) -> None:
    """BENCH_STACKS_EVERY_S's stacks go to the variant's stderr while it runs: the parent must not hold them back until
    the variant fails (nor lose them when a time limit kills the run). A real variant process, with a stand-in for
    the plain loop that writes to stderr."""
    loop = tmp_path / "raw_loop.py"
    loop.write_text(
        "import json, sys\n"
        "print('Thread 0x1 (most recent call first): the stand-in loop', file=sys.stderr)\n"
        "print(json.dumps({'img_s': 1000.0, 'ms_per_step': 2.0}))\n"
    )
    monkeypatch.setattr(throughput, "table", lambda rows, config: [f"rows: {sorted(rows)}"])  # no GPU memory here
    throughput.main(["--variants", "raw", "--raw-loop", str(loop)])
    out, err = capfd.readouterr()
    assert "Thread 0x1 (most recent call first): the stand-in loop" in err
    assert "raw x1: {'img_s': 1000.0, 'ms_per_step': 2.0" in out and "Thread 0x1" not in out


def test_the_workers_default_to_each_gpu_s_share_of_this_process_s_cores_less_two(throughput, monkeypatch) -> None:
    """Not os.cpu_count(): taskset's affinity counts, and under DDP every rank starts its own workers."""
    import os

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)  # taskset -c 0-15
    monkeypatch.delenv("BENCH_GPUS", raising=False)
    assert throughput.parse([]).workers == 14  # as bench/gpu_session.sh's CORES-2
    assert throughput.parse(["--gpus", "1,2"]).workers == 6  # cores per GPU minus two, on 1 GPU too: alike rows
    assert throughput.parse(["--gpus", "8"]).workers == 1  # never below 1
    assert throughput.parse(["--workers", "3", "--gpus", "2"]).workers == 3
    monkeypatch.setenv("BENCH_GPUS", "2")  # a variant run alone on 2 GPUs
    assert throughput.parse(["--child", "app_folder"]).workers == 6
    assert throughput.parse([]).workers == 14  # the parent reads --gpus only
    for bad in ("0", "1,x", ""):
        with pytest.raises(SystemExit):
            throughput.parse(["--gpus", bad])


def test_matrix_configurations_parse_and_bad_ones_are_refused(throughput) -> None:
    assert throughput.matrix_configs("fp16:eager,bf16:reduce-overhead:tuned,bf16:default") == [
        ("fp16", None),
        ("bf16", "reduce-overhead:tuned"),
        ("bf16", "default"),
    ]
    for bad in ("fp16", "fp8:eager", "fp16:fast", "fp16:eager:tuned", "bf16:default:fast", "fp16:eager,fp16:eager"):
        with pytest.raises(ValueError, match="--matrix"):
            throughput.matrix_configs(bad)
    assert throughput.with_compile_mode("app_folder_gpu@0.5+threads=2", "reduce-overhead") == (
        "app_folder_gpu@0.5:reduce-overhead+threads=2"
    )
    assert throughput.with_compile_mode("raw", "default") == "raw"  # the plain loop compiles with its own mode
    assert throughput.with_compile_mode("app_synthetic", None) == "app_synthetic"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--compile"], "leave out --precision and --compile"),
        (["--precision", "fp16"], "leave out --precision and --compile"),
        (["--inductor", "conv_1x1_as_mm=true"], "--matrix takes no --inductor"),
        (["--child", "raw"], "a variant's process (--child) takes --precision and --compile"),
        (["--matrix", "fp16:eagre"], "give PRECISION:eager or PRECISION:MODE"),
    ],
)
def test_matrix_with_options_it_stands_for_is_refused(throughput, capsys, extra, message) -> None:
    with pytest.raises(SystemExit):
        throughput.parse(["--matrix", "fp16:eager", *extra])
    assert message in capsys.readouterr().err


def test_matrix_variants_take_no_compile_mode_of_their_own(throughput, monkeypatch) -> None:
    stub_children(monkeypatch)
    with pytest.raises(SystemExit, match="each configuration gives the compile mode; leave out :MODE"):
        throughput.main(["--matrix", "bf16:default", "--variants", "raw,app_synthetic:reduce-overhead"])


def test_matrix_runs_every_variant_in_each_configuration_and_prints_one_table(
    throughput, monkeypatch, capsys, tmp_path
) -> None:
    data = image_folder(tmp_path / "jpegs")
    speed = {"fp16": 1.0, "bf16": 1.5}
    share = {"raw": 1.0, "app_synthetic": 0.99, "app_folder_gpu_preallocated_tv@0.5": 0.95}

    def img_s(cmd: list, env: dict) -> float:
        precision = cmd[cmd.index("--precision") + 1]
        compiled = 1.2 if "--compile" in cmd else 1.0
        return 4000.0 * speed[precision] * compiled * share[child(cmd).replace(":reduce-overhead", "")]

    calls = stub_children(monkeypatch, img_s)
    variants = "raw,app_synthetic,app_folder_gpu_preallocated_tv@0.5"
    argv = ["--matrix", "fp16:eager,bf16:reduce-overhead", "--variants", variants, "--data", str(data)]
    throughput.main([*argv, "--batch", "1", "--warmup", "1", "--steps", "1"])
    runs = [(cmd[cmd.index("--precision") + 1], "--compile" in cmd, child(cmd)) for cmd, _ in calls]
    assert runs == [
        ("fp16", False, "raw"),
        ("fp16", False, "app_synthetic"),
        ("fp16", False, "app_folder_gpu_preallocated_tv@0.5"),
        ("bf16", True, "raw"),  # the plain loop compiles with torch.compile's default mode
        ("bf16", True, "app_synthetic:reduce-overhead"),
        ("bf16", True, "app_folder_gpu_preallocated_tv@0.5:reduce-overhead"),
    ]
    assert not any("--matrix" in cmd or any(arg.startswith("--matrix") for arg in cmd) for cmd, _ in calls)
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("|")]
    header, _, *body = ([c.strip() for c in line.strip("|").split("|")] for line in lines)
    assert header[:3] == ["config (resnet50, NCHW, batch 1/GPU, CUDA_DEVICE_MAX_CONNECTIONS=32)", "variant", "GPUs"]
    cells = {(c[0], c[1]): dict(zip(header, c, strict=True)) for c in body}
    assert len(cells) == 6
    assert cells["fp16 eager", "raw"]["img/s"] == "4,000"
    assert cells["bf16 reduce-overhead", "raw"]["img/s"] == "7,200"
    # Each configuration's ratios are to its own raw and app_synthetic rows.
    for config in ("fp16 eager", "bf16 reduce-overhead"):
        assert cells[config, "app_synthetic"]["vs raw"] == "0.990"
        assert cells[config, "app_folder_gpu_preallocated_tv@0.5"]["vs synthetic"] == "0.960"


def test_the_table_gives_the_device_s_memory_beside_torch_s_peak(throughput) -> None:
    rows = {
        ("raw", 1): {**row(5000, 50.0, 11.0), "device_mem_gib": 12.0},
        ("app_folder_gpu@0.5", 1): {**row(4800, 52.0, 11.5), "device_mem_gib": 13.2},
        ("app_synthetic", 1): row(4900, 51.0, 11.0),  # a result from before the column: "-"
    }
    header, _, *body = ([c.strip() for c in line.strip("|").split("|")] for line in throughput.table(rows, "x"))
    cells = {c[0]: dict(zip(header, c, strict=True)) for c in body}
    assert (cells["app_folder_gpu@0.5"]["device GiB"], cells["app_folder_gpu@0.5"]["device vs raw"]) == (
        "13.20",
        "1.100",
    )
    assert (cells["app_synthetic"]["device GiB"], cells["app_synthetic"]["device vs raw"]) == ("-", "-")


def test_matrix_configurations_warm_up_as_their_mode_and_take_the_equals_form(throughput, monkeypatch) -> None:
    calls = stub_children(monkeypatch)
    throughput.main(["--matrix=fp16:eager,bf16:default", "--variants", "raw,app_synthetic"])
    # Each variant's process parses its own arguments: 20 warm-up steps eager, 60 compiled (compilation is untimed).
    warmups = [(child(cmd), throughput.parse(cmd[2:]).warmup) for cmd, _ in calls]
    assert warmups == [("raw", 20), ("app_synthetic", 20), ("raw", 60), ("app_synthetic:default", 60)]
    assert not any(arg.startswith("--matrix") for cmd, _ in calls for arg in cmd)


def test_a_failed_configuration_keeps_the_table_of_those_that_finished(throughput, monkeypatch, capsys) -> None:
    def fake_run(cmd, stdout, stderr, text, env):  # noqa: ANN001
        if "--compile" in cmd:
            return SimpleNamespace(returncode=1, stdout="", stderr="")
        return SimpleNamespace(returncode=0, stdout='RESULT {"img_s": 10.0, "ms_per_step": 1.0, "peak_mem_gib": 1.0}')

    monkeypatch.setattr(subprocess, "run", fake_run)
    with pytest.raises(SystemExit, match="bf16 default: variant raw on 1 GPU"):
        throughput.main(["--matrix", "fp16:eager,bf16:default", "--variants", "raw,app_synthetic"])
    out = capsys.readouterr().out
    assert "The configurations that finished:" in out
    assert "| fp16 eager | app_synthetic | 1 | 10 |" in out and "| bf16 default |" not in out


def test_rounds_rotate_the_order_and_the_table_gives_each_row_s_median_and_every_round(
    throughput, monkeypatch, capsys
) -> None:
    # Each (variant, round) its own rate; the rounds are told apart by how many runs the variant had before.
    rates = {"raw": [5000.0, 5100.0, 4900.0], "app_synthetic": [6000.0, 5000.0, 5500.0]}
    done: dict[str, int] = {}

    def img_s(cmd: list, env: dict) -> float:
        variant = child(cmd)
        done[variant] = done.get(variant, 0) + 1
        return rates[variant][done[variant] - 1]

    calls = stub_children(monkeypatch, img_s)
    throughput.main(["--variants", "raw,app_synthetic", "--rounds", "3"])
    # Rotated by one place a round; no variant's process gets --rounds (it would refuse it).
    assert [child(cmd) for cmd, _ in calls] == ["raw", "app_synthetic", "app_synthetic", "raw", "raw", "app_synthetic"]
    assert not any("--rounds" in cmd for cmd, _ in calls)
    out = capsys.readouterr().out
    assert "app_synthetic x1 (round 2 of 3):" in out
    lines = [line for line in out.splitlines() if line.startswith("|")]
    header, _, *body = ([c.strip() for c in line.strip("|").split("|")] for line in lines)
    assert header[0].endswith("median of 3 rounds in rotated orders)") and header[-1] == "img/s each round"
    cells = {c[0]: dict(zip(header, c, strict=True)) for c in body}
    assert cells["raw"]["img/s"] == "5,000" and cells["raw"]["img/s each round"] == "5,000 / 5,100 / 4,900"
    assert cells["app_synthetic"]["img/s"] == "5,500"
    assert cells["app_synthetic"]["img/s each round"] == "6,000 / 5,000 / 5,500"
    assert cells["app_synthetic"]["vs raw"] == "1.100"  # between the medians


def test_two_rounds_take_the_lower_middle_run_and_one_round_has_no_rounds_column(
    throughput, monkeypatch, capsys
) -> None:
    rates = iter([4000.0, 4400.0])
    stub_children(monkeypatch, lambda cmd, env: next(rates))
    throughput.main(["--variants", "raw", "--rounds=2"])
    row = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| raw")][0]
    assert row.startswith("| raw | 1 | 4,000 |") and row.endswith("| 4,000 / 4,400 |")

    stub_children(monkeypatch)
    throughput.main(["--variants", "raw"])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("|")]
    assert "each round" not in lines[0] and "rounds" not in lines[0] and lines[2].endswith("| - | - |")

    # A variant listed twice runs twice, and its one row is the median of both.
    rates = iter([4000.0, 4600.0, 4400.0])
    stub_children(monkeypatch, lambda cmd, env: next(rates))
    throughput.main(["--variants", "raw,app_synthetic,raw"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| raw")]
    assert rows == [rows[0]] and rows[0].startswith("| raw | 1 | 4,000 |") and rows[0].endswith("| 4,000 / 4,400 |")


def test_rounds_keep_an_option_variant_on_one_gpu_as_its_base_row(throughput, monkeypatch, capsys) -> None:
    calls = stub_children(monkeypatch)
    throughput.main(["--gpus", "1,2", "--variants", "app_synthetic,app_synthetic+bucket_view", "--rounds", "2"])
    runs = [(child(cmd), env["BENCH_GPUS"]) for cmd, env in calls]
    assert runs == [
        ("app_synthetic", "1"),
        ("app_synthetic", "1"),
        ("app_synthetic", "2"),
        ("app_synthetic+bucket_view", "2"),
        ("app_synthetic+bucket_view", "2"),
        ("app_synthetic", "2"),
    ]
    out = capsys.readouterr().out
    assert "| app_synthetic+bucket_view (= app_synthetic) | 1 | 5,000 |" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rounds", "0"], "--rounds 0: give at least 1"),
        (["--rounds", "2", "--child", "raw"], "a variant's process \\(--child\\) runs once"),
    ],
)
def test_bad_rounds_are_refused(throughput, capsys, argv: list, message: str) -> None:
    with pytest.raises(SystemExit):
        throughput.parse(argv)
    assert re.search(message, capsys.readouterr().err)


def test_rounds_run_an_option_variant_listed_before_its_base_on_one_gpu(throughput, monkeypatch) -> None:
    calls = stub_children(monkeypatch)
    throughput.main(["--gpus", "1,2", "--variants", "app_synthetic+bucket_view,app_synthetic", "--rounds", "2"])
    one_gpu = [child(cmd) for cmd, env in calls if env["BENCH_GPUS"] == "1"]
    assert one_gpu == ["app_synthetic+bucket_view", "app_synthetic", "app_synthetic", "app_synthetic+bucket_view"]


def test_matrix_with_rounds_gives_each_configuration_its_medians_and_the_rounds_column(
    throughput, monkeypatch, capsys
) -> None:
    rates = iter([5000.0, 6000.0, 5500.0, 6500.0, 7000.0, 6000.0, 8000.0, 7500.0, 7000.0, 7200.0, 7100.0, 7300.0])
    calls = stub_children(monkeypatch, lambda cmd, env: next(rates))
    throughput.main(["--matrix", "fp16:eager,bf16:eager", "--variants", "raw,app_synthetic", "--rounds", "3"])
    assert len(calls) == 12 and not any("--rounds" in cmd for cmd, _ in calls)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("|")]
    header, separator, *body = ([c.strip() for c in line.strip("|").split("|")] for line in lines)
    assert header[-1] == "img/s each round" and len(separator) == len(header)
    cells = {(c[0], c[1]): dict(zip(header, c, strict=True)) for c in body}
    # fp16: raw ran 5,000 (round 1), 6,500 (round 2, second), 7,000 (round 3, first); app_synthetic 6,000, 5,500, 6,000.
    assert cells["fp16 eager", "raw"]["img/s each round"] == "5,000 / 6,500 / 7,000"
    assert cells["fp16 eager", "raw"]["img/s"] == "6,500"
    assert cells["fp16 eager", "app_synthetic"]["img/s"] == "6,000"
    assert cells["bf16 eager", "raw"]["img/s each round"] == "8,000 / 7,200 / 7,100"
    assert cells["bf16 eager", "app_synthetic"]["vs raw"] == f"{7300 / 7200:.3f}"


def test_a_run_failing_in_a_later_round_still_prints_the_rounds_that_finished(throughput, monkeypatch, capsys) -> None:
    runs = {"n": 0}

    def fake_run(cmd, stdout, stderr, text, env):  # noqa: ANN001
        runs["n"] += 1
        if runs["n"] == 4:  # round 2's second run: raw
            return SimpleNamespace(returncode=1, stdout="", stderr="")
        result = {"img_s": 1000.0 * runs["n"], "ms_per_step": 1.0, "peak_mem_gib": 11.0}
        return SimpleNamespace(returncode=0, stdout="RESULT " + json.dumps(result) + "\n", stderr="")

    monkeypatch.setattr(subprocess, "run", fake_run)
    with pytest.raises(SystemExit, match=r"variant raw on 1 GPU\(s\) \(round 2 of 3\) failed with exit code 1"):
        throughput.main(["--variants", "raw,app_synthetic", "--rounds", "3"])
    out = capsys.readouterr().out
    assert "The runs that finished:" in out
    rows = {line.split("|")[1].strip(): line for line in out.splitlines() if line.startswith("| raw") or
            line.startswith("| app_synthetic")}  # fmt: skip
    assert rows["raw"].startswith("| raw | 1 | 1,000 |") and rows["raw"].endswith("| 1,000 |")  # its one run
    assert (
        rows["app_synthetic"].startswith("| app_synthetic | 1 | 2,000 |")
        and "| 2,000 / 3,000 |" in rows["app_synthetic"]
    )
