#!/usr/bin/env bash
# Build a local stand-in for python:3.11-slim-bookworm when no registry is reachable:
# debootstrap a minimal Debian bookworm root filesystem with Debian's python3 (3.11),
# venv support and CA certificates, then `podman import` it as a local image.
#
#   deploy/image/build-base.sh [IMAGE]        (default IMAGE: localhost/fp8serve-base:bookworm)
#
# Environment: MIRROR (default http://deb.debian.org/debian), SECURITY_MIRROR, SUITE (bookworm),
# WORKDIR (default: a fresh temporary directory, removed on exit). Needs root, debootstrap
# and podman. The image provides what the Dockerfile expects of its base: `python` and
# `python3` on PATH, `python -m venv`, apt-get and useradd.
set -euo pipefail

IMAGE=${1:-localhost/fp8serve-base:bookworm}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
SUITE=${SUITE:-bookworm}
SECURITY_MIRROR=${SECURITY_MIRROR:-http://deb.debian.org/debian-security}
PACKAGES=python3,python3-venv,python-is-python3,ca-certificates

[[ $(id -u) -eq 0 ]] || { echo "build-base.sh: run as root (debootstrap needs it)" >&2; exit 1; }
for tool in debootstrap podman; do
    command -v "$tool" >/dev/null || { echo "build-base.sh: $tool not found (apt-get install -y $tool)" >&2; exit 1; }
done

if [[ -n ${WORKDIR:-} ]]; then
    mkdir -p "$WORKDIR"
else
    WORKDIR=$(mktemp -d /var/tmp/fp8serve-base.XXXXXX)
    trap 'rm -rf "$WORKDIR"' EXIT
fi
ROOTFS=$WORKDIR/rootfs

debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$ROOTFS" "$MIRROR"

# Same apt sources and apt/dpkg trimming as the official Debian slim images (updates +
# security; no package caches, translations or docs left behind by later installs).
cat > "$ROOTFS/etc/apt/sources.list" <<SOURCES
deb $MIRROR $SUITE main
deb $MIRROR $SUITE-updates main
deb $SECURITY_MIRROR $SUITE-security main
SOURCES
cat > "$ROOTFS/etc/apt/apt.conf.d/docker-clean" <<'APT'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
APT
echo 'Acquire::Languages "none";' > "$ROOTFS/etc/apt/apt.conf.d/docker-no-languages"
echo 'APT::Install-Recommends "false";' > "$ROOTFS/etc/apt/apt.conf.d/docker-no-recommends"
cat > "$ROOTFS/etc/dpkg/dpkg.cfg.d/docker-slim" <<'DPKG'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
DPKG
rm -rf "$ROOTFS"/var/cache/apt/*.bin "$ROOTFS"/usr/share/locale/*
rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/archives/*.deb \
    "$ROOTFS"/usr/share/man/* "$ROOTFS"/usr/share/info/* \
    "$ROOTFS"/var/log/*.log "$ROOTFS"/tmp/* "$ROOTFS"/root/.cache
find "$ROOTFS/usr/share/doc" -type f ! -name copyright -delete  # licences stay
find "$ROOTFS/usr/share/doc" -mindepth 1 -depth -type d -empty -delete
# The rootfs must not carry this host's identity into the image.
: > "$ROOTFS/etc/resolv.conf"
: > "$ROOTFS/etc/hostname"

tar --numeric-owner --xattrs -C "$ROOTFS" -c . | podman import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    --message "debootstrap $SUITE minbase + $PACKAGES" \
    - "$IMAGE"

podman image inspect --format '{{.Id}} {{.Size}}' "$IMAGE"
echo "base image: $IMAGE"
