"""Shared fixtures of the test suite: a tiny generated dataset, CLI argument helpers and a ``train.py`` runner.

``python -m pytest -q`` runs everything on the CPU; tests marked ``gpu`` are skipped unless CUDA is available
(``python -m pytest -m gpu`` on a GPU machine).
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):
    # Under pytest-xdist each worker, and every process it starts (DDP ranks, `python train.py`), would run torch's
    # CPU ops on as many threads as the machine has cores, so two workers oversubscribe the cores, and OpenMP's
    # spinning threads took turns with the tests' own work: on a 2-core machine like CI's the suite took 10 min 36 s
    # (16.5 CPU minutes); with one thread per process, 7 min 36 s (10.4). Set before torch is imported.
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
# The application modules live at the repository root (not installed in a fresh checkout); the test-only helpers
# (core_probes.py) next to this file, where --trainer.callbacks class paths of in-process CLI runs find them.
for _path in (str(REPO), str(TESTS)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import shapes_dataset  # noqa: E402

#: Train/val images per class of the session dataset (10 classes, 32x32 pixels).
TRAIN_PER_CLASS = 24
VAL_PER_CLASS = 6


def free_port() -> int:
    """A TCP port that no process listens on now, for a rendezvous (tests run in two processes at once, see
    tests/README.md: a fixed port such as torch.distributed's default 29500 could be taken by the other one)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Shuts down the workers of data loader iterators that tests left alive (a generator stopped early keeps its
    loader's iterator): at interpreter exit ``multiprocessing`` would terminate them while torch's SIGCHLD handler
    is still installed, which prints "DataLoader worker ... is killed by signal: Terminated" after the summary."""
    import gc

    from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

    for obj in gc.get_objects():
        if type(obj) is _MultiProcessingDataLoaderIter:  # type(): isinstance would touch deprecated objects
            obj._shutdown_workers()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (run `python -m pytest -m gpu` on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def device_connections_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    """``train.main()`` and ``bench/throughput.py`` set CUDA_DEVICE_MAX_CONNECTIONS in the test process
    (cuda_env.request): every test starts without it and leaves the process as it found it."""
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "8")  # recorded, so that the undo restores the original
    monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS")


@pytest.fixture(autouse=True)
def cudnn_benchmark_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fit turns ``torch.backends.cudnn.benchmark`` on for the process (train.py's default, Lightning's
    ``benchmark=True``): every test starts with it off, torch's default, and leaves the process as it found it."""
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)


@pytest.fixture(scope="session")
def shapes_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small generated shapes dataset: 10 classes, 24 train and 6 val JPEGs per class, 32x32 pixels. Read-only."""
    root = tmp_path_factory.mktemp("data") / "shapes"
    return shapes_dataset.generate(
        root, train_per_class=TRAIN_PER_CLASS, val_per_class=VAL_PER_CLASS, image_size=32, seed=0
    )


def _tiny_args(root: Path | str, run_dir: Path | str, **overrides: object) -> list[str]:
    """CLI arguments (without the subcommand) for a fast CPU run of resnet18 on 32-pixel crops of ``root``.

    The run writes under ``run_dir`` (checkpoints and CSV logs in ``run_dir/logs/<version>``). ``overrides`` are
    extra ``--key value`` pairs, the key with ``__`` for ``.`` (``trainer__max_steps=4``); a ``None`` value drops
    the default of that key.
    """
    options: dict[str, object] = {
        "data.root": root,
        "data.workers": 0,
        "data.batch_size": 16,
        "data.crop_size": 32,
        "data.min_crop_scale": 0.35,
        "data.val_resize_size": 36,
        "data.val_crop_size": 32,
        "model.arch": "resnet18",
        "trainer.accelerator": "cpu",
        "trainer.devices": 1,
        "trainer.enable_progress_bar": "false",
        "trainer.enable_model_summary": "false",
        "trainer.num_sanity_val_steps": 0,
        "trainer.default_root_dir": run_dir,
        "trainer.logger.init_args.save_dir": run_dir,
        "trainer.logger.init_args.name": "logs",
    }
    for key, value in overrides.items():
        options[key.replace("__", ".")] = value
    args: list[str] = []
    for key, value in options.items():
        if value is not None:
            args += [f"--{key}", str(value)]
    return args


def _run_train(
    args: list[str], cwd: Path, timeout: float = 180, env_changes: dict[str, str | None] | None = None
) -> subprocess.CompletedProcess:
    """Runs ``python train.py *args`` in ``cwd`` with the test helpers importable; returns the finished process.

    ``env_changes`` sets environment variables for the run (``None``: unset).
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    for name, value in (env_changes or {}).items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return subprocess.run(
        [sys.executable, str(REPO / "train.py"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="session")
def tiny_args():
    """:func:`_tiny_args`: CLI arguments of a fast CPU run."""
    return _tiny_args


@pytest.fixture(scope="session")
def run_train():
    """:func:`_run_train`: runs ``python train.py`` in a subprocess."""
    return _run_train


@pytest.fixture(scope="module")
def main():
    """``train.main`` with the process arguments of ``python train.py`` (not pytest's)."""
    import train

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", [str(REPO / "train.py")])
        yield train.main


@pytest.fixture(scope="module")
def built(main):
    """``built(argv)``: ``train.main(argv)`` with the CLI's classes built and no subcommand run (LightningCLI's
    ``run=False``, which takes no subcommand word: main's is dropped); returns the CLI."""
    import train

    real_cli = train.ImageNetCLI

    def instantiate_only(*args: object, **kwargs: object):
        cli_args = kwargs.pop("args")
        assert cli_args[0] == "fit"  # main prepends the default subcommand
        return real_cli(*args, args=cli_args[1:], run=False, **kwargs)

    def build(argv: list[str]):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(train, "ImageNetCLI", instantiate_only)
            return main(argv)

    return build


@pytest.fixture
def refused(capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch):
    """``refused(argv)``: runs ``train.main(argv)`` as ``python train.py`` would, expects it refused as the parser's own
    errors (exit 2, no traceback) and returns the last line it printed."""
    import train

    monkeypatch.setattr(sys, "argv", [str(REPO / "train.py")])  # the CLI's arguments are main's, not pytest's

    def run(argv: list[str]) -> str:
        with pytest.raises(SystemExit) as exit_info:
            train.main(argv)
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err
        return err.strip().splitlines()[-1]

    return run


def _bench_script(name: str) -> ModuleType:
    """``bench/<name>.py`` imported as a module (``bench/`` is a folder of scripts, not a package); its own folder is
    on ``sys.path`` for the helpers the scripts share, as when they run."""
    bench = str(REPO / "bench")
    if bench not in sys.path:
        sys.path.insert(0, bench)
    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def bench_script():
    """:func:`_bench_script`: imports a benchmark script by name."""
    return _bench_script
