"""The fused tower (one q/k/v GEMM, one gate/up GEMM per layer, fewer buffers) against
the unfused reference layer (engine/vision/tower_unfused.py) on the same weights; the
fused weights hold the checkpoint's rows; the mapped pages of the copied tensors leave
the process's RSS, and read back unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from bench.rss.run import proc_memory
from engine.vision.encoder import load_vision_encoder
from engine.vision.gemm import MODES, VisionGemm
from engine.vision.mapped_pages import release_mapped_pages
from engine.vision.tower_unfused import UnfusedTower
from engine.vision.weights import FUSED
from tests.engine.vision.support import pixels, rel_error, write_pair

TOL = 0.03  # test_encoder_parity.py's bound against transformers


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_pair(tmp_path_factory.mktemp("vision-fusion"))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("layout", [0, 1], ids=["hf", "native"])
def test_fused_matches_unfused(pair, layout: int, mode: str) -> None:
    enc = load_vision_encoder(pair[layout], VisionGemm(mode, "test"))
    ref = UnfusedTower(enc.weights, enc.gemm)
    for i, (h, w) in enumerate([(112, 112), (56, 84), (28, 112)]):
        img = pixels(h, w, seed=10 + i)
        fused, gh, gw = enc.tower(img)
        unfused, rh, rw = ref(img)
        assert (gh, gw) == (rh, rw) and fused.shape == unfused.shape
        assert fused.dtype == unfused.dtype == enc.gemm.act_dtype
        assert rel_error(fused, unfused.float()) < (1e-5 if mode == "fp32" else TOL)


def test_fused_rows_are_the_checkpoints(pair) -> None:
    enc = load_vision_encoder(pair[0])
    prefix = "vision_tower.transformer.layers.1."
    names = {"q_proj": "attention.q_proj", "k_proj": "attention.k_proj",
             "v_proj": "attention.v_proj", "gate_proj": "feed_forward.gate_proj",
             "up_proj": "feed_forward.up_proj"}
    files = list(pair[0].glob("*.safetensors"))
    lw = enc.weights.layers[1]
    for parts in FUSED.values():
        for part in parts:
            name = f"{prefix}{names[part]}.weight"
            f = next(f for f in files if name in safe_open(str(f), "pt").keys())
            raw = safe_open(str(f), "pt").get_tensor(name)
            assert torch.equal(lw.part(part), raw.to(torch.bfloat16)), part
    c = enc.config
    assert lw.qkv_proj.shape == (3 * c.hidden_size, c.hidden_size)
    assert lw.gate_up_proj.shape == (2 * c.intermediate_size, c.hidden_size)


def test_released_pages_leave_rss_and_read_back(tmp_path) -> None:
    big = torch.randn(4096, 1024).to(torch.bfloat16)  # 8 MiB
    save_file({"big": big, "small": torch.ones(8, dtype=torch.bfloat16)},
              str(tmp_path / "t.safetensors"))
    f = safe_open(str(tmp_path / "t.safetensors"), "pt")
    keep, mapped = f.get_tensor("small"), f.get_tensor("big")  # one file mapping
    assert torch.equal(mapped, big)  # every page touched
    before = proc_memory()["RssFile"]
    released = release_mapped_pages(mapped)
    after = proc_memory()["RssFile"]
    assert released >= 8 * 2**20 - 2 * 4096
    assert before - after >= released * 0.9
    assert torch.equal(mapped, big) and keep.sum() == 8  # faulted back in from the file
