# The two commands of the README: `make demo` (the main job, on the embedded offline default) and
# `make test` (the whole test suite, the embedded-model and server tests included). Both create
# .venv and install everything they need from this repository's own files on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# llama-cpp-python compiles llama.cpp from source on first install: use every core.
export CMAKE_BUILD_PARALLEL_LEVEL ?= $(shell nproc 2>/dev/null || echo 2)

DEMO_Q1 := Who directed the film that was shot in or around Leland, North Carolina in 1986
DEMO_Q2 := Are Christopher Nolan and Sathish Kalathil both film directors?

.PHONY: demo test lint install clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -e '.[embedded,server,eval,dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/metarag index build --retrievers bm25,dense
	$(BIN)/metarag ask "$(DEMO_Q1)" --method standard-rag
	$(BIN)/metarag ask "$(DEMO_Q2)" --method standard-rag

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks

clean:
	rm -rf $(VENV) build src/*.egg-info
