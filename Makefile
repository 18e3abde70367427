# The two commands a fresh machine needs (see README.md):
#   make demo   run casfs's main job on the zero-config default
#   make test   run the whole test suite (what CI runs)
.PHONY: bootstrap check clients demo test test-clients lint bench bench-quick

bootstrap:
	@scripts/bootstrap.sh

demo: bootstrap
	@.venv/bin/python -m casfs.demo.run_twice

lint: bootstrap
	.venv/bin/ruff check
	.venv/bin/mypy


# The heavy real clients get venvs of their own (their packages must not change the
# main venv's torch/triton keys): vLLM CPU (3.4 GB, ~3 min to install) and FlashInfer's
# JIT with a CUDA toolchain from wheels (2.1 GB, ~5 min). `make test` runs them with the
# rest (CI's 90 minutes hold them: ~12 min all told); CASFS_REQUIRE_CLIENTS=1 makes a
# missing client venv a failure, never a skip.
VLLM_VENV ?= .venv-vllm
FLASHINFER_VENV ?= .venv-flashinfer
CLIENTS_ENV = CASFS_REQUIRE_CLIENTS=1 \
	CASFS_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python \
	CASFS_FLASHINFER_PYTHON=$(abspath $(FLASHINFER_VENV))/bin/python

clients: bootstrap
	@scripts/vllm-venv.sh $(VLLM_VENV)
	@scripts/flashinfer-venv.sh $(FLASHINFER_VENV)

# Independent real-mount tests run in parallel (pytest-xdist): each test has its own
# root, state dir and mount base, and each worker its own SeaweedFS. Two workers on
# 2 cores: three made load-bound timeouts (a 3 s root-open bound) show in CI.
# loadscope: a module's tests run on one worker, in order, with nothing between them, so
# a module-scoped fixture is set up once (tests/system/test_systemd.py's tests share one
# booted container: with --dist load another module's test came between two of them, the
# container was booted anew, and every later test found casfsd never started).
XDIST ?= -n 2 --dist loadscope

# The core suite: every real path that is not a whole system (no systemd boot, no wheel
# in a clean root, no Prometheus, no vLLM/FlashInfer). For iterating: ~10 min on 2 cores.
check: bootstrap lint
	@scripts/check-capabilities.sh
	@scripts/run-tests.sh $(XDIST) -m "not system" $(PYTEST_ARGS)

# What CI runs: the core suite and the system suites.
test: bootstrap lint clients
	@scripts/check-capabilities.sh
	@$(CLIENTS_ENV) scripts/run-tests.sh $(XDIST) $(PYTEST_ARGS)

# Only the heavy real clients (vLLM, FlashInfer), node A/B(/C).
test-clients: clients
	@$(CLIENTS_ENV) scripts/run-tests.sh tests/clients/test_vllm.py tests/clients/test_vllm_index.py \
		tests/clients/test_flashinfer.py

bench-quick: bootstrap
	bench/run --quick

bench: bootstrap
	bench/run
