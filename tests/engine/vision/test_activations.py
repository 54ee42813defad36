"""vision_config.hidden_act: towers with the activations transformers' Pixtral takes (gelu is
PixtralConfig's default, silu the published files') match transformers in fp32 as in
test_encoder_parity.py; a wrong activation is caught by the same bound; an activation
not served names the way to serve the text model (--limit-mm-per-prompt image=0), and
that way starts without reading the vision config."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest
import torch

from engine.checkpoint.errors import CheckpointError
from engine.vision.activation import activation
from engine.vision.config import read_vision_config
from engine.vision.encoder import load_vision_encoder
from engine.vision.gemm import MODES, VisionGemm
from service.vision_setup import load_vision_runtime
from tests.engine.vision.support import (
    SMALL_VISION,
    hf_image_features,
    hf_model,
    pixels,
    rel_error,
    vision_spec,
)

TOL = 0.03  # test_encoder_parity.py's bound and its reasons
SIZES = [(56, 84), (112, 56)]
ACTS = ["gelu", "silu", "gelu_pytorch_tanh", "quick_gelu"]


def _write(root, act: str):
    from engine.synth import write_checkpoint

    spec = vision_spec(vision=dataclasses.replace(SMALL_VISION, hidden_act=act))
    write_checkpoint(root, spec)
    return root


@pytest.fixture(scope="module")
def towers(tmp_path_factory):
    """act -> (checkpoint dir, transformers' features per image)."""
    images = [pixels(h, w, seed=i) for i, (h, w) in enumerate(SIZES)]
    out = {}
    for act in ACTS:
        d = _write(tmp_path_factory.mktemp(f"vision-{act}"), act)
        out[act] = d, hf_image_features(hf_model(d), images)
    return out


def _ours(enc):
    return [enc(pixels(h, w, seed=i)) for i, (h, w) in enumerate(SIZES)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("act", ACTS)
def test_tower_matches_transformers(towers, act, mode):
    model_dir, reference = towers[act]
    assert read_vision_config(model_dir).hidden_act == act
    enc = load_vision_encoder(model_dir, VisionGemm(mode, "test"))
    for ours, ref in zip(_ours(enc), reference, strict=True):
        assert ours.shape == ref.shape
        assert rel_error(ours, ref) < TOL, f"{act} {mode}: {rel_error(ours, ref):.4f}"


def test_a_wrong_activation_is_caught(towers):
    model_dir, reference = towers["gelu"]
    enc = load_vision_encoder(model_dir, VisionGemm("fp32", "test"))
    enc.tower.act = activation("silu")
    assert rel_error(_ours(enc)[0], reference[0]) > 3 * TOL


def test_missing_hidden_act_is_pixtrals_gelu(towers, tmp_path):
    import shutil

    model_dir = shutil.copytree(towers["gelu"][0], tmp_path / "m")
    cfg = json.loads((model_dir / "config.json").read_text())
    del cfg["vision_config"]["hidden_act"]
    (model_dir / "config.json").write_text(json.dumps(cfg))
    assert read_vision_config(model_dir).hidden_act == "gelu"


def test_an_activation_not_served_names_the_text_only_flag(tmp_path):
    model_dir = _write(tmp_path / "mish", "mish")  # in ACT2FN, not served here
    with pytest.raises(CheckpointError, match=r"hidden_act 'mish'.*--limit-mm-per-prompt "
                                              r"image=0"):
        read_vision_config(model_dir)
    settings = SimpleNamespace(limit_mm_per_prompt=0)
    assert load_vision_runtime(model_dir, settings, None) == (
        None, "image input disabled (--limit-mm-per-prompt image=0)")


def test_activations_work_in_place():
    for name in ACTS:
        x = torch.randn(4, 8)
        ref = x.clone()
        assert activation(name)(x).data_ptr() == x.data_ptr()
        assert not torch.equal(x, ref)
    with pytest.raises(ValueError, match="'mish' is not served"):
        activation("mish")
