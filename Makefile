# Two entry points on a fresh clone:
#   make run   - set up a virtualenv and run the main job (the staged pipeline on the tiny CPU config)
#   make test  - set up and run the whole test suite, starting the servers the tests need
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml Makefile images/rollout/Dockerfile | sha256sum | cut -c1-12)
CONFIG ?= configs/tiny-cpu.yaml
TORCH_INDEX ?=
# SGLang's own request structs are read from its source by tests/rollout/test_sglang_structs.py: the
# version the rollout image is built on, installed without its dependencies (nothing imports it).
SGLANG_VERSION := $(shell sed -n 's/^ARG BASE_IMAGE=lmsysorg\/sglang:v\([0-9.]*\).*/\1/p' images/rollout/Dockerfile)

.PHONY: setup run ablate test lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile images/rollout/Dockerfile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# The CPU wheel first, so the torch range in pyproject.toml is already satisfied. Where the package
	# index serves the multi-GB CUDA build under that name (PyPI does on Linux), take the CPU build from
	# PyTorch's own index: make setup TORCH_INDEX=https://download.pytorch.org/whl/cpu
	$(BIN)/pip install --quiet $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev,test,kfp]'
	$(BIN)/pip install --quiet --no-deps sglang==$(SGLANG_VERSION)
	rm -f $(VENV)/.installed-*
	touch $@

run: setup
	$(BIN)/ringzero run $(CONFIG)

# The seed's four claims side by side over two seeds (ringzero.pipeline.studies); reuses `make run`'s stages
ablate: setup
	for study in loss distill depth islands; do $(BIN)/ringzero ablate $(CONFIG) --study $$study || exit 1; done

# tests/run_all.sh runs `make setup` itself, while the test servers start beside it
test:
	bash tests/run_all.sh

lint: setup
	$(BIN)/ruff check ringzero tests bench components pipelines
	$(BIN)/ruff format --check ringzero tests bench components pipelines

clean:
	rm -rf $(VENV) runs .pytest_cache
