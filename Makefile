# cutlass-aot developer entry points. Set up a fresh machine with:
#
#   make build    # venv + package + build configs/*.yaml into the default cache
#   make test     # CPU test suite
#
# Variables (override on the command line, e.g. `make test VENV=/tmp/venv`):
#   VENV        virtual environment to create and use            (.venv)
#   PYTHON      interpreter that creates the venv                (python3)
#   TORCH_SPEC  torch requirement installed before the package   (torch==2.13.0)
#               The pin exists because an unpinned torch pulls a multi-GB CUDA
#               build; on these machines torch==2.13.0 is a local CPU wheel.
#   CONFIGS     manifests for `make build`                        (configs/*.yaml)
#   CACHE_DIR   cache for `make build` (default: the knobs' default, below)
#   BUILD_FLAGS extra flags for `cutlass-aot build`, e.g. -j 4 --no-bundle-runtime
#   GPU_SUITE   build_scripts/gpu_suite.sh's steps, e.g. "tests host"   (all:
#               tests suite host decode heldout; the script's header lists them)
#
# Without CACHE_DIR, `make build` writes to $CUTLASS_AOT_CACHE_DIR, else the
# platform user cache dir (~/.cache/cutlass-aot on Linux); see README "Knobs".

VENV ?= .venv
PYTHON ?= python3
TORCH_SPEC ?= torch==2.13.0
CONFIGS ?= $(sort $(wildcard configs/*.yaml))
CACHE_DIR ?=
BUILD_FLAGS ?=
GPU_SUITE ?= all

PY := $(VENV)/bin/python
PIP := $(PY) -m pip
CLI := $(VENV)/bin/cutlass-aot
CACHE_OPT := $(if $(CACHE_DIR),--cache-dir $(CACHE_DIR))

# `install` is skipped when this stamp exists. Its name carries a hash of
# pyproject.toml and TORCH_SPEC, so editing the dependencies (or the pin)
# reinstalls, while a fresh checkout that only touched mtimes does not.
# The package is installed editable: code changes never need a reinstall.
# torch goes first and pinned, so that '.[test]' finds it satisfied.
INSTALL_KEY := $(shell { cat pyproject.toml; echo '$(TORCH_SPEC)'; } | sha256sum | cut -c1-16)
STAMP := $(VENV)/.cutlass-aot-install-$(INSTALL_KEY)
FASTPATH := cutlass_aot/run/_fastpath.so

.PHONY: install build test lint gpu-suite bench-build clean-venv registry-deps

install: $(STAMP) $(FASTPATH)

# The dispatch entry's C++ half (run/fastpath.py): rebuilt when its source
# changes; without a C++ compiler the script says so and dispatch stays all
# Python.
$(FASTPATH): cutlass_aot/run/fastpath.cc build_scripts/build_fastpath.py $(STAMP)
	$(PY) build_scripts/build_fastpath.py

$(STAMP):
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install $(TORCH_SPEC)
	$(PIP) install -e '.[test]'
	rm -f $(VENV)/.cutlass-aot-install-*
	touch $@

build: install
	$(CLI) build $(CACHE_OPT) $(BUILD_FLAGS) $(CONFIGS)
	$(CLI) info $(CACHE_OPT)

# The push/pull tests run a real OCI registry: Debian's docker-registry (the
# CNCF distribution registry), and apache2-utils' htpasswd for basic auth.
# Installed when missing where we are root with apt-get (CI runs as root);
# elsewhere those tests skip naming the package, and fail when CI=true.
registry-deps:
	@if command -v docker-registry >/dev/null && command -v htpasswd >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	      --no-install-recommends docker-registry apache2-utils openssl >/dev/null; } \
	  || echo "note: could not install docker-registry; the registry tests skip (fail with CI=true)"; \
	else echo "note: docker-registry is missing and this is not root with apt-get;" \
	  "the registry tests skip (fail with CI=true)"; fi

# pytest exits 5 when it collects no test; that fails this target on purpose.
test: install registry-deps
	$(PY) -m pytest -q tests --ignore=tests/gpu

lint: install
	$(VENV)/bin/ruff check cutlass_aot tests benchmarks build_scripts

# The GPU tests and benchmarks. Runs on the device machine (see the script's
# header for what it expects there), so it does not depend on `install`.
gpu-suite:
	bash build_scripts/gpu_suite.sh $(GPU_SUITE)

bench-build: install
	$(PY) benchmarks/bench_build.py

clean-venv:
	rm -rf $(VENV)
