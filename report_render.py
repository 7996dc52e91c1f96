"""Renders a step-time report (``step_report.py``) as Markdown and as a PNG chart drawn with Pillow.

The chart stacks each step's phase times (GPU clock where measured, else host) per rank, with the side-stream copy
beside each step, so a straggler or an input stall shows as a taller or differently coloured column.
"""

from __future__ import annotations

import io
import math
import textwrap

from trace_summary import EPOCH_START, PHASES


def between_text(gaps: list[dict]) -> str:
    """The work between steps of a window: ``epoch end after step 24 (412.3 ms, of which 262.1 ms the next epoch's
    first batch); ...``, and ``epoch start before step 25 (212.3 ms, the epoch's first batch)`` for a window that
    opens at an epoch's first step."""
    return "; ".join(
        f"{g['what']} before step {g['after_step'] + 1} ({g['host_ms']:.1f} ms, the epoch's first batch)"
        if g["what"] == EPOCH_START
        else f"{g['what']} after step {g['after_step']} ({g['host_ms']:.1f} ms"
        + (f", of which {g['first_fetch_ms']:.1f} ms the next epoch's first batch" if g.get("first_fetch_ms") else "")
        + ")"
        for g in gaps
    )


def ranks_text(report: dict) -> str:
    """``2 rank(s)``, or ``1 of 8 rank(s) (the others not traced)`` for a report read from some ranks' traces."""
    run, n = report["overall"].get("run_world_size"), report["world_size"]
    return f"{n} of {run} rank(s) (the others not traced)" if run else f"{n} rank(s)"


def markdown(report: dict) -> str:
    """The readable report."""
    o, w = report["overall"], report["window"]
    copies = o.get("copies")
    out = [f"# Step-time report: steps {w[0]}-{w[1]}", "", f"**{report['verdict']}**", "", "| | |", "|---|---|"]
    rows = [
        ("ranks", ranks_text(report)),
        (
            f"images/s ({'these' if o.get('run_world_size') else 'all'} ranks, {o.get('clock') or 'host'} clock)",
            o["images_per_s"],
        ),
        ("median step (host, ms)", o.get("host_step_ms", o["step_ms"])),
        ("median step (GPU, ms)", o.get("gpu_step_ms")),
        ("data wait (% of step, mean / max of ranks)", f"{o['data_pct']} / {o['data_pct_max']}"),
        ("GPU busy", f"{100 * o['gpu_busy']:.1f}% ({o['gpu_busy_source']})" if o.get("gpu_busy") is not None else None),
        ("GPU behind host at step end (ms)", o.get("lag_ms")),
    ]
    if o.get("between_steps"):
        rows.append(("between steps (left out of images/s and GPU busy)", between_text(o["between_steps"])))
    if copies:
        rows += [
            ("H2D copies", f"{copies['count']} ({copies['source']}), {copies['time_ms']:.3f} ms"),
            (
                "H2D overlapped with compute",
                f"{100 * copies['overlap']:.1f}%" if copies["overlap"] is not None else None,
            ),
            ("compute waited for input (ms)", copies.get("waited_ms")),
            ("pinned / pageable / unknown", f"{copies['pinned']} / {copies['pageable']} / {copies['unknown']}"),
        ]
    out += [f"| {k} | {'n/a' if v is None else v} |" for k, v in rows]
    header = "| rank | clock | " + " | ".join(PHASES) + " | step | h2d (side stream) |"
    out += ["", "## Median per step (ms)", "", header, "|" + "---|" * (len(PHASES) + 4)]
    for r in report["ranks"]:
        for clock in r["stats"]["clocks"]:
            m = r["stats"][clock]["median_ms"]
            h2d = r["stats"]["h2d_ms"] if clock == "gpu" else None
            cells = " | ".join(f"{m[p]:.3f}" for p in (*PHASES, "total"))
            out.append(f"| {r['rank']} | {clock} | {cells} | {'' if h2d is None else f'{h2d:.3f}'} |")
    if report["world_size"] > 1:
        clock = o.get("clock") or "host"
        head = (f"| rank | img/s ({clock} clock) | step ms ({clock}) | data+optimizer+other ms | data wait % | "
                "host data ms | GPU busy | straggler |")  # fmt: skip
        out += ["", "## Ranks", "", head, "|---|---|---|---|---|---|---|---|"]
        slow = {s["rank"]: s for s in report["stragglers"]}
        for r in report["ranks"]:
            s = r["stats"]
            flag = f"+{slow[r['rank']]['excess_pct']}% ({slow[r['rank']]['phase']})" if r["rank"] in slow else ""
            busy = f"{100 * r['gpu_busy']:.1f}%" if r.get("gpu_busy") is not None else "n/a"
            host_data = "n/a" if s.get("host_data_ms") is None else s["host_data_ms"]
            out.append(f"| {r['rank']} | {s['images_per_s']} | {s['step_ms']} | {s['unsynced_ms']} | "
                       f"{s['data_pct']} | {host_data} | {busy} | {flag} |")  # fmt: skip
    out += ["", "## Steps (ms)", "", "| rank | step | images | clock | " + " | ".join(PHASES) + " | step | h2d |",
            "|" + "---|" * (len(PHASES) + 6)]  # fmt: skip
    for r in report["ranks"]:
        for s in r["steps"]:
            for clock in ("host", "gpu"):
                if s.get(clock):
                    cells = " | ".join(f"{s[clock][p]:.3f}" for p in (*PHASES, "total"))
                    h2d = s.get("h2d") if clock == "gpu" else None
                    out.append(f"| {r['rank']} | {s['step']} | {s.get('images') or ''} | {clock} | {cells} | "
                               f"{'' if h2d is None else f'{h2d:.3f}'} |")  # fmt: skip
    if report["findings"]:
        out += ["", "## What to change", ""] + [f"- {f}" for f in report["findings"]]
    out += ["", "## How this was measured", "", MEASURED]
    return "\n".join(out) + "\n"


MEASURED = (
    "Images/s and the median step are on the GPU's clock when CUDA events (or a Kineto trace) timed every step: the "
    "window from its first step's start to its last step's end as the GPU ran them. Opening a window under nsys "
    "drains the GPU's queue, and the host of a GPU-bound run then enqueues steps faster than the GPU runs them, so "
    "the host's clock would overstate the rate; the host's median step is given beside. The data wait is what the "
    "GPU idled through: per step the smaller of the host's and the GPU's `data` time; the host's own wait is "
    "listed apart. "
    "Phases follow the NVTX ranges of each step: `data` (loader hand-off and issuing the next batch's copy), "
    "`forward`, `backward`, `optimizer`, `other` (the rest of the step). Host times are `perf_counter` at the range "
    "boundaries. GPU times from CUDA events at the same boundaries on the compute stream (recorded inside the window "
    "only, read after one synchronize at its end): GPU `data` is the compute stream waiting for the host's fetch or "
    "for its input, and GPU busy is the rest of the window (an upper bound: gaps between kernels inside a phase "
    "count as busy). From a Kineto trace GPU phases are kernel time and GPU busy is exact. `h2d` is the host-to-device "
    "copy on the prefetcher's side stream (the normalization after it is not timed); its overlap is the share of "
    "copy time that lies inside the "
    "compute stream's forward..optimizer spans (events) or inside kernels on other streams (Kineto). Compute waited "
    "for input: in each fetch, how long the compute stream took to pass it beyond the host's own time (events), or "
    "how much later than both the end of its launch call and the kernels before it the first compute kernel after a "
    "fetch started (Kineto): the batch's copy was not done. A copy that overlaps no compute while the compute stream "
    "has nothing issued (whenever the host falls behind, as at a window's first step, which the profiler's start "
    "drains) holds nothing up: the prefetch counts as hidden while at most 10% of copy time is waited for. "
    "Stragglers: ranks that spend over 5% of a step longer than the other ranks in data+optimizer+other; under DDP "
    "the fast ranks wait for them inside forward (buffer broadcast) and backward (gradient all-reduce), so those "
    "phases are left out. Work between steps (validation, an epoch's end, a checkpoint save) is listed apart and left "
    "out of images/s and GPU busy; after an epoch's end so is the next epoch's first fetch, where the loader refills: "
    "that step starts after its fetch. Copies issued inside such a gap are left out of the copy figures."
)


def render_png(report: dict, max_ranks: int = 8) -> bytes:
    """A PNG chart: stacked phase times per step (one panel per rank, GPU clock where measured) and per rank."""
    from PIL import Image, ImageDraw, ImageFont

    colors = {"data": (214, 39, 40), "forward": (31, 119, 180), "backward": (44, 160, 44), "optimizer": (255, 127, 14),
              "other": (170, 170, 170), "h2d": (148, 103, 189)}  # fmt: skip
    ranks = [r for r in report["ranks"] if r["steps"]][:max_ranks]  # a rank without steps has nothing to draw
    panels: list[tuple[str, list[str], list[dict], list[float | None]]] = []
    for r in ranks:
        clock = r["stats"]["clocks"][-1]
        panels.append((f"rank {r['rank']} per step ({clock} clock, ms)", [str(s["step"]) for s in r["steps"]],
                       [s[clock] for s in r["steps"]], [s.get("h2d") for s in r["steps"]]))  # fmt: skip
    timed = [r for r in report["ranks"] if r["steps"]]
    if len(timed) > 1:
        clock = "gpu" if all("gpu" in r["stats"]["clocks"] for r in timed) else "host"
        slow = {s["rank"] for s in report["stragglers"]}
        panels.append((f"median step per rank ({clock} clock, ms; * straggler)",
                       [f"{r['rank']}{'*' if r['rank'] in slow else ''}" for r in timed],
                       [r["stats"][clock]["median_ms"] for r in timed],
                       [r["stats"]["h2d_ms"] for r in timed]))  # fmt: skip
    verdict_lines = textwrap.wrap(report["verdict"], 150) or [""]
    width, panel_h = 960, 190
    legend = 20 + 14 * len(verdict_lines) + 10
    top = legend + 36
    image = Image.new("RGB", (width, top + panel_h * len(panels) + 10), "white")
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default()
    w = report["window"]
    o = report["overall"]
    head = (f"step report, steps {w[0]}-{w[1]}, {report['world_size']} rank(s), {o['images_per_s'] or 'n/a'} img/s "
            f"({o.get('clock') or 'host'} clock)")  # fmt: skip
    draw.text((10, 4), head, fill="black", font=font)
    for i, line in enumerate(verdict_lines):
        draw.text((10, 20 + 14 * i), line, fill="black", font=font)
    x = 10
    for name in (*PHASES, "h2d"):
        draw.rectangle([x, legend, x + 12, legend + 12], fill=colors[name])
        label = "h2d (side stream)" if name == "h2d" else name
        draw.text((x + 16, legend), label, fill="black", font=font)
        x += 30 + int(draw.textlength(label, font=font))
    for n, (title, labels, values, h2d) in enumerate(panels):
        y0 = top + n * panel_h
        left, right, plot_top, bottom = 60, width - 20, y0 + 18, y0 + panel_h - 24
        draw.text((left, y0 + 2), title, fill="black", font=font)
        peak = max([v["total"] for v in values] + [h or 0.0 for h in h2d] + [1e-9])
        tick = _nice(peak / 5)
        ticks = math.ceil(peak / tick - 1e-9)
        scale = (bottom - plot_top) / (tick * ticks)
        for i in range(ticks + 1):
            y = bottom - i * tick * scale
            draw.line([left, y, right, y], fill=(230, 230, 230))
            draw.text((4, y - 6), f"{i * tick:g}", fill="black", font=font)
        slot = (right - left) / max(1, len(values))
        every = max(1, int(len(values) * 30 / (right - left)) + 1)
        for i, (v, h) in enumerate(zip(values, h2d, strict=True)):
            x0 = left + i * slot + slot * 0.1
            x1 = x0 + slot * 0.6
            y = bottom
            for phase in PHASES:
                height = v[phase] * scale
                if height > 0:
                    draw.rectangle([x0, y - height, x1, y], fill=colors[phase])
                y -= height
            if h:
                draw.rectangle([x1 + slot * 0.05, bottom - h * scale, x1 + slot * 0.2, bottom], fill=colors["h2d"])
            if i % every == 0:
                draw.text((x0, bottom + 4), labels[i], fill="black", font=font)
        draw.line([left, bottom, right, bottom], fill="black")
        draw.line([left, plot_top, left, bottom], fill="black")
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _nice(x: float) -> float:
    """The smallest of 1, 2, 2.5, 5 x 10^k at or above ``x``."""
    if x <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(x))
    return next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= x)
