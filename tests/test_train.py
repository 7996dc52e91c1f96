"""The application through its CLI (train.main in this process, train.py in subprocesses): configs, fit, resume,
validate/test, DDP on two CPU processes, precision."""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import re
import shutil
import warnings
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
import yaml
from core_probes import LRLog
from pytorch_lightning.callbacks import ModelCheckpoint
from torchvision.datasets import ImageFolder

import train
from callbacks import ProfilerWindow
from datamodule import ImageNetDataModule
from imagenet_module import ImageNetClassifier, lr_multiplier

REPO = Path(train.__file__).resolve().parent
CONFIGS = sorted((REPO / "configs").glob("*.yaml"))


def callbacks_arg(*specs: tuple[str, dict]) -> list[str]:
    """``--trainer.callbacks`` for the test-only callbacks of core_probes, by class name and init_args."""
    value = [{"class_path": f"core_probes.{name}", "init_args": init} for name, init in specs]
    return ["--trainer.callbacks", json.dumps(value)]


def find(cli: train.ImageNetCLI, kind: type) -> object:
    return next(c for c in cli.trainer.callbacks if isinstance(c, kind))


def read_metrics(log_dir: str | Path) -> list[dict[str, str]]:
    with open(Path(log_dir) / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


# --- the subcommand default --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], ["fit"]),
        (["--config", "a.yaml"], ["fit", "--config", "a.yaml"]),
        (["validate", "--ckpt_path", "x"], ["validate", "--ckpt_path", "x"]),
        (["test"], ["test"]),
        (["--help"], ["--help"]),
        (["-h"], ["-h"]),
        (["--version"], ["--version"]),
        (["predict"], ["predict"]),  # a word: the parser refuses it by name, not as an argument of fit
    ],
)
def test_fit_is_the_default_subcommand(argv: list[str], expected: list[str]) -> None:
    assert train.with_default_subcommand(argv) == expected


# --- every shipped config parses and instantiates ----------------------------------------------------------------
def test_there_are_configs() -> None:
    assert REPO / "configs" / "quickstart.yaml" in CONFIGS


@pytest.mark.parametrize("config", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_config_instantiates(
    config: Path, shapes_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, built
) -> None:
    monkeypatch.chdir(tmp_path)  # relative paths of the config resolve (and would write) here
    raw = yaml.safe_load(config.read_text())
    data, model, trainer = raw.get("data") or {}, raw.get("model") or {}, raw.get("trainer") or {}
    overrides: list[str] = []
    if data.get("source", "folder") == "folder" and not Path(data.get("root", "data/imagenet")).is_dir():
        overrides += ["--data.root", str(shapes_root)]
    if not torch.cuda.is_available():
        overrides += ["--trainer.accelerator", "cpu", "--trainer.devices", "1", "--trainer.strategy", "auto"]
        if str(trainer.get("precision", "")).startswith("16"):
            overrides += ["--trainer.precision", "bf16-mixed"]
    overridden = {arg[2:] for arg in overrides if arg.startswith("--")}

    cli = built(["--config", str(config), *overrides])

    assert isinstance(cli.model, ImageNetClassifier)
    assert isinstance(cli.datamodule, ImageNetDataModule)
    for key, value in model.items():
        assert cli.model.hparams[key] == value, f"model.{key}"
    for key, value in data.items():
        if f"data.{key}" not in overridden:
            assert cli.datamodule.hparams[key] == value, f"data.{key}"
    if "max_epochs" in trainer:
        assert cli.trainer.max_epochs == trainer["max_epochs"]
    # The links of ImageNetCLI.
    assert cli.model.hparams.num_classes == cli.datamodule.num_classes
    assert cli.model.hparams.batch_size == cli.datamodule.batch_size
    assert cli.datamodule.channels_last == cli.model.hparams.channels_last
    checkpoints = [c for c in cli.trainer.callbacks if isinstance(c, ModelCheckpoint)]
    assert (checkpoints[0].monitor, checkpoints[0].mode) == ("val_acc1", "max")
    assert any(c.save_last or c.filename == "last" for c in checkpoints)  # a last.ckpt to resume from
    assert any(isinstance(c, ProfilerWindow) for c in cli.trainer.callbacks)


def test_ddp_options_reach_the_strategy_s_ddp_keyword_arguments(
    shapes_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, built
) -> None:
    """README: ``--trainer.strategy DDPStrategy --trainer.strategy.gradient_as_bucket_view true`` (DDPStrategy passes
    its extra keyword arguments to torch's DistributedDataParallel)."""
    from pytorch_lightning.strategies import DDPStrategy

    monkeypatch.chdir(tmp_path)
    cli = built(["--config", str(REPO / "configs" / "quickstart.yaml"), "--data.root", str(shapes_root),
                "--trainer.accelerator", "cpu", "--trainer.devices", "1", "--trainer.strategy", "DDPStrategy",
                "--trainer.strategy.gradient_as_bucket_view", "true", "--trainer.strategy.static_graph", "true",
                "--trainer.strategy.bucket_cap_mb", "50"])  # fmt: skip
    strategy = cli.trainer.strategy
    assert isinstance(strategy, DDPStrategy)
    assert {k: strategy._ddp_kwargs[k] for k in ("gradient_as_bucket_view", "static_graph", "bucket_cap_mb")} == {
        "gradient_as_bucket_view": True,
        "static_graph": True,
        "bucket_cap_mb": 50,
    }


@pytest.mark.parametrize(
    ("given", "benchmark"),
    [
        ([], True),
        (["--trainer.benchmark", "false"], False),
        (["--trainer.deterministic", "warn"], False),
        (["--trainer.deterministic", "true"], False),
    ],
)
def test_cudnn_benchmark_is_on_unless_turned_off_or_deterministic(
    shapes_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, built, given: list[str], benchmark: bool
) -> None:
    """torch's default is off and Lightning keeps it for a null ``trainer.benchmark``: the app turns it on (fixed
    shapes), except where asked not to or for a deterministic run, which it would undo (cuDNN's timed choice). The
    configuration keeps what was given (null), so that its config.yaml reruns with deterministic set."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", not benchmark)
    deterministic = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    try:
        cli = built(["--config", str(REPO / "configs" / "quickstart.yaml"), "--data.root", str(shapes_root),
                    "--trainer.accelerator", "cpu", *given])  # fmt: skip
    finally:
        torch.use_deterministic_algorithms(deterministic[0], warn_only=deterministic[1])
    assert torch.backends.cudnn.benchmark is benchmark
    assert cli.config.trainer.benchmark is (False if "--trainer.benchmark" in given else None)


def test_cudnn_benchmark_with_deterministic_is_refused_naming_both(shapes_root: Path, main, capsys) -> None:
    """Lightning only warns, and PyTorch then ignores cudnn.deterministic: the run would not be what was asked."""
    args = ["--config", str(REPO / "configs" / "quickstart.yaml"), "--data.root", str(shapes_root),
            "--trainer.benchmark", "true", "--trainer.deterministic", "true"]  # fmt: skip
    with pytest.raises(SystemExit) as stopped:
        main(["fit", *args])
    assert stopped.value.code == 2
    assert "error: trainer.benchmark true with trainer.deterministic true: " in capsys.readouterr().err


@pytest.mark.parametrize(
    ("in_file", "on_the_command_line", "expected"),
    [
        (None, ["--trainer.limit_train_batches", "1"], {"limit_train_batches": 1}),  # one batch, not every batch
        (None, ["--trainer.limit_train_batches=1.0", "--trainer.limit_val_batches", "0.5"],
         {"limit_train_batches": 1.0, "limit_val_batches": 0.5}),
        ("limit_val_batches: 1\nlimit_test_batches: 1.0\n", [], {"limit_val_batches": 1, "limit_test_batches": 1.0}),
        ("limit_val_batches: 1\n", ["--trainer.limit_val_batches", "1.0"], {"limit_val_batches": 1.0}),  # the last
        ("limit_val_batches: 1.0\n", ["--trainer.limit_val_batches", "1"], {"limit_val_batches": 1}),
        (None, ["--trainer", "{limit_val_batches: 1, limit_test_batches: 0.5}"],
         {"limit_val_batches": 1, "limit_test_batches": 0.5}),  # the trainer's keys as YAML text
    ],
)  # fmt: skip
def test_a_batch_limit_of_1_means_one_batch(
    shapes_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, built, in_file, on_the_command_line, expected
) -> None:
    """Lightning: an int limit counts batches, a float is a fraction; its ``float | int`` annotation made the parser
    read ``1`` as ``1.0`` (every batch)."""
    monkeypatch.chdir(tmp_path)
    extra = []
    if in_file is not None:
        (tmp_path / "limits.yaml").write_text("trainer:\n" + "".join(f"  {line}\n" for line in in_file.splitlines()))
        extra = ["--config", str(tmp_path / "limits.yaml")]
    cli = built(["--config", str(REPO / "configs" / "quickstart.yaml"), *extra, "--data.root", str(shapes_root),
                "--trainer.accelerator", "cpu", *on_the_command_line])  # fmt: skip
    for key, value in expected.items():
        limit = getattr(cli.trainer, key)
        assert (limit, type(limit)) == (value, type(value)), key


def test_a_batch_limit_of_1_stays_one_batch_in_a_trainer_file_the_saved_config_and_print_config(
    shapes_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, built, main, capsys
) -> None:
    """The limits were made ints again from what the command line and the config files wrote, which missed a trainer
    section given as a file inside a config file; and the saved config.yaml said 1.0, so a rerun from it trained
    every batch."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "trainer.yaml").write_text("limit_train_batches: 1\nlimit_val_batches: 0.5\n")
    (tmp_path / "main.yaml").write_text(f"trainer: {tmp_path / 'trainer.yaml'}\n")
    args = ["--config", str(REPO / "configs" / "quickstart.yaml"), "--config", str(tmp_path / "main.yaml"),
            "--data.root", str(shapes_root), "--trainer.accelerator", "cpu"]  # fmt: skip
    cli = built(args)
    assert (cli.trainer.limit_train_batches, cli.trainer.limit_val_batches) == (1, 0.5)
    assert type(cli.trainer.limit_train_batches) is int
    saved = yaml.safe_load(cli.parser.dump(cli.config, skip_none=False))  # what SaveConfigCallback writes
    assert saved["trainer"]["limit_train_batches"] == 1 and type(saved["trainer"]["limit_train_batches"]) is int
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["fit", *args, "--print_config"])
    printed = yaml.safe_load(capsys.readouterr().out)
    assert type(printed["trainer"]["limit_train_batches"]) is int and printed["trainer"]["limit_val_batches"] == 0.5


# --- a short fit that learns, and evaluation of its checkpoint ---------------------------------------------------
@pytest.fixture(scope="module")
def trained(shapes_root: Path, tmp_path_factory: pytest.TempPathFactory, tiny_args, main) -> dict:
    """resnet18 trained 4 epochs (60 steps) on the 240 training images; its results and checkpoint."""
    run = tmp_path_factory.mktemp("trained")
    args = tiny_args(
        shapes_root,
        run,
        data__batch_size=16,
        model__lr=0.05,
        model__warmup_epochs=1,
        model__weight_decay=5e-5,
        model__lr_milestones="[3]",
        trainer__max_epochs=4,
        trainer__log_every_n_steps=2,
    )
    cli = main(["fit", *args, *callbacks_arg(("SeenData", {"out_dir": str(run / "seen")}))])
    return {
        "run": run,
        "log_dir": Path(cli.trainer.logger.log_dir),
        "metrics": {k: float(v) for k, v in cli.trainer.callback_metrics.items()},
        "global_step": cli.trainer.global_step,
        "last": Path(cli.trainer.logger.log_dir) / "checkpoints" / "last.ckpt",
        "args": args,
    }


def test_fit_learns_and_logs_csv(trained: dict) -> None:
    assert trained["global_step"] == 4 * 240 // 16
    rows = read_metrics(trained["log_dir"])
    assert {"train_loss", "train_acc1", "val_acc1", "val_acc5", "val_loss", "train_loss_epoch"} <= set(rows[0])
    train_loss = [float(r["train_loss"]) for r in rows if r["train_loss"]]
    val_acc1 = [float(r["val_acc1"]) for r in rows if r["val_acc1"]]
    assert len(train_loss) >= 20 and len(val_acc1) == 4  # every 2 steps; every epoch
    first, last = sum(train_loss[:4]) / 4, sum(train_loss[-4:]) / 4
    assert last < 0.6 * first, train_loss
    assert train_loss[0] == pytest.approx(math.log(10), rel=0.4)  # about chance level at the start
    assert val_acc1[-1] >= 0.5  # 10 classes: chance is 0.1
    assert trained["metrics"]["val_acc1"] == pytest.approx(val_acc1[-1])
    assert (trained["log_dir"] / "config.yaml").is_file()
    assert trained["last"].name == "last.ckpt" and trained["last"].is_file()
    assert list((trained["log_dir"] / "checkpoints").glob("best-epoch*-acc1*.ckpt"))


def test_training_order_changes_every_epoch(trained: dict) -> None:
    seen = json.loads((trained["run"] / "seen" / "train_rank0.json").read_text())
    epochs = seen["epoch_indices"]
    assert len(epochs) == 4
    for indices in epochs:
        assert sorted(indices) == list(range(240))
    assert len({tuple(indices) for indices in epochs}) == 4
    val = json.loads((trained["run"] / "seen" / "val_rank0.json").read_text())
    assert val["indices"] == list(range(60)) and len(val["targets"]) == 60


def test_validate_and_test_a_checkpoint(trained: dict, shapes_root: Path, tmp_path: Path, main) -> None:
    # The fit's validation of the epoch the checkpoint was written at: the same weights on the same data.
    epoch = torch.load(trained["last"], map_location="cpu", weights_only=True)["epoch"]
    (fit_row,) = [r for r in read_metrics(trained["log_dir"]) if r["val_acc1"] and int(r["epoch"]) == epoch]
    args = [*trained["args"], "--trainer.default_root_dir", str(tmp_path)]
    args += ["--trainer.logger.init_args.save_dir", str(tmp_path)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        validated = main(["validate", *args, "--ckpt_path", str(trained["last"])])
    # Lightning's note that the checkpoint callbacks' best scores are not reloaded into this new folder: a fit's.
    assert not [w for w in caught if "dirpath has changed" in str(w.message)]
    metrics = validated.trainer.callback_metrics
    assert float(metrics["val_acc1"]) == pytest.approx(float(fit_row["val_acc1"]))
    assert float(metrics["val_acc5"]) == pytest.approx(float(fit_row["val_acc5"]))
    assert float(metrics["val_loss"]) == pytest.approx(float(fit_row["val_loss"]), rel=1e-4)
    assert float(metrics["val_acc1"]) >= 0.5
    assert validated.trainer.global_step == 0  # nothing was trained
    tested = main(["test", *args, "--ckpt_path", str(trained["last"])])
    metrics = tested.trainer.callback_metrics
    assert float(metrics["test_acc1"]) == pytest.approx(float(fit_row["val_acc1"]))
    assert float(metrics["test_acc5"]) == pytest.approx(float(fit_row["val_acc5"]))


def test_a_folder_with_other_class_names_is_refused_before_it_is_scored(
    trained: dict, shapes_root: Path, tmp_path: Path, refused
) -> None:
    """Ten classes still, one renamed: every label from it on would move, and the accuracy with them, silently."""
    root = tmp_path / "renamed"
    shutil.copytree(shapes_root, root)
    for split in ("train", "val"):
        (root / split / "circle").rename(root / split / "zz_circle")
    args = [*trained["args"], "--data.root", str(root), "--trainer.logger.init_args.save_dir", str(tmp_path)]
    said = refused(["validate", *args, "--ckpt_path", str(trained["last"])])
    assert (
        f"--ckpt_path {trained['last']} was trained with other class names: label 1 is 'circle' there and 'cross' in "
        "this run's data.root" in said
    )
    # Refused in the fit's own folder, the refused run's config is not left there.
    folder = trained["log_dir"]
    before = {path.name: path.read_bytes() for path in folder.iterdir() if path.is_file()}
    args = [*trained["args"], "--data.root", str(root), "--trainer.logger.init_args.version", folder.name]
    refused(["validate", *args, "--ckpt_path", str(trained["last"])])
    assert {path.name: path.read_bytes() for path in folder.iterdir() if path.is_file()} == before


def test_validate_and_test_in_the_fits_folder_write_beside_its_files_not_over_them(trained: dict, main) -> None:
    """What the refusal of --ckpt_path last once advised (--trainer.logger.init_args.version NAME): validate then
    rewrote the fit's config.yaml and hparams.yaml, and added a step-0 row to its metrics.csv."""
    folder = trained["log_dir"]
    before = {name: (folder / name).read_bytes() for name in ("config.yaml", "hparams.yaml", "metrics.csv")}
    args = [*trained["args"], "--trainer.logger.init_args.version", folder.name, "--trainer.limit_val_batches", "1",
            "--trainer.limit_test_batches", "1"]  # fmt: skip
    try:
        for subcommand in ("validate", "test"):
            main([subcommand, *args, "--ckpt_path", str(trained["last"])])
            assert {name: (folder / name).read_bytes() for name in before} == before
            rows = list(csv.DictReader(open(folder / f"{subcommand}_metrics.csv")))
            assert len(rows) == 1 and float(rows[0][{"validate": "val_acc1", "test": "test_acc1"}[subcommand]]) >= 0
            saved = yaml.safe_load((folder / f"{subcommand}_config.yaml").read_text())
            assert saved["ckpt_path"] == str(trained["last"])
            assert (folder / f"{subcommand}_hparams.yaml").is_file()
    finally:
        for path in folder.glob("*_*.*"):
            if path.name.startswith(("validate_", "test_")):
                path.unlink()  # the module's fixture, shared


def test_validate_without_checkpoint_is_chance(trained: dict, tmp_path: Path, main) -> None:
    # Counterpart of the test above: an untrained net is far from the trained checkpoint.
    args = [*trained["args"], "--trainer.default_root_dir", str(tmp_path)]
    with pytest.warns(UserWarning, match="validate without --ckpt_path .* evaluates a randomly initialized model"):
        cli = main(["validate", *args, "--trainer.logger.init_args.save_dir", str(tmp_path)])
    assert float(cli.trainer.callback_metrics["val_acc1"]) < 0.3


# --- resume ------------------------------------------------------------------------------------------------------
def last_ckpt(cli: train.ImageNetCLI) -> Path:
    return Path(cli.trainer.logger.log_dir) / "checkpoints" / "last.ckpt"


def test_resume_continues_step_epoch_and_lr_schedule(shapes_root: Path, tmp_path: Path, tiny_args, main) -> None:
    spe = 3

    def fit(run: str, epochs: int, *extra: str) -> tuple[train.ImageNetCLI, LRLog]:
        args = tiny_args(
            shapes_root,
            tmp_path / run,
            data__batch_size=8,
            trainer__limit_train_batches=spe,
            trainer__limit_val_batches=1,
            trainer__max_epochs=epochs,
            model__warmup_epochs=1,
            model__lr_milestones="[2]",
            # Without a monitor every epoch saves, so last.ckpt is the end of the run whatever val_acc1 does (with
            # one, Lightning 2.6 updates last.ckpt only with a new best: see test_last_ckpt_is_the_latest_state).
            checkpoint__monitor="null",
        )
        cli = main(["fit", *args, *callbacks_arg(("LRLog", {})), *extra])
        return cli, find(cli, LRLog)

    _, whole = fit("whole", 3)
    first_cli, first = fit("first", 2)
    last = last_ckpt(first_cli)
    assert torch.load(last, map_location="cpu", weights_only=True)["global_step"] == 2 * spe
    assert first_cli.trainer.global_step == 2 * spe
    resumed_cli, resumed = fit("resumed", 3, "--ckpt_path", str(last))

    base = 0.1 * 8 / 256
    expected = [base * lr_multiplier(s, spe, 1, "step", [2], 0.1) for s in range(3 * spe)]
    assert [whole.lr[s] for s in range(3 * spe)] == pytest.approx(expected)
    assert expected[2 * spe] == pytest.approx(base * 0.1)
    assert first.lr == pytest.approx({s: whole.lr[s] for s in range(2 * spe)})
    # The resumed run starts at the step and epoch where the first stopped, on the uninterrupted schedule.
    assert sorted(resumed.lr) == list(range(2 * spe, 3 * spe))
    assert set(resumed.epoch.values()) == {2}
    assert resumed.lr == pytest.approx({s: whole.lr[s] for s in range(2 * spe, 3 * spe)})
    assert resumed_cli.trainer.global_step == 3 * spe
    assert resumed_cli.trainer.current_epoch == 3


@pytest.mark.parametrize("stop", ["epoch_end", "mid_epoch", "mid_epoch_accumulated"])
def test_resume_in_other_units_keeps_the_lr_recipe_on_its_epochs(
    stop: str, shapes_root: Path, tmp_path: Path, tiny_args, main
) -> None:
    # A job requeued with another global batch (here data.batch_size 8 -> 16; fewer ranks is the same arithmetic),
    # another epoch length (limit_train_batches 4 -> 6 steps), a new --model.lr and --model.weight_decay: the rate is
    # the new recipe's at the checkpoint's point in training, warmup (2 epochs) and milestone (epoch 3) on their epochs.
    # Lightning alone restored the old base rate and the old step count, and the old weight decay.
    def fit(run: str, *extra: str) -> tuple[train.ImageNetCLI, LRLog]:
        args = tiny_args(
            shapes_root,
            tmp_path / run,
            trainer__limit_val_batches=1,
            model__warmup_epochs=2,
            model__lr_milestones="[3]",
            checkpoint__monitor="null",
        )
        cli = main(["fit", *args, *callbacks_arg(("LRLog", {})), *extra])
        return cli, find(cli, LRLog)

    first_args = ["--data.batch_size", "8", "--trainer.limit_train_batches", "4", "--trainer.max_epochs", "2"]
    if stop != "epoch_end":
        first_args += ["--trainer.max_steps", "6"]  # epoch 1 after 2 of its 4 steps
    first_cli, _ = fit("first", *first_args)
    last = last_ckpt(first_cli)
    saved = torch.load(last, map_location="cpu", weights_only=True)
    assert saved["lr_schedule_units"] == {"steps_per_epoch": 4, "global_batch": 8}
    # The global batch of 16 as one batch, or as two of 8 accumulated (12 batches, 6 steps an epoch either way).
    batches = ["--data.batch_size", "16", "--trainer.limit_train_batches", "6"]
    if stop == "mid_epoch_accumulated":
        batches = ["--data.batch_size", "8", "--trainer.accumulate_grad_batches", "2", "--trainer.limit_train_batches",
                   "12"]  # fmt: skip
    resumed_cli, resumed = fit(
        "resumed",
        *batches,
        "--trainer.max_epochs",
        "4",
        *["--model.lr", "0.2", "--model.weight_decay", "0.001", "--ckpt_path", str(last)],
    )
    base, spe = 0.2 * 16 / 256, 6
    steps = sorted(resumed.lr)
    epochs = [resumed.epoch[step] for step in steps]
    if stop == "epoch_end":
        positions = list(range(2 * spe, 4 * spe))  # epochs 2 and 3, whole
        assert epochs == [2] * spe + [3] * spe
    elif stop == "mid_epoch":
        # The rest of epoch 1 from batch 2: 4 steps, counted back from the epoch's end (positions 8-11 of 12 warmup
        # steps: 9/12, 10/12, 11/12, 1), then epochs 2 and 3.
        positions = list(range(spe + 2, 4 * spe))
        assert epochs == [1] * 4 + [2] * spe + [3] * spe
    else:
        # 16 of epoch 1's images done are 2 of its 12 batches of 8: 10 batches left, 5 steps of 2, counted back from
        # the epoch's end (positions 7-11), then epochs 2 and 3.
        positions = list(range(spe + 1, 4 * spe))
        assert epochs == [1] * 5 + [2] * spe + [3] * spe
    expected = [base * lr_multiplier(p, spe, 2, "step", [3], 0.1) for p in positions]
    assert [resumed.lr[step] for step in steps] == pytest.approx(expected)
    # The run's last checkpoint is on its epochs' schedule: a later resume in these units goes on from there.
    state = torch.load(last_ckpt(resumed_cli), map_location="cpu", weights_only=True)
    assert state["lr_schedulers"][0]["last_epoch"] == 4 * spe
    assert state["lr_schedule_units"] == {"steps_per_epoch": spe, "global_batch": 16}
    group = resumed_cli.trainer.optimizers[0].param_groups[0]
    assert (resumed_cli.model.hparams.lr, group["weight_decay"]) == (0.2, 0.001)


def test_last_ckpt_is_the_latest_state(shapes_root: Path, tmp_path: Path, tiny_args, main) -> None:
    # Monitoring the epoch with mode min: only epoch 0 is ever a "best"; the metric must not matter for last.ckpt.
    args = tiny_args(
        shapes_root,
        tmp_path,
        data__batch_size=8,
        trainer__limit_train_batches=2,
        trainer__limit_val_batches=1,
        trainer__max_epochs=2,
        checkpoint__monitor="epoch",
        checkpoint__mode="min",
    )
    cli = main(["fit", *args])
    assert cli.trainer.global_step == 4
    state = torch.load(last_ckpt(cli), map_location="cpu", weights_only=True)
    assert (state["global_step"], state["epoch"]) == (4, 1)


def test_rerun_in_the_same_run_folder(shapes_root: Path, tmp_path: Path, tiny_args, main) -> None:
    args = tiny_args(
        shapes_root,
        tmp_path,
        data__batch_size=8,
        trainer__max_steps=1,
        trainer__limit_val_batches=1,
        trainer__logger__init_args__version="fixed",
    )
    for _ in range(2):
        cli = main(["fit", *args])
        assert cli.trainer.global_step == 1
    log_dir = tmp_path / "logs" / "fixed"
    assert Path(cli.trainer.logger.log_dir) == log_dir
    assert (log_dir / "config.yaml").is_file()
    assert (log_dir / "checkpoints" / "last.ckpt").is_file()


# --- precision ---------------------------------------------------------------------------------------------------
#: bf16 convolutions are slow on CPUs without native bf16: small batches of small crops.
SMALL = {"data__batch_size": 2, "data__crop_size": 16, "data__val_resize_size": 16, "data__val_crop_size": 16}


def test_bf16_mixed_runs_on_cpu(shapes_root: Path, tmp_path: Path, tiny_args, main) -> None:
    cli = main(
        [
            "fit",
            *tiny_args(
                shapes_root,
                tmp_path,
                **SMALL,
                trainer__precision="bf16-mixed",
                trainer__max_epochs=1,
                trainer__limit_train_batches=2,
                trainer__limit_val_batches=1,
            ),
        ]
    )
    assert cli.trainer.global_step == 2
    assert cli.trainer.precision == "bf16-mixed"
    assert math.isfinite(float(cli.trainer.callback_metrics["val_loss"]))
    assert cli.model.model.fc.weight.dtype == torch.float32  # mixed: the weights stay float32


# --- two CPU processes -------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_ddp_two_cpu_processes(trained: dict, shapes_root: Path, tmp_path: Path, run_train, main) -> None:
    config = tmp_path / "ddp.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "data": {
                    "root": str(shapes_root),
                    "workers": 0,
                    "batch_size": 16,
                    "crop_size": 32,
                    "val_resize_size": 36,
                    "val_crop_size": 32,
                },
                "model": {"arch": "resnet18"},
                "trainer": {
                    "max_epochs": 2,  # the sampler's epoch set on each rank: a new order, the shards still disjoint
                    "limit_train_batches": 2,
                    "num_sanity_val_steps": 0,
                    "enable_progress_bar": False,
                    "enable_model_summary": False,
                    "default_root_dir": str(tmp_path / "run"),
                    "logger": {"init_args": {"save_dir": str(tmp_path / "run"), "name": "logs"}},
                },
            }
        )
    )
    ddp = [
        "--config",
        str(config),
        "--trainer.accelerator",
        "cpu",
        "--trainer.devices",
        "2",
        "--trainer.strategy",
        "ddp",
    ]

    # The progress bar on, as a user has it: on rank 0 only, it reads the epoch's metrics before the module's epoch-end
    # hook, so a collective of the app's own there met another rank's different one (a crash at the first epoch end).
    fit = run_train(
        [
            "fit",
            *ddp,
            "--trainer.enable_progress_bar",
            "true",
            *callbacks_arg(("SeenData", {"out_dir": str(tmp_path / "fit")})),
        ],
        cwd=tmp_path,
    )
    assert fit.returncode == 0, fit.stderr[-4000:]
    train_set = ImageFolder(str(shapes_root / "train"))
    val_set = ImageFolder(str(shapes_root / "val"))
    for stage, dataset, per_rank in (("train", train_set, 120), ("val", val_set, 30)):
        ranks = [json.loads((tmp_path / "fit" / f"{stage}_rank{r}.json").read_text()) for r in range(2)]
        assert [r["world_size"] for r in ranks] == [2, 2]
        assert [len(r["indices"]) for r in ranks] == [per_rank, per_rank]
        assert not set(ranks[0]["indices"]) & set(ranks[1]["indices"]), stage
        assert sorted(ranks[0]["indices"] + ranks[1]["indices"]) == list(range(len(dataset)))
        for r in ranks:  # the batches followed the rank's shard
            assert r["targets"] == [dataset.targets[i] for i in r["indices"]][: len(r["targets"])]
    assert [len(json.loads((tmp_path / "fit" / f"train_rank{r}.json").read_text())["targets"]) for r in (0, 1)] == [
        32,
        32,
    ]
    epochs = [json.loads((tmp_path / "fit" / f"train_rank{r}.json").read_text())["epoch_indices"] for r in (0, 1)]
    assert [len(e) for e in epochs] == [2, 2]
    for epoch in (0, 1):
        assert sorted(epochs[0][epoch] + epochs[1][epoch]) == list(range(len(train_set))), epoch
    assert epochs[0][0] != epochs[0][1] and epochs[1][0] != epochs[1][1]
    assert list((tmp_path / "run" / "logs").rglob("last.ckpt"))
    # train_loss_epoch: the mean over both ranks' images (each rank's mean weighted by its images, Lightning's sync).
    losses = [
        pair for r in (0, 1) for pair in json.loads((tmp_path / "fit" / f"train_rank{r}.json").read_text())["losses"]
    ]
    (metrics,) = (tmp_path / "run" / "logs").rglob("metrics.csv")
    logged = [float(row["train_loss_epoch"]) for row in csv.DictReader(metrics.open()) if row.get("train_loss_epoch")]
    assert len(logged) == 2
    assert logged[-1] == pytest.approx(sum(loss * n for loss, n in losses) / sum(n for _, n in losses), rel=1e-5)

    # One fixed checkpoint, validated by two processes and by one: the val shards do not pad, so the metrics agree.
    out = tmp_path / "validate"
    checked = run_train(
        ["validate", *ddp, "--ckpt_path", str(trained["last"]), *callbacks_arg(("SeenData", {"out_dir": str(out)}))],
        cwd=tmp_path,
    )
    assert checked.returncode == 0, checked.stderr[-4000:]
    two = json.loads((out / "val_metrics.json").read_text())
    assert sum(len(json.loads((out / f"val_rank{r}.json").read_text())["targets"]) for r in (0, 1)) == 60
    one = main(
        [
            "validate",
            "--config",
            str(config),
            "--trainer.accelerator",
            "cpu",
            "--trainer.devices",
            "1",
            "--ckpt_path",
            str(trained["last"]),
        ]
    ).trainer.callback_metrics
    assert two["val_acc1"] == pytest.approx(float(one["val_acc1"]), abs=1e-6)
    assert two["val_acc5"] == pytest.approx(float(one["val_acc5"]), abs=1e-6)
    assert two["val_loss"] == pytest.approx(float(one["val_loss"]), rel=1e-5)
    assert two["val_acc1"] == pytest.approx(trained["metrics"]["val_acc1"], abs=1e-6)


@pytest.mark.slow
def test_a_ddp_refusal_in_the_restore_is_said_once(
    shapes_root: Path, tmp_path: Path, tiny_args, run_train, main
) -> None:
    """Both ranks refuse the checkpoint (other class names) in the restore. Rank 0 is held in its failure (SlowFailure)
    so that rank 1 reaches its message first, as it did in some runs: the job said the refusal once per rank."""
    first = main(["fit", *tiny_args(shapes_root, tmp_path / "first", trainer__max_steps=1)])
    last = Path(first.trainer.logger.log_dir) / "checkpoints" / "last.ckpt"
    root = tmp_path / "renamed"
    shutil.copytree(shapes_root, root)
    for split in ("train", "val"):
        (root / split / "circle").rename(root / split / "zz_circle")
    args = tiny_args(root, tmp_path / "second", trainer__devices=2, trainer__strategy="ddp", trainer__max_steps=2)
    done = run_train(
        ["fit", *args, "--ckpt_path", str(last), *callbacks_arg(("SlowFailure", {"seconds": 3}))], cwd=tmp_path
    )
    assert done.returncode == 2, done.stderr[-4000:]
    said = f"error: --ckpt_path {last} was trained with other class names: label 1 is 'circle' there and 'cross'"
    assert done.stderr.count(said) == 1, done.stderr[-4000:]
    assert "Traceback" not in done.stderr


# --- GPU (python -m pytest -m gpu) -------------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_fit_fp16_channels_last_with_workers(shapes_root: Path, tmp_path: Path, tiny_args, main) -> None:
    """The CUDA path end to end: pinned uint8 batches from worker processes, side-stream prefetch, fp16 AMP."""
    args = tiny_args(
        shapes_root,
        tmp_path,
        trainer__accelerator="gpu",
        trainer__precision="16-mixed",
        trainer__max_epochs=2,
        trainer__limit_train_batches=4,
        trainer__limit_val_batches=2,
        model__channels_last="true",
        data__workers=2,
    )
    cli = main(["fit", *args, *callbacks_arg(("LRLog", {}))])
    assert cli.trainer.global_step == 8
    assert cli.trainer.precision == "16-mixed"
    assert cli.trainer.strategy.root_device.type == "cuda"
    assert math.isfinite(float(cli.trainer.callback_metrics["val_loss"]))
    assert cli.datamodule.channels_last
    loader = cli.trainer.train_dataloader
    assert loader.is_cuda and loader.loader.loader.pin_memory  # prefetcher -> bad-image counter -> DataLoader
    images, targets = next(iter(loader))
    assert images.device.type == "cuda" and images.dtype == torch.float32
    assert images.is_contiguous(memory_format=torch.channels_last)
    assert targets.device.type == "cuda"
    assert sorted(find(cli, LRLog).lr) == list(range(8))


@pytest.mark.gpu
def test_cpu_checkpoint_resumes_on_the_gpu_in_fp16(shapes_root: Path, tmp_path: Path, tiny_args, main) -> None:
    """A checkpoint written on a CPU (optimizer state on the CPU, no GradScaler state) continues on a GPU in fp16."""

    def fit(run: str, epochs: int, *extra: str) -> train.ImageNetCLI:
        args = tiny_args(
            shapes_root,
            tmp_path / run,
            trainer__max_epochs=epochs,
            trainer__limit_train_batches=2,
            trainer__limit_val_batches=1,
            checkpoint__monitor="null",
        )
        return main(["fit", *args, *extra])

    cpu = fit("cpu", 1)
    last = last_ckpt(cpu)
    gpu = fit("gpu", 2, "--trainer.accelerator", "gpu", "--trainer.precision", "16-mixed", "--ckpt_path", str(last))
    assert gpu.trainer.global_step == 4
    assert gpu.trainer.strategy.root_device.type == "cuda"
    # (Lightning moves the optimizer state back to the CPU when fit ends.)
    assert all(torch.isfinite(s["momentum_buffer"]).all() for s in gpu.trainer.optimizers[0].state.values())
    assert math.isfinite(float(gpu.trainer.callback_metrics["val_loss"]))


def test_checkpoint_of_another_arch_is_refused_in_one_line(trained: dict, main, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["validate", *trained["args"], "--model.arch", "resnet34", "--ckpt_path", str(trained["last"])])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "holds a resnet18 and this run asks for model.arch resnet34; pass --model.arch resnet18" in err


def test_an_arch_the_run_does_not_name_is_the_checkpoints(trained: dict, shapes_root: Path, tmp_path: Path, tiny_args,
                                                          main, capsys, caplog) -> None:  # fmt: skip
    # Left at its default (resnet50), model.arch was refused as if asked for: "this run asks for model.arch resnet50".
    args = tiny_args(shapes_root, tmp_path, model__arch=None, trainer__limit_val_batches=2)
    with caplog.at_level(logging.INFO):
        cli = main(["validate", *args, "--ckpt_path", str(trained["last"])])
    assert cli.model.hparams.arch == "resnet18"
    assert "model.arch 'resnet18' from the checkpoint (the configuration's: 'resnet50')" in caplog.text
    # The checkpoint's lr 0.05 and milestones [3] differ from the defaults: not said, an evaluation has no optimizer.
    assert "model.lr" not in caplog.text and "model.warmup" not in caplog.text
    # Named in a config file, it is the run's ask.
    config = tmp_path / "arch.yaml"
    config.write_text("model:\n  arch: resnet34\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["validate", "--config", str(config), *args, "--ckpt_path", str(trained["last"])])
    assert exit_info.value.code == 2
    assert "holds a resnet18 and this run asks for model.arch resnet34" in capsys.readouterr().err


def test_checks_of_the_configuration_are_said_as_the_parsers_errors(trained: dict, refused):
    args, versions = trained["args"], sorted((trained["run"] / "logs").glob("version_*"))
    for key, value, message in [
        ("data.batch_size", "0", "error: data.batch_size must be >= 1, got 0"),
        ("data.workers", "-1", "error: data.workers must be >= 0"),
        ("model.arch", "notanarch", "error: model.arch: unknown architecture 'notanarch'; valid: alexnet"),
        ("model.lr", "-1", "error: model.lr must be > 0, got -1.0"),
        ("profile.num_steps", "0", "error: profile.num_steps must be >= 1, got 0"),
        ("trainer.max_epochs", "-5", "error: trainer: `max_epochs` must be a non-negative integer or -1"),
        ("trainer.devices", "0", "error: trainer: `Trainer(devices='0')` value is not a valid input"),
        # Lightning's TypeError on the CPU: a traceback before.
        ("trainer.devices", "-2", "error: trainer: `devices` selected with `CPUAccelerator` should be an int > 0"),
    ]:
        said = refused(["fit", *args, f"--{key}", value])
        assert said.startswith(message), key
        if key == "trainer.devices":  # Lightning's messages do not say what is valid
            assert said.endswith("(trainer.devices: a count >= 1 or auto)"), said  # the tests' accelerator: cpu
    assert sorted((trained["run"] / "logs").glob("version_*")) == versions  # refused before any run folder


def test_checks_in_setup_are_said_in_one_line_and_leave_no_run_folder(
    shapes_root: Path, tmp_path: Path, tiny_args, refused
) -> None:
    # These need the dataset's size or the world size, so they run in setup, after the logger made version_0.
    images = len(list((shapes_root / "train").rglob("*.JPEG")))
    for key, value, message in [
        ("data.batch_size", "100000", f"holds {images} images, fewer than one batch of data.batch_size 100000"),
        (
            "profile.start_step",
            "1 --profile.ranks [3]",
            "error: profile.ranks [3] names a rank >= the world size 1; valid ranks are 0..0",
        ),
    ]:
        said = refused(["fit", *tiny_args(shapes_root, tmp_path, trainer__max_steps=2), f"--{key}", *value.split()])
        assert message in said, key
        assert not (tmp_path / "logs").exists(), key
    # A folder that was there before the refused run stays, and the run's own new version folder goes.
    (tmp_path / "logs" / "version_0" / "checkpoints").mkdir(parents=True)
    (tmp_path / "logs" / "version_0" / "checkpoints" / "last.ckpt").write_bytes(b"earlier run")
    refused(["fit", *tiny_args(shapes_root, tmp_path), "--data.batch_size", "100000"])
    assert [p.name for p in (tmp_path / "logs").iterdir()] == ["version_0"]


def test_ckpt_path_last_on_a_file_cut_short_is_refused_in_a_line(
    shapes_root: Path, tmp_path: Path, tiny_args, refused
) -> None:
    # Lightning resolves "last" itself, after the parse-time checks of a named file: it gave a 45-line traceback.
    (tmp_path / "ckpts").mkdir()
    (tmp_path / "ckpts" / "last.ckpt").write_bytes(b"PK\x03\x04" + b"\0" * 100)  # the start of a zip archive
    args = tiny_args(shapes_root, tmp_path / "run")
    said = refused(["fit", *args, "--last_checkpoint.dirpath", str(tmp_path / "ckpts"), "--ckpt_path", "last"])
    assert said.startswith(f"error: --ckpt_path {tmp_path / 'ckpts' / 'last.ckpt'} cannot be read: it is cut short")


def test_a_stop_between_log_steps_logs_the_interval_it_cuts_short(
    shapes_root: Path, tmp_path: Path, tiny_args, main
) -> None:
    # exit_after stops at step 6, one step after the log step 5: Lightning writes a row at a stop, and it held step
    # 5's values a second time; now the module logs the one-step interval there.
    args = tiny_args(shapes_root, tmp_path, trainer__log_every_n_steps=5, trainer__max_steps=12,
                     trainer__limit_val_batches=0, profile__start_step=3, profile__num_steps=3)  # fmt: skip
    with pytest.warns(UserWarning, match="not CUDA"):
        main(["fit", *args])
    (metrics,) = (tmp_path / "logs").rglob("metrics.csv")
    rows = [row for row in csv.DictReader(metrics.open()) if row.get("train_loss")]
    assert [row["step"] for row in rows] == ["4", "5"]  # global steps 5 and 6 (Lightning counts from 0)
    assert rows[0]["train_loss"] != rows[1]["train_loss"] and rows[0]["train_img_s"] != rows[1]["train_img_s"]


def test_a_valueerror_from_outside_lightning_while_building_the_trainer_keeps_its_traceback(
    shapes_root: Path, tmp_path: Path, tiny_args, main, monkeypatch: pytest.MonkeyPatch
) -> None:
    def plugin_of_the_users(*args: object, **kwargs: object) -> None:
        raise ValueError("a bug in a plugin")

    monkeypatch.setattr(train.ImageNetCLI, "_instantiate_trainer", plugin_of_the_users)
    with pytest.raises(ValueError, match="a bug in a plugin"):  # not turned into a one-line `error: trainer:`
        main(["fit", *tiny_args(shapes_root, tmp_path)])


def test_checkpoint_paths_that_cannot_be_loaded_are_refused_naming_why(trained: dict, tmp_path: Path, refused):
    args, not_a_checkpoint = trained["args"], tmp_path / "config.yaml"
    not_a_checkpoint.write_text("model: {}\n")
    torn = tmp_path / "torn.ckpt"
    torn.write_bytes(trained["last"].read_bytes()[:3000])
    for path, why in [
        (tmp_path, "is a folder"),
        (tmp_path / "missing.ckpt", "does not exist"),
        (not_a_checkpoint, "is not a checkpoint (a checkpoint is a torch.save zip archive"),
        (torn, "is cut short: a zip archive (torch.save's format) whose end is missing"),
    ]:
        assert f"--ckpt_path {path} {why}" in refused(["validate", *args, "--ckpt_path", str(path)])
    # 'last': Lightning looks in this run's own new version folder; the newest last.ckpt of the run's name is named.
    said = refused(["fit", *args, "--ckpt_path", "last"])
    assert "--ckpt_path last: this run writes into a new version folder of its own" in said
    runs = trained["log_dir"].parent
    assert f"pass the file (the newest under {runs}: --ckpt_path {trained['last']}), or fix the folder" in said
    # validate and test: Lightning warned and evaluated a randomly initialized model, exit status 0.
    said = refused(["validate", *args, "--ckpt_path", "last"])
    assert said.endswith(f"evaluate a randomly initialized model; pass the file (the newest under {runs}: --ckpt_path "
                         f"{trained['last']})")  # fmt: skip
    empty = tmp_path / "empty"
    empty.mkdir()
    said = refused(["test", *args, "--last_checkpoint.dirpath", str(empty), "--ckpt_path", "last"])
    assert f"--ckpt_path last: no last*.ckpt in {empty}, so test would evaluate a randomly initialized model" in said
    # A fixed run folder of another name than version_N is found as the newest too.
    named = runs / "named" / "checkpoints"
    named.mkdir(parents=True)
    shutil.copy(trained["last"], named / "last.ckpt")
    try:
        said = refused(["validate", *args, "--trainer.logger.init_args.version", "other", "--ckpt_path", "last"])
        assert said.endswith(f"no last*.ckpt in {runs / 'other' / 'checkpoints'}, so validate would evaluate a "
                             f"randomly initialized model; pass the file (the newest under {runs}: --ckpt_path "
                             f"{named / 'last.ckpt'})")  # fmt: skip
    finally:
        shutil.rmtree(runs / "named")  # the module's fixture, shared


def test_a_resume_past_the_runs_end_is_refused_and_one_at_it_warned(trained: dict, refused, main, tmp_path) -> None:
    # Lightning restored the checkpoint, said max_steps was reached and exited 0: a run that trained nothing.
    last, steps = trained["last"], trained["global_step"]  # 4 epochs
    said = refused(["fit", *trained["args"], "--trainer.max_steps", "3", "--ckpt_path", str(last)])
    assert said == (
        f"error: --ckpt_path {last} has trained {steps} steps and this run ends at trainer.max_steps 3: nothing would "
        f"train; raise trainer.max_steps to train on, or evaluate it: python train.py validate ... --ckpt_path {last}"
    )
    assert "has trained 4 epochs and this run ends at trainer.max_epochs 2" in refused(
        ["fit", *trained["args"], "--trainer.max_epochs", "2", "--ckpt_path", str(last)]
    )
    runs = trained["log_dir"].parent
    folders = sorted(runs.iterdir())
    with pytest.warns(UserWarning, match="has trained 4 epochs and this run ends at trainer.max_epochs 4: nothing"):
        cli = main(["fit", *trained["args"], "--ckpt_path", str(last)])  # the rerun of a finished job
    assert cli.trainer.global_step == steps
    # Its version folder, made before the fit found nothing to train, held the setup files of no run: taken back.
    assert not Path(cli.trainer.logger.log_dir).exists() and sorted(runs.iterdir()) == folders
    # The requeued job's form: 'last' in the run's fixed folder, warned of by the file it takes; the folder's setup
    # files stay those of the run that trained.
    fixed = runs / "fixed"
    shutil.copytree(trained["log_dir"], fixed)
    config = (fixed / "config.yaml").read_bytes()
    try:
        with pytest.warns(UserWarning, match=re.escape(f"--ckpt_path last ({fixed / 'checkpoints' / 'last.ckpt'}) "
                                                       "has trained 4 epochs")):  # fmt: skip
            cli = main(["fit", *trained["args"], "--trainer.logger.init_args.version", "fixed", "--model.lr", "0.07",
                        "--ckpt_path", "last"])  # fmt: skip
        assert cli.trainer.global_step == steps and (fixed / "config.yaml").read_bytes() == config
    finally:
        shutil.rmtree(fixed)  # the module's fixture, shared
    # Saved at the end of the last epoch's last batch, before the epoch's end (every_n_train_steps, a preemption):
    # Lightning counts that epoch done as well.
    saved = torch.load(last, map_location="cpu", weights_only=True)
    loops = saved["loops"]["fit_loop"]
    loops["epoch_progress"]["current"].update(processed=3, completed=3, started=4, ready=4)
    loops["epoch_loop.batch_progress"]["is_last_batch"] = True
    torch.save(saved, tmp_path / "batch_end.ckpt")
    assert "has trained 4 epochs and this run ends at trainer.max_epochs 3" in refused(
        ["fit", *trained["args"], "--trainer.max_epochs", "3", "--ckpt_path", str(tmp_path / "batch_end.ckpt")]
    )
    # trainer.max_time counts over every resume (Lightning's Timer state travels in the checkpoint): a run it stopped,
    # resumed with the same limit, trained nothing and exited 0.
    saved = torch.load(last, map_location="cpu", weights_only=True)
    saved["callbacks"]["Timer"] = {"time_elapsed": {"train": 75.5, "sanity_check": 0.0, "validate": 3.0}}
    torch.save(saved, tmp_path / "timed.ckpt")
    said = refused(["fit", *trained["args"], "--trainer.max_epochs", "9", "--trainer.max_time", "00:00:01:00",
                    "--ckpt_path", str(tmp_path / "timed.ckpt")])  # fmt: skip
    assert said.startswith(
        f"error: --ckpt_path {tmp_path / 'timed.ckpt'} has trained for 0:01:15 and this run ends at trainer.max_time "
        "0:01:00, counted over every resume: nothing would train"
    )
    # The requeued job's form, --ckpt_path last, which Lightning resolves in the run: refused there, in one line.
    (tmp_path / "requeue").mkdir()
    torch.save(saved, tmp_path / "requeue" / "last.ckpt")
    said = refused(["fit", *trained["args"], "--trainer.max_epochs", "9", "--trainer.max_time", "00:00:01:00",
                    "--last_checkpoint.dirpath", str(tmp_path / "requeue"), "--ckpt_path", "last"])  # fmt: skip
    assert said.startswith(
        f"error: --ckpt_path last ({tmp_path / 'requeue' / 'last.ckpt'}) has trained for 0:01:15 and this run ends at "
        "trainer.max_time 0:01:00"
    )


def test_lightnings_own_checkpoint_names_and_remote_paths_reach_lightning(trained: dict, main, monkeypatch, refused):
    asked = []
    record = lambda self, *args, ckpt_path=None, **kwargs: asked.append(ckpt_path)  # noqa: E731
    monkeypatch.setattr(pl.Trainer, "validate", record)
    monkeypatch.setattr(pl.Trainer, "test", record)
    monkeypatch.setattr(pl.Trainer, "fit", record)
    for path in ["s3://bucket/run/last.ckpt", "hpc", "registry:my-model:v1", "Registry"]:
        main(["validate", *trained["args"], "--ckpt_path", path])
    # A file: evaluated at the validation sizes it was validated at, or with a warning (the data's options, which a
    # checkpoint does not carry over).
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        main(["validate", *trained["args"], "--ckpt_path", str(trained["last"])])
    assert not [w for w in caught if "other sizes" in str(w.message)]
    with pytest.warns(UserWarning, match=re.escape(
        f"--ckpt_path {trained['last']} was validated at other sizes than this test's: data.val_resize_size 256 (its "
        "fit's: 36); data.val_crop_size 224 (its fit's: 32); pass its fit's"
    )):  # fmt: skip
        main(["test", *trained["args"], "--data.val_resize_size", "256", "--data.val_crop_size", "224",
              "--ckpt_path", str(trained["last"])])  # fmt: skip
    # The same for the file --ckpt_path last takes.
    last = ["--last_checkpoint.dirpath", str(trained["last"].parent), "--ckpt_path", "last"]
    with pytest.warns(UserWarning, match=re.escape(f"--ckpt_path {trained['last']} was validated at other sizes")):
        main(["validate", *trained["args"], "--data.val_crop_size", "24", *last])
    del asked[-3:]
    # 'last' where the folder is fixed (a requeued job's usual resume): Lightning finds it there.
    main(["fit", *trained["args"], "--trainer.logger.init_args.version", "fixed", "--ckpt_path", "last"])
    # Without a logger the folder is fixed too: <default_root_dir>/checkpoints.
    main(["fit", *trained["args"], "--trainer.logger", "false", "--ckpt_path", "last"])
    assert asked == ["s3://bucket/run/last.ckpt", "hpc", "registry:my-model:v1", "Registry", "last", "last"]
    said = refused(["validate", *trained["args"], "--ckpt_path", "best"])
    assert "--ckpt_path best names the best checkpoint of a fit in this same process" in said


def test_a_resume_takes_the_checkpoints_options_but_the_command_lines_own(
    shapes_root: Path, tmp_path: Path, tiny_args, main
) -> None:
    # Started from a weights file (since moved away) with warmup 1 and lr 0.05: resumed with the same configuration but
    # --model.lr 0.2 on the command line, the run keeps its warmup (the checkpoint's), takes the new rate, and does not
    # read the weights file (the checkpoint's weights replace it).
    weights = tmp_path / "start.pth"
    torch.save(ImageNetClassifier(arch="resnet18", num_classes=10).model.state_dict(), weights)
    args = tiny_args(shapes_root, tmp_path, data__batch_size=8, trainer__limit_val_batches=1)
    first = main(
        [
            "fit",
            *args,
            "--trainer.max_steps",
            "1",
            "--model.weights",
            str(weights),
            "--model.lr",
            "0.05",
            "--model.warmup_epochs",
            "1",
        ]
    )
    # The first submission of a requeued job (a fixed folder, --ckpt_path last, nothing there yet): Lightning starts
    # from scratch, so from the weights file.
    requeued = main(["fit", *args, "--trainer.max_steps", "1", "--model.weights", str(weights)]
                    + ["--trainer.logger.init_args.version", "requeued", "--ckpt_path", "last"])  # fmt: skip
    assert requeued.model.hparams.weights == str(weights)
    weights.rename(tmp_path / "moved.pth")
    resumed = main(["fit", *args, "--trainer.max_steps", "2", "--model.lr=0.2", "--ckpt_path", str(last_ckpt(first))])
    assert resumed.trainer.global_step == 2
    hparams = resumed.model.hparams
    assert (hparams.lr, hparams.warmup_epochs, hparams.weights) == (0.2, 1, None)
    validated = main(["validate", *args, "--ckpt_path", str(last_ckpt(resumed))])
    assert validated.model.hparams.lr == 0.2  # what the resumed run saved


def test_a_resume_or_evaluation_with_another_channels_last_gives_the_data_the_models(
    trained: dict, tmp_path: Path, main
) -> None:
    # The checkpoint was trained without channels_last; the command line's own --model.channels_last wins back over
    # it, and the data module, linked to the model's option at parse time, must follow (Lightning refuses a module and
    # a data module whose hparams differ, in a traceback after set-up).
    args = [*trained["args"], "--trainer.default_root_dir", str(tmp_path), "--trainer.limit_val_batches", "1",
            "--trainer.logger.init_args.save_dir", str(tmp_path)]  # fmt: skip
    for subcommand in ("fit", "validate"):
        steps = ["--trainer.max_steps", str(trained["global_step"] + 1)] if subcommand == "fit" else []
        cli = main([subcommand, *args, *steps, "--model.channels_last", "true", "--ckpt_path", str(trained["last"])])
        assert cli.model.hparams.channels_last and cli.datamodule.hparams.channels_last, subcommand


def test_help_says_what_each_subcommand_does_and_errors_point_to_the_subcommands_help(
    trained: dict, main, capsys
) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    listing = " ".join(capsys.readouterr().out.split())
    assert "test Evaluates a checkpoint (--ckpt_path) on the val/ split, as validate does" in listing
    assert "the test set" not in listing  # Lightning's description
    # An error found after parsing points to the help that lists the keys (the top-level one lists none).
    with pytest.raises(SystemExit):
        main(["fit", *trained["args"], "--trainer.max_steps", "3", "--ckpt_path", str(trained["last"])])
    assert "run: train.py fit --help" in capsys.readouterr().err


def test_version_and_no_predict(main, capsys, refused):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert f"torch {torch.__version__}" in out and "pytorch_lightning" in out
    assert "invalid choice: 'predict' (choose from 'fit', 'validate', 'test')" in refused(["predict"])


def test_module_refuses_weights_of_another_arch(trained: dict) -> None:
    # Outside the CLI (Trainer API) the module itself checks, before Lightning loads mismatched weights.
    from imagenet_module import ImageNetClassifier

    checkpoint = torch.load(trained["last"], map_location="cpu", weights_only=True)
    with pytest.raises(ValueError, match="holds resnet18 with 10 classes, this run builds resnet34 with 10 classes"):
        ImageNetClassifier(arch="resnet34", num_classes=10).on_load_checkpoint(checkpoint)


def test_two_deterministic_runs_give_bitwise_identical_losses(shapes_root: Path, tmp_path: Path, tiny_args, main):
    losses = []
    for run in ("a", "b"):
        args = tiny_args(
            shapes_root, tmp_path / run, trainer__max_steps=6, trainer__limit_val_batches=0,
            trainer__deterministic="true", trainer__log_every_n_steps=1, data__workers=2,
        )  # fmt: skip
        cli = main(["fit", *args])
        rows = read_metrics(cli.trainer.logger.log_dir)
        losses.append([r["train_loss"] for r in rows if r["train_loss"]])
        weights = {k: v.clone() for k, v in cli.model.state_dict().items()}
        if run == "a":
            first_weights = weights
    assert len(losses[0]) == 5 and losses[0] == losses[1]  # the CSV holds the exact float reprs
    assert all(torch.equal(first_weights[k], weights[k]) for k in weights)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("workers", "policy", "bar"), [(0, "error", False), (1, "error", False), (1, "skip", False), (1, "error", True)]
)
def test_a_bad_image_ends_python_train_py_with_one_error_line(
    workers: int, policy: str, bar: bool, shapes_root: Path, tmp_path: Path, tiny_args, run_train
) -> None:
    # Before: a 76-line traceback through Lightning's loops and the loader (a worker's, quoted, inside it). With the
    # progress bar on (the default), the line then went on from the bar's open one on a terminal (the bar is on
    # stdout): "Epoch 0:   0%|   | 0/15 [00:00<?, ?it/s]train.py: error: bad image ...".
    root = tmp_path / "data"
    shutil.copytree(shapes_root, root)
    bad = sorted((root / "train").rglob("*.JPEG"))
    for path in bad:  # every training file: the first batch has one, whatever the order
        path.write_bytes(b"not a JPEG")
    args = tiny_args(root, tmp_path / "run", data__workers=workers, data__on_bad_image=policy,
                     trainer__limit_val_batches=0, trainer__enable_progress_bar=str(bar).lower())  # fmt: skip
    result = run_train(["fit", *args], cwd=tmp_path, timeout=150)
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    if policy == "error":
        said = re.fullmatch(r"train\.py: error: bad image (\S+\.JPEG): .+ \(remove or replace the file, .+\)", last)
        assert said and Path(said.group(1)) in bad, last
    else:  # skip gives up on a run of bad files
        assert re.fullmatch(r"train\.py: error: \d+ bad images in a row from index \d+ on \(.+", last), last
    assert "Traceback" not in result.stderr and "Caught BadImageError" not in result.stderr
    if bar:
        assert "Epoch 0:" in result.stdout and result.stdout.endswith("\n"), result.stdout[-200:]


def test_the_progress_bars_an_error_left_open_close_so_that_the_next_line_starts_its_own(monkeypatch) -> None:
    # A bad validation image with the bars on: the main bar (position 0) and the validation bar (position 1, not
    # left). Closed in the main, validation order (as the set of bars may give them), the validation bar's clear
    # ended on "\x1b[A" with the cursor mid-line, where "train.py: error: ..." then began.
    from tqdm import tqdm

    out = io.StringIO()
    main_bar = tqdm(total=10, desc="Epoch 0", position=0, leave=True, file=out)
    main_bar.update(3)
    validation = tqdm(total=5, desc="Validation", position=1, leave=False, file=out)
    validation.update(2)
    monkeypatch.setattr(tqdm, "_instances", [main_bar, validation])
    train.close_progress_bars()
    assert out.getvalue().endswith("\n") and "Epoch 0:  30%" in out.getvalue().splitlines()[-1]
