"""Two step-time reports side by side: what a change did to the step, phase by phase (``step_report.py --compare``).

The question after every change a performance engineer makes (a compile mode, another decoder, a new kernel) is
"how much faster, where, and is it more than noise?". This answers it from two reports of ``step_report.py``
(``<run folder>/step_report/window_<A>-<B>.json``, or one made from Kineto traces)::

    python step_report.py --compare runs/before/version_0 runs/after/version_0

It prints, in Markdown: the settings that differ between the two runs (every model and data option, the trainer's
precision, accumulation and world size, the GPU and torch, as the reports record them), images/s and each phase's
mean time on a clock both reports have (the GPU's where both measured it), per step, or per image when the steps do
not all hold one number of images, the phase that changed most, how often a step of B was shorter than one of A
(over every pair of steps: this measures the window's step-to-step spread, not how much two runs of one command
differ), and both verdicts. Pure analysis over plain data, like ``step_report.py``.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from trace_summary import PHASES

#: Steps per report below which the spread of step times says nothing.
MIN_STEPS = 5
#: Share of step pairs in which one side's step is shorter, at or beyond which the change is clear of the spread.
CLEAR = 0.9
#: Change of the mean step, as a share of A's, below which it is not split into phases.
MOVED = 0.005
#: A rank summary's own fields that name settings, under the names ``setup`` gives them: what a report written before
#: ``setup`` was recorded has to compare (``callbacks/step_timer.py`` records both).
SUMMARY_SETTINGS = {
    "compile": "model.compile",
    "compile_tuning": "model.compile_tuning",
    "cpu_decoder": "data.cpu_decoder",
    "decode_threads": "data.decode_threads",
}
#: The settings named when no setting differs, where recorded.
HEADLINE = ("model.arch", "trainer.precision", "data.batch_size", "world_size", "device_name")
#: Why a report may record no settings.
NO_SETTINGS = (
    "a report made from Kineto traces has those the profiling window recorded in them, or, in older traces, its run's "
    "config.yaml's, when step_report.py finds one beside traces/"
)


class CompareError(ValueError):
    """A report that cannot be compared; the message says why."""


def settings(report: dict) -> dict[str, Any]:
    """The recorded settings of a report's run: each key's value on its ranks (``a/b`` if they differ); no key for
    what no rank recorded."""
    values: dict[str, list] = {}
    for rank in report["ranks"]:
        recorded = dict(rank.get("setup") or {})
        for field, key in SUMMARY_SETTINGS.items():
            # A report from before ``setup``: the summary's own fields, where they are the option's value (its decoder
            # and decode threads are None when unused: no value to compare).
            if not rank.get("setup") and field in rank and (rank[field] is not None or field == "compile"):
                recorded[key] = rank[field]
        # The environment's hardware queues (none off CUDA), and, in a report from before ``setup``, what fed the
        # steps; "trace" is how a report was made, not a setting.
        if rank.get("device_connections") is not None:
            recorded["CUDA_DEVICE_MAX_CONNECTIONS"] = rank["device_connections"]
        if not rank.get("setup") and rank.get("input") not in (None, "trace"):
            recorded["input"] = rank["input"]
        for key, value in recorded.items():
            if value not in values.setdefault(key, []):
                values[key].append(value)
    return {key: v[0] if len(v) == 1 else "/".join(map(str, v)) for key, v in values.items()}


def common_clock(a: dict, b: dict) -> str:
    """``gpu`` when every rank of both reports timed its steps on the GPU, else ``host``."""
    return "gpu" if all("gpu" in r["stats"]["clocks"] for r in (*a["ranks"], *b["ranks"])) else "host"


def per_step(report: dict, clock: str) -> list[dict]:
    """Each step of the window: its phases' and its own time on ``clock``, the mean over the ranks that ran it (under
    DDP every rank's step ends together: one step, not one sample per rank), and the run's images in it: the mean of
    those ranks' images times the run's ranks (a report of some ranks' traces, or a rank without that step, holds
    fewer ranks than ran the step)."""
    by_step: dict[int, list[dict]] = {}
    for rank in report["ranks"]:
        for step in rank["steps"]:
            by_step.setdefault(step["step"], []).append(step)
    ranks = report["overall"].get("run_world_size") or len(report["ranks"])
    out = []
    for number, rows in sorted(by_step.items()):
        images = [row.get("images") for row in rows]
        out.append(
            {
                "step": number,
                "ms": {p: statistics.fmean(row[clock][p] for row in rows) for p in (*PHASES, "total")},
                "images": None if None in images else round(statistics.fmean(images) * ranks),
            }
        )
    return out


def shorter_share(a: list[float], b: list[float]) -> float:
    """The share of pairs (one step of A, one of B) in which B's step is the shorter (ties count half): 1.0 when
    every step of B beat every step of A, 0.5 when the two runs' steps are alike (the Mann-Whitney U over n_A*n_B)."""
    wins = sum((y < x) + 0.5 * (y == x) for x in a for y in b)
    return wins / (len(a) * len(b))


def _rate_and_data(report: dict, clock: str) -> tuple[float | None, float | None]:
    """images/s (the run's: all its ranks) and the mean data wait (% of the step) on ``clock``: the report's own
    figures on the GPU's clock, the ranks' host figures on the host's (a GPU report's headline rate is the GPU's).

    A report of some ranks' traces (``profile.ranks``) sums those ranks' rates only: its rate is scaled to the run's
    ranks, as its steps' images are (``per_step``), so that it compares with a report of every rank of the same run.
    """
    ranks = report["overall"].get("run_world_size") or len(report["ranks"])
    if clock == "gpu":
        rate = report["overall"].get("images_per_s")
        scaled = round(rate * ranks / len(report["ranks"]), 2) if rate else rate
        return scaled, report["overall"].get("data_pct")
    stats = [r["stats"] for r in report["ranks"] if r["steps"]]
    rates = [s.get("host_images_per_s") for s in stats]
    rate = round(sum(rates) * ranks / len(rates), 2) if rates and None not in rates else None
    return rate, round(statistics.fmean(s["host"]["pct"]["data"] for s in stats), 2)


def compare(a: dict, b: dict) -> dict:
    """The comparison of report ``b`` against report ``a`` (both as ``step_report.build_report`` returns them).

    Raises:
        CompareError: A report without a finished step (``A`` or ``B`` named in the message).
    """
    for name, report in (("A", a), ("B", b)):
        if not report.get("ranks") or not any(r["steps"] for r in report["ranks"]):
            raise CompareError(f"{name} has no finished step (a window that training ended inside): nothing to compare")
    clock = common_clock(a, b)
    notes = []
    for name, report in (("A", a), ("B", b)):
        if clock == "host" and all("gpu" in r["stats"]["clocks"] for r in report["ranks"]):
            other = "B" if name == "A" else "A"
            notes.append(f"{other} has no GPU clock (a CPU run, or a rank without CUDA events): compared on the host's")
    steps = {"A": per_step(a, clock), "B": per_step(b, clock)}
    # Per image when the steps do not all hold one number of images (another batch size, accumulation or world size
    # between the reports, or a short last batch of an epoch in a window): a shorter step of fewer images is no gain.
    counts = {s["images"] for side in steps.values() for s in side}
    unit = "us/image" if len(counts) > 1 and None not in counts else "ms"
    if len(counts) > 1 and None in counts:
        notes.append("images per step unknown in a report: compared per step")

    def value(step: dict, phase: str) -> float:
        return step["ms"][phase] * 1000 / step["images"] if unit == "us/image" else step["ms"][phase]

    # Per image, the window's time over its images (a short step weighs by its images, as in images/s); per step, the
    # mean step.
    means = {
        name: {
            p: sum(s["ms"][p] for s in side) * 1000 / sum(s["images"] for s in side)
            if unit == "us/image"
            else statistics.fmean(s["ms"][p] for s in side)
            for p in (*PHASES, "total")
        }
        for name, side in steps.items()
    }
    change = {p: means["B"][p] - means["A"][p] for p in (*PHASES, "total")}
    largest = max(PHASES, key=lambda p: abs(change[p]))  # the headline of a before/after
    totals = {name: [value(s, "total") for s in side] for name, side in steps.items()}
    share = None
    if min(len(t) for t in totals.values()) >= MIN_STEPS:
        share = round(shorter_share(totals["A"], totals["B"]), 3)
    figures = {"A": _rate_and_data(a, clock), "B": _rate_and_data(b, clock)}
    rates = {name: f[0] for name, f in figures.items()}
    settings_a, settings_b = settings(a), settings(b)
    return {
        "clock": clock,
        "unit": unit,
        "differences": differences(settings_a, settings_b),
        "one_side_only": {
            "A": [k for k in settings_a if k not in settings_b],
            "B": [k for k in settings_b if k not in settings_a],
        },
        "settings": {"A": settings_a, "B": settings_b},
        "images_per_s": rates,
        "speedup": round(rates["B"] / rates["A"], 4) if rates["A"] and rates["B"] else None,
        "phases": {name: {p: round(v, 4) for p, v in m.items()} for name, m in means.items()},
        "change": {p: round(v, 4) for p, v in change.items()},
        "largest": largest,
        "steps": {name: {"count": len(t), "min": min(t), "max": max(t)} for name, t in totals.items()},
        "b_shorter_share": share,
        "gpu_busy": {name: report["overall"].get("gpu_busy") for name, report in (("A", a), ("B", b))},
        "data_pct": {name: f[1] for name, f in figures.items()},
        "verdicts": {"A": a["verdict"], "B": b["verdict"]},
        "windows": {"A": a["window"], "B": b["window"]},
        "notes": notes,
    }


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(key, A's value, B's)`` of each setting both record with different values; ``model.batch_size`` left out when
    it changed as ``data.batch_size`` did (train.py links the model's copy, which scales the learning rate, to it)."""
    out = [(key, a[key], b[key]) for key in a if key in b and a[key] != b[key]]
    data = next(((x, y) for key, x, y in out if key == "data.batch_size"), None)
    return [row for row in out if not (row[0] == "model.batch_size" and row[1:] == data)]


def check(report: Any) -> None:
    """Raises :class:`CompareError` unless ``report`` is a step report with a finished step that :func:`compare`
    reads whole (each file is checked alone, so that the error can name it)."""
    if not isinstance(report, dict) or not isinstance(report.get("ranks"), list) or not report["ranks"]:
        raise CompareError("not a step report (no ranks)")
    if not any(isinstance(r, dict) and r.get("steps") for r in report["ranks"]):
        raise CompareError("has no finished step (a window that training ended inside): nothing to compare")
    try:
        markdown(compare(report, report), ("", ""))
    except (KeyError, TypeError, AttributeError, ValueError, IndexError, ZeroDivisionError) as error:
        raise CompareError(f"not a step report ({type(error).__name__}: {error})") from error


def noise_text(result: dict) -> str:
    """Whether the change of the step is clear of the window's step-to-step spread, in words."""
    share, steps, unit = result["b_shorter_share"], result["steps"], result["unit"]
    spread = ", ".join(
        f"{name} {s['min']:.2f}-{s['max']:.2f} {unit} over {s['count']} steps" for name, s in steps.items()
    )
    if share is None:
        fewest = min(s["count"] for s in steps.values())
        return f"too few steps to judge the spread ({fewest}; {MIN_STEPS} or more a report): {spread}"
    which, pct = ("shorter", share) if share >= 0.5 else ("longer", 1 - share)
    head = f"B's step is {which} than A's in {100 * pct:.0f}% of step pairs ({spread})"
    if pct >= CLEAR:
        # Steps inside one window vary less than two runs of one command do (a new process, another compile, the
        # GPU's clocks): the share cannot see the second.
        return f"{head}: clear of the window's step-to-step spread; run-to-run variation is not measured (run A again)"
    return f"{head}: within the steps' spread; repeat both runs (or a longer window) before trusting the difference"


def share_text(result: dict) -> str:
    """The largest phase change's share of the step's change, when that says something: the step moved by at least
    :data:`MOVED` of A's step (two eager runs on an H200 differed by 0.03%, and a 0.028 ms phase read "191% of the
    step's change") and the phase's change has the step's sign and is no larger (phases that trade time, one up and
    another down, get the step's own change instead)."""
    change, total, unit = result["change"], result["change"]["total"], result["unit"]
    phase = change[result["largest"]]
    if abs(total) < MOVED * result["phases"]["A"]["total"]:
        return f" (the step {_signed(total)} {unit}: under {100 * MOVED:g}% of A's, not split into phases)"
    if phase * total > 0 and abs(phase) <= abs(total):
        return f", {100 * phase / total:.0f}% of the step's change"
    return f" (the step {_signed(total)} {unit}: the other phases moved the other way)"


def _signed(value: float, digits: int = 3) -> str:
    """``+1,992.700``; a value that rounds to zero is ``+0.000``, never ``-0.000``."""
    return f"{round(value, digits) or 0.0:+,.{digits}f}"


def _number(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def settings_lines(result: dict) -> list[str]:
    """What differs between the two runs' settings, and what only one report records."""
    sa, sb = result["settings"]["A"], result["settings"]["B"]
    lines = []
    if result["differences"]:
        lines.append(
            "Settings that differ: " + "; ".join(f"{k} {_value(x)} -> {_value(y)}" for k, x, y in result["differences"])
        )
    elif sa and sb:
        same = ", ".join(f"{k} {_value(sa[k])}" for k in HEADLINE if k in sa and k in sb)
        lines.append(
            f"No setting differs of the {sum(k in sb for k in sa)} both reports record{': ' if same else ''}{same}."
        )
    for name, keys in result["one_side_only"].items():
        # The run's own settings (the GPU, torch, the world size) first: the options are many.
        keys = sorted(keys, key=lambda key: key.startswith(("model.", "data.")))
        if keys and (sa if name == "B" else sb):
            shown = ", ".join(keys[:8]) + (f" and {len(keys) - 8} more" if len(keys) > 8 else "")
            lines.append(f"Not compared, recorded in {name} only: {shown}.")
    for name, recorded in (("A", sa), ("B", sb)):
        if not recorded:
            lines.append(f"{name} records no settings ({NO_SETTINGS}).")
    return lines


def markdown(result: dict, names: tuple[str, str]) -> str:
    """The comparison as Markdown, ``names`` the two reports' paths (A, B)."""
    clock, unit = ("GPU" if result["clock"] == "gpu" else "host"), result["unit"]
    out = [
        "# Step reports compared",
        "",
        f"- A: `{names[0]}` (steps {_window(result, 'A')})",
        f"- B: `{names[1]}` (steps {_window(result, 'B')})",
        "",
        *(f"- {line}" for line in settings_lines(result)),  # a list: Markdown joins lines of a paragraph
    ]
    if result["unit"] == "us/image":
        out.append(
            "- The steps hold different numbers of images (within a report or between the two): times are per image "
            "(us), the window's time over its images, not per step."
        )
    out += ["", f"| {clock} clock | A | B | B - A | B / A |", "|---|---|---|---|---|"]
    rates, change = result["images_per_s"], result["change"]
    delta = "-" if None in rates.values() else _signed(rates["B"] - rates["A"], 1)
    out.append(
        f"| images/s | {_number(rates['A'], 1)} | {_number(rates['B'], 1)} | {delta} | {_number(result['speedup'])} |"
    )
    for phase in (*PHASES, "total"):
        a, b = result["phases"]["A"][phase], result["phases"]["B"][phase]
        ratio = f"{b / a:.3f}" if a > 0 else "-"
        label = f"{'step' if phase == 'total' else phase}, mean ({unit})"
        out.append(f"| {label} | {a:.3f} | {b:.3f} | {_signed(change[phase])} | {ratio} |")
    for key, label in (("gpu_busy", "GPU busy"), ("data_pct", "data wait")):
        values = result[key]
        if any(v is not None for v in values.values()):
            scale = 100 if key == "gpu_busy" else 1
            cells = [f"{scale * v:.1f}%" if v is not None else "-" for v in values.values()]
            diff = "-" if None in values.values() else f"{_signed(scale * (values['B'] - values['A']), 1)} pt"
            out.append(f"| {label} | {cells[0]} | {cells[1]} | {diff} | |")
    largest = result["largest"]
    out.append("")
    if change[largest] != 0:
        out.append(f"Largest change: {largest} {_signed(change[largest])} {unit}{share_text(result)}.")
    out += [
        f"Spread: {noise_text(result)}.",
        "",
        f"- verdict A: {result['verdicts']['A']}",
        f"- verdict B: {result['verdicts']['B']}",
    ]
    out += [f"- note: {note}" for note in result["notes"]]
    return "\n".join(out) + "\n"


def _window(result: dict, name: str) -> str:
    window = result["windows"][name]
    return f"{window[0]}-{window[1]}" if window else "none"


def _value(value: Any) -> str:
    return "none" if value is None else str(value)


def find_report(path: str | Path) -> Path:
    """The one report at ``path``: a report JSON, or a folder (a run folder, its ``step_report/``) holding exactly one.

    Raises:
        CompareError: No report there, or several (each named, to pass one).
    """
    path = Path(path)
    if path.is_file():
        return path
    if not path.is_dir():
        raise CompareError(f"{path} does not exist; pass a step report (window_*.json) or a run folder holding one")
    found = sorted(p for p in path.rglob("window_*.json") if p.parent.name == "step_report" or p.parent == path)
    if not found:
        raise CompareError(
            f"no step report (step_report/window_*.json) in {path}; a run with only Kineto traces: run "
            f"python step_report.py {path} first to make one"
        )
    if len(found) > 1:
        raise CompareError(f"{path} holds {len(found)} step reports; pass one of: " + ", ".join(map(str, found)))
    return found[0]
