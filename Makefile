# Runwarden: `make run` serves the live dashboard (embedded default), `make test` runs
# the whole suite (SQLite, then PostgreSQL + Redis when reachable).
VENV   := .venv
PY     := $(VENV)/bin/python
PORT   ?= 8000
PYTHON ?= python3

.PHONY: install run test migrate clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

run: install
	PY=$(PY) PORT=$(PORT) scripts/run

test: install
	PY=$(PY) scripts/test

clean:
	rm -rf $(VENV) var
