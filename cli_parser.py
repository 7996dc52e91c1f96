"""The command line's parser: LightningCLI's, with errors a person can read.

A mistyped option made jsonargparse print the whole usage of the subcommand (about 130 lines for ``fit``) above the
one line that matters. Here an error prints that line, the closest valid option when one is near (``--modle.arch``:
did you mean ``--model.arch``?), whether the key came from a ``--config`` file, and where ``--help`` is. A YAML
syntax error names its file (YAML calls it ``<unicode string>``), and a wrong ``trainer.precision`` gets the valid
values under jsonargparse's dump of the type. :func:`tidy_console` keeps the output around them short.
"""

from __future__ import annotations

import difflib
import importlib
import logging
import os
import re
import sys
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any, NoReturn

import yaml
from jsonargparse import ArgumentParser
from pytorch_lightning.cli import LightningArgumentParser

from cli_names import SUBCOMMANDS

#: The option names in jsonargparse's messages for an unknown command-line option and an unknown config key.
_UNRECOGNIZED = re.compile(r"unrecognized arguments: (--?[\w.\-]+)")
_NOT_ACCEPTED = re.compile(r"does not accept (?:option|key)s? '([\w.\-]+)'")


class ReadableErrorsParser(LightningArgumentParser):
    """A :class:`LightningArgumentParser` whose errors are the message, a suggestion and a pointer to ``--help``."""

    _given: list[str] | None = None  # the arguments of the last parse, to tell a config file's key from the line's

    def parse_args(self, args: Any = None, *more: Any, **kwargs: Any) -> Any:
        self._given = [str(a) for a in (sys.argv[1:] if args is None else args)] if not hasattr(args, "keys") else []
        self._cwd = os.getcwd()  # the parser changes into each config file's folder while it reads it
        return super().parse_args(args, *more, **kwargs)

    def print_usage(self, file: IO[str] | None = None) -> None:
        # Called on errors only (--help prints the full text through print_help).
        (file or sys.stderr).write(f"usage: {self.prog} [options]\n")

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        parser = getattr(ex, "subcommand_parser", None) or self
        cwd = getattr(self, "_cwd", os.getcwd())
        message = _name_the_config_file(message, self._given or [], cwd)
        message = _name_the_file_that_is_no_mapping(message, self._given or [], cwd)
        message = _union_in_one_line(message)
        message = _single_type_in_one_line(message)
        if self.exit_on_error:
            # The message the user reads. A class's own parser inside a parse (exit_on_error False) names its keys
            # relative to the class: its hint would be no option of the command line, and its dump is left whole for
            # the outer message, which lists it.
            message = _class_option_in_one_line(message)
        # --lr_scheduler is close to --model.lr_schedule, which takes other values: the recipe's hint says them.
        recipe = _optimizer_hint(message)
        hints = ("" if recipe else _suggestion(message, parser, self._given or [], cwd)) + _precision_hint(message)
        hints += _num_classes_hint(message) + _apex_flag_hint(message) + recipe
        hints += _subcommand_first_hint(message) + _config_file_hint(message, self._given or [], cwd)
        super().error(message + hints + _empty_section_hint(message), ex)


def _subcommand_first_hint(message: str) -> str:
    """``train.py --config X validate``: fit was implied before the options, and ``validate`` was left over."""
    found = re.search(r"unrecognized arguments: (\w+)\b", message)
    if found is None or found.group(1) not in SUBCOMMANDS:
        return ""
    return f" (the subcommand comes first: python train.py {found.group(1)} --config ...)"


_MISSING_CONFIG = re.compile(r"""Parser key "config": File does not exist: '([^']+)'""")


def _config_file_hint(message: str, given: list[str], cwd: str) -> str:
    """``--config configs/quickstrat.yaml``: the closest config file of that folder (``; did you mean
    configs/quickstart.yaml?``), else of the application's own configs folder, else the files of the first of the two
    that has any."""
    found = _MISSING_CONFIG.search(message)
    if found is None:
        return ""
    missing = Path(found.group(1))
    typed = next((v for v in option_values(given, ("--config", "-c")) if Path(cwd, v) == missing), str(missing))
    app_configs = Path(__file__).resolve().parent / "configs"
    # The typed folder first; then the application's configs/ (a folder that does not exist, or a name typed without
    # its folder: --config quickstart.yaml from the project's root).
    folders = [folder for folder in (missing.parent, app_configs) if folder.is_dir()]
    listed: tuple[Path, list[str]] | None = None
    for folder in dict.fromkeys(folders):
        names = sorted(e.name for e in folder.iterdir() if e.suffix in (".yaml", ".yml") and e.is_file())
        # By stem: the shared ".yaml" made any short name close to any other.
        stems = {Path(name).stem: name for name in names}
        close = [stems[stem] for stem in difflib.get_close_matches(missing.stem, list(stems), n=1, cutoff=0.6)]
        if folder == missing.parent:
            shown = Path(typed).parent
        else:
            shown = folder.relative_to(cwd) if folder.is_relative_to(cwd) else folder
        if close:
            return f"; did you mean {shown / close[0]}?"
        if names and listed is None:
            listed = shown, names
    return f" (the config files in {listed[0]}: {', '.join(listed[1])})" if listed else ""


def _num_classes_hint(message: str) -> str:
    """``Linked "model.num_classes" must be given via "data.num_classes"`` sends to a key no one can set: the data
    module counts the classes."""
    if 'Linked "model.num_classes"' not in message:
        return ""
    return (
        " (data.num_classes is no option: it is the number of class folders under data.root, or "
        "data.synthetic_num_classes with data.source: synthetic)"
    )


def _apex_flag_hint(message: str) -> str:
    """An unrecognized argument that is a flag of apex's main_amp.py (``--prof``, ``--opt-level``, ``-e``; also an
    unambiguous prefix such as ``--b``): say why it was not translated, and where train.py's own keys are listed."""
    found = _UNRECOGNIZED.search(message)
    if found is None:
        return ""
    import apex_compat  # here, not at the top: apex_compat imports this module

    name = found.group(1).split("=", 1)[0]
    if name in ("-h", "--help") or not apex_compat.is_original_flag(name):
        return ""
    return (
        f"; {name} is a flag of apex main_amp.py: train.py translates main_amp.py's flags only on a command line that "
        f"starts with one of them or with the data folder (python train.py DIR {name} ...), not after --config or a "
        'subcommand; there give train.py\'s own keys (README, "From apex main_amp.py", gives the key for each flag)'
    )


#: LightningCLI's own options that this application leaves out (``ImageNetCLI`` adds neither).
_RECIPE_OPTIONS = ("--optimizer", "--lr_scheduler")


def _optimizer_hint(message: str) -> str:
    """``--optimizer SGD`` / ``--lr_scheduler StepLR`` (LightningCLI's own, left out here): why, and the keys of the
    module's recipe that take their place."""
    found = _UNRECOGNIZED.search(message)
    if found is None or found.group(1).split("=", 1)[0].split(".", 1)[0] not in _RECIPE_OPTIONS:
        return ""
    return (
        "; the optimizer and its schedule are the module's recipe (SGD, the rate scaled to the global batch, warmup): "
        "set them with --model.lr, --model.momentum, --model.weight_decay, --model.lr_schedule (step or cosine), "
        "--model.lr_milestones, --model.lr_gamma and --model.warmup_epochs (LightningCLI's --optimizer would replace "
        "it without warmup or scaling, and its --lr_scheduler would be ignored)"
    )


def _suggestion(message: str, parser: Any, given: list[str], cwd: str) -> str:
    """``; did you mean --model.arch?`` (and where an unknown key came from) for an unknown option in ``message``."""
    found = _UNRECOGNIZED.search(message) or _NOT_ACCEPTED.search(message)
    if found is None:
        return ""
    name = found.group(1).lstrip("-")
    options = sorted({o.lstrip("-") for action in parser._actions for o in action.option_strings if "." in o})
    close = difflib.get_close_matches(name, options, n=1, cutoff=0.75)
    hint = f"; did you mean --{close[0]}?" if close else ""
    if found.re is _NOT_ACCEPTED and f"--{name}" not in given:
        # The files that hold the key; else those that name another config (it may be there); else none: the key
        # came from elsewhere (a section's own file, --data FILE).
        files = list(config_files(given, cwd))
        configs = [path for path, content, _ in files if holds_key(content, name.split("."))]
        configs = configs or [path for path, content, _ in files if holds_key(content, ["config"])]
        if configs:
            hint += f" ('{name}' is a key of {' or '.join(configs)}, not of the command line)"
    return hint


def holds_key(content: Any, parts: list[str]) -> bool:
    """Whether a config file's YAML ``content`` has the dotted key ``parts`` (``["data", "source"]``)."""
    for part in parts:
        if not isinstance(content, dict) or part not in content:
            return False
        content = content[part]
    return True


def config_files(given: list[str], cwd: str) -> Iterator[tuple[str, Any, yaml.YAMLError | None]]:
    """Each ``--config`` file of ``given`` that can be read (from ``cwd``, where the command line's relative paths
    start): its path as given, its YAML content, and the YAML error that stops it from parsing (then no content)."""
    for path in option_values(given, ("--config", "-c")):
        try:
            text = (Path(cwd) / path).read_text()
        except OSError:
            continue  # the parser says so itself
        try:
            yield path, yaml.safe_load(text), None
        except yaml.YAMLError as error:
            yield path, None, error


def _name_the_config_file(message: str, given: list[str], cwd: str) -> str:
    """A YAML syntax error says ``in "<unicode string>", line 2``: the ``--config`` file that does not parse instead."""
    if '"<unicode string>"' not in message:
        return message
    for path, _, error in config_files(given, cwd):
        if error is not None:
            return message.replace('"<unicode string>"', path)
    return message


def _name_the_file_that_is_no_mapping(message: str, given: list[str], cwd: str) -> str:
    """jsonargparse's ``Unexpected config: <content>`` for a ``--config`` file that is empty or not a mapping of keys:
    the file and what it holds instead."""
    if not message.startswith("Unexpected config"):
        return message
    for path, content, error in config_files(given, cwd):
        if error is None and not isinstance(content, dict):
            holds = "nothing" if content is None else f"a {type(content).__name__}"
            return f"--config {path} holds {holds}, not keys (e.g. 'trainer:' with 'max_epochs: 90' under it)"
    return message


_KEY_NOT_FOUND = re.compile(r'Key "(model|data)\.[\w.]+" not found in namespace')


def _empty_section_hint(message: str) -> str:
    """A config file's ``model:`` or ``data:`` whose keys are all commented out is a null that the parser's links
    then fail on, naming a key nobody wrote."""
    found = _KEY_NOT_FOUND.search(message)
    if found is None:
        return ""
    section = found.group(1)
    return (
        f"\nis '{section}:' empty (null) in a config file, every key under it commented out? remove it, or give it keys"
    )


#: ``trainer.precision`` values, for the hint under jsonargparse's dump of the type's union.
PRECISIONS = ("32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true", "64-true")


_UNION = re.compile(
    r'^(Parser key "[\w.]+"):\n\s*Does not validate against any of the Union subtypes\n\s*Subtypes: \[(.*)\]\n'
    r"(?:.*\n)*?\s*Given value: (.*)$"
)
#: jsonargparse's spelling of a plain subtype, and what the one-line error calls it.
_PLAIN_TYPES = {"<class 'int'>": "an int", "<class 'float'>": "a float", "<class 'str'>": "a string",
                "<class 'bool'>": "true/false", "<class 'NoneType'>": "null", "list[int]": "a list of ints ([1,2])",
                "list[str]": "a list of strings"}  # fmt: skip


def _union_in_one_line(message: str) -> str:
    """jsonargparse's nine-line dump for a value that fits none of a key's types (``--profile.start_step 2.5``: each
    subtype, the error of each, the given value's type, which on the command line is always str) as one line: the
    value and what the key takes. Unions of other types (classes, whose errors tell what went wrong inside) and
    ``trainer.precision`` (whose valid values are listed after it) keep the dump."""
    found = _UNION.match(message)
    if found is None:
        return message
    if found.group(1) == 'Parser key "trainer.precision"':  # Lightning's many spellings: _precision_hint lists them
        return f"{found.group(1)}: {found.group(3)!r} is not a precision Lightning takes"
    takes = [_what_it_takes(subtype) for subtype in re.split(r",\s*(?![^\[]*\])", found.group(2).strip())]
    if None in takes:
        return message
    expected = ", ".join(takes[:-1]) + f" or {takes[-1]}" if len(takes) > 1 else takes[0]
    return f"{found.group(1)}: {found.group(3)!r} is not {expected}"


def _what_it_takes(subtype: str) -> str | None:
    """What one of jsonargparse's type spellings takes, in words (``typing.Literal['cpu', 'gpu']``: one of 'cpu',
    'gpu'); None for a type not spelt out here."""
    literal = re.fullmatch(r"typing\.Literal\[(.*)\]", subtype)
    if literal:
        return f"one of {literal.group(1)}"
    return _PLAIN_TYPES.get(subtype)


#: jsonargparse's two lines for a value that a key of one type does not take (``--data.decode gpuu``).
_SINGLE_TYPE = re.compile(r'^(Parser key "[\w.]+"):\n\s*Expected a (.*)\. Got value: (.*)$')


def _single_type_in_one_line(message: str) -> str:
    """jsonargparse's ``Expected a typing.Literal['cpu', 'gpu']. Got value: gpuu`` under the key, for a key of one
    type (``data.decode``, ``data.batch_size``), as one line in the words of :func:`_union_in_one_line`: ``'gpuu'
    is not one of 'cpu', 'gpu'``. Other types keep jsonargparse's message."""
    found = _SINGLE_TYPE.match(message)
    expected = _what_it_takes(found.group(2)) if found else None
    if found is None or expected is None:
        return message
    return f"{found.group(1)}: {found.group(3)!r} is not {expected}"


#: jsonargparse's dump for an option a class does not take (``--trainer.logger.init_args.versoin 0``): the union's
#: subtypes and their errors, among them the class's. Only the key's own subtypes (the first level of the dump, by
#: its indentation): an option refused by a class nested in one (``--trainer.strategy.init_args.cluster_environment.
#: init_args.X``) is no option of the key's class.
_CLASS_OPTION = re.compile(
    r'^(Parser key "([\w.]+)"):\n  Does not validate against any of the Union subtypes\n(?:  .*\n)*?'
    r"    - Problem with given class_path '([\w.]+)':\n        Option '([\w.]+)' is not accepted\n"
)


def _class_option_in_one_line(message: str) -> str:
    """jsonargparse's twelve-line dump for a mistyped option of a class given by its ``class_path`` (the logger's
    ``init_args.versoin``, ``--trainer.strategy.gradient_as_bucket_veiw``) as one line: the class, the option, and
    the closest option it takes (else all of them)."""
    found = _CLASS_OPTION.match(message)
    if found is None:
        return message
    key, class_path, name = found.group(2), found.group(3), found.group(4)
    try:
        module, _, attribute = class_path.rpartition(".")
        parser = ArgumentParser()
        parser.add_class_arguments(getattr(importlib.import_module(module), attribute), fail_untyped=False)
    except Exception:  # the dump, as it was, rather than an error inside the error
        return message
    options = sorted(
        {o[2:] for a in parser._actions for o in a.option_strings if o.startswith("--") and o[2:].isidentifier()}
        - {"help"}
    )
    close = difflib.get_close_matches(name, options, n=1, cutoff=0.75)
    if close:
        hint = f"did you mean --{key}.init_args.{close[0]}?"
    else:
        hint = f"it takes: {', '.join(options)}" if options else "it takes no options"
    return f"{found.group(1)}: {class_path} takes no option '{name}'; {hint}"


def _precision_hint(message: str) -> str:
    """The valid ``trainer.precision`` values after jsonargparse's union dump (``--trainer.precision fp16``; the
    original's O1 is 16-mixed)."""
    if not message.startswith('Parser key "trainer.precision"'):
        return ""
    return f"\nvalid trainer.precision: {', '.join(PRECISIONS)} (main_amp.py's O1/O2: 16-mixed)"


def option_values(args: Sequence[str], names: Sequence[str]) -> list[str]:
    """The values of the options ``names`` in ``args``, in order (``--name VALUE``, ``--name=VALUE``, and for a short
    name ``-c``, argparse's ``-cVALUE`` too)."""
    values = []
    short = [name for name in names if len(name) == 2 and name[0] == "-" and name[1] != "-"]
    for position, token in enumerate(args):
        name, equals, value = token.partition("=")
        if name in names:
            if equals:
                values.append(value)
            elif position + 1 < len(args):
                values.append(args[position + 1])
        elif not token.startswith("--") and any(token.startswith(s) and len(token) > 2 for s in short):
            values.append(token[2:])
    return values


def tidy_console(app_dir: str) -> None:
    """The console output around the parser's: the application's warnings as ``file:line: message`` (as Lightning
    prints its own; Python's format adds the source line that raised it, ``  rank_zero_warn(``, which says nothing),
    and without Lightning 2.6's advert for its cloud logger at the start of every run (this application logs to
    metrics.csv) or its deprecation notice about torch's pytree. Once per process, however often it is called.

    Args:
        app_dir: The application's folder: UserWarnings raised from its files (not from packages installed in it).
    """
    logging.getLogger("pytorch_lightning.utilities.rank_zero").addFilter(_without_litlogger_tip)  # a set: once
    # Lightning 2.6's own use of torch's pytree (its _pytree.py) under torch >= 2.13, once per run: nothing for the
    # user to change (filterwarnings keeps one entry however often it is called).
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
    if getattr(warnings.formatwarning, "without_source_line", False):
        return
    previous = warnings.formatwarning

    def format_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int, line=None) -> str:  # noqa: ANN001
        if _LIGHTNINGS_SAVE_LAST_HINT in str(message):
            # --ckpt_path last before any save (a requeued job's first run): Lightning's hint to set save_last is
            # wrong here, where last_checkpoint always writes last.ckpt.
            message = str(message).replace(_LIGHTNINGS_SAVE_LAST_HINT, _FIRST_RUN)
        path = Path(filename)
        if issubclass(category, UserWarning) and path.is_relative_to(app_dir) and "site-packages" not in path.parts:
            # The app's own kinds (BadImageWarning) keep their name: it is what a warnings filter would take.
            kind = "" if category is UserWarning else f"{category.__name__}: "
            return f"{filename}:{lineno}: {kind}{message}\n"
        return previous(message, category, filename, lineno, line)

    format_warning.without_source_line = True  # type: ignore[attr-defined]
    warnings.formatwarning = format_warning


#: The end of Lightning's warning for ``--ckpt_path last`` without a last checkpoint, and what this app says instead.
_LIGHTNINGS_SAVE_LAST_HINT = "HINT: Set `ModelCheckpoint(..., save_last=True)`."
_FIRST_RUN = (
    "This run trains from the start (a requeued job's first run; its last_checkpoint writes last.ckpt, which the "
    "next submission's --ckpt_path last finds)."
)


def _without_litlogger_tip(record: logging.LogRecord) -> bool:
    return "pypi.org/project/litlogger" not in str(record.msg)
