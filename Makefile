# Two entry points on a fresh clone:
#   make run   - set up a virtualenv and run the main job (the staged pipeline on the tiny CPU config)
#   make test  - set up and run the whole test suite, starting the servers the tests need
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-12)
CONFIG ?= configs/tiny-cpu.yaml

.PHONY: setup run test lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# The CPU wheel first, so the torch range in pyproject.toml is already satisfied.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev,test,kfp]'
	rm -f $(VENV)/.installed-*
	touch $@

run: setup
	$(BIN)/ringzero run $(CONFIG)

test: setup
	bash tests/run_all.sh

lint: setup
	$(BIN)/ruff check ringzero tests bench components pipelines

clean:
	rm -rf $(VENV) runs .pytest_cache
