"""bench/kernel_classes.py on a kernel summary laid out as `nsys stats --report cuda_gpu_kern_sum --format csv` writes
one (kernel names as an H200 run of ResNet-50 printed them)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

HEADER = ["Time (%)", "Total Time (ns)", "Instances", "Avg (ns)", "Med (ns)", "Min (ns)", "Max (ns)", "StdDev (ns)",
          "Name"]  # fmt: skip
KERNELS = [  # (name, total ns over 2 steps, instances)
    ("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64", 6_000_000, 40),
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT", 2_000_000, 22),
    ("triton_tem_fused_convolution_7", 1_000_000, 2),  # a max-autotune template: a convolution
    ("triton_red_fused__native_batch_norm_legit_functional_14", 3_000_000, 8),
    ("triton_per_fused_sum_3", 1_000_000, 2),
    ("triton_poi_fused_add_max_pool2d_with_indices_max_pool2d_with_indices_backward_63", 4_000_000, 2),
    ("void at::native::batch_norm_collect_statistics_channels_last_kernel<at::native::Var, c10::BFloat16>", 500_000, 4),
    ("void at::native::<unnamed>::max_pool_backward_nhwc<c10::BFloat16, float>(const T1 *)", 250_000, 2),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedSgdMathFunctor>", 150_000, 2),
    ("void at::native::vectorized_elementwise_kernel<(int)8, at::native::CUDAFunctor_add<c10::BFloat16>>", 80_000, 4),
    ("void <unnamed>::softmax_warp_forward<float, float, float, (int)10>", 20_000, 2),
]


@pytest.fixture(scope="module")
def classes(bench_script):
    return bench_script("kernel_classes")


def write_summary(path: Path, kernels: list[tuple[str, int, int]]) -> Path:
    """``kernels`` (name, total ns, instances) as ``nsys stats`` writes them, longest first."""
    total = sum(ns for _, ns, _ in kernels)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(HEADER)
        for name, ns, n in sorted(kernels, key=lambda k: -k[1]):
            writer.writerow([round(100 * ns / total, 1), ns, n, ns / n, ns / n, ns / n, ns / n, 0, name])
    return path


@pytest.fixture
def summary(tmp_path: Path) -> Path:
    return write_summary(tmp_path / "win_cuda_gpu_kern_sum.csv", KERNELS)


def test_kernels_are_classed_by_name(classes) -> None:
    c = classes
    assert [c.kernel_class(name) for name, _, _ in KERNELS] == [
        c.CONV, c.CONV, c.CONV,  # cuDNN, cuBLASLt, a Triton template
        c.TRITON_REDUCTION, c.TRITON_REDUCTION, c.TRITON_POINTWISE,
        c.BATCH_NORM, c.POOLING, c.OPTIMIZER, c.ELEMENTWISE, c.OTHER,
    ]  # fmt: skip
    # Triton's names spell the ops they fuse; cuDNN's batch norm and its convolutions without a GEMM in the name.
    assert c.kernel_class("triton_poi_fused__native_batch_norm_legit_functional_add_convolution_backward_7") == (
        c.TRITON_POINTWISE
    )
    assert c.kernel_class("void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 512, true, 1>(...)") == (
        c.BATCH_NORM
    )
    assert c.kernel_class("bn_bw_1C11_kernel_new<float, float, float2, 512, true, 1>") == c.BATCH_NORM
    assert c.kernel_class("void cudnn::winograd_nonfused::winogradForwardData4x4<float, float>(...)") == c.CONV
    assert c.kernel_class("void conv2d_grouped_direct_kernel<false, true, false, false, 0, 0, int, float>") == c.CONV
    assert c.kernel_class("void at::native::batch_norm_backward_elemt_channels_last_kernel<4>") == c.BATCH_NORM


def test_time_per_step_by_class_largest_first(classes, summary: Path) -> None:
    rows = classes.by_class(classes.read_summary(summary), steps=2)
    c = classes
    assert [(label, round(ms, 3), round(share, 4), count) for label, ms, share, count in rows] == [
        (c.CONV, 4.5, round(9 / 18, 4), 32),
        (c.TRITON_POINTWISE, 2.0, round(4 / 18, 4), 1),
        (c.TRITON_REDUCTION, 2.0, round(4 / 18, 4), 5),
        (c.BATCH_NORM, 0.25, round(0.5 / 18, 4), 2),
        (c.POOLING, 0.125, round(0.25 / 18, 4), 1),
        (c.OPTIMIZER, 0.075, round(0.15 / 18, 4), 1),
        (c.ELEMENTWISE, 0.04, round(0.08 / 18, 4), 2),
        (c.OTHER, 0.01, round(0.02 / 18, 4), 1),
    ]


def test_the_tables_and_the_errors_of_the_command_line(classes, summary: Path, tmp_path: Path, capsys) -> None:
    assert classes.main([str(summary), "--steps", "2", "--top", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("9.00 ms of kernels a step (2 steps)")
    assert "| conv/GEMM (cuDNN, cuBLAS, Triton templates) | 4.50 | 50.0% | 32 |" in out
    longest = KERNELS[0][0]
    assert f"| `{longest}` | 3.00 | 20 | {classes.CONV} |" in out
    assert "nvjet" not in out  # only the longest kernel
    with pytest.raises(SystemExit, match="missing.csv"):
        classes.main([str(tmp_path / "missing.csv")])
    other = tmp_path / "nvtx_sum.csv"
    other.write_text("Time (%),Total Time (ns),Instances,Range\n1,2,3,step 20\n")
    with pytest.raises(SystemExit, match=r"no column Name; expected the CSV of `nsys stats --report cuda_gpu_kern_sum"):
        classes.main([str(other)])
    empty = tmp_path / "empty.csv"
    empty.write_text(",".join(HEADER) + "\n")
    with pytest.raises(SystemExit, match="lists no kernels"):
        classes.main([str(empty)])
    with pytest.raises(SystemExit):
        classes.main([str(summary), "--steps", "0"])
    assert "--steps must be >= 1" in capsys.readouterr().err


def test_two_summaries_compared_by_class_and_by_kernel(classes, summary: Path, tmp_path: Path, capsys) -> None:
    """B: the convolutions 1 ms a step faster, the Triton pointwise kernel gone, a new ATen add, over 4 steps."""
    after = [(name, ns * 2, n * 2) for name, ns, n in KERNELS if not name.startswith("triton_poi")]  # 4 steps
    after[0] = (after[0][0], after[0][1] - 4_000_000, after[0][2])  # cuDNN's fprop: 3 ms a step -> 2
    after.append(
        ("void at::native::vectorized_elementwise_kernel<(int)4, at::native::AddFunctor<float>>", 1_200_000, 8)
    )
    b = write_summary(tmp_path / "b.csv", after)
    c = classes
    rows = c.compare_classes(c.read_summary(summary), c.read_summary(b), 2, 4)
    assert [(label, round(ms_a, 3), round(ms_b, 3)) for label, ms_a, ms_b in rows][:3] == [
        (c.TRITON_POINTWISE, 2.0, 0.0), (c.CONV, 4.5, 3.5), (c.ELEMENTWISE, 0.04, 0.34),
    ]  # fmt: skip
    assert rows[-1][0] == "all kernels" and (round(rows[-1][1], 3), round(rows[-1][2], 3)) == (9.0, 6.3)
    changes = c.kernel_changes(c.read_summary(summary), c.read_summary(b), 2, 4, top=3)
    assert [(name[:24], round(a, 3), round(b_, 3), status) for name, a, b_, status in changes] == [
        ("triton_poi_fused_add_max", 2.0, 0.0, "gone"),
        ("sm90_xmma_fprop_implicit", 3.0, 2.0, ""),
        ("void at::native::vectori", 0.0, 0.3, "new"),
    ]
    assert classes.main([str(summary), "--steps", "2", "--compare", str(b), "--steps-b", "4", "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"A: {summary} (2 steps), B: {b} (4 steps)")
    assert "| Triton pointwise (normalize, ReLU, adds, pooling) | 2.00 | 0.00 | -2.00 | 0.000 |" in out
    assert "| all kernels | 9.00 | 6.30 | -2.70 | 0.700 |" in out
    assert (
        "| `triton_poi_fused_add_max_pool2d_with_indices_max_pool2d_with_indices_backward_63` | 2.000 | 0.000 | " in out
    )
    assert "| -2.000 | gone |" in out and "sm90_xmma" in out and "AddFunctor" not in out  # --top 2
    with pytest.raises(SystemExit, match="missing.csv"):
        classes.main([str(summary), "--compare", str(tmp_path / "missing.csv")])
    with pytest.raises(SystemExit):
        classes.main([str(summary), "--steps-b", "4"])
    assert "--steps-b is B's step count: it needs --compare CSV_B" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        classes.main([str(summary), "--compare", str(b), "--steps-b", "0"])
    assert "--steps must be >= 1, as must --steps-b" in capsys.readouterr().err


def test_names_lose_their_parameters_and_are_cut_in_the_middle_but_stay_apart(classes, tmp_path: Path, capsys) -> None:
    # Two ATen kernels that differ in their dtype only, past a long shared prefix, and a parameter list that says
    # nothing (template placeholders): cut in the middle they stay apart.
    prefix = (
        "void at::native::elementwise_kernel<(int)128, (int)2, void at::native::gpu_kernel_impl_nocast<at::native::"
    )
    params = "(int, T2, T3)"
    float_mul, bf16_mul = prefix + "MulFunctor<float>>" + params, prefix + "MulFunctor<c10::BFloat16>>" + params
    short = classes.short_names([float_mul, bf16_mul, "triton_poi_fused_add_7"])
    assert short[0] != short[1] and all(len(name) == 90 and "..." in name for name in short[:2])
    assert short[1].endswith("MulFunctor<c10::BFloat16>>") and short[1].startswith("at::native::elementwise_kernel<")
    assert short[2] == "triton_poi_fused_add_7"
    # Names alike once cut (the difference in the middle) are shown whole, without their parameters.
    middle = [
        f"void at::native::vectorized_elementwise_kernel<(int)8, at::native::{functor}<c10::BFloat16>, "
        "std::array<char *, (unsigned long)3>>(int, T2, T3)"
        for functor in ("CUDAFunctor_add", "CUDAFunctor_mul")
    ]
    assert classes.short_names(middle) == [name.removeprefix("void ").removesuffix(params) for name in middle]
    # A name whose parentheses are its own (a lambda's) keeps them; --full-names prints every name whole.
    assert classes.short_names(["kernel(lambda)"]) == ["kernel(lambda)"]
    a = write_summary(tmp_path / "a.csv", [(float_mul, 1_000_000, 2)])
    b = write_summary(tmp_path / "b.csv", [(bf16_mul, 1_000_000, 2)])
    assert classes.main([str(a), "--compare", str(b), "--full-names"]) == 0
    out = capsys.readouterr().out
    assert f"| `{bf16_mul.removeprefix('void ').removesuffix(params)}` | 0.000 | 1.000 | +1.000 | new |" in out


@pytest.mark.parametrize(
    ("row", "said"),
    [
        (["1", "", "2", "1", "1", "1", "1", "0", "k"], "could not convert string to float"),
        (["1", "100", "2.0", "1", "1", "1", "1", "0", "k"], "invalid literal for int()"),
        (["1", "100", "2"], r"no Name field \(a row cut short\)"),
    ],
)
def test_a_bad_row_is_named_by_file_and_line(classes, summary: Path, tmp_path: Path, row, said) -> None:
    bad = tmp_path / "b.csv"
    bad.write_text(",".join(HEADER) + "\n1,100,2,50,50,50,50,0,good\n" + ",".join(row) + "\n")
    with pytest.raises(SystemExit, match=f"^kernel_classes: {bad}, line 3: .*{said}"):
        classes.main([str(summary), "--compare", str(bad)])
    undecodable = tmp_path / "u.csv"
    undecodable.write_bytes(",".join(HEADER).encode() + b"\n1,100,2,50,50,50,50,0,\xff\xfe\n")
    with pytest.raises(SystemExit, match=f"^kernel_classes: {undecodable}: .*codec can't decode"):
        classes.main([str(summary), "--compare", str(undecodable)])
