"""bench/nsys_threads.py on a small SQLite file laid out as `nsys export --type sqlite` writes one."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from nsys_export import MS, RUNTIME, new_export, tid

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL (start INT, end INT, streamId INT)"
MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY (start INT, end INT, streamId INT)"
THREADS = "ThreadNames (nameId INT, globalTid INT)"


@pytest.fixture(scope="module")
def threads(bench_script):
    return bench_script("nsys_threads")


@pytest.fixture
def report(tmp_path: Path) -> Path:
    """100 ms: the main thread launches; a producer thread waits 60 ms on events; stream 7 runs kernels 0-50 ms and
    40-60 ms (overlapping by 10), stream 13 copies for the last 10 ms."""
    path = tmp_path / "run.sqlite"
    names = ["cudaLaunchKernel", "cudaEventSynchronize", "MainThread-name", "prefetcher"]
    db = new_export(path, names, RUNTIME, KERNEL, MEMCPY, THREADS)
    t0 = 5_000 * MS
    main, producer = tid(42, 42), tid(42, 43)
    calls = [(t0 + i * MS, t0 + i * MS + MS // 10, 0, main) for i in range(100)]  # 100 launches of 0.1 ms
    calls += [(t0 + 10 * MS, t0 + 40 * MS, 1, producer), (t0 + 50 * MS, t0 + 80 * MS, 1, producer)]
    db.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, ?, ?)", calls)
    db.executemany(
        "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, ?)",
        [(t0, t0 + 50 * MS, 7), (t0 + 40 * MS, t0 + 60 * MS, 7)],
    )
    db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES (?, ?, ?)", (t0 + 90 * MS, t0 + 100 * MS, 13))
    db.executemany("INSERT INTO ThreadNames VALUES (?, ?)", [(2, main), (3, producer)])
    db.commit()
    db.close()
    return path


def test_each_threads_api_time_and_each_streams_work(threads, report: Path) -> None:
    lines = threads.report(sqlite3.connect(report), top=2)
    assert lines[0] == "span: 100.0 ms (first to last CUDA activity)"
    rows = [line for line in lines if line.startswith("| ") and "---" not in line]
    # The producer's 60 ms of waiting comes first, then the main thread's 100 x 0.1 ms.
    assert rows[1] == "| prefetcher | 43 | 60.00 | 60.0% | cudaEventSynchronize 2, 60.00, 30.00 |"
    assert rows[2] == "| MainThread-name | 42 | 10.00 | 10.0% | cudaLaunchKernel 100, 10.00, 0.10 |"
    assert rows[4] == "| 7 | 2 | 70.00 | 0 | 0.00 | 70.0% |"
    assert rows[5] == "| 13 | 0 | 0.00 | 1 | 10.00 | 10.0% |"
    # The union: 0-60 ms of kernels (the overlap counted once) and 90-100 ms of copy.
    assert lines[-1] == "device busy (any kernel or copy running): 70.0% of the span"


def test_union_of_intervals(threads) -> None:
    assert threads.union_ns([]) == 0
    assert threads.union_ns([(5, 10), (0, 3), (2, 4), (9, 12), (20, 21)]) == 4 + 7 + 1


def test_the_command_line_and_its_errors(threads, report: Path, tmp_path: Path, capsys) -> None:
    assert threads.main([str(report)]) == 0
    assert "device busy" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        threads.main([str(tmp_path / "none.sqlite")])
    assert "none.sqlite: no such file (make it with nsys export" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        threads.main([str(report), "--top", "0"])
    assert "--top must be at least 1, got 0" in capsys.readouterr().err
    empty = tmp_path / "empty.sqlite"
    new_export(empty, [], "Other (x INT)").close()
    assert threads.main([str(empty)]) == 1
    assert "not an nsys export with CUDA traced (-t cuda): no CUPTI_ACTIVITY_KIND_RUNTIME" in capsys.readouterr().err
