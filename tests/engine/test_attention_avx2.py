"""The AVX2 paged-attention kernel (ext/csrc/attention_avx2.cpp) on bf16 and FP8 caches.

What runs in this process is the host's dispatch: the AVX2 kernel on AVX2 hosts for both
cache dtypes (AVX-512 hosts run the AVX-512 kernel; test_avx2_kernel_forced_on_bigger_hosts
runs the checks there under FP8SERVE_ISA=avx2).

* Against a float64 reference over the very K/V values the kernel reads (the dequantized
  ones for FP8): fp32 accumulation (relative ~1e-6) and one bf16 rounding of the output
  (<= 2^-9 relative), so |out - ref| <= 2^-8 |ref| + 1e-3, as in test_attention_op.py;
  a wrong slot, scale, head or mask gives errors of order 1. Group sizes 1..16, head_dim
  64 and 128 (and 32, 96, 160, 224, 256 for groups 1 and 3), contexts on both sides of
  the 16-key tiles and 128-key segments (1, 15, 16, 17, 127, 128, 129, 1030), shuffled
  block tables with a block size (7) that cuts tiles.
* Against the portable kernel (FP8SERVE_ISA=scalar, own process): both are within the
  bound above of the same exact value, so they differ by at most 2^-7 |ref| + 2e-3.
* Bit-for-bit invariance: a row alone = inside a batch of rows of other lengths = in
  prefill chunks = on 1 or 2 threads (the long rows then run split into segments).
* e4m3 decode: every non-NaN code comes back as torch's float8_e4m3fn -> float value.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import ext
from engine.model.kv_store import dequantize_kv
from tests.engine.kv_layout import blocks_of, slots_of
from tests.ext.support import run_with_isa

LENS = [1, 15, 16, 17, 127, 128, 129, 1030]
BS = 7


@pytest.fixture(scope="module")
def ops():
    st = ext.load()
    assert st.built, st.error
    return torch.ops.fp8serve


def make_case(ops, hq: int, hkv: int, d: int, lens: list[int], fp8: bool, seed: int,
              bs: int = BS) -> dict:
    """Caches for the sequences `lens` on shuffled blocks of `bs` slots, one decode query
    row per sequence. FP8: the bf16 K/V written through kv_write_fp8 (per-row scales)."""
    g = torch.Generator().manual_seed(seed)
    need = [-(-n // bs) for n in lens]
    blocks = sum(need) + 3  # a few blocks nobody uses
    k = (torch.randn(blocks * bs, hkv, d, generator=g) * 2).bfloat16()
    v = torch.randn(blocks * bs, hkv, d, generator=g).bfloat16()
    perm = torch.randperm(blocks, generator=g).to(torch.int32)
    bt = torch.zeros(len(lens), max(need), dtype=torch.int32)
    used = 0
    for i, n in enumerate(need):
        bt[i, :n] = perm[used:used + n]
        used += n
    case = {"q": torch.randn(len(lens), hq, d, generator=g).bfloat16(), "bt": bt,
            "seq": torch.arange(len(lens), dtype=torch.int32),
            "ctx": torch.tensor(lens, dtype=torch.int32), "bs": bs, "scale": d ** -0.5}
    if fp8:  # the ops' layout [blocks, hkv, bs, d]; "values" slot-major for the reference
        k8 = torch.zeros(blocks, hkv, bs, d, dtype=torch.float8_e4m3fn)
        v8, ks, vs = torch.zeros_like(k8), torch.ones(blocks, hkv, bs), torch.ones(blocks, hkv, bs)
        ops.kv_write_fp8(k8, v8, ks, vs, k, v, torch.arange(k.shape[0]), 0.0, 0.0)
        case.update(kv=(k8, v8), scales=(ks, vs),
                    values=(slots_of(dequantize_kv(k8, ks)), slots_of(dequantize_kv(v8, vs))))
    else:
        case.update(kv=(blocks_of(k, bs), blocks_of(v, bs)), scales=(),
                    values=(k.float(), v.float()))
    return case


def attend(ops, c: dict, rows: slice | None = None, **over) -> torch.Tensor:
    """paged_attention over the case (or its query rows `rows`, with their tables)."""
    q, bt, seq, ctx = c["q"], c["bt"], c["seq"], c["ctx"]
    if rows is not None:
        q, ctx = q[rows], ctx[rows]
        bt = bt[rows].contiguous()
        seq = torch.arange(q.shape[0], dtype=torch.int32)
    args = {"q": q, "bt": bt, "seq": seq, "ctx": ctx, **over}
    return ops.paged_attention(args["q"], *c["kv"], args["bt"], args["seq"], args["ctx"],
                               c["bs"], c["scale"], *c["scales"])


def reference(c: dict, q=None, seq=None, ctx=None) -> torch.Tensor:
    """float64 softmax(scale q K^T) V over each row's first ctx_len keys -> [T, Hq * D]
    (the rows of one sequence together: its keys gathered once, later ones masked; on one
    thread: these small ops lose more to a busy host's thread hand-offs than they gain)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _reference(c, q, seq, ctx)
    finally:
        torch.set_num_threads(before)


def _reference(c: dict, q, seq, ctx) -> torch.Tensor:
    q = c["q"] if q is None else q
    seq = c["seq"] if seq is None else seq
    ctx = c["ctx"] if ctx is None else ctx
    kf, vf = c["values"]
    t_n, hq, d = q.shape
    group = hq // kf.shape[1]
    out = torch.empty(t_n, hq * d, dtype=torch.float64)
    for sq in seq.unique().tolist():
        rows = (seq == sq).nonzero().flatten()
        pos = torch.arange(int(ctx[rows].max()))
        slots = c["bt"][sq].long()[pos // c["bs"]] * c["bs"] + pos % c["bs"]
        kk = kf[slots].double().repeat_interleave(group, dim=1)  # [n, Hq, D]
        vv = vf[slots].double().repeat_interleave(group, dim=1)
        s = torch.einsum("thd,nhd->thn", q[rows].double(), kk) * c["scale"]
        s = s.masked_fill(pos[None, None, :] >= ctx[rows, None, None], float("-inf"))
        out[rows] = torch.einsum("thn,nhd->thd", s.softmax(-1), vv).reshape(len(rows), -1)
    return out


def assert_close(out: torch.Tensor, ref: torch.Tensor, rel: float = 2.0 ** -8,
                 eps: float = 1e-3) -> None:
    err = (out.double() - ref).abs()
    bound = rel * ref.abs() + eps
    assert bool((err <= bound).all()), f"max excess {(err - bound).max().item():.3g}"


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
@pytest.mark.parametrize("d", [64, 128])
def test_matches_float64_reference_for_every_group_size(ops, fp8: bool, d: int) -> None:
    for group in range(1, 17):
        hkv = 2 if group <= 4 else 1
        c = make_case(ops, group * hkv, hkv, d, LENS, fp8, seed=100 * group + d)
        out = attend(ops, c)
        assert out.shape == (len(LENS), group * hkv * d) and out.dtype == torch.bfloat16
        try:
            assert_close(out, reference(c))
        except AssertionError as exc:
            raise AssertionError(f"group {group}: {exc}") from None


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_head_dims_not_a_multiple_of_64_match_reference(ops, fp8: bool) -> None:
    """head_dim 32, 96, 160 and 224 (a lone query head's P V then runs in 32-column chunks
    instead of 64) and 256 (the largest), for groups of 1 and 3: close to the reference,
    and a row's bits the same alone and batched."""
    for d in (32, 96, 160, 224, 256):
        for group in (1, 3):
            c = make_case(ops, group, 1, d, LENS, fp8, seed=d + group)
            out = attend(ops, c)
            try:
                assert_close(out, reference(c))
            except AssertionError as exc:
                raise AssertionError(f"d {d}, group {group}: {exc}") from None
            for i in (0, 3, len(LENS) - 1):
                assert torch.equal(attend(ops, c, slice(i, i + 1))[0], out[i]), (d, group, i)


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_prefill_chunks_and_peaked_scores_match_reference(ops, fp8: bool) -> None:
    """Causal prefill rows [120, 260) of one sequence with q scaled x 6 (segments whose
    maxima differ widely, so the online rescaling and the merge matter)."""
    c = make_case(ops, 8, 2, 128, [260], fp8, seed=7)
    q = torch.randn(140, 8, 128, generator=torch.Generator().manual_seed(8)).bfloat16() * 6
    seq = torch.zeros(140, dtype=torch.int32)
    ctx = torch.arange(121, 261, dtype=torch.int32)
    out = ops.paged_attention(q, *c["kv"], c["bt"], seq, ctx, c["bs"], c["scale"],
                              *c["scales"])
    assert_close(out, reference(c, q, seq, ctx))


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_row_bits_alone_batched_chunked_and_threaded(ops, fp8: bool) -> None:
    c = make_case(ops, 12, 3, 64, LENS, fp8, seed=11)
    before = torch.get_num_threads()
    try:
        per_threads = {}
        for threads in (1, 2):
            torch.set_num_threads(threads)
            batched = attend(ops, c)
            for i in range(len(LENS)):  # alone: whole row (1 thread) or segments (2)
                assert torch.equal(attend(ops, c, slice(i, i + 1))[0], batched[i]), (i, threads)
            per_threads[threads] = batched
        assert torch.equal(per_threads[1], per_threads[2])
        # the long sequence's last 300 positions as one prefill chunk, then as three
        last = len(LENS) - 1
        q = torch.randn(300, 12, 64, generator=torch.Generator().manual_seed(12)).bfloat16()
        pos = torch.arange(LENS[last] - 300, LENS[last], dtype=torch.int32)
        seq = torch.full((300,), last, dtype=torch.int32)
        whole = attend(ops, c, q=q, seq=seq, ctx=pos + 1)
        parts = [attend(ops, c, q=q[a:b], seq=seq[a:b], ctx=pos[a:b] + 1)
                 for a, b in ((0, 1), (1, 130), (130, 300))]
        assert torch.equal(torch.cat(parts), whole)
        torch.set_num_threads(1)
        assert torch.equal(attend(ops, c, q=q, seq=seq, ctx=pos + 1), whole)
    finally:
        torch.set_num_threads(before)
    assert_close(whole, reference(c, q, seq, pos + 1))


def test_every_e4m3_code_decodes_as_torch(ops) -> None:
    """One key, so the softmax weight is exactly 1 and the output is that V row times its
    scale: each of the 254 non-NaN codes (0x7F / 0xFF are NaN; the clamped writes never
    store them) must come back as torch's float8_e4m3fn -> float value times 0.375 (exact:
    4 + 2 significant bits). K rows go through the same conversion."""
    d, hkv = 128, 2
    codes = torch.arange(256, dtype=torch.int32)
    codes = codes[(codes & 0x7F) != 0x7F].to(torch.uint8)  # 254 codes
    codes = torch.cat([codes, torch.zeros(2, dtype=torch.uint8)])  # two rows of 128
    v8 = codes.view(2, 1, 1, d).repeat(1, hkv, 1, 1).view(torch.float8_e4m3fn)  # block_size 1
    k8 = v8.flip(0).contiguous()
    ks, vs = torch.full((2, hkv, 1), 0.5), torch.full((2, hkv, 1), 0.375)
    seq, ctx = torch.zeros(1, dtype=torch.int32), torch.ones(1, dtype=torch.int32)
    q = torch.randn(1, 4, d, generator=torch.Generator().manual_seed(3)).bfloat16()
    for r in range(2):
        bt = torch.tensor([[r]], dtype=torch.int32)
        out = ops.paged_attention(q, k8, v8, bt, seq, ctx, 1, d ** -0.5, ks, vs)
        want = (v8[r].float() * 0.375).repeat_interleave(2, dim=0).reshape(-1)
        assert torch.equal(out[0].float(), want), r


def portable_outputs(tmp_path: Path) -> dict[str, torch.Tensor]:
    """The same cases through the portable kernel (FP8SERVE_ISA=scalar, own process)."""
    script = f"""
import torch, ext
from tests.engine import test_attention_avx2 as t
assert ext.isa() == "scalar", ext.isa()
ops = ext.ops()
torch.save({{name: t.attend(ops, t.make_case(ops, *shape, t.LENS, fp8, seed=5))
            for name, (shape, fp8) in t.PORTABLE_CASES.items()}}, {str(tmp_path / "p.pt")!r})
"""
    out = run_with_isa("scalar", script)
    assert out.returncode == 0, out.stderr[-2000:]
    return torch.load(tmp_path / "p.pt")


PORTABLE_CASES = {"bf16_g4_d128": ((32, 8, 128), False), "fp8_g4_d128": ((32, 8, 128), True),
                  "fp8_g3_d64": ((6, 2, 64), True)}


def test_agrees_with_the_portable_kernel(ops, tmp_path: Path) -> None:
    if ext.isa() == "scalar":
        pytest.skip("this process already runs the portable kernel (no AVX2)")
    portable = portable_outputs(tmp_path)
    for name, (shape, fp8) in PORTABLE_CASES.items():
        c = make_case(ops, *shape, LENS, fp8, seed=5)
        out = attend(ops, c)
        assert not torch.equal(out, torch.zeros_like(out))
        assert_close(out.double(), portable[name].double(), rel=2.0 ** -7, eps=2e-3)
        assert_close(out, reference(c))


FORCED = """
import torch, ext
from tests.engine import test_attention_avx2 as t
assert ext.isa() == "avx2", ext.isa()
ops = ext.ops()
for fp8 in (False, True):
    for d in (64, 128):
        t.test_matches_float64_reference_for_every_group_size(ops, fp8, d)
    t.test_head_dims_not_a_multiple_of_64_match_reference(ops, fp8)
    t.test_prefill_chunks_and_peaked_scores_match_reference(ops, fp8)
    t.test_row_bits_alone_batched_chunked_and_threaded(ops, fp8)
t.test_every_e4m3_code_decodes_as_torch(ops)
print("avx2 ok")
"""


def test_avx2_kernel_forced_on_bigger_hosts(ops) -> None:
    """On AVX-512 hosts the AVX-512 kernel runs in-process; FP8SERVE_ISA=avx2
    (own process: the ISA is chosen once) runs the checks above on the AVX2 kernel."""
    if ext.isa() in ("scalar", "avx2"):
        pytest.skip(f"dispatch is {ext.isa()}: the in-process tests already cover it")
    out = run_with_isa("avx2", FORCED)
    assert out.returncode == 0 and "avx2 ok" in out.stdout, out.stderr[-2000:]
