# Runwarden: `make run` serves the live dashboard (embedded default), `make test` runs
# the whole suite (SQLite, then PostgreSQL + Redis when reachable).
VENV   := .venv
PY     := $(VENV)/bin/python
PORT   ?= 8000
PYTHON ?= python3

.PHONY: install run test migrate clean

install: $(VENV)/.installed

# The official clients are installed too, so `make test` runs their suites against a real
# server: the Python one into the venv, the TypeScript one built from its lock file
# (npm ci: exact versions, no download at test time). Without npm its tests skip, loudly.
TS_CLIENT := clients/typescript

$(VENV)/.installed: pyproject.toml clients/python/pyproject.toml $(TS_CLIENT)/package-lock.json $(wildcard $(TS_CLIENT)/src/*.ts)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]' -e clients/python
	if command -v npm >/dev/null; then \
	  cd $(TS_CLIENT) && npm ci --no-audit --no-fund --loglevel=error && npm run --silent build; \
	else echo "!!! npm is missing: the TypeScript client's tests will skip" >&2; fi
	touch $@

run: install
	PY=$(PY) PORT=$(PORT) scripts/run

test: install
	PY=$(PY) scripts/test

clean:
	rm -rf $(VENV) var $(TS_CLIENT)/node_modules $(TS_CLIENT)/dist
