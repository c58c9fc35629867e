# The two commands of the README: `make demo` (the main job) and `make test` (the tests).
# Each installs what it needs first, idempotently, into .venv (built from uv.lock).
SHELL := /bin/bash
PYTHON ?= python3
UV_VERSION := 0.13.9
UV := .tools/bin/uv
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: install demo test lint typecheck bench clean

$(UV):
	$(PYTHON) -m venv .tools
	.tools/bin/pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)

$(STAMP): $(UV) pyproject.toml uv.lock
	$(UV) sync --frozen --python $(PYTHON)
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(VENV)/bin/evalfleet demo

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy .

test: install lint
	$(VENV)/bin/python -m pytest -q

bench: install
	$(VENV)/bin/evalfleet bench queue
	$(VENV)/bin/evalfleet bench planner --all

clean:
	rm -rf $(VENV) .tools .pytest_cache .mypy_cache .ruff_cache
