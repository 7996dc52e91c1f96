"""Two step-time reports side by side: what a change did to the step, phase by phase (``step_report.py --compare``).

The question after every change a performance engineer makes (a compile mode, another decoder, a new kernel) is
"how much faster, where, and is it more than noise?". This answers it from two reports of ``step_report.py``
(``<run folder>/step_report/window_<A>-<B>.json``, or one made from Kineto traces)::

    python step_report.py --compare runs/before/version_0 runs/after/version_0

It prints, in Markdown: the settings that differ between the two runs (as far as the reports record them), images/s
and the mean step per phase on a clock both reports have (the GPU's where both measured it), the phase that changed
the step most, how often a step of B was shorter than one of A (over every pair of steps: a change within the steps'
own spread says "repeat both runs"), and both verdicts. Pure analysis over plain data, like ``step_report.py``.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from trace_summary import PHASES

#: Steps per report below which the spread of step times says nothing.
MIN_STEPS = 5
#: Change of the mean step, as a share of A's, below which the step is called unchanged.
MOVED = 0.005
#: Share of step pairs in which one side's step is shorter, at or beyond which the change is called clear of noise.
CLEAR = 0.9
#: Settings of a rank summary (``callbacks/step_timer.py``) that set a window's speed, as ``step_report.py``
#: records them: the first group on every summary, ``setup`` on those written since the comparison exists.
SUMMARY_KEYS = ("compile", "compile_tuning", "input", "cpu_decoder", "decode_threads", "device_connections")
SETUP_KEYS = (
    "arch",
    "precision",
    "channels_last",
    "batch_size",
    "accumulate_grad_batches",
    "world_size",
    "device_name",
    "torch",
)


class CompareError(ValueError):
    """A report that cannot be compared (no finished steps); the message names the report."""


def settings(report: dict) -> dict[str, Any]:
    """The recorded settings of a report's run: each key's value on its ranks (``a/b`` if they differ), no key for
    what no rank recorded (a report older than the field, or made from a Kineto trace)."""
    out: dict[str, Any] = {}
    for key in (*SETUP_KEYS, *SUMMARY_KEYS):
        values = []
        for rank in report["ranks"]:
            holder = (rank.get("setup") or {}) if key in SETUP_KEYS else rank
            if key in holder and holder[key] not in values:
                values.append(holder[key])
        if values:
            out[key] = values[0] if len(values) == 1 else "/".join(str(v) for v in values)
    return out


def setting_differences(a: dict, b: dict) -> list[tuple[str, Any, Any]]:
    """``(key, A's value, B's value)`` of each setting both reports recorded with different values."""
    sa, sb = settings(a), settings(b)
    return [
        (key, sa[key], sb[key])
        for key in (*SETUP_KEYS, *SUMMARY_KEYS)
        if key in sa and key in sb and sa[key] != sb[key]
    ]


def common_clock(a: dict, b: dict) -> str:
    """``gpu`` when every rank of both reports timed its steps on the GPU, else ``host``."""
    return "gpu" if all("gpu" in r["stats"]["clocks"] for r in (*a["ranks"], *b["ranks"])) else "host"


def step_times(report: dict, clock: str) -> list[float]:
    """Every step's time (ms) on ``clock``, over every rank."""
    return [s[clock]["total"] for r in report["ranks"] for s in r["steps"] if s.get(clock)]


def phase_means(report: dict, clock: str) -> dict[str, float]:
    """Mean ms per step of each phase and of the step on ``clock``, the mean over ranks (means, not medians: the
    phases then add up to the step, so the change of the step splits into the changes of its phases)."""
    ranks = [r["stats"][clock]["mean_ms"] for r in report["ranks"] if clock in r["stats"]]
    return {p: statistics.fmean(m[p] for m in ranks) for p in (*PHASES, "total")}


def shorter_share(a: list[float], b: list[float]) -> float:
    """The share of pairs (one step of A, one of B) in which B's step is the shorter (ties count half): 1.0 when
    every step of B beat every step of A, 0.5 when the two runs' steps are alike (the Mann-Whitney U over n_A*n_B)."""
    wins = sum((y < x) + 0.5 * (y == x) for x in a for y in b)
    return wins / (len(a) * len(b))


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
    means = {"A": phase_means(a, clock), "B": phase_means(b, clock)}
    change = {p: means["B"][p] - means["A"][p] for p in (*PHASES, "total")}
    # The phase that moved the step most, as a share of the step's change: the headline of a before/after.
    largest = max(PHASES, key=lambda p: abs(change[p]))
    steps = {"A": step_times(a, clock), "B": step_times(b, clock)}
    share = None
    if min(len(steps["A"]), len(steps["B"])) >= MIN_STEPS:
        share = round(shorter_share(steps["A"], steps["B"]), 3)
    rates = {name: report["overall"].get("images_per_s") for name, report in (("A", a), ("B", b))}
    rate_clocks = {name: report["overall"].get("clock") for name, report in (("A", a), ("B", b))}
    if rates["A"] and rates["B"] and rate_clocks["A"] != rate_clocks["B"]:
        notes.append(f"images/s on different clocks: A's {rate_clocks['A']}, B's {rate_clocks['B']}")
    return {
        "clock": clock,
        "differences": setting_differences(a, b),
        "settings": {"A": settings(a), "B": settings(b)},
        "images_per_s": rates,
        "speedup": round(rates["B"] / rates["A"], 4) if rates["A"] and rates["B"] else None,
        "phase_ms": {name: {p: round(v, 4) for p, v in m.items()} for name, m in means.items()},
        "change_ms": {p: round(v, 4) for p, v in change.items()},
        "largest": largest,
        "steps": {
            name: {"count": len(t), "min": min(t), "median": statistics.median(t), "max": max(t)}
            for name, t in steps.items()
        },
        "b_shorter_share": share,
        "gpu_busy": {name: report["overall"].get("gpu_busy") for name, report in (("A", a), ("B", b))},
        "data_pct": {name: report["overall"].get("data_pct") for name, report in (("A", a), ("B", b))},
        "verdicts": {"A": a["verdict"], "B": b["verdict"]},
        "windows": {"A": a["window"], "B": b["window"]},
        "notes": notes,
    }


def noise_text(result: dict) -> str:
    """Whether the change of the step is clear of the steps' own spread, in words."""
    share, steps = result["b_shorter_share"], result["steps"]
    spread = ", ".join(f"{name} {s['min']:.2f}-{s['max']:.2f} ms over {s['count']} steps" for name, s in steps.items())
    if share is None:
        fewest = min(s["count"] for s in steps.values())
        return f"too few steps to judge the noise ({fewest}; {MIN_STEPS} or more a report): {spread}"
    which, pct = ("shorter", share) if share >= 0.5 else ("longer", 1 - share)
    head = f"B's step is {which} than A's in {100 * pct:.0f}% of step pairs ({spread})"
    if pct >= CLEAR:
        return f"{head}: clear of the noise"
    return f"{head}: within the steps' spread; repeat both runs (or a longer window) before trusting the difference"


def share_text(result: dict) -> str:
    """The largest phase change's share of the step's change, when that says something: the step changed by at
    least :data:`MOVED` of A's step (two eager runs on an H200 differed by 0.03%, and a 0.028 ms phase read "191%
    of the step's change") and the phase's change has the step's sign and is no larger (phases that trade time, one
    up and another down, get the step's own change instead)."""
    change, total = result["change_ms"], result["change_ms"]["total"]
    phase = change[result["largest"]]
    if abs(total) < MOVED * result["phase_ms"]["A"]["total"]:
        return f" (the step {total:+.3f} ms: unchanged within {100 * MOVED:g}%)"
    if phase * total > 0 and abs(phase) <= abs(total):
        return f", {100 * phase / total:.0f}% of the step's change"
    return f" (the step {total:+.3f} ms: the other phases moved the other way)"


def _number(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def markdown(result: dict, names: tuple[str, str]) -> str:
    """The comparison as Markdown, ``names`` the two reports' paths (A, B)."""
    clock = "GPU" if result["clock"] == "gpu" else "host"
    sa, sb = result["settings"]["A"], result["settings"]["B"]
    out = [
        "# Step reports compared",
        "",
        f"- A: `{names[0]}` (steps {_window(result, 'A')})",
        f"- B: `{names[1]}` (steps {_window(result, 'B')})",
        "",
    ]
    if result["differences"]:
        out.append(
            "Settings that differ: " + "; ".join(f"{k} {_value(x)} -> {_value(y)}" for k, x, y in result["differences"])
        )
    elif sa and sb:
        same = ", ".join(f"{k} {_value(sa[k])}" for k in SETUP_KEYS if k in sa and k in sb)
        out.append(f"The same settings as far as both reports record them{': ' + same if same else ''}.")
    else:
        out.append(
            "Settings: not recorded in "
            + " and ".join(n for n, s in (("A", sa), ("B", sb)) if not s)
            + " (a report from before step_report.py recorded them, or made from a Kineto trace)."
        )
    out += ["", f"| {clock} clock | A | B | B - A | B / A |", "|---|---|---|---|---|"]
    rates, change = result["images_per_s"], result["change_ms"]
    speedup = _number(result["speedup"])
    delta = "-" if None in rates.values() else f"{rates['B'] - rates['A']:+,.1f}"
    out.append(f"| images/s | {_number(rates['A'], 1)} | {_number(rates['B'], 1)} | {delta} | {speedup} |")
    for phase in (*PHASES, "total"):
        a, b = result["phase_ms"]["A"][phase], result["phase_ms"]["B"][phase]
        ratio = f"{b / a:.3f}" if a > 0 else "-"
        label = "step, mean (ms)" if phase == "total" else f"{phase}, mean (ms)"
        out.append(f"| {label} | {a:.3f} | {b:.3f} | {change[phase]:+.3f} | {ratio} |")
    for key, label in (("gpu_busy", "GPU busy"), ("data_pct", "data wait")):
        values = result[key]
        if any(v is not None for v in values.values()):
            scale = 100 if key == "gpu_busy" else 1
            cells = [f"{scale * v:.1f}%" if v is not None else "-" for v in values.values()]
            diff = "-" if None in values.values() else f"{round(scale * (values['B'] - values['A']), 1) or 0.0:+.1f} pt"
            out.append(f"| {label} | {cells[0]} | {cells[1]} | {diff} | |")
    largest = result["largest"]
    out.append("")
    if change[largest] != 0:
        out.append(f"Largest change: {largest} {change[largest]:+.3f} ms{share_text(result)}.")
    out += [
        f"Noise: {noise_text(result)}.",
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
