"""bench/kernels/gpu.py without a device: the row arithmetic, the table, and a
clear exit where no CUDA device is visible (the timing itself runs on GPU hosts)."""

from __future__ import annotations

import pytest
import torch

from bench.kernels import gpu as gb
from bench.kernels.cpu import Shape


def test_row_arithmetic() -> None:
    shape = Shape("q_proj/o_proj", 4096, 4096)
    # 16 MiB of FP8 weight in 10 us at a 4000 GB/s bound (4.19 us) -> 41.9 % of bound
    row = gb._row(shape, 128, "cuda_scaled_mm_w8a8", 10.0, 2.5, 4096 * 4096, 4000.0)
    assert row.weight_gbps == pytest.approx(4096 * 4096 / 10e-6 / 1e9, rel=1e-3)
    assert row.tflops == pytest.approx(2 * 128 * 4096 * 4096 / 10e-6 / 1e12, abs=0.01)
    assert row.pct_of_bound == pytest.approx(4096 * 4096 / 4000e9 / 10e-6 * 100, abs=0.1)
    assert row.vs_bf16 == 2.5
    table = gb.format_table([row, gb._row(shape, 128, gb.BF16, 25.0, None, 2 * 4096 * 4096,
                                          4000.0)])
    lines = table.splitlines()
    assert len(lines) == 3 and "2.50" in lines[1] and lines[2].split()[-2] == "-"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-device exit")
def test_exits_with_message_without_a_device() -> None:
    with pytest.raises(SystemExit, match="no CUDA device"):
        gb.run((1,), 1)
