"""pyproject.toml installs every module the app imports: a module left out of ``py-modules`` is missing from a wheel
and from an editable install used outside the repository's root, where ``import datamodule`` then fails."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_every_top_level_module_and_package_is_installed() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    modules = {path.stem for path in ROOT.glob("*.py")}
    packages = {path.parent.name for path in ROOT.glob("*/__init__.py")} - {"tests"}
    assert set(setuptools["py-modules"]) == modules
    assert set(setuptools["packages"]) == packages
