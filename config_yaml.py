"""A LightningCLI YAML config read as plain data, for the code that looks into one after (or beside) the parser: which
``model`` options the ``--config`` files set (``checkpoint_model_options.py``), and the options a run's saved
``config.yaml`` records for a step report made from its traces (``step_report.py``). No torch, no Lightning: the
step report's command line stays light.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


def read_mapping(path: str | Path) -> dict[str, Any]:
    """The YAML mapping in ``path``; empty if the file cannot be read, does not parse, or holds no mapping (the parser,
    where there is one, has said so already: such a file sets nothing)."""
    try:
        content = yaml.safe_load(Path(path).read_text())
    except (OSError, ValueError, yaml.YAMLError):  # ValueError: not UTF-8, or a name too long for a path
        return {}
    return content if isinstance(content, dict) else {}


def section_options(config: dict[str, Any], name: str) -> dict[str, Any]:
    """The options of the config's section ``name``: its ``init_args`` in the ``class_path`` form, else the section
    itself; empty when the section is missing or no mapping."""
    section = config.get(name)
    if isinstance(section, dict) and isinstance(section.get("init_args"), dict):
        section = section["init_args"]
    return section if isinstance(section, dict) else {}
