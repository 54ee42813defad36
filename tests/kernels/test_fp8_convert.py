"""FP8 e4m3 -> BF16 is exact for all 256 codes but NaN: the standalone op, and the
in-register conversion inside every C++ GEMM path (GEMV, brgemm panel, 128-deep AMX
tiles, AVX2), read back through one-hot activations."""

from __future__ import annotations

import pytest
import torch

import ext
from engine.kernels.base import FP8_DTYPE
from tests.ext.support import (
    all_codes_weight,
    loaded_status,
    needs_avx2,
    needs_avx512,
    run_forced_avx2,
)

CODES = torch.arange(256, dtype=torch.uint8).view(FP8_DTYPE)
NOT_NAN = (torch.arange(256) & 0x7F) != 0x7F


def test_op_is_exact_for_all_codes():
    loaded_status()
    got = ext.fp8_to_bf16(CODES).view(torch.int16)
    want = CODES.to(torch.bfloat16).view(torch.int16)
    bad = [hex(c) for c in range(256) if NOT_NAN[c] and got[c] != want[c]]
    assert not bad, f"codes converted wrongly: {bad}"
    # zero, negative zero, smallest subnormal, largest subnormal, min normal, max
    assert ext.fp8_to_bf16(CODES[[0x00, 0x80, 0x01, 0x07, 0x08, 0x7E]]).float().tolist() == [
        0.0, -0.0, 2.0**-9, 7 * 2.0**-9, 2.0**-6, 448.0]


def test_op_handles_odd_lengths_and_shapes():
    loaded_status()
    x = CODES[NOT_NAN].repeat(3)[:-6].reshape(-1, 7)  # 756 codes: not a multiple of 16 or 32
    assert torch.equal(ext.fp8_to_bf16(x), x.to(torch.bfloat16))


_FORCED_AVX2 = """
import ext
from tests.kernels import test_fp8_convert as t
assert ext.isa() == "avx2", ext.isa()
t.test_op_is_exact_for_all_codes()
t.test_op_handles_odd_lengths_and_shapes()
print("avx2 ok")
"""


def test_op_avx2_loop_forced_on_bigger_hosts():
    """The op converts at the dispatch level (the AVX-512 loop on AVX-512 hosts); under
    FP8SERVE_ISA=avx2 (own process) the two checks above run on the AVX2 loop and its tail."""
    run_forced_avx2(_FORCED_AVX2)


def _onehot(m: int, k: int) -> torch.Tensor:
    x = torch.zeros(m, k, dtype=torch.bfloat16)
    x[torch.arange(m), torch.arange(m) % k] = 1.0
    return x


def _expected(values: torch.Tensor, m: int, k: int) -> torch.Tensor:
    # y[r, c] = value(code c) when row c's code sits in the column row r selects
    col = (torch.arange(256) % k)[None, :] == (torch.arange(m) % k)[:, None]
    return torch.where(col, values.float()[None, :], torch.zeros(()))


@needs_avx512
@pytest.mark.parametrize("m", [1, 4, 9, 33])
def test_gemm_avx512_and_amx_paths_are_exact_for_all_codes(m):
    loaded_status()
    w, values = all_codes_weight()
    wp, ones = ext.pack_vnni32(w), torch.ones(256)
    want = _expected(values, m, 32)
    x = _onehot(m, 32)
    for y in (ext.gemm_avx512(x, wp, ones, None, 256, gemv_max_m=32),  # GEMV
              ext.gemm_avx512(x, wp, ones, None, 256, gemv_max_m=0),  # brgemm on a bf16 panel
              ext.gemm_amx(x, wp, ones, None, 256)):  # GEMV m <= 4, else 128-deep tiles
        assert torch.equal(y.float(), want)


@needs_avx512
def test_block_scaled_paths_are_exact_for_all_codes():
    loaded_status()
    w, values = all_codes_weight()
    wp, s = ext.pack_vnni32(w), torch.full((2, 1), 0.5)  # block (128, 128), power of 2
    for m in (1, 9):
        want, x = _expected(values, m, 32) * 0.5, _onehot(m, 32)
        for y in (ext.gemm_avx512(x, wp, s, None, 256, 128, 128, gemv_max_m=32),
                  ext.gemm_avx512(x, wp, s, None, 256, 128, 128, gemv_max_m=0),
                  ext.gemm_amx(x, wp, s, None, 256, 128, 128)):
            assert torch.equal(y.float(), want)


@needs_avx2
@pytest.mark.parametrize("m", [1, 5])
def test_gemm_avx2_is_exact_for_all_codes(m):
    loaded_status()
    w, values = all_codes_weight()
    y = ext.gemm_avx2(_onehot(m, 32), ext.pack_avx2(w), torch.ones(256), None, 256)
    assert torch.equal(y.float(), _expected(values, m, 32))
