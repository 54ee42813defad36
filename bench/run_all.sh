#!/usr/bin/env bash
# Regenerates every figure of the README results table into bench/results/:
#   kernels.json/.png      fp8serve bench kernels (Ministral-3-8B linear shapes)
#   generate-demo.json     fp8serve bench generate on the demo model (+ transformers, llama.cpp)
#   generate-3b.json       fp8serve bench generate on a 3B-shaped synth checkpoint
#   serve-demo.json        fp8serve bench serve at concurrency 1, 4, 16 on the demo model
#                          (SERVE_ROUNDS interleaved rounds, default 3: medians per level)
#   rss-{demo,3b,8b}.json  fp8serve bench rss (server peak RSS vs weights + KV budget)
#   RESULTS.md             the markdown table for the README (python -m engine.bench.report)
#
# Environment: OUT (results dir), MODELS (where synth checkpoints are written once; about
# 4 GB for 3B, 9 GB for 8B), THREADS (default: all cores), BASELINES_3B (default
# transformers; '' = none), RUN_8B=1 to include the 8B-shaped RSS run, SKIP="kernels serve"
# to skip steps (names: kernels generate-demo generate-3b serve rss-demo rss-3b rss-8b).
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."

OUT=${OUT:-bench/results}
MODELS=${MODELS:-${FP8SERVE_CACHE_DIR:-$HOME/.cache/fp8serve}/bench-models}
THREADS=${THREADS:-$(nproc)}
BASELINES_3B=${BASELINES_3B-transformers}
RUN_8B=${RUN_8B:-0}
SKIP=${SKIP:-}
SERVE_ROUNDS=${SERVE_ROUNDS:-3}
PY=${PYTHON:-python}
FP8SERVE=("$PY" -m cli.main --log-level WARNING)
mkdir -p "$OUT" "$MODELS"

want() { [[ " $SKIP " != *" $1 "* ]]; }
step() { echo; echo "=== $* ($(date +%H:%M:%S), load $(cut -d' ' -f1 /proc/loadavg))"; }

synth() {  # synth SHAPE: a random-weight checkpoint under $MODELS/SHAPE, written once
  local dir="$MODELS/$1"
  if [[ ! -f "$dir/config.json" ]]; then
    rm -rf "$dir.partial"
    "${FP8SERVE[@]}" synth-model --shape "$1" --layout hf-text --out "$dir.partial" >&2
    mv "$dir.partial" "$dir"
  fi
  echo "$dir"
}

SERVER_PID=
cleanup() { [[ -n "$SERVER_PID" ]] && kill "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" || true; }
trap cleanup EXIT

serve_bench() {  # the demo model behind a real server, concurrency 1, 4, 16
  local port log
  port=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  log="$OUT/serve-demo.server.log"
  "${FP8SERVE[@]}" serve --port "$port" --max-num-seqs 16 --threads "$THREADS" >"$log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
    kill -0 "$SERVER_PID" || { tail -20 "$log"; return 1; }
    sleep 1
  done
  "${FP8SERVE[@]}" bench serve --url "http://127.0.0.1:$port" --concurrency 1 4 16 \
    --num-prompts 32 --input-len 128 --output-len 64 --rounds "$SERVE_ROUNDS" \
    --json-out "$OUT/serve-demo.json"
  kill "$SERVER_PID"; wait "$SERVER_PID" || true; SERVER_PID=
}

if want kernels; then
  step "kernel benchmark"
  "${FP8SERVE[@]}" bench kernels --json "$OUT/kernels.json" --png "$OUT/kernels.png"
fi
if want generate-demo; then
  step "generate: demo model"
  "${FP8SERVE[@]}" bench generate --threads "$THREADS" --json "$OUT/generate-demo.json"
fi
if want generate-3b; then
  step "generate: 3B-shaped synth model"
  "${FP8SERVE[@]}" bench generate --model "$(synth ministral-3-3b)" \
    --threads "$THREADS" --baselines "$BASELINES_3B" --hf-dtype bfloat16 \
    --json "$OUT/generate-3b.json"
fi
if want serve; then
  step "serve: demo model at concurrency 1, 4, 16"
  serve_bench
fi
if want rss-demo; then
  step "rss: demo model"
  "${FP8SERVE[@]}" bench rss --threads "$THREADS" --json "$OUT/rss-demo.json"
fi
if want rss-3b; then
  step "rss: 3B-shaped synth model"
  "${FP8SERVE[@]}" bench rss --model "$(synth ministral-3-3b)" --threads "$THREADS" \
    --json "$OUT/rss-3b.json"
fi
if [[ "$RUN_8B" == 1 ]] && want rss-8b; then
  step "rss: 8B-shaped synth model"
  "${FP8SERVE[@]}" bench rss --model "$(synth ministral-3-8b)" --threads "$THREADS" \
    --json "$OUT/rss-8b.json"
fi

step "results table"
"$PY" -m engine.bench.report "$OUT" | tee "$OUT/RESULTS.md"
echo "wrote $OUT/RESULTS.md"
