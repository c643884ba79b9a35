# Thin targets; the work lives in scripts/ (one module per verb: series/, host/, bench/, comm/, report/, over box/ and
# lib/). `make help` lists them.
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
RUFF      ?= $(VENV)/bin/ruff
IMAGE     ?=
export SGLANG_BASE

# A command-line variable this Makefile does not read but that looks like one it does (DRYRUN or dry-run for
# DRY_RUN, BENCH_ARG for BENCH_ARGS) stops make with the right name: else a dry run quietly becomes a real build.
CLI_VARS  := $(foreach v,$(.VARIABLES),$(if $(filter command line,$(origin $(v))),$(v)))
ifneq ($(CLI_VARS),)
LP        := (
OUR_VARS  := $(sort $(shell grep -ohE '[$$][$(LP)][A-Z][A-Z0-9_]*|[A-Z][A-Z0-9_]*=' $(MAKEFILE_LIST) | tr -d '$$$(LP)='))
LOOKALIKE := $(shell $(PY) -c 'import difflib, sys; n = lambda s: s.upper().replace("-", "").replace("_", "").rstrip("S"); \
    i = sys.argv.index("--"); ours = sys.argv[i + 1:]; print(*[f"{v} is not a variable of this Makefile: did you \
    mean {m[0]}?" for v in sys.argv[1:i] for m in [[o for o in ours if n(o) == n(v)] or difflib.get_close_matches(v.upper(), \
    ours, 1, 0.8)] if m], sep="; ")' $(filter-out $(OUR_VARS),$(CLI_VARS)) -- $(OUR_VARS))
$(if $(LOOKALIKE),$(error $(LOOKALIKE)))
endif
# DRY_RUN=1 is every verb's --dry-run (print what would run, check, run nothing); where it means nothing, make stops
DRY       := $(if $(DRY_RUN),--dry-run)
DRY_VERBS := image serve test-gpu test-serve bench bench-sweep bench-comm report
ifneq ($(DRY_RUN),)
ifneq ($(filter-out $(DRY_VERBS),$(or $(MAKECMDGOALS),help)),)
$(error DRY_RUN=1 means nothing to make $(filter-out $(DRY_VERBS),$(or $(MAKECMDGOALS),help)): it is the dry run of \
    $(DRY_VERBS) only)
endif
endif

.PHONY: help setup apply export check-patches refresh test test-gpu test-serve prove-tests image lint-docker doctor \
        serve test-image bench bench-sweep bench-comm report docs clean distclean

help:            ## list targets and the variables they take
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | expand -t16
	@sed -n 's/^#: \{0,1\}//p' $(MAKEFILE_LIST)

#: Variables (make TARGET VAR=value; the targets' help above names theirs):
#:   SGLANG_BASE=clone|wheel  apply, check-patches, refresh: where the pristine base comes from (default auto)
#:   SGLANG_WHEEL=FILE        apply: the pinned wheel from a file you have (checked against the pin)
#:   SGLANG_SRC=DIR           apply: patch your own clean checkout of the tag instead of build/sglang
#:   REBUILD=1                apply: build build/sglang again from a fresh base (drops commits not exported)
#:   TO=TAG WHEEL=FILE WRITE=1  refresh: the new release, its wheel if you have it, move the pin and patches/
#:   IMAGE=NAME:TAG           image, serve, test-gpu, test-serve, bench, bench-sweep, bench-comm, report: another image
#:   DRY_RUN=1                image, serve, test-gpu, test-serve, bench, bench-sweep, bench-comm, report: their
#:                            --dry-run (print what would run and the checks, run nothing; exit 2 if a check fails)
#:   NCCL=VERSION             image: an NCCL variant (own tag)
#:   BASE=REF ALLOW_BAD_NCCL=1  image: FROM another base (labels name it); build an NCCL known to fail, on purpose
#:   SERVE_ARGS="..."         serve: its options (--dry-run, --draft-model D, --host 0.0.0.0 --api-key-file F, -- ARGS)
#:   BENCH_ARGS="..."         bench, bench-sweep, bench-comm: their options (BENCH_ARGS=--dry-run: the plan only)
#:   TEST_GPU_ARGS="..."      test-gpu: its options (e.g. -- -k faults)
#:   TEST_SERVE_ARGS="..."    test-serve: pytest options for tests/gpu/serve (e.g. -k client, --serve-world 2)
#:   REPORT_ARGS="..."        report: its options (--dry-run: the plan only, --redo PART, -- BENCH_ARGS)
#:   RECEIPT=FILE             docs: ingest this receipt (.tar.gz or directory) only
#:   PYTEST_ARGS="..."        test: pytest options (RUFF=PATH: another ruff; `ruff format scripts tests bench`
#:                            writes what make test checks)
#:   VENV=DIR PY=PYTHON       the test environment (default .venv) and the python for the host verbs (python3)

setup: $(VENV)/.done   ## test environment: .venv with pinned torch 2.14.1 + sglang's deps (not sglang itself), ~6 GB
$(VENV)/.done: requirements/test.in requirements/test.lock requirements/nodeps.txt
	@$(PY) -c 'import scripts'
	@echo "make setup: $(VENV) gets torch 2.14.1 and SGLang's dependencies, about 6 GB to download and install:" \
	     "about 2 minutes on a fast link, much longer on a slow one (pip shows each package)"
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install --progress-bar on -r requirements/test.in -c requirements/test.lock
	$(VPY) -m pip install --no-deps -r requirements/nodeps.txt
	touch $@

apply:           ## build/sglang: the pinned base (a clone, else the pinned wheel) + git am of the series (SGLANG_SRC=DIR)
	$(PY) -m scripts.series.apply $(if $(SGLANG_SRC),--src $(SGLANG_SRC)) $(if $(REBUILD),--rebuild)

export:          ## patches/ (*.patch, series) from the commits of build/sglang (git format-patch)
	$(PY) -m scripts.series.export

check-patches:   ## lint the series, git am it onto a pristine base, re-export, fail on any difference
	$(PY) -m scripts.series.check_patches

refresh: setup   ## the series onto a new release with git am -3: TO=v0.5.24 [WHEEL=FILE]; WRITE=1 moves the pin + patches/
	$(VPY) -m scripts.series.refresh $(if $(TO),--to $(TO)) $(if $(WHEEL),--wheel $(WHEEL)) $(if $(WRITE),--write)

test: setup apply  ## the whole check: code format and lint, pytest, series round trip, Dockerfile lint, prove-tests
	$(RUFF) format --check scripts tests bench
	$(RUFF) check scripts tests bench
	$(VPY) -m pytest $(PYTEST_ARGS)
	$(VPY) -m scripts.series.check_patches
	$(VPY) -m scripts.host.image --lint-only
	$(VPY) -m scripts.series.prove_tests

test-gpu:        ## the patched collectives, fused op and decisions on >= 2 GPUs, in the image -> bench/results
	$(PY) -m scripts.host.in_image $(if $(IMAGE),--image $(IMAGE)) test-gpu $(DRY) $(TEST_GPU_ARGS)

test-serve:      ## the patched server with EAGLE-3 on generated tiny models, in IMAGE on this machine's GPUs -> bench/results
	$(PY) -m scripts.host.in_image $(if $(IMAGE),--image $(IMAGE)) test-serve $(DRY) $(TEST_SERVE_ARGS)

prove-tests: setup apply  ## show that every patch test fails on the unpatched base tree
	$(VPY) -m scripts.series.prove_tests

image:           ## the serving image FROM the pinned upstream image (DRY_RUN=1: print the command; NCCL=, BASE=)
	$(PY) -m scripts.host.image $(if $(IMAGE),--tag $(IMAGE)) $(if $(NCCL),--nccl $(NCCL)) $(if $(BASE),--base \
	    $(BASE)) $(if $(ALLOW_BAD_NCCL),--allow-known-bad-nccl) $(DRY)

lint-docker:     ## hadolint docker/Dockerfile
	$(VPY) -m scripts.host.image --lint-only

serve:           ## serve Kimi-K2.5 with EAGLE-3 from the image (the docker run is printed first; SERVE_ARGS)
	$(PY) -m scripts.host.serve --image=$(IMAGE) $(DRY) $(SERVE_ARGS)

test-image:      ## build docker/Dockerfile on a local stand-in base and run its verbs (root, ~8 GB, 3-7 min)
	$(PY) -m tests.image.build

doctor:          ## preflight of this box (GPUs, NVLink/P2P, NUMA, driver, NCCL, host settings)
	$(PY) -m scripts.host.doctor

bench:           ## A/B serving benchmarks, servers and client in the serving image (BENCH_ARGS="--variants ... --scenarios C1")
	$(BPY) -m scripts.bench.bench $(if $(IMAGE),--image $(IMAGE)) $(DRY) $(BENCH_ARGS)

bench-sweep:     ## drafters x speculative settings (bench/sweep.toml), each point's setting checked first
	$(BPY) -m scripts.bench.bench --sweep $(if $(IMAGE),--image $(IMAGE)) $(DRY) $(BENCH_ARGS)

bench-comm:      ## all-reduce / verify-shaped communication benchmark on >= 2 GPUs, in the serving image
	$(PY) -m scripts.host.in_image $(if $(IMAGE),--image $(IMAGE)) bench-comm $(DRY) $(BENCH_ARGS)

report:          ## the box receipt: test-serve, doctor, test-gpu, bench-comm, bench -> bench/receipts/<box>_<date>/ + .tar.gz (resumable; REPORT_ARGS)
	$(BPY) -m scripts.report.receipt $(if $(IMAGE),--image $(IMAGE)) $(DRY) $(REPORT_ARGS)

docs:            ## regenerate eagle-fast-verify.md's tables and plot from bench/ and receipts (RECEIPT=<.tar.gz>: that one)
	$(BPY) -m scripts.report.cost_model --write $(if $(RECEIPT),--receipt $(RECEIPT))

clean:           ## remove the trees under build/ (keeps the wheel and base cache, and .venv)
	rm -rf build/sglang build/sglang-* build/sglang.new build/wt-* build/image-context

distclean: clean ## also remove .venv (make setup again: ~6 GB) and build/cache
	rm -rf $(VENV) build/cache
