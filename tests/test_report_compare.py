"""report_compare.py and ``step_report.py --compare``: two reports with known answers (the phase that changed, the
speed-up, per step or per image, the spread call, the settings that differ, the clock both share), the command line's
refusals, and real CPU runs' reports (live and made from Kineto traces) compared end to end."""

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
from trace_summary import SETUP_KEY


def summary(forward: list[float], gpu: bool = True, setup: dict | None = None, images: int = 256,
            **fields: object) -> dict:  # fmt: skip
    """A rank summary with one step per entry of ``forward`` (ms): data 1, backward 50, optimizer 5, other 2 ms."""
    rows = []
    for i, ms in enumerate(forward):
        times = {"data": 1.0, "forward": ms, "backward": 50.0, "optimizer": 5.0, "other": 2.0}
        times["total"] = sum(times.values())
        rows.append({"step": 20 + i, "images": images, "host": dict(times), "gpu": dict(times) if gpu else None,
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


SETUP = {"model.arch": "resnet50", "model.channels_last": True, "data.batch_size": 256, "data.crop_size": 224,
         "trainer.precision": "bf16-mixed", "trainer.accumulate_grad_batches": 1, "world_size": 1,
         "device_name": "NVIDIA H200", "torch": "2.11.0"}  # fmt: skip
JITTER = [0.0, 0.3, -0.2, 0.1, -0.3, 0.2, -0.1, 0.0, 0.25, -0.25]


def test_a_shorter_forward_is_named_as_the_change_with_its_speedup_and_called_clear_of_the_spread():
    a = build_report([summary([40 + j for j in JITTER], setup=SETUP)])
    b = build_report([summary([30 + j for j in JITTER], setup=SETUP)])
    result = report_compare.compare(a, b)
    assert result["clock"] == "gpu" and result["unit"] == "ms" and result["differences"] == []
    assert result["change"]["forward"] == pytest.approx(-10.0) and result["change"]["total"] == pytest.approx(-10)
    assert result["change"]["backward"] == 0 and result["largest"] == "forward"
    assert result["speedup"] == pytest.approx(98 / 88, rel=1e-3)  # 256 images per 98 ms against per 88 ms
    assert result["b_shorter_share"] == 1.0
    text = report_compare.markdown(result, ("a.json", "b.json"))
    assert "Largest change: forward -10.000 ms, 100% of the step's change." in text
    assert "B's step is shorter than A's in 100% of step pairs (A 97.70-98.30 ms over 10 steps, B 87.70-88.30" in text
    # What the share measures, and what it cannot: two runs of one command differ more than steps of one window.
    assert "clear of the window's step-to-step spread; run-to-run variation is not measured (run A again)" in text
    assert "| forward, mean (ms) | 40.000 | 30.000 | -10.000 | 0.750 |" in text
    assert "| step, mean (ms) | 98.000 | 88.000 | -10.000 | 0.898 |" in text
    assert "| data, mean (ms) | 1.000 | 1.000 | +0.000 | 1.000 |" in text  # a zero change is never "-0.000"
    assert "No setting differs of the 9 both reports record: model.arch resnet50, trainer.precision bf16-mixed" in text
    # The other way round: B slower, as clearly.
    assert "B's step is longer than A's in 100% of step pairs" in report_compare.markdown(
        report_compare.compare(b, a), ("b.json", "a.json")
    )


def test_steps_of_another_number_of_images_are_compared_per_image():
    """A smaller batch's shorter step is no gain: B's 96-image steps of 68 ms are 0.708 ms an image against A's
    0.383 (256 images in 98 ms), so B is slower, and the phases and the spread say so per image."""
    a = build_report([summary([40 + j for j in JITTER], setup=SETUP)])
    b = build_report([summary([10 + j for j in JITTER], setup=dict(SETUP, **{"data.batch_size": 96}), images=96)])
    result = report_compare.compare(a, b)
    assert result["unit"] == "us/image" and result["speedup"] == pytest.approx(0.540, abs=1e-3)
    assert result["phases"]["A"]["total"] == pytest.approx(98 / 256 * 1000, rel=1e-3)
    assert result["phases"]["B"]["total"] == pytest.approx(68 / 96 * 1000, rel=1e-3)
    assert result["largest"] == "backward"  # 50 ms over 96 images against over 256
    assert result["b_shorter_share"] == 0.0
    text = report_compare.markdown(result, ("a", "b"))
    assert "Settings that differ: data.batch_size 256 -> 96" in text
    assert (
        "The steps hold different numbers of images (within a report or between the two): times are per image" in text
    )
    assert "| step, mean (us/image) |" in text
    assert "B's step is longer than A's in 100% of step pairs" in text


def test_ranks_of_one_step_count_as_one_step():
    """Under DDP every rank's step ends together: two ranks' 3 steps are 3 steps, too few to judge."""
    a = build_report([summary([40.0, 40.2, 39.8]), summary([40.0, 40.2, 39.8], rank=1)])
    b = build_report([summary([30.0, 30.2, 29.8]), summary([30.0, 30.2, 29.8], rank=1)])
    result = report_compare.compare(a, b)
    assert result["steps"]["A"]["count"] == 3 and result["b_shorter_share"] is None
    assert "too few steps to judge the spread (3; 5 or more a report)" in report_compare.markdown(result, ("a", "b"))
    # Two ranks whose phases differ (one waits longer for data): the step's phases are their mean.
    c = build_report([summary([40.0] * 6), summary([44.0] * 6, rank=1)])
    assert report_compare.compare(c, c)["phases"]["A"]["forward"] == 42.0


def test_a_change_inside_the_steps_spread_is_said_so():
    steps = [40 + 3 * j for j in JITTER]
    a = build_report([summary(steps)])
    b = build_report([summary([s + 0.1 for s in reversed(steps)])])
    result = report_compare.compare(a, b)
    assert 0.1 < result["b_shorter_share"] < 0.5
    text = report_compare.markdown(result, ("a", "b"))
    assert f"B's step is longer than A's in {100 * (1 - result['b_shorter_share']):.0f}% of step pairs" in text
    assert "within the steps' spread; repeat both runs" in text


def test_too_few_steps_to_judge_the_spread_is_said():
    result = report_compare.compare(build_report([summary([40, 40, 40])]), build_report([summary([30] * 10)]))
    assert result["b_shorter_share"] is None
    assert "too few steps to judge the spread (3; 5 or more a report)" in report_compare.markdown(result, ("a", "b"))


def test_settings_that_differ_or_that_one_report_lacks_are_named():
    a = build_report([summary([40] * 6, setup=dict(SETUP, **{"trainer.precision": "16-mixed", "model.compile": None}))])
    b = build_report(
        [summary([30] * 6, setup=dict(SETUP, **{"model.compile": "reduce-overhead"}), compile="reduce-overhead")]
    )
    result = report_compare.compare(a, b)
    assert result["differences"] == [("trainer.precision", "16-mixed", "bf16-mixed"),
                                      ("model.compile", None, "reduce-overhead")]  # fmt: skip
    text = report_compare.markdown(result, ("a", "b"))
    assert (
        "Settings that differ: trainer.precision 16-mixed -> bf16-mixed; model.compile none -> reduce-overhead" in text
    )
    # A report from before the settings were recorded: its compile mode and input path; what only B records is named,
    # the run's own settings first.
    old = build_report([summary([40] * 6)])
    result = report_compare.compare(old, b)
    assert result["differences"] == [("model.compile", None, "reduce-overhead")]
    text = report_compare.markdown(result, ("a", "b"))
    assert "Not compared, recorded in A only: input, model.compile_tuning." in text
    assert "Not compared, recorded in B only: trainer.precision, trainer.accumulate_grad_batches, world_size, " in text
    assert "device_name, torch, model.arch, model.channels_last, data.batch_size and 1 more." in text
    # Its decoder and decode threads are None when unused: no value to set against B's.
    unused = build_report([summary([40] * 6, cpu_decoder=None, decode_threads=None)])
    assert "data.decode_threads" not in report_compare.settings(unused)
    assert report_compare.settings(build_report([summary([40] * 6, decode_threads=2)]))["data.decode_threads"] == 2
    # A report made from a Kineto trace: "trace" is how it was made, not what fed the steps.
    trace = {k: v for k, v in summary([40] * 6).items() if k not in report_compare.SUMMARY_SETTINGS}
    trace["input"] = "trace"
    text = report_compare.markdown(report_compare.compare(build_report([trace]), b), ("a", "b"))
    assert "A records no settings (a report made from Kineto traces has those the profiling window recorded" in text
    assert "input" not in report_compare.settings(build_report([trace]))


def test_the_models_batch_size_linked_to_the_datas_is_one_difference():
    setup_b = dict(SETUP, **{"data.batch_size": 128, "model.batch_size": 128})
    a = build_report([summary([40] * 6, setup=dict(SETUP, **{"model.batch_size": 256}))])
    assert report_compare.compare(a, build_report([summary([40] * 6, setup=setup_b)]))["differences"] == [
        ("data.batch_size", 256, 128)
    ]
    # Set apart from the data's (from Python), it is a difference of its own.
    setup_c = dict(SETUP, **{"model.batch_size": 128})
    assert report_compare.compare(a, build_report([summary([40] * 6, setup=setup_c)]))["differences"] == [
        ("model.batch_size", 256, 128)
    ]


def test_a_report_of_some_ranks_or_with_a_rank_short_of_a_step_counts_the_runs_images():
    """One run's 2-rank report against a report of rank 0's trace alone (``profile.ranks [0]``), and against a copy
    whose rank 1 lacks the last step: the same steps, not per image, no change."""
    full = build_report([summary([40] * 6), summary([40] * 6, rank=1)])
    rank0 = build_report([summary([40] * 6, world_size=2)])
    assert rank0["overall"]["run_world_size"] == 2
    short = build_report([summary([40] * 6), summary([40] * 5, rank=1)])
    for other in (rank0, short):
        result = report_compare.compare(full, other)
        assert result["unit"] == "ms" and result["change"]["total"] == 0, result
    # The run's images/s on either clock: rank 0's trace alone read as half the run's rate (a speed-up of 0.5).
    host = build_report([summary([40] * 6, gpu=False), summary([40] * 6, gpu=False, rank=1)])
    host_rank0 = build_report([summary([40] * 6, gpu=False, world_size=2)])
    for a, b, clock in ((full, rank0, "gpu"), (host, host_rank0, "host")):
        result = report_compare.compare(a, b)
        assert result["clock"] == clock and result["speedup"] == 1.0, result["images_per_s"]
        assert result["images_per_s"]["A"] == pytest.approx(2 * 256 / 0.098, rel=1e-3)


def test_a_short_last_batch_in_both_windows_is_compared_per_image_weighted_by_images():
    """Steps of 256 images and an epoch's last of 64 in both: per image, the window's time over its images."""
    a = summary([40] * 6)
    a["steps"][-1]["images"] = 64
    result = report_compare.compare(build_report([a]), build_report([a]))
    assert result["unit"] == "us/image"
    assert result["phases"]["A"]["total"] == pytest.approx(6 * 98 / (5 * 256 + 64) * 1000)


def test_ranks_that_disagree_on_a_setting_show_both_values():
    report = build_report([summary([40] * 6, setup=SETUP), summary([40] * 6, setup=dict(SETUP, torch="2.9"), rank=1)])
    assert report_compare.settings(report)["torch"] == "2.11.0/2.9"


def test_a_report_without_a_gpu_clock_moves_both_onto_the_hosts_figures():
    gpu = build_report([summary([40] * 6)])
    for rank in (gpu,):  # the GPU ran 40 ms behind the host: its clock, and the report's headline rate, differ
        for step in rank["ranks"][0]["steps"]:
            step["gpu"]["forward"] += 40
            step["gpu"]["total"] += 40
        rank["ranks"][0]["gpu_wall_ms"] = 6 * 138.0
    gpu = build_report(gpu["ranks"])
    cpu = build_report([summary([40] * 6, gpu=False)])
    result = report_compare.compare(gpu, cpu)
    assert result["clock"] == "host" and result["change"]["total"] == 0  # the host's times are equal
    assert result["images_per_s"]["A"] == result["images_per_s"]["B"] == pytest.approx(256 / 0.098, rel=1e-3)
    assert gpu["overall"]["images_per_s"] == pytest.approx(256 / 0.138, rel=1e-3)  # the GPU's, not compared
    assert result["data_pct"] == {"A": pytest.approx(100 / 98, abs=0.01), "B": pytest.approx(100 / 98, abs=0.01)}
    assert result["notes"] == ["B has no GPU clock (a CPU run, or a rank without CUDA events): compared on the host's"]
    assert "| host clock |" in report_compare.markdown(result, ("a", "b"))


def test_a_report_without_a_finished_step_is_refused_by_name():
    empty = build_report([summary([])])
    with pytest.raises(report_compare.CompareError, match="^B has no finished step"):
        report_compare.compare(build_report([summary([40] * 6)]), empty)


@pytest.mark.parametrize(
    ("a_forward", "b_forward", "b_backward", "said"),
    [
        (40.0, 30.0, 50.0, "Largest change: forward -10.000 ms, 100% of the step's change."),
        # Two eager runs on an H200: a 0.03% step change is not split into phases.
        (40.0, 40.02, 50.0, "Largest change: forward +0.020 ms (the step +0.020 ms: under 0.5% of A's, not split"),
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
    result = {"change": change, "largest": "forward", "phases": {"A": {"total": 100.0}}, "unit": "ms"}
    assert report_compare.share_text(result) == " (the step +2.600 ms: the other phases moved the other way)"


def test_the_spread_call_counts_ties_as_half_and_calls_ninety_percent_clear():
    assert report_compare.shorter_share([40.0] * 6, [40.0] * 6) == 0.5
    # Nine of B's ten steps beat every step of A, the tenth none: 90 of 100 pairs, exactly the threshold.
    a = build_report([summary([40.0] * 10)])
    b = build_report([summary([30.0] * 9 + [50.0])])
    result = report_compare.compare(a, b)
    assert result["b_shorter_share"] == 0.9
    assert "in 90% of step pairs (A 98.00-98.00 ms over 10 steps, B 88.00-108.00 ms over 10 steps): clear of the" in (
        report_compare.markdown(result, ("a", "b"))
    )


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
    assert report_compare._signed(1992.71, 1) == "+1,992.7" and report_compare._signed(-0.0004) == "+0.000"
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
    assert step_report.main(["--compare", str(b), str(tmp_path / "b")]) == 1
    assert f"step_report: A and B are the same report, {b}: pass two" in capsys.readouterr().err
    empty = write(tmp_path / "c", build_report([summary([])]))
    assert step_report.main(["--compare", str(a), str(empty)]) == 1
    assert f"step_report: {empty}: has no finished step" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        step_report.main(["--compare", str(a)])
    assert exit_info.value.code == 2
    assert "--compare takes two reports, A then B; got 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        step_report.main(["--compare", str(a), str(b), "--out", str(tmp_path)])
    assert "--batch-size and --out do not apply" in capsys.readouterr().err


def _broken(report: dict, how: str) -> object:
    report = json.loads(json.dumps(report))
    if how == "a JSON that is no report":
        return {"data": 1}
    if how == "a rank without steps' fields":
        report["ranks"] = [{"stats": {}, "steps": [{"step": 1}]}]
    elif how == "no verdict":
        del report["verdict"]
    elif how == "overall null":
        report["overall"] = None
    elif how == "a phase null":
        report["ranks"][0]["steps"][0]["gpu"]["forward"] = None
    elif how == "no clocks":
        del report["ranks"][0]["stats"]["clocks"]
    return report


@pytest.mark.parametrize(
    "how", ["a JSON that is no report", "a rank without steps' fields", "no verdict", "overall null", "a phase null",
            "no clocks"],
)  # fmt: skip
def test_a_report_missing_a_field_is_refused_in_one_line_naming_the_file(tmp_path, capsys, how):
    good = write(tmp_path / "a", build_report([summary([40] * 6)]))
    bad = write(tmp_path / "b", _broken(build_report([summary([40] * 6)]), how))
    assert step_report.main(["--compare", str(good), str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"step_report: {bad}: ") and err.count("\n") == 1, err
    assert "pass a step_report/window_*.json with finished steps" in err


def test_two_real_cpu_runs_reports_record_their_settings_and_compare(tmp_path, capsys):
    """Two CPU fits with a window, the second in bf16 with another crop: each report records every model and data
    option, the trainer's, the device's and torch's, and the comparison names the differences on the host's clock."""
    for name, precision in (("a", "32-true"), ("b", "bf16-mixed")):
        fit_with_window(tmp_path / name, ProfilerWindow(start_step=2, num_steps=5), max_steps=8, precision=precision)
    (report,) = (tmp_path / "a").rglob("step_report/window_2-6.json")
    setup = json.loads(report.read_text())["ranks"][0]["setup"]
    assert {k: setup[k] for k in ("model.arch", "data.batch_size", "data.crop_size", "data.source", "model.fused_sgd",
                                  "trainer.precision", "trainer.accumulate_grad_batches", "world_size", "device_name",
                                  "torch", "strategy", "cudnn.benchmark")} == {
        "model.arch": "resnet18", "data.batch_size": 4, "data.crop_size": 32, "data.source": "synthetic",
        "model.fused_sgd": None, "trainer.precision": "32-true", "trainer.accumulate_grad_batches": 1,
        "world_size": 1, "device_name": "cpu", "torch": torch.__version__, "strategy": "SingleDeviceStrategy",
        "cudnn.benchmark": False,
    }  # fmt: skip
    assert json.loads(json.dumps(setup)) == setup  # every value as JSON writes it back (a Path root as its string)
    assert not [key for key in setup if key.startswith(("model._", "data._"))]  # options only
    assert step_report.main(["--compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "Settings that differ: data.root " in out and "; trainer.precision 32-true -> bf16-mixed" in out
    assert "| host clock |" in out and "Spread: B's step is" in out


def test_a_report_made_from_the_apps_trace_alone_has_the_live_reports_settings(tmp_path, capsys):
    """The window records its run's settings in the Kineto trace: a report made from the trace alone, copied away from
    its run folder (no config.yaml), holds the live report's settings (the device, torch and world size included) and
    batch size, and compares with the live report without a difference."""
    run = tmp_path / "run"
    window = ProfilerWindow(start_step=2, num_steps=5, torch_profiler=True, trace_dir=str(run / "traces"))
    fit_with_window(run, window, max_steps=8)
    (live,) = run.rglob("step_report/window_2-6.json")
    (trace,) = (run / "traces").glob("rank0_steps2-6.pt.trace.json")
    copied = tmp_path / "copied" / trace.name
    copied.parent.mkdir()
    copied.write_bytes(trace.read_bytes())
    assert step_report.main([str(copied)]) == 0
    (made,) = (tmp_path / "copied").rglob("window_2-6.kineto.json")
    live_setup, made_report = json.loads(live.read_text())["ranks"][0]["setup"], json.loads(made.read_text())
    assert made_report["ranks"][0]["setup"] == live_setup
    assert {k: live_setup[k] for k in ("world_size", "device_name", "torch", "data.batch_size")} == {
        "world_size": 1, "device_name": "cpu", "torch": torch.__version__, "data.batch_size": 4
    }  # fmt: skip
    assert [step["images"] for step in made_report["ranks"][0]["steps"]] == [4] * 5  # the recorded batch size
    capsys.readouterr()
    assert step_report.main(["--compare", str(live), str(made)]) == 0
    out = capsys.readouterr().out
    assert f"No setting differs of the {len(live_setup)} both reports record: model.arch resnet18" in out
    assert "Not compared" not in out and "records no settings" not in out


def test_a_report_made_from_kineto_traces_takes_its_settings_from_the_runs_config(tmp_path, capsys):
    """``python step_report.py RUN`` on traces that record no settings (an older version's): the run's config.yaml
    gives the report the settings a live one records under the same names, so a live report and a trace's compare on
    them."""
    run = tmp_path / "run"
    window = ProfilerWindow(start_step=2, num_steps=5, torch_profiler=True, trace_dir=str(run / "traces"),
                            report=False)  # fmt: skip
    fit_with_window(run, window, max_steps=8)
    (trace,) = (run / "traces").glob("*.pt.trace.json")
    recorded = json.loads(trace.read_text())
    del recorded[SETUP_KEY]
    trace.write_text(json.dumps(recorded))
    (run / "config.yaml").write_text(
        "trainer:\n  precision: bf16-mixed\n  accumulate_grad_batches: 1\nmodel:\n  arch: resnet18\n"
        "  channels_last: false\ndata:\n  class_path: datamodule.ImageNetDataModule\n  init_args:\n    batch_size: 4\n"
        "    crop_size: 32\n"
    )
    assert step_report.main([str(run)]) == 0
    (made,) = run.rglob("window_2-6.kineto.json")
    assert json.loads(made.read_text())["ranks"][0]["setup"] == {
        "model.arch": "resnet18", "model.channels_last": False, "data.batch_size": 4, "data.crop_size": 32,
        "trainer.precision": "bf16-mixed", "trainer.accumulate_grad_batches": 1,
    }  # fmt: skip
    fit_with_window(tmp_path / "live", ProfilerWindow(start_step=2, num_steps=5), max_steps=8)
    capsys.readouterr()
    assert step_report.main(["--compare", str(tmp_path / "live"), str(made)]) == 0
    out = capsys.readouterr().out
    assert "Settings that differ: trainer.precision 32-true -> bf16-mixed" in out
    assert "Not compared, recorded in A only: " in out and "input" not in out.split("Not compared")[0]


@pytest.mark.parametrize(("precision", "resolved"), [("bf16", "bf16-mixed"), (16, "16-mixed"), (32, "32-true"),
                                                     (None, "32-true"), ("bf16-mixed", "bf16-mixed")])  # fmt: skip
def test_a_configs_precision_is_read_as_lightning_resolves_it(precision, resolved):
    config = {"trainer": {"precision": precision}, "model": {"arch": "resnet18", "_instantiator": "x"}}
    setup = step_report._setup_from_config(config)
    assert setup["trainer.precision"] == resolved and "model._instantiator" not in setup
