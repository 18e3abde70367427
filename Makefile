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

# Heavy real clients kept out of `make test` (CI's 90 minutes): vLLM CPU in its
# own venv (3.5 GB, ~3 min to install), then its node A/B/C tests.
VLLM_VENV ?= .venv-vllm
test-clients: bootstrap
	@scripts/vllm-venv.sh $(VLLM_VENV)
	CASFS_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python scripts/run-tests.sh tests/clients/test_vllm.py

bench-quick: bootstrap
	bench/run --quick

bench: bootstrap
	bench/run
