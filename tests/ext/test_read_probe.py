"""The read_xor op (ext/csrc/read_probe.cpp) and the ReadProbe built on it: the op
returns the exact XOR of every 64-bit word of the buffer (so a test can tell it read
every byte), under the host's dispatch ISA and the portable loop; bad inputs are rejected
with a message naming the rule. Nothing here asserts a timing."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ext
from bench.common.read_probe import ReadProbe, best_of
from tests.ext.support import loaded_status, run_forced_avx2, run_with_isa


@pytest.fixture(scope="module", autouse=True)
def _built():
    loaded_status()


def _xor(buf: torch.Tensor) -> int:
    words = buf.contiguous().view(torch.uint8).numpy().reshape(-1).view(np.int64)
    return int(np.bitwise_xor.reduce(words)) if words.size else 0


@pytest.mark.parametrize("lines", [1, 2, 3, 7, 64, 1001, 16385])
def test_xor_is_exact_for_any_length(lines):
    g = torch.Generator().manual_seed(lines)
    buf = torch.randint(0, 256, (lines * 64,), dtype=torch.uint8, generator=g)
    assert ext.read_xor(buf) == _xor(buf)


def test_every_byte_is_read():
    """Flipping any single bit anywhere (first, last, slice boundaries) changes the XOR."""
    buf = torch.zeros(64 * 4099, dtype=torch.uint8)
    for pos in [0, 63, 64, 4099 * 32, buf.numel() // 3, buf.numel() - 1]:
        buf.zero_()
        buf[pos] = 1 << (pos % 8)
        assert ext.read_xor(buf) != 0, pos
        assert ext.read_xor(buf) == _xor(buf)


def test_any_dtype_and_thread_count():
    x = torch.randn(4096, 17 * 16)  # fp32, nbytes a multiple of 64
    want = _xor(x)
    before = torch.get_num_threads()
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            assert ext.read_xor(x) == want
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("make, match", [
    (lambda: torch.zeros(100, dtype=torch.uint8), "multiple of 64 bytes"),
    (lambda: torch.zeros(0, dtype=torch.uint8), "multiple of 64 bytes"),
    (lambda: torch.zeros(64, 64, dtype=torch.uint8).t(), "contiguous"),
])
def test_bad_inputs_are_rejected(make, match):
    with pytest.raises(RuntimeError, match=match):
        ext.read_xor(make())


def test_fake_impl_gives_an_int64_scalar():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        out = torch.ops.fp8serve.read_xor(torch.empty(128, dtype=torch.uint8))
    assert out.shape == () and out.dtype == torch.int64


_PORTABLE = """
import torch, ext, functools, operator
assert ext.isa() == "scalar", ext.isa()
g = torch.Generator().manual_seed(1)
b = torch.randint(0, 256, (64 * 999,), dtype=torch.uint8, generator=g)
w = b.view(torch.int64).tolist()
assert ext.read_xor(b) == functools.reduce(operator.xor, w, 0)
print("portable ok")
"""


def test_portable_loop_below_avx2():
    """FP8SERVE_ISA=scalar runs the portable loop (own process: the ISA is chosen once)."""
    out = run_with_isa("scalar", _PORTABLE)
    assert out.returncode == 0 and "portable ok" in out.stdout, out.stderr[-2000:]


_AVX2 = """
import torch, ext, functools, operator
assert ext.isa() == "avx2", ext.isa()
torch.set_num_threads(1)
for lines in (1, 2, 3, 999):
    g = torch.Generator().manual_seed(lines)
    b = torch.randint(0, 256, (64 * lines,), dtype=torch.uint8, generator=g)
    assert ext.read_xor(b) == functools.reduce(operator.xor, b.view(torch.int64).tolist(), 0)
print("avx2 ok")
"""


def test_avx2_loop_forced_on_bigger_hosts():
    """AVX-512 hosts run the AVX-512 loop in-process; FP8SERVE_ISA=avx2 (own process) runs
    the AVX2 one, its odd-line tail included."""
    run_forced_avx2(_AVX2)


def test_probe_checks_what_it_read_and_reports_both_figures():
    probe = ReadProbe(64 * 1025, passes=2)
    assert probe.expected_xor == 8 * 1025 == ext.read_xor(probe.buf) == _xor(probe.buf)
    probe.buf[5000] += 1  # a word the probe did not see as built: the check fails loudly
    with pytest.raises(RuntimeError, match="did not read the buffer"):
        probe.read_xor_gbps()
    probe.buf[5000] -= 1
    s = probe.sample("here")
    assert s["label"] == "here" and s["read_xor_gbps"] > 0 and s["torch_sum_gbps"] > 0
    assert best_of([s, {"read_xor_gbps": None}], "read_xor_gbps") == s["read_xor_gbps"]
    assert best_of([{"read_xor_gbps": None}], "read_xor_gbps") is None


@pytest.mark.parametrize("nbytes, passes", [(100, 1), (0, 1), (128, 0)])
def test_probe_rejects_bad_sizes(nbytes, passes):
    with pytest.raises(ValueError, match="multiple of 64"):
        ReadProbe(nbytes, passes)
