# syntax=docker/dockerfile:1
# Two images from one file:
#   docker build --target operator -t ghcr.io/batchd/batchd-operator:0.1.0 .
#   docker build --target replica  -t ghcr.io/batchd/batchd-replica:0.1.0 .            # CUDA-capable
#   docker build --target replica  --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu \
#                -t ghcr.io/batchd/batchd-replica:0.1.0-cpu .                              # CPU only, ~1/5 the size
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS base
ARG VERSION=0.1.0
LABEL org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="https://github.com/batchd/batchd" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONSAFEPATH=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# The same non-root user the operator's pod security context names (runAsUser 10001).
RUN groupadd --gid 10001 batchd \
    && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin batchd
WORKDIR /app

# One wheel of batchd; each target installs it with its own extra.
FROM base AS build
COPY pyproject.toml README.md ./
COPY api api
COPY replica replica
COPY operator operator
COPY bench bench
RUN pip wheel --no-deps --wheel-dir /wheels .

FROM base AS operator
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="batchd-operator" \
      org.opencontainers.image.description="Kopf operator that runs BatchedDeployments (no torch)"
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir "/wheels/batchd-${VERSION}-py3-none-any.whl[operator]"
USER 10001:10001
EXPOSE 8080 9090
ENTRYPOINT ["python", "-m", "batchd.operator"]

FROM base AS replica
ARG VERSION=0.1.0
# Empty: PyPI's torch, which brings CUDA and runs on NVIDIA GPUs (and CPUs).
# https://download.pytorch.org/whl/cpu: a CPU-only torch, for nodes without GPUs.
ARG TORCH_INDEX_URL=""
LABEL org.opencontainers.image.title="batchd-replica" \
      org.opencontainers.image.description="FastAPI batching server for one model (torch, transformers)"
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    if [ -n "${TORCH_INDEX_URL}" ]; then \
        pip install --no-cache-dir --index-url "${TORCH_INDEX_URL}" torch==2.13.0; \
    fi \
    && pip install --no-cache-dir "/wheels/batchd-${VERSION}-py3-none-any.whl[replica]"
# Handlers named by import path (model.handler) are imported from /app; the examples ship too.
COPY examples examples
# The root file system is read-only in the pod; the operator mounts an emptyDir here.
ENV HF_HOME=/var/cache/batchd/huggingface
USER 10001:10001
EXPOSE 8000
ENTRYPOINT ["batchd"]
CMD ["serve", "/etc/batchd/manifest.yaml", "--host", "0.0.0.0", "--port", "8000"]
