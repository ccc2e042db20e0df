# The README's two commands. Both install what they need first (scripts/install.sh is idempotent).
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: install demo test test-all bench bench-xnnpack bench-architectures bench-arm lint docs

install:
	VENV=$(VENV) bash scripts/install.sh

demo: install
	$(PY) scripts/demo.py

test: install
	$(PY) -m pytest -m "not slow" -q

test-all: install
	$(PY) -m pytest -q

bench: install
	$(PY) bench/lowering.py

bench-xnnpack: install
	$(PY) bench/xnnpack.py

bench-architectures: install
	$(PY) bench/architectures.py

bench-arm: install
	$(PY) bench/arm.py

lint:
	$(VENV)/bin/ruff check core plugins backends-* tests bench scripts testing

docs: install
	$(PY) scripts/gen_docs.py
