"""The AMX FP8 GEMM's walk (ext/csrc/amx_gemm.inc) through the gemm_amx op.

Where the dispatch level is below amx (every host without AMX, or FP8SERVE_ISA lowered)
the op runs the walk on the portable stand-in of the tile operations, so these checks
test the blocking, row padding, K walk, tails, scales and layout on every host; on an AMX
host the in-process tests run the real tiles, and the needs_amx tests rerun them on the
stand-in and compare the two within the oracle tolerance (their bits cannot match: the
tile instruction's internal order is not a sequential fp32 chain).

The check functions take the ops namespace (torch.ops.fp8serve) so that
assert_tests_pass_under_isa can call them in a process at another dispatch level.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import ext
from engine.kernels.base import Fp8Weight, ScaleKind
from tests.ext.support import (
    all_codes_weight,
    assert_close_to_oracle,
    assert_tests_pass_under_isa,
    make_bias,
    make_weight,
    make_x,
    run_with_isa,
)

needs_amx = pytest.mark.skipif(ext.isa() != "amx",
                               reason="host has no granted AMX (cannot execute tiles)")


def _pack(w: Fp8Weight) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """(vnni32 weight, scale for the op, block_n, block_k) as the amx kernels pack them."""
    if w.scale_kind is ScaleKind.BLOCK:
        return ext.pack_vnni32(w.weight), w.scale, *w.block_size
    return ext.pack_vnni32(w.weight), w.scale.expand(w.n).contiguous(), 0, 0


def _gemm(ops, x, w: Fp8Weight, bias=None) -> torch.Tensor:
    wp, s, bn, bk = _pack(w)
    return ops.gemm_amx(x, wp, s, bias, w.n, bn, bk)


def check_rows_independent_of_m(ops) -> None:
    """Every row of a 70-row batch equals the same row computed alone and in other
    batches (N, K not multiples of 32 or 128; both scale kinds)."""
    for kind in (ScaleKind.PER_CHANNEL, ScaleKind.BLOCK):
        w = make_weight(80, 200, kind, seed=3, block=(64, 128))
        x = make_x(70, 200, seed=4)
        y = _gemm(ops, x, w, make_bias(80))
        for r in range(70):
            alone = _gemm(ops, x[r:r + 1], w, make_bias(80))
            assert torch.equal(alone[0].view(torch.int16), y[r].view(torch.int16)), (kind, r)
        for a, b in ((0, 16), (3, 20), (15, 48), (31, 70), (60, 61)):
            part = _gemm(ops, x[a:b], w, make_bias(80))
            assert torch.equal(part.view(torch.int16), y[a:b].view(torch.int16)), (kind, a, b)


def check_decode_walk_equals_row_walk(ops) -> None:
    """M <= 16 runs the decode walk (a ring of unpacked steps, two weight tiles side by
    side, C tiles configured with M rows, x read in place); M > 16 the row-tile walk. Every
    M from 1 to 17 equals the same rows of a 40-row batch: per-channel over a K that is a
    multiple of 32 but not of 256 (x unpadded), block scales over a K padded to 608 (a
    partial last k-block), each tile of a side-by-side pair in its own n-block; N = 96
    (3 tiles: a pair and a lone tile) and 232 (8 tiles, the last partial)."""
    for (kind, k), n in zip(((ScaleKind.PER_CHANNEL, 640), (ScaleKind.BLOCK, 600)) * 2,
                            (96, 96, 232, 232), strict=True):
        w = make_weight(n, k, kind, seed=11, block=(32, 128))
        x = make_x(40, k, seed=12)
        y = _gemm(ops, x, w, make_bias(n))
        for m in range(1, 18):
            alone = _gemm(ops, x[:m], w, make_bias(n))
            assert torch.equal(alone.view(torch.int16), y[:m].view(torch.int16)), (kind, m)


def check_row_blocks_do_not_change_rows(ops) -> None:
    """K = 12800: the walk splits 70 rows into row blocks (x per block within 1.5 MiB is
    under the 4-row-tile minimum, so 64 rows); rows on either side of a block edge equal
    themselves alone."""
    w = make_weight(40, 12800, ScaleKind.BLOCK, seed=5)
    x = make_x(70, 12800, seed=6)
    y = _gemm(ops, x, w)
    for a, b in ((0, 1), (47, 48), (63, 64), (64, 65), (69, 70), (50, 70)):
        part = _gemm(ops, x[a:b], w)
        assert torch.equal(part.view(torch.int16), y[a:b].view(torch.int16)), (a, b)
    assert_close_to_oracle(y, w, x, None)


def check_tails_match_oracle(ops) -> None:
    """N and K tails, per-tensor / per-channel / block scales, bias or none."""
    cases = [(17, 33, ScaleKind.PER_TENSOR, (128, 128)),
             (48, 200, ScaleKind.PER_CHANNEL, (128, 128)),
             (80, 300, ScaleKind.BLOCK, (64, 128)),
             (40, 96, ScaleKind.BLOCK, (32, 32)),
             (96, 130, ScaleKind.BLOCK, (96, 64))]
    for i, (n, k, kind, block) in enumerate(cases):
        w = make_weight(n, k, kind, seed=i, block=block)
        for m in (1, 5, 16, 17, 33):
            x, bias = make_x(m, k, seed=m), make_bias(n) if m % 2 else None
            assert_close_to_oracle(_gemm(ops, x, w, bias), w, x, bias)


def check_every_code_exact(ops) -> None:
    """x = I: y[c % 32, c] is fp8 code c's exact value (subnormals included): the unpack,
    the vnni32 orientation and the tile layout, with nothing to round."""
    w8, values = all_codes_weight(256, 32)
    w = Fp8Weight(w8, torch.ones(256), ScaleKind.PER_CHANNEL)
    y = _gemm(ops, torch.eye(32, dtype=torch.bfloat16), w)
    codes = torch.arange(256)
    assert torch.equal(y[codes % 32, codes].float(), values.float())


def test_rows_independent_of_m():
    check_rows_independent_of_m(torch.ops.fp8serve)


def test_decode_walk_equals_row_walk():
    check_decode_walk_equals_row_walk(torch.ops.fp8serve)


def test_row_blocks_do_not_change_rows():
    check_row_blocks_do_not_change_rows(torch.ops.fp8serve)


def test_tails_and_scales_match_oracle():
    check_tails_match_oracle(torch.ops.fp8serve)


def test_every_code_exact():
    check_every_code_exact(torch.ops.fp8serve)


def test_empty_batch():
    w = make_weight(48, 64, ScaleKind.PER_CHANNEL)
    y = _gemm(torch.ops.fp8serve, make_x(0, 64), w)
    assert tuple(y.shape) == (0, 48) and y.dtype == torch.bfloat16


def test_bad_shapes_name_the_expected_shape():
    # K = 0: an error naming it, not a crash (the tile walks read a first K step)
    empty = ext.pack_vnni32(torch.zeros(64, 0, dtype=torch.float8_e4m3fn))
    for m in (3, 20):  # the decode walk and the row-tile walk
        with pytest.raises(RuntimeError, match=r"gemm_amx: K must be > 0"):
            ext.gemm_amx(make_x(m, 0), empty, torch.ones(64), None, 64)
    w = make_weight(48, 200, ScaleKind.PER_CHANNEL)
    wp, s, _, _ = _pack(w)
    x = make_x(3, 200)
    with pytest.raises(RuntimeError, match=r"w_packed must be \[N/32, K/2, 32, 2\] = \[2, 112"):
        ext.gemm_amx(x, wp[:, :50], s, None, 48)
    with pytest.raises(RuntimeError, match=r"per-channel scale must be \[N\] = \[48\]"):
        ext.gemm_amx(x, wp, s[:40], None, 48)
    with pytest.raises(RuntimeError, match=r"block scale must be \[ceil\(N/bn\), ceil\(K/bk\)\]"):
        ext.gemm_amx(x, wp, torch.ones(1, 1), None, 48, 64, 128)
    with pytest.raises(RuntimeError, match=r"x must be a 2-D \[M, K\] bfloat16"):
        ext.gemm_amx(x.float(), wp, s, None, 48)
    with pytest.raises(RuntimeError, match=r"bias must be contiguous float32 \[N\] = \[48\]"):
        ext.gemm_amx(x, wp, s, torch.ones(47), 48)


def _tdpbf16ps(dst: int, src1: int, src2: int) -> bytes:
    """TDPBF16PS tmm_dst, tmm_src1, tmm_src2: VEX.128.F3.0F38.W0 5C /r (SDM), src2 in
    VEX.vvvv (inverted), dst in ModRM.reg, src1 in ModRM.rm."""
    return bytes([0xC4, 0xE2, ((~src2 & 0xF) << 3) | 0b010, 0x5C, 0xC0 | dst << 3 | src1])


def test_the_extension_holds_the_real_tile_kernel():
    """Every host compiles amx_gemm_tiles.cpp (AMX code it may not run): the library holds
    the walk's four dot products (C 0..3 from A 4..5 and B 6..7) and LDTILECFG."""
    lib = Path(ext.load().path).read_bytes()
    for dst, a, b in ((0, 4, 6), (1, 4, 7), (2, 5, 6), (3, 5, 7)):
        assert _tdpbf16ps(dst, a, b) in lib, (dst, a, b)
    assert bytes([0xC4, 0xE2, 0x78, 0x49]) in lib  # LDTILECFG m512


@needs_amx
def test_standin_passes_the_same_checks_on_an_amx_host():
    assert_tests_pass_under_isa("avx512", __name__, "check_rows_independent_of_m",
                                "check_row_blocks_do_not_change_rows",
                                "check_decode_walk_equals_row_walk", "check_tails_match_oracle",
                                "check_every_code_exact")


@needs_amx
def test_real_tiles_match_the_standin_within_tolerance(tmp_path):
    w = make_weight(160, 640, ScaleKind.BLOCK, seed=7)
    x = make_x(37, 640, seed=8)
    real = _gemm(torch.ops.fp8serve, x, w)
    path = tmp_path / "standin.pt"
    script = (f"import torch, ext\nfrom {__name__} import _gemm, make_weight, make_x\n"
              "from engine.kernels.base import ScaleKind\n"
              "assert ext.isa() == 'avx512', ext.isa()\n"
              "w = make_weight(160, 640, ScaleKind.BLOCK, seed=7)\n"
              f"torch.save(_gemm(torch.ops.fp8serve, make_x(37, 640, seed=8), w), {str(path)!r})\n")
    out = run_with_isa("avx512", script)
    assert out.returncode == 0, out.stderr[-2000:]
    standin = torch.load(path)
    rms = standin.float().pow(2).mean().sqrt()
    assert ((real.float() - standin.float()).abs() <= 2.0**-7 * (standin.float().abs() + rms)).all()
    assert_close_to_oracle(real, w, x, None)
