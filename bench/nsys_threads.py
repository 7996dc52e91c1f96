"""What each thread spent its CUDA API time on, and what each stream ran, from an Nsight Systems SQLite export.

    nsys profile -t cuda,nvtx --capture-range=cudaProfilerApi -o run python train.py ... --profile.start_step 20
    nsys export --type sqlite -o run.sqlite run.nsys-rep
    python bench/nsys_threads.py run.sqlite [--top 6]

Prints two Markdown tables over the report's span (its first to its last CUDA activity):

- per thread (its OS name: the app's producer threads are ``prefetcher``, ``prefetcher-1``, ...): the CUDA API's
  total time and share of the span, then its APIs by total time (calls, total ms, longest ms). A thread that only
  prepares data and spends most of the span in ``cudaEventSynchronize`` waits for the GPU, not for the interpreter's
  lock or its own work;
- per stream of each device: kernels, copies and memsets, their GPU time, and the share of the span each stream kept
  busy; then, per device, the share of the span with any of them running (the union of the intervals). A device busy
  most of the span is the limit; one mostly idle while a thread waits on it points at the latency of that thread's
  chain of work.
"""

from __future__ import annotations

import argparse
import contextlib
import sqlite3
import sys
from collections import defaultdict
from pathlib import Path

NS_PER_MS = 1e6
#: The GPU work a stream runs, in the order of the stream table's columns.
WORK = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")


def _tables(db: sqlite3.Connection) -> set[str]:
    return {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def thread_names(db: sqlite3.Connection) -> dict[int, str]:
    """``{globalTid: name}`` from the export's ThreadNames, where it has them; a thread that was renamed (the app's
    producer names itself once it runs) gets its names joined by ``/``."""
    if "ThreadNames" not in _tables(db):
        return {}
    names: dict[int, list[str]] = defaultdict(list)
    rows = db.execute(
        "SELECT t.globalTid, s.value FROM ThreadNames t JOIN StringIds s ON t.nameId = s.id ORDER BY t.rowid"
    )
    for tid, name in rows:  # in the order nsys wrote them
        if name not in names[tid]:
            names[tid].append(name)
    return {tid: "/".join(each) for tid, each in names.items()}


def span(db: sqlite3.Connection, tables: set[str]) -> tuple[int, int]:
    """The first start and the last end (ns) of any API call, kernel or copy in the report."""
    starts, ends = [], []
    for table in ("CUPTI_ACTIVITY_KIND_RUNTIME", *WORK):
        if table in tables:
            first, last = db.execute(f"SELECT MIN(start), MAX(end) FROM {table}").fetchone()
            if first is not None:
                starts.append(first)
                ends.append(last)
    if not starts:
        raise ValueError("the report holds no CUDA API call, kernel or copy (was it made with -t cuda?)")
    return min(starts), max(ends)


def api_by_thread(db: sqlite3.Connection) -> dict[int, dict[str, list]]:
    """``{globalTid: {api: [calls, total ns, longest ns]}}``."""
    out: dict[int, dict[str, list]] = defaultdict(lambda: defaultdict(lambda: [0, 0, 0]))
    query = (
        "SELECT r.globalTid, s.value, COUNT(*), SUM(r.end - r.start), MAX(r.end - r.start) "
        "FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON r.nameId = s.id GROUP BY r.globalTid, s.value"
    )
    for tid, api, calls, total, longest in db.execute(query):
        out[tid][api] = [calls, total, longest]
    return out


def stream_work(
    db: sqlite3.Connection, tables: set[str]
) -> tuple[dict[tuple[int, int], list], dict[int, list[tuple[int, int]]]]:
    """``({(deviceId, streamId): [kernels, kernel ns, copies, copy ns, memsets, memset ns]}, {deviceId: every
    interval})``: stream numbers repeat across devices, so a report of several GPUs keeps them apart."""
    streams: dict[tuple[int, int], list] = defaultdict(lambda: [0, 0, 0, 0, 0, 0])
    intervals: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for column, table in enumerate(WORK):
        if table not in tables:
            continue
        for device, stream, start, end in db.execute(f"SELECT deviceId, streamId, start, end FROM {table}"):
            streams[device, stream][2 * column] += 1
            streams[device, stream][2 * column + 1] += end - start
            intervals[device].append((start, end))
    return streams, intervals


def union_ns(intervals: list[tuple[int, int]]) -> int:
    """The total length of the union of ``intervals``."""
    total, reach = 0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


def report(db: sqlite3.Connection, top: int = 6) -> list[str]:
    tables = _tables(db)
    missing = {"CUPTI_ACTIVITY_KIND_RUNTIME", "StringIds"} - tables
    if missing:
        raise ValueError(f"not an nsys export with CUDA traced (-t cuda): no {', '.join(sorted(missing))}")
    first, last = span(db, tables)
    length = max(last - first, 1)
    names = thread_names(db)
    lines = [
        f"span: {length / NS_PER_MS:.1f} ms (first to last CUDA activity)",
        "",
        "| thread | tid | API ms | share of span | top APIs: calls, total ms, longest ms |",
        "|---|---|---|---|---|",
    ]
    by_thread = api_by_thread(db)
    for tid, apis in sorted(by_thread.items(), key=lambda kv: -sum(v[1] for v in kv[1].values())):
        total = sum(v[1] for v in apis.values())
        ranked = sorted(apis.items(), key=lambda kv: -kv[1][1])[:top]
        detail = "; ".join(
            f"{api} {calls}, {ns / NS_PER_MS:.2f}, {longest / NS_PER_MS:.2f}" for api, (calls, ns, longest) in ranked
        )
        name = names.get(tid, "?")
        lines.append(f"| {name} | {tid & 0xFFFFFF} | {total / NS_PER_MS:.2f} | {total / length:.1%} | {detail} |")
    streams, intervals = stream_work(db, tables)
    lines += [
        "",
        "| device | stream | kernels | kernel ms | copies | copy ms | memsets | memset ms | busy share of span |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (device, stream), work in sorted(streams.items(), key=lambda kv: (kv[0][0], -sum(kv[1][1::2]))):
        counts = " | ".join(f"{work[k]} | {work[k + 1] / NS_PER_MS:.2f}" for k in (0, 2, 4))
        lines.append(f"| {device} | {stream} | {counts} | {sum(work[1::2]) / length:.1%} |")
    lines.append("")
    for device, spans in sorted(intervals.items()):
        busy = union_ns(spans) / length
        lines.append(f"device {device} busy (any kernel, copy or memset running): {busy:.1%} of the span")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("sqlite", type=Path, help="nsys export --type sqlite output")
    p.add_argument("--top", type=int, default=6, help="APIs listed per thread (default 6)")
    a = p.parse_args(argv)
    if not a.sqlite.is_file():
        p.error(f"{a.sqlite}: no such file (make it with nsys export --type sqlite -o {a.sqlite} REPORT.nsys-rep)")
    if a.top < 1:
        p.error(f"--top must be at least 1, got {a.top}")
    try:
        with contextlib.closing(sqlite3.connect(a.sqlite.resolve().as_uri() + "?mode=ro", uri=True)) as db:
            print("\n".join(report(db, a.top)))
    except (ValueError, sqlite3.DatabaseError) as error:
        print(f"{a.sqlite}: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
