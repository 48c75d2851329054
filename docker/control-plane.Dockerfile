# syntax=docker/dockerfile:1
# tandem control plane: gateway, router and planner. No model weights run here, but the gateway's tokenizer
# stack and the `tandem` CLI import torch, so it carries the CPU build of torch. The planner's compose connector
# runs `docker compose` against the host's Docker socket: the CLI and its compose plugin come from Docker's image.
# Build from the repository root: docker build -f docker/control-plane.Dockerfile .
ARG PYTHON_VERSION=3.11
ARG DOCKER_CLI_TAG=28.5.1-cli
FROM docker:${DOCKER_CLI_TAG} AS docker-cli

FROM python:${PYTHON_VERSION}-slim-bookworm
COPY --from=docker-cli /usr/local/bin/docker /usr/local/bin/docker
COPY --from=docker-cli /usr/local/libexec/docker/cli-plugins/docker-compose /usr/local/libexec/docker/cli-plugins/docker-compose

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TANDEM_CACHE_DIR=/cache \
    HF_HUB_OFFLINE=1
WORKDIR /opt/tandem

# torch first, from the CPU index and at constraints.txt's version, so nothing later pulls another build
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
COPY constraints.txt pyproject.toml ./
RUN pip install -c constraints.txt --index-url ${TORCH_INDEX} torch

# the project's dependencies in their own layer: rebuilt when pyproject.toml changes, not on every edit
COPY docker/pyproject_deps.py docker/healthcheck.py docker/
RUN python docker/pyproject_deps.py pyproject.toml > /tmp/requirements.txt \
 && pip install -c constraints.txt -r /tmp/requirements.txt \
 && rm /tmp/requirements.txt

# the project, editable: the generated protobuf modules (tandem/v1) and engine data files live in the tree
COPY . .
RUN pip install --no-deps -e . \
 && python -m services.common.protos --force \
 && python -c "import services.gateway.server, services.router.server, services.planner.server"

RUN useradd --uid 10001 --create-home --shell /usr/sbin/nologin tandem \
 && mkdir -p /cache && chown tandem:tandem /cache
USER tandem
EXPOSE 8000 50051 50071 9464
CMD ["tandem", "serve", "gateway"]
