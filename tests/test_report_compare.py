"""report_compare.py and ``step_report.py --compare``: two reports with known answers (the phase that changed, the
speed-up, the noise call, the settings that differ, the clock both share), the command line's refusals, and two real
CPU runs' reports compared end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from profiling_helpers import fit_with_window

import report_compare
import step_report
from callbacks import ProfilerWindow
from step_report import build_report


def summary(forward: list[float], gpu: bool = True, setup: dict | None = None, **fields: object) -> dict:
    """A rank summary with one step per entry of ``forward`` (ms): data 1, backward 50, optimizer 5, other 2 ms."""
    rows = []
    for i, ms in enumerate(forward):
        times = {"data": 1.0, "forward": ms, "backward": 50.0, "optimizer": 5.0, "other": 2.0}
        times["total"] = sum(times.values())
        rows.append({"step": 20 + i, "images": 256, "host": dict(times), "gpu": dict(times) if gpu else None,
                     "h2d": None, "lag": 5.0 if gpu else None})  # fmt: skip
    out = {
        "rank": 0, "device": "cuda:0" if gpu else "cpu", "source": "events" if gpu else "host",
        "window": [20, 20 + len(forward) - 1], "steps": rows, "wall_ms": sum(r["host"]["total"] for r in rows),
        "gpu_wall_ms": sum(r["host"]["total"] for r in rows) if gpu else None, "gpu_busy": 0.99 if gpu else None,
        "gpu_busy_source": "events" if gpu else None, "copies": None, "input": "on-device", "compile": None,
        "compile_tuning": False,
    }  # fmt: skip
    if setup is not None:
        out["setup"] = setup
    out.update(fields)
    return out


SETUP = {"arch": "resnet50", "precision": "bf16-mixed", "channels_last": True, "batch_size": 256,
         "accumulate_grad_batches": 1, "world_size": 1, "device_name": "NVIDIA H200", "torch": "2.11.0"}  # fmt: skip
JITTER = [0.0, 0.3, -0.2, 0.1, -0.3, 0.2, -0.1, 0.0, 0.25, -0.25]


def test_a_shorter_forward_is_named_as_the_change_with_its_speedup_and_called_clear_of_noise():
    a = build_report([summary([40 + j for j in JITTER], setup=SETUP)])
    b = build_report([summary([30 + j for j in JITTER], setup=SETUP)])
    result = report_compare.compare(a, b)
    assert result["clock"] == "gpu" and result["differences"] == []
    assert result["change_ms"]["forward"] == pytest.approx(-10.0) and result["change_ms"]["total"] == pytest.approx(-10)
    assert result["change_ms"]["backward"] == 0 and result["largest"] == "forward"
    assert result["speedup"] == pytest.approx(98 / 88, rel=1e-3)  # 256 images per 98 ms against per 88 ms
    assert result["b_shorter_share"] == 1.0
    text = report_compare.markdown(result, ("a.json", "b.json"))
    assert "Largest change: forward -10.000 ms, 100% of the step's change." in text
    assert "B's step is shorter than A's in 100% of step pairs (A 97.70-98.30 ms over 10 steps, B 87.70-88.30" in text
    assert "clear of the noise" in text
    assert "| forward, mean (ms) | 40.000 | 30.000 | -10.000 | 0.750 |" in text
    assert "| step, mean (ms) | 98.000 | 88.000 | -10.000 | 0.898 |" in text
    assert "The same settings as far as both reports record them: arch resnet50, precision bf16-mixed" in text
    # The other way round: B slower, as clearly.
    assert "B's step is longer than A's in 100% of step pairs" in report_compare.markdown(
        report_compare.compare(b, a), ("b.json", "a.json")
    )


def test_a_change_inside_the_steps_spread_is_called_noise():
    steps = [40 + 3 * j for j in JITTER]
    a = build_report([summary(steps)])
    b = build_report([summary([s + 0.1 for s in reversed(steps)])])
    result = report_compare.compare(a, b)
    assert 0.1 < result["b_shorter_share"] < 0.5
    text = report_compare.markdown(result, ("a", "b"))
    assert f"B's step is longer than A's in {100 * (1 - result['b_shorter_share']):.0f}% of step pairs" in text
    assert "within the steps' spread; repeat both runs" in text


def test_too_few_steps_to_judge_the_noise_is_said():
    result = report_compare.compare(build_report([summary([40, 40, 40])]), build_report([summary([30] * 10)]))
    assert result["b_shorter_share"] is None
    assert "too few steps to judge the noise (3; 5 or more a report)" in report_compare.markdown(result, ("a", "b"))


def test_settings_that_differ_are_listed_and_a_report_without_them_is_said_so():
    bf16 = dict(SETUP, precision="16-mixed")
    a = build_report([summary([40] * 6, setup=bf16)])
    b = build_report([summary([30] * 6, setup=SETUP, compile="reduce-overhead")])
    result = report_compare.compare(a, b)
    assert result["differences"] == [("precision", "16-mixed", "bf16-mixed"), ("compile", None, "reduce-overhead")]
    text = report_compare.markdown(result, ("a", "b"))
    assert "Settings that differ: precision 16-mixed -> bf16-mixed; compile none -> reduce-overhead" in text
    # A report from before the settings were recorded (no setup): only what both record is compared.
    old = build_report([summary([40] * 6)])
    assert report_compare.compare(old, b)["differences"] == [("compile", None, "reduce-overhead")]
    bare = build_report([{k: v for k, v in summary([40] * 6).items() if k not in report_compare.SUMMARY_KEYS}])
    text = report_compare.markdown(report_compare.compare(bare, b), ("a", "b"))
    assert "Settings: not recorded in A (a report from before" in text


def test_ranks_that_disagree_on_a_setting_show_both_values():
    report = build_report([summary([40] * 6, setup=SETUP), summary([40] * 6, setup=dict(SETUP, torch="2.9"), rank=1)])
    assert report_compare.settings(report)["torch"] == "2.11.0/2.9"


def test_a_report_without_a_gpu_clock_moves_both_onto_the_hosts():
    gpu = build_report([summary([40] * 6)])
    for step in gpu["ranks"][0]["steps"]:  # the GPU ran behind: its clock differs from the host's
        step["gpu"]["forward"] += 5
        step["gpu"]["total"] += 5
    cpu = build_report([summary([40] * 6, gpu=False)])
    result = report_compare.compare(gpu, cpu)
    assert result["clock"] == "host" and result["change_ms"]["total"] == 0  # the host's times are equal
    assert result["notes"][0] == "B has no GPU clock (a CPU run, or a rank without CUDA events): compared on the host's"
    assert "images/s on different clocks: A's gpu, B's host" in result["notes"]
    assert "| host clock |" in report_compare.markdown(result, ("a", "b"))


def test_a_report_without_a_finished_step_is_refused_by_name():
    empty = build_report([summary([])])
    with pytest.raises(report_compare.CompareError, match="^B has no finished step"):
        report_compare.compare(build_report([summary([40] * 6)]), empty)


def write(folder: Path, report: dict, name: str = "window_20-29.json") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(json.dumps(report))
    return path


def test_command_line_compares_two_run_folders_and_refuses_what_it_cannot_compare(tmp_path, capsys):
    a = write(tmp_path / "a" / "step_report", build_report([summary([40 + j for j in JITTER], setup=SETUP)]))
    b = write(tmp_path / "b" / "step_report", build_report([summary([30 + j for j in JITTER], setup=SETUP)]))
    assert step_report.main(["--compare", str(tmp_path / "a"), str(b)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"# Step reports compared\n\n- A: `{a}` (steps 20-29)\n- B: `{b}` (steps 20-29)")
    assert "| images/s | 2,612.2 | 2,909.1 | +296.9 | 1.114 |" in out
    # A folder with two reports (a live one and one made from its traces): which one is meant is asked.
    second = write(tmp_path / "a" / "step_report", build_report([summary([40] * 6)]), "window_20-29.kineto.json")
    assert step_report.main(["--compare", str(tmp_path / "a"), str(b)]) == 1
    assert f"{tmp_path / 'a'} holds 2 step reports; pass one of: {a}, {second}" in capsys.readouterr().err
    (tmp_path / "traces_only").mkdir()
    assert step_report.main(["--compare", str(tmp_path / "traces_only"), str(b)]) == 1
    err = capsys.readouterr().err
    assert f"no step report (step_report/window_*.json) in {tmp_path / 'traces_only'}" in err
    assert f"python step_report.py {tmp_path / 'traces_only'} first" in err
    assert step_report.main(["--compare", str(tmp_path / "missing"), str(b)]) == 1
    assert f"{tmp_path / 'missing'} does not exist" in capsys.readouterr().err
    not_report = tmp_path / "config.json"
    not_report.write_text('{"data": 1}')
    assert step_report.main(["--compare", str(not_report), str(b)]) == 1
    assert f"step_report: {not_report}: not a step report (KeyError" in capsys.readouterr().err
    empty = write(tmp_path / "c", build_report([summary([])]))
    assert step_report.main(["--compare", str(a), str(empty)]) == 1
    assert "step_report: B has no finished step" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        step_report.main(["--compare", str(a)])
    assert exit_info.value.code == 2
    assert "--compare takes two reports, A then B; got 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        step_report.main(["--compare", str(a), str(b), "--out", str(tmp_path)])
    assert "--batch-size and --out do not apply" in capsys.readouterr().err


def test_two_real_cpu_runs_reports_record_their_settings_and_compare(tmp_path, capsys):
    """Two CPU fits with a window, the second in bf16: each report records what ran, and the comparison names the
    difference and compares them on the host's clock."""
    for name, precision in (("a", "32-true"), ("b", "bf16-mixed")):
        fit_with_window(tmp_path / name, ProfilerWindow(start_step=2, num_steps=5), max_steps=8, precision=precision)
    (report,) = (tmp_path / "a").rglob("step_report/window_2-6.json")
    setup = json.loads(report.read_text())["ranks"][0]["setup"]
    assert setup == {"arch": "resnet18", "precision": "32-true", "channels_last": setup["channels_last"],
                     "batch_size": 4, "accumulate_grad_batches": 1, "world_size": 1, "device_name": "cpu",
                     "torch": torch.__version__}  # fmt: skip
    assert isinstance(setup["channels_last"], bool)
    assert step_report.main(["--compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "Settings that differ: precision 32-true -> bf16-mixed" in out and "| host clock |" in out
    assert "Noise: B's step is" in out


@pytest.mark.parametrize(
    ("a_forward", "b_forward", "b_backward", "said"),
    [
        (40.0, 30.0, 50.0, "Largest change: forward -10.000 ms, 100% of the step's change."),
        # Two eager runs on an H200: a 0.03% step change is no change to split into phases.
        (40.0, 40.02, 50.0, "Largest change: forward +0.020 ms (the step +0.020 ms: unchanged within 0.5%)."),
        # One phase down, another up: the step's own change, not a share above 100%.
        (40.0, 30.0, 58.0, "Largest change: forward -10.000 ms (the step -2.000 ms: the other phases moved the other"),
    ],
)
def test_the_largest_changes_share_of_the_step_is_given_only_where_it_means_something(
    a_forward, b_forward, b_backward, said
):
    b = summary([b_forward] * 6)
    for step in b["steps"]:
        for clock in ("host", "gpu"):
            step[clock]["backward"], step[clock]["total"] = b_backward, step[clock]["total"] + b_backward - 50
    result = report_compare.compare(build_report([summary([a_forward] * 6)]), build_report([b]))
    assert said in report_compare.markdown(result, ("a", "b"))


def test_a_largest_phase_against_the_steps_sign_is_no_share_of_it():
    # forward -1 ms while the four other phases gain 0.9 ms each: the step +2.6 ms, forward still the largest change.
    change = {"data": 0.9, "forward": -1.0, "backward": 0.9, "optimizer": 0.9, "other": 0.9, "total": 2.6}
    result = {"change_ms": change, "largest": "forward", "phase_ms": {"A": {"total": 100.0}}}
    assert report_compare.share_text(result) == " (the step +2.600 ms: the other phases moved the other way)"


def test_the_noise_call_counts_ties_as_half_and_calls_ninety_percent_clear():
    assert report_compare.shorter_share([40.0] * 6, [40.0] * 6) == 0.5
    # Nine of B's ten steps beat every step of A, the tenth none: 90 of 100 pairs, exactly the threshold.
    a = build_report([summary([40.0] * 10)])
    b = build_report([summary([30.0] * 9 + [50.0])])
    result = report_compare.compare(a, b)
    assert result["b_shorter_share"] == 0.9
    assert "in 90% of step pairs (A 98.00-98.00 ms over 10 steps, B 88.00-108.00 ms over 10 steps): clear of the" in (
        report_compare.markdown(result, ("a", "b"))
    )
