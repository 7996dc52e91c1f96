"""bench/longest_pause.py: the probe thread of bench/host_release.py and bench/nvjpeg_calls.py sees a stall of its
own loop."""

from __future__ import annotations

import threading
import time


def test_the_longest_gap_is_a_stall_of_the_loop(bench_script):
    probe = bench_script("longest_pause")
    with probe.LongestPause(warmup_s=0.05) as idle:
        time.sleep(0.05)
    assert idle.longest < 0.05  # a free loop: no stall (scheduling on a loaded 2-core machine stays well below)

    hold = threading.Event()

    def step() -> None:
        if hold.is_set():
            hold.clear()
            time.sleep(0.08)  # one stalled iteration, as if the GIL were held that long

    with probe.LongestPause(step) as stalled:
        hold.set()
        while hold.is_set():
            time.sleep(0.001)
        time.sleep(0.1)
    assert 0.08 <= stalled.longest < 0.5
