"""bench/nsys_threads.py on a small SQLite file laid out as `nsys export --type sqlite` writes one."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from nsys_export import MS, RUNTIME, new_export, tid

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL (start INT, end INT, deviceId INT, streamId INT)"
MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY (start INT, end INT, deviceId INT, streamId INT)"
MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET (start INT, end INT, deviceId INT, streamId INT)"
THREADS = "ThreadNames (nameId INT, globalTid INT)"
T0 = 5_000 * MS  # reports do not start at 0


@pytest.fixture(scope="module")
def threads(bench_script):
    return bench_script("nsys_threads")


@pytest.fixture
def report(tmp_path: Path) -> Path:
    """100 ms: the main thread launches; a producer thread (named twice: it renames itself) waits 60 ms on events; a
    third thread has no name. Device 0: stream 7 runs kernels 0-50 ms and 40-60 ms (overlapping by 10) and a memset
    at 60-65 ms, stream 13 copies for the last 10 ms. Device 1 has a stream 7 of its own, busy 0-20 ms."""
    path = tmp_path / "run.sqlite"
    names = ["cudaLaunchKernel", "cudaEventSynchronize", "MainThread-name", "python3", "prefetcher"]
    db = new_export(path, names, RUNTIME, KERNEL, MEMCPY, MEMSET, THREADS)
    main, producer, unnamed = tid(42, 42), tid(42, 43), tid(42, 44)
    calls = [(T0 + i * MS, T0 + i * MS + MS // 10, 0, main) for i in range(100)]  # 100 launches of 0.1 ms
    calls += [(T0 + 10 * MS, T0 + 40 * MS, 1, producer), (T0 + 50 * MS, T0 + 80 * MS, 1, producer)]
    calls += [(T0 + 5 * MS, T0 + 6 * MS, 0, unnamed)]
    db.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, ?, ?)", calls)
    kernels = [(T0, T0 + 50 * MS, 0, 7), (T0 + 40 * MS, T0 + 60 * MS, 0, 7), (T0, T0 + 20 * MS, 1, 7)]
    db.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, ?, ?)", kernels)
    db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES (?, ?, ?, ?)", (T0 + 90 * MS, T0 + 100 * MS, 0, 13))
    db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_MEMSET VALUES (?, ?, ?, ?)", (T0 + 60 * MS, T0 + 65 * MS, 0, 7))
    db.executemany("INSERT INTO ThreadNames VALUES (?, ?)", [(2, main), (3, producer), (4, producer)])
    db.commit()
    db.close()
    return path


def test_each_threads_api_time_and_each_streams_work(threads, report: Path) -> None:
    lines = threads.report(sqlite3.connect(report), top=2)
    assert lines[0] == "span: 100.0 ms (first to last CUDA activity)"
    rows = [line for line in lines if line.startswith("| ") and "---" not in line]
    # The producer's 60 ms of waiting comes first, under both its names, then the main thread's 100 x 0.1 ms.
    assert rows[1] == "| python3/prefetcher | 43 | 60.00 | 60.0% | cudaEventSynchronize 2, 60.00, 30.00 |"
    assert rows[2] == "| MainThread-name | 42 | 10.00 | 10.0% | cudaLaunchKernel 100, 10.00, 0.10 |"
    assert rows[3] == "| ? | 44 | 1.00 | 1.0% | cudaLaunchKernel 1, 1.00, 1.00 |"
    # Stream 7 of each device apart; the memset counts as the stream's work.
    assert rows[5] == "| 0 | 7 | 2 | 70.00 | 0 | 0.00 | 1 | 5.00 | 75.0% |"
    assert rows[6] == "| 0 | 13 | 0 | 0.00 | 1 | 10.00 | 0 | 0.00 | 10.0% |"
    assert rows[7] == "| 1 | 7 | 1 | 20.00 | 0 | 0.00 | 0 | 0.00 | 20.0% |"
    # The union per device: 0-65 ms (the overlap counted once) and 90-100 ms on device 0; device 1 is not added in.
    assert lines[-2] == "device 0 busy (any kernel, copy or memset running): 75.0% of the span"
    assert lines[-1] == "device 1 busy (any kernel, copy or memset running): 20.0% of the span"


def test_a_report_with_kernels_only_and_no_thread_names(threads, tmp_path: Path) -> None:
    path = tmp_path / "kernels_only.sqlite"
    db = new_export(path, ["cudaLaunchKernel"], RUNTIME, KERNEL)
    db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, ?, ?)", (T0, T0 + MS, 0, tid(1, 1)))
    db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, ?, ?)", (T0 + MS, T0 + 4 * MS, 0, 7))
    db.commit()
    lines = threads.report(db)
    assert "| ? | 1 | 1.00 | 25.0% | cudaLaunchKernel 1, 1.00, 1.00 |" in lines
    assert lines[-1] == "device 0 busy (any kernel, copy or memset running): 75.0% of the span"


def test_union_of_intervals(threads) -> None:
    assert threads.union_ns([]) == 0
    assert threads.union_ns([(5, 10), (0, 3), (2, 4), (9, 12), (20, 21)]) == 4 + 7 + 1


def test_the_command_line_and_its_errors(threads, report: Path, tmp_path: Path, capsys) -> None:
    assert threads.main([str(report)]) == 0
    assert "device 0 busy" in capsys.readouterr().out
    odd = tmp_path / "a #1?.sqlite"  # characters a URI would take for its own
    odd.write_bytes(report.read_bytes())
    assert threads.main([str(odd)]) == 0
    assert "device 1 busy" in capsys.readouterr().out
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
