"""config_yaml.py: a config file read as a mapping (empty when unreadable, unparsable, not UTF-8 or no mapping) and a
section's options, plain or under ``init_args``."""

from __future__ import annotations

from pathlib import Path

import pytest

from config_yaml import read_mapping, section_options


def test_a_mapping_is_read_and_anything_else_reads_empty(tmp_path: Path) -> None:
    good = tmp_path / "config.yaml"
    good.write_text("model:\n  arch: resnet18\n")
    assert read_mapping(good) == {"model": {"arch": "resnet18"}}
    assert read_mapping(str(good)) == {"model": {"arch": "resnet18"}}
    cases = {"list.yaml": "- 1\n- 2\n", "empty.yaml": "", "broken.yaml": "model: [\n"}
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
        assert read_mapping(tmp_path / name) == {}, name
    (tmp_path / "latin1.yaml").write_bytes(b"model:\n  arch: r\xe9snet\n")  # not UTF-8
    assert read_mapping(tmp_path / "latin1.yaml") == {}
    assert read_mapping(tmp_path / "missing.yaml") == {}
    assert read_mapping(tmp_path / ("x" * 300)) == {}  # a name too long for the file system


@pytest.mark.parametrize(
    ("config", "options"),
    [
        ({"model": {"arch": "resnet18", "lr": 0.1}}, {"arch": "resnet18", "lr": 0.1}),
        ({"model": {"class_path": "m.C", "init_args": {"arch": "resnet50"}}}, {"arch": "resnet50"}),
        ({"model": {"class_path": "m.C", "init_args": None}}, {"class_path": "m.C", "init_args": None}),
        ({"model": "resnet18"}, {}),
        ({}, {}),
    ],
)
def test_a_sections_options_plain_or_under_init_args(config, options) -> None:
    assert section_options(config, "model") == options
