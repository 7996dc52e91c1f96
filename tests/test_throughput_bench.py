"""bench/throughput.py without a GPU: its table's ratios on known figures; a folder row without data is refused."""

from __future__ import annotations

import json

import pytest


@pytest.fixture(scope="module")
def throughput(bench_script):
    return bench_script("throughput")


def row(img_s: float, ms: float, peak: float) -> dict:
    return {"img_s": img_s, "ms_per_step": ms, "peak_mem_gib": peak}


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
    assert throughput.split_variant("app_folder_gpu_onegroup") == ("app_folder_gpu_onegroup", 0.0)
    assert throughput.split_variant("raw") == ("raw", 0.0)
    for bad, message in [
        ("app_folder@0.5", "unknown variant 'app_folder@0.5'"),
        ("app_folder_gpu@1.5", r"must be a number in \[0, 1\]"),
        ("app_folder_gpu@half", r"must be a number in \[0, 1\]"),
        ("app_sythetic", "unknown variant 'app_sythetic'; valid: raw, app_synthetic"),
        ("app_folder_gpu_pageable", r"needs finished crops: add @SHARE with SHARE > 0"),
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
    import subprocess
    from types import SimpleNamespace

    runs = []
    img_s = {
        ("app_synthetic", "1"): 6000.0,
        ("app_synthetic", "2"): 11300.0,
        ("app_synthetic+bucket_view", "2"): 11500.0,
    }

    def fake_run(cmd, capture_output, text, env):  # noqa: ANN001
        variant = cmd[cmd.index("--child") + 1]
        runs.append((variant, env["BENCH_GPUS"], "torch.distributed.run" in cmd))
        result = {"img_s": img_s[variant, env["BENCH_GPUS"]], "ms_per_step": 1.0, "peak_mem_gib": 11.0}
        return SimpleNamespace(returncode=0, stdout="RESULT " + json.dumps(result) + "\n", stderr="")

    monkeypatch.setattr(subprocess, "run", fake_run)
    throughput.main(
        ["--gpus", "1,2", "--launcher", "torchrun", "--variants", "app_synthetic,app_synthetic+bucket_view"]
    )
    # Three runs, not four: on one GPU there is no DDP for the option to change.
    assert runs == [
        ("app_synthetic", "1", False),
        ("app_synthetic", "2", True),
        ("app_synthetic+bucket_view", "2", True),
    ]
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| app")]
    assert table[1].startswith("| app_synthetic+bucket_view (= app_synthetic) | 1 | 6,000 |")
    assert table[3].startswith("| app_synthetic+bucket_view | 2 | 11,500 |") and "| 0.958 |" in table[3]


def test_compiled_runs_warm_up_longer_unless_told(throughput) -> None:
    assert throughput.parse([]).warmup == 20
    assert throughput.parse(["--compile"]).warmup == 60
    assert throughput.parse(["--compile", "--warmup", "5"]).warmup == 5


def test_a_folder_whose_epoch_ends_inside_the_timed_steps_is_refused(throughput, tmp_path) -> None:
    """2 GPUs halve each GPU's epoch: on the bench's 30,000-image folder the 20 + 50 steps of batch 256 crossed an
    epoch's end there (58 batches per GPU), and not on 1 GPU (117)."""
    for c in range(3):
        (tmp_path / "train" / f"c{c}").mkdir(parents=True)
        for i in range(20):
            (tmp_path / "train" / f"c{c}" / f"{i}.JPEG").touch()
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
    with pytest.raises(SystemExit, match=r"no class folders in .*missing"):
        throughput.check_epoch_room(str(tmp_path / "missing"), gpus=1, batch=4, warmup=2, steps=11)
