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

$(STAMP): $(UV) pyproject.toml uv.lock Makefile
	$(UV) sync --frozen --compile-bytecode --python $(PYTHON)
	touch $(STAMP)

install: $(STAMP)

# Where a PostgreSQL server answers on 127.0.0.1:5432 the demo's Prefect server uses it (a
# SQLite-backed Prefect server stalls under the instances' concurrent writes); else SQLite.
DEMO_PREFECT_DB := $(shell command -v pg_isready >/dev/null 2>&1 && pg_isready -q -h 127.0.0.1 -p 5432 && echo postgresql+asyncpg://postgres@127.0.0.1:5432/evalfleet_demo_prefect)

demo: install
	$(VENV)/bin/evalfleet demo $(if $(DEMO_PREFECT_DB),--prefect-db $(DEMO_PREFECT_DB))

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy .

# --durations: the slowest tests are named in every run's log (CI's too), so one that grows shows
test: install lint
	$(VENV)/bin/python -m pytest -q --durations=25

bench: install
	$(VENV)/bin/evalfleet bench queue
	$(VENV)/bin/evalfleet bench planner --all

clean:
	rm -rf $(VENV) .tools .pytest_cache .mypy_cache .ruff_cache
