"""Rows by role through the HTTP API (engine/kernels/amx.py): a server on a faked AMX host
profile runs prompt rows on the tile GEMM (its portable stand-in below dispatch level amx)
and generated rows on AVX-512. Its greedy answers to concurrent requests, chunked,
preempted (a KV cache of a few blocks) and sharing a prefix through the cache, and to a
second turn that repeats the first answer, equal the same requests sent one at a time.

The checkpoint is a tiny one rewritten with tests/engine/test_rows_by_role.py's role-mix
weights, whose answers follow the roles of the K/V they attend to: on random weights the
stand-in's sums equal AVX-512's, and a role mix-up would go unseen."""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient
from safetensors.torch import load_file, save_file

from service.app import create_app
from service.settings import Settings
from tests.engine.test_rows_by_role import PROBE
from tests.ext.support import AMX_HOST, fake_hw, needs_avx512

pytestmark = needs_avx512

HIDDEN, VOCAB = 64, 131072


def _role_mix_checkpoint(src: Path, dst: Path) -> Path:
    """``src`` (one layer, hidden 64, tekken) with test_rows_by_role.role_mix_weights's
    values: every token embeds as PROBE plus a constant column 16, q/k/o-free attention
    whose v sums the PROBE columns into column 32 through o, no MLP, and a head whose
    argmax follows column 32 (scaled past tekken's first 1000 special ids)."""
    import shutil

    shutil.copytree(src, dst)
    t = load_file(str(dst / "model.safetensors"))
    fp8 = torch.float8_e4m3fn
    for name in list(t):
        if name.endswith(".weight") and t[name].dtype == fp8:
            t[name] = torch.zeros_like(t[name])
        elif name.endswith("weight_scale_inv"):
            t[name] = torch.ones_like(t[name])
        elif name.endswith("layernorm.weight") or name == "model.norm.weight":
            t[name] = torch.ones_like(t[name])
    v = torch.zeros_like(t["model.layers.0.self_attn.v_proj.weight"], dtype=torch.float32)
    v[:, :6] = 1.0
    o = torch.zeros_like(t["model.layers.0.self_attn.o_proj.weight"], dtype=torch.float32)
    o[32] = 1.0
    t["model.layers.0.self_attn.v_proj.weight"] = v.to(fp8)
    t["model.layers.0.self_attn.o_proj.weight"] = o.to(fp8)
    embed = torch.zeros(VOCAB, HIDDEN)
    embed[:, :6], embed[:, 16] = torch.tensor(PROBE), 2.0**10
    t["model.embed_tokens.weight"] = embed.to(torch.bfloat16)
    j = torch.arange(VOCAB, dtype=torch.float32)
    head = torch.zeros(VOCAB, HIDDEN)
    head[:, 32], head[:, 16] = 3340.0 * 11 * j, -(2.0**-20) * j * j
    t["lm_head.weight"] = head.to(torch.bfloat16)
    save_file(t, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


@pytest.fixture(scope="module")
def client(tiny_checkpoint, tmp_path_factory, request):
    src = tiny_checkpoint(vocab_size=VOCAB, tokenizer=True, num_layers=1, hidden_size=HIDDEN,
                          intermediate_size=160, head_dim=32)
    model = _role_mix_checkpoint(src, tmp_path_factory.mktemp("roles") / "ckpt")
    mp = pytest.MonkeyPatch()
    request.addfinalizer(mp.undo)
    mp.setattr("engine.hardware_probe.probe_hardware", lambda: fake_hw(*AMX_HOST, amx=True))
    # 6 blocks of 16 tokens for 4 requests of 40-45 tokens: preemption; 8-token chunks
    settings = Settings(model=model, served_model_name=("tiny",), max_model_len=256,
                        max_num_seqs=4, max_num_batched_tokens=8, rows_by_role="on",
                        kv_cache_gib=6 * 2 * 2 * 32 * 2 * 16 / 2**30)
    with TestClient(create_app(settings)) as c:
        kernels = c.get("/kernels").json()
        assert kernels["summary"]["generated_rows"], kernels["summary"]
        yield c


def _complete(client: TestClient, prompt: list[int], n: int = 12) -> list[int]:
    r = client.post("/v1/completions", json={
        "model": "tiny", "prompt": prompt, "max_tokens": n, "temperature": 0,
        "ignore_eos": True, "return_token_ids": True})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["token_ids"]


def test_concurrent_preempted_cached_answers_equal_each_alone(client):
    shared = list(range(2000, 2024))
    prompts = [shared + list(range(3000 + 10 * i, 3004 + 10 * i + i)) for i in range(4)]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda p: _complete(client, p), prompts))
    assert _counter(client, "fp8serve_num_preemptions_total") > 0, "must preempt"
    assert _counter(client, "fp8serve_prefix_cache_hits_total") > 0
    alone = [_complete(client, p) for p in prompts]
    assert together == alone
    assert all(len(set(a)) > 1 for a in alone)  # the answers follow the roles' mix


def _counter(client: TestClient, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in client.get("/metrics").text.splitlines()
               if line.startswith(name))


def test_the_next_turn_answers_as_it_does_alone(client):
    prompt = list(range(4000, 4030))
    first = _complete(client, prompt)
    turn2 = prompt + first + [4100, 4101]
    cached = _complete(client, turn2)  # the first turn's prompt blocks are in the cache
    client.post("/reset_prefix_cache")
    assert cached == _complete(client, turn2)
