# The two commands a fresh machine needs (see README.md):
#   make demo   run casfs's main job on the zero-config default
#   make test   run the whole test suite (what CI runs)
.PHONY: bootstrap clients demo test test-clients lint bench bench-quick

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

test: bootstrap lint clients
	@scripts/check-capabilities.sh
	@$(CLIENTS_ENV) scripts/run-tests.sh $(PYTEST_ARGS)

# Only the heavy real clients (vLLM, FlashInfer), node A/B(/C).
test-clients: clients
	@$(CLIENTS_ENV) scripts/run-tests.sh tests/clients/test_vllm.py tests/clients/test_vllm_index.py \
		tests/clients/test_flashinfer.py

bench-quick: bootstrap
	bench/run --quick

bench: bootstrap
	bench/run
