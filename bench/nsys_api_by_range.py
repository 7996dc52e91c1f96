"""CUDA API calls that allocate, free, copy or synchronize, counted per NVTX range of an Nsight Systems SQLite export.

    nsys profile -s none -t cuda,nvtx -o calls python bench/nvjpeg_calls.py --data /tmp/jpegs --same-size 500 375
    nsys export --type sqlite -o calls.sqlite calls.nsys-rep
    python bench/nsys_api_by_range.py calls.sqlite [--range 'new files'] [--api cuMemFree] [--same-thread]
        [--every-api | --os-runtime]

A call belongs to every range (push/pop or start/end, any thread of the process) during which it started, so nested
ranges each count it; with ``--same-thread`` only to the ranges of its own thread: the ranges of one thread's steps
(``bench/producer_timing.py --nvtx`` makes each of the producer's steps one) then hold that thread's calls, not the
training thread's launches of the same moment. Only the calls that allocate, free, copy or synchronize are counted,
every CUDA API call with ``--every-api`` (launches, event records, stream waits: what a step's host time went to).
``--os-runtime`` counts the OS runtime calls of ``nsys profile -t osrt`` instead, every one: a thread's waits for a
lock or a condition (``pthread_cond_timedwait`` is how CPython's threads wait for the GIL), its ``futex``,
``sem_wait``, ``poll`` and ``read`` calls.
Prints one Markdown row per (range, API): how many ranges of that name closed (a producer's step: one a batch), the
API's calls, total ms and longest ms in them; ranges in the order they started, APIs by total time. ``cuMemFree`` and
``cudaFree`` wait for the whole device, and a pageable ``cudaMemcpyAsync`` holds up other threads' launches while it
lasts: the calls to look for when a thread that only prepares data slows the training thread down.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
from pathlib import Path

#: SQL LIKE patterns of the API names counted (runtime and driver API).
PATTERNS = ("%Free%", "%alloc%", "%Register%", "%Synchronize%", "cuMem%", "cudaMemcpy%")


def api_by_range(
    db: sqlite3.Connection,
    range_filter: str = "",
    api_filter: str = "",
    same_thread: bool = False,
    every_api: bool = False,
    os_runtime: bool = False,
) -> list[tuple]:
    """``(range, ranges, api, calls, total_ms, longest_ms)`` per NVTX range name and API whose names contain the
    filters (``ranges``: how many closed ranges have that name); with
    ``same_thread`` a call counts only in its own thread's ranges, with ``every_api`` every API counts (else only
    :data:`PATTERNS`); with ``os_runtime`` the calls are the OS runtime's (every one), not CUDA's."""
    tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    calls_table, traced = ("OSRT_API", "osrt,nvtx") if os_runtime else ("CUPTI_ACTIVITY_KIND_RUNTIME", "cuda,nvtx")
    missing = {"NVTX_EVENTS", calls_table, "StringIds"} - tables
    if missing:
        absent = ", ".join(sorted(missing))
        raise ValueError(f"not an nsys export with {traced} traced (-t {traced}): no {absent}")
    patterns = () if every_api or os_runtime else PATTERNS
    matches = " OR ".join("api.value LIKE ?" for _ in patterns) or "1"
    # globalTid holds the process id above bit 24: a range matches its process's calls, or only its thread's.
    owner = "c.globalTid = r.tid" if same_thread else "c.globalTid >> 24 = r.tid >> 24"
    query = f"""
        WITH ranges AS (
            SELECT e.start AS s, e.end AS e, e.globalTid AS tid, COALESCE(e.text, n.value) AS label
            FROM NVTX_EVENTS e LEFT JOIN StringIds n ON n.id = e.textId
            WHERE e.end IS NOT NULL AND e.eventType IN (59, 60)
        )
        SELECT r.label, api.value, COUNT(*), SUM(c.end - c.start) / 1e6, MAX(c.end - c.start) / 1e6, MIN(r.s)
        FROM {calls_table} c JOIN StringIds api ON api.id = c.nameId
        JOIN ranges r ON c.start >= r.s AND c.start < r.e AND {owner}
        WHERE ({matches}) AND r.label LIKE ? AND api.value LIKE ?
        GROUP BY r.label, api.value
        ORDER BY MIN(r.s), SUM(c.end - c.start) DESC, api.value
    """
    rows = db.execute(query, (*patterns, f"%{range_filter}%", f"%{api_filter}%"))
    counts = dict(
        db.execute(
            """SELECT COALESCE(e.text, n.value), COUNT(*) FROM NVTX_EVENTS e LEFT JOIN StringIds n ON n.id = e.textId
            WHERE e.end IS NOT NULL AND e.eventType IN (59, 60) GROUP BY 1"""
        )
    )
    return [(label, counts[label], api, calls, total, longest) for label, api, calls, total, longest, _ in rows]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("sqlite", type=Path, help="nsys export --type sqlite output")
    p.add_argument("--range", default="", help="only ranges whose name contains this")
    p.add_argument("--api", default="", help="only APIs whose name contains this, e.g. cuMemFree")
    p.add_argument("--same-thread", action="store_true", help="count a call only in its own thread's ranges")
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "--every-api", action="store_true", help="every CUDA API call, not only allocations, frees, copies and syncs"
    )
    which.add_argument("--os-runtime", action="store_true", help="the OS runtime calls (nsys -t osrt) instead")
    a = p.parse_args(argv)
    if not a.sqlite.is_file():
        sys.exit(f"{a.sqlite}: no such file (export the report with: nsys export --type sqlite -o OUT.sqlite REP)")
    try:
        db = sqlite3.connect(f"file:{a.sqlite}?mode=ro", uri=True)
        rows = api_by_range(db, a.range, a.api, a.same_thread, a.every_api, a.os_runtime)
    except (ValueError, sqlite3.DatabaseError) as error:
        sys.exit(f"{a.sqlite}: {error}")
    print("| range | ranges | API | calls | total ms | longest ms |")
    print("|---|---|---|---|---|---|")
    for label, ranges, api, calls, total, longest in rows:
        print(f"| {label} | {ranges} | {api} | {calls} | {total:.2f} | {longest:.2f} |")


if __name__ == "__main__":
    main()
