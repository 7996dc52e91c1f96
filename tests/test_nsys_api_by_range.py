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
            (0, 200 * MS, "other process", None, 59, tid(8, 1)),
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
        ("row A", "cuMemFree_v2", 2, 21.0, 20.0),
        ("other process", "cuMemFree_v2", 1, 5.0, 5.0),
        ("row B", "cudaMemcpyAsync_v3020", 1, 8.0, 8.0),
    ]
    assert counter.api_by_range(sqlite3.connect(report), range_filter="row B", api_filter="Free") == []
    assert counter.api_by_range(sqlite3.connect(report), api_filter="Memcpy") == [
        ("row B", "cudaMemcpyAsync_v3020", 1, 8.0, 8.0)
    ]


def test_the_table_and_the_errors_of_the_command_line(counter, report: Path, tmp_path: Path, capsys) -> None:
    counter.main([str(report), "--range", "row A"])
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["| range | API | calls | total ms | longest ms |", "|---|---|---|---|---|",
                     "| row A | cuMemFree_v2 | 2 | 21.00 | 20.00 |"]  # fmt: skip
    with pytest.raises(SystemExit, match="missing.sqlite: no such file"):
        counter.main([str(tmp_path / "missing.sqlite")])
    bare = tmp_path / "bare.sqlite"
    sqlite3.connect(bare).execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)").connection.commit()
    with pytest.raises(SystemExit, match="-t cuda,nvtx.*no CUPTI_ACTIVITY_KIND_RUNTIME, NVTX_EVENTS"):
        counter.main([str(bare)])
