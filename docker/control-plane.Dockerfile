# tandem control plane: gateway, router and planner. No model weights run here, but the gateway's tokenizer
# stack and the `tandem` CLI import torch, so it carries the CPU build of torch. The scaler service
# runs `docker compose` against the host's Docker socket for the planner: the CLI and its compose plugin come from
# DOCKER_CLI_IMAGE (Docker's own image by default; offline, any image with the two at the same paths).
# Build from the repository root: docker build -f docker/control-plane.Dockerfile .
# Offline builds: as in worker-cpu.Dockerfile (BASE_IMAGE, TORCH_WHEELS, the `ca_bundle` secret).
ARG BASE_IMAGE=python:3.11-slim-bookworm
# an image whose /wheels pip takes torch from before TORCH_INDEX (its name, or the empty stage below)
ARG TORCH_WHEELS=no-wheels
ARG DOCKER_CLI_IMAGE=docker:28.5.1-cli
FROM ${DOCKER_CLI_IMAGE} AS docker-cli

FROM ${BASE_IMAGE} AS no-wheels
RUN mkdir -p /wheels
FROM ${TORCH_WHEELS} AS wheels

FROM ${BASE_IMAGE}
# the same steps as worker-cpu.Dockerfile up to the project's dependencies, so both images share those layers
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    TANDEM_CACHE_DIR=/cache \
    HF_HUB_OFFLINE=1
WORKDIR /opt/tandem
RUN python3 -m venv /opt/venv

ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
COPY constraints.txt pyproject.toml ./
RUN --mount=type=secret,id=ca_bundle --mount=type=bind,from=wheels,source=/wheels,target=/wheels \
    if [ -s /run/secrets/ca_bundle ]; then export PIP_CERT=/run/secrets/ca_bundle; fi \
 && pip install -c constraints.txt --find-links /wheels --index-url ${TORCH_INDEX} torch

COPY docker/pyproject_deps.py docker/healthcheck.py docker/
RUN --mount=type=secret,id=ca_bundle \
    if [ -s /run/secrets/ca_bundle ]; then export PIP_CERT=/run/secrets/ca_bundle; fi \
 && python docker/pyproject_deps.py pyproject.toml > /tmp/requirements.txt \
 && pip install -c constraints.txt -r /tmp/requirements.txt \
 && rm /tmp/requirements.txt

COPY --from=docker-cli /usr/local/bin/docker /usr/local/bin/docker
COPY --from=docker-cli /usr/local/libexec/docker/cli-plugins/docker-compose /usr/local/libexec/docker/cli-plugins/docker-compose

# the router's compiled kernels are cached here at build time, so a router starts without compiling them (~5 s of
# CPU); the directory stays writable by the service user (numba uses a cache directory only where it can write)
ENV NUMBA_CACHE_DIR=/var/cache/tandem/numba
# the project, editable: the generated protobuf modules (tandem/v1) and engine data files live in the tree
COPY . .
RUN --mount=type=secret,id=ca_bundle \
    if [ -s /run/secrets/ca_bundle ]; then export PIP_CERT=/run/secrets/ca_bundle; fi \
 && pip install --no-deps -e . \
 && python -m services.common.protogen --force \
 && python -c "import services.gateway.server, services.router.server, services.planner.server, services.scaler.server" \
 && python -c "from services.router.policy import make_policy; make_policy('kv')"

# a fresh named volume mounted on one of these takes its owner and mode: the scaler writes its token, compose's
# `certs` service the CA (/pki/ca) and each role's files (/pki/<role>), which services mount at /etc/tandem/tls;
# the gateway its SQLite response store. /pki/redis holds only Redis's password, which the redis image's own user
# reads, so that one volume stays traversable (0755; the file itself is 0644 and no other service mounts it)
RUN useradd --uid 10001 --create-home --shell /usr/sbin/nologin tandem \
 && mkdir -p /cache /var/lib/tandem/scaler /var/lib/tandem/responses /etc/tandem/tls /pki/ca /pki/gateway /pki/router /pki/planner \
    /pki/prefill /pki/decode /pki/redis \
 && chown -R tandem:tandem "$NUMBA_CACHE_DIR" \
 && chown tandem:tandem /cache /var/lib/tandem/scaler /var/lib/tandem/responses /etc/tandem/tls /pki /pki/* \
 && chmod 0700 /var/lib/tandem/scaler /etc/tandem/tls /pki/* \
 && chmod 0755 /pki/redis
USER tandem
EXPOSE 8000 50051 50071 9464
CMD ["tandem", "serve", "gateway"]
