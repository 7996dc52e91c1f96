"""main_amp.py command lines and checkpoints in train.py (apex_compat.py, legacy_checkpoint.py).

The command lines under test are the ones of apex's examples/imagenet/README.md, verbatim after ``main_amp.py``.
End-to-end tests run what train.py's ``main`` does with such a command line: ``train.main(apex_compat.migrate(argv))``.
"""

from __future__ import annotations

import io
import math
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torchvision
from conftest import free_port

# train.main(argv) passes args= while pytest has its own sys.argv: LightningCLI's warning about that is expected here.
pytestmark = pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import apex_compat  # noqa: E402
import legacy_checkpoint  # noqa: E402
import shapes_dataset  # noqa: E402
import train  # noqa: E402
from imagenet_module import lr_multiplier  # noqa: E402

#: torch.distributed.launch / torchrun environment of rank 0 of ``--nproc_per_node=2`` on one node.
LAUNCH_ENV = {
    "WORLD_SIZE": "2",
    "LOCAL_WORLD_SIZE": "2",
    "RANK": "0",
    "LOCAL_RANK": "0",
    "GROUP_RANK": "0",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29500",
}
#: What every translation of a main_amp.py command line starts with, after the subcommand, for these values.
COMMON = [
    "--data.root", "./",
    "--data.workers", "4",
    "--data.batch_size", "224",
    "--model.arch", "resnet50",
    "--model.lr", "0.1",
    "--model.momentum", "0.9",
    "--model.weight_decay", "0.0001",
    "--trainer.max_epochs", "90",
    "--trainer.log_every_n_steps", "10",
    "--trainer.accelerator", "auto",
]  # fmt: skip
ONE_GPU = ["--trainer.devices", "1"]
TWO_GPUS = ["--trainer.devices", "2", "--trainer.strategy", "ddp", "--trainer.num_nodes", "1"]
#: Shrinks a run to CPU size (appended after the original flags; LightningCLI options pass through).
CPU = [
    "--trainer.accelerator", "cpu",
    "--data.crop_size", "32",
    "--data.val_resize_size", "36",
    "--data.val_crop_size", "32",
    "--trainer.enable_progress_bar", "false",
    "--trainer.enable_model_summary", "false",
    "--trainer.logger", "false",
]  # fmt: skip


def options(argv: list[str]) -> dict[str, str]:
    """``--key value`` pairs of a LightningCLI argv (the last occurrence wins, as in LightningCLI)."""
    out = {}
    for i, token in enumerate(argv):
        if token.startswith("--") and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out[token] = argv[i + 1]
    return out


# --- the README's command lines -----------------------------------------------------------------------------
README_SINGLE = [
    ("-a resnet50 --b 128 --workers 4 --opt-level O0 ./", "128", "32-true"),
    ("-a resnet50 --b 224 --workers 4 --opt-level O3 ./", "224", "16-mixed"),
    ("-a resnet50 --b 224 --workers 4 --opt-level O3 --keep-batchnorm-fp32 True ./", "224", "16-mixed"),
    ("-a resnet50 --b 224 --workers 4 --opt-level O1 ./", "224", "16-mixed"),
    ("-a resnet50 --b 224 --workers 4 --opt-level O2 ./", "224", "16-mixed"),
    ("-a resnet50 --b 224 --workers 4 --opt-level O2 --loss-scale 128.0 ./", "224", "16-mixed"),
]


@pytest.mark.parametrize(("command", "batch", "precision"), README_SINGLE)
def test_readme_single_process_commands(command: str, batch: str, precision: str) -> None:
    argv, notes = apex_compat.translate(shlex.split(command), environ={})
    common = list(COMMON)
    common[common.index("--data.batch_size") + 1] = batch
    assert argv == ["fit", *common, *ONE_GPU, "--trainer.precision", precision, *apex_compat.recipe_overrides(90)]
    assert notes, "every --opt-level gets a note saying how exact its mapping is"


def test_readme_notes_are_honest_about_inexact_mappings() -> None:
    def notes(command: str) -> str:
        return "\n".join(apex_compat.translate(shlex.split(command), environ={})[1])

    assert "Lightning has no O2" in notes("--opt-level O2 ./")
    o3 = notes("--opt-level O3 --keep-batchnorm-fp32 True ./")
    assert "not pure FP16" in o3 and "16-true" in o3 and "--keep-batchnorm-fp32 True: already so" in o3
    assert "no static loss scale" in notes("--opt-level O1 --loss-scale 128.0 ./")
    assert "not available" in notes("--opt-level O3 --keep-batchnorm-fp32 False ./")
    assert "ignored, FP32" in notes("--opt-level O0 --loss-scale 128.0 ./")
    assert "default of 16-mixed" in notes("--opt-level O1 --loss-scale dynamic ./")
    assert "Unexpected optimization level None" in notes("./")


def test_readme_static_loss_scale_line_without_dir_fails_like_the_original(capsys: pytest.CaptureFixture) -> None:
    # The README's "O1 overridden to use static loss scaling" line omits the data folder; main_amp.py rejected it.
    with pytest.raises(SystemExit) as exit_info:
        apex_compat.translate(shlex.split("-a resnet50 --b 224 --workers 4 --opt-level O1 --loss-scale 128.0"), {})
    assert exit_info.value.code == 2
    assert "the following arguments are required: DIR" in capsys.readouterr().err


@pytest.mark.parametrize("level", ["O1", "O2"])
@pytest.mark.parametrize("local_rank_flag", ["--local-rank=0", "--local_rank=0"])  # torch >= 2.0 / older launchers
def test_readme_torch_distributed_launch_commands(level: str, local_rank_flag: str) -> None:
    # python -m torch.distributed.launch --nproc_per_node=2 main_amp.py -a resnet50 --b 224 --workers 4 --opt-level ..
    command = f"{local_rank_flag} -a resnet50 --b 224 --workers 4 --opt-level {level} ./"
    assert apex_compat.is_apex_command_line(shlex.split(command))
    argv, notes = apex_compat.translate(shlex.split(command), environ=LAUNCH_ENV)
    assert argv == ["fit", *COMMON, *TWO_GPUS, "--trainer.precision", "16-mixed", *apex_compat.recipe_overrides(90)]
    assert any("distributed (2 processes, 2 per node)" in note for note in notes)


def test_two_nodes_of_four() -> None:
    env = {**LAUNCH_ENV, "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}
    argv, _ = apex_compat.translate(["./"], environ=env)
    opts = options(argv)
    assert (opts["--trainer.devices"], opts["--trainer.num_nodes"], opts["--trainer.strategy"]) == ("4", "2", "ddp")


def test_issue_command_lines() -> None:
    # python main_amp.py -a resnet50 --b 224 --deterministic --workers 4 --opt-level O1 ./data/
    argv, _ = apex_compat.translate(
        shlex.split("-a resnet50 --b 224 --deterministic --workers 4 --opt-level O1 ./data/")
    )
    common = list(COMMON)
    common[1] = "./data/"
    assert argv == [
        "fit",
        *common,
        *ONE_GPU,
        "--trainer.precision", "16-mixed",
        "--trainer.deterministic", "true",
        *apex_compat.recipe_overrides(90),
    ]  # fmt: skip
    # nvprof --profile-from-start off -fo %p.nvprof python main_amp.py -a resnet50 --b 224 --workers 4 \
    #     --opt-level O1 --prof 20 ./data/
    argv, notes = apex_compat.translate(
        shlex.split("-a resnet50 --b 224 --workers 4 --opt-level O1 --prof 20 ./data/"), environ={}
    )
    assert argv == [
        "fit",
        *common,
        *ONE_GPU,
        "--trainer.precision", "16-mixed",
        "--profile.start_step", "20",
        "--profile.num_steps", "10",
        "--profile.exit_after", "true",
        *apex_compat.recipe_overrides(90),
    ]  # fmt: skip
    prof_note = next(note for note in notes if note.startswith("--prof"))
    assert "11 iterations" in prof_note and "--profile.start_step 19 --profile.num_steps 11" in prof_note


def test_translated_readme_commands_parse_in_train_cli() -> None:
    """Every key the translation emits exists in train.py's LightningCLI and parses to the intended value."""

    class ParseOnly(train.ImageNetCLI):
        def before_instantiate_classes(self) -> None:  # no device checks: O1 (16-mixed) needs a GPU to run
            pass

        def instantiate_classes(self) -> None:  # parse, do not build
            pass

    for command, batch, precision in README_SINGLE:
        argv, _ = apex_compat.translate(shlex.split(command + " --deterministic --sync_bn --prof 3"), environ={})
        cli = ParseOnly(
            train.ImageNetClassifier,
            train.ImageNetDataModule,
            args=legacy_checkpoint.instantiation_args(argv),
            run=False,
        )
        config = cli.config
        assert config.trainer.precision == precision
        assert config.data.batch_size == int(batch) and config.data.workers == 4
        assert config.model.arch == "resnet50" and config.model.lr == 0.1 and config.model.weight_decay == 1e-4
        assert config.trainer.max_epochs == 90 and config.trainer.log_every_n_steps == 10
        assert config.trainer.deterministic is True and config.trainer.sync_batchnorm is True
        assert config.profile.start_step == 3 and config.profile.num_steps == 10 and config.profile.exit_after


# --- flag by flag ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ("./", {"--model.arch": "resnet18", "--data.workers": "4", "--data.batch_size": "256", "--model.lr": "0.1"}),
        ("-a resnet34 ./", {"--model.arch": "resnet34"}),
        ("--arch=resnet34 ./", {"--model.arch": "resnet34"}),
        ("-j 2 ./", {"--data.workers": "2"}),
        ("-j2 ./", {"--data.workers": "2"}),
        ("--workers 0 ./", {"--data.workers": "0"}),
        ("--epochs 3 ./", {"--trainer.max_epochs": "3"}),
        ("-b 8 ./", {"--data.batch_size": "8"}),
        ("--batch-size 8 ./", {"--data.batch_size": "8"}),
        ("--b 8 ./", {"--data.batch_size": "8"}),  # argparse prefix matching, as the README uses it
        ("--lr 0.4 ./", {"--model.lr": "0.4"}),  # per 256 images in both programs
        ("--learning-rate 0.4 ./", {"--model.lr": "0.4"}),
        ("--momentum 0.8 ./", {"--model.momentum": "0.8"}),
        ("--wd 5e-5 ./", {"--model.weight_decay": "5e-05"}),
        ("--weight-decay 5e-5 ./", {"--model.weight_decay": "5e-05"}),
        ("-p 5 ./", {"--trainer.log_every_n_steps": "5"}),
        ("--print-freq 5 ./", {"--trainer.log_every_n_steps": "5"}),
        ("--deterministic ./", {"--trainer.deterministic": "true"}),
        ("--sync_bn ./", {"--trainer.sync_batchnorm": "true"}),
        ("--channels-last True ./", {"--model.channels_last": "true"}),
        ("--channels-last False ./", {"--model.channels_last": "true"}),  # the original's type=bool quirk, kept
        ("--opt-level O0 ./", {"--trainer.precision": "32-true"}),
        ("--opt-level O1 ./", {"--trainer.precision": "16-mixed"}),
        ("--opt-level O2 ./", {"--trainer.precision": "16-mixed"}),
        ("--opt-level O3 ./", {"--trainer.precision": "16-mixed"}),
        ("--prof 5 ./", {"--profile.start_step": "5", "--profile.num_steps": "10", "--profile.exit_after": "true"}),
        ("--local_rank 3 ./", {"--trainer.devices": "1"}),  # accepted; ranks come from the environment
        ("--epochs 120 ./", {"--trainer.max_epochs": "120", "--model.lr_milestones": "[30,60,80,90]"}),
        ("./ --trainer.max_steps 2", {"--trainer.max_steps": "2"}),
    ],
)
def test_flag(flags: str, expected: dict[str, str]) -> None:
    argv, _ = apex_compat.translate(shlex.split(flags), environ={})
    assert argv[0] == "fit"
    opts = options(argv)
    for key, value in expected.items():
        assert opts.get(key) == value, (key, argv)


def test_absent_flags_map_to_nothing() -> None:
    argv, _ = apex_compat.translate(["./"], environ={})
    for key in ("--trainer.precision", "--trainer.deterministic", "--trainer.sync_batchnorm", "--model.channels_last"):
        assert key not in argv
    assert not any(token.startswith("--profile.") for token in argv)


def test_passthrough_order_and_config_first() -> None:
    argv, _ = apex_compat.translate(shlex.split("-b 8 ./ --trainer.accelerator=cpu --config my.yaml -b2"), {})
    assert argv[:3] == ["fit", "--config", "my.yaml"]  # under the translated flags
    assert argv[-1] == "--trainer.accelerator=cpu"  # over them
    assert options(argv)["--data.batch_size"] == "2"  # -b2: a short flag with its value attached, last one wins


def test_with_a_config_file_only_the_flags_typed_are_translated_over_it() -> None:
    # main_amp.py's defaults (batch 256, 90 epochs, lr 0.1, ...) and its fixed recipe replaced the file's values, and
    # the file's warmup and milestones stayed: a recipe neither of them.
    argv, notes = apex_compat.translate(shlex.split("-a resnet18 --b 8 --opt-level O1 ./ --config my.yaml"), {})
    opts = options(argv)
    assert opts["--data.batch_size"] == "8" and opts["--model.arch"] == "resnet18" and opts["--data.root"] == "./"
    assert opts["--trainer.precision"] == "16-mixed"
    for key in ("--data.workers", "--model.lr", "--trainer.max_epochs", "--trainer.log_every_n_steps",
                "--model.weight_decay", "--trainer.devices", "--model.warmup_epochs", "--data.crop_size"):  # fmt: skip
        assert key not in opts, key
    assert any(note.startswith("--config my.yaml: the file's values stand") for note in notes)
    # Under a launcher the process layout is still the launcher's.
    argv, _ = apex_compat.translate(["./", "--config", "my.yaml"], {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"})
    assert options(argv)["--trainer.devices"] == "2" and options(argv)["--trainer.strategy"] == "ddp"
    # --pretrained finds its weights by the arch: with a config file, only by a typed one.
    with pytest.raises(apex_compat.MigrationError, match="--pretrained with --config my.yaml: give -a ARCH too"):
        apex_compat.translate(["--pretrained", "./", "--config", "my.yaml"], {})
    # Without a config every default is pinned, as before.
    assert options(apex_compat.translate(["./"], {})[0])["--trainer.max_epochs"] == "90"


def test_dir_is_not_passed_to_a_synthetic_source(tmp_path: Path) -> None:
    # DIR is required by the original's syntax; the synthetic source reads no folder and warned about data.root.
    synthetic = REPO / "configs" / "resnet50_synthetic.yaml"
    argv, notes = apex_compat.translate(["-a", "resnet18", "/data/in", "--config", str(synthetic)], {})
    assert "--data.root" not in options(argv) and options(argv)["--model.arch"] == "resnet18"
    assert "DIR /data/in is not read: data.source synthetic trains on a fixed batch on the device" in notes
    argv, _ = apex_compat.translate(["/data/in", "--data.source", "synthetic"], {})
    assert "--data.root" not in options(argv) and "--data.workers" not in options(argv)  # nor -j's default
    argv, _ = apex_compat.translate(["-j", "2", "/data/in", "--data.source", "synthetic"], {})
    assert options(argv)["--data.workers"] == "2"  # typed: passed on (and warned about)
    # The line's --data.source over the file's, and the last file's over an earlier one's.
    argv, _ = apex_compat.translate(["/data/in", f"--config={synthetic}", "--data.source", "folder"], {})
    assert options(argv)["--data.root"] == "/data/in"
    folder = tmp_path / "folder.yaml"
    folder.write_text("data:\n  source: folder\n")
    argv, _ = apex_compat.translate(["/data/in", "--config", str(synthetic), "--config", str(folder)], {})
    assert options(argv)["--data.root"] == "/data/in"
    argv, notes = apex_compat.translate(["/data/in", "-c", str(folder), "-c", str(synthetic)], {})
    assert "--data.root" not in options(argv)
    # A file the translation cannot read is the parser's to name; the folder is passed on.
    argv, _ = apex_compat.translate(["/data/in", "--config", str(tmp_path / "missing.yaml")], {})
    assert options(argv)["--data.root"] == "/data/in"


def test_a_config_file_with_main_amp_flags_parses_to_the_files_values(tmp_path: Path) -> None:
    config = tmp_path / "cfg.yaml"
    config.write_text("data:\n  workers: 8\nmodel:\n  warmup_epochs: 1\ntrainer:\n  max_epochs: 7\n")
    argv, _ = apex_compat.translate(["--b", "16", "./", "--config", str(config)], {})

    class ParseOnly(train.ImageNetCLI):
        def instantiate_classes(self) -> None:  # parse, do not build
            pass

    cli = ParseOnly(train.ImageNetClassifier, train.ImageNetDataModule, args=argv[1:], run=False)
    assert cli.config.data.workers == 8 and cli.config.trainer.max_epochs == 7 and cli.config.model.warmup_epochs == 1
    assert cli.config.data.batch_size == 16


def test_channels_last_false_turns_it_on_as_in_the_original_and_says_so() -> None:
    for value in ("False", "0", "off"):
        argv, notes = apex_compat.translate(["--channels-last", value, "./"], {})
        assert options(argv)["--model.channels_last"] == "true"
        assert any(note.startswith(f"--channels-last {value} -> --model.channels_last true") for note in notes)
    argv, notes = apex_compat.translate(["--channels-last", "True", "./"], {})
    assert options(argv)["--model.channels_last"] == "true" and not any("type=bool" in note for note in notes)


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        ("--dali_cpu ./", "--dali_cpu: there is no DALI here"),
        ("--fp16 ./", "--fp16: use --opt-level O1"),
        # O1 went to DIR, and ./ was the argument said to be unrecognized.
        (
            "--opt_level O1 ./",
            "unrecognized arguments: --opt_level ./ (--opt_level: did you mean --opt-level?; its "
            "value O1 was read as DIR)",
        ),
        # A flag without a value before DIR: DIR is right, nothing is said of it.
        (
            "-a resnet18 --fp16 ./data",
            "unrecognized arguments: --fp16 (--fp16: use --opt-level O1 (float16 mixed precision with dynamic loss "
            "scaling)); train.py read",
        ),
        ("--bogus O1 ./", "unrecognized arguments: --bogus ./ (--bogus: its value O1 was read as DIR)"),
        ("./ --bogus=O1", "unrecognized arguments: --bogus=O1;"),
        ("--sync-bn ./", "--sync-bn: did you mean --sync_bn?"),
    ],
)
def test_an_unknown_flag_is_one_line_with_what_to_use(flags: str, said: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        apex_compat.translate(shlex.split(flags), environ={})
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and said in err and "`python train.py DIR -h` lists its flags" in err
    assert err.count("\n") == 1 and err.startswith("train.py: error: unrecognized arguments:"), err


def test_prof_0_says_the_original_captured_nothing() -> None:
    _, notes = apex_compat.translate(["--prof", "0", "./"], {})
    (note,) = [n for n in notes if n.startswith("--prof")]
    assert "never called cudaProfilerStart with --prof 0" in note and "quit after iteration 10" in note
    assert "--profile.start_step -1" not in note


def test_every_section_of_the_cli_passes_through() -> None:
    keys = ["--last_checkpoint.every_n_train_steps", "--preemption.check_every_n_steps", "--checkpoint.save_top_k"]
    argv, _ = apex_compat.translate([*shlex.split("-b 8 ./"), *(token for key in keys for token in (key, "2"))], {})
    assert all(key in argv for key in keys)


def test_instantiation_args_leave_out_the_checkpoint_and_the_logger() -> None:
    argv = ["fit", "--data.root", "d", "--ckpt_path", "x.ckpt", "--trainer.logger.init_args.version", "v"]
    argv += ["--trainer.logger=false", "--ckpt_path=y.ckpt", "--trainer.logger", "true", "--trainer.max_steps", "5"]
    assert legacy_checkpoint.instantiation_args(argv) == ["--data.root", "d", "--trainer.max_steps", "5"]


def test_evaluate_is_validate() -> None:
    argv, notes = apex_compat.translate(shlex.split("-e --prof 3 ./"), environ={})
    assert argv[0] == "validate"
    assert not any(token.startswith("--profile.") for token in argv)
    assert any("--prof ignored" in note for note in notes)


def test_learning_rate_schedule_is_the_originals() -> None:
    """The app's default schedule plus recipe_overrides reproduces adjust_learning_rate of main_amp.py."""
    for epochs in (90, 120):
        milestones = [30, 60, 80]
        opts = options(apex_compat.recipe_overrides(epochs))
        if "--model.lr_milestones" in opts:
            milestones = [int(m) for m in opts["--model.lr_milestones"].strip("[]").split(",")]
        steps_per_epoch = 7
        for epoch in range(5, epochs):  # after warmup
            original = 0.1 ** (epoch // 30 + (1 if epoch >= 80 else 0))
            ours = lr_multiplier(epoch * steps_per_epoch + 3, steps_per_epoch, 5, "step", milestones, 0.1)
            assert math.isclose(original, ours, rel_tol=1e-9), (epochs, epoch)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ("--opt-level 01 ./", "the letter O"),
        ("--opt-level O4 ./", "O0, O1, O2, O3"),
        ("--opt-level O3 --keep-batchnorm-fp32 yes ./", "'True' or 'False'"),
        ("--opt-level O1 --loss-scale big ./", "a number (static scale) or 'dynamic'"),
        ("--start-epoch 3 ./", "--start-epoch 3"),
        ("./ --trainer.max_steps", "needs a value"),
        ("./ --ckpt_path x.ckpt", "--resume"),
    ],
)
def test_invalid_values(flags: str, message: str) -> None:
    with pytest.raises(apex_compat.MigrationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        apex_compat.translate(shlex.split(flags), environ={})


@pytest.mark.parametrize("flags", ["--bogus ./", "-a notamodel ./", "--p 3 ./", "./ extra"])
def test_rejected_like_the_original(flags: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        apex_compat.translate(shlex.split(flags), environ={})
    assert exit_info.value.code == 2
    assert "main_amp.py" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], False),
        (["fit", "-a", "x"], False),
        (["validate"], False),
        (["--config", "configs/quickstart.yaml"], False),
        (["-c", "x.yaml"], False),
        (["--help"], False),
        (["-h"], False),
        (["--print_config"], False),
        (["--trainer.devices", "2"], False),
        (["--model.arch=resnet18"], False),
        (["--data.root", "x"], False),
        (["--profile.start_step", "3"], False),
        (["--checkpoint.monitor", "val_acc1"], False),
        (["--seed_everything", "1"], False),
        (["--ckpt_path", "x.ckpt"], False),
        (["--bogus"], False),
        (["-a", "resnet50", "./"], True),
        (["--b", "224", "./"], True),
        (["-j4", "./"], True),
        (["--opt-level", "O1", "./"], True),
        (["--local-rank=0", "-a", "resnet50", "./"], True),
        (["--local_rank=0", "./"], True),
        (["./data/"], True),
        (["--deterministic", "./"], True),
    ],
)
def test_is_apex_command_line(argv: list[str], expected: bool) -> None:
    assert apex_compat.is_apex_command_line(argv) is expected


@pytest.mark.parametrize(
    ("first", "said"),
    [("fitt", "'fitt' is neither a subcommand (did you mean fit? valid: fit, validate, test) nor an existing folder"),
     ("valdate", "(did you mean validate? valid"),
     ("/no/such/imagenet", "'/no/such/imagenet' is neither a subcommand (valid")],
)  # fmt: skip
def test_a_first_word_that_is_no_subcommand_and_no_folder_is_refused_before_anything_runs(
    first: str, said: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    # It was main_amp.py's DIR: 90 epochs at batch 256 replaced the config's, and data.source generated drew a dataset
    # into a new folder of that name.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        train.main([first, "--config", str(REPO / "configs" / "quickstart.yaml")])
    assert exit_info.value.code == 2
    assert said in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_an_existing_folder_first_is_main_amps_dir(tmp_path: Path) -> None:
    assert apex_compat.unknown_first_word([str(tmp_path), "-a", "resnet50"]) is None
    # One that does not exist yet, with main_amp.py's flags after it: a DIR the run may generate.
    generated = [str(tmp_path / "new"), "-a", "resnet18", "--data.source", "generated"]
    assert apex_compat.unknown_first_word(generated) is None
    assert apex_compat.unknown_first_word(["fitt", "-a", "resnet18"]) is not None  # a subcommand's typo all the same
    assert apex_compat.unknown_first_word(["fit"]) is None and apex_compat.unknown_first_word(["-a", "x", "./"]) is None


def test_format_equivalent_round_trips() -> None:
    argv, _ = apex_compat.translate(shlex.split("-a resnet50 --b 224 --opt-level O1 '/data/image net/'"), {})
    line = apex_compat.format_equivalent(argv)
    assert line.startswith("python train.py fit ")
    assert shlex.split(line)[2:] == argv


def test_migrate_prints_on_rank_zero_only() -> None:
    import io

    for env, printed in ((LAUNCH_ENV, True), ({**LAUNCH_ENV, "RANK": "1", "LOCAL_RANK": "1"}, False)):
        stream = io.StringIO()
        argv = apex_compat.migrate(["--opt-level", "O2", "./"], environ=env, stream=stream)
        assert argv[0] == "fit"
        text = stream.getvalue()
        assert (apex_compat.format_equivalent(argv) in text) is printed
        assert ("no O2" in text) is printed


# --- --pretrained -------------------------------------------------------------------------------------------
def test_pretrained_missing_file_names_the_searched_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    with pytest.raises(apex_compat.MigrationError) as error:
        apex_compat.translate(["--pretrained", "-a", "resnet50", "./"], environ={})
    message = str(error.value)
    assert str(tmp_path / "torch" / "hub" / "checkpoints" / "resnet50-*.pth") in message
    assert "resnet50-0676ba61.pth" in message and "--model.weights" in message
    with pytest.raises(SystemExit):  # what train.py shows: the message, exit code 2
        apex_compat.migrate(["--pretrained", "./"], environ={})


def test_pretrained_uses_the_torchvision_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    folder = tmp_path / "torch" / "hub" / "checkpoints"
    folder.mkdir(parents=True)
    (folder / "resnet18-0123abcd.pth").touch()  # some other resnet18 file: used when the V1 file is absent
    argv, notes = apex_compat.translate(["--pretrained", "./"], environ={})
    assert options(argv)["--model.weights"] == str(folder / "resnet18-0123abcd.pth")
    (folder / "resnet18-f37072fd.pth").touch()  # IMAGENET1K_V1, what pretrained=True loaded
    argv, notes = apex_compat.translate(["--pretrained", "./"], environ={})
    assert options(argv)["--model.weights"] == str(folder / "resnet18-f37072fd.pth")
    assert any("no download" in note for note in notes)


# --- checkpoints --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """10 classes x 4 training images: 5 steps per epoch at batch 8."""
    return shapes_dataset.generate(
        tmp_path_factory.mktemp("shapes") / "d", train_per_class=4, val_per_class=2, image_size=32
    )


def write_legacy(
    path: Path,
    arch: str = "resnet18",
    num_classes: int = 10,
    epoch: int = 1,
    head_bias: int = -1,
    amp: dict | None = None,
) -> dict:
    """A checkpoint as main_amp.py saved it under DDP: ``module.`` prefixes and SGD momentum buffers; ``amp``: apex
    amp's state, which apex recommended saving beside them."""
    torch.manual_seed(0)
    model = torchvision.models.get_model(arch, num_classes=num_classes)
    optimizer = torch.optim.SGD(model.parameters(), 0.1, momentum=0.9, weight_decay=1e-4)
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    optimizer.step()
    if head_bias >= 0:  # every image gets the same logits: the validation loss is known exactly
        with torch.no_grad():
            model.fc.weight.zero_()
            model.fc.bias.zero_()
            model.fc.bias[head_bias] = 5.0
    state = {
        "epoch": epoch,
        "arch": arch,
        "state_dict": {f"module.{k}": v for k, v in model.state_dict().items()},
        "best_prec1": 12.5,
        "optimizer": optimizer.state_dict(),
    }
    if amp is not None:
        state["amp"] = amp
    torch.save(state, path)
    return state


def cpu_run(argv: list[str]) -> train.ImageNetCLI:
    """What train.py's main does with a main_amp.py command line (see the report for the wiring)."""
    assert apex_compat.is_apex_command_line(argv)
    return train.main(apex_compat.migrate(argv, environ={}))


@pytest.mark.parametrize(("epoch", "said"), [(0, "0 epochs done"), (1, "1 epoch done"), (3, "3 epochs done")])
def test_a_main_amp_checkpoints_finished_epochs_are_said_in_words(tmp_path: Path, epoch: int, said: str) -> None:
    write_legacy(tmp_path / "checkpoint.pth.tar", arch="resnet18", epoch=epoch)
    assert legacy_checkpoint.load_legacy(tmp_path / "checkpoint.pth.tar", lazy=True).epochs_done == said


def test_is_legacy_checkpoint(tmp_path: Path) -> None:
    write_legacy(tmp_path / "checkpoint.pth.tar")
    assert legacy_checkpoint.is_legacy_checkpoint(tmp_path / "checkpoint.pth.tar")
    torch.save({"pytorch-lightning_version": "2.6.6", "state_dict": {}, "epoch": 1}, tmp_path / "l.ckpt")
    assert not legacy_checkpoint.is_legacy_checkpoint(tmp_path / "l.ckpt")
    assert legacy_checkpoint.is_lightning_checkpoint(tmp_path / "l.ckpt")
    (tmp_path / "junk").write_text("not a checkpoint")
    assert not legacy_checkpoint.is_legacy_checkpoint(tmp_path / "junk")
    assert not legacy_checkpoint.is_legacy_checkpoint(tmp_path / "missing.pth.tar")
    assert legacy_checkpoint.converted_path(tmp_path / "model_best.pth.tar") == tmp_path / "model_best.lightning.ckpt"


def test_fit_resumes_a_main_amp_checkpoint(tmp_path: Path, data_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    legacy = write_legacy(tmp_path / "checkpoint.pth.tar", epoch=1)
    # A requeued job's options after the original flags: a fixed run folder (the logger's keys) and a last.ckpt every
    # 5 steps, beside the best checkpoints in checkpoint.dirpath. The conversion builds the run without a logger and
    # leaves the logger's keys out.
    assert CPU[-2:] == ["--trainer.logger", "false"]
    argv = [
        "-a", "resnet18", "--b", "8", "-j", "0", "--epochs", "2", "--resume", str(tmp_path / "checkpoint.pth.tar"),
        str(data_root), *CPU[:-2], "--checkpoint.dirpath", str(tmp_path / "ckpts"),
        "--trainer.logger.init_args.save_dir", str(tmp_path / "logs"), "--trainer.logger.init_args.version", "requeued",
        "--last_checkpoint.every_n_train_steps", "5",
    ]  # fmt: skip
    cli = cpu_run(argv)
    last = tmp_path / "ckpts" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == 10

    converted = tmp_path / "checkpoint.lightning.ckpt"
    checkpoint = torch.load(converted, weights_only=True)
    assert (checkpoint["epoch"], checkpoint["global_step"]) == (1, 5)  # 40 images / batch 8 = 5 steps per epoch
    assert checkpoint[legacy_checkpoint.RECORD_KEY]["best_prec1"] == 12.5
    # The data folder's class names, as every checkpoint of the run records them (checked on other data).
    assert checkpoint["class_names"] == sorted(p.name for p in (data_root / "train").iterdir())
    for key, value in legacy["state_dict"].items():
        assert torch.equal(checkpoint["state_dict"]["model." + key.removeprefix("module.")], value)
    saved, ours = legacy["optimizer"]["state"], checkpoint["optimizer_states"][0]["state"]
    assert saved.keys() == ours.keys()
    assert all(torch.equal(saved[i]["momentum_buffer"], ours[i]["momentum_buffer"]) for i in saved)
    base_lr = 0.1 * 8 / 256
    assert checkpoint["lr_schedulers"][0]["last_epoch"] == 5
    assert math.isclose(checkpoint["optimizer_states"][0]["param_groups"][0]["lr"], base_lr * 6 / 25)  # warmup

    trainer = cli.trainer
    # Only epoch 1 ran (an epoch-0 restart would have reached step 15), and the schedule followed the step count.
    assert (trainer.current_epoch, trainer.global_step) == (2, 10)
    assert sorted(p.name.split("-acc1")[0] for p in (tmp_path / "ckpts").glob("best-*.ckpt")) == ["best-epoch001"]
    assert math.isclose(trainer.optimizers[0].param_groups[0]["lr"], base_lr * 11 / 25)


def test_validate_evaluates_a_main_amp_checkpoint(
    tmp_path: Path, data_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    write_legacy(tmp_path / "model_best.pth.tar", head_bias=3)
    # Batches of 4 split the 20 validation images evenly: the mean loss is the same however batches are weighted.
    argv = ["-e", "--resume", str(tmp_path / "model_best.pth.tar"), "--b", "4", "-j", "0", str(data_root), *CPU]
    metrics = cpu_run(argv).trainer.callback_metrics
    # Constant logits (5 for class 3, 0 elsewhere) on 2 images per class: the loaded head, not a random one.
    log_z = math.log(math.exp(5.0) + 9)
    expected_loss = (2 * (log_z - 5.0) + 18 * log_z) / 20
    assert math.isclose(float(metrics["val_loss"]), expected_loss, rel_tol=1e-5)
    assert float(metrics["val_acc1"]) == pytest.approx(0.1)


def test_arch_mismatch_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    write_legacy(tmp_path / "checkpoint.pth.tar")
    argv = ["-a", "resnet34", "--resume", str(tmp_path / "checkpoint.pth.tar"), "./"]
    with pytest.raises(apex_compat.MigrationError, match=r"holds a 'resnet18' model .* builds 'resnet34'"):
        apex_compat.translate(argv, environ={})
    with pytest.raises(SystemExit) as exit_info:
        apex_compat.migrate(argv, environ={})
    assert exit_info.value.code == 2
    assert "run with -a resnet18" in capsys.readouterr().err


def test_class_count_mismatch_is_a_clear_error(tmp_path: Path, data_root: Path) -> None:
    write_legacy(tmp_path / "checkpoint.pth.tar", num_classes=1000)
    argv, _ = apex_compat.translate(
        ["-b", "8", "-j", "0", "--resume", str(tmp_path / "checkpoint.pth.tar"), str(data_root), *CPU], {}
    )
    with pytest.raises(legacy_checkpoint.CheckpointConversionError) as refused:
        legacy_checkpoint.convert(tmp_path / "checkpoint.pth.tar", argv)
    assert "fc.weight: checkpoint [1000, 512], model [10, 512]" in str(refused.value)
    # The reason is main_amp.py's fixed head, not "trained on another number of classes".
    assert "main_amp.py built torchvision's 1000-way head whatever the data folder held" in str(refused.value)


def test_a_state_dict_from_before_num_batches_tracked_converts(tmp_path: Path, data_root: Path) -> None:
    # torch before 0.4.1 saved no BatchNorm num_batches_tracked; torch's BatchNorm loads such files.
    state = write_legacy(tmp_path / "checkpoint.pth.tar")
    state["state_dict"] = {k: v for k, v in state["state_dict"].items() if not k.endswith("num_batches_tracked")}
    torch.save(state, tmp_path / "checkpoint.pth.tar")
    argv, _ = apex_compat.translate(
        ["-b", "8", "-j", "0", "--resume", str(tmp_path / "checkpoint.pth.tar"), str(data_root), *CPU], {}
    )
    converted = torch.load(legacy_checkpoint.convert(tmp_path / "checkpoint.pth.tar", argv), weights_only=True)
    weights = converted["state_dict"]
    assert torch.equal(weights["model.conv1.weight"], state["state_dict"]["module.conv1.weight"])
    assert int(weights["model.bn1.num_batches_tracked"]) == 0


def test_a_checkpoint_without_optimizer_state_is_said_to_start_momentum_at_zero(tmp_path: Path) -> None:
    state = write_legacy(tmp_path / "checkpoint.pth.tar")
    del state["optimizer"]
    torch.save(state, tmp_path / "checkpoint.pth.tar")
    _, notes = apex_compat.translate(["--resume", str(tmp_path / "checkpoint.pth.tar"), "./"], environ={})
    assert any("holds no 'optimizer' entry, so SGD's momentum buffers start at zero" in note for note in notes)
    _, notes = apex_compat.translate(["-e", "--resume", str(tmp_path / "checkpoint.pth.tar"), "./"], environ={})
    assert not any("'optimizer'" in note for note in notes)  # an evaluation steps no optimizer


def test_conversion_is_reused_and_other_ranks_wait(tmp_path: Path, data_root: Path) -> None:
    source = tmp_path / "checkpoint.pth.tar"
    write_legacy(source)
    argv, _ = apex_compat.translate(["-b", "8", "-j", "0", "--resume", str(source), str(data_root), *CPU], {})
    out = legacy_checkpoint.convert(source, argv, environ={})
    stamp = out.stat().st_mtime_ns
    assert legacy_checkpoint.convert(source, argv, environ={}) == out and out.stat().st_mtime_ns == stamp
    assert legacy_checkpoint.convert(source, argv, environ={"LOCAL_RANK": "1"}) == out  # up to date: no wait
    other = [*argv, "--data.batch_size", "4"]  # another run: local rank 1 waits for local rank 0's conversion
    with pytest.raises(legacy_checkpoint.CheckpointConversionError, match="local rank 0"):
        legacy_checkpoint.convert(source, other, environ={"LOCAL_RANK": "1"}, timeout_s=0.2)
    assert not list(tmp_path.glob(".*.tmp"))


def test_an_edited_config_or_another_data_folder_converts_anew(
    tmp_path: Path, data_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The command line names the config file only: its content decides the steps per epoch all the same.
    source, config = tmp_path / "checkpoint.pth.tar", tmp_path / "cfg.yaml"
    write_legacy(source, epoch=2)
    config.write_text("trainer:\n  limit_train_batches: 2\n")
    argv, _ = apex_compat.translate(
        ["--config", str(config), "-a", "resnet18", "-b", "8", "-j", "0", "--resume", str(source), "d", *CPU], {}
    )
    monkeypatch.chdir(data_root.parent)  # the data folder "d", relative
    out = legacy_checkpoint.convert(source, argv, environ={})
    assert torch.load(out, weights_only=True)["global_step"] == 4  # 2 epochs of 2 steps
    config.write_text("trainer:\n  limit_train_batches: 3\n")
    assert torch.load(legacy_checkpoint.convert(source, argv, environ={}), weights_only=True)["global_step"] == 6
    # The same relative data folder name from another working directory is another data folder.
    key = legacy_checkpoint.conversion_key(source, argv, environ={})
    monkeypatch.chdir(tmp_path)
    assert legacy_checkpoint.conversion_key(source, argv, environ={}) != key


def test_the_converted_checkpoint_is_saved_as_the_runs_own(tmp_path: Path, data_root: Path) -> None:
    source = tmp_path / "checkpoint.pth.tar"
    write_legacy(source)
    argv, _ = apex_compat.translate(["-b", "8", "-j", "0", "--resume", str(source), str(data_root), *CPU], {})
    umask = os.umask(0o022)
    try:
        out = legacy_checkpoint.convert(source, argv, environ={})
    finally:
        os.umask(umask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o644  # 0666 minus the umask, as every other checkpoint (not 0600)
    assert not list(tmp_path.glob(".*"))


def test_a_converted_checkpoint_is_refused_on_a_folder_with_other_class_names(
    tmp_path: Path, data_root: Path, refused, monkeypatch: pytest.MonkeyPatch
) -> None:
    """main_amp.py's checkpoint has no class names; the converted one takes those of the data folder it was converted
    for, so evaluating it on a folder with a class renamed (every label from it on moved) is refused as any is."""
    monkeypatch.chdir(tmp_path)  # without a logger, the working folder is where a run writes its config
    source = tmp_path / "model_best.pth.tar"
    write_legacy(source)
    argv, _ = apex_compat.translate(["-b", "8", "-j", "0", "--resume", str(source), str(data_root), *CPU], {})
    converted = legacy_checkpoint.convert(source, argv, environ={})
    root = tmp_path / "renamed"
    shutil.copytree(data_root, root)
    for split in ("train", "val"):
        (root / split / "circle").rename(root / split / "zz_circle")
    said = refused(["validate", "--data.root", str(root), "--data.workers", "0", *CPU, "--ckpt_path", str(converted)])
    assert f"--ckpt_path {converted} was trained with other class names: label 1 is 'circle' there" in said
    # Without a logger the config goes to the working folder; the refused run takes it back as from a run folder.
    assert not (tmp_path / "validate_config.yaml").exists()


def test_a_converted_checkpoint_resumed_in_other_units_maps_the_lr_schedule(
    tmp_path: Path, data_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Converted for batches of 8 (5 steps an epoch) and resumed with batches of 4 (10 steps an epoch): the schedule's
    # step 5, the start of epoch 1, becomes step 10, as for a native checkpoint (ImageNetClassifier.on_save_checkpoint).
    monkeypatch.chdir(tmp_path)
    source = tmp_path / "checkpoint.pth.tar"
    write_legacy(source, epoch=1)
    argv, _ = apex_compat.translate(["-b", "8", "-j", "0", "--resume", str(source), str(data_root), *CPU], {})
    out = legacy_checkpoint.convert(source, argv, environ={})
    assert torch.load(out, weights_only=True)["lr_schedule_units"] == {"steps_per_epoch": 5, "global_batch": 8}
    resumed = [*argv[:-2], "--data.batch_size", "4", "--trainer.max_steps", "6", "--ckpt_path", str(out)]
    trainer = train.main(resumed).trainer
    scheduler = trainer.lr_scheduler_configs[0].scheduler
    assert trainer.global_step == 6 and scheduler.last_epoch == 11  # mapped to 10, then one step
    base_lr = 0.1 * 4 / 256
    assert math.isclose(trainer.optimizers[0].param_groups[0]["lr"], base_lr * 12 / 50)  # warmup: 5 epochs of 10


def test_resume_variants(tmp_path: Path) -> None:
    argv, notes = apex_compat.translate(["--resume", str(tmp_path / "nothing.pth.tar"), "./"], environ={})
    assert "--ckpt_path" not in argv and any("no checkpoint found" in note for note in notes)  # as the original
    with pytest.raises(apex_compat.MigrationError, match=r"--resume .* is a folder; pass the checkpoint file"):
        apex_compat.translate(["--resume", str(tmp_path), "./"], environ={})  # it trained from scratch
    torch.save({"pytorch-lightning_version": "2.6.6", "state_dict": {}, "epoch": 3}, tmp_path / "last.ckpt")
    argv, _ = apex_compat.translate(["--resume", str(tmp_path / "last.ckpt"), "./"], environ={})
    assert options(argv)["--ckpt_path"] == str(tmp_path / "last.ckpt")  # a Lightning checkpoint as is
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.pth.tar")
    with pytest.raises(apex_compat.MigrationError, match="neither a main_amp.py checkpoint"):
        apex_compat.translate(["--resume", str(tmp_path / "other.pth.tar"), "./"], environ={})
    # A main_amp.py file short of a key says which, and what it holds.
    state = write_legacy(tmp_path / "noepoch.pth.tar")
    del state["epoch"]
    torch.save(state, tmp_path / "noepoch.pth.tar")
    with pytest.raises(apex_compat.MigrationError, match=re.escape(
        "nor a Lightning checkpoint: it lacks 'epoch'; its keys: ['arch', 'best_prec1', 'optimizer', 'state_dict']"
    )):  # fmt: skip
        apex_compat.translate(["--resume", str(tmp_path / "noepoch.pth.tar"), "./"], environ={})
    torch.save({"epoch": 3, "state_dict": [1, 2]}, tmp_path / "other_dict.pth")
    with pytest.raises(apex_compat.MigrationError, match=re.escape(
        "it lacks 'state_dict' as a dict (it is a list), one of 'arch', 'optimizer', 'best_prec1'; its keys: "
    )):  # fmt: skip
        apex_compat.translate(["--resume", str(tmp_path / "other_dict.pth"), "./"], environ={})
    # A save cut short (main_amp.py saved in place) is said as such, not as a file of the wrong format.
    write_legacy(tmp_path / "whole.pth.tar")
    whole = (tmp_path / "whole.pth.tar").read_bytes()
    (tmp_path / "torn.pth.tar").write_bytes(whole[: len(whole) // 2])
    (tmp_path / "junk.pth.tar").write_text("x")
    said = r"torch.load cannot read it \(.+\): not a checkpoint, or a torn"
    for name in ("torn.pth.tar", "junk.pth.tar"):
        with pytest.raises(apex_compat.MigrationError, match=said):
            apex_compat.translate(["--resume", str(tmp_path / name), "./"], environ={})


def test_prof_with_resume_counts_from_the_resumed_step(tmp_path: Path) -> None:
    # The original counted --prof iterations from the resumed epoch's start; refused before ("a window before the
    # resumed step"), naming a key the user never typed.
    torch.save({"pytorch-lightning_version": "2.6.6", "state_dict": {}, "global_step": 50}, tmp_path / "last.ckpt")
    argv, notes = apex_compat.translate(["--prof", "5", "--resume", str(tmp_path / "last.ckpt"), "./"], {})
    assert options(argv)["--profile.start_step"] == "55"
    assert any(note.startswith("--prof 5 with --resume -> --profile.start_step 55") for note in notes)
    argv, _ = apex_compat.translate(["--prof", "5", "./"], {})
    assert options(argv)["--profile.start_step"] == "5"


def test_prof_with_a_main_amp_resume_counts_from_its_converted_step(
    tmp_path: Path, data_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    source = tmp_path / "checkpoint.pth.tar"
    write_legacy(source, epoch=2, amp={"loss_scaler0": {"loss_scale": 65536.0, "unskipped": 17}})
    stream = io.StringIO()
    argv = apex_compat.migrate(
        ["--prof", "3", "-b", "8", "-j", "0", "--resume", str(source), str(data_root), *CPU], {}, stream
    )
    assert options(argv)["--profile.start_step"] == "13"  # 2 epochs of 5 steps, then 3 more
    said = stream.getvalue()
    command = said.split("the equivalent train.py command is\n", 1)[1].splitlines()[0]
    assert "--profile.start_step 13 " in command  # the command printed is the one that runs
    assert "--prof 3 with --resume -> --profile.start_step 13" in said
    assert "its apex amp state (the loss scaler's scale) is not carried over" in said


def test_prof_runs_its_window_and_stops(tmp_path: Path, data_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    # --prof 2 opens the window at step 2; the passed-through num_steps shrinks it from 10 steps to 3 for the CPU.
    argv = ["--prof", "2", "--b", "8", "-j", "0", "--epochs", "5", str(data_root), *CPU, "--profile.num_steps", "3"]
    trainer = cpu_run(argv).trainer
    assert trainer.global_step == 5  # steps 2..4 in the window, then every rank stops (exit_after)
    assert trainer.current_epoch < 5  # stopped by the window, not by --epochs


@pytest.mark.slow
def test_torch_distributed_launch_resumes_on_two_processes(tmp_path: Path, data_root: Path) -> None:
    """``python -m torch.distributed.launch --nproc_per_node=2 train.py ...`` on CPU (gloo), with a legacy resume."""
    write_legacy(tmp_path / "checkpoint.pth.tar")
    runner = tmp_path / "runner.py"
    runner.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "import apex_compat, train\n"
        "trainer = train.main(apex_compat.migrate(sys.argv[1:])).trainer\n"
        "print(f'RANK {trainer.global_rank}/{trainer.world_size} epoch {trainer.current_epoch} '\n"
        "      f'step {trainer.global_step} {type(trainer.strategy).__name__}', flush=True)\n"
    )
    argv = [
        "-a", "resnet18", "--b", "4", "-j", "0", "--epochs", "2", "--resume", str(tmp_path / "checkpoint.pth.tar"),
        str(data_root), *CPU, "--checkpoint.dirpath", str(tmp_path / "ckpts"),
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_ENV}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.launch",
            "--nproc_per_node=2",
            f"--master_port={free_port()}",
            str(runner),
            *argv,
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    # 40 images over 2 ranks at batch 4: 5 steps per epoch; epoch 1 only, on both ranks, in the launcher's processes.
    for rank in (0, 1):
        assert f"RANK {rank}/2 epoch 2 step 10 DDPStrategy" in result.stdout
    assert result.stderr.count("the equivalent train.py command is") == 1  # rank 0 only
