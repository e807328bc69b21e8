# Two entry points (see README): `make demo` and `make test`; each makes its own virtual environment.
PYTHON ?= python3
DEMO_VENV := .venv-demo
TEST_VENV := .venv-test
PIP_FLAGS := --quiet --disable-pip-version-check

.PHONY: demo test lint benchmark clean

$(DEMO_VENV)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(DEMO_VENV)
	$(DEMO_VENV)/bin/pip install $(PIP_FLAGS) -e .
	touch $@

$(TEST_VENV)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(TEST_VENV)
	$(TEST_VENV)/bin/pip install $(PIP_FLAGS) -e ".[test]"
	touch $@

demo: $(DEMO_VENV)/.installed
	$(DEMO_VENV)/bin/gpusim demo --out out/demo

test: $(TEST_VENV)/.installed
	$(TEST_VENV)/bin/ruff check gpusim tests $(wildcard validation benchmarks)
	$(TEST_VENV)/bin/python -m pytest -n 2 --dist loadfile

lint: $(TEST_VENV)/.installed
	$(TEST_VENV)/bin/ruff check gpusim tests $(wildcard validation benchmarks)

benchmark: $(TEST_VENV)/.installed
	$(TEST_VENV)/bin/python benchmarks/run_benchmarks.py --out docs/benchmarks.md

clean:
	rm -rf $(DEMO_VENV) $(TEST_VENV) out .pytest_cache
