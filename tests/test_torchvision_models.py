"""torchvision_models: classifiers built by name with a head for the data's classes, local weights loaded, and every
misfit of a weights file said in one line."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
import torch
import torchvision

from torchvision_models import build_model, classification_archs


def test_unknown_arch_lists_the_valid_names() -> None:
    listed = r"unknown architecture 'resnet19'; did you mean resnet18 or .*\? valid: .*\bresnet18\b.*\bresnet50\b"
    with pytest.raises(ValueError, match=listed) as e:
        build_model("resnet19", 10)
    assert "vit_b_16" in str(e.value)
    with pytest.raises(ValueError, match=r"'notanarch'; valid: alexnet"):  # nothing close: no suggestion
        build_model("notanarch", 10)
    # Detection or video models are no image classifiers here.
    assert "fasterrcnn_resnet50_fpn" not in classification_archs()
    assert "r3d_18" not in classification_archs()


@pytest.fixture(scope="module")
def resnet18_weights(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    """A local torchvision resnet18 state_dict file (1000 classes, random weights) and its tensors."""
    torch.manual_seed(1)
    state = torchvision.models.resnet18().state_dict()
    path = tmp_path_factory.mktemp("weights") / "resnet18-random.pth"
    torch.save(state, path)
    return path, state


def test_weights_load_exactly(resnet18_weights: tuple[Path, dict]) -> None:
    path, state = resnet18_weights
    model = build_model("resnet18", 1000, str(path))
    for key, value in model.state_dict().items():
        assert torch.equal(value, state[key]), key


def test_weights_of_a_ddp_or_wrapped_checkpoint(resnet18_weights: tuple[Path, dict], tmp_path: Path) -> None:
    _, state = resnet18_weights
    path = tmp_path / "wrapped.pth"
    torch.save({"state_dict": {f"module.{k}": v for k, v in state.items()}}, path)
    model = build_model("resnet18", 1000, str(path))
    assert torch.equal(model.fc.weight, state["fc.weight"])


def test_1000_class_weights_into_a_10_class_model_keep_the_body(resnet18_weights: tuple[Path, dict], caplog) -> None:
    path, state = resnet18_weights
    torch.manual_seed(0)
    with caplog.at_level(logging.INFO):
        model = build_model("resnet18", 10, str(path))
    # Said: main_amp.py's -e --pretrained on a 10-class folder scored this untrained head without a word.
    assert f"model.weights: {path} was trained for 1000 classes and this run has 10: its body is loaded, and its " \
        "head (fc.bias, fc.weight) starts freshly initialized" in caplog.text  # fmt: skip
    assert model.fc.weight.shape == (10, 512) and model.fc.bias.shape == (10,)
    for key, value in model.state_dict().items():
        if not key.startswith("fc."):
            assert torch.equal(value, state[key]), key
    # The head is a fresh initialization, not a slice of the checkpoint's.
    assert not torch.equal(model.fc.weight, state["fc.weight"][:10])


def test_missing_weights_file(tmp_path: Path) -> None:
    path = tmp_path / "resnet18-f37072fd.pth"
    with pytest.raises(FileNotFoundError, match=re.escape(f"model.weights: {path} does not exist")):
        build_model("resnet18", 10, str(path))
    with pytest.raises(FileNotFoundError, match=re.escape(f"model.weights: {tmp_path} is a folder; give a local")):
        build_model("resnet18", 10, str(tmp_path))


def test_weights_of_another_arch_are_refused(resnet18_weights: tuple[Path, dict], tmp_path: Path) -> None:
    path, state = resnet18_weights
    # Same keys, but a body layer of another width: must not be dropped silently like a head.
    wider = dict(state)
    wider["layer1.0.conv1.weight"] = torch.zeros(96, 64, 3, 3)
    torch.save(wider, tmp_path / "wider.pth")
    for classes in (1000, 10):
        with pytest.raises(ValueError, match=r"(?s)does not fit arch 'resnet18'.*layer1\.0\.conv1\.weight"):
            build_model("resnet18", classes, str(tmp_path / "wider.pth"))
    # A deeper net whose first blocks fit (resnet18 into resnet34 misses blocks; resnet34 into resnet18 has extra).
    with pytest.raises(ValueError, match=r"(?s)does not fit arch 'resnet34'.*[Mm]issing key"):
        build_model("resnet34", 10, str(path))
    deeper = dict(state)
    deeper["layer1.2.conv1.weight"] = torch.zeros(64, 64, 3, 3)
    torch.save(deeper, tmp_path / "deeper.pth")
    for classes in (1000, 10):
        with pytest.raises(ValueError, match=r"(?s)does not fit arch 'resnet18'.*[Uu]nexpected key.*layer1\.2"):
            build_model("resnet18", classes, str(tmp_path / "deeper.pth"))


@pytest.mark.parametrize("content", ["text", "whole model", "list", "torn"])
def test_weights_file_that_is_no_state_dict(tmp_path: Path, content: str) -> None:
    """A file that is no state_dict is said in one line, without torch's advice to load it with weights_only=False
    (which runs whatever code the file pickled)."""
    path = tmp_path / "weights.pth"
    if content == "text":
        path.write_text("# README\n\nNot a weights file.\n")
    elif content == "torn":  # a download cut short: torch's own reason is said
        torch.save(torchvision.models.resnet18().state_dict(), path)
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    else:
        torch.save(torchvision.models.resnet18() if content == "whole model" else [1, 2], path)
    with pytest.raises(ValueError, match=re.escape(f"model.weights: {path} is not a state_dict")) as caught:
        build_model("resnet18", 10, str(path))
    said = str(caught.value)
    assert "torch.save(model.state_dict())" in said and "resnet18-*.pth" in said
    assert "weights_only" not in said and "\n" not in said
    if content == "whole model":
        assert "it pickles a torchvision.models.resnet.ResNet object" in said
    if content == "torn":
        assert "torch.load cannot read it: RuntimeError: PytorchStreamReader failed" in said
    if content == "text":
        assert "torch.load cannot read it: not a torch.save file" in said  # was "KeyError: 101"


def test_weights_that_do_not_fit_are_summarized(resnet18_weights: tuple[Path, dict], tmp_path: Path) -> None:
    """Missing, unexpected and mis-shaped keys: counted, at most three names of each, in one short line."""
    _, state = resnet18_weights
    # 4 missing: a BatchNorm's 5 entries less its num_batches_tracked, which torch fills (old files lack it).
    broken = {k: v for k, v in state.items() if not k.startswith("layer4.1.bn2.")}
    broken.update({f"extra.{i}.weight": torch.zeros(1) for i in range(4)})  # 4 unexpected
    broken["layer1.0.conv1.weight"] = torch.zeros(96, 64, 3, 3)  # 1 mis-shaped
    path = tmp_path / "broken.pth"
    torch.save(broken, path)
    with pytest.raises(ValueError) as caught:
        build_model("resnet18", 10, str(path))
    said = str(caught.value)
    assert said.startswith(f"model.weights: {path} does not fit arch 'resnet18': 4 missing keys (layer4.1.bn2.")
    assert "; 4 unexpected keys (extra.0.weight, extra.1.weight, extra.2.weight, ...)" in said
    assert "; 1 mis-shaped key (layer1.0.conv1.weight (96, 64, 3, 3) vs (64, 64, 3, 3))" in said
    assert said.count("layer4.1.bn2.") == 3 and "\n" not in said and len(said) < 500
    # Another arch altogether: still one line, not torch's list of every key.
    with pytest.raises(ValueError, match=r"does not fit arch 'resnet50': \d+ missing keys") as caught:
        build_model("resnet50", 10, str(resnet18_weights[0]))
    assert len(str(caught.value)) < 600


@pytest.mark.parametrize("arch", ["googlenet", "inception_v3"])
def test_torchvisions_own_weights_of_archs_with_auxiliary_heads_load(arch: str, tmp_path: Path) -> None:
    # torchvision's files hold the auxiliary heads (it builds the model with them to load, then drops them).
    torch.manual_seed(0)
    published = torchvision.models.get_model(arch, num_classes=1000, aux_logits=True, init_weights=False)
    torch.save(published.state_dict(), tmp_path / f"{arch}.pth")
    model = build_model(arch, 1000, weights=str(tmp_path / f"{arch}.pth"))
    assert not model.aux_logits and model.transform_input  # as torchvision builds it for its weights
    published_state = published.state_dict()
    assert all(torch.equal(v, published_state[k]) for k, v in model.state_dict().items())
