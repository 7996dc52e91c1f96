"""bench/check_nsys.py on a small SQLite file laid out as `nsys export --type sqlite` writes one: step ranges and
their children, kernels inside steps, inside the ranges between steps, or outside every range."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from nsys_export import MS, NVTX_EVENTS, new_export, tid

PID = 7


@pytest.fixture(scope="module")
def checker(bench_script):
    return bench_script("check_nsys")


def write_report(path: Path, ranges: list[tuple[int, int, str]], launches_ms: list[float]) -> Path:
    """One process: push/pop ranges (start ms, end ms, name) and one kernel per launch time (ms), launched from a
    second thread as autograd's backward would be."""
    db = new_export(
        path,
        ["cudaLaunchKernel_v7000"],
        NVTX_EVENTS,
        "CUPTI_ACTIVITY_KIND_RUNTIME (start INT, end INT, nameId INT, correlationId INT, globalTid INT)",
        "CUPTI_ACTIVITY_KIND_KERNEL (correlationId INT, globalPid INT)",
    )
    db.executemany(
        "INSERT INTO NVTX_EVENTS VALUES (?, ?, ?, NULL, 59, ?)",
        [(s * MS, e * MS, n, tid(PID, 1)) for s, e, n in ranges],
    )
    for i, t in enumerate(launches_ms):
        db.execute(
            "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, 0, ?, ?)",
            (int(t * MS), int(t * MS) + 10, i, tid(PID, 2)),
        )
        db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?)", (i, PID << 24))
    db.commit()
    db.close()
    return path


def step(n: int, start: int) -> list[tuple[int, int, str]]:
    """``step n`` over [start, start + 10] ms with its four children."""
    return [(start, start + 10, f"step {n}"), (start, start + 1, "data"), (start + 1, start + 4, "forward"),
            (start + 4, start + 8, "backward"), (start + 8, start + 10, "optimizer")]  # fmt: skip


def test_kernels_between_steps_count_apart_and_only_unnamed_ones_fail(checker, tmp_path: Path) -> None:
    # A checkpoint save inside the epoch's end: its kernel counts as the checkpoint's (the innermost range). The
    # module's metrics reduction on a log step runs after the step's range: its own range.
    ranges = step(20, 0) + [(10, 12, "validation"), (12, 15, "epoch end"), (13, 14, "checkpoint")] + step(21, 15)
    ranges += [(25, 26, "metrics")]
    ok = write_report(tmp_path / "ok.sqlite", ranges, [2, 5, 11, 12.5, 13.5, 20, 25.5])
    result = checker.check(str(ok), range(20, 22), processes=1)
    process = result["processes"][PID]
    assert result["ok"] and process["ok"]
    assert process["steps"] == [20, 21] and process["children_ok"] and process["data_ranges"] == 2
    assert process["kernels"] == 7
    assert process["kernels_between_steps"] == {"validation": 1, "epoch end": 1, "checkpoint": 1, "metrics": 1}
    assert process["kernels_outside_ranges"] == 0

    # A kernel in the gap after the last step (no range at all) fails the check, as does a missing step.
    bad = write_report(tmp_path / "bad.sqlite", ranges, [2, 27])
    result = checker.check(str(bad), range(20, 23), processes=1)
    process = result["processes"][PID]
    assert not result["ok"] and process["kernels_outside_ranges"] == 1 and process["steps"] == [20, 21]


def test_a_step_without_its_children_fails_and_main_exits_1(checker, tmp_path: Path, capsys) -> None:
    ranges = step(20, 0) + [(15, 25, "step 21"), (15, 20, "forward")]  # step 21 lacks backward and optimizer
    path = write_report(tmp_path / "r.sqlite", ranges, [2, 16])
    assert checker.main([str(path), "--steps", "20-21"]) == 1
    [result] = json.loads(capsys.readouterr().out)
    assert result["processes"][str(PID)]["missing_children"] == {"21": ["backward", "optimizer"]}


def test_the_ranges_between_steps_are_the_apps(checker) -> None:
    import callbacks.ranges as r

    assert checker.BETWEEN_STEPS == (r.VALIDATION, r.EPOCH_END, r.CHECKPOINT, r.METRICS)


@pytest.mark.parametrize(
    ("argv", "said"),
    [(["--steps", "20"], "--steps '20': give the window's first and last step"), (["--steps", "29-20"], "29-20")],
)
def test_a_wrong_path_or_window_is_said_and_no_file_is_made(checker, tmp_path: Path, capsys, argv, said) -> None:
    """A mistyped report path used to fail with sqlite's 'no such table' and leave an empty file under that name."""
    missing = tmp_path / "typo.sqlite"
    with pytest.raises(SystemExit):
        checker.main([str(missing)])
    assert f"{missing} does not exist: give nsys's SQLite export" in capsys.readouterr().err
    assert not missing.exists()
    report = write_report(tmp_path / "r.sqlite", [(0, 10, "step 20")], [])
    with pytest.raises(SystemExit):
        checker.main([str(report), *argv])
    assert said in capsys.readouterr().err


def test_a_report_without_nvtx_ranges_fails_with_the_reason(checker, tmp_path: Path) -> None:
    import sqlite3

    rep = tmp_path / "win.nsys-rep"  # the report itself instead of its SQLite export
    rep.write_bytes(b"NSYS report, not SQLite" * 100)
    result = checker.check(str(rep), range(20, 30), 1)
    assert result["ok"] is False and "not an SQLite file" in result["error"] and "not the .nsys-rep" in result["error"]

    bare = tmp_path / "bare.sqlite"
    sqlite3.connect(bare).execute("CREATE TABLE StringIds (id INT, value TEXT)").connection.commit()
    result = checker.check(str(bare), range(20, 30), 1)
    assert result["ok"] is False and "no NVTX_EVENTS table" in result["error"]
