"""Checks an Nsight Systems capture of a profiling window: the step ranges, their children, and kernel coverage.

    nsys profile -s none -t cuda,nvtx --capture-range=cudaProfilerApi --capture-range-end=stop -o win \\
        python train.py --config configs/resnet50_synthetic.yaml --profile.start_step 20 --profile.num_steps 10
    nsys export --type sqlite -o win.sqlite win.nsys-rep
    python bench/check_nsys.py win.sqlite --steps 20-29 [--processes 2]

For every process in the report it verifies: exactly the ``step N`` ranges asked for, each with ``forward``,
``backward`` and ``optimizer`` children (and ``data`` when the loader fetches), and every CUDA kernel launched
inside a range (by the time of its launch API call, on any thread of the process: autograd runs the backward pass
on its own thread): a step range, or one of the app's ranges of the work between steps (``validation``, ``epoch
end``, ``checkpoint``: a window that crosses an epoch's end holds them; ``metrics``: the module's reduction on the
log steps), counted apart by the innermost. Prints a JSON summary; exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from bisect import bisect_right
from collections import defaultdict
from pathlib import Path

REQUIRED_CHILDREN = ("forward", "backward", "optimizer")
#: The app's ranges of work between two steps: callbacks/ranges.py's VALIDATION, EPOCH_END, CHECKPOINT and METRICS.
BETWEEN_STEPS = ("validation", "epoch end", "checkpoint", "metrics")


def _tables(db: sqlite3.Connection) -> set[str]:
    return {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def nvtx_ranges(db: sqlite3.Connection) -> list[tuple[int, int, int, str]]:
    """(pid, start, end, name) of every closed NVTX push/pop or start/end range."""
    has_strings = "StringIds" in _tables(db)
    name = "COALESCE(e.text, s.value)" if has_strings else "e.text"
    join = "LEFT JOIN StringIds s ON s.id = e.textId" if has_strings else ""
    rows = db.execute(
        f"SELECT e.globalTid, e.start, e.end, {name} FROM NVTX_EVENTS e {join} "
        "WHERE e.end IS NOT NULL AND e.eventType IN (59, 60)"
    )
    return [((tid >> 24) & 0xFFFFFF, start, end, text or "") for tid, start, end, text in rows]


def kernel_launches(db: sqlite3.Connection) -> list[tuple[int, int]]:
    """(pid, launch API start time) of every kernel in the report."""
    rows = db.execute(
        "SELECT r.globalTid, r.start FROM CUPTI_ACTIVITY_KIND_KERNEL k "
        "JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId "
        "AND (r.globalTid >> 24) = (k.globalPid >> 24)"
    )
    return [((tid >> 24) & 0xFFFFFF, start) for tid, start in rows]


def host_syncs(db: sqlite3.Connection) -> dict[int, dict[str, int]]:
    """Per process: runtime calls that block the host on the GPU, and device-to-host copies (each a sync)."""
    out: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    tables = _tables(db)
    if "CUPTI_ACTIVITY_KIND_RUNTIME" in tables:
        rows = db.execute(
            "SELECT r.globalTid, s.value FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId "
            "WHERE s.value LIKE '%Synchronize%'"
        )
        for tid, name in rows:
            out[(tid >> 24) & 0xFFFFFF][name.split("_")[0]] += 1
    if "CUPTI_ACTIVITY_KIND_MEMCPY" in tables:
        for pid, count in db.execute(
            "SELECT (globalPid >> 24) & 16777215, COUNT(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY "
            "WHERE copyKind = 2 GROUP BY 1"
        ):
            out[pid]["DtoH copies"] += count
    return out


def check(path: str, steps: range, processes: int) -> dict:
    # Read only: a mistyped path is not created as an empty database.
    db = sqlite3.connect(Path(path).resolve().as_uri() + "?mode=ro", uri=True)
    try:
        tables = _tables(db)
    except sqlite3.DatabaseError as error:  # the .nsys-rep itself, or another file
        error = f"not an SQLite file ({error}): give nsys export --type sqlite's output, not the .nsys-rep"
        return {"report": path, "ok": False, "error": error}
    if "NVTX_EVENTS" not in tables:
        error = "no NVTX_EVENTS table: no NVTX ranges (nsys profile -t cuda,nvtx)"
        return {"report": path, "ok": False, "error": error}
    by_pid: dict[int, list[tuple[int, int, str]]] = defaultdict(list)
    for pid, start, end, name in nvtx_ranges(db):
        by_pid[pid].append((start, end, name))
    launches: dict[int, list[int]] = defaultdict(list)
    for pid, start in kernel_launches(db) if "CUPTI_ACTIVITY_KIND_KERNEL" in _tables(db) else []:
        launches[pid].append(start)
    syncs = host_syncs(db)
    report: dict = {"report": path, "expected_steps": [steps.start, steps.stop - 1], "processes": {}}
    ok = True
    pids = sorted(set(by_pid) | set(launches))
    for pid in pids:
        ranges = by_pid[pid]
        step_ranges = sorted((s, e, n) for s, e, n in ranges if n.startswith("step "))
        found = [int(n.split()[1]) for _, _, n in step_ranges]
        children_ok = True
        missing: dict[int, list[str]] = {}
        for s, e, n in step_ranges:
            inside = {name for cs, ce, name in ranges if cs >= s and ce <= e and name != n}
            lacking = [c for c in REQUIRED_CHILDREN if c not in inside]
            if lacking:
                children_ok = False
                missing[int(n.split()[1])] = lacking
        starts = [s for s, _, _ in step_ranges]
        between = sorted((s, e, n) for s, e, n in ranges if n in BETWEEN_STEPS)
        outside = 0
        in_between: dict[str, int] = defaultdict(int)
        for t in launches[pid]:
            i = bisect_right(starts, t) - 1
            if i >= 0 and t <= step_ranges[i][1]:
                continue
            # The innermost (latest-starting) range holding the launch: a save inside an epoch end is a checkpoint.
            name = next((n for s, e, n in reversed(between) if s <= t <= e), None)
            if name is None:
                outside += 1
            else:
                in_between[name] += 1
        process_ok = found == list(steps) and children_ok and outside == 0 and len(launches[pid]) > 0
        ok &= process_ok
        report["processes"][pid] = {
            "steps": found,
            "children_ok": children_ok,
            "missing_children": missing,
            "data_ranges": sum(1 for _, _, n in ranges if n == "data"),
            "epoch_start_ranges": sum(1 for _, _, n in ranges if n == "epoch start"),
            "kernels": len(launches[pid]),
            "kernels_between_steps": dict(in_between),
            "kernels_outside_ranges": outside,
            # Informational: the window's last step synchronizes once on purpose (before cudaProfilerStop).
            "host_syncs": dict(syncs.get(pid, {})),
            "ok": process_ok,
        }
    if len(pids) != processes:
        ok = False
        report["error"] = f"expected {processes} profiled process(es), found {len(pids)}"
    report["ok"] = ok
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("sqlite", nargs="+", help="nsys export --type sqlite output(s); one per rank for torchrun runs")
    p.add_argument("--steps", default="20-29", help="first-last step of the window")
    p.add_argument("--processes", type=int, default=1, help="profiled processes expected in each report")
    a = p.parse_args(argv)
    try:
        first, last = (int(x) for x in a.steps.split("-"))
    except ValueError:
        first, last = 0, -1
    if not 0 <= first <= last:
        p.error(f"--steps {a.steps!r}: give the window's first and last step, FIRST-LAST, e.g. 20-29")
    for path in a.sqlite:
        if not Path(path).is_file():
            p.error(
                f"{path} does not exist: give nsys's SQLite export (nsys export --type sqlite -o X.sqlite X.nsys-rep)"
            )
    results = [check(path, range(first, last + 1), a.processes) for path in a.sqlite]
    print(json.dumps(results, indent=1))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
