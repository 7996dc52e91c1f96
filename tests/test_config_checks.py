"""The options checked before anything is built (config_checks.py), through the CLI as a user meets them: each refused
in one line that names the key (exit 2, no traceback, no run folder left), or warned about."""

from __future__ import annotations

from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from jsonargparse import Namespace

import config_checks
import train

REPO = Path(train.__file__).resolve().parent
#: bf16 convolutions are slow on CPUs without native bf16: small batches of small crops.
SMALL = {"data__batch_size": 2, "data__crop_size": 16, "data__val_resize_size": 16, "data__val_crop_size": 16}


def test_fp16_mixed_on_cpu_is_refused_naming_what_is_valid(
    shapes_root: Path, tmp_path: Path, tiny_args, main, capsys
) -> None:
    # Lightning 2.6 would warn and train bf16-mixed instead: a different run than the one asked for.
    args = tiny_args(shapes_root, tmp_path, **SMALL, trainer__precision="16-mixed", trainer__max_steps=1)
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *args, "--trainer.limit_val_batches", "0"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "trainer.precision 16-mixed" in err and "needs a CUDA GPU" in err and "bf16-mixed, 32-true" in err
    assert not list(tmp_path.rglob("*.ckpt"))


@pytest.mark.parametrize(("accelerator", "precision"), [("cpu", "16"), ("auto", "16-mixed")])
def test_fp16_autocast_is_refused_wherever_the_run_lands_on_the_cpu(
    accelerator: str, precision: str, shapes_root: Path, tmp_path: Path, tiny_args, refused, monkeypatch
) -> None:
    # "16" is Lightning's older name for 16-mixed; "auto" on a machine without a GPU is the CPU.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    args = tiny_args(shapes_root, tmp_path / "run", trainer__accelerator=accelerator, trainer__precision=precision)
    said = refused(["fit", *args])
    assert said == (
        f"error: trainer.precision {precision} (fp16 autocast) needs a CUDA GPU and this run is on the CPU; valid "
        "here: bf16-mixed, 32-true"
    )
    # (The last line: the application's own refusal has no list of every precision under it.)


def test_fp16_true_on_cpu_warns_that_it_is_slow(shapes_root: Path, tmp_path: Path, tiny_args, main, monkeypatch):
    monkeypatch.setattr(pl.Trainer, "fit", lambda self, *args, **kwargs: None)  # the warning, not the slow run
    args = tiny_args(shapes_root, tmp_path, **SMALL, trainer__precision="16-true", trainer__max_steps=1)
    with pytest.warns(UserWarning, match="trainer.precision 16-true on the CPU: .* bf16-mixed or 32-true"):
        main(["fit", *args])


@pytest.mark.parametrize(
    "key",
    ["checkpoint.dirpath", "last_checkpoint.dirpath", "trainer.logger.init_args.save_dir", "profile.trace_dir",
     "data.root"],
)  # fmt: skip
def test_folders_the_run_cannot_write_to_are_refused_before_it_starts(
    key: str, shapes_root: Path, tmp_path: Path, tiny_args, refused
) -> None:
    # Found at the first checkpoint save (after an epoch) or when the window closed: a file in the way here.
    (tmp_path / "a_file").write_text("")
    folder = tmp_path / "a_file" / "out"
    args = tiny_args(shapes_root, tmp_path / "run")
    if key == "profile.trace_dir":
        args += ["--profile.start_step", "1", "--profile.torch_profiler", "true"]
    if key == "data.root":
        args += ["--data.source", "generated"]  # drawn into data.root
    said = refused(["fit", *args, f"--{key}", str(folder)])
    why = f"{tmp_path / 'a_file'} is a file, not a folder"
    assert said == f"error: {key} {folder}: {why}; pass a folder this job can write to"
    assert not (tmp_path / "run").exists()


def test_a_generated_data_root_of_other_files_is_refused_before_it_starts(
    shapes_root: Path, tmp_path: Path, tiny_args, refused
) -> None:
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "a.JPEG").write_text("")
    args = tiny_args(shapes_root, tmp_path / "run")
    said = refused(["fit", *args, "--data.source", "generated", "--data.root", str(tmp_path / "photos")])
    assert said.startswith(f"error: data.root {tmp_path / 'photos'} exists and is not a generated shapes dataset")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("option", "said"),
    [(["--trainer.gradient_clip_val", "-1"], "trainer.gradient_clip_val must be >= 0"),
     # clip_grad_norm_ with a NaN limit makes every gradient NaN.
     (["--trainer.gradient_clip_val", ".nan"], "trainer.gradient_clip_val must be >= 0 (0 or null: no clipping), "
                                               "got nan"),
     (["--trainer.accumulate_grad_batches", "0"], "trainer.accumulate_grad_batches must be >= 1"),
     (["--checkpoint.monitor", "val_acc"], "checkpoint.monitor names 'val_acc', which this module does not log; "
                                           "did you mean 'val_acc1'?"),
     (["--last_checkpoint.monitor", "val_accc"], "last_checkpoint.monitor names 'val_accc'"),
     (["--checkpoint.monitor", "acc1"], "checkpoint.monitor names 'acc1', which this module does not log; did you mean "
                                        "'val_acc1'?"),
     (["--checkpoint.filename", "best-{val_acc:.4f}"], "checkpoint.filename names 'val_acc'"),
     (["--checkpoint.mode", "maximum"], "checkpoint.mode must be min or max, got 'maximum'"),
     (["--checkpoint.save_top_k", "-2"], "checkpoint.save_top_k must be >= -1"),
     # Lightning's own checks against the data, a traceback before: one line naming the option.
     (["--trainer.val_check_interval", "1000"], "trainer.val_check_interval: `val_check_interval` (1000) must be"),
     (["--trainer.limit_train_batches", "0.0001"], "trainer.limit_train_batches: You requested to check 0.0001"),
     # A ZeroDivisionError after the first step, in the sanity check; a budget a fresh run has spent already.
     (["--trainer.val_check_interval", "0"], "trainer.val_check_interval must be > 0"),
     (["--trainer.check_val_every_n_epoch", "0"], "trainer.check_val_every_n_epoch must be >= 1"),
     (["--trainer.max_time", "00:00:00:00"], "trainer.max_time must be more than 0"),
     (["--trainer.max_time", "{minutes: -5}"], "trainer.max_time must be more than 0"),
     # Lightning's Timer: "trainer: 'minuts' is an invalid keyword argument for __new__()", naming no key.
     (["--trainer.max_time", "{minuts: 5}"], "trainer.max_time {'minuts': 5} is not a duration: give DD:HH:MM:SS"),
     (["--trainer.max_time", "0"], "trainer.max_time '0' is not a duration"),
     # More days than a timedelta holds: an OverflowError's traceback from the Timer.
     (["--trainer.max_time", "9999999999:00:00:00"], "trainer.max_time '9999999999:00:00:00' is not a duration"),
     # A format a metric's float cannot take failed at the first save, after an epoch and its validation.
     (["--checkpoint.filename", "best-{val_acc1:03d}"],
      "checkpoint.filename 'best-{val_acc1:03d}': {val_acc1:03d} cannot format a float"),
     (["--last_checkpoint.filename", "last-{step"], "last_checkpoint.filename 'last-{step': a { or } that opens"),
     # Lightning's ModelCheckpoint checks: a traceback that named neither section.
     (["--checkpoint.every_n_train_steps", "-1"], "checkpoint: Invalid value for every_n_train_steps=-1"),
     (["--last_checkpoint.every_n_epochs", "-2"], "last_checkpoint: Invalid value for every_n_epochs=-2"),
     (["--checkpoint.monitor", "null", "--checkpoint.save_top_k", "3"], "checkpoint: ModelCheckpoint(save_top_k=3,"),
     (["--trainer.enable_checkpointing", "false"], "trainer.enable_checkpointing false: this app always adds"),
     (["--seed_everything", "-5"], "seed_everything must be in 0..4294967295"),
     (["--seed_everything", "4294967296"], "seed_everything must be in 0..4294967295"),  # Lightning's traceback
     (["--trainer.precision", "transformer-engine"], "trainer.precision transformer-engine needs NVIDIA Transformer"),
     # A spawn start pickles the data module and its live prefetchers: a 40-line traceback once the ranks started.
     (["--trainer.devices", "2", "--trainer.strategy", "ddp_spawn"],
      "trainer.strategy ddp_spawn: a spawn start pickles the trainer and the data module"),
     (["--trainer.devices", "2", "--trainer.strategy", "DDPStrategy", "--trainer.strategy.start_method", "forkserver"],
      "trainer.strategy with start_method forkserver: a forkserver start pickles"),
     # An unset $VAR: last.ckpt went to the current folder, the logs to ./quickstart, random weights without a word.
     (["--last_checkpoint.dirpath", ""], "last_checkpoint.dirpath is an empty string (an unset environment variable?)"),
     (["--trainer.logger.init_args.save_dir", ""], "trainer.logger.init_args.save_dir is an empty string"),
     (["--model.weights", " "], "model.weights is an empty string"),
     (["--ckpt_path", ""], "--ckpt_path is an empty string")],
)  # fmt: skip
def test_training_options_that_would_fail_or_train_wrong_later_are_refused_now(
    option: list[str], said: str, shapes_root: Path, tmp_path: Path, tiny_args, refused
) -> None:
    # The monitor failed after the first epoch and its validation; a negative clip value turned the gradient around.
    assert refused(["fit", *tiny_args(shapes_root, tmp_path / "run"), *option]).startswith(f"error: {said}")
    assert not (tmp_path / "run").exists()


def test_validate_refuses_checkpoint_options_lightning_would_refuse_in_a_traceback(
    shapes_root: Path, tmp_path: Path, tiny_args, refused
) -> None:
    args = tiny_args(shapes_root, tmp_path / "run")
    assert (
        refused(["validate", *args, "--checkpoint.mode", "foo"])
        == "error: checkpoint.mode must be min or max, got 'foo'"
    )
    said = refused(["test", *args, "--last_checkpoint.save_top_k", "-3"])
    assert said.startswith("error: last_checkpoint.save_top_k must be >= -1")


def test_a_data_root_under_home_is_the_home_folders(
    shapes_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, built
) -> None:
    # The generated dataset was drawn into ./~/..., a folder's ~/... did not exist.
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "shapes").symlink_to(shapes_root)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    cli = built(["--config", str(REPO / "configs" / "quickstart.yaml"), "--data.root", "~/shapes",
                "--trainer.accelerator", "cpu", "--trainer.logger.init_args.save_dir", "~/runs",
                "--last_checkpoint.dirpath", "~/ck"])  # fmt: skip
    assert cli.datamodule.root == tmp_path / "home" / "shapes"
    assert cli.config.data.root == str(tmp_path / "home" / "shapes")  # the saved config.yaml's too
    # The logger's too: its metrics rewrite opened '~/runs/...' itself (a crash after the first epoch).
    assert cli.trainer.logger.log_dir.startswith(str(tmp_path / "home" / "runs"))
    assert cli.config.last_checkpoint.dirpath == str(tmp_path / "home" / "ck")


def test_a_monitor_a_callback_of_the_users_may_log_is_a_warning(
    shapes_root: Path, tmp_path: Path, tiny_args, built
) -> None:
    args = [*tiny_args(shapes_root, tmp_path), "--checkpoint.monitor", "lr-SGD", "--trainer.callbacks",
            "LearningRateMonitor"]  # fmt: skip
    with pytest.warns(UserWarning, match="checkpoint.monitor names 'lr-SGD'.*fine if a callback of trainer.callbacks"):
        built(["fit", *args])


def test_a_complete_generated_dataset_is_only_read_and_need_not_be_writable(
    shapes_root: Path, tmp_path: Path, tiny_args, main, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A shared, pre-generated copy on read-only storage: nothing is drawn there, so it is not probed.
    probed = []
    monkeypatch.setattr(config_checks, "why_unwritable", lambda folder: probed.append(folder) or None)
    main(["fit", *tiny_args(shapes_root, tmp_path, trainer__max_steps=1), "--data.source", "generated"])
    assert Path(shapes_root) not in probed and probed  # the run's own folders were


def test_a_gpu_accelerator_without_a_gpu_is_refused_naming_the_fix(
    shapes_root: Path, tmp_path: Path, tiny_args, refused
):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    said = refused(["fit", *tiny_args(shapes_root, tmp_path, trainer__accelerator="gpu")])
    assert said.startswith("error: trainer.accelerator gpu needs a CUDA GPU") and "--trainer.accelerator cpu" in said


@pytest.mark.parametrize("interval", ["00:00:00:01", "{minutes: 1}"])
def test_a_validation_interval_in_time_is_lightnings_to_check(
    interval: str, shapes_root: Path, tmp_path: Path, tiny_args, built
) -> None:
    # The check of a number of batches (> 0) compared a time with 0: a TypeError before training.
    cli = built(["fit", *tiny_args(shapes_root, tmp_path), "--trainer.val_check_interval", interval,
                "--trainer.check_val_every_n_epoch", "null"])  # fmt: skip
    assert isinstance(cli.trainer, pl.Trainer)  # built, not refused
    assert cli.config.trainer.val_check_interval in ("00:00:00:01", {"minutes": 1})


@pytest.mark.parametrize("key", ["trainer.default_root_dir", "checkpoint.dirpath"])
def test_a_remote_folder_is_left_to_lightning(key: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # fsspec URLs Lightning writes to (s3://, gs://): as local paths they would be a folder named "s3:" here, and a
    # file of that name would refuse a run that never writes there.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s3:").write_text("")
    section, option = key.split(".")
    config = Namespace(trainer=Namespace(default_root_dir=None, logger=None), data=Namespace(source="folder"),
                       checkpoint=Namespace(dirpath=None), last_checkpoint=Namespace(dirpath=None),
                       preemption=Namespace(dirpath=None), profile=Namespace(torch_profiler=False))  # fmt: skip
    config[key] = "s3://bucket/runs"
    config_checks._check_folders(config, "fit")
    config[key] = "s3:/bucket/runs"  # a local path through that file: refused
    with pytest.raises(config_checks.ConfigError, match=f"{key} s3:/bucket/runs: .*is a file, not a folder"):
        config_checks._check_folders(config, "fit")
