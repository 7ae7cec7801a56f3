# gpuscope: `make demo` runs the main job, `make test` the tests; each installs what it needs.
PYTHON ?= python3
VENV ?= .venv
TORCH_VERSION ?= 2.13.0
# torch is pinned here (a CPU wheel); the package itself accepts torch>=2.1
TORCH_SPEC ?= torch==$(TORCH_VERSION)
BIN := $(VENV)/bin
SCENARIO ?= data

.PHONY: install demo test test-parallel test-fast bench bench-overhead bench-overhead-cases bench-whatif bench-faults samples dashboards docs clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# what the demo needs (torch, gpuscope, plotly for its dashboard, tensorboard for its tab) ...
$(VENV)/.demo: $(BIN)/python pyproject.toml
	@echo "make: installing $(TORCH_SPEC) (a CPU wheel, the largest part) into $(VENV), then gpuscope with plotly and tensorboard (.[demo]); the first time only"
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[demo]"
	@echo "make: $(VENV) now takes $$(du -sh $(VENV) | cut -f1)"
	touch $@

# ... and what the tests need besides (the trainers, a browser driver, the exporters)
$(VENV)/.installed: $(VENV)/.demo
	@echo "make: installing what the tests need besides (.[test]: the trainers, a browser driver, the exporters, Ray)"
	$(BIN)/pip install -q -e ".[test]"
	touch $@

install: $(VENV)/.installed

demo: $(VENV)/.demo
	$(BIN)/gpuscope demo --scenario $(SCENARIO) --out runs/demo

TEST_WORKERS ?= 2

# every test in one process (CI: its timing margins hold for a steady load)
test: install
	$(BIN)/python -m pytest -q tests

# the same in TEST_WORKERS processes (pytest-xdist, a test file each), then those marked `alone`
# one at a time: twice as fast on 2 cores, but a second test process moves other timing margins
test-parallel: install
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not alone" tests
	$(BIN)/python -m pytest -q -m alone tests

test-fast: install   # everything but the tests that start other processes
	$(BIN)/python -m pytest -q -m "not slow" tests

bench-overhead: install
	$(BIN)/python benchmarks/bench_overhead.py

bench-overhead-cases: install   # the overhead on nanoGPT-style, FSDP2, HF Trainer, Lightning loops
	$(BIN)/python benchmarks/bench_overhead_cases.py

bench-whatif: install
	$(BIN)/python benchmarks/bench_whatif.py

bench-faults: install   # injected faults at random ranks, scored; the tables of docs/accuracy.md
	$(BIN)/python benchmarks/faults/run.py
	$(BIN)/python benchmarks/faults/many.py --sizes 128,512,1024 --steps 48
	$(BIN)/python benchmarks/faults/many.py --sizes 10000 --steps 24
	$(BIN)/python scripts/accuracy.py

bench: bench-overhead

samples: install   # regenerate sample_traces/ (CPU runs; the cuda/ ones need a GPU: scripts/gpu_check.sh)
	$(BIN)/python scripts/make_samples.py
	$(BIN)/python scripts/make_parallel_samples.py

dashboards: install
	$(BIN)/python scripts/make_dashboards.py

# what the README and docs show, from the current code: pictures (Chromium), the demo's output
# and walk-throughs (real runs), the measured figures (benchmarks/results/)
docs: install
	$(BIN)/python scripts/make_pictures.py
	$(BIN)/python scripts/make_readme_demo.py
	$(BIN)/python scripts/make_performance_doc.py

clean:
	rm -rf runs .pytest_cache
