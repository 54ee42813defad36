"""The fused decoder layer (engine/model/decode_step.py, ext/csrc/decode_layer.cpp) against
the Python layer it replaces, once per FP8 kernel family the host can execute: the
AVX-512 kernels (AVX-512 hosts) and the AVX2 kernel (AVX2 hosts and up). The elementwise
ops and attention run at the host's dispatch ISA either way, so on an AVX-512 host the
AVX2 case fuses the AVX2 GEMM with the AVX-512 norms; test_avx2_families_forced_on_bigger_hosts
runs the AVX2 cases there again under FP8SERVE_ISA=avx2 (the AVX2 norms and attention).

Tolerance for one layer: both sides run the same FP8 GEMMs on the same packed weights;
they differ only in fp32 summation order inside RMSNorm and in RoPE's fp32 rounding, each
at most one bf16 ulp of an intermediate, which the following GEMM can carry into a one-
or two-ulp difference of the output (2^-7 relative); a wrong head, position, slot or
weight gives errors of order 1. Whole-model logits use the runner tests' 2e-2 bound.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from engine.batch import BatchInputs, LogitsWanted, SeqChunk
from engine.kernels.avx512 import GEMV_MAX_M
from engine.kernels.base import ScaleKind
from engine.kernels.registry import KernelOverrides
from engine.model.attention import build_metadata
from engine.model.decode_step import GEMM_AVX2
from engine.model.kv_store import LayerKV
from engine.model.layers import StepRope
from engine.runner import ModelRunner, generate_greedy, load_runner
from tests.engine.kv_layout import slots_of
from tests.engine.test_model_support import (
    engine_config,
    logit_error,
    random_weights,
    tiny_config,
)
from tests.ext.support import (
    AVX2_HOST,
    AVX512_HOST,
    fake_hw,
    needs_avx2,
    needs_avx512,
    run_forced_avx2,
)

NONE = LogitsWanted.NONE


AMX_HOST = (*AVX512_HOST, "avx512_vnni", "amx_tile", "amx_bf16", "amx_int8")
# (cpuid flags of the fake profile, the FP8 kernel its layers then run)
FAMILIES = [pytest.param((AVX512_HOST, "avx512_w8a16"), marks=needs_avx512, id="avx512"),
            pytest.param((AVX512_HOST, "avx512_block_w8a16"), marks=needs_avx512,
                         id="avx512-block"),
            pytest.param((AVX2_HOST, "avx2_w8a16"), marks=needs_avx2, id="avx2"),
            pytest.param((AVX2_HOST, "avx2_block_w8a16"), marks=needs_avx2, id="avx2-block")]


@dataclass(frozen=True)
class Case:
    """A checkpoint's weights and the kernel family its runners use."""

    weights: dict
    flags: tuple[str, ...]
    kernel: str


def _runner(case: Case, fuse: bool | None, kv_dtype: str = "auto", amx: bool = False,
            **kw) -> ModelRunner:
    """On the case's kernels, or (amx) on the AMX ones: the real tiles at dispatch level
    amx, else gemm_amx's stand-in, in the Python layers and the fused op alike."""
    hw = fake_hw(*AMX_HOST, amx=True) if amx else fake_hw(*case.flags)
    runner = ModelRunner(case.weights, engine_config(kv_cache_dtype=kv_dtype, **kw), hw,
                         KernelOverrides())
    if fuse is not None:
        runner.model.set_fusion(fuse)
    return runner


KV_DTYPES = pytest.mark.parametrize("kv_dtype", ["auto", "fp8"])


def _case(flags: tuple[str, ...], kernel: str) -> Case:
    kind = ScaleKind.BLOCK if "block" in kernel else ScaleKind.PER_TENSOR
    # 32 x 32 blocks: every tiny shape is a multiple (q, k, v fuse), several per linear
    return Case(random_weights(tiny_config(num_layers=3), seed=21, kind=kind, block=32),
                flags, kernel)


@pytest.fixture(scope="module", params=FAMILIES)
def weights(request):
    return _case(*request.param)


def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(0, 320, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_every_layer_fuses_on_the_family_kernels(weights) -> None:
    runner = _runner(weights, fuse=None)
    assert runner.model.fusion_reasons == [None] * 3
    kernels = {c.kernel_id for c in runner.kernel_report.choices.values()
               if c.layer.startswith("layers.")}
    assert kernels == {weights.kernel}  # the report names the kernel the op calls
    gemm = GEMM_AVX2 if weights.kernel.startswith("avx2") else GEMV_MAX_M
    assert [f.dims[5] for f in runner.model.fused] == [gemm] * 3


@needs_avx512
def test_amx_layers_fuse_and_match_python_and_solo() -> None:
    """The fused op on the AMX GEMM: logits near the Python layers' (same GEMM, other
    elementwise rounding) and each sequence's batched decode logits equal its solo ones."""
    weights = Case(random_weights(tiny_config(num_layers=3), seed=21), AMX_HOST, "amx_w8a16")
    fused, py = _runner(weights, None, amx=True), _runner(weights, False, amx=True)
    assert fused.model.fusion_reasons == [None] * 3
    assert {c.kernel_id for c in fused.kernel_report.choices.values()
            if c.layer.startswith("layers.")} == {"amx_w8a16"}
    _near_python_and_batch_invariant(fused, py, [3, 17, 9], seed=40, token=7)


def _near_python_and_batch_invariant(fused: ModelRunner, py: ModelRunner, lens: list[int],
                                     seed: int, token: int) -> None:
    """Each prompt prefilled alone, then one batched decode step: logits within the
    tolerance of the Python layers', and each row of the batch equal to its solo run."""
    tables = {s: tuple(range(8 * s, 8 * s + 8)) for s in range(len(lens))}
    for s, n in enumerate(lens):
        chunk = SeqChunk(s, tuple(_ids(n, seed + s)), 0, tables[s])
        assert logit_error(fused.run(BatchInputs((chunk,))), py.run(BatchInputs((chunk,)))) < 2e-2
    step = [SeqChunk(s, (token,), n, tables[s]) for s, n in enumerate(lens)]
    batched = fused.run(BatchInputs(tuple(step)))
    assert logit_error(batched, py.run(BatchInputs(tuple(step)))) < 2e-2
    for i, chunk in enumerate(step):
        assert torch.equal(fused.run(BatchInputs((chunk,)))[0], batched[i]), i


def test_python_kernels_do_not_fuse(weights) -> None:
    from engine.hardware import HardwareInfo

    runner = ModelRunner(weights.weights, engine_config(), HardwareInfo.fake(), KernelOverrides())
    assert all(r is not None and "not the AVX-512, AMX or AVX2 FP8 kernel" in r
               for r in runner.model.fusion_reasons)
    with pytest.raises(ValueError, match="cannot fuse"):
        runner.model.set_fusion(True)


def test_fused_layer_matches_the_python_layer(weights) -> None:
    runner = _runner(weights, fuse=True)
    model = runner.model
    chunks = (SeqChunk(0, tuple(_ids(9, 1)), 0, (0, 1, 2)), SeqChunk(1, (5,), 6, (3, 4)))
    batch = BatchInputs(chunks)
    meta = build_metadata(batch, runner.block_size, runner.kv.num_slots, spans=False)
    c = model.config
    h = torch.randn(10, c.hidden_size, generator=torch.Generator().manual_seed(2)).bfloat16()
    rope = StepRope.select(model.rope, meta.positions, c.num_heads, c.num_kv_heads)
    kv_py, kv_fused = runner.kv.kv.clone(), runner.kv.kv.clone()
    layer_views = [LayerKV(kv[1, 0], kv[1, 1]) for kv in (kv_py, kv_fused)]
    ref = model.layers[1](h, rope, meta, layer_views[0])
    got = model.fused[1](h, model.rope, meta, layer_views[1])
    err = (got.float() - ref.float()).abs()
    assert float(err.max()) <= 2 ** -7 * float(ref.float().abs().max()), float(err.max())
    written = meta.slot_mapping
    for a, b in zip(layer_views[0][:2], layer_views[1][:2], strict=True):  # K, then V
        a, b = slots_of(a)[written].float(), slots_of(b)[written].float()
        assert float(a.abs().max()) > 0  # the step's rows were written
        assert float((a - b).abs().max()) <= 2 ** -6 * float(a.abs().max())
    assert torch.equal(kv_py[0], kv_fused[0])  # other layers untouched


def test_fused_runner_logits_match_python_runner(weights) -> None:
    fused, py = _runner(weights, True), _runner(weights, False)
    prompt = _ids(14, 3)
    chunk = SeqChunk(0, tuple(prompt), 0, tuple(range(5)))
    assert fused.model.stack is None  # the first step checks each fused layer
    a, b = fused.run(BatchInputs((chunk,))), py.run(BatchInputs((chunk,)))
    assert logit_error(a, b) < 2e-2
    assert fused.model.stack is not None  # later steps: all layers in one call
    nxt = SeqChunk(0, (int(a.argmax()),), 14, tuple(range(5)))
    assert logit_error(fused.run(BatchInputs((nxt,))), py.run(BatchInputs((nxt,)))) < 2e-2


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_tokens_fused_equal_python_on_the_tiny_checkpoint(tiny_checkpoint,
                                                                  family) -> None:
    cfg = engine_config(kv_cache_gib=0.02, kv_block_size=16)
    hw = fake_hw(*family[0])
    runs = []
    for fuse in (True, False):
        runner = load_runner(tiny_checkpoint(), cfg, hw, KernelOverrides())
        runner.model.set_fusion(fuse)
        runs.append(generate_greedy(runner, _ids(11, 4), max_new_tokens=12))
    assert runs[0] == runs[1]


@KV_DTYPES
def test_fused_batched_decode_equals_solo_bitwise(weights, kv_dtype) -> None:
    """A sequence's logits inside a batch of decodes equal its logits alone (fused path:
    batch-invariant attention and, with the batch-invariant GEMMs, linears; an fp8 cache's
    rows depend on their own token only)."""
    runner = _runner(weights, True, kv_dtype)
    lens = [3, 17, 9, 30, 1, 12]
    seqs = {s: _ids(n, 10 + s) for s, n in enumerate(lens)}
    tables = {s: tuple(range(8 * s, 8 * s + 8)) for s in seqs}
    for s, ids in seqs.items():  # prefill each alone
        runner.run(BatchInputs((SeqChunk(s, tuple(ids), 0, tables[s]),)))
    step = [SeqChunk(s, (7,), lens[s], tables[s]) for s in seqs]
    batched = runner.run(BatchInputs(tuple(step)))
    for i, chunk in enumerate(step):
        alone = runner.run(BatchInputs((chunk,)))  # rewrites the same K/V slot
        assert torch.equal(alone[0], batched[i]), i


def test_fused_chunked_prefill_equals_one_shot_bitwise(weights) -> None:
    """Prompt logits do not depend on how the prompt was chunked (batch-invariant
    attention and GEMMs: a row's result never depends on the other rows of the step)."""
    prompt = _ids(23, 5)
    blocks = tuple(range(6))
    one = _runner(weights, True)
    whole = one.run(BatchInputs((SeqChunk(0, tuple(prompt), 0, blocks),)))
    chunked = _runner(weights, True)
    for a, b in ((0, 6), (6, 13), (13, 22)):
        chunked.run(BatchInputs((SeqChunk(0, tuple(prompt[a:b]), a, blocks, NONE),)))
    last = chunked.run(BatchInputs((SeqChunk(0, (prompt[22],), 22, blocks),)))
    assert torch.equal(last, whole)


def test_fused_layer_failing_on_first_call_falls_back_to_python(weights) -> None:
    fused, py = _runner(weights, True), _runner(weights, False)

    def broken(*args):
        raise RuntimeError("decode_layer: simulated failure")

    fused.model.fused[1] = broken  # type: ignore[assignment]
    chunk = SeqChunk(0, tuple(_ids(7, 6)), 0, (0, 1))
    assert logit_error(fused.run(BatchInputs((chunk,))), py.run(BatchInputs((chunk,)))) < 2e-2
    assert fused.model.fused[1] is None and fused.model.fused[0] is not None
    assert "simulated failure" in str(fused.model.fusion_reasons[1])
    paths = [(d["path"], d["reason"]) for d in fused.kernel_report.snapshot()["decoder_layers"]]
    assert paths == [("fused", None), ("python", fused.model.fusion_reasons[1]),
                     ("fused", None)]  # what /kernels and the metrics show


def test_fused_batched_prefill_equals_solo_bitwise(weights) -> None:
    """Several prompts prefilled in one step give each prompt's solo logits bitwise."""
    prompts = {s: _ids(n, 30 + s) for s, n in enumerate([5, 19, 1, 11])}
    tables = {s: tuple(range(6 * s, 6 * s + 6)) for s in prompts}
    chunks = tuple(SeqChunk(s, tuple(p), 0, tables[s], LogitsWanted.ALL)
                   for s, p in prompts.items())
    together = _runner(weights, True).run(BatchInputs(chunks))
    row = 0
    for chunk in chunks:
        alone = _runner(weights, True).run(BatchInputs((chunk,)))
        assert torch.equal(alone, together[row:row + chunk.num_tokens]), chunk.seq_id
        row += chunk.num_tokens


def _wide_case(flags: tuple[str, ...], kernel: str) -> Case:
    # wide enough rows that a 96-token chunk's norms, RoPE, SwiGLU and adds are split
    # over threads (ext/csrc/decode_layer.cpp for_rows: ranges of >= 32K elements)
    cfg = tiny_config(hidden_size=1024, intermediate_size=2048, num_layers=1, num_heads=8,
                      num_kv_heads=2, head_dim=128)
    return Case(random_weights(cfg, seed=23), flags, kernel)


@pytest.fixture(scope="module", params=FAMILIES)
def wide_weights(request):
    return _wide_case(*request.param)


def test_fused_prefill_is_bitwise_the_same_for_1_2_3_threads(wide_weights) -> None:
    chunk = SeqChunk(0, tuple(_ids(96, 8)), 0, tuple(range(24)), LogitsWanted.ALL)
    before = torch.get_num_threads()
    outs = []
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            outs.append(_runner(wide_weights, True).run(BatchInputs((chunk,))))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])
    python = _runner(wide_weights, False).run(BatchInputs((chunk,)))
    assert logit_error(outs[0], python) < 2e-2


def test_fused_wide_prefill_chunked_equals_one_shot_bitwise(wide_weights) -> None:
    prompt, blocks = _ids(96, 9), tuple(range(24))
    whole = _runner(wide_weights, True).run(
        BatchInputs((SeqChunk(0, tuple(prompt), 0, blocks, LogitsWanted.ALL),)))
    chunked = _runner(wide_weights, True)
    parts = [chunked.run(BatchInputs((SeqChunk(0, tuple(prompt[a:b]), a, blocks,
                                                LogitsWanted.ALL),)))
             for a, b in ((0, 40), (40, 41), (41, 96))]
    assert torch.equal(torch.cat(parts), whole)


def _per_op(runner: ModelRunner, batch: BatchInputs) -> torch.Tensor:
    """The step layer by layer: decode_layer ops, whose T > 1 path runs op by op (the
    reference of the team path); the stack is built again after the call."""
    runner.model.stack = None
    return runner.run(batch)


@KV_DTYPES
def test_team_steps_equal_the_per_op_path_on_any_thread_count(weights, kv_dtype) -> None:
    """Steps of up to 32 rows run the whole stack in one parallel region (decode_team.cpp).
    A decode batch (contexts on both sides of the 128-key segments: attention by whole
    rows), one decode token (attention split into segments), and a mixed step (a prefill
    chunk attending its own new keys, plus decodes) each give the per-op path's logits
    bitwise, on 1, 2 and 3 threads. With an fp8 cache the team path quantizes the rows it
    writes as kv_write_fp8 does: the same codes and scales."""
    runner = _runner(weights, None, kv_dtype, max_model_len=256)
    lens = [250, 129, 128, 40, 2]
    tables = {s: tuple(range(64 * s, 64 * s + 64)) for s in range(len(lens) + 1)}
    for s, n in enumerate(lens):
        runner.run(BatchInputs((SeqChunk(s, tuple(_ids(n, 40 + s)), 0, tables[s]),)))
    decodes = tuple(SeqChunk(s, (7,), n, tables[s]) for s, n in enumerate(lens))
    prompt = SeqChunk(len(lens), tuple(_ids(21, 50)), 0, tables[len(lens)], LogitsWanted.ALL)
    steps = [decodes, decodes[:1], (prompt, *decodes[2:])]
    before = torch.get_num_threads()
    try:
        for step in steps:
            batch = BatchInputs(step)
            assert batch.num_tokens <= 32
            reference = _per_op(runner, batch)
            written = (runner.kv.kv.clone(),
                       None if runner.kv.scales is None else runner.kv.scales.clone())
            assert runner.model.stack is not None
            for threads in (1, 2, 3):
                torch.set_num_threads(threads)
                team = runner.run(batch)  # rewrites the same K/V slots
                assert torch.equal(team, reference), (threads, batch.num_tokens)
                assert torch.equal(runner.kv.kv.view(torch.uint8), written[0].view(torch.uint8))
                if written[1] is not None:
                    assert torch.equal(runner.kv.scales, written[1])
            torch.set_num_threads(before)
    finally:
        torch.set_num_threads(before)


def test_steps_past_32_rows_run_op_by_op_and_equal_solo_rows(weights) -> None:
    """A 40-row step (over the team path's 32) runs op by op: each row's logits equal the
    same chunk run alone (through the team path)."""
    runner = _runner(weights, True)
    runner.run(BatchInputs((SeqChunk(2, (3,), 0, (30,)),)))  # the first call builds the stack
    assert runner.model.stack is not None
    chunks = (SeqChunk(0, tuple(_ids(30, 60)), 0, tuple(range(10)), LogitsWanted.ALL),
              SeqChunk(1, tuple(_ids(10, 61)), 0, tuple(range(10, 20)), LogitsWanted.ALL))
    together = runner.run(BatchInputs(chunks))
    row = 0
    for chunk in chunks:
        alone = runner.run(BatchInputs((chunk,)))
        assert torch.equal(alone, together[row:row + chunk.num_tokens]), chunk.seq_id
        row += chunk.num_tokens


@KV_DTYPES
def test_single_token_decode_layer_op_equals_the_stack(weights, kv_dtype) -> None:
    """A first call with one token runs layer by layer (decode_layer, T == 1 path); later
    calls run decode_stack: the same token gives the same logits either way."""
    first = _runner(weights, True, kv_dtype)
    by_layer = first.run(BatchInputs((SeqChunk(0, (5,), 0, (0, 1)),)))
    assert first.model.stack is not None  # built after that first call
    by_stack = first.run(BatchInputs((SeqChunk(1, (5,), 0, (2, 3)),)))
    assert torch.equal(by_layer, by_stack)


def test_fp8_kv_layers_fuse_and_match_the_python_layers(weights) -> None:
    """With --kv-cache-dtype fp8 every layer still fuses; the fused runner's logits follow
    the Python layers' on the same fp8 cache. Tolerance: the two sides differ by an ulp in
    RMSNorm / RoPE (see the module docstring), and an e4m3 rounding of K or V can turn
    that ulp into one e4m3 step (2^-3 of an element) before attention averages it, so
    twice the bf16 cache's 2e-2 bound."""
    fused, py = _runner(weights, None, "fp8"), _runner(weights, False, "fp8")
    assert fused.model.fusion_reasons == [None] * 3
    assert fused.kv.scales is not None and fused.kv.kv.dtype == torch.float8_e4m3fn
    prompt = _ids(14, 3)
    chunk = SeqChunk(0, tuple(prompt), 0, tuple(range(5)))
    a, b = fused.run(BatchInputs((chunk,))), py.run(BatchInputs((chunk,)))
    assert logit_error(a, b) < 4e-2
    assert fused.model.stack is not None
    nxt = SeqChunk(0, (int(a.argmax()),), 14, tuple(range(5)))
    assert logit_error(fused.run(BatchInputs((nxt,))), py.run(BatchInputs((nxt,)))) < 4e-2
    written = torch.arange(15)  # slots 0 .. 14 of blocks 0 .. 3 (block size 4)
    scales = fused.kv.scales.transpose(3, 4).flatten(2, 3)[:, :, written]  # [L, 2, 15, Hkv]
    assert bool((scales != 1.0).all())  # every written row got its own amax / 448


def _ragged_case(flags: tuple[str, ...], kernel: str) -> Case:
    # hidden and intermediate sizes that are not multiples of 8 or 32: the row ops' tails
    # (the AVX2 ones run them on zero-padded copies) and the per-op path (the team path
    # wants K % 32 == 0)
    cfg = tiny_config(hidden_size=44, intermediate_size=100, num_heads=2, num_kv_heads=1,
                      head_dim=32)
    return Case(random_weights(cfg, seed=29), flags, kernel)


@pytest.fixture(scope="module", params=FAMILIES)
def ragged_weights(request):
    return _ragged_case(*request.param)


def test_ragged_widths_fuse_match_python_and_batch_invariantly(ragged_weights) -> None:
    fused, py = _runner(ragged_weights, None), _runner(ragged_weights, False)
    assert fused.model.fusion_reasons == [None] * 2
    _near_python_and_batch_invariant(fused, py, [5, 13], seed=70, token=9)


# The AVX2 families' checks above, with the AVX2 norms, RoPE, SwiGLU, adds and attention
# (decode_layer_avx2.cpp, attention_avx2.cpp) that only dispatch level avx2 runs
FORCED_AVX2 = """
import torch, ext
from tests.engine import test_decode_step as t
assert ext.isa() == "avx2", ext.isa()
for kernel in ("avx2_w8a16", "avx2_block_w8a16"):
    case = t._case(t.AVX2_HOST, kernel)
    t.test_every_layer_fuses_on_the_family_kernels(case)
    t.test_fused_layer_matches_the_python_layer(case)
    t.test_fused_runner_logits_match_python_runner(case)
    for kv_dtype in ("auto", "fp8"):
        t.test_fused_batched_decode_equals_solo_bitwise(case, kv_dtype)
        t.test_team_steps_equal_the_per_op_path_on_any_thread_count(case, kv_dtype)
        t.test_single_token_decode_layer_op_equals_the_stack(case, kv_dtype)
    t.test_fused_chunked_prefill_equals_one_shot_bitwise(case)
    t.test_fused_batched_prefill_equals_solo_bitwise(case)
    t.test_steps_past_32_rows_run_op_by_op_and_equal_solo_rows(case)
    t.test_fp8_kv_layers_fuse_and_match_the_python_layers(case)
    wide = t._wide_case(t.AVX2_HOST, kernel)
    t.test_fused_prefill_is_bitwise_the_same_for_1_2_3_threads(wide)
    t.test_fused_wide_prefill_chunked_equals_one_shot_bitwise(wide)
    t.test_ragged_widths_fuse_match_python_and_batch_invariantly(
        t._ragged_case(t.AVX2_HOST, kernel))
print("avx2 ok")
"""


def test_avx2_families_forced_on_bigger_hosts() -> None:
    """On AVX-512 hosts the avx2 cases above fuse the AVX2 GEMM with the AVX-512 row ops
    and attention; FP8SERVE_ISA=avx2 (own process: the ISA is chosen once) runs them on
    the AVX2 ones, as an AVX2 host does."""
    run_forced_avx2(FORCED_AVX2)
