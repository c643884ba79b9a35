"""`make test-gpu`: the patched SGLang's own collectives, fused op and decisions on this machine's GPUs.

  python -m scripts.host.gpu_tier [--out FILE] [--world N] [--timeout S] [--python PY]
                                  [--image IMAGE | --here] [--check] [-- PYTEST_ARGS...]

Runs tests/gpu: one process per GPU, SGLang's distributed state brought up the way the model runner brings it up;
tp.all_reduce routing and results (eager and replayed from graphs captured in graph_capture()), the fused
all-reduce + residual + RMSNorm op against an fp32 reference and the unfused path, a PDL race stress, per-call
timings of those paths, what the patched code decides on this device and host, and one-rank faults bounded by a
timeout (a hang fails the test). The result document (world size, passed / failed / skipped, every test, what the
tests recorded, the command, versions) goes to --out, by default
bench/results/test-gpu_<gpu>_x<N>_<UTC date>.json; it is one part of the box receipt (make report).

Where it runs (scripts/host/route.py, the rule make bench-comm follows too; the first line says which and why): here,
with PY (default: this python), when PY's torch sees at least 2 CUDA GPUs and the patched sglang is importable
(build/sglang from `make apply`, or an installed patched sglang); otherwise inside the serving image (`docker run
--gpus all --ipc=host -v DIR:/results -v sglang-flashinfer:/root/.cache/flashinfer
IMAGE test-gpu`; the image has SGLang, sgl-kernel, FlashInfer and the NCCL the
server runs), when the docker engine answers and has the image. --image forces the image, --here forbids it. In the
image the default result directory is the mounted /results ($EAGLE_RESULTS).

--check chooses the route and stops there (make report's preflight): one JSON line {estimate_s, route}, or the
same error a run would give.

Exit status: 0 every test passed (GPU tests skip only where this machine has fewer GPUs than they need; with
--check: it can run); 1 a test failed; 2 no usable GPU, no way to run (neither PY nor docker with the image), or a bad option.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
from pathlib import Path

from ..lib import proc
from ..lib.cli import run
from ..lib.errors import UserError
from ..lib.progress import say
from ..lib.repo import REPO_ROOT, revision
from . import route

ESTIMATE_S = 900  # the tier on 8 GPUs: an assumption until a box run times it (the H200 pair took minutes)


def why_not_here(python: str, info: dict) -> str:
    """'' when `python` can run the tier here: torch with >= 2 CUDA GPUs, and a sglang to test (an importable one,
    build/sglang from make apply, or SGLANG_TREE)."""
    why = route.gpus_why(python, info)
    tree = REPO_ROOT / "build" / "sglang" / "python" / "sglang"
    if not why and not (tree.is_dir() or info.get("sglang") or os.environ.get("SGLANG_TREE")):
        why = f"{python} has no sglang and build/sglang is missing (make apply)"
    return why


def pytest_command(python: str, pytest_args: list[str]) -> list[str]:
    return [python, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-o", "addopts=", str(REPO_ROOT / "tests" / "gpu"),
            *pytest_args]


def run_here(python: str, out: Path, world: int | None, timeout: int, pytest_args: list[str]) -> int:
    env = {**os.environ, "EAGLE_GPU_RESULTS": str(out), "EAGLE_GPU_TIMEOUT": str(timeout)}
    if world:
        env["EAGLE_GPU_WORLD"] = str(world)
    cmd = pytest_command(python, pytest_args)
    say(f"running: {' '.join(cmd)}")
    res = proc.run(cmd, timeout=None, cwd=REPO_ROOT, env=env, capture=False)
    return res.returncode if res.returncode is not None else 1


def run_in_image(image: str, out: Path, world: int | None, timeout: int, pytest_args: list[str]) -> int:
    out.parent.mkdir(parents=True, exist_ok=True)
    args = ["--out", f"{route.IN_IMAGE_RESULTS}/{out.name}", "--timeout", str(timeout)]
    if world:
        args += ["--world", str(world)]
    if pytest_args:
        args += ["--", *pytest_args]
    cmd = route.docker_run(image, "test-gpu", args, out.parent)
    say(f"running: {' '.join(cmd)}")
    res = proc.run(cmd, timeout=None, capture=False)
    return res.returncode if res.returncode is not None else 1


def finish(out: Path, meta: dict) -> dict:
    """Add what ran (command, where, revision, times) to the document the tests wrote; report the counts."""
    if not out.is_file():
        raise UserError(f"the GPU tests wrote no result document at {out}: see their output above")
    doc = json.loads(out.read_text())
    doc.setdefault("meta", {}).update(meta)
    out.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    say(f"{doc['passed']} passed, {doc['failed']} failed, {doc['skipped']} skipped on {doc['world']} GPU(s): {out}")
    return doc


def parse(argv):
    ap = argparse.ArgumentParser(prog="scripts.host.gpu_tier", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="result document (default bench/results/test-gpu_<gpu>_x<N>_<date>.json)")
    ap.add_argument("--world", type=int, help="ranks per test (default: every visible GPU)")
    ap.add_argument("--timeout", type=int, default=600, help="seconds one multi-rank run may take (default 600)")
    ap.add_argument("--python", default=sys.executable, help="interpreter to run the tests with (default: this one)")
    ap.add_argument("--check", action="store_true", help="only choose the route (and check the results directory); "
                                                         "print {estimate_s, route} as JSON (make report)")
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--image", nargs="?", const="", default=None, help="run inside the serving image (default "
                                                                         "eagle-fast-verify/sglang:<pinned tag>)")
    where.add_argument("--here", action="store_true", help="never fall back to the image")
    ap.add_argument("pytest_args", nargs="*", help="after --: passed to pytest (e.g. -k faults)")
    a = ap.parse_args(argv)
    if a.world is not None and a.world < 2:
        ap.error("--world needs at least 2 ranks")
    return a


def main(argv=None) -> int:
    a = parse(argv)
    results = a.out.parent if a.out else route.results_dir()  # first: a missing mount fails now
    info = {} if a.image is not None else route.probe_python(a.python)
    where = route.choose("test-gpu", route.describe(a.python, info), why_not_here(a.python, info), a.image, a.here)
    say(where.message)
    if a.check:
        print(json.dumps({"estimate_s": ESTIMATE_S, "route": where.message}))
        return 0
    names = route.gpu_names()  # the route saw >= 2 GPUs here (torch) or the image will; nvidia-smi names them
    world = a.world or len(names) or info.get("gpus") or "all"
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H%MZ")
    out = a.out or results / f"test-gpu_{route.gpu_slug(names)}_x{world}_{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"gpus": names, "revision": revision(short=True)[0], "started_at": stamp,
            "command": " ".join(["python3", "-m", "scripts.host.gpu_tier", *(argv if argv is not None else sys.argv[1:])])}
    if where.where == "here":
        rc = run_here(a.python, out, a.world, a.timeout, a.pytest_args)
    else:
        rc = run_in_image(where.image, out, a.world, a.timeout, a.pytest_args)
    meta["ran"] = where.message
    doc = finish(out, meta)
    return 0 if rc == 0 and doc["failed"] == 0 else 1


if __name__ == "__main__":
    run(main)
