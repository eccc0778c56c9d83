# syntax=docker/dockerfile:1
# Three images from one file; `make images` builds them with the version from VERSION:
#   docker build --target operator --build-arg VERSION=$(cat VERSION) -t ghcr.io/batchd/batchd-operator:$(cat VERSION) .
#   docker build --target replica  --build-arg VERSION=$(cat VERSION) -t ghcr.io/batchd/batchd-replica:$(cat VERSION) .
#   docker build --target router   --build-arg VERSION=$(cat VERSION) -t ghcr.io/batchd/batchd-router:$(cat VERSION) .
# A CPU-only replica (about a fifth of the size): add --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS base
ARG VERSION=unset
LABEL org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="https://github.com/batchd/batchd" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# The non-root user the pods' security contexts name (batchd.api.pod.RUNTIME_UID).
RUN groupadd --gid 10001 batchd \
    && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin batchd
WORKDIR /app

# A wheel per shipped project. The benchmarks and the test support never enter this stage,
# so no image can carry them.
FROM base AS build
COPY VERSION ./
COPY api api
COPY operator operator
COPY replica replica
COPY router router
RUN pip wheel --no-deps --wheel-dir /wheels ./api ./operator ./replica ./router

# The spec and the operator: no torch, no FastAPI.
FROM base AS operator
LABEL org.opencontainers.image.title="batchd-operator" \
      org.opencontainers.image.description="Kopf operator that runs BatchedDeployments (no torch)"
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir /wheels/batchd_api-*.whl /wheels/batchd_operator-*.whl
USER 10001:10001
EXPOSE 8080 9090
ENTRYPOINT ["python", "-m", "batchd.operator"]

# The spec and the replica, with the torch that replica/pyproject.toml pins.
FROM base AS replica
# PyPI (the default): torch with CUDA, for NVIDIA GPUs (and CPUs).
# https://download.pytorch.org/whl/cpu: the same torch release as a CPU-only build (its +cpu
# local version sorts above PyPI's, so pip takes it).
ARG TORCH_INDEX_URL=https://pypi.org/simple
LABEL org.opencontainers.image.title="batchd-replica" \
      org.opencontainers.image.description="FastAPI batching server for one model (torch, transformers)"
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --extra-index-url "${TORCH_INDEX_URL}" \
        /wheels/batchd_api-*.whl /wheels/batchd_replica-*.whl
# Handlers named by import path (model.handler) are imported from /app; the examples ship too.
COPY examples examples
# The root file system is read-only in the pod; the operator mounts an emptyDir here.
ENV HF_HOME=/var/cache/batchd/huggingface
USER 10001:10001
EXPOSE 8000
ENTRYPOINT ["batchd"]
CMD ["serve", "/etc/batchd/manifest.yaml", "--host", "0.0.0.0", "--port", "8000"]

# The spec and the router: no torch, no FastAPI (uvicorn serves its plain ASGI app).
FROM base AS router
LABEL org.opencontainers.image.title="batchd-router" \
      org.opencontainers.image.description="Request router: picks a replica per request by load, holds requests at zero"
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir /wheels/batchd_api-*.whl /wheels/batchd_router-*.whl
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["batchd-router"]
