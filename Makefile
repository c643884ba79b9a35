# Thin targets; the work lives in scripts/ (series/, host/, bench/: one module per verb). `make help` lists them.
# Nothing here names the release: patches/pin.toml does, and the verbs read it (make image tags the image with it).
PY        ?= python3
VENV      ?= .venv
VPY       := $(VENV)/bin/python
# make bench / bench-sweep / report: .venv's python when it exists (prometheus_client, matplotlib), else PY; their
# servers and bench_serving run in the serving image
BPY       := $(if $(wildcard $(VPY)),$(VPY),$(PY))
SGLANG_SRC ?=
SGLANG_BASE ?= auto
PYTEST_ARGS ?=
IMAGE     ?=
export SGLANG_BASE

.PHONY: help setup apply export check-patches refresh test test-gpu test-serve prove-tests image lint-docker doctor \
        bench bench-sweep bench-comm report docs clean

help:            ## list targets and the variables they take
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | expand -t16
	@sed -n 's/^#: \{0,1\}//p' $(MAKEFILE_LIST)

#: Variables (make TARGET VAR=value; the targets' help above names theirs):
#:   SGLANG_BASE=clone|wheel  apply, check-patches, refresh: where the pristine base comes from (default auto)
#:   SGLANG_WHEEL=FILE        apply: the pinned wheel from a file you have (checked against the pin)
#:   SGLANG_SRC=DIR           apply: patch your own clean checkout of the tag instead of build/sglang
#:   REBUILD=1                apply: build build/sglang again from a fresh base (drops commits not exported)
#:   TO=TAG WHEEL=REQ WHEEL_FILE=FILE WRITE=1 RESUME=1 DROP="PATCH ..." SYNC=1   refresh (see its help line)
#:   IMAGE=NAME:TAG           image, test-gpu, test-serve, bench, bench-sweep, bench-comm, report: another image
#:   NCCL=VERSION DRY_RUN=1   image: an NCCL variant (own tag); print the docker build instead of running it
#:   BENCH_ARGS="..."         bench, bench-sweep, bench-comm: their options (BENCH_ARGS=--dry-run: the plan only)
#:   TEST_GPU_ARGS="..."      test-gpu: its options (e.g. -- -k faults)
#:   TEST_SERVE_ARGS="..."    test-serve: its options (e.g. --phases ..., --world N)
#:   REPORT_ARGS="..."        report: its options (--dry-run: the plan only, --redo PART, --nccl-image IMAGE,
#:                            -- BENCH_ARGS)
#:   RECEIPT=FILE             docs: ingest this receipt (.tar.gz or directory) only
#:   PYTEST_ARGS="..."        test: pytest options
#:   VENV=DIR PY=PYTHON       the test environment (default .venv) and the python for the host verbs (python3)

setup: $(VENV)/.done   ## test environment: .venv with pinned torch 2.14.1 + sglang's deps (not sglang itself)
$(VENV)/.done: requirements/test.in requirements/test.lock requirements/nodeps.txt
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --progress-bar on -r requirements/test.in -c requirements/test.lock
	$(VPY) -m pip install -q --no-deps -r requirements/nodeps.txt
	touch $@

apply:           ## patched SGLang tree at build/sglang (or SGLANG_SRC=<checkout>); base from git or the pinned wheel
	$(PY) -m scripts.series.apply $(if $(SGLANG_SRC),--src $(SGLANG_SRC)) $(if $(REBUILD),--rebuild)

export: setup    ## regenerate patches/ from the commits of build/sglang
	$(VPY) -m scripts.series.export

check-patches: setup  ## lint the series, apply to a pristine base, re-export, fail on any difference
	$(VPY) -m scripts.series.check_patches

refresh: setup   ## new upstream: TO=v0.5.24 or WHEEL=sglang==0.5.24 [WHEEL_FILE=f]; WRITE=1; RESUME=1 [DROP=p]; SYNC=1
	$(VPY) -m scripts.series.refresh $(if $(TO),--tag $(TO)) $(if $(WHEEL),--wheel $(WHEEL)) \
	    $(if $(WHEEL_FILE),--wheel-file $(WHEEL_FILE)) $(if $(WRITE),--write) $(if $(RESUME),--resume) \
	    $(foreach p,$(DROP),--drop $(p)) $(if $(SYNC),--sync)

test: setup apply  ## the whole check: pytest against build/sglang, series round trip, Dockerfile lint, prove-tests
	$(VPY) -m pytest $(PYTEST_ARGS)
	$(VPY) -m scripts.series.check_patches
	$(VPY) -m scripts.host.image --lint-only
	$(VPY) -m scripts.series.prove_tests

test-gpu:        ## the patched collectives, fused op and decisions on >= 2 GPUs (here or in IMAGE) -> bench/results
	$(PY) -m scripts.host.gpu_tier $(if $(IMAGE),--image $(IMAGE)) $(TEST_GPU_ARGS)

test-serve:      ## the patched server with EAGLE-3 on generated tiny models, on the GPUs (here or in IMAGE) -> bench/results
	$(PY) -m scripts.host.serve_tier $(if $(IMAGE),--image $(IMAGE)) $(TEST_SERVE_ARGS)

prove-tests: setup apply  ## show that every patch test fails on the unpatched base tree
	$(VPY) -m scripts.series.prove_tests

image:           ## the serving image FROM the pinned upstream image (DRY_RUN=1: print the command; NCCL=<version>)
	$(PY) -m scripts.host.image $(if $(IMAGE),--tag $(IMAGE)) $(if $(NCCL),--nccl $(NCCL)) $(if $(DRY_RUN),--dry-run)

lint-docker:     ## hadolint docker/Dockerfile
	$(VPY) -m scripts.host.image --lint-only

doctor:          ## preflight of this box (GPUs, NVLink/P2P, NUMA, driver, NCCL, host settings)
	$(PY) -m scripts.host.doctor

bench:           ## A/B serving benchmarks, servers and client in the serving image (BENCH_ARGS="--variants ... --scenarios C1")
	$(BPY) -m scripts.bench.bench $(if $(IMAGE),--image $(IMAGE)) $(BENCH_ARGS)

bench-sweep:     ## drafters x speculative settings (bench/sweep.toml), each checked against SGLang's rules first
	$(BPY) -m scripts.bench.bench --sweep $(if $(IMAGE),--image $(IMAGE)) $(BENCH_ARGS)

bench-comm:      ## all-reduce / verify-shaped communication benchmark on >= 2 GPUs, in the serving image
	$(PY) -m scripts.bench.bench_comm $(if $(IMAGE),--image $(IMAGE)) $(BENCH_ARGS)

report:          ## the box receipt: test-serve, doctor, test-gpu, bench-comm, bench -> bench/receipts/<box>_<date>/ + .tar.gz (resumable; REPORT_ARGS)
	$(BPY) -m scripts.bench.receipt $(if $(IMAGE),--image $(IMAGE)) $(REPORT_ARGS)

docs:            ## regenerate eagle-fast-verify.md's tables from bench/results and receipts (RECEIPT=<.tar.gz>: that one)
	$(PY) -m scripts.bench.cost_model --write $(if $(RECEIPT),--receipt $(RECEIPT))

clean:           ## remove the trees under build/ (keeps the wheel and base cache) and .venv
	rm -rf build/sglang build/sglang-* build/sglang.new build/wt-* build/image-context $(VENV)
