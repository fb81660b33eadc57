# npumem: every target creates what it needs (.venv, the maturin build, Rust and Python deps).
# `make help` lists the targets with their one-line descriptions (the `## ` comments below).

SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
export VIRTUAL_ENV := $(abspath $(VENV))
export PATH := $(abspath $(BIN)):$(PATH)
# CI=1 selects the thorough hypothesis profile (see tests/conftest.py).
export HYPOTHESIS_PROFILE ?= $(if $(CI),ci,dev)

RUST_SOURCES := $(shell find rust -name '*.rs' -o -name Cargo.toml) Cargo.toml Cargo.lock
PY_DEPS_STAMP := $(VENV)/.deps-stamp
DOCS_STAMP := $(VENV)/.docs-stamp
BUILD_STAMP := $(VENV)/.build-stamp
TEST_BUILD_STAMP := $(VENV)/.test-build-stamp

.PHONY: help
help: ## Show this list of targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-14s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(PY):
	$(PYTHON) -m venv $(VENV)

$(PY_DEPS_STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet \
	    $$($(PY) -c 'import tomllib; t = tomllib.load(open("pyproject.toml", "rb")); p = t["project"]; print(" ".join(f"\"{d}\"" for d in t["build-system"]["requires"] + p["dependencies"] + p["optional-dependencies"]["test"] + p["optional-dependencies"]["dev"]))' | xargs)
	touch $@

# The profile is pyproject.toml's (`dist`: release with link-time optimization), as for wheels,
# in a target directory of its own. One build of the extension is installed at a time: this
# one, or the tests' (below).
$(BUILD_STAMP): $(PY_DEPS_STAMP) $(RUST_SOURCES)
	$(BIN)/maturin develop --quiet --target-dir target/extension
	rm -f $(TEST_BUILD_STAMP)
	touch $@

# The tests' build: the release profile, in the target directory of the Rust tests, so that
# npumem-core and the C library (built first, shipped as it is: `NPUMEM_C_LIBRARY`) are
# compiled once for both. Link-time optimization changes the extension's speed, not what it
# does; the demo and the benches install the optimized build again.
$(TEST_BUILD_STAMP): $(PY_DEPS_STAMP) $(RUST_SOURCES)
	cargo build --release -p npumem-capi --lib
	NPUMEM_C_LIBRARY=$(abspath target/release/libnpumem.so) $(BIN)/maturin develop --quiet --profile release
	rm -f $(BUILD_STAMP)
	touch $@

.PHONY: venv
venv: $(PY_DEPS_STAMP) ## Create .venv with maturin and the test and lint tools

.PHONY: develop
develop: $(BUILD_STAMP) ## Build the Rust extension (release, link-time optimized) into .venv, package in editable mode

.PHONY: develop-test
develop-test: $(TEST_BUILD_STAMP) ## Build the extension as the tests use it (release, sharing the Rust tests' build) into .venv

# The sdist, then the wheel built from it (maturin unpacks it in a temporary folder), with the
# crates of Cargo.lock (`--locked`). The profile is pyproject.toml's (`dist`: link-time
# optimized, no debug information), which `maturin build --release` would replace; the target
# directory is `make develop`'s, which has the dependencies built for that profile.
.PHONY: wheel
wheel: $(PY_DEPS_STAMP) ## Build the wheel and the sdist into dist/ (link-time optimized, no debug information)
	$(BIN)/maturin build --locked --sdist --out dist --target-dir target/extension

.PHONY: demo
demo: develop ## Run the main job: the built-in demo workload (npumem demo)
	$(BIN)/npumem demo

.PHONY: test
test: test-builds test-rust test-loom test-python docs lint ## Every test: Rust unit and stress, loom models, pytest (with the browser test), stubtest, the docs build, and the lints

# The builds of `make test` carry no debug information: it takes a quarter of their compile
# time (125 s against 94 s for npumem-core's tests on 2 cores), and no test reads it. The
# release profile keeps it (`Cargo.toml`) for profiling the benches and the examples.
TEST_BUILD_TARGETS := test test-builds build-rust-tests build-loom develop-test $(TEST_BUILD_STAMP) \
    test-rust test-loom test-python docs
$(TEST_BUILD_TARGETS): export CARGO_PROFILE_RELEASE_DEBUG := 0

# The cargo runs of `test-rust`, each followed by its arguments to the test binaries.
RUST_TESTS := "-p npumem-core" "-p npumem-capi" "-p npumem-benches --lib" "-p npumem-benches --benches -- --test"
# The loom models' build: its own flags and target directory.
LOOM_CARGO := RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p npumem-core --release --lib

# The loom models (a target directory of their own) build beside the Rust tests and the
# extension (which share one, in turn): often one rustc process on one core each, so side by
# side they keep both cores busy. The tests then run one phase at a time, so that no test
# shares the CPUs with a compiler.
.PHONY: test-builds
test-builds: ## Build what `make test` runs: the Rust tests, the loom models and the extension, side by side
	$(MAKE) --no-print-directory --output-sync=target -j3 build-rust-tests build-loom develop-test

.PHONY: build-rust-tests
build-rust-tests:
	for run in $(RUST_TESTS); do cargo test --release --no-run $${run%% -- *} || exit 1; done

.PHONY: build-loom
build-loom:
	$(LOOM_CARGO) --no-run

.PHONY: test-rust
test-rust: ## Rust unit, property and stress tests of npumem-core and the C ABI; bench code compiles and runs once
	for run in $(RUST_TESTS); do cargo test --release $$run || exit 1; done

.PHONY: test-loom
test-loom: ## Loom models of every atomic protocol (interleavings with up to four preemptions; three for the two three-thread handle batch races)
	LOOM_MAX_PREEMPTIONS=4 $(LOOM_CARGO) loom -- --test-threads=2

# The scale of mimalloc's test-stress: 32 threads, about 54M allocations (half the operations
# allocate), sizes capped at 8 KiB so that the pattern fill and check stay memory-bound.
STRESS_THREADS ?= 32
STRESS_ITERS ?= 3400000
STRESS_MAX_SIZE ?= 8192
STRESS_SLOTS ?= 64
STRESS_CAPACITY_MIB ?= 256

.PHONY: stress
stress: ## The Rust stress test at the anchor's scale (STRESS_THREADS, STRESS_ITERS, STRESS_SLOTS, STRESS_MAX_SIZE, STRESS_CAPACITY_MIB)
	NPUMEM_STRESS_THREADS=$(STRESS_THREADS) NPUMEM_STRESS_ITERS=$(STRESS_ITERS) \
	    NPUMEM_STRESS_MAX_SIZE=$(STRESS_MAX_SIZE) NPUMEM_STRESS_SLOTS=$(STRESS_SLOTS) \
	    NPUMEM_STRESS_CAPACITY_MIB=$(STRESS_CAPACITY_MIB) \
	    cargo test -p npumem-core --release --test stress stress_mixed_sizes -- --nocapture

.PHONY: memcheck
memcheck: $(PY_DEPS_STAMP) ## Valgrind's memcheck over the core's unit tests and a set of its integration tests (installs valgrind as root)
	scripts/ensure_package.sh valgrind valgrind "make memcheck"
	PY=$(PY) scripts/memcheck.sh

.PHONY: browser
browser: ## Install Debian's chromium for the viewer test when it is missing (as root)
	scripts/ensure_package.sh chromium chromium "the viewer test"

# pytest's workers (pytest-xdist): one per CPU; `make test-python PYTEST_WORKERS=0` runs the
# suite in this process, as a debugger or `-x` wants it.
PYTEST_WORKERS ?= auto

# The package's bytecode is written first: where the environment forbids Python to write it
# (PYTHONDONTWRITEBYTECODE), every command a test starts would compile the package again, some
# 0.3 s of CPU each (57 of the suite's 536 CPU seconds).
.PHONY: test-python
test-python: develop-test browser ## pytest suite (with the headless-browser test) on every CPU, and mypy.stubtest
	$(PY) -m compileall -q python/npumem
	NPUMEM_REQUIRE_BROWSER=1 $(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist worksteal
	$(PY) -m mypy.stubtest npumem._core --allowlist tests/stubtest-allowlist.txt

.PHONY: bench
bench: develop ## Criterion benches against peers, the compaction pause, the Python and planner scripts
	cargo bench -p npumem-benches
	cargo run --release -p npumem-benches --example compaction_pause -- 1024 100000 3
	$(PY) benches/compaction_residue.py
	cargo run --release -p npumem-benches --example threads_loop -- 3000000 npumem-buddy
	$(PY) benches/python_roundtrip.py
	$(PY) benches/python_churn.py
	$(PY) benches/plan_bench.py --time-limit 10 --seed 0

$(DOCS_STAMP): pyproject.toml | $(PY_DEPS_STAMP)
	$(PY) -m pip install --quiet \
	    $$($(PY) -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; print(" ".join(f"\"{d}\"" for d in p["optional-dependencies"]["docs"]))' | xargs)
	touch $@

.PHONY: device-bundle
device-bundle: develop ## Build what scripts/device_checks.sh carries to the device machine (16 cores, a GPU)
	cargo build --release -p npumem-benches --example mixed_sizes
	rm -rf .device && mkdir -p .device/tests
	cp target/release/examples/mixed_sizes .device/
	cargo test -p npumem-core --release --no-run --message-format=json \
	    | $(PY) scripts/test_executables.py | xargs -I{} cp {} .device/tests/
	strip .device/mixed_sizes .device/tests/*

.PHONY: docs
docs: develop-test $(DOCS_STAMP) ## Build the documentation site into site/ (MkDocs, strict: no broken links)
	$(BIN)/mkdocs build --strict --site-dir site

.PHONY: lint
lint: $(PY_DEPS_STAMP) ## cargo fmt --check, clippy and rustdoc -D warnings (clippy also on the loom models), ruff, mypy, no import cycles
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet
	RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo clippy -p npumem-core --lib --profile=test -- -D warnings
	$(BIN)/ruff check python tests benches scripts
	$(BIN)/ruff format --check python tests benches scripts
	$(BIN)/mypy
	$(BIN)/mypy scripts
	$(PY) scripts/check_import_cycles.py

.PHONY: cycles
cycles: ## List the import graph of the core, the binding, the C ABI and the facade, and any cycle in it
	$(PYTHON) scripts/check_import_cycles.py --graph

.PHONY: fmt
fmt: $(PY_DEPS_STAMP) ## Format Rust and Python sources in place
	cargo fmt --all
	$(BIN)/ruff format python tests benches scripts
	$(BIN)/ruff check --fix python tests benches scripts

.PHONY: clean
clean: ## Remove build outputs and the virtual environment
	cargo clean
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis npumem-demo site dist
