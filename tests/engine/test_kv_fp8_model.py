"""The model on an FP8 KV cache (--kv-cache-dtype fp8), tiny random checkpoints.

The oracle: transformers' fp32 Ministral3 (as in test_model_parity.py) with its K (after
RoPE) and V rounded through e4m3 with one scale per (token, KV head), as the cache stores
them, over every position of a 40-token prompt. Rounding to e4m3 is a step function with
steps of 2^-4 relative, so our bf16 activations (2^-9 relative per op) flip some elements
to the neighbouring e4m3 value: against this oracle our fp8 path measured 0.063-0.089
relative logit error over seeds 3-6, and transformers itself run in bf16 (same rounding)
0.070-0.089, max logprob error 0.21-0.32 nats for both. So we bound ours by 0.12 and by
1.5x transformers' bf16 figure (logprobs: 0.4 nats and 1.5x), as test_model_parity does
for bf16 K/V. Against the exact-K/V oracle the e4m3 cost itself is bounded separately.

Exactness: the stored bytes of a token depend on that token's K/V only (per (token, KV
head) scales), so logits are bitwise the same chunked or not, alone or batched.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.batch import BatchInputs, LogitsWanted, SeqChunk
from engine.kv.block_hash import root_hash
from engine.loader import load_weights
from engine.model.kv_store import KV_FP8, bytes_per_block
from tests.engine.kv_layout import slots_of
from tests.engine.test_model_parity import PROMPT
from tests.engine.test_model_support import (
    hf_logits,
    hf_reference,
    logit_error,
    make_runner,
    random_weights,
    tiny_config,
)

TOL = 0.12
TOL_LOGPROB = 0.4
TOL_FP8_VS_EXACT = 0.2


def _run(runner, chunks) -> torch.Tensor:
    return runner.run(BatchInputs(tuple(chunks)))


def _fake_quant(x: torch.Tensor) -> torch.Tensor:
    """[B, Hkv, T, D] -> the same rounded through e4m3 with one scale per (token, head)."""
    s = (x.abs().amax(-1, keepdim=True) / 448).clamp_min(1e-30)
    return ((x / s).clamp(-448, 448).to(KV_FP8).to(x.dtype) * s).to(x.dtype)


@pytest.fixture()
def hf_fp8_kv(monkeypatch):
    """transformers' eager attention with its K (after RoPE) and V rounded to e4m3 per
    (token, KV head), as the fp8 cache stores them: the oracle of the fp8 path."""
    from transformers.models.ministral3 import modeling_ministral3 as m

    eager = m.eager_attention_forward

    def quantized(module, query, key, value, *args, **kw):
        return eager(module, query, _fake_quant(key), _fake_quant(value), *args, **kw)

    monkeypatch.setattr(m, "eager_attention_forward", quantized)


def test_fp8_kv_logits_and_logprobs_match_the_e4m3_oracle(hf_fp8_kv) -> None:
    weights = random_weights(tiny_config(), seed=3)
    model = hf_reference(weights)
    ref = hf_logits(model, PROMPT)  # fp32, K/V through e4m3
    runner = make_runner(weights, kv_cache_dtype="fp8")
    assert runner.kv_dtype == "float8_e4m3fn" and runner.kv.kv.dtype == KV_FP8
    assert all(r is not None for r in runner.model.fusion_reasons)  # fused ops: bf16 K/V
    chunk = SeqChunk(0, tuple(PROMPT), 0, tuple(range(10, 20)), LogitsWanted.ALL)
    ours = _run(runner, [chunk])
    hf_bf16 = hf_logits(model.to(torch.bfloat16), PROMPT)  # its own bf16, same rounding

    def logprob_error(x: torch.Tensor) -> float:
        return float((x.log_softmax(-1) - ref.log_softmax(-1)).abs().max())

    err, err_hf = logit_error(ours, ref), logit_error(hf_bf16, ref)
    assert err < TOL and err <= 1.5 * err_hf, f"fp8 KV {err:.4f}, transformers bf16 {err_hf:.4f}"
    lp, lp_hf = logprob_error(ours), logprob_error(hf_bf16)
    assert lp < TOL_LOGPROB and lp <= 1.5 * lp_hf, (lp, lp_hf)
    assert (ours.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.9


def test_fp8_kv_cost_against_bf16_kv_is_bounded() -> None:
    """What e4m3 K/V cost, against the fp32 oracle with exact K/V (random tiny models
    have peaky attention, so this is a worst case; the demo model's figure is in the
    README): measured 0.085-0.15 relative logit error over seeds 3-6 (bf16 KV 0.017-0.029)."""
    weights = random_weights(tiny_config(), seed=3)
    ref = hf_logits(hf_reference(weights), PROMPT)
    ours = _run(make_runner(weights, kv_cache_dtype="fp8"),
                [SeqChunk(0, tuple(PROMPT), 0, tuple(range(10, 20)), LogitsWanted.ALL)])
    assert logit_error(ours, ref) < TOL_FP8_VS_EXACT
    assert (ours.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.75


@pytest.mark.parametrize("seed", [3, 4, 5, 6, 7])
def test_fp8_kv_against_bf16_kv_logprobs(seed: int) -> None:
    """fp8 KV against our own bf16 KV, same model, every position of the prompt: measured
    over seeds 3-7 KL(bf16 || fp8) mean 1.3e-3-1.7e-3, max 3.4e-3-1.0e-2, max |logprob
    difference| 0.27-0.51 nats, top-1 agreement 0.85-0.95 (random tiny models have peaky
    attention: a worst case; the demo model's figures are in the README). Against the
    exact-K/V fp32 oracle the bf16 cache is the closer (measured 0.017-0.029 vs 0.067-0.15
    relative logit error)."""
    weights = random_weights(tiny_config(), seed=seed)
    chunk = SeqChunk(0, tuple(PROMPT), 0, tuple(range(10, 20)), LogitsWanted.ALL)
    bf16 = _run(make_runner(weights), [chunk]).float()
    fp8 = _run(make_runner(weights, kv_cache_dtype="fp8"), [chunk]).float()
    lp, lq = bf16.log_softmax(-1), fp8.log_softmax(-1)
    kl = (lp.exp() * (lp - lq)).sum(-1)
    assert float(kl.mean()) < 4e-3 and float(kl.max()) < 3e-2, (kl.mean(), kl.max())
    assert float((lp - lq).abs().max()) < 1.0
    assert (bf16.argmax(-1) == fp8.argmax(-1)).float().mean() >= 0.8
    ref = hf_logits(hf_reference(weights), PROMPT)
    assert logit_error(bf16, ref) < 0.5 * TOL_FP8_VS_EXACT
    assert logit_error(bf16, ref) < logit_error(fp8, ref)  # the e4m3 cost is the larger


def test_fp8_kv_chunked_and_batched_give_the_same_bits() -> None:
    weights = random_weights(tiny_config(), seed=4)
    runner = make_runner(weights, kv_cache_dtype="fp8")
    blocks = tuple(range(10, 21))
    whole = _run(runner, [SeqChunk(0, tuple(PROMPT), 0, blocks, LogitsWanted.ALL)])
    parts = [_run(runner, [SeqChunk(0, tuple(PROMPT[a:b]), a, blocks, LogitsWanted.ALL)])
             for a, b in ((0, 5), (5, 23), (23, 40))]
    assert torch.equal(torch.cat(parts), whole)
    other = tuple(range(30, 41))  # a second sequence, prefilled, then decoded beside it
    _run(runner, [SeqChunk(1, tuple(PROMPT[::-1]), 0, other, LogitsWanted.LAST)])
    alone = _run(runner, [SeqChunk(0, (7,), 40, blocks)])
    both = _run(runner, [SeqChunk(1, (9,), 40, other), SeqChunk(0, (7,), 40, blocks)])
    assert torch.equal(both[1], alone[0])


def test_fp8_reference_sdpa_path_agrees_with_the_op() -> None:
    weights = random_weights(tiny_config(), seed=5)
    op = make_runner(weights, kv_cache_dtype="fp8")
    sdpa = make_runner(weights, kv_cache_dtype="fp8")
    sdpa.model.attention.use_ext = False
    chunk = SeqChunk(0, tuple(PROMPT), 0, tuple(range(10, 20)), LogitsWanted.ALL)
    a, b = _run(op, [chunk]), _run(sdpa, [chunk])
    # layer 0 sees the same K/V on both paths: the same quantizer stores the same bytes
    # (later layers' inputs differ by the attention's rounding)
    assert torch.equal(op.kv.kv[0].view(torch.uint8), sdpa.kv.kv[0].view(torch.uint8))
    assert torch.equal(op.kv.scales[0], sdpa.kv.scales[0])
    # SDPA dequantizes to bf16 before attending: its 2^-9 roundings flip some later-layer
    # K/V elements to the neighbouring e4m3 value, as against the oracle (measured 0.055)
    assert logit_error(a, b) < TOL


def test_fp8_holds_twice_the_tokens_per_gib() -> None:
    weights = random_weights(tiny_config(), seed=6)
    c = weights.config
    bf16, fp8 = (make_runner(weights, kv_cache_dtype=d, kv_cache_gib=0.02) for d in
                 ("auto", "fp8"))
    per_row = c.head_dim + 4  # e4m3 bytes + one fp32 scale per (token, layer, K/V, head)
    assert bytes_per_block(c, 4, KV_FP8) == 2 * c.num_layers * c.num_kv_heads * 4 * per_row
    assert fp8.kv_bytes_per_block == bytes_per_block(c, 4, KV_FP8)
    want = int(0.02 * 2**30) // bytes_per_block(c, 4, KV_FP8)
    assert fp8.num_kv_blocks == want
    ratio = fp8.num_kv_blocks / bf16.num_kv_blocks
    assert abs(ratio - 2 * c.head_dim / per_row) < 0.01  # 2x less the scales' share
    assert fp8.kv.nbytes <= 0.02 * 2**30
    assert root_hash(fp8.kv_dtype) != root_hash(bf16.kv_dtype)  # no prefix sharing across


def _with_kv_scales(src: Path, dst: Path, scales: list[tuple[float, float]]) -> Path:
    """A copy of the single-file checkpoint src with HF self_attn.k_scale / v_scale."""
    dst.mkdir()
    for f in src.iterdir():
        if f.name != "model.safetensors":
            (dst / f.name).write_bytes(f.read_bytes())
    tensors = load_file(src / "model.safetensors")
    norm = next(n for n in tensors if n.endswith("layers.0.input_layernorm.weight"))
    prefix = norm.removesuffix("layers.0.input_layernorm.weight")
    for i, (ks, vs) in enumerate(scales):
        tensors[f"{prefix}layers.{i}.self_attn.k_scale"] = torch.tensor(ks)
        tensors[f"{prefix}layers.{i}.self_attn.v_scale"] = torch.tensor(vs)
    save_file(tensors, dst / "model.safetensors")
    return dst


def test_checkpoint_static_kv_scales_are_honoured(tiny_checkpoint, tmp_path: Path) -> None:
    src = tiny_checkpoint()
    if not (src / "model.safetensors").exists():
        pytest.skip("tiny checkpoint is sharded")
    layers = load_weights(src, progress=False).config.num_layers
    scales = [(0.02 * (i + 1), 0.01 * (i + 1)) for i in range(layers)]
    weights = load_weights(_with_kv_scales(src, tmp_path / "ckpt", scales), progress=False)
    assert weights.kv_scales == tuple((float(torch.tensor(k)), float(torch.tensor(v)))
                                      for k, v in scales)
    runner = make_runner(weights, kv_cache_dtype="fp8")
    _run(runner, [SeqChunk(0, tuple(PROMPT[:9]), 0, (3, 4, 5), LogitsWanted.LAST)])
    used = torch.arange(3 * 4, 3 * 4 + 9)
    for i, (ks, vs) in enumerate(weights.kv_scales):
        k_scale, v_scale = runner.kv.layer(i).k_scale, runner.kv.layer(i).v_scale
        k_scale, v_scale = slots_of(k_scale), slots_of(v_scale)  # [slots, Hkv]
        assert bool((k_scale[used] == ks).all()) and bool((v_scale[used] == vs).all())
        assert bool((k_scale[:12] == 1.0).all())  # blocks 0 .. 2: never written
    assert make_runner(weights).kv.scales is None  # a bf16 cache ignores them


def test_a_partial_set_of_kv_scales_names_the_file_and_tensor(tiny_checkpoint,
                                                              tmp_path: Path) -> None:
    from engine.checkpoint.errors import CheckpointError

    src = tiny_checkpoint()
    layers = load_weights(src, progress=False).config.num_layers
    d = _with_kv_scales(src, tmp_path / "ckpt", [(0.5, 0.5)] * layers)
    tensors = load_file(d / "model.safetensors")
    gone = next(n for n in tensors if n.endswith(f"layers.{layers - 1}.self_attn.v_scale"))
    del tensors[gone]
    save_file(tensors, d / "model.safetensors")
    with pytest.raises(CheckpointError) as info:
        load_weights(d, progress=False)
    assert str(info.value).startswith(f"model.safetensors: tensor '{gone}' missing")


def test_fp8_engine_with_preemption_and_prefix_cache_matches_each_alone() -> None:
    """Four greedy requests sharing a 12-token prefix through the engine on an fp8 cache
    too small for all of them (preemption, recompute) with the prefix cache on: each
    output equals that request decoded alone on a fresh fp8 runner."""
    from engine.config import EngineConfig
    from engine.engine import Engine, EngineObserver
    from engine.runner import generate_greedy
    from engine.sampler import Sampler
    from engine.sampling_params import SamplingParams
    from tests.engine.fake_runner import FakeDetokenizer, FakeTokenizer
    from tests.engine.test_engine import collect, run_all

    weights = random_weights(tiny_config(), seed=8)
    gib = 14 * bytes_per_block(weights.config, 4, KV_FP8) / 2**30  # 14 blocks of 4 tokens
    runner = make_runner(weights, kv_cache_dtype="fp8", kv_cache_gib=gib)
    assert runner.num_kv_blocks == 14
    preempted: list[int] = []

    class Observer(EngineObserver):
        def on_preempted(self, n: int) -> None:
            preempted.append(n)

    cfg = EngineConfig(model_dir=".", max_num_seqs=4, max_model_len=64,
                       max_num_batched_tokens=8)
    eng = Engine(runner, FakeTokenizer(), cfg, detokenizer=FakeDetokenizer,
                 sampler=Sampler(()), observer=Observer())
    prompts = [PROMPT[:12] + PROMPT[12 + 3 * i:16 + 3 * i] for i in range(4)]
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    outs = [collect(eng, f"r{i}", p, params) for i, p in enumerate(prompts)]
    run_all(eng)
    assert sum(preempted) > 0  # the KV pressure forced preemption and recompute
    assert eng.scheduler.prefix_cache is not None
    for p, o in zip(prompts, outs, strict=True):
        alone = generate_greedy(make_runner(weights, kv_cache_dtype="fp8"), p, 10)
        assert [x.token_ids[0] for x in o] == alone


def test_fp8_kv_greedy_agreement_over_long_generations_on_the_demo_model() -> None:
    """The demo model (SmolLM2-135M, 3 KV heads x 64), its four chat prompts, 32 greedy
    tokens per prompt on each cache alone, then KL over every position of prompt + the
    bf16 continuation (bench/kv_cache/run.py). Measured on the AVX2 development
    host with 64 tokens: leading agreement 25, 64, 13, 1 (mean 25.8), KL(bf16 || fp8) mean
    8.4e-3, max 5.6e-2, top-1 0.953 over 428 positions (with 128 tokens, README: 25, 93,
    13, 1; KL mean 7.9e-3, top-1 0.958); those are the portable attention kernel's. With
    the AVX2 kernel (attention_avx2.cpp), 32 tokens: leading agreement 11, 32, 32, 32, KL
    mean 1.3e-2, max 0.56 (one position: bf16 gives its top token 0.49, fp8 0.26), top-1
    0.98 over 300 positions; the portable kernel on the same 32 tokens: 25, 32, 13, 1, KL
    mean 8.9e-3, max 5.6e-2, top-1 0.947. The e4m3 quantizer turns a kernel's ulp-level
    rounding into whole e4m3 steps of the stored K/V (on the same token ids the two
    kernels' bf16 logits differ by KL 1.4e-3 mean, their fp8 ones by 6.0e-3), so the max
    over a few hundred positions moves 10x between kernels; the bounds leave room for that
    and for other kernels' rounding (AVX-512 hosts sum in another order)."""
    from bench.kv_cache.run import (
        KvCacheBenchConfig,
        accuracy,
        bench_prompts,
        load_runner,
        stores,
    )
    from engine.demo_model import ensure_demo_model

    n = 32
    cfg = KvCacheBenchConfig(model_dir=ensure_demo_model(), greedy_tokens=n, num_prompts=4)
    runner = load_runner(cfg, 512 + n + 64)
    acc = accuracy(runner, stores(runner), bench_prompts(cfg, runner.config.vocab_size), n)
    assert acc["rows"] > 4 * n
    assert acc["greedy_leading_mean"] >= 8, acc["greedy"]
    assert sum(g["leading_agree"] >= 1 for g in acc["greedy"]) >= 3
    kl = (acc["kl_mean"], acc["kl_p99"], acc["kl_max"])
    assert acc["kl_mean"] < 0.03 and acc["kl_p99"] < 0.5 and acc["kl_max"] < 3.0, kl
    assert acc["top1"] >= 0.9
