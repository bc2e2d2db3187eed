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
	DEBUG=$${DEBUG:-1} $(PY) manage.py migrate --noinput
	DEBUG=$${DEBUG:-1} $(PY) manage.py ensure_operator
	@echo "Runwarden: open http://127.0.0.1:$(PORT)/"
	DEBUG=$${DEBUG:-1} RUNWARDEN_EMBEDDED=$${RUNWARDEN_EMBEDDED:-1} $(VENV)/bin/daphne -b 127.0.0.1 -p $(PORT) dashboard.asgi:application

test: install
	PY=$(PY) scripts/test

clean:
	rm -rf $(VENV) var
