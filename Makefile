# The two commands a fresh machine needs (see README.md):
#   make demo   run casfs's main job on the zero-config default
#   make test   run the whole test suite (what CI runs)
.PHONY: bootstrap demo test test-clients lint bench bench-quick

bootstrap:
	@scripts/bootstrap.sh

demo: bootstrap
	@.venv/bin/python -m casfs.demo.run_twice

lint: bootstrap
	.venv/bin/ruff check
	.venv/bin/mypy

test: bootstrap lint
	@scripts/check-capabilities.sh
	@scripts/run-tests.sh $(PYTEST_ARGS)

# Heavy real clients kept out of `make test` (CI's 90 minutes): vLLM CPU (3.4 GB,
# ~3 min to install) and FlashInfer's JIT with a CUDA toolchain from wheels (2.1 GB,
# ~5 min), each in its own venv, then their node A/B(/C) tests.
VLLM_VENV ?= .venv-vllm
FLASHINFER_VENV ?= .venv-flashinfer
test-clients: bootstrap
	@scripts/vllm-venv.sh $(VLLM_VENV)
	@scripts/flashinfer-venv.sh $(FLASHINFER_VENV)
	CASFS_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python \
	CASFS_FLASHINFER_PYTHON=$(abspath $(FLASHINFER_VENV))/bin/python \
	scripts/run-tests.sh tests/clients/test_vllm.py tests/clients/test_flashinfer.py

bench-quick: bootstrap
	bench/run --quick

bench: bootstrap
	bench/run
