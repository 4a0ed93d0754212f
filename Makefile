# agentmesh developer entry points. Each target works on a fresh machine with only Python.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PROTOS := $(wildcard protos/agentmesh/v1/*.proto protos/agentmesh/internal/v1/*.proto)
STUBS  := lib/agentmesh/v1/.generated

.PHONY: install system-packages browser stubs demo lint gates test test-fast bench up clean wheels images

install: system-packages $(VENV)/.installed $(STUBS) browser

# bubblewrap and libseccomp2, installed when missing (as root or with passwordless sudo); else
# it stops with the command that installs them. SYSTEM_PACKAGES=skip leaves the machine alone.
system-packages:
ifneq ($(SYSTEM_PACKAGES),skip)
	@bash scripts/system-packages.sh $(PYTHON)
endif

# The web console's tests run in Debian's chromium; without it they are skipped, with a reason
# (so a failed install only warns).
browser:
ifneq ($(SYSTEM_PACKAGES),skip)
	@command -v chromium >/dev/null 2>&1 || { \
	  if command -v apt-get >/dev/null 2>&1; then \
	    SUDO=""; [ "$$(id -u)" -ne 0 ] && SUDO="sudo -n"; \
	    echo "installing Debian's chromium for the browser tests"; \
	    $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium \
	      || echo "warning: could not install chromium; the browser tests will be skipped"; \
	  else echo "note: no apt-get here; install chromium to run the browser tests"; fi; }
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

# Gates: lint and import order, types (strict on the cores and the shared library), and the
# import-linter contracts that keep dependencies pointing inward (docs/architecture.md).
lint: install
	@$(MAKE) --no-print-directory gates

gates:
	$(VENV)/bin/ruff check .
	$(PY) .ci/package_tree.py mypy -p agentmesh
	$(PY) .ci/package_tree.py lint-imports

# The suite on TEST_WORKERS pytest-xdist workers: every test has its own ports, homes and
# temporary directories, so tests run side by side; the image tests share one build and one
# podman stack and run on one worker (--dist loadgroup). Most tests wait on processes, sockets and
# jails rather than compute, hence more workers than cores. TEST_WORKERS=0: one process.
TEST_WORKERS ?= 4
PYTEST_WORKERS = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadgroup)
# The suite writes bytecode even where the environment says not to (PYTHONDONTWRITEBYTECODE,
# set on some CI and agent machines): pytest caches each test module's rewritten assertions
# there, and without it every worker of every run rewrites all ~290 modules again (~8 s of CPU
# each), and every `agentmesh` child process compiles the CLI modules it imports.

# The gates run beside the suite, not before it: their half-minute of CPU (mypy's, mostly) slows
# the suite less than the minute of wall time they took in front of it. Their output is held and
# printed after the suite's, so neither's is interleaved; the target fails if either fails.
test: install
	@gates_log=$$(mktemp); \
	$(MAKE) --no-print-directory gates >"$$gates_log" 2>&1 & gates_pid=$$!; \
	PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -q $(PYTEST_WORKERS); suite=$$?; \
	wait $$gates_pid; gates=$$?; \
	echo "--- the gates (make lint), run beside the suite ---"; cat "$$gates_log"; rm -f "$$gates_log"; \
	[ $$gates -eq 0 ] || echo "make test: the gates failed (above)"; \
	[ $$suite -eq 0 ] || echo "make test: the suite failed (see its summary above the gates)"; \
	[ $$suite -eq 0 ] && [ $$gates -eq 0 ]

# Before every commit (about 75 s on two cores): ruff, then the tests not marked slow — the cores against
# their ports, the shared library, each service's own tests; not the end-to-end, browser, chart,
# MCP-server, protocol, multi-replica or image tests (tests/conftest.py: SLOW_DIRS).
FAST_PATHS := tests/agent tests/cli tests/gateway tests/memory tests/observability tests/scheduler \
              tests/security tests/tools $(wildcard tests/test_*.py)

test-fast: install
	$(VENV)/bin/ruff check .
	PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -q $(PYTEST_WORKERS) -m "not slow" $(FAST_PATHS)

bench: install
	$(PY) -m benches

# The images the chart runs, built with buildah (no Docker engine needed). BASE_IMAGE: the
# base both Dockerfiles build on; the default is Debian bookworm with Debian's python3, made here
# with debootstrap (cached) because no container registry may be reachable. Elsewhere:
#   make images BASE_IMAGE=docker.io/library/python:3.11-slim-bookworm
# Tags match the chart's defaults (repository + appVersion), so `helm install` finds them.
IMAGE_TAG      ?= $(shell sed -n 's/^appVersion: *"*\([^"]*\)"*/\1/p' helm/agentmesh/Chart.yaml)
SERVICES_IMAGE ?= ghcr.io/agentmesh/agentmesh:$(IMAGE_TAG)
SANDBOX_IMAGE  ?= ghcr.io/agentmesh/agentmesh-sandbox:$(IMAGE_TAG)
# The `data` sandbox template's image: the sandbox image plus numpy, pandas and matplotlib.
DATA_IMAGE     ?= ghcr.io/agentmesh/agentmesh-sandbox-data:$(IMAGE_TAG)
BASE_IMAGE     ?= localhost/agentmesh-base:bookworm
EXTRAS         ?=
WHEELS         := build/wheels
BUILDAH        := buildah bud --quiet --layers --format docker --network host --build-arg BASE=$(BASE_IMAGE)
# podman/buildah settings for this machine kind (runc, cgroupfs, ulimits): docker/containers.conf.
export CONTAINERS_CONF ?= $(CURDIR)/docker/containers.conf

# agentmesh's wheel (this tree, stubs included) and, in deps/, its dependencies' wheels chosen for
# the oldest Python the images may carry (Debian bookworm's 3.11.2); those are fetched again only
# when pyproject.toml changes. A fixed SOURCE_DATE_EPOCH makes the wheel the same bytes while the
# code is, so buildah's layer cache holds.
DEPS_STAMP := $(WHEELS)/deps/.complete$(if $(EXTRAS),-$(EXTRAS))

wheels: install
	rm -rf $(WHEELS)/agentmesh-*.whl build/lib build/bdist.*
	SOURCE_DATE_EPOCH=315532800 $(PY) -m pip wheel --quiet --no-deps --wheel-dir $(WHEELS) .
	$(MAKE) --no-print-directory $(DEPS_STAMP)

$(DEPS_STAMP): pyproject.toml
	rm -rf $(WHEELS)/deps
	$(PY) -m pip download --quiet --only-binary=:all: --python-version 3.11.2 --dest $(WHEELS)/deps \
	  "$$(ls $(WHEELS)/agentmesh-*.whl)$(if $(EXTRAS),[$(EXTRAS)])"
	rm -f $(WHEELS)/deps/agentmesh-*.whl
	touch $@

# The data image's wheels (docker/sandbox-data/requirements.txt), its build context; fetched again
# only when that file changes.
DATA_WHEELS := $(WHEELS)/data
$(DATA_WHEELS)/.complete: docker/sandbox-data/requirements.txt
	rm -rf $(DATA_WHEELS)
	$(PY) -m pip download --quiet --only-binary=:all: --python-version 3.11.2 --dest $(DATA_WHEELS) \
	  -r docker/sandbox-data/requirements.txt
	cp docker/sandbox-data/requirements.txt $(DATA_WHEELS)/
	touch $@

images: wheels
	$(MAKE) --no-print-directory $(DATA_WHEELS)/.complete
	case "$(BASE_IMAGE)" in localhost/agentmesh-base:*) docker/base/build-base.sh $(BASE_IMAGE);; esac
	$(BUILDAH) --ignorefile docker/Dockerfile.dockerignore -f docker/Dockerfile -t $(SERVICES_IMAGE) .
	$(BUILDAH) -f docker/sandbox/Dockerfile -t $(SANDBOX_IMAGE) docker/sandbox
	$(BUILDAH) --build-arg SANDBOX=$(SANDBOX_IMAGE) -f docker/sandbox-data/Dockerfile -t $(DATA_IMAGE) $(DATA_WHEELS)
	@podman images --format '{{.Repository}}:{{.Tag}}  {{.Size}}' $(SERVICES_IMAGE) $(SANDBOX_IMAGE) $(DATA_IMAGE) 2>/dev/null || true

clean:
	rm -rf $(VENV) .venv-checkov .mypy_cache .ruff_cache .import_linter_cache lib/agentmesh/v1/*_pb2*.py* lib/agentmesh/internal/v1/*_pb2*.py* $(STUBS)
