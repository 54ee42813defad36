#!/usr/bin/env bash
# Build the fp8serve image with podman where no container registry is reachable: a local
# base image (deploy/image/build-base.sh, built on first use) stands in for
# python:3.11-slim-bookworm, and pip in the build stage uses this machine's pip sources
# (find-links / extra-index-url directories bind-mounted read-only, its CA bundle).
#
#   deploy/image/build-local.sh [extra podman build args...]
#
# Environment (all optional):
#   IMAGE            tag to build                    (fp8serve:<package version>)
#   BASE_IMAGE       local base image                (localhost/fp8serve-base:bookworm)
#   CONTEXT          build context directory         (the repository root)
#   FIND_LINKS       pip find-links, space-separated (pip config global.find-links)
#   EXTRA_INDEX_URL  pip extra index URLs            (pip config global.extra-index-url)
#   INDEX_URL        pip index URL                   (pip's default)
#   CA_BUNDLE        CA bundle pip should trust      ($PIP_CERT or the system bundle)
#   TORCH_INDEX_URL  torch's index; empty = the pip sources above (empty)
# The Dockerfile's own defaults (public base image, PyTorch CPU index) are untouched.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
IMAGE=${IMAGE:-fp8serve:$(sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT/pyproject.toml")}
BASE_IMAGE=${BASE_IMAGE:-localhost/fp8serve-base:bookworm}
CONTEXT=${CONTEXT:-$ROOT}
PIP=(python3 -m pip)

pip_config() {  # the host's pip setting $1, empty if unset
    "${PIP[@]}" config get "$1" 2>/dev/null || true
}
FIND_LINKS=${FIND_LINKS-${PIP_FIND_LINKS:-$(pip_config global.find-links)}}
EXTRA_INDEX_URL=${EXTRA_INDEX_URL-${PIP_EXTRA_INDEX_URL:-$(pip_config global.extra-index-url)}}
INDEX_URL=${INDEX_URL-${PIP_INDEX_URL:-$(pip_config global.index-url)}}
CA_BUNDLE=${CA_BUNDLE:-${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}}
TORCH_INDEX_URL=${TORCH_INDEX_URL-}

if ! podman image exists "$BASE_IMAGE"; then
    echo "== base image $BASE_IMAGE not found: building it"
    "$HERE/build-base.sh" "$BASE_IMAGE"
fi

# Local pip sources (/dir or file:///dir[/simple]) are mounted at the same path, read-only;
# an index's "simple" pages link to files beside it, so its parent is mounted.
declare -A MOUNTED=()
MOUNTS=()
mount_local() {
    local src=${1#file://}
    [[ $src == /* && -e $src ]] || return 0
    [[ $(basename "$src") == simple ]] && src=$(dirname "$src")
    [[ -n ${MOUNTED[$src]:-} ]] && return 0
    MOUNTED[$src]=1
    MOUNTS+=(-v "$src:$src:ro")
}
for src in $FIND_LINKS $EXTRA_INDEX_URL $INDEX_URL; do mount_local "$src"; done

ARGS=(--build-arg "PYTHON_IMAGE=$BASE_IMAGE" --build-arg "TORCH_INDEX_URL=$TORCH_INDEX_URL")
[[ -n $FIND_LINKS ]] && ARGS+=(--build-arg "PIP_FIND_LINKS=$FIND_LINKS")
[[ -n $EXTRA_INDEX_URL ]] && ARGS+=(--build-arg "PIP_EXTRA_INDEX_URL=$EXTRA_INDEX_URL")
[[ -n $INDEX_URL ]] && ARGS+=(--build-arg "PIP_INDEX_URL=$INDEX_URL")
if [[ -r $CA_BUNDLE ]]; then
    MOUNTS+=(-v "$CA_BUNDLE:/etc/fp8serve-build-ca.crt:ro")
    ARGS+=(--build-arg "PIP_CERT=/etc/fp8serve-build-ca.crt")
fi

set -x
podman build --isolation chroot --format docker --pull=never \
    "${MOUNTS[@]}" "${ARGS[@]}" -f "$ROOT/Dockerfile" -t "$IMAGE" "$@" "$CONTEXT"
