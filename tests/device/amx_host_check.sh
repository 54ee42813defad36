#!/usr/bin/env bash
# Checks for a host with real AMX tiles (e.g. a Sapphire/Emerald Rapids Xeon), where the
# development machine can only run the AMX code path on oneDNN's AVX-512 kernels:
#   1. the extension builds against this host's torch and its cpuid probe reports AMX,
#      and Linux grants the tile-data state (probe_hardware().amx_permitted);
#   2. the kernel and extension tests (tests/kernels, tests/ext) pass here, AMX kernels
#      included, now executing AMX tile instructions through cpublas::brgemm;
#   3. the registry picks amx_w8a16 on this host for every 8B shape;
#   4. fp8serve bench kernels: amx_w8a16 and avx512_w8a16 vs torch bf16 matmul.
# Usage: tests/device/amx_host_check.sh [OUT_DIR]   (from the repository root)
set -uo pipefail
OUT=${1:-${OUT:-/tmp/amx-check}}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 FP8SERVE_CACHE_DIR=${FP8SERVE_CACHE_DIR:-/tmp/fp8serve-cache}
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
PY=${PYTHON:-python3}

"$PY" - <<'PYEOF' 2>&1 | tee "$OUT/probe.log"
import time
t0 = time.time()
import ext
st = ext.load()
print(f"extension built={st.built} in {time.time() - t0:.0f} s; isa={ext.isa() if st.built else '-'}")
if not st.built:
    print(st.error[-4000:])
    raise SystemExit(1)
from engine.hardware_probe import probe_hardware
from engine.kernels.base import Fp8Spec, ScaleKind
from engine.kernels.registry import select_kernel
hw = probe_hardware()
print(hw.cpu_model, sorted(hw.cpu_flags), "amx_permitted", hw.amx_permitted)
for n, k in [(4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336), (48, 200)]:
    for kind in (ScaleKind.PER_TENSOR, ScaleKind.BLOCK):
        sel = select_kernel(Fp8Spec(n, k, kind, has_activation_scale=True), hw)
        print(f"{n}x{k} {kind.value}: {sel.kernel.id}", [(r.kernel_id, r.reason) for r in sel.rejections])
PYEOF
[[ ${PIPESTATUS[0]} == 0 ]] || exit 1
"$PY" -m pytest -q -ra -p no:cacheprovider -m "not slow" tests/kernels tests/ext 2>&1 \
    | tee "$OUT/pytest.log" | tail -40
"$PY" -m cli.main bench kernels --m "${BENCH_M:-1,32,512}" --kernels amx_w8a16,avx512_w8a16 \
    --json "$OUT/kernels.json" --png "$OUT/kernels.png" 2>&1 | tee "$OUT/bench.log" | tail -45
