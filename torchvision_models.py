"""torchvision classifiers as the app builds them: by name, with a head for the data's classes, from a local
state_dict file whose every misfit is said in one line.

No Lightning at import: apex_compat.py's replica of main_amp.py's parser lists the architectures with it.
"""

from __future__ import annotations

import difflib
import pickle
import re
from pathlib import Path
from typing import Any

import torch
import torchvision


def classification_archs() -> list[str]:
    """Names that ``torchvision.models.get_model`` builds as image classifiers."""
    return sorted(torchvision.models.list_models(module=torchvision.models))


#: torchvision classifiers with auxiliary heads, built without them (``aux_logits=False``).
AUX_HEAD_ARCHS = ("googlenet", "inception_v3")
#: The state_dict prefixes of those heads (googlenet's, inception_v3's).
AUX_HEAD_KEYS = ("aux1.", "aux2.", "AuxLogits.")


def build_model(arch: str, num_classes: int, weights: str | None = None) -> torch.nn.Module:
    """Builds ``arch`` with a ``num_classes``-way head, optionally loading a local torchvision ``state_dict`` file.

    Raises:
        ValueError: ``arch`` is not a torchvision classification model (the message lists the valid ones), or
            ``weights`` is no state_dict or does not fit the architecture (see ``_load_weights``).
        FileNotFoundError: ``weights`` does not exist.
    """
    valid = classification_archs()
    if arch not in valid:
        # The first thing said: the list of valid names is some 80 long.
        close = difflib.get_close_matches(arch, valid, n=3, cutoff=0.7)
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        raise ValueError(f"model.arch: unknown architecture {arch!r}; {hint}valid: {', '.join(valid)}")
    options: dict[str, Any] = {}
    if arch in AUX_HEAD_ARCHS:
        # Built with their auxiliary heads, these return a namedtuple of three outputs in training; the original's
        # recipe trains the main head alone (and refused inception_v3).
        options["aux_logits"] = False
        options["init_weights"] = True  # torchvision's initialization of these (its default, said in a FutureWarning)
    model = torchvision.models.get_model(arch, weights=None, num_classes=num_classes, **options)
    if weights:
        _load_weights(model, arch, num_classes, Path(weights))
    return model


def _starts_as_a_zip(path: Path) -> bool:
    """Whether ``path`` begins as torch.save's zip archive does (a torn one too, unlike ``zipfile.is_zipfile``)."""
    with path.open("rb") as file:
        return file.read(4) == b"PK\x03\x04"


def _load_weights(model: torch.nn.Module, arch: str, num_classes: int, path: Path) -> None:
    """Loads the torchvision ``state_dict`` file ``path`` into ``model`` (``arch``, ``num_classes``-way head).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: ``path`` is no state_dict (another file, a whole pickled model, this application's training
            checkpoint), or its tensors do not fit ``arch``: the message says which, in one line.
    """
    if not path.is_file():
        raise FileNotFoundError(
            f"model.weights: {path} {'is a folder' if path.is_dir() else 'does not exist'}; give a local torchvision "
            "state_dict file "
            f"(e.g. a {arch}-*.pth from the torchvision model zoo copied to this machine)"
        )
    wanted = f"give a state_dict saved by torch.save(model.state_dict()), e.g. torchvision's {arch}-*.pth weights file"
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, MemoryError):
        raise  # the file system's error (permissions, I/O), said as it is
    except Exception as error:  # noqa: BLE001 - UnpicklingError for any pickle, RuntimeError for a torn archive, ...
        # torch's own message advises weights_only=False, which runs whatever code the file pickled: not said here.
        found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(error))
        if found:  # a whole model saved by torch.save(model), or a checkpoint holding other objects
            holds = f"it pickles a {found[1]} object, not only tensors"
        elif isinstance(error, pickle.UnpicklingError) or not _starts_as_a_zip(path):
            holds = "torch.load cannot read it: not a torch.save file"  # a text file gave "KeyError: 101"
        else:  # a torn download of the right file: torch's reason ("failed finding central directory")
            reason = (str(error).splitlines() or [""])[0]
            holds = f"torch.load cannot read it: {type(error).__name__}: {reason}"
        raise ValueError(f"model.weights: {path} is not a state_dict file ({holds}); {wanted}") from error
    if _is_training_checkpoint(saved):
        raise ValueError(
            f"model.weights: {path} is a training checkpoint of this application; resume it with --ckpt_path {path} "
            f"(or evaluate it with `train.py validate --ckpt_path {path}`)"
        )
    state = saved["state_dict"] if isinstance(saved, dict) and "state_dict" in saved else saved
    if not isinstance(state, dict) or not state or not all(isinstance(v, torch.Tensor) for v in state.values()):
        holds = f"keys {sorted(map(str, state))[:8]}" if isinstance(state, dict) else f"a {type(state).__name__}"
        raise ValueError(f"model.weights: {path} is not a state_dict (found {holds}, not tensors by name); {wanted}")
    state = {k.removeprefix("module."): v for k, v in state.items()}  # saved from a DDP or DataParallel wrapper
    aux = {k for k in state if k.startswith(AUX_HEAD_KEYS)} if arch in AUX_HEAD_ARCHS else set()
    if aux:
        # torchvision's own file of these: it builds the model with the auxiliary heads to load it, then drops them,
        # and its weights were trained on inputs that transform_input remaps (torchvision turns it on with them).
        state = {k: v for k, v in state.items() if k not in aux}
        model.transform_input = True  # type: ignore[assignment]
        from pytorch_lightning.utilities import rank_zero_info  # here: building a model needs no Lightning

        rank_zero_info(
            f"model.weights: {path} holds {arch}'s auxiliary heads (torchvision's file): left out, and "
            "transform_input on, as torchvision builds the model for these weights"
        )
    own = model.state_dict()
    misshaped = {k for k, v in state.items() if k in own and own[k].shape != v.shape}
    # A 1000-class ImageNet checkpoint fine-tuned on another class count: keep the body, re-initialize the head. Only
    # the head may differ: any other mismatch (another width or depth) is another arch.
    head = _head_keys(arch, num_classes, own) if misshaped else set()
    # strict=False, then the summary below: torch's strict error lists every key (10 KB for a ResNet). Its missing keys
    # are the ones torch could not fill (it fills a BatchNorm's num_batches_tracked that old files lack).
    left_out = misshaped | head
    result = model.load_state_dict({k: v for k, v in state.items() if k not in left_out}, strict=False)
    problems = [
        (sorted(set(result.missing_keys) - left_out), "missing"),
        (sorted(result.unexpected_keys), "unexpected"),
        ([f"{k} {tuple(state[k].shape)} vs {tuple(own[k].shape)}" for k in sorted(misshaped - head)], "mis-shaped"),
    ]
    said = [_summary(names, kind) for names, kind in problems if names]
    if said:
        raise ValueError(
            f"model.weights: {path} does not fit arch {arch!r}: {'; '.join(said)}; give a state_dict of a {arch} "
            f"(e.g. torchvision's {arch}-*.pth weights file), or pass the --model.arch it was saved from"
        )
    if head & misshaped:
        from pytorch_lightning.utilities import rank_zero_info  # here: building a model needs no Lightning

        saved_classes = next(state[k].shape[0] for k in sorted(head & misshaped))
        rank_zero_info(
            f"model.weights: {path} was trained for {saved_classes} classes and this run has {num_classes}: its "
            f"body is loaded, and its head ({', '.join(sorted(head))}) starts freshly initialized (a fine-tuning; an "
            "evaluation scores that untrained head)"
        )


def _summary(names: list[str], kind: str) -> str:
    """``3 missing keys (a, b, c, ...)``: the count and at most three names."""
    more = ", ..." if len(names) > 3 else ""
    return f"{len(names)} {kind} key{'s' if len(names) > 1 else ''} ({', '.join(names[:3])}{more})"


def _is_training_checkpoint(saved: Any) -> bool:
    """Whether ``saved`` is a checkpoint Lightning wrote of this module: its ``state_dict`` holds the network under
    the module's ``model`` attribute (``model.conv1.weight``)."""
    if not isinstance(saved, dict) or not isinstance(saved.get("state_dict"), dict):
        return False
    ours = [str(k).startswith("model.") for k in saved["state_dict"]]
    # Lightning's version entry marks its checkpoints; without it (a state_dict re-saved from one), every key must be.
    return any(ours) if "pytorch-lightning_version" in saved else bool(ours) and all(ours)


def _head_keys(arch: str, num_classes: int, own: dict[str, torch.Tensor]) -> set[str]:
    """The state_dict keys of ``arch`` whose shapes depend on the class count: the classifier head.

    Found by building the architecture for another class count on the meta device (no memory, no init cost).
    """
    with torch.device("meta"):
        other = torchvision.models.get_model(arch, weights=None, num_classes=num_classes + 1).state_dict()
    return {k for k, v in own.items() if k in other and other[k].shape != v.shape}
