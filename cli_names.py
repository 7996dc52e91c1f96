"""The names of train.py's command line that several modules read: its subcommands and configuration sections.

Kept apart (no imports) so that apex_compat.py and legacy_checkpoint.py, which train.py imports, can read them too.
"""

from __future__ import annotations

#: train.py's LightningCLI subcommands.
SUBCOMMANDS = ("fit", "validate", "test")
#: Lightning's subcommands: ``predict`` too, which train.py refuses by name (the data module has no prediction split).
LIGHTNING_SUBCOMMANDS = (*SUBCOMMANDS, "predict")
#: The sections of train.py's configuration: each key of the command line is ``--SECTION.KEY``.
SECTIONS = ("trainer", "model", "data", "profile", "checkpoint", "last_checkpoint", "preemption")
