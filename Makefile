# The README's two commands: `make demo` runs the platform, `make test` runs every test.
# Both set up everything they need first (Debian packages, the virtualenv, pip extras).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.nodeward-installed
PYTEST_ARGS ?=

.PHONY: demo test lint typecheck check system-deps venv schemas dashboards clean

demo: $(STAMP)
	$(BIN)/nodeward up

test: system-deps $(STAMP)
	$(BIN)/python -m pytest -n 2 --dist loadgroup -q $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

check: lint typecheck test

system-deps:
	@bash scripts/system-deps.sh

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	@$(BIN)/python -m pip install -q -e '.[kerberos]' || echo "nodeward: Kerberos support not built (it needs libkrb5-dev and a C compiler: scripts/system-deps.sh as root); Kerberos renewal and its tests are left out" >&2
	@$(BIN)/python -m pip install -q -e '.[ldap]' || echo "nodeward: LDAP support not built (it needs libldap-dev, libsasl2-dev and a C compiler: scripts/system-deps.sh as root); the directory service and its tests are left out" >&2
	@touch $(STAMP)

venv: $(STAMP)

schemas: $(STAMP)
	$(BIN)/python -m nodeward.schemas_export schemas/json

# The Grafana dashboards, from launch/observability/dashboards.py into the chart.
dashboards: $(STAMP)
	$(BIN)/python -m launch.observability.generate deploy/helm/nodeward/files/dashboards

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info
