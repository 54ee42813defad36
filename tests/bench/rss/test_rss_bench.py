"""`fp8serve bench rss`: weight bytes counted from safetensors headers (text decoder and
vision apart), /proc status parsing, one real server run on a tiny checkpoint (JSON
structure only), and on a tiny multimodal one: the vision tower is in the budget when
the server loaded it, and out of it with --limit-mm-per-prompt image=0."""

from __future__ import annotations

import argparse
import json

import pytest
from safetensors import safe_open

from bench.rss.cli import format_summary, run
from bench.rss.run import proc_memory, weight_bytes_on_disk
from tests.engine.vision.support import write_pair


def test_weight_bytes_exclude_vision(tiny_checkpoint):
    d = tiny_checkpoint(layout="hf-multimodal")
    total = text = 0
    for f in d.glob("*.safetensors"):
        with safe_open(f, "pt") as st:
            for name in st.keys():
                t = st.get_tensor(name)
                n = t.numel() * t.element_size()
                total += n
                text += 0 if ("vision_tower" in name or "multi_modal_projector" in name) else n
    got = weight_bytes_on_disk(d)
    assert got == {"all_tensors": total, "text_decoder": text, "vision": total - text}
    assert text < total  # the multimodal layout has vision tensors


def test_proc_memory_self():
    mem = proc_memory()
    assert mem["VmHWM"] >= mem["VmRSS"] > 0
    assert mem["RssAnon"] + mem["RssFile"] + mem["RssShmem"] == mem["VmRSS"]


def test_server_run(tiny_checkpoint, tmp_path):
    model = tiny_checkpoint(vocab_size=131072, tokenizer=True)
    out = tmp_path / "rss.json"
    args = argparse.Namespace(model=model, kv_cache_gib=0.05, max_num_seqs=4,
                              max_model_len=512, threads=1, requests=2, concurrency=2,
                              prompt_len=16, max_tokens=4, json=out)
    assert run(args) == 0
    res = json.loads(out.read_text())
    assert res["vision"]["images"] is False  # a text-only checkpoint
    ready, after = res["memory"]["ready"], res["memory"]["after_requests"]
    assert after["VmHWM"] >= ready["VmHWM"] >= ready["VmRSS"] > 0
    assert res["peak_rss_bytes"] == after["VmHWM"]
    assert res["requests"] == {"completed": 2, "failed": 0, "output_tokens": 8}
    assert res["budget_bytes"] == res["weight_bytes"]["text_decoder"] + int(0.05 * 2**30)
    # The server holds torch, the service and a model: more than the bare interpreter.
    assert res["peak_rss_bytes"] > res["interpreter_baseline"]["VmHWM"]
    assert "server peak RSS (VmHWM)" in format_summary(res)


@pytest.mark.parametrize("limit", [None, 0], ids=["default", "image=0"])
def test_vision_tower_counted_when_loaded(tmp_path, limit) -> None:
    model = write_pair(tmp_path / "m")[0]
    out = tmp_path / "rss.json"
    args = argparse.Namespace(model=model, kv_cache_gib=0.05, max_num_seqs=4,
                              max_model_len=512, threads=1, limit_mm_per_prompt=limit,
                              requests=2, concurrency=2, prompt_len=16, max_tokens=4, json=out)
    assert run(args) == 0
    res = json.loads(out.read_text())
    w, vision = res["weight_bytes"], res["vision"]
    assert w["vision"] > 0 and w["text_decoder"] + w["vision"] == w["all_tensors"]
    kv = int(0.05 * 2**30)
    if limit is None:
        assert vision["images"] is True and vision["vision_weights_mib"] > 0
        assert res["loaded_weight_bytes"] == w["all_tensors"]
        assert "vision tower + projector" in format_summary(res)
        assert "MiB on disk counted" in format_summary(res)
    else:
        assert vision["images"] is False and "image=0" in vision["reason"]
        assert res["loaded_weight_bytes"] == w["text_decoder"]
        assert "not loaded" in format_summary(res)
    assert res["budget_bytes"] == res["loaded_weight_bytes"] + kv
