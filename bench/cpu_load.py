"""Where a run's CPU time goes: per-core load, the cores' clock, and the busiest threads of a command's process tree.

    python bench/cpu_load.py [--interval 1] [--skip 20] [--top 15] [--json OUT.json] -- COMMAND ...

Runs COMMAND, reads /proc every ``--interval`` seconds once ``--skip`` seconds (the start-up) have passed, and when
COMMAND ends prints, over the sampled window:

- each core's busy share (user, system, irq, steal), sorted, and how many cores were above 90%;
- the cores' mean clock (``cpu MHz`` of /proc/cpuinfo) in the first and the last sample, where the kernel reports it;
- the busiest threads of COMMAND and its descendants: CPU seconds per second (1.0 = one core all the time), process id
  and command, thread name. A training process's main thread near 1.0 is bound by its own host work or the GIL, a
  loader worker near 1.0 by its decode; many cores near 100% with a falling clock point at the machine.

For a multi-GPU JPEG run, for example (bench/RESULTS.md, seventh session):
``python bench/cpu_load.py --skip 60 -- python bench/throughput.py --gpus 2 ...``.
Exits with COMMAND's exit status (128 + N for signal N). On SIGTERM or Ctrl-C it passes the signal on and still
reports. Threads of one Python process share its name (the app's producer thread names itself ``prefetcher``); the
main thread is marked. The samples are ``--interval``
apart, so a window of a few seconds holds a few of them. Linux only (/proc).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

PROC = Path("/proc")
TICK = os.sysconf("SC_CLK_TCK")


def core_times(stat: str | None = None) -> dict[str, tuple[int, int]]:
    """``{"cpu0": (busy ticks, all ticks), ...}`` from /proc/stat (or ``stat``, its text); idle and iowait are idle."""
    text = stat if stat is not None else (PROC / "stat").read_text()
    cores = {}
    for line in text.splitlines():
        name, *fields = line.split()
        if name.startswith("cpu") and name != "cpu":
            values = [int(v) for v in fields[:8]]  # user nice system idle iowait irq softirq steal
            idle = values[3] + values[4]
            cores[name] = (sum(values) - idle, sum(values))
    return cores


def core_mhz(cpuinfo: str | None = None) -> list[float]:
    """Each core's ``cpu MHz`` from /proc/cpuinfo (or ``cpuinfo``); empty where the kernel does not report it."""
    text = cpuinfo if cpuinfo is not None else (PROC / "cpuinfo").read_text()
    return [float(line.split(":")[1]) for line in text.splitlines() if line.startswith("cpu MHz")]


def parse_task_stat(text: str) -> tuple[str, int, int]:
    """(name, parent pid, user + system ticks) from a /proc/<pid>[/task/<tid>]/stat line.

    The name sits in parentheses and may itself hold spaces and parentheses, so the fields are counted from the last
    closing one.
    """
    close = text.rindex(")")
    name = text[text.index("(") + 1 : close]
    fields = text[close + 2 :].split()  # fields[0] is field 3 of proc(5): the state
    return name, int(fields[1]), int(fields[11]) + int(fields[12])


def _read(path: Path) -> str | None:
    try:
        # Bytes, not text: the kernel cuts thread names at 15 bytes, which can split a UTF-8 character.
        return path.read_bytes().decode("utf-8", "replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None  # the process or thread ended between the listing and the read


def process_tree(root: int) -> list[int]:
    """``root`` and every process descended from it, as /proc lists them now."""
    children: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit() and (text := _read(entry / "stat")) is not None:
            children.setdefault(parse_task_stat(text)[1], []).append(int(entry.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def thread_ticks(pids: list[int]) -> dict[tuple[int, int], tuple[str, int]]:
    """``{(pid, tid): (thread name, CPU ticks)}`` for every thread of ``pids``."""
    threads = {}
    for pid in pids:
        try:
            tids = [int(t.name) for t in (PROC / str(pid) / "task").iterdir()]
        except (FileNotFoundError, ProcessLookupError):
            continue
        for tid in tids:
            if (text := _read(PROC / str(pid) / "task" / str(tid) / "stat")) is not None:
                name, _, ticks = parse_task_stat(text)
                threads[pid, tid] = (name, ticks)
    return threads


def command_of(pid: int) -> str:
    raw = _read(PROC / str(pid) / "cmdline") or ""
    words = [w for w in raw.split("\0") if w]
    return short(" ".join([Path(words[0]).name, *words[1:3]])) if words else "?"


def short(text: str, width: int = 60) -> str:
    """One line of at most ``width`` characters, for a table cell."""
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 3] + "..."


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    usage = "cpu_load.py [--interval S] [--skip S] [--top N] [--json FILE] -- COMMAND ..."
    p = argparse.ArgumentParser(usage=usage, description=__doc__.split("\n")[0])
    p.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    p.add_argument("--skip", type=float, default=20.0, help="seconds after the start before the window opens")
    p.add_argument("--top", type=int, default=15, help="threads to list")
    p.add_argument("--json", help="also write the figures to this file")
    if "--" not in args:
        if "-h" in args or "--help" in args:
            p.parse_args(["--help"])  # prints the help and exits 0
        sys.exit(f"usage: {usage}")
    split = args.index("--")
    a = p.parse_args(args[:split])
    command = args[split + 1 :]
    if not command or a.interval <= 0 or a.skip < 0:
        sys.exit("cpu_load.py: give a COMMAND after --, an --interval > 0 and a --skip >= 0")

    try:
        proc = subprocess.Popen(command)
    except OSError as error:
        sys.exit(f"cpu_load.py: cannot start {command[0]!r}: {error}")
    stopping: list[int] = []

    def stop(signum: int, _frame: object) -> None:
        # ``timeout`` or Ctrl-C: pass the signal on, and still report what was sampled.
        stopping.append(signum)
        proc.send_signal(signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    start = time.monotonic()
    first = last = None  # (time, core ticks, MHz)
    # (pid, tid) -> (name, command, time first seen, ticks then, time last seen, ticks then)
    seen: dict[tuple[int, int], tuple[str, str, float, int, float, int]] = {}
    while proc.poll() is None and not stopping:
        time.sleep(a.interval)
        if time.monotonic() - start < a.skip or proc.poll() is not None or stopping:
            continue
        threads = thread_ticks(process_tree(proc.pid))
        now = time.monotonic()
        last = (now, core_times(), core_mhz())
        first = first or last
        for key, (name, ticks) in threads.items():
            # A thread counts from its first sample: what it ran before is not in the window.
            old = seen.get(key)
            seen[key] = (
                (name, old[1], old[2], old[3], now, ticks)
                if old
                else (name, command_of(key[0]), now, ticks, now, ticks)
            )
    proc.wait()
    status = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode  # as a shell reports a signal

    if first is None or last is None or last[0] <= first[0]:
        ran = short(" ".join(command), 200)
        print(f"cpu_load: {ran} ended before two samples after --skip {a.skip} s: nothing to report")
        return status
    seconds = last[0] - first[0]
    busy = {
        core: (last[1][core][0] - first[1][core][0]) / max(1, last[1][core][1] - first[1][core][1])
        for core in last[1]
        if core in first[1]
    }
    # Cores over the thread's own time in the window (a worker started late and busy all along shows 1.0).
    threads = sorted(
        ((ticks1 - ticks0) / TICK / max(t1 - t0, a.interval), pid, tid, name, cmd)
        for (pid, tid), (name, cmd, t0, ticks0, t1, ticks1) in seen.items()
    )[::-1]
    shares = sorted(busy.values(), reverse=True)
    print(f"\ncpu_load: {seconds:.1f} s sampled after the first {a.skip:g} s of: {short(' '.join(command), 200)}")
    print(
        f"cores: {len(shares)}, mean busy {sum(shares) / len(shares):.0%}, above 90%: "
        f"{sum(s > 0.9 for s in shares)}; busiest first: {' '.join(f'{s:.0%}' for s in shares)}"
    )
    if first[2] and last[2]:
        print(
            f"clock: mean {sum(first[2]) / len(first[2]):,.0f} MHz at the first sample, "
            f"{sum(last[2]) / len(last[2]):,.0f} at the last"
        )
    print(
        f"CPU time of {len({t[1] for t in threads})} processes, {len(threads)} threads: "
        f"{sum((v[5] - v[3]) / TICK for v in seen.values()) / seconds:.2f} cores in all"
    )
    print("| cores | pid | tid | thread | command |\n|---|---|---|---|---|")
    for share, pid, tid, name, cmd in threads[: a.top]:
        print(f"| {share:.2f} | {pid} | {tid}{' (main)' if tid == pid else ''} | {name} | {cmd} |")
    if a.json:
        Path(a.json).write_text(
            json.dumps(
                {
                    "seconds": seconds,
                    "core_busy": busy,
                    "mhz_first": first[2],
                    "mhz_last": last[2],
                    "threads": [
                        {"cores": s, "pid": pid, "tid": tid, "main": tid == pid, "name": name, "command": cmd}
                        for s, pid, tid, name, cmd in threads
                    ],
                },
                indent=1,
            )
        )
    return status


if __name__ == "__main__":
    sys.exit(main())
