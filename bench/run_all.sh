#!/usr/bin/env bash
# Regenerates every figure of docs/performance.md into bench/results/:
#   kernels.json/.png      fp8serve bench kernels (Ministral-3-8B linear shapes)
#   generate-demo.json     fp8serve bench generate on the demo model (+ transformers, llama.cpp)
#   generate-3b.json       fp8serve bench generate on a 3B-shaped synth checkpoint
#   overhead-demo.json     fp8serve bench overhead on the demo model: the runner alone, behind
#                          the engine, and streamed over HTTP, concurrency 1 and 8, interleaved
#   lm-head-{demo,3b}.json fp8serve bench lm-head: FP8 vs bf16 lm_head (KL, top-1, greedy,
#                          interleaved decode speed) on the demo and 3B-shaped models
#   llamacpp.json          fp8serve bench llamacpp: llama.cpp built for this host once (the
#                          baselines' library and llama-server), what it was compiled for
#   serve-demo.json        fp8serve bench serve at concurrency 1, 4, 16 on the demo model
#   llama-serve-demo.json  bench serve --llama-server: fp8serve and llama-server on the demo
#                          model's weights, concurrency 1, 4, 16, interleaved rounds: the
#                          original Q4_1 GGUF, and (llama-serve-demo-q8_0.json) the Q8_0
#                          export of fp8serve's FP8 checkpoint
#   flags-serve-demo-prefill-cap{,-long}.json  bench serve --compare-server-arg: the demo
#                          model as started by default (no prefill cap in steps that decode)
#                          against --max-prefill-tokens-with-decodes=128, prompts of 128 and
#                          512 ids, concurrency 4 and 16, interleaved rounds
#   vision.json            fp8serve bench vision on the 3B-shaped synth checkpoint
#                          (SERVE_ROUNDS interleaved rounds, default 3: medians per level)
#   rss-{demo,3b,8b}.json  fp8serve bench rss (server peak RSS vs weights + KV budget)
#   prefix-shared-demo.json    bench serve --workload shared-prefix on the demo model: a
#                          500-id system prompt, cache on vs off (cache_salt passes)
#   prefix-random-demo.json    bench serve (random, no shared prefix) on a demo server with
#                          the prefix cache vs one started with --no-enable-prefix-caching
#   prefix-multiturn-3b.json   bench serve --workload multi-turn on the 3B-shaped synth
#                          model: 4 turns after a 500-id system prompt, cache on vs off
#                          (the prefix-* steps need a server with --enable-prefix-caching)
#   structured-demo.json   fp8serve bench structured on the demo model: json_schema-
#                          constrained vs unconstrained decode at concurrency 1 and 16
#   spec-{ngram,prediction-text,prediction-answer}-demo.json  bench generate with drafts vs
#                          plain decoding on the demo model (grounded, code-edit; story too for
#                          ngram and answer), concurrency 1 and 16, 2 interleaved rounds: the
#                          n-gram lookup (k=8), predicted outputs (the text the prompt quotes or
#                          edits, as a client sends it), and the plain pass's own output as the
#                          prediction (every drafted token right: the ceiling)
#   prediction-serve-demo-{code-edit,grounded}.json  bench serve --prediction: two demo servers
#                          with the same flags driven interleaved with the workload's chat
#                          requests, the second's carrying the function or passage as their
#                          prediction (concurrency 1, 4, 16; closed-loop clients, 128 tokens)
#   structured-spec-{demo,3b}.json  bench structured --speculative-config: speculative vs
#                          plain constrained decoding (extraction, tool-args, free-json) at
#                          concurrency 1; the 3B-shaped model drafts with --spec-oracle right
#   host.json              fp8serve kernels --json: the hardware probe (host class, probe line)
#   RESULTS.md             every table of this run (python -m bench.report.results)
# and rewrites this host class's section of docs/performance.md, with its charts under
# docs/img/ (python -m bench.report.perf_doc; the other host classes' sections stay).
#
# Environment: OUT (results dir), MODELS (where synth checkpoints are written once; about
# 4 GB for 3B, 9 GB for 8B), THREADS (default: all cores), GEN_ROUNDS (interleaved rounds
# of the generate steps, default 3: one round on a shared host can read a ratio 20% off),
# BASELINES_3B (default
# transformers,python_layers; '' = none), RUN_8B=1 to include the 8B-shaped RSS run, SKIP="kernels serve"
# to skip steps (names: llamacpp kernels generate-demo generate-3b overhead lm-head-demo lm-head-3b
# serve prefill-cap llama-serve rss-demo rss-3b rss-8b prefix-demo prefix-3b spec structured structured-spec
# vision; without the llamacpp step the llama.cpp baselines use a build made earlier, else
# llama-cpp-python's own library, as the results say), KERNEL_M
# (the kernel step's M values, default 1,8,32,128,512).
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."

# the settings this run was given, for the command docs/performance.md shows
GIVEN=""
for v in THREADS BASELINES_3B RUN_8B SKIP SERVE_ROUNDS GEN_ROUNDS KERNEL_M; do
  if [[ -v $v ]]; then GIVEN+="$v=\"${!v}\" "; fi
done
OUT=${OUT:-bench/results}
MODELS=${MODELS:-${FP8SERVE_CACHE_DIR:-$HOME/.cache/fp8serve}/bench-models}
THREADS=${THREADS:-$(nproc)}
BASELINES_3B=${BASELINES_3B-transformers,python_layers}
RUN_8B=${RUN_8B:-0}
SKIP=${SKIP:-}
SERVE_ROUNDS=${SERVE_ROUNDS:-3}
GEN_ROUNDS=${GEN_ROUNDS:-3}
KERNEL_M=${KERNEL_M:-1,8,32,128,512}
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

SERVER_PIDS=()
stop_servers() {
  local pid
  for pid in "${SERVER_PIDS[@]}"; do kill "$pid" 2>/dev/null && wait "$pid" || true; done
  SERVER_PIDS=()
}
trap stop_servers EXIT

start_server() {  # start_server LOG ARGS...: `fp8serve serve ARGS` on a free port; sets URL
  local port log=$1; shift
  port=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  "${FP8SERVE[@]}" serve --port "$port" --threads "$THREADS" "$@" >"$log" 2>&1 &
  SERVER_PIDS+=($!)
  URL="http://127.0.0.1:$port"
  for _ in $(seq 600); do
    curl -sf "$URL/health" >/dev/null && return 0
    kill -0 "${SERVER_PIDS[-1]}" || { tail -20 "$log"; return 1; }
    sleep 1
  done
  return 1
}

serve_bench() {  # the demo model behind a real server, concurrency 1, 4, 16
  start_server "$OUT/serve-demo.server.log" --max-num-seqs 16
  "${FP8SERVE[@]}" bench serve --url "$URL" --concurrency 1 4 16 \
    --num-prompts 32 --input-len 128 --output-len 64 --rounds "$SERVE_ROUNDS" \
    --json-out "$OUT/serve-demo.json"
  stop_servers
}

has_prefix_caching() {
  [[ $("${FP8SERVE[@]}" serve --help) == *--no-enable-prefix-caching* ]] \
    || { echo "skipped: this server has no --enable-prefix-caching"; return 1; }
}

prefix_demo() {  # demo: shared prefix on vs off; no shared prefix, cache vs no-cache server
  start_server "$OUT/prefix-demo.server.log" --max-num-seqs 16
  local on=$URL
  "${FP8SERVE[@]}" bench serve --url "$on" --workload shared-prefix --concurrency 1 4 \
    --num-prompts 16 --system-len 500 --input-len 64 --output-len 32 \
    --rounds "$SERVE_ROUNDS" --json-out "$OUT/prefix-shared-demo.json"
  start_server "$OUT/prefix-demo-off.server.log" --max-num-seqs 16 --no-enable-prefix-caching
  "${FP8SERVE[@]}" bench serve --url "$on" --compare-url "$URL" --concurrency 1 4 16 \
    --num-prompts 32 --input-len 128 --output-len 64 --rounds "$SERVE_ROUNDS" \
    --json-out "$OUT/prefix-random-demo.json"
  stop_servers
}

prefix_3b() {  # 3B: one chat at a time, 4 turns after a 500-id system prompt, on vs off
  start_server "$OUT/prefix-3b.server.log" --model "$(synth ministral-3-3b)" --max-num-seqs 4
  "${FP8SERVE[@]}" bench serve --url "$URL" --workload multi-turn --concurrency 1 \
    --num-prompts 4 --turns 4 --system-len 500 --input-len 64 --output-len 32 \
    --rounds "$SERVE_ROUNDS" --json-out "$OUT/prefix-multiturn-3b.json"
  stop_servers
}

step "hardware probe"
"${FP8SERVE[@]}" kernels --json >"$OUT/host.json"
if want llamacpp; then
  step "llama.cpp for this host (built once; an hour on 2 cores the first time)"
  "${FP8SERVE[@]}" bench llamacpp --json "$OUT/llamacpp.json"
fi
if want kernels; then
  step "kernel benchmark"
  "${FP8SERVE[@]}" bench kernels --threads "$THREADS" --m "$KERNEL_M" \
    --json "$OUT/kernels.json" --png "$OUT/kernels.png"
fi
if want generate-demo; then
  step "generate: demo model"
  "${FP8SERVE[@]}" bench generate --threads "$THREADS" --rounds "$GEN_ROUNDS" \
    --json "$OUT/generate-demo.json"
fi
if want generate-3b; then
  step "generate: 3B-shaped synth model"
  "${FP8SERVE[@]}" bench generate --model "$(synth ministral-3-3b)" \
    --threads "$THREADS" --baselines "$BASELINES_3B" --hf-dtype bfloat16 \
    --rounds "$GEN_ROUNDS" --json "$OUT/generate-3b.json"
fi
if want overhead; then
  step "overhead: runner, engine and HTTP on the demo model"
  "${FP8SERVE[@]}" bench overhead --threads "$THREADS" --rounds "$GEN_ROUNDS" \
    --concurrency 1 8 --json "$OUT/overhead-demo.json"
fi
if want lm-head-demo; then
  step "lm-head: FP8 vs bf16 head, demo model"
  "${FP8SERVE[@]}" bench lm-head --threads "$THREADS" --speed-rounds 5 \
    --json "$OUT/lm-head-demo.json"
fi
if want lm-head-3b; then
  step "lm-head: FP8 vs bf16 head, 3B-shaped synth model"
  "${FP8SERVE[@]}" bench lm-head --model "$(synth ministral-3-3b)" --threads "$THREADS" \
    --random-prompts --prompts 2 --kl-tokens 24 --greedy-tokens 16 --speed-rounds 3 \
    --speed-tokens 8 --json "$OUT/lm-head-3b.json"
fi
if want serve; then
  step "serve: demo model at concurrency 1, 4, 16"
  serve_bench
fi
if want prefill-cap; then
  step "serve: demo model, no prefill cap (default) vs 128, prompts of 128 and 512 ids"
  CAP=(bench serve --compare-server-arg=--max-prefill-tokens-with-decodes=128
    --concurrency 4 16 --output-len 64 --rounds "$SERVE_ROUNDS")
  "${FP8SERVE[@]}" "${CAP[@]}" --num-prompts 32 --input-len 128 \
    --json-out "$OUT/flags-serve-demo-prefill-cap.json"
  "${FP8SERVE[@]}" "${CAP[@]}" --num-prompts 24 --input-len 512 \
    --json-out "$OUT/flags-serve-demo-prefill-cap-long.json"
fi
if want llama-serve; then
  step "serve: demo model, fp8serve vs llama-server (Q4_1, Q8_0) at concurrency 1, 4, 16"
  LLAMA_SERVE=(bench serve --llama-server --threads "$THREADS" --concurrency 1 4 16
    --num-prompts 32 --input-len 128 --output-len 64 --rounds "$SERVE_ROUNDS")
  "${FP8SERVE[@]}" "${LLAMA_SERVE[@]}" --json-out "$OUT/llama-serve-demo.json"
  "${FP8SERVE[@]}" "${LLAMA_SERVE[@]}" --model-dir "$("$PY" -c \
    'from engine.demo_model import ensure_demo_model; print(ensure_demo_model())')" \
    --gguf-type Q8_0 --json-out "$OUT/llama-serve-demo-q8_0.json"
fi
if want prefix-demo && has_prefix_caching; then
  step "prefix caching: demo model, shared prefix and no shared prefix"
  prefix_demo
fi
if want prefix-3b && has_prefix_caching; then
  step "prefix caching: 3B-shaped synth model, multi-turn"
  prefix_3b
fi
if want structured; then
  step "structured: json_schema-constrained vs unconstrained decode, demo model"
  "${FP8SERVE[@]}" bench structured --threads "$THREADS" --rounds 5 --gen-len 32 \
    --json "$OUT/structured-demo.json"
fi
if want spec; then
  step "spec: n-gram drafts and predicted outputs vs plain decoding, demo model"
  NGRAM='{"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_max": 4, "prompt_lookup_min": 2}'
  SPEC_ARGS=(--threads "$THREADS" --rounds 2 --gen-len 128 --concurrency 1 16)
  "${FP8SERVE[@]}" bench generate "${SPEC_ARGS[@]}" --speculative-config "$NGRAM" \
    --json "$OUT/spec-ngram-demo.json"
  "${FP8SERVE[@]}" bench generate "${SPEC_ARGS[@]}" --prediction text \
    --json "$OUT/spec-prediction-text-demo.json"
  "${FP8SERVE[@]}" bench generate "${SPEC_ARGS[@]}" --prediction answer \
    --json "$OUT/spec-prediction-answer-demo.json"
  for w in code-edit grounded; do
    "${FP8SERVE[@]}" bench serve --prediction --workload "$w" --concurrency 1 4 16 \
      --num-prompts 16 --output-len 128 --rounds 2 --server-arg="--threads=$THREADS" \
      --json-out "$OUT/prediction-serve-demo-$w.json"
  done
fi
if want structured-spec; then
  step "structured-spec: speculative vs plain constrained decoding, demo and 3B-shaped"
  STRUCT_SPEC='{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}'
  "${FP8SERVE[@]}" bench structured --threads "$THREADS" --rounds 3 \
    --speculative-config "$STRUCT_SPEC" --json "$OUT/structured-spec-demo.json"
  "${FP8SERVE[@]}" bench structured --model "$(synth ministral-3-3b)" --threads "$THREADS" \
    --rounds 1 --gen-len 24 --workloads extraction,tool-args --spec-oracle right \
    --speculative-config "$STRUCT_SPEC" --json "$OUT/structured-spec-3b.json"
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
if want vision; then
  step "vision: 3B-shaped synth model (encode GFLOP/s, one-image TTFT, ITL during an encode)"
  "${FP8SERVE[@]}" bench vision --model "$(synth ministral-3-3b)" --serving \
    --json "$OUT/vision.json"
fi

step "results table"
"$PY" -m bench.report.results "$OUT" | tee "$OUT/RESULTS.md"
echo "wrote $OUT/RESULTS.md"
"$PY" -m bench.report.perf_doc "$OUT" --command "${GIVEN}bash bench/run_all.sh"
