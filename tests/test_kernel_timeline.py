"""bench/kernel_timeline.py on a small SQLite file laid out as `nsys export --type sqlite` writes one."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from nsys_export import MS, RUNTIME, new_export, tid

S = 1_000_000_000  # nsys times are in ns


@pytest.fixture(scope="module")
def timeline(bench_script):
    return bench_script("kernel_timeline")


@pytest.fixture
def report(tmp_path: Path) -> Path:
    """A run that launched kernels for 20 s, then one 15 s kernel, then only a synchronize that never returned work."""
    path = tmp_path / "run.sqlite"
    names = ["conv", "slow_triton_kernel", "cudaLaunchKernel", "cudaDeviceSynchronize", "cudaGraphLaunch"]
    db = new_export(path, names, "CUPTI_ACTIVITY_KIND_KERNEL (start INT, end INT, shortName INT)", RUNTIME)
    t0 = 1000 * S  # reports do not start at 0
    kernels = [(t0 + i * S, t0 + i * S + 500 * MS, 0) for i in range(20)]  # 0.5 s busy per second
    kernels.append((t0 + 25 * S, t0 + 40 * S, 1))  # 25-40 s: crosses the 30 s bin boundary
    db.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, ?)", kernels)
    calls = [(t0 + i * S, t0 + i * S + MS, 2, tid(7, 1)) for i in range(20)]
    calls += [(t0 + 25 * S, t0 + 25 * S + MS, 4, tid(7, 1)), (t0 + 41 * S, t0 + 59 * S, 3, tid(7, 1))]
    calls += [(t0 + 5 * S, t0 + 5 * S + 2 * MS, 2, tid(7, 9))]  # another thread
    db.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, ?, ?)", calls)
    db.commit()
    db.close()
    return path


def test_bins_show_when_the_gpu_worked(timeline, report: Path) -> None:
    rows = timeline.bins(sqlite3.connect(report), 10.0)
    assert [(t, k, round(b, 3), c) for t, k, b, c in rows] == [
        (0.0, 10, 5.0, 11),  # ten half-second kernels; the other thread's call counts too
        (10.0, 10, 5.0, 10),
        (20.0, 1, 5.0, 1),  # the slow kernel's first 5 s, and the graph launch
        (30.0, 0, 10.0, 0),  # busy the whole bin, no kernel started in it
        (40.0, 0, 0.0, 1),  # the synchronize: an API call and an idle GPU
    ]


def test_longest_kernels_and_each_threads_last_calls(timeline, report: Path) -> None:
    db = sqlite3.connect(report)
    assert timeline.longest_kernels(db, 2) == [(25.0, 15000.0, "slow_triton_kernel"), (0.0, 500.0, "conv")]
    assert timeline.last_calls(db, 2) == [
        (1, 25.0, 1.0, "cudaGraphLaunch"),
        (1, 41.0, 18000.0, "cudaDeviceSynchronize"),
        (9, 5.0, 2.0, "cudaLaunchKernel"),
    ]


def test_the_tables_and_the_errors_of_the_command_line(timeline, report: Path, tmp_path: Path, capsys) -> None:
    timeline.main([str(report), "--bin", "30", "--top", "1"])
    out = capsys.readouterr().out
    assert "| 0 | 21 | 15.00 | 22 |" in out and "| 30 | 0 | 10.00 | 1 |" in out
    assert "| 25.000 | 15000.00 | slow_triton_kernel |" in out
    assert "| 1 | 41.000 | 18000.00 | cudaDeviceSynchronize |" in out and "cudaGraphLaunch" not in out
    with pytest.raises(SystemExit, match="missing.sqlite: no such file"):
        timeline.main([str(tmp_path / "missing.sqlite")])
    with pytest.raises(SystemExit, match="--bin must be > 0"):
        timeline.main([str(report), "--bin", "0"])
    bare = tmp_path / "bare.sqlite"
    sqlite3.connect(bare).execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)").connection.commit()
    with pytest.raises(SystemExit, match=r"-t cuda\): no CUPTI_ACTIVITY_KIND_KERNEL, CUPTI_ACTIVITY_KIND_RUNTIME"):
        timeline.main([str(bare)])
