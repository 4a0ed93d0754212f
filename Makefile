# agentmesh developer entry points. Each target works on a fresh machine with only Python.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PROTOS := $(wildcard protos/agentmesh/v1/*.proto)
STUBS  := lib/agentmesh/v1/.generated

.PHONY: install stubs demo test bench up clean

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

test: install
	$(PY) -m pytest -q

bench: install
	$(PY) -m benches

clean:
	rm -rf $(VENV) .venv-checkov lib/agentmesh/v1/*_pb2*.py* $(STUBS)
