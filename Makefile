# Thin targets; the work lives in scripts/ (one module per verb). `make help` lists them.
PY        ?= python3
VENV      ?= .venv
VPY       := $(VENV)/bin/python
SGLANG_SRC ?=
SGLANG_BASE ?= auto
PYTEST_ARGS ?=
IMAGE     ?= eagle-fast-verify/sglang:v0.5.23
export SGLANG_BASE

.PHONY: help setup apply export check-patches refresh test prove-tests image lint-docker doctor bench bench-comm docs clean

help:            ## list targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | expand -t16

setup: $(VENV)/.done   ## test environment: .venv with pinned torch 2.14.1 + sglang's deps (not sglang itself)
$(VENV)/.done: requirements/test.in requirements/test.lock requirements/nodeps.txt
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --progress-bar on -r requirements/test.in -c requirements/test.lock
	$(VPY) -m pip install -q --no-deps -r requirements/nodeps.txt
	touch $@

apply:           ## patched SGLang tree at build/sglang (or SGLANG_SRC=<checkout>); base from git or the pinned wheel
	$(PY) -m scripts.apply $(if $(SGLANG_SRC),--src $(SGLANG_SRC)) $(if $(REBUILD),--rebuild)

export:          ## regenerate patches/ from the commits of build/sglang
	$(PY) -m scripts.export

check-patches:   ## lint the series, apply to a pristine base, re-export, fail on any difference
	$(PY) -m scripts.check_patches

refresh:         ## move the series to a new upstream: make refresh TO=v0.5.24 (or WHEEL=sglang==0.5.24)
	$(PY) -m scripts.refresh $(if $(TO),--tag $(TO)) $(if $(WHEEL),--wheel $(WHEEL)) $(if $(WRITE),--write)

test: setup apply  ## the whole check: pytest against build/sglang, series round trip, Dockerfile lint, prove-tests
	$(VPY) -m pytest $(PYTEST_ARGS)
	$(PY) -m scripts.check_patches
	$(VPY) -m scripts.image --lint-only
	$(VPY) -m scripts.prove_tests

prove-tests: setup apply  ## show that every patch test fails on the unpatched v0.5.23 tree
	$(VPY) -m scripts.prove_tests

image:           ## build the serving image (docker build) FROM the pinned upstream image
	$(PY) -m scripts.image --tag $(IMAGE)

lint-docker:     ## hadolint docker/Dockerfile
	$(VPY) -m scripts.image --lint-only

doctor:          ## preflight of this box (GPUs, NVLink/P2P, NUMA, driver, NCCL, host settings)
	$(PY) -m scripts.doctor

bench:           ## A/B regression benchmarks on the 8-GPU box (BENCH_ARGS="--variants ... --scenarios C1")
	$(PY) -m scripts.bench $(BENCH_ARGS)

bench-comm:      ## all-reduce / verify-shaped communication benchmark on any box with >= 2 GPUs
	$(PY) -m scripts.bench_comm $(BENCH_ARGS)

docs:            ## regenerate the cost-model tables in eagle-fast-verify.md from bench/results
	$(PY) -m scripts.cost_model --write

clean:           ## remove the trees under build/ (keeps the wheel and base cache) and .venv
	rm -rf build/sglang build/sglang-* build/wt-* build/image-context $(VENV)
