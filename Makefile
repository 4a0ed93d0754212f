# agentmesh developer entry points. Each target works on a fresh machine with only Python.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PROTOS := $(wildcard protos/agentmesh/v1/*.proto)
STUBS  := lib/agentmesh/v1/.generated

.PHONY: install system-packages stubs demo test bench up clean

install: system-packages $(VENV)/.installed $(STUBS)

# bubblewrap and libseccomp2, installed when missing (as root or with passwordless sudo); else
# it stops with the command that installs them. SYSTEM_PACKAGES=skip leaves the machine alone.
system-packages:
ifneq ($(SYSTEM_PACKAGES),skip)
	@bash scripts/system-packages.sh $(PYTHON)
endif

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
