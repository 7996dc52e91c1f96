"""CUDA API calls that allocate, free, copy or synchronize, counted per NVTX range of an Nsight Systems SQLite export.

    nsys profile -s none -t cuda,nvtx -o calls python bench/nvjpeg_calls.py --data /tmp/jpegs --same-size 500 375
    nsys export --type sqlite -o calls.sqlite calls.nsys-rep
    python bench/nsys_api_by_range.py calls.sqlite [--range 'new files'] [--api cuMemFree]

A call belongs to every range (push/pop or start/end, any thread of the process) during which it started, so nested
ranges each count it. Prints one Markdown row per (range, API): calls, total ms, longest ms; ranges in the order
they started, APIs by total time. ``cuMemFree`` and ``cudaFree`` wait for the whole device, and a pageable
``cudaMemcpyAsync`` holds up other threads' launches while it lasts: the calls to look for when a thread that only
prepares data slows the training thread down.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
from pathlib import Path

#: SQL LIKE patterns of the API names counted (runtime and driver API).
PATTERNS = ("%Free%", "%alloc%", "%Register%", "%Synchronize%", "cuMem%", "cudaMemcpy%")


def api_by_range(db: sqlite3.Connection, range_filter: str = "", api_filter: str = "") -> list[tuple]:
    """``(range, api, calls, total_ms, longest_ms)`` per NVTX range and API whose names contain the filters."""
    tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    missing = {"NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_RUNTIME", "StringIds"} - tables
    if missing:
        absent = ", ".join(sorted(missing))
        raise ValueError(f"not an nsys export with CUDA and NVTX traced (-t cuda,nvtx): no {absent}")
    matches = " OR ".join("api.value LIKE ?" for _ in PATTERNS)
    query = f"""
        WITH ranges AS (
            SELECT e.start AS s, e.end AS e, e.globalTid >> 24 AS pid, COALESCE(e.text, n.value) AS label
            FROM NVTX_EVENTS e LEFT JOIN StringIds n ON n.id = e.textId
            WHERE e.end IS NOT NULL AND e.eventType IN (59, 60)
        )
        SELECT r.label, api.value, COUNT(*), SUM(c.end - c.start) / 1e6, MAX(c.end - c.start) / 1e6, MIN(r.s)
        FROM CUPTI_ACTIVITY_KIND_RUNTIME c JOIN StringIds api ON api.id = c.nameId
        JOIN ranges r ON c.start >= r.s AND c.start < r.e AND c.globalTid >> 24 = r.pid
        WHERE ({matches}) AND r.label LIKE ? AND api.value LIKE ?
        GROUP BY r.label, api.value
        ORDER BY MIN(r.s), SUM(c.end - c.start) DESC
    """
    rows = db.execute(query, (*PATTERNS, f"%{range_filter}%", f"%{api_filter}%"))
    return [(label, api, calls, total, longest) for label, api, calls, total, longest, _ in rows]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("sqlite", type=Path, help="nsys export --type sqlite output")
    p.add_argument("--range", default="", help="only ranges whose name contains this")
    p.add_argument("--api", default="", help="only APIs whose name contains this, e.g. cuMemFree")
    a = p.parse_args(argv)
    if not a.sqlite.is_file():
        sys.exit(f"{a.sqlite}: no such file (export the report with: nsys export --type sqlite -o OUT.sqlite REP)")
    try:
        rows = api_by_range(sqlite3.connect(f"file:{a.sqlite}?mode=ro", uri=True), a.range, a.api)
    except (ValueError, sqlite3.DatabaseError) as error:
        sys.exit(f"{a.sqlite}: {error}")
    print("| range | API | calls | total ms | longest ms |")
    print("|---|---|---|---|---|")
    for label, api, calls, total, longest in rows:
        print(f"| {label} | {api} | {calls} | {total:.2f} | {longest:.2f} |")


if __name__ == "__main__":
    main()
