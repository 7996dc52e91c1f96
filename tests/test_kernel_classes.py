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


@pytest.fixture
def summary(tmp_path: Path) -> Path:
    path = tmp_path / "win_cuda_gpu_kern_sum.csv"
    total = sum(ns for _, ns, _ in KERNELS)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(HEADER)
        for name, ns, n in sorted(KERNELS, key=lambda k: -k[1]):
            writer.writerow([round(100 * ns / total, 1), ns, n, ns / n, ns / n, ns / n, ns / n, 0, name])
    return path


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
