"""cli_parser.py through train.main: an unknown option is one error line with the closest valid option and where
--help is, not the subcommand's whole usage; an unknown config key names the config files; --optimizer and
--lr_scheduler are not options (the module's recipe is the optimizer)."""

from __future__ import annotations

import inspect
import logging
import sys
import warnings
from pathlib import Path

import pytest
import torch

import cli_parser
import train
from image_loading import BadImageWarning

REPO = Path(__file__).resolve().parent.parent
QUICKSTART = str(REPO / "configs" / "quickstart.yaml")


def error_of(argv: list[str], capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(sys, "argv", [str(REPO / "train.py")])
    with pytest.raises(SystemExit) as exit_info:
        train.main(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    ("typo", "meant"),
    [("--modle.arch", "--model.arch"), ("--trainer.max_stepz", "--trainer.max_steps"),
     ("--data.batchsize", "--data.batch_size"),
     # A prefix of an option: argparse took it for the option (--model.weight_dec on a resume then lost to the
     # checkpoint's value, said to come from the configuration).
     ("--trainer.max_epoch", "--trainer.max_epochs"), ("--model.weight_dec", "--model.weight_decay")],
)  # fmt: skip
def test_a_mistyped_option_is_one_line_with_the_option_meant(typo, meant, capsys, monkeypatch) -> None:
    err = error_of(["fit", "--config", QUICKSTART, typo, "3"], capsys, monkeypatch)
    # Before: about 130 lines of fit's usage above the error.
    assert len(err.splitlines()) <= 4
    assert err.splitlines()[-1] == f"error: unrecognized arguments: {typo} 3; did you mean {meant}?"
    assert "train.py fit --help" in err


@pytest.mark.parametrize(
    "argv",
    [["--config", QUICKSTART, "--prof", "20"], ["fit", "--config", QUICKSTART, "--opt-level", "O1"],
     ["validate", "--config", QUICKSTART, "-e"], ["--config", QUICKSTART, "--b", "224"]],
)  # fmt: skip
def test_a_main_amp_flag_after_the_config_says_why_it_was_not_translated(argv, capsys, monkeypatch) -> None:
    flag = argv[3] if argv[0] != "--config" else argv[2]
    err = error_of(argv, capsys, monkeypatch).splitlines()[-1]
    assert err.startswith(f"error: unrecognized arguments: {flag}")
    assert err.endswith(
        f"; {flag} is a flag of apex main_amp.py: train.py translates main_amp.py's flags only on a command line that "
        f"starts with one of them or with the data folder (python train.py DIR {flag} ...), not after --config or a "
        'subcommand; there give train.py\'s own keys (README, "From apex main_amp.py", gives the key for each flag)'
    )


def test_an_unknown_option_that_is_no_main_amp_flag_gets_no_such_hint(capsys, monkeypatch) -> None:
    for option in ("--trainer.devces", "--nonsense", "-z"):
        err = error_of(["--config", QUICKSTART, option, "2"], capsys, monkeypatch)
        assert "main_amp" not in err.splitlines()[-1]


def test_a_subcommand_after_the_options_is_told_to_come_first(capsys, monkeypatch) -> None:
    err = error_of(["--config", QUICKSTART, "validate", "--ckpt_path", "x.ckpt"], capsys, monkeypatch)
    assert err.splitlines()[-1] == (
        "error: unrecognized arguments: validate (the subcommand comes first: python train.py validate --config ...)"
    )


def test_a_misspelt_config_path_gets_the_closest_file(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(REPO)
    err = error_of(["fit", "--config", "configs/quickstrat.yaml"], capsys, monkeypatch)
    assert err.splitlines()[-1] == (
        f"error: Parser key \"config\": File does not exist: '{REPO / 'configs' / 'quickstrat.yaml'}'; did you mean "
        "configs/quickstart.yaml?"
    )
    # In the form it was typed (-c, =, a folder of the user's); with nothing close, the files that are there.
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "a.yaml").write_text("trainer: {}\n")
    (tmp_path / "mine" / "big_run.yml").write_text("trainer: {}\n")
    monkeypatch.chdir(tmp_path)
    err = error_of(["fit", "-c", "mine/big_rnu.yml"], capsys, monkeypatch)
    assert err.endswith("; did you mean mine/big_run.yml?\n")
    err = error_of(["fit", "--config=mine/other.yaml"], capsys, monkeypatch)
    assert err.endswith(" (the config files in mine: a.yaml, big_run.yml)\n")
    err = error_of(["fit", "-cmine/big_rnu.yml"], capsys, monkeypatch)  # argparse's attached short form
    assert err.endswith("; did you mean mine/big_run.yml?\n")
    # A folder that does not exist: the application's own configs, by a path that works from here.
    err = error_of(["fit", "--config", "config/resnet50_synthetic.yaml"], capsys, monkeypatch)
    assert err.endswith(f"; did you mean {REPO / 'configs' / 'resnet50_synthetic.yaml'}?\n")


def test_a_config_name_without_its_folder_is_found_in_the_apps_configs(tmp_path: Path, capsys, monkeypatch) -> None:
    # From the project's root, which holds no config file: the name typed is one of configs/.
    monkeypatch.chdir(REPO)
    err = error_of(["fit", "--config", "quickstart.yaml"], capsys, monkeypatch)
    assert err.endswith("; did you mean configs/quickstart.yaml?\n")
    # A folder with config files of its own, none close: the application's one that is close.
    (tmp_path / "mine.yaml").write_text("trainer: {}\n")
    monkeypatch.chdir(tmp_path)
    err = error_of(["fit", "--config", "resnet50_synthetc.yaml"], capsys, monkeypatch)
    assert err.endswith(f"; did you mean {REPO / 'configs' / 'resnet50_synthetic.yaml'}?\n")
    # Nothing close anywhere: the typed folder's files, not the application's.
    err = error_of(["fit", "--config", "zzz.yaml"], capsys, monkeypatch)
    assert err.endswith(" (the config files in .: mine.yaml)\n")


def test_a_config_named_in_a_config_is_looked_for_beside_that_config(tmp_path: Path, capsys, monkeypatch) -> None:
    # jsonargparse reads a config's own 'config:' key from that config's folder, not from where the command runs.
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "base.yaml").write_text("trainer: {}\n")
    (tmp_path / "runs" / "outer.yaml").write_text("config: bsae.yaml\n")
    monkeypatch.chdir(tmp_path)
    err = error_of(["fit", "--config", "runs/outer.yaml"], capsys, monkeypatch)
    assert err.endswith(f"'{tmp_path / 'runs' / 'bsae.yaml'}'; did you mean {tmp_path / 'runs' / 'base.yaml'}?\n")


def test_a_word_that_is_no_subcommand_gets_no_subcommand_hint(capsys, monkeypatch) -> None:
    err = error_of(["--config", QUICKSTART, "validation"], capsys, monkeypatch)
    assert err.splitlines()[-1] == "error: unrecognized arguments: validation"


def test_a_config_files_unknown_key_names_the_files(tmp_path: Path, capsys, monkeypatch) -> None:
    config = tmp_path / "mine.yaml"
    config.write_text("data:\n  batchsize: 8\n")
    err = error_of(["fit", "--config", QUICKSTART, "--config", str(config)], capsys, monkeypatch)
    assert "does not accept option 'data.batchsize'; did you mean --data.batch_size?" in err
    assert f"is a key of {config}, not of the command line" in err  # not quickstart.yaml, which has no such key
    other = tmp_path / "other.yaml"
    other.write_text("data:\n  batchsize: 16\n")
    err = error_of(
        ["fit", "--config", str(config), "--config", QUICKSTART, "--config", str(other)], capsys, monkeypatch
    )
    assert f"is a key of {config} or {other}, not of the command line" in err
    # From a section's own file: no config file is blamed.
    section = tmp_path / "data.yaml"
    section.write_text("workerz: 0\n")
    err = error_of(["fit", "--config", QUICKSTART, "--data", str(section)], capsys, monkeypatch)
    assert "does not accept option 'data.workerz'" in err and "is a key of" not in err
    # Named in a config of a config: the file that names it.
    outer = tmp_path / "outer.yaml"
    outer.write_text(f"config: {config}\n")
    err = error_of(["fit", "--config", QUICKSTART, "--config", str(outer)], capsys, monkeypatch)
    assert f"is a key of {outer}, not of the command line" in err


def test_a_config_file_that_does_not_parse_is_named(tmp_path: Path, capsys, monkeypatch) -> None:
    config = tmp_path / "broken.yaml"
    config.write_text("model:\n  arch: [resnet18\ndata: {}\n")
    err = error_of(["fit", "--config", QUICKSTART, "--config", str(config)], capsys, monkeypatch)
    assert f"in {config}, line 2" in err and "<unicode string>" not in err  # YAML's own name for the text
    err = error_of(["fit", f"--config={config}"], capsys, monkeypatch)
    assert f"in {config}, line 2" in err


def test_the_second_config_file_is_named_when_paths_are_relative(tmp_path: Path, capsys, monkeypatch) -> None:
    # The parser changes into each config file's folder while reading it: the first file, relative, could not be read
    # from there and was blamed.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "first.yaml").write_text("trainer:\n  max_steps: 3\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "broken.yaml").write_text("model:\n  arch: [resnet18\ndata: {}\n")
    err = error_of(["fit", "--config", "first.yaml", "--config", "sub/broken.yaml"], capsys, monkeypatch)
    assert "in sub/broken.yaml, line 2" in err and "first.yaml" not in err


@pytest.mark.parametrize(
    ("section", "said"),
    [("profile", "error: profile: the section is empty (null) in a config file"),
     ("checkpoint", "error: checkpoint: the section is empty (null) in a config file"),
     ("trainer", "error: trainer: the section is empty (null) in a config file"),
     ("model", "is 'model:' empty (null) in a config file"),
     ("data", "is 'data:' empty (null) in a config file")],
)  # fmt: skip
def test_a_section_with_every_key_commented_out_is_said(section, said, tmp_path: Path, capsys, monkeypatch) -> None:
    config = tmp_path / "mine.yaml"
    config.write_text(f"{section}:\n#  some_key: 20\n")
    err = error_of(["fit", "--config", QUICKSTART, "--config", str(config)], capsys, monkeypatch)
    assert "Traceback" not in err and said in err


@pytest.mark.parametrize(("content", "holds"), [("", "nothing"), ("- a\n- b\n", "a list")])
def test_a_config_file_without_keys_is_named(content, holds, tmp_path: Path, capsys, monkeypatch) -> None:
    config = tmp_path / "mine.yaml"
    config.write_text(content)
    err = error_of(["fit", "--config", QUICKSTART, "--config", str(config)], capsys, monkeypatch)
    assert f"error: --config {config} holds {holds}, not keys" in err  # was "Unexpected config: " and its content


def test_a_wrong_precision_is_told_the_valid_values(capsys, monkeypatch) -> None:
    err = error_of(["fit", "--config", QUICKSTART, "--trainer.precision", "fp16"], capsys, monkeypatch)
    assert err.splitlines()[-2:] == [
        """error: Parser key "trainer.precision": 'fp16' is not a precision Lightning takes""",
        "valid trainer.precision: 32-true, bf16-mixed, 16-mixed, bf16-true, 16-true, 64-true (main_amp.py's O1/O2: "
        "16-mixed)",
    ]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--profile.start_step", "2.5"], "start_step\": '2.5' is not an int, a list of ints ([1,2]) or null"),
        (["--profile.start_step", "[1,20"], "start_step\": '[1,20' is not an int, a list of ints"),
        (["--profile.ranks", "abc"], "ranks\": 'abc' is not a list of ints ([1,2]) or null"),
        (["--trainer.limit_val_batches", "abc"], "limit_val_batches\": 'abc' is not an int, a float or null"),
        (["--model.compile", "3"], "compile\": '3' is not one of 'default', 'reduce-overhead', 'max-autotune', "
                                   "'max-autotune-no-cudagraphs' or null"),
        # A key of one type: jsonargparse's two lines, the first without the value ("Expected a typing.Literal[...]").
        (["--data.decode", "gpuu"], "decode\": 'gpuu' is not one of 'cpu', 'gpu'"),
        (["--data.batch_size", "abc"], "batch_size\": 'abc' is not an int"),
        (["--model.channels_last", "maybe"], "channels_last\": 'maybe' is not true/false"),
    ],
)  # fmt: skip
def test_a_value_of_none_of_a_keys_types_is_said_in_one_line(args, said, capsys, monkeypatch) -> None:
    """jsonargparse's nine-line dump (each subtype, each one's error, the value's type, always str on the command
    line) as one line: the value and what the key takes."""
    err = error_of(["fit", "--config", QUICKSTART, *args], capsys, monkeypatch)
    (line,) = [line for line in err.splitlines() if line.startswith("error:")]
    assert said in line and "Subtypes" not in err and "Given value" not in err and "Expected a" not in err


@pytest.mark.parametrize(
    ("args", "said"),
    [(["--trainer.logger.init_args.versoin", "0"],
      'error: Parser key "trainer.logger": run_logger.RunLogger takes no option \'versoin\'; did you mean '
      "--trainer.logger.init_args.version?"),
     (["--trainer.strategy", "DDPStrategy", "--trainer.strategy.gradient_as_bucket_veiw", "true"],
      "DDPStrategy takes no option 'gradient_as_bucket_veiw'; did you mean "
      "--trainer.strategy.init_args.gradient_as_bucket_view?"),
     (["--trainer.logger.init_args.zzz", "0"],
      "takes no option 'zzz'; it takes: flush_logs_every_n_steps, name, prefix, save_dir, version"),
     # A class of no options: the line ended "it takes: " and nothing.
     (["--trainer.callbacks+=pytorch_lightning.callbacks.Callback", "--trainer.callbacks.init_args.foo", "1"],
      "pytorch_lightning.callbacks.Callback takes no option 'foo'; it takes no options")],
)  # fmt: skip
def test_a_mistyped_option_of_a_class_is_one_line_with_the_option_meant(args, said, capsys, monkeypatch) -> None:
    """jsonargparse's twelve-line dump of the union's subtypes, with no guess, as one line: the class, the option and
    the closest option the class takes (DDP's own, which DDPStrategy passes on, among them)."""
    err = error_of(["fit", "--config", QUICKSTART, *args], capsys, monkeypatch)
    assert said in err.splitlines()[-1] and "Subtypes" not in err and "Given value" not in err


def test_a_mistyped_option_of_a_class_inside_a_class_is_named_by_no_wrong_option(capsys, monkeypatch) -> None:
    # The cluster environment's option: the dump's nested class parser said "did you mean
    # --cluster_environment.init_args.auto_requeue?", and read from the outer dump the hint was DDPStrategy's option
    # --trainer.strategy.init_args.auto_requeue; neither is an option of the command line.
    args = ["--trainer.strategy", "DDPStrategy", "--trainer.strategy.init_args.cluster_environment", "SLURMEnvironment",
            "--trainer.strategy.init_args.cluster_environment.init_args.auto_requeu", "false"]  # fmt: skip
    err = error_of(["fit", "--config", QUICKSTART, *args], capsys, monkeypatch)
    assert "auto_requeu" in err
    assert "did you mean --cluster_environment" not in err and "--trainer.strategy.init_args.auto_requeue" not in err


def test_the_class_count_set_on_the_model_says_where_it_comes_from(capsys, monkeypatch) -> None:
    # The parser's own message sent to data.num_classes, which is no option.
    err = error_of(["fit", "--config", QUICKSTART, "--model.num_classes", "5"], capsys, monkeypatch)
    assert 'Linked "model.num_classes" must be given via "data.num_classes".' in err
    assert "data.num_classes is no option: it is the number of class folders under data.root" in err


def test_an_option_with_nothing_close_gets_no_guess(capsys, monkeypatch) -> None:
    err = error_of(["fit", "--config", QUICKSTART, "--zzz.qqq", "1"], capsys, monkeypatch)
    assert err.splitlines()[-1] == "error: unrecognized arguments: --zzz.qqq 1"


@pytest.mark.parametrize("option", ["--optimizer", "--lr_scheduler"])
def test_optimizer_and_scheduler_options_are_refused(option, capsys, monkeypatch) -> None:
    # LightningCLI's --optimizer replaced the recipe silently (no warmup, no lr scaling); --lr_scheduler was ignored.
    err = error_of(["fit", "--config", QUICKSTART, option, "StepLR"], capsys, monkeypatch)
    line = err.splitlines()[-1]
    assert line.startswith(f"error: unrecognized arguments: {option} StepLR; the optimizer and its schedule are")
    assert "--model.lr_schedule (step or cosine)" in line and "--model.warmup_epochs" in line
    assert "did you mean" not in line


def test_help_still_prints_every_option(capsys, monkeypatch) -> None:
    monkeypatch.setattr(sys, "argv", [str(REPO / "train.py")])
    with pytest.raises(SystemExit) as exit_info:
        train.main(["fit", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "--model.arch" in out and "--data.batch_size" in out and "--optimizer" not in out


def test_the_top_level_help_says_fit_is_implied_and_main_amp_lines_run(capsys, monkeypatch) -> None:
    monkeypatch.setattr(sys, "argv", [str(REPO / "train.py")])
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--help"])
    assert exit_info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "fit is implied" in out and "-a resnet50 --b 224 --opt-level O1 --prof 20 DATA_DIR" in out


def test_the_apps_warnings_print_without_their_source_line(capsys, monkeypatch) -> None:
    monkeypatch.setattr(sys, "argv", [str(REPO / "train.py")])
    with pytest.raises(SystemExit):
        train.main(["--version"])  # main() installs the format first (cli_parser.tidy_console)
    app_file, torch_file = str(REPO / "train.py"), torch.__file__
    assert warnings.formatwarning(UserWarning("said"), UserWarning, app_file, 7, "rank_zero_warn(x)") == (
        f"{app_file}:7: said\n"
    )
    assert "rank_zero_warn" in warnings.formatwarning(UserWarning("said"), UserWarning, torch_file, 7, "rank_zero_warn")
    # The app's own kinds of UserWarning too (a bad image skipped printed the line that warned under it).
    bad = BadImageWarning("skipping bad image x.JPEG")
    assert warnings.formatwarning(bad, BadImageWarning, app_file, 9, "self._record(bad)") == (
        f"{app_file}:9: BadImageWarning: skipping bad image x.JPEG\n"
    )


def test_a_package_installed_inside_the_apps_folder_keeps_pythons_format(capsys, monkeypatch) -> None:
    # A virtual environment in the project's folder: its packages' warnings are not the application's.
    monkeypatch.setattr(sys, "argv", [str(REPO / "train.py")])
    with pytest.raises(SystemExit):
        train.main(["--version"])
    package_file = str(REPO / ".venv" / "lib" / "python3.11" / "site-packages" / "pkg" / "mod.py")
    said = warnings.formatwarning(UserWarning("said"), UserWarning, package_file, 7, "rank_zero_warn(x)")
    assert said.startswith(f"{package_file}:7: UserWarning: said") and "rank_zero_warn(x)" in said


def test_lightnings_litlogger_advert_is_not_logged(caplog) -> None:
    cli_parser.tidy_console(str(REPO))
    log = logging.getLogger("pytorch_lightning.utilities.rank_zero")
    with caplog.at_level(logging.INFO, logger=log.name):
        log.info("Tip: for seamless cloud logging and experiment tracking, try `pip install litlogger`: "
                 "https://pypi.org/project/litlogger/")  # fmt: skip
        log.info("GPU available: False, used: False")
    assert [r.getMessage() for r in caplog.records if r.name == log.name] == ["GPU available: False, used: False"]


def test_lightnings_pytree_deprecation_notice_is_not_printed(monkeypatch) -> None:
    monkeypatch.setattr(warnings, "filters", list(warnings.filters))  # the suite's filters as they were, afterwards
    cli_parser.tidy_console(str(REPO))
    with warnings.catch_warnings(record=True) as caught:
        warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated, use ...", FutureWarning, stacklevel=1)
        warnings.warn("another deprecation", FutureWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["another deprecation"]


def test_lightnings_save_last_hint_for_a_first_run_with_ckpt_path_last_is_replaced() -> None:
    """``--ckpt_path last`` before any save (a requeued job's first run): Lightning's hint to set save_last is wrong
    where last_checkpoint always writes last.ckpt; the line says the run trains from the start instead."""
    from pytorch_lightning.trainer.connectors import checkpoint_connector

    # The warning as this Lightning words it (a change of its wording shows here, not as a stale hint on the console).
    assert cli_parser._LIGHTNINGS_SAVE_LAST_HINT in inspect.getsource(checkpoint_connector)
    cli_parser.tidy_console(str(REPO))
    lightning_file = checkpoint_connector.__file__
    lightnings = ('.fit(ckpt_path="last") is set, but there is no last checkpoint available. No checkpoint will be '
                  "loaded. HINT: Set `ModelCheckpoint(..., save_last=True)`.")  # fmt: skip
    said = warnings.formatwarning(UserWarning(lightnings), UserWarning, lightning_file, 190, "rank_zero_warn(x)")
    assert "save_last" not in said
    assert "No checkpoint will be loaded. This run trains from the start (a requeued job's first run;" in said
