"""Callbacks: the profiling window with NVTX step/phase ranges (``--profile.*``), preemption (``--preemption.*``)
and the per-epoch count of skipped images (``--bad_images.*``)."""

from callbacks.bad_images import BadImageCount
from callbacks.preemption import PreemptionHandler
from callbacks.profiler_window import ProfilerWindow
from callbacks.ranges import RangeStack

__all__ = ["BadImageCount", "PreemptionHandler", "ProfilerWindow", "RangeStack"]
