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

EXTRAS := embedded,server,eval,hf,view,browser,train,dev

.PHONY: demo test test-fast lint install doctor clean

# llama-cpp-python comes from a wheel built on this machine with AMX kernels left out (they crash
# on our Q4_K_M GGUF), kept under $METARAG_HOME/wheels by build identity; never from pip's wheel
# cache, which does not key on CMAKE_ARGS. Then everything else, then the doctor's checks.
$(STAMP): pyproject.toml scripts/install-llama-cpp
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	scripts/install-llama-cpp $(BIN)/python
	$(BIN)/python -m pip install -e '.[$(EXTRAS)]'
	$(BIN)/metarag doctor
	touch $(STAMP)

install: $(STAMP)

doctor: $(STAMP)
	$(BIN)/metarag doctor

demo: $(STAMP)
	$(BIN)/metarag index build --retrievers bm25,dense
	$(BIN)/metarag ask "$(DEMO_Q1)" --method standard-rag
	$(BIN)/metarag ask "$(DEMO_Q2)" --method standard-rag
	@# the same two questions as a run folder the viewer can open: seed 316 samples exactly them from the demo
	@# set, so the response cache answers at once (and a second make demo resumes the finished run)
	$(BIN)/metarag eval --method standard-rag --dataset demo --limit 2 --seed 316 --quiet > $(VENV)/demo-eval.txt; \
		status=$$?; cat $(VENV)/demo-eval.txt; exit $$status
	@echo "See the demo's run question by question, trace by trace, in a browser:"
	@echo "  $(BIN)/metarag view $$(sed -n 's/^run folder: //p' $(VENV)/demo-eval.txt)"

test: $(STAMP)
	$(BIN)/python -m pytest -q

# The suite without the tests that load a real model (the embedded GGUFs, transformers on their weights,
# MiniLM, a llama.cpp server), drive a browser, or launch several training processes (markers in
# pyproject.toml): scripted models and tiny ones only (its time as measured: README).
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not real_model and not browser and not slow"

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks

clean:
	rm -rf $(VENV) build src/*.egg-info
