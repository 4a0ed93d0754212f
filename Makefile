# agentmesh developer entry points. Each target works on a fresh machine with only Python.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PROTOS := $(wildcard protos/agentmesh/v1/*.proto)
STUBS  := lib/agentmesh/v1/.generated

.PHONY: install browser stubs demo test bench up clean

install: $(VENV)/.installed $(STUBS) browser

# The web console's tests run in Debian's chromium; without it they are skipped, with a reason.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if command -v apt-get >/dev/null 2>&1; then \
	    SUDO=""; [ "$$(id -u)" -ne 0 ] && SUDO="sudo"; \
	    echo "installing Debian's chromium for the browser tests"; \
	    $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium \
	      || echo "warning: could not install chromium; the browser tests will be skipped"; \
	  else echo "note: no apt-get here; install chromium to run the browser tests"; fi; }

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
