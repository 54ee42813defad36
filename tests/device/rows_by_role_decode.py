"""Decode with rows by role against the fused AVX-512 path, one process, alternating rounds.

On an AVX-512 host without AMX the runner on a faked AMX profile runs its prompt rows on
the tile GEMM's portable stand-in (slow: its prefill figure means nothing) and its
generated rows on the AVX-512 GEMM in the fused op, so its decode must match the fused
AVX-512 path's: this checks that the role plumbing costs nothing per step. On an AMX host
the same script times the real split (prefill on the tiles).

Usage: python -m tests.device.rows_by_role_decode MODEL_DIR [ROUNDS]   (repository root)
"""

from __future__ import annotations

import statistics
import sys

import torch

from bench.generate.run import time_runner
from engine.config import EngineConfig
from engine.hardware_probe import probe_hardware
from engine.kernels.registry import KernelOverrides
from engine.runner import load_runner
from tests.ext.support import AMX_HOST, AVX2_HOST, AVX512_HOST, fake_hw


def main(model: str, rounds: int) -> None:
    torch.set_num_threads(2)
    cfg = EngineConfig(model_dir=model, kv_cache_gib=0.25, kv_block_size=16, max_model_len=1024,
                       rows_by_role="on")
    real = probe_hardware()
    role_hw = real if real.amx_usable else fake_hw(*AMX_HOST, amx=True)
    role = load_runner(model, cfg, hw=role_hw, overrides=KernelOverrides())
    avx = load_runner(model, cfg, hw=fake_hw(*AVX512_HOST, *AVX2_HOST),
                      overrides=KernelOverrides())
    print(f"rows by role: {role.rows_by_role} ({'real tiles' if real.amx_usable else 'stand-in'})"
          f"; fused layers {role.model.fusion_reasons.count(None)} and "
          f"{avx.model.fusion_reasons.count(None)}")
    prompt, ratios = list(range(100, 132)), []
    for r in range(rounds):
        a, b = time_runner(role, prompt, 65), time_runner(avx, prompt, 65)
        ra, rb = a.decode_steps / a.decode_s, b.decode_steps / b.decode_s
        ratios.append(ra / rb)
        print(f"round {r}: decode {ra:.1f} (rows by role) vs {rb:.1f} tok/s (AVX-512), "
              f"x{ra / rb:.3f}; prefill {a.prefill_tps:.0f} vs {b.prefill_tps:.0f} tok/s; "
              f"same tokens: {a.output_ids == b.output_ids}")
    print(f"decode x the AVX-512 path: median {statistics.median(ratios):.3f} "
          f"({min(ratios):.3f}-{max(ratios):.3f}) over {rounds} rounds")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 6)
