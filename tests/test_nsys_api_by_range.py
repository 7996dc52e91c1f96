"""bench/nsys_api_by_range.py on a small SQLite file laid out as `nsys export --type sqlite` writes one."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from nsys_export import MS, NVTX_EVENTS, RUNTIME, new_export, tid


@pytest.fixture(scope="module")
def counter(bench_script):
    return bench_script("nsys_api_by_range")


@pytest.fixture
def report(tmp_path: Path) -> Path:
    path = tmp_path / "calls.sqlite"
    names = ["cuMemFree_v2", "cudaLaunchKernel_v7000", "cudaMemcpyAsync_v3020", "row B"]
    db = new_export(path, names, NVTX_EVENTS, RUNTIME)
    db.executemany(
        "INSERT INTO NVTX_EVENTS VALUES (?, ?, ?, ?, ?, ?)",
        [
            (0, 100 * MS, "row A", None, 59, tid(7, 1)),  # a push/pop range with its text inline
            (100 * MS, 200 * MS, None, 3, 59, tid(7, 1)),  # its name in StringIds
            (1 * MS, 200 * MS, "other process", None, 59, tid(8, 1)),  # starts after row A: listed after it
            (300 * MS, None, "never closed", None, 59, tid(7, 1)),
        ],
    )
    db.executemany(
        "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, ?, ?)",
        [
            (10 * MS, 30 * MS, 0, tid(7, 2)),  # another thread of the same process: counted in its ranges
            (50 * MS, 51 * MS, 0, tid(7, 1)),
            (20 * MS, 21 * MS, 1, tid(7, 1)),  # a launch: not an allocation, copy, free or sync
            (150 * MS, 158 * MS, 2, tid(7, 1)),
            (120 * MS, 125 * MS, 0, tid(8, 1)),  # process 8: only its own range
            (310 * MS, 311 * MS, 0, tid(7, 1)),  # inside a range that never closed: nowhere
        ],
    )
    db.commit()
    db.close()
    return path


def test_calls_are_counted_per_range_of_their_own_process(counter, report: Path) -> None:
    rows = counter.api_by_range(sqlite3.connect(report))
    assert rows == [
        ("row A", 1, "cuMemFree_v2", 2, 21.0, 20.0),
        ("other process", 1, "cuMemFree_v2", 1, 5.0, 5.0),
        ("row B", 1, "cudaMemcpyAsync_v3020", 1, 8.0, 8.0),
    ]
    assert counter.api_by_range(sqlite3.connect(report), range_filter="row B", api_filter="Free") == []
    assert counter.api_by_range(sqlite3.connect(report), api_filter="Memcpy") == [
        ("row B", 1, "cudaMemcpyAsync_v3020", 1, 8.0, 8.0)
    ]


def test_same_thread_keeps_a_range_to_its_thread_s_calls_and_every_api_counts_launches(counter, report: Path) -> None:
    db = sqlite3.connect(report)
    # Thread 2's free (10-30 ms) falls inside thread 1's "row A": counted there only without --same-thread.
    assert counter.api_by_range(db, same_thread=True) == [
        ("row A", 1, "cuMemFree_v2", 1, 1.0, 1.0),
        ("other process", 1, "cuMemFree_v2", 1, 5.0, 5.0),
        ("row B", 1, "cudaMemcpyAsync_v3020", 1, 8.0, 8.0),
    ]
    # The launch (20-21 ms, thread 1) is no allocation, free, copy or sync: counted with every_api only.
    assert counter.api_by_range(db, range_filter="row A", every_api=True) == [
        ("row A", 1, "cuMemFree_v2", 2, 21.0, 20.0),
        ("row A", 1, "cudaLaunchKernel_v7000", 1, 1.0, 1.0),
    ]
    assert counter.api_by_range(db, range_filter="row A", same_thread=True, every_api=True) == [
        ("row A", 1, "cuMemFree_v2", 1, 1.0, 1.0),
        ("row A", 1, "cudaLaunchKernel_v7000", 1, 1.0, 1.0),
    ]


def test_os_runtime_counts_the_os_calls_of_each_range(counter, report: Path) -> None:
    db = sqlite3.connect(report)
    with pytest.raises(ValueError, match=r"-t osrt,nvtx.*no OSRT_API"):
        counter.api_by_range(db, os_runtime=True)
    db.execute(f"CREATE TABLE {RUNTIME.replace('CUPTI_ACTIVITY_KIND_RUNTIME', 'OSRT_API')}")
    db.execute("INSERT INTO StringIds VALUES (4, 'pthread_cond_timedwait')")
    db.executemany(
        "INSERT INTO OSRT_API VALUES (?, ?, ?, ?)",
        [(60 * MS, 64 * MS, 4, tid(7, 1)), (70 * MS, 72 * MS, 4, tid(7, 2)), (160 * MS, 161 * MS, 4, tid(7, 1))],
    )
    # Every OS call counts (no allocation/copy filter), the CUDA calls none.
    assert counter.api_by_range(db, os_runtime=True) == [
        ("row A", 1, "pthread_cond_timedwait", 2, 6.0, 4.0),
        ("row B", 1, "pthread_cond_timedwait", 1, 1.0, 1.0),
    ]
    assert counter.api_by_range(db, range_filter="row A", same_thread=True, os_runtime=True) == [
        ("row A", 1, "pthread_cond_timedwait", 1, 4.0, 4.0)
    ]


def test_ranges_counts_the_closed_ranges_of_a_name(counter, report: Path) -> None:
    db = sqlite3.connect(report)
    db.execute("INSERT INTO NVTX_EVENTS VALUES (?, ?, ?, ?, ?, ?)", (400 * MS, 500 * MS, "row A", None, 59, tid(7, 1)))
    db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, ?, ?)", (410 * MS, 413 * MS, 0, tid(7, 1)))
    assert counter.api_by_range(db, range_filter="row A") == [("row A", 2, "cuMemFree_v2", 3, 24.0, 20.0)]


def test_the_table_and_the_errors_of_the_command_line(counter, report: Path, tmp_path: Path, capsys) -> None:
    counter.main([str(report), "--range", "row A"])
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["| range | ranges | API | calls | total ms | longest ms |", "|---|---|---|---|---|---|",
                     "| row A | 1 | cuMemFree_v2 | 2 | 21.00 | 20.00 |"]  # fmt: skip
    counter.main([str(report), "--range", "row A", "--same-thread", "--every-api"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[2:] == ["| row A | 1 | cuMemFree_v2 | 1 | 1.00 | 1.00 |",
                         "| row A | 1 | cudaLaunchKernel_v7000 | 1 | 1.00 | 1.00 |"]  # fmt: skip
    with pytest.raises(SystemExit, match="missing.sqlite: no such file"):
        counter.main([str(tmp_path / "missing.sqlite")])
    bare = tmp_path / "bare.sqlite"
    sqlite3.connect(bare).execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)").connection.commit()
    with pytest.raises(SystemExit, match="-t cuda,nvtx.*no CUPTI_ACTIVITY_KIND_RUNTIME, NVTX_EVENTS"):
        counter.main([str(bare)])
    with pytest.raises(SystemExit):  # one of the two kinds of calls
        counter.main([str(report), "--every-api", "--os-runtime"])
