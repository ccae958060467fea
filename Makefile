# airflow-quota: two commands for a fresh machine.
#   make test   creates .venv, installs the project with its test extras, lints, type-checks, builds the
#               docs, tests
#   make demo   runs the AWS walkthrough in a real Airflow (SQLite) with the quota scheduler, tells its
#               quota story and serves the UI until Ctrl-C (DEMO_ARGS=--once: stop after the story)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: test lint typecheck docs postgres redis browser compose systemd demo bench clean

$(BIN)/python:
	@$(PYTHON) -m venv $(VENV) 2>/dev/null || { \
	  echo "python3 -m venv failed: installing Debian's python3-venv"; \
	  apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null && $(PYTHON) -m venv $(VENV); }

# pip is quiet for make test; make demo (PIP_QUIET empty below) shows what it collects and installs,
# since a first install takes minutes.
PIP_QUIET ?= -q
$(STAMP): $(BIN)/python pyproject.toml
	@echo "[install] the project, Airflow 3.3 and the test tools into $(VENV) (minutes the first time)"
	$(BIN)/python -m pip install $(PIP_QUIET) --upgrade pip
	$(BIN)/python -m pip install $(PIP_QUIET) -e '.[test]'
	@touch $(STAMP)
	@echo "[install] done"

# The service tests need PostgreSQL: the machine's server when one answers on 127.0.0.1:5432,
# else a throwaway server the tests start from Debian's postgresql package, installed here.
postgres:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null || { \
	  echo "installing Debian's postgresql for the service tests"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; }

# The Celery delegate's end-to-end test needs a Redis broker: the machine's on 127.0.0.1:6379 when
# one answers, else a throwaway server the test starts from Debian's redis-server, installed here.
redis:
	@command -v redis-server >/dev/null 2>&1 || redis-cli -h 127.0.0.1 ping >/dev/null 2>&1 || { \
	  echo "installing Debian's redis-server for the Celery delegate's test"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; }

# The Quotas page's browser test drives Debian's Chromium through its ChromeDriver.
browser:
	@command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1 || { \
	  echo "installing Debian's chromium and chromium-driver for the browser test"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; }

# tests/test_compose.py validates docker-compose.yml: the compose plugin, or else Debian's docker-compose
compose:
	@docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null || { \
	  echo "installing Debian's docker-compose (to validate docker-compose.yml)"; \
	  apt-get update -qq && apt-get install -y -qq docker-compose >/dev/null; }

# tests/test_deploy_files.py checks deploy/systemd's unit with systemd-analyze, from Debian's systemd
systemd:
	@command -v systemd-analyze >/dev/null 2>&1 || { \
	  echo "installing Debian's systemd (systemd-analyze, to verify deploy/systemd's unit)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq systemd >/dev/null; }

lint: $(STAMP)
	$(BIN)/ruff check airflow_quota tests benchmarks dags
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

# The manual (docs/, Markdown through myst-parser, the reference from the docstrings): every warning,
# a broken link included, fails the build. -E re-reads every page: autodoc does not notice an edited
# docstring, so an incremental build would hide its warnings.
docs: $(STAMP)
	$(BIN)/sphinx-build -E -W --keep-going -b html docs docs/_build/html

# Three workers, each test file on one of them (its module fixtures, e.g. an Airflow stack, stay
# with it): the longest files mostly wait on trainings of set durations, so a third worker on two
# cores took the run from 17.6 to 14.7 minutes; TEST_WORKERS=0 runs the tests in this process.
# Then the tests that time a takeover or a recovery (marker timed, tests/conftest.py), alone.
TEST_WORKERS ?= 3
test: lint typecheck docs postgres redis browser compose systemd
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile -m "not timed"
	$(BIN)/pytest -m timed

DEMO_ARGS ?=
demo: PIP_QUIET =
demo: $(STAMP)
	$(BIN)/airflow-quota validate examples/quota.yaml
	$(BIN)/python -m airflow_quota.devtools.demo $(DEMO_ARGS)

bench: $(STAMP)
	$(BIN)/python benchmarks/core_cycle.py

clean:
	rm -rf $(VENV) .demo .pytest_cache .mypy_cache .ruff_cache docs/_build
