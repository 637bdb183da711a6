# agentlog: everything a newcomer runs. Needs only Python 3.11+, Java 17+, Maven 3.6+ and make.
#   make test   the whole suite against a real Kafka broker (started from Maven jars) and chdb
#   make demo   start the local stack and run the demo
#   make dist   the sdist and the wheel in dist/
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
AGENTLOG := $(VENV)/bin/agentlog
# Re-install only when the dependency list changes.
STAMP  := $(VENV)/.installed-stamp

.PHONY: venv kafka lint test unit demo down bench dist clean distclean

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -e '.[test,grpc,frameworks]'
	@touch $(STAMP)

kafka: venv
	$(AGENTLOG) infra fetch

# ruff (lint + import order) and mypy (strict on schemas/ and processors/core/), as configured in pyproject.toml.
# mypy reads modules from folders named like them: build/typecheck/agentlog is the installed layout as links to the
# repository's folders (the editable install maps names with an import hook, which mypy does not run).
lint: venv
	$(VENV)/bin/ruff check .
	rm -rf build/typecheck && mkdir -p build/typecheck/agentlog
	ln -s $(CURDIR)/processors/* $(CURDIR)/schemas $(CURDIR)/streams $(CURDIR)/infra build/typecheck/agentlog/
	$(VENV)/bin/mypy

test: lint kafka
	$(PY) -m pytest -q

# The broker-free tier: seconds, no Kafka.
unit: venv
	$(PY) -m pytest -q tests/unit

demo: venv kafka
	$(AGENTLOG) demo

# Stops the demo worker and the local broker (data is kept; `agentlog infra down --purge` deletes it).
down: venv
	$(AGENTLOG) demo --stop-only

bench: venv kafka
	$(PY) -m tests.bench

# The sdist and the wheel in dist/ (the wheel built from the sdist; tests/integration/packaging/test_wheel.py
# installs the same pair in a fresh venv).
dist: venv
	$(PY) -m build

# Stops the test broker (if the tests left one) and removes caches; keeps .venv and the jar cache.
clean:
	-@test -x $(AGENTLOG) && AGENTLOG_HOME=$(CURDIR)/.agentlog/test-stack AGENTLOG_KAFKA_BOOTSTRAP=127.0.0.1:19192 $(AGENTLOG) infra down
	rm -rf .agentlog/test-stack .pytest_cache .hypothesis build dist
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) *.egg-info
