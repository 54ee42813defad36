"""Peak RSS of building the runner (load, fuse, pack every layer, allocate the KV cache)
stays within the checkpoint's bytes + the KV budget + a small stated margin, and the
mapped checkpoint is not left resident afterwards. Measured in a child process from its
own /proc/self/status (VmHWM; never ru_maxrss, which a child inherits from its parent)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from engine.synth import SynthSpec, write_checkpoint

MIB = 2**20
KV_GIB = 0.125
# Allocator slack, the rotary tables, per-layer transients (one layer's fused copy while
# it is packed) and padding of packed tiles; the model's weights are ~300 MiB.
MARGIN = 64 * MIB

CHILD = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    import torch
    import ext
    from engine.config import EngineConfig
    from engine.hardware_probe import probe_hardware
    from engine.runner import generate_greedy, load_runner
    def status():
        out = {}
        for line in Path("/proc/self/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
                out[key] = int(value.split()[0]) * 1024
        return out
    hw = probe_hardware()  # loads the extension: part of the baseline
    base = status()
    runner = load_runner(sys.argv[1], EngineConfig(Path(sys.argv[1]), kv_cache_gib=%s,
                         max_model_len=512), hw=hw)
    built = status()
    tokens = generate_greedy(runner, [1, 5, 7, 9], 3)
    kernels = sorted({c.kernel_id for c in runner.kernel_report.choices.values()})
    print(json.dumps({"base": base, "built": built, "after": status(), "tokens": tokens,
                      "kv": runner.kv.nbytes, "kernels": kernels}))
""") % KV_GIB


def test_runner_peak_rss_within_weights_plus_kv(tmp_path: Path) -> None:
    spec = SynthSpec.preset("tiny", hidden_size=1024, intermediate_size=4096, num_layers=12,
                            num_heads=8, num_kv_heads=2, head_dim=128, vocab_size=32768)
    write_checkpoint(tmp_path, spec)
    size = (tmp_path / "model.safetensors").stat().st_size
    assert size > 250 * MIB
    out = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], capture_output=True,
                         text=True, check=True, cwd=str(Path(__file__).parents[2]))
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(r["tokens"]) == 3
    base, built = r["base"], r["built"]
    budget = size + r["kv"]
    assert r["kv"] >= KV_GIB * 2**30 * 0.9
    grown = built["VmHWM"] - base["VmRSS"]
    # everything was packed and the cache allocated: most of the budget is resident ...
    assert grown > 0.6 * budget, (r, size)
    # ... and the peak never held a second copy of the weights
    assert grown <= budget + MARGIN, (grown - budget) / MIB
    # the mapped checkpoint was released layer by layer (only partial pages remain)
    assert built["RssFile"] - base["RssFile"] < size // 8, r
