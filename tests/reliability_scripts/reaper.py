"""Runs a command as a child subreaper and records how every process of its tree ended (Linux).

    python reaper.py EXITS.json COMMAND [ARGS...]

When a DDP rank 0 started by Lightning's launcher dies, its child ranks are orphaned: re-parented to init, their exit
status is lost to the test that started rank 0. Run under this script they are re-parented to it instead
(``prctl(PR_SET_CHILD_SUBREAPER)``), and it reaps every process of the tree. After each one ends it rewrites
``EXITS.json``: ``{"<pid>": {"status": <os.waitstatus_to_exitcode: -signal or the exit code>, "time": <time.time()>}}``.
It exits once no descendant is left, with the command's status (128 + signal number for a signal).
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    out, command = Path(sys.argv[1]), sys.argv[2:]
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(error)}")
    child = os.posix_spawnp(command[0], command, dict(os.environ))
    exits: dict[str, dict[str, float | int]] = {}
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:  # nothing left to wait for
            break
        exits[str(pid)] = {"status": os.waitstatus_to_exitcode(status), "time": time.time()}
        temp = out.with_suffix(".part")
        temp.write_text(json.dumps(exits))
        os.replace(temp, out)
    status = int(exits[str(child)]["status"])
    return 128 - status if status < 0 else status


if __name__ == "__main__":
    sys.exit(main())
