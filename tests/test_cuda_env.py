"""cuda_env.py: CUDA_DEVICE_MAX_CONNECTIONS asked for before CUDA starts, by train.py, and checked."""

from __future__ import annotations

import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import cuda_env
import train
from datamodule import ImageNetDataModule


def test_request_sets_32_unless_the_environment_chose_a_value() -> None:
    environ: dict[str, str] = {}
    assert cuda_env.connections(environ) == 8  # CUDA's default when unset
    assert cuda_env.request(environ) == 32 and environ == {"CUDA_DEVICE_MAX_CONNECTIONS": "32"}
    chosen = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}  # e.g. Megatron-style ordering: the user's value stays
    assert cuda_env.request(chosen) == 1 and chosen == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}


def test_an_empty_value_counts_as_unset() -> None:
    environ = {"CUDA_DEVICE_MAX_CONNECTIONS": ""}  # VAR= cmd
    assert cuda_env.connections(environ) == 8 and cuda_env.request(environ) == 32
    assert environ == {"CUDA_DEVICE_MAX_CONNECTIONS": "32"}


def test_asked_for_after_cuda_started_it_warns_that_only_new_processes_get_it(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.warns(UserWarning, match="set after CUDA started in this process, which keeps CUDA's 8"):
        assert cuda_env.request() == 32
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cuda_env.request() == 32  # set already: nothing new to say
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
        monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS")
        assert cuda_env.request() == 32  # in time: no warning


@pytest.mark.parametrize("value", ["0", "33", "eight", " 4x"])
def test_a_value_cuda_does_not_take_is_refused_with_the_variable_named(value: str) -> None:
    with pytest.raises(
        ValueError, match=f"CUDA_DEVICE_MAX_CONNECTIONS={value!r}: CUDA takes a whole number from 1 to 32"
    ):
        cuda_env.request({"CUDA_DEVICE_MAX_CONNECTIONS": value})


def test_train_main_asks_for_the_connections_before_the_cli_starts(monkeypatch) -> None:
    seen = []
    monkeypatch.setattr(train, "ImageNetCLI", lambda *a, **k: seen.append(cuda_env.connections()))
    train.main(["fit", "--print_config"])
    assert seen == [32]
    # A value CUDA does not take stops train.py with the message, before anything else runs.
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "64")
    with pytest.raises(SystemExit, match="train.py: CUDA_DEVICE_MAX_CONNECTIONS='64': CUDA takes a whole number"):
        train.main(["fit", "--print_config"])
    assert seen == [32]


def gpu_decode_setup(root: Path) -> list[str]:
    """The warnings of a ``decode: gpu`` data module's setup on a (pretended) CUDA device; setup makes no CUDA call."""
    dm = ImageNetDataModule(root=str(root), workers=0, batch_size=8, crop_size=32, val_resize_size=36, val_crop_size=32,
                            decode="gpu")  # fmt: skip
    dm.trainer = SimpleNamespace(
        world_size=1, global_rank=0, strategy=SimpleNamespace(root_device=torch.device("cuda", 0))
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dm.setup("fit")
    assert dm.gpu_decode
    return [str(w.message) for w in caught]


def test_the_gpu_decode_path_warns_when_the_environment_keeps_cuda_s_8_queues(shapes_root: Path, monkeypatch) -> None:
    unset = gpu_decode_setup(shapes_root)  # as for a caller other than train.py: CUDA's default
    assert any("data.decode: gpu with CUDA_DEVICE_MAX_CONNECTIONS=8" in m for m in unset), unset
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "8")
    messages = gpu_decode_setup(shapes_root)
    assert any("data.decode: gpu with CUDA_DEVICE_MAX_CONNECTIONS=8" in m and "set CUDA_DEVICE_MAX_CONNECTIONS=32" in m
               for m in messages), messages  # fmt: skip
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32")
    assert not any("CUDA_DEVICE_MAX_CONNECTIONS" in m for m in gpu_decode_setup(shapes_root))
