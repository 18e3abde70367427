# The two commands a fresh machine needs (see README.md):
#   make demo   run casfs's main job on the zero-config default
#   make test   run the whole test suite (what CI runs)
.PHONY: bootstrap demo test lint bench bench-quick

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

bench-quick: bootstrap
	bench/run --quick

bench: bootstrap
	bench/run
