"""Rows by role on AMX hosts (engine/kernels/amx.py): a sequence's prompt rows run the AMX
tiles, its generated rows the AVX-512 GEMM on the same packed weight, in the Python layers
and in the fused op alike; greedy answers stay the same alone, batched, chunked, preempted,
served from the prefix cache and speculated.

The host profile is faked (AMX granted); below dispatch level amx the tile GEMM runs its
portable stand-in, so everything here runs on any AVX-512 host, and on the real tiles on
an AMX one. The generated rows' AVX-512 GEMM needs AVX-512 BF16: hosts without it skip.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import ext
from engine.batch import BatchInputs, LogitsWanted, SeqChunk
from engine.kernels.base import FP8_DTYPE, Fp8Weight, ScaleKind
from engine.kernels.layer_kernel import KernelReport, LayerKernel
from engine.kernels.registry import KernelOverrides
from engine.runner import ModelRunner, generate_greedy
from engine.weights import LayerWeights, ModelWeights
from tests.engine.test_model_support import engine_config, random_weights, tiny_config
from tests.ext.support import AMX_HOST, AVX2_HOST, AVX512_HOST, fake_hw, needs_avx512

pytestmark = needs_avx512

def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(3, 320, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


AVX512_FULL = (*AVX512_HOST, *AVX2_HOST)  # an AVX-512 host without AMX


def amx_runner(weights, overrides: KernelOverrides | None = None, fuse=None,
               **kw) -> ModelRunner:
    kw.setdefault("rows_by_role", "on")  # the split whatever max_num_seqs (auto: only 1)
    runner = ModelRunner(weights, engine_config(**kw), fake_hw(*AMX_HOST, amx=True),
                         overrides or KernelOverrides())
    if fuse is not None:
        runner.model.set_fusion(fuse)
    return runner


def _layer_kernels(runner: ModelRunner) -> set[tuple[str, str | None]]:
    return {(c.kernel_id, c.generated_kernel_id) for c in runner.kernel_report.choices.values()
            if c.layer.startswith("layers.")}


@pytest.mark.parametrize("kind,pair", [
    (ScaleKind.PER_TENSOR, ("amx_w8a16", "avx512_w8a16")),
    (ScaleKind.BLOCK, ("amx_block_w8a16", "avx512_block_w8a16")),
])
def test_amx_layers_run_generated_rows_on_avx512(kind, pair) -> None:
    weights = random_weights(tiny_config(num_layers=2), seed=3, kind=kind, block=32)
    runner = amx_runner(weights)
    assert _layer_kernels(runner) == {pair}
    assert runner.kernel_report.rows_by_role()
    assert runner.model.fusion_reasons == [None, None]
    assert all(f is not None and f.by_role for f in runner.model.fused)


@pytest.mark.parametrize("overrides", [
    KernelOverrides(disabled=frozenset({"avx512_w8a16"})),
    KernelOverrides(forced="amx_w8a16"),
], ids=["avx512-disabled", "amx-forced"])
def test_every_row_on_the_tiles_when_avx512_is_disabled_or_amx_forced(overrides) -> None:
    runner = amx_runner(random_weights(tiny_config(num_layers=2), seed=3), overrides)
    assert _layer_kernels(runner) == {("amx_w8a16", None)}
    assert not runner.kernel_report.rows_by_role()
    assert all(f is not None and not f.by_role for f in runner.model.fused)


@pytest.mark.parametrize("mode,seqs,split", [
    ("auto", 1, True), ("auto", 2, False), ("auto", 16, False),
    ("on", 16, True), ("off", 1, False),
])
def test_rows_by_role_auto_splits_only_an_engine_of_one_sequence(mode, seqs, split) -> None:
    """--rows-by-role auto: the split only where the engine runs one sequence at a time
    (the AVX-512 GEMV decodes one row faster, the tiles a batch); on / off say so."""
    runner = amx_runner(random_weights(tiny_config(num_layers=2), seed=3), rows_by_role=mode,
                        max_num_seqs=seqs)
    assert runner.kernel_report.rows_by_role() is split
    assert runner.overrides.rows_by_role is split
    assert _layer_kernels(runner) == {("amx_w8a16", "avx512_w8a16" if split else None)}
    assert all(f is not None and f.by_role is split for f in runner.model.fused)


def test_rows_by_role_of_the_overrides_wins_over_the_engine_config() -> None:
    weights = random_weights(tiny_config(num_layers=2), seed=3)
    off = amx_runner(weights, KernelOverrides(rows_by_role=False), rows_by_role="on")
    on = amx_runner(weights, KernelOverrides(rows_by_role=True), rows_by_role="off")
    assert not off.kernel_report.rows_by_role() and on.kernel_report.rows_by_role()


def test_avx512_host_has_one_kernel_for_every_row() -> None:
    runner = ModelRunner(random_weights(tiny_config(num_layers=2), seed=3), engine_config(),
                         fake_hw(*AVX512_FULL), KernelOverrides())
    assert _layer_kernels(runner) == {("avx512_w8a16", None)}


# One row that tells the two accumulation orders apart: over the K pairs (0, 1), (2, 3),
# (4, 5) with unit weights, c = C, then C + A + C, then - A, where A = 2^24 C. The
# stand-in's tile chain adds a pair's even product first (the SDM's TDPBF16PS), the
# AVX-512 GEMM's VDPBF16PS the odd one: C + A loses half of C where 2 C + A does not, so
# the sums differ (0 or 2 ulp(C)), whatever C's scale (kept through the norms: powers of
# two). The real tiles' internal order is the hardware's own.
PROBE = (1.0, 0.0, 2.0**24, 1.0, -(2.0**24), 0.0)
STANDIN = ext.isa() != "amx"  # the tile GEMM runs its portable stand-in here


def test_layer_kernel_runs_each_row_on_its_roles_kernel() -> None:
    """Row i of a mixed call equals row i of the prompt kernel alone (prompt rows) or of
    the AVX-512 kernel alone (generated rows)."""
    w = Fp8Weight(torch.ones(96, 160).to(FP8_DTYPE), torch.ones(96), ScaleKind.PER_CHANNEL)
    report = KernelReport()
    layer = LayerKernel("l", w, fake_hw(*AMX_HOST, amx=True), KernelOverrides(), report)
    avx = LayerKernel("a", w, fake_hw(*AVX512_HOST), KernelOverrides(), report)
    assert (layer.kernel.id, avx.kernel.id) == ("amx_w8a16", "avx512_w8a16")
    x = torch.zeros(9, 160)
    x[:, :6] = torch.tensor(PROBE)
    x = x.to(torch.bfloat16)
    gen = torch.tensor([0, 1, 1, 0, 0, 1, 0, 1, 0], dtype=torch.uint8)
    y = layer(x, gen)
    g, p = gen.bool(), ~gen.bool()
    assert torch.equal(y[g], avx(x[g]))
    assert torch.equal(y[p], layer(x[p]))
    assert torch.equal(layer(x, torch.zeros(9, dtype=torch.uint8)), layer(x))
    if STANDIN:  # the two kernels' sums differ on this row: the checks above can fail
        assert not torch.equal(layer(x[:1]), avx(x[:1]))


def order_probe_weights() -> ModelWeights:
    """One layer whose output row shows which GEMM ran it: every token embeds as PROBE;
    q/k/v and o are zero (attention adds nothing); gate sums the PROBE columns (0 or
    2 ulp), up reads column 0, and down writes silu(gate) * up into columns 32.., where
    the residual is zero. Per-channel scales of one; norms of one."""
    c = tiny_config(num_layers=1)
    h, i = c.hidden_size, c.intermediate_size

    def fp8(w: torch.Tensor) -> Fp8Weight:
        return Fp8Weight(w.to(FP8_DTYPE).contiguous(), torch.ones(w.shape[0]),
                         ScaleKind.PER_CHANNEL)

    gate, up, down = torch.zeros(i, h), torch.zeros(i, h), torch.zeros(h, i)
    gate[:, :6], up[:, 0], down[32:] = 1.0, 1.0, 1.0
    ones = torch.ones(h, dtype=torch.bfloat16)
    layer = LayerWeights(ones, ones, fp8(torch.zeros(c.q_size, h)),
                         fp8(torch.zeros(c.kv_size, h)), fp8(torch.zeros(c.kv_size, h)),
                         fp8(torch.zeros(h, c.q_size)), fp8(gate), fp8(up), fp8(down))
    embed = torch.zeros(c.vocab_size, h)
    embed[:, :6] = torch.tensor(PROBE)
    head = torch.randn(c.vocab_size, h, generator=torch.Generator().manual_seed(1))
    return ModelWeights(c, embed.to(torch.bfloat16), (layer,), ones, head.to(torch.bfloat16))


def role_mix_weights() -> ModelWeights:
    """One layer whose answers follow the roles of the K/V they attend to: every token
    embeds as PROBE (plus a constant column 16); q and k are zero, so each row attends
    evenly to its context; v sums the PROBE columns (2 ulp computed as a prompt row by the
    stand-in, 1 ulp as a generated row by AVX-512); o writes the mean into column 32; the
    head scores token j as j * c1 * h[32] - j^2 * c2 * h[16], whose argmax follows h[32]:
    202 when every position was a prompt row, 101 when every one was generated, between
    for a mix. A row computed in the wrong role, or a cached block read in the other role,
    moves it."""
    c = tiny_config(num_layers=1)
    h, i = c.hidden_size, c.intermediate_size

    def fp8(w: torch.Tensor) -> Fp8Weight:
        return Fp8Weight(w.to(FP8_DTYPE).contiguous(), torch.ones(w.shape[0]),
                         ScaleKind.PER_CHANNEL)

    def zero(n: int, k: int) -> Fp8Weight:
        return fp8(torch.zeros(n, k))

    v, o = torch.zeros(c.kv_size, h), torch.zeros(h, c.q_size)
    v[:, :6], o[32] = 1.0, 1.0
    ones = torch.ones(h, dtype=torch.bfloat16)
    layer = LayerWeights(ones, ones, zero(c.q_size, h), zero(c.kv_size, h), fp8(v), fp8(o),
                         zero(i, h), zero(i, h), zero(h, i))
    embed = torch.zeros(c.vocab_size, h)
    embed[:, :6], embed[:, 16] = torch.tensor(PROBE), 2.0**10
    j = torch.arange(c.vocab_size, dtype=torch.float32)
    head = torch.zeros(c.vocab_size, h)
    head[:, 32], head[:, 16] = 3340.0 * j, -(2.0**-20) * j * j
    return ModelWeights(c, embed.to(torch.bfloat16), (layer,), ones, head.to(torch.bfloat16))


def test_the_role_mix_model_tells_roles_apart() -> None:
    weights = role_mix_weights()
    tiles = amx_runner(weights, KernelOverrides(disabled=frozenset({"avx512_w8a16"})))
    avx = ModelRunner(weights, engine_config(), fake_hw(*AVX512_FULL),
                      KernelOverrides())
    prompt = _ids(12, 1)
    all_tiles = generate_greedy(tiles, prompt, 4)
    assert generate_greedy(avx, prompt, 4) == [101] * 4
    mixed = generate_greedy(amx_runner(weights), prompt, 12)
    assert mixed[0] == all_tiles[0]  # the first token is read from prompt rows
    if STANDIN:  # the real tiles' sums on PROBE are the hardware's own
        assert all_tiles == [202] * 4
        assert 101 < mixed[-1] < 202 and mixed == sorted(mixed, reverse=True)


@pytest.mark.parametrize("fuse", [None, False], ids=["fused", "python"])
@pytest.mark.parametrize("chunk_len", [6, 40], ids=["team-path", "per-op-path"])
def test_a_mixed_step_runs_prompt_rows_on_the_tiles_and_generated_rows_on_avx512(
        fuse, chunk_len) -> None:
    """One step: a prompt chunk of sequence 0 and a decode row of sequence 1 (36 or 41
    rows: the fused op's team path or its per-op path). The prompt rows' hidden states
    equal the step's with every row a prompt row (all tiles); the generated row's equal a
    runner's on an AVX-512 host profile."""
    weights = order_probe_weights()
    amx = amx_runner(weights, fuse=fuse, kv_block_size=16)
    avx = ModelRunner(weights, engine_config(kv_block_size=16),
                      fake_hw(*AVX512_FULL), KernelOverrides())
    if fuse is not None:
        avx.model.set_fusion(fuse)
    assert amx.model.fusion_reasons == [None if fuse is None else "fusion disabled"]
    t0, t1 = (0, 1, 2, 3), (4, 5)
    step = (SeqChunk(0, tuple(_ids(chunk_len, 3)), 5, t0, LogitsWanted.ALL,
                     prompt_len=5 + chunk_len),
            SeqChunk(1, (7,), 11, t1, prompt_len=11))
    mixed = amx.hidden(BatchInputs(step))
    tiles = amx.hidden(BatchInputs((step[0], replace(step[1], prompt_len=None))))
    avx512 = avx.hidden(BatchInputs(step))
    assert torch.equal(mixed[:chunk_len], tiles[:chunk_len])
    assert torch.equal(mixed[chunk_len], avx512[chunk_len])
    if STANDIN:  # the row's role changed its kernel, and the kernels' sums differ here
        assert not torch.equal(mixed[chunk_len], tiles[chunk_len])
        assert not torch.equal(mixed[0], avx512[0])


def test_engine_answers_equal_each_alone_with_preemption_prefix_cache_and_drafts() -> None:
    """Greedy requests through the engine on the split kernels, chunked (8-token budget),
    preempted (14 KV blocks), sharing a prefix through the cache and verifying drafts
    from predicted outputs: each answer equals generate_greedy alone on a fresh runner; a
    second turn that repeats the first's answer in its prompt answers as it does alone
    too. Where the tile GEMM runs its stand-in, whose sums on random data equal AVX-512's,
    the model is role_mix_weights (answers follow the roles); on the real tiles, random
    weights."""
    from engine.config import EngineConfig
    from engine.engine import Engine, EngineObserver
    from engine.model.kv_store import KV_DTYPE, bytes_per_block
    from engine.sampler import Sampler
    from engine.sampling_params import SamplingParams
    from tests.engine.fake_runner import FakeDetokenizer, FakeTokenizer
    from tests.engine.test_engine import collect, run_all

    weights = role_mix_weights() if STANDIN else random_weights(tiny_config(), seed=8)
    gib = 14 * bytes_per_block(weights.config, 4, KV_DTYPE) / 2**30
    runner = amx_runner(weights, kv_cache_gib=gib)
    assert runner.num_kv_blocks == 14 and runner.kernel_report.rows_by_role()
    seen = {"preempted": 0, "drafted": 0, "hits": 0}

    class Observer(EngineObserver):
        def on_preempted(self, n: int) -> None:
            seen["preempted"] += n

        def on_spec_decode(self, num_draft_tokens, num_accepted_tokens, grammar="none"):
            seen["drafted"] += num_draft_tokens

        def on_prefix_cache(self, num_queried_tokens: int, num_hit_tokens: int) -> None:
            seen["hits"] += num_hit_tokens

    cfg = EngineConfig(model_dir=".", max_num_seqs=4, max_model_len=64,
                       max_num_batched_tokens=8)
    eng = Engine(runner, FakeTokenizer(), cfg, detokenizer=FakeDetokenizer,
                 sampler=Sampler(()), observer=Observer())
    assert eng.scheduler.prefix_cache is not None and eng.scheduler.prefix_cache.by_role
    from tests.engine.spec.test_spec_engine import FixedShare

    eng.spec.cost = FixedShare(0.0)  # draft every step: a tiny model's step times say nothing
    shared = _ids(12, 9)
    prompts = [shared + _ids(3 + i, 10 + i) for i in range(4)]
    alone = [generate_greedy(amx_runner(weights), p, 10) for p in prompts]
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    # predicted outputs: drafts right for a while, then wrong (accepted and rejected rows)
    outs = [collect(eng, f"r{i}", p, params, prediction=tuple(a[:4 + i] + [1, 2, 3]))
            for i, (p, a) in enumerate(zip(prompts, alone, strict=True))]
    run_all(eng)
    assert seen["preempted"] > 0 and seen["drafted"] > 0 and seen["hits"] > 0
    answers = [[t for x in o for t in x.token_ids] for o in outs]
    assert answers == alone
    # the next turn, on an engine whose cache keeps every block: its prompt holds the
    # first answer, whose blocks were computed as generated rows
    eng = Engine(amx_runner(weights), FakeTokenizer(), cfg, detokenizer=FakeDetokenizer,
                 sampler=Sampler(()), observer=Observer())
    seen["hits"] = 0
    first = collect(eng, "turn1", prompts[0], params)
    run_all(eng)
    turn2 = prompts[0] + [t for x in first for t in x.token_ids] + [5, 6]
    second = collect(eng, "turn2", turn2, params)
    run_all(eng)
    assert seen["hits"] >= len(prompts[0]) // 4 * 4  # the first turn's prompt blocks
    assert [t for x in second for t in x.token_ids] == generate_greedy(amx_runner(weights),
                                                                       turn2, 10)


def test_operators_see_the_generated_rows_kernel() -> None:
    """`fp8serve kernels`, GET /kernels and the metrics name the generated rows' kernel."""
    from cli.kernels import format_report
    from engine.kernels.report import build_kernel_report
    from tests.service.test_kernel_metrics import _scrape

    runner = amx_runner(random_weights(tiny_config(num_layers=2), seed=3))
    rep = build_kernel_report(fake_hw(*AMX_HOST, amx=True), KernelOverrides(),
                              runner.kernel_report)
    assert rep["summary"]["generated_rows"] == [
        {"kernel": "amx_w8a16", "generated_kernel": "avx512_w8a16", "layers": 8}]
    table = next(t for t in rep["tables"] if t["name"] == "cpu/per_tensor")
    assert table["kernels"][0]["kernel_id"] == "amx_w8a16"
    assert table["kernels"][0]["generated_rows_kernel"] == "avx512_w8a16"
    text = format_report(rep)
    assert "-> amx_w8a16 (generated rows: avx512_w8a16)" in text
    assert "8 layers on amx_w8a16 run generated rows (decode, drafts) on avx512_w8a16" in text
    assert ('fp8serve_layer_group_generated_rows_kernel{kernel="avx512_w8a16",'
            'layer_group="qkv_proj"} 2.0') in _scrape(runner.kernel_report)
    off = build_kernel_report(fake_hw(*AMX_HOST, amx=True),
                              KernelOverrides(disabled=frozenset({"avx512_w8a16"})))
    table = next(t for t in off["tables"] if t["name"] == "cpu/per_tensor")
    assert table["kernels"][0]["generated_rows_kernel"] is None


def test_the_op_refuses_row_roles_it_cannot_honour() -> None:
    """generated_rows of the wrong length, or for a layer on the AVX-512 GEMM, is an error
    naming the argument, not a silent misread."""
    from engine.model.attention import build_metadata

    weights = random_weights(tiny_config(num_layers=1), seed=3)
    amx = amx_runner(weights)
    avx = ModelRunner(weights, engine_config(), fake_hw(*AVX512_FULL),
                      KernelOverrides())
    step = BatchInputs((SeqChunk(0, (1, 2, 3), 0, (0,), prompt_len=2),))
    meta = build_metadata(step, amx.block_size, amx.kv.num_slots, spans=False)
    assert meta.generated_rows is not None and meta.generated_rows.tolist() == [0, 0, 1]
    h = weights.embed_tokens[:3].contiguous()
    fused = amx.model.fused[0]
    assert fused is not None and fused.by_role
    short = replace(meta, generated_rows=torch.ones(2, dtype=torch.uint8))
    with pytest.raises(RuntimeError, match=r"generated_rows must be contiguous uint8 or bool "
                                           r"\[T = 3\]"):
        fused(h, amx.model.rope, short, amx.kv.layer(0))
    on_avx = avx.model.fused[0]
    assert on_avx is not None and not on_avx.by_role
    with pytest.raises(RuntimeError, match="generated_rows applies to layers on the AMX GEMM"):
        replace(on_avx, by_role=True)(h, avx.model.rope, meta, avx.kv.layer(0))


def test_a_layer_whose_linears_differ_in_the_generated_rows_kernel_does_not_fuse() -> None:
    from engine.model.decode_step import fusion_reason

    runner = amx_runner(random_weights(tiny_config(num_layers=2), seed=3))
    layer = runner.model.layers[1]
    layer.o_proj.kernel.generated_kernel = None
    assert "generated rows run" in (fusion_reason(layer) or "")
    assert fusion_reason(runner.model.layers[0]) is None


def test_a_failing_generated_rows_kernel_falls_back_to_the_layers_kernel(monkeypatch) -> None:
    """The generated rows' kernel raising on its first call: the layer logs and records a
    runtime fallback, runs those rows (and every later one) on its own kernel, and the
    report no longer names a generated rows' kernel."""
    w = Fp8Weight(torch.ones(64, 96).to(FP8_DTYPE), torch.ones(64), ScaleKind.PER_CHANNEL)
    report = KernelReport()
    layer = LayerKernel("layers.0.mlp.down_proj", w, fake_hw(*AMX_HOST, amx=True),
                        KernelOverrides(), report)
    gen = layer.generated_kernel
    assert gen is not None and report.rows_by_role()

    def boom(*a, **k):
        raise RuntimeError("no such shape")

    monkeypatch.setattr(gen, "apply", boom)
    x = torch.randn(4, 96, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    roles = torch.tensor([0, 1, 0, 1], dtype=torch.uint8)
    assert torch.equal(layer(x, roles), layer(x))
    assert layer.generated_kernel is None and not report.rows_by_role()
    (fb,) = report.fallbacks
    assert (fb.from_kernel, fb.to_kernel, fb.stage) == (
        "avx512_w8a16", "amx_w8a16", "apply (generated rows)")
    choice = report.choices["layers.0.mlp.down_proj"]
    assert choice.kernel_id == "amx_w8a16" and choice.generated_kernel_id is None


def test_only_decoder_layers_key_the_prefix_cache_by_role() -> None:
    """An FP8 lm_head's generated rows on AVX-512 change no K/V: the cache keeps sharing
    blocks by tokens alone."""
    from engine.kernels.layer_kernel import LayerChoice

    report = KernelReport()
    report.record_choice(LayerChoice("lm_head", "amx_w8a16", "cpu", "per_tensor", 8, 8, (),
                                     generated_kernel_id="avx512_w8a16"))
    assert not report.rows_by_role()
    report.record_choice(LayerChoice("layers.0.self_attn.o_proj", "amx_w8a16", "cpu",
                                     "per_tensor", 8, 8, (),
                                     generated_kernel_id="avx512_w8a16"))
    assert report.rows_by_role()


def test_rows_by_role_on_where_nothing_splits_says_so(caplog) -> None:
    """--rows-by-role on where no layer splits (no AMX, or a forced kernel) is a warning,
    not a silent no-op."""
    weights = random_weights(tiny_config(num_layers=2), seed=3)
    with caplog.at_level("WARNING", logger="engine.runner"):
        ModelRunner(weights, engine_config(rows_by_role="on"), fake_hw(*AVX512_FULL),
                    KernelOverrides())
    assert "rows_by_role on: no layer runs its generated rows on another kernel" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="engine.runner"):
        amx_runner(weights)
    assert "rows_by_role on" not in caplog.text
