"""Profiling callbacks: the CUDA profiler window with NVTX step/phase ranges (``--profile.*`` on the CLI)."""

from callbacks.profiler_window import ProfilerWindow
from callbacks.ranges import RangeStack

__all__ = ["ProfilerWindow", "RangeStack"]
