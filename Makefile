# agentmesh developer entry points. Each target works on a fresh machine with only Python.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PROTOS := $(wildcard protos/agentmesh/v1/*.proto)
STUBS  := lib/agentmesh/v1/.generated

.PHONY: install stubs demo lint test bench up clean

install: $(VENV)/.installed $(STUBS)

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

stubs: $(STUBS)

$(STUBS): $(PROTOS) $(VENV)/.installed
	$(PY) -m grpc_tools.protoc -I protos --python_out=lib --pyi_out=lib --grpc_python_out=lib $(PROTOS)
	touch $@

demo: install
	$(VENV)/bin/agentmesh demo

up: install
	$(VENV)/bin/agentmesh up

# Gates: lint and import order, types (strict on the cores and the shared library), and the
# import-linter contracts that keep dependencies pointing inward (docs/architecture.md).
lint: install
	$(VENV)/bin/ruff check .
	$(PY) .ci/package_tree.py mypy -p agentmesh
	$(PY) .ci/package_tree.py lint-imports

test: install lint
	$(PY) -m pytest -q

bench: install
	$(PY) -m benches

clean:
	rm -rf $(VENV) .venv-checkov .mypy_cache .ruff_cache .import_linter_cache lib/agentmesh/v1/*_pb2*.py* $(STUBS)
