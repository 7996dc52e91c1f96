"""When the GPU worked and when it waited, from an Nsight Systems SQLite export: for a run that stops making progress.

    nsys profile -s none -t cuda --cuda-graph-trace=node --duration 300 -o run python bench/throughput.py ...
    nsys export --type sqlite -o run.sqlite run.nsys-rep
    python bench/kernel_timeline.py run.sqlite [--bin 10] [--top 8]

Prints three Markdown tables, times in seconds from the report's first CUDA activity:
- per time bin: kernels that started, GPU busy time (kernel time clipped to the bin, summed over streams, so
  concurrent kernels count twice) and CUDA API calls: a stall shows as bins with API calls and no kernels (the host
  waits on something that is not GPU work) or with a busy GPU and few kernels (a slow kernel);
- the longest kernel instances;
- the last CUDA API calls of each thread: what the threads did last before the report ended.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
from collections import defaultdict
from pathlib import Path

NS = 1e9  # nsys times are in ns


def _tables(db: sqlite3.Connection) -> set[str]:
    return {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def _check(db: sqlite3.Connection) -> None:
    missing = {"CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "StringIds"} - _tables(db)
    if missing:
        raise ValueError(f"not an nsys export with CUDA traced (-t cuda): no {', '.join(sorted(missing))}")


def origin(db: sqlite3.Connection) -> int:
    """The start of the report's first kernel or CUDA API call (ns)."""
    kernels, calls = (
        db.execute(f"SELECT MIN(start) FROM {table}").fetchone()[0]
        for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME")
    )
    return min((t for t in (kernels, calls) if t is not None), default=0)


def bins(db: sqlite3.Connection, width_s: float) -> list[tuple[float, int, float, int]]:
    """``(bin start s, kernels started, GPU busy s, API calls started)`` per bin of ``width_s`` seconds, every bin
    from the first to the last activity, empty ones included."""
    _check(db)
    t0, width = origin(db), int(width_s * NS)
    kernels: dict[int, int] = defaultdict(int)
    busy: dict[int, float] = defaultdict(float)
    calls: dict[int, int] = defaultdict(int)
    last = 0
    for start, end in db.execute("SELECT start, end FROM CUPTI_ACTIVITY_KIND_KERNEL"):
        kernels[(start - t0) // width] += 1
        for b in range((start - t0) // width, (end - t0) // width + 1):  # a kernel longer than a bin fills several
            lo, hi = max(start, t0 + b * width), min(end, t0 + (b + 1) * width)
            busy[b] += max(0, hi - lo) / NS
        last = max(last, (end - t0) // width)
    for (start,) in db.execute("SELECT start FROM CUPTI_ACTIVITY_KIND_RUNTIME"):
        calls[(start - t0) // width] += 1
        last = max(last, (start - t0) // width)
    return [(b * width_s, kernels[b], busy[b], calls[b]) for b in range(last + 1)]


def longest_kernels(db: sqlite3.Connection, top: int) -> list[tuple[float, float, str]]:
    """``(start s, duration ms, name)`` of the ``top`` longest kernel instances, longest first."""
    _check(db)
    t0 = origin(db)
    rows = db.execute(
        "SELECT k.start, k.end - k.start, s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k "
        "LEFT JOIN StringIds s ON s.id = k.shortName ORDER BY k.end - k.start DESC LIMIT ?",
        (top,),
    )
    return [((start - t0) / NS, duration / 1e6, name or "?") for start, duration, name in rows]


def last_calls(db: sqlite3.Connection, per_thread: int) -> list[tuple[int, float, float, str]]:
    """``(thread id, start s, duration ms, API)`` of each thread's last ``per_thread`` CUDA API calls, by thread and
    start."""
    _check(db)
    t0 = origin(db)
    rows = db.execute(
        "SELECT tid, start, dur, name FROM (SELECT r.globalTid & 16777215 AS tid, r.start AS start, "
        "r.end - r.start AS dur, s.value AS name, ROW_NUMBER() OVER (PARTITION BY r.globalTid ORDER BY r.start DESC) "
        "AS n FROM CUPTI_ACTIVITY_KIND_RUNTIME r LEFT JOIN StringIds s ON s.id = r.nameId) WHERE n <= ? "
        "ORDER BY tid, start",
        (per_thread,),
    )
    return [(tid, (start - t0) / NS, dur / 1e6, name or "?") for tid, start, dur, name in rows]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("sqlite", type=Path, help="an `nsys export --type sqlite` file")
    p.add_argument("--bin", type=float, default=10.0, help="bin width in seconds (default 10)")
    p.add_argument("--top", type=int, default=8, help="longest kernels and last API calls per thread (default 8)")
    a = p.parse_args(argv)
    if a.bin <= 0 or a.top < 1:
        sys.exit(f"--bin must be > 0 (got {a.bin}) and --top at least 1 (got {a.top})")
    if not a.sqlite.is_file():
        sys.exit(f"{a.sqlite}: no such file (make one with: nsys export --type sqlite -o {a.sqlite} REPORT.nsys-rep)")
    db = sqlite3.connect(f"file:{a.sqlite}?mode=ro", uri=True)
    try:
        rows = bins(db, a.bin)
    except ValueError as error:
        sys.exit(f"{a.sqlite}: {error}")
    print("| from s | kernels | GPU busy s | API calls |\n|---|---|---|---|")
    print("\n".join(f"| {t:g} | {k} | {b:.2f} | {c} |" for t, k, b, c in rows))
    print("\n| start s | kernel ms | longest kernels |\n|---|---|---|")
    print("\n".join(f"| {t:.3f} | {ms:.2f} | {name[:80]} |" for t, ms, name in longest_kernels(db, a.top)))
    print("\n| thread | start s | ms | last API calls |\n|---|---|---|---|")
    print("\n".join(f"| {tid} | {t:.3f} | {ms:.2f} | {name} |" for tid, t, ms, name in last_calls(db, a.top)))


if __name__ == "__main__":
    main()
