"""The vision encoder (tower + projector) against transformers' Mistral3 in fp32 on tiny
random checkpoints, HF and Mistral-native layouts (same seed, same model).

Tolerance: max |ours - ref| / max |ref| per image < 0.03. On the bf16 GEMM path ours runs
bf16 activations (2^-9 relative rounding per op) through 2 layers and the projector;
measured ~0.008; the fp32 path (bf16 weights widened per GEMM) only rounds the output
to bf16. The tests below show the bound is meaningful: swapping the RoPE row/column
frequencies or merging the 2x2 patches position-major gives errors > 0.1 (measured
~0.2); transformers itself in bf16 is ~0.008-0.011 from its fp32 output."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.vision.encoder import VisionEncoder, load_vision_encoder
from engine.vision.gemm import MODES, VisionGemm, choose_gemm
from engine.vision.rope2d import Rope2D
from tests.engine.vision.support import hf_image_features, hf_model, pixels, rel_error, write_pair

TOL = 0.03
SIZES = [(112, 112), (56, 84), (28, 112), (84, 28)]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_pair(tmp_path_factory.mktemp("vision-pair"))


@pytest.fixture(scope="module")
def reference(pair: tuple[Path, Path]) -> list[torch.Tensor]:
    images = [pixels(h, w, seed=i) for i, (h, w) in enumerate(SIZES)]
    return hf_image_features(hf_model(pair[0]), images)


def _ours(enc: VisionEncoder) -> list[torch.Tensor]:
    return [enc(pixels(h, w, seed=i)) for i, (h, w) in enumerate(SIZES)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("layout", [0, 1], ids=["hf", "native"])
def test_projector_output_matches_transformers(pair, reference, layout: int, mode: str) -> None:
    enc = load_vision_encoder(pair[layout], VisionGemm(mode, "test"))
    assert enc is not None and enc.gemm.act_dtype == (
        torch.bfloat16 if mode == "bf16" else torch.float32)
    for (h, w), ours, ref in zip(SIZES, _ours(enc), reference, strict=True):
        tokens = (h // 28) * (w // 28)
        assert ours.shape == ref.shape == (tokens, 256) and ours.dtype == torch.bfloat16
        err = rel_error(ours, ref)
        assert err < TOL, f"{h}x{w}: relative error {err:.4f}"


@pytest.mark.parametrize("mode", MODES)
def test_native_and_hf_layouts_give_the_same_weights(pair, mode: str) -> None:
    # one GEMM path for both (left to choose, each load times the paths and may pick
    # another on a busy host)
    hf, native = (load_vision_encoder(p, VisionGemm(mode, "test")) for p in pair)
    assert hf is not None and native is not None
    for a, b in zip(hf.weights.layers, native.weights.layers, strict=True):
        assert torch.equal(a.qkv_proj, b.qkv_proj) and torch.equal(a.gate_up_proj, b.gate_up_proj)
        assert torch.equal(a.down_proj, b.down_proj)
    assert torch.equal(hf.weights.linear_1, native.weights.linear_1)
    img = pixels(56, 84, seed=1)
    assert torch.equal(hf(img), native(img))


def test_native_qk_on_disk_are_interleaved(pair) -> None:
    """The native file really holds the other layout: read raw, its wq differs."""
    from safetensors import safe_open

    enc = load_vision_encoder(pair[1])
    with safe_open(str(pair[1] / "consolidated.safetensors"), "pt") as f:
        raw = f.get_tensor("vision_encoder.transformer.layers.0.attention.wq.weight")
    assert raw.shape == enc.weights.layers[0].part("q_proj").shape
    assert not torch.equal(raw, enc.weights.layers[0].part("q_proj"))


def test_the_comparison_detects_rope_and_merge_mistakes(pair, reference, monkeypatch) -> None:
    enc = load_vision_encoder(pair[0])
    r = enc.tower.rope
    enc.tower.rope = Rope2D(rows=r.cols, cols=r.rows)  # row and column frequencies swapped
    assert rel_error(_ours(enc)[0], reference[0]) > 3 * TOL
    enc.tower.rope = r

    def position_major(x: torch.Tensor, gh: int, gw: int, m: int) -> torch.Tensor:
        grid = x.view(gh // m, m, gw // m, m, -1).permute(0, 2, 1, 3, 4)
        return grid.reshape((gh // m) * (gw // m), -1)  # index (ki*m + kj)*D + c: wrong

    monkeypatch.setattr("engine.vision.projector.unfold_merge", position_major)
    assert rel_error(_ours(enc)[0], reference[0]) > 3 * TOL


def test_encoder_checks_its_input(pair) -> None:
    enc = load_vision_encoder(pair[0])
    with pytest.raises(ValueError, match="multiple of 28"):
        enc(pixels(56, 42, seed=0))
    with pytest.raises(ValueError, match="fp32"):
        enc(pixels(56, 56, seed=0).to(torch.bfloat16))
    with pytest.raises(ValueError, match="RoPE table"):
        enc(pixels(140, 28, seed=0))  # 10 patches > 112 // 14 = 8
    assert enc.config.max_patches_per_side == 8


def test_gemm_choice_is_measured_or_forced(monkeypatch) -> None:
    monkeypatch.delenv("FP8SERVE_VISION_GEMM", raising=False)
    measured = choose_gemm()
    assert measured.mode in MODES and "GFLOP/s" in measured.why
    monkeypatch.setenv("FP8SERVE_VISION_GEMM", "fp32")
    assert choose_gemm().mode == "fp32"
    monkeypatch.setenv("FP8SERVE_VISION_GEMM", "fp16")
    with pytest.raises(ValueError) as info:  # it named the mode, not the variable
        choose_gemm()
    assert str(info.value) == ("FP8SERVE_VISION_GEMM='fp16': one of bf16, fp32 (unset: the "
                               "faster on this host, measured)")


def test_text_only_checkpoint_has_no_encoder(tiny_checkpoint) -> None:
    assert load_vision_encoder(tiny_checkpoint()) is None
