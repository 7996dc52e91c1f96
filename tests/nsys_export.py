"""Small SQLite files laid out as `nsys export --type sqlite` writes them, for the tests of the bench scripts that read
nsys reports (check_nsys.py, kernel_timeline.py, nsys_api_by_range.py)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

MS = 1_000_000  # nsys times are in ns
NVTX_EVENTS = "NVTX_EVENTS (start INT, end INT, text TEXT, textId INT, eventType INT, globalTid INT)"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME (start INT, end INT, nameId INT, globalTid INT)"


def tid(pid: int, thread: int) -> int:
    return (pid << 24) | thread  # nsys packs the process id above the thread id


def new_export(path: Path, names: list[str], *tables: str) -> sqlite3.Connection:
    """A new file at ``path`` with nsys's ``StringIds`` holding ``names`` (ids 0, 1, ...) and the ``tables``, each
    given as ``"NAME (COLUMNS)"``; the caller fills, commits and closes it."""
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)")
    for table in tables:
        db.execute(f"CREATE TABLE {table}")
    db.executemany("INSERT INTO StringIds VALUES (?, ?)", list(enumerate(names)))
    return db
