# Tessera: the two commands are `make demo` (run everything on embedded defaults) and `make test`.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
PG_URL ?= postgres://postgres@127.0.0.1:5432/postgres

.PHONY: demo test setup setup-test preload lint clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# Runtime dependencies only (pinned in pyproject.toml).
setup: $(BIN)/python
	$(BIN)/pip install --quiet -e .

# Test tools, Debian's Chromium for the browser tests, an AArch64 cross compiler and user-mode
# emulator (the preload library is also tested as built for Arm GPU nodes), and the library.
APT_TEST := chromium gcc-aarch64-linux-gnu qemu-user
setup-test: $(BIN)/python
	$(BIN)/pip install --quiet -e '.[test]'
	@(command -v chromium && command -v aarch64-linux-gnu-gcc && command -v qemu-aarch64) >/dev/null || (apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(APT_TEST) >/dev/null)
	$(MAKE) -C preload

preload:
	$(MAKE) -C preload

demo: setup
	$(BIN)/python manage.py demo

test: setup-test
	DATABASE_URL=$(PG_URL) $(BIN)/pytest -n 2 --dist loadgroup

lint: $(BIN)/python
	$(BIN)/ruff check .

clean:
	rm -rf var preload/build .pytest_cache
