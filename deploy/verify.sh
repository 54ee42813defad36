#!/usr/bin/env bash
# The whole deployment check on a host that can build images but not run containers
# (only Debian's and the Python package registries reachable), as root:
#
#   1. a Debian base image made locally: debootstrap + podman import (image/build-base.sh)
#   2. the image built from it: podman build --isolation chroot
#      --build-arg PYTHON_IMAGE=<that base> (image/build-local.sh)
#   3. the image's file system exported and the server started in it with chroot:
#      /health, /kernels and one completion (image/verify-image.sh), twice: with the
#      host's own ISA, then with FP8SERVE_ISA=avx2 (every FP8 layer must be on
#      avx2_w8a16: the image's AVX2 path, as on an AVX2-only host)
#   4. deploy/validate.py: hadolint, the Kubernetes manifests and custom resources
#      against their schemas, the compose files against the compose-spec, every PromQL
#      expression of the alerts, the dashboard and the autoscalers with promtool
#
#   deploy/verify.sh      (about 10 min on 2 shared cores, at nice 19, with an empty
#                          build cache and local pip sources)
#
# Needs, from Debian: podman debootstrap prometheus (promtool, step 4) nodejs npm (the CRD
# schemas of step 4, installed by `make deploy-schemas`).
#
# Environment: IMAGE (localhost/fp8serve:verify), BASE_IMAGE
# (localhost/fp8serve-base:bookworm), REUSE_BASE=1 keeps an existing base image (step 1
# then only checks it exists), PYTHON (python3; needs the test extra of pyproject.toml
# for step 4), plus those of the scripts in deploy/image/.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export IMAGE=${IMAGE:-localhost/fp8serve:verify}
export BASE_IMAGE=${BASE_IMAGE:-localhost/fp8serve-base:bookworm}
PYTHON=${PYTHON:-python3}
RESULTS=()
FAILED=0

step() {  # step NAME COMMAND...: run it, time it, record ok/FAIL
    local name=$1 start=$SECONDS rc
    shift
    echo
    echo "=== $name"
    "$@"
    rc=$?
    local took=$((SECONDS - start))
    if [[ $rc == 0 ]]; then RESULTS+=("ok   $name (${took}s)")
    else RESULTS+=("FAIL $name (${took}s, exit $rc)"); FAILED=1; fi
    return $rc
}

base() {
    if [[ ${REUSE_BASE:-0} == 1 ]] && podman image exists "$BASE_IMAGE"; then
        echo "reusing $BASE_IMAGE"
    else
        "$HERE/image/build-base.sh" "$BASE_IMAGE"
    fi
}

[[ $(id -u) -eq 0 ]] || { echo "verify.sh: run as root (debootstrap, podman, chroot)" >&2; exit 1; }
T0=$SECONDS
step "1. base image $BASE_IMAGE (debootstrap + podman import)" base \
    && step "2. image $IMAGE (podman build --isolation chroot)" "$HERE/image/build-local.sh"
if [[ $FAILED == 0 ]]; then
    step "3a. image checks + chroot smoke test (host ISA)" "$HERE/image/verify-image.sh" "$IMAGE"
    step "3b. chroot smoke test with FP8SERVE_ISA=avx2" \
        env ISA=avx2 EXPECT_KERNEL=avx2_w8a16 "$HERE/image/verify-image.sh" "$IMAGE"
fi
step "4. manifests, compose, Dockerfile, PromQL (deploy/validate.py)" \
    "$PYTHON" "$HERE/validate.py"

echo
echo "=== summary ($((SECONDS - T0))s in all)"
printf '%s\n' "${RESULTS[@]}"
exit $FAILED
