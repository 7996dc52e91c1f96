"""Callbacks: the profiling window with NVTX step/phase ranges (``--profile.*``), preemption (``--preemption.*``),
the per-epoch count of skipped images (``--bad_images.*``) and checkpoints that resume exactly (``--checkpoint.*``,
``--last_checkpoint.*``)."""

from callbacks.bad_images import BadImageCount
from callbacks.preemption import PreemptionHandler
from callbacks.profiler_window import ProfilerWindow
from callbacks.ranges import RangeStack
from callbacks.resumable_checkpoint import ResumableCheckpoint

__all__ = ["BadImageCount", "PreemptionHandler", "ProfilerWindow", "RangeStack", "ResumableCheckpoint"]
