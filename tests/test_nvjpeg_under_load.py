"""bench/nvjpeg_under_load.py without a GPU: its arguments, one process per connections value with the variable set,
and its table."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest


@pytest.fixture(scope="module")
def under_load(bench_script):
    return bench_script("nvjpeg_under_load")


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "train" / "c0").mkdir(parents=True)
    (tmp_path / "train" / "c0" / "a.JPEG").write_bytes(b"\xff\xd8")
    return tmp_path


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--connections", "8,64"], "--connections: CUDA takes 1 to 32 hardware queues, got [8, 64]"),
        (["--connections", "eight"], "--connections: comma-separated whole numbers from 1 to 32, got 'eight'"),
        (["--bindings", "preallocated,pil"], "--bindings: pil unknown; choose from preallocated, torchvision"),
        (["--calls", "0"], "--calls must be at least 1, got 0"),
        (["--timeout", "0"], "--timeout must be positive, got 0.0"),
    ],
)
def test_bad_arguments_are_refused_with_what_is_valid(under_load, folder, capsys, argv, message) -> None:
    with pytest.raises(SystemExit):
        under_load.parse(["--data", str(folder), *argv])
    assert message in capsys.readouterr().err


def test_a_folder_without_training_files_is_refused(under_load, tmp_path, capsys) -> None:
    with pytest.raises(SystemExit):
        under_load.parse(["--data", str(tmp_path)])
    assert f"--data {tmp_path}: no files in {tmp_path / 'train'}/<class>/" in capsys.readouterr().err


def test_each_connections_value_runs_in_a_process_of_its_own_and_the_rows_make_one_table(
    under_load, folder, monkeypatch, capsys
) -> None:
    calls = []

    def fake_run(cmd, capture_output, text, env, timeout):  # noqa: ANN001
        value = int(cmd[cmd.index("--child") + 1])
        calls.append((value, env["CUDA_DEVICE_MAX_CONNECTIONS"]))
        rows = [
            {"connections": value, "binding": "preallocated", "load": "idle", "threads": 1, "call_ms": 8.46,
             "cpu_ms": 8.47, "img_s": 13566.2, "refused": 0},
            {"connections": value, "binding": "preallocated", "load": "busy", "threads": 1,
             "call_ms": 196.65 if value == 8 else 19.63, "cpu_ms": 196.6 if value == 8 else 19.6, "img_s": 630.4,
             "refused": 2},
        ]  # fmt: skip
        stdout = "noise\n" + "".join("ROW " + json.dumps(r) + "\n" for r in rows)
        return SimpleNamespace(returncode=0, stdout=stdout, stderr="")

    monkeypatch.setattr(subprocess, "run", fake_run)
    under_load.main(["--data", str(folder), "--connections", "8,32"])
    assert calls == [(8, "8"), (32, "32")]  # CUDA reads the variable at its start: one process per value
    lines = capsys.readouterr().out.splitlines()
    start = lines.index("| " + " | ".join(under_load.COLUMNS) + " |")
    assert lines[start + 2 :] == [
        "| 8 | preallocated | idle | 1 | 8.46 | 8.47 | 13,566 | 0 |",
        "| 8 | preallocated | busy | 1 | 196.65 | 196.60 | 630 | 2 |",
        "| 32 | preallocated | idle | 1 | 8.46 | 8.47 | 13,566 | 0 |",
        "| 32 | preallocated | busy | 1 | 19.63 | 19.60 | 630 | 2 |",
    ]


def test_a_failed_process_stops_the_run_and_names_its_value(under_load, folder, monkeypatch) -> None:
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: SimpleNamespace(returncode=1, stdout="", stderr="boom"))
    with pytest.raises(SystemExit, match="the process with CUDA_DEVICE_MAX_CONNECTIONS=8 failed"):
        under_load.main(["--data", str(folder), "--connections", "8"])

    def too_long(cmd, **kwargs):  # noqa: ANN001, ANN003
        assert kwargs["timeout"] == 5
        raise subprocess.TimeoutExpired(cmd, kwargs["timeout"])

    monkeypatch.setattr(subprocess, "run", too_long)
    with pytest.raises(SystemExit, match="CUDA_DEVICE_MAX_CONNECTIONS=32 ran past --timeout 5 s"):
        under_load.main(["--data", str(folder), "--connections", "32", "--timeout", "5"])
