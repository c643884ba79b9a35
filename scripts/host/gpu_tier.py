"""`make test-gpu` (the image's test-gpu verb): the patched SGLang's collectives, fused op and decisions on this
machine's GPUs (pytest tests/gpu with this python).

  python -m scripts.host.gpu_tier [--out FILE] [--world N] [--timeout S] [-- PYTEST_ARGS...]

make test-gpu runs it in the serving image (scripts/host/in_image.py); a machine with the patched SGLang runs it
directly. The result document (--out, by default test-gpu_<gpu>_x<N>_<UTC date>.json under /results in the image,
else bench/results) lists every test, what the tests recorded, the command and the GPUs; make report keeps it.
Exit status: 0 every test passed; 1 a test failed; 2 fewer than 2 GPUs, or a bad option.
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
from .docker_run import gpu_names, gpu_slug, results_dir


def cuda_gpus() -> tuple[int, str]:
    try:
        import torch

        return (torch.cuda.device_count() if torch.cuda.is_available() else 0), f"torch {torch.__version__}"
    except Exception as e:  # noqa: BLE001 - why torch does not import is the answer
        return 0, f"torch does not import ({type(e).__name__}: {e})"


def run_here(a: argparse.Namespace) -> int:
    results = a.out.parent if a.out else results_dir()  # first: a missing mount fails now
    n, torch = cuda_gpus()
    if n < 2:
        fix = ("start the container with the GPUs: docker run --gpus all --ipc=host ..."
               if os.environ.get("EAGLE_IMAGE") else "run it on the GPU box: make test-gpu (in the image)")
        raise UserError(f"test-gpu needs at least 2 CUDA GPUs; {torch} sees {n} here. Fix: {fix}")
    names = gpu_names()
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H%MZ")
    out = a.out or results / f"test-gpu_{gpu_slug(names)}_x{a.world or len(names) or n}_{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "EAGLE_GPU_RESULTS": str(out), "EAGLE_GPU_TIMEOUT": str(a.timeout),
           **({"EAGLE_GPU_WORLD": str(a.world)} if a.world else {})}
    cmd = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-o", "addopts=",
           str(REPO_ROOT / "tests" / "gpu"), *a.pytest_args]
    say(f"running: {' '.join(cmd)}")
    rc = proc.run(cmd, timeout=None, cwd=REPO_ROOT, env=env, capture=False).returncode
    doc = finish(out, {"gpus": names, "revision": revision(short=True)[0], "started_at": stamp,
                       "command": " ".join(["python3", "-m", "scripts.host.gpu_tier", *sys.argv[1:]])})
    return 0 if rc == 0 and doc["failed"] == 0 else 1


def finish(out: Path, meta: dict) -> dict:
    """Add what ran to the document the tests wrote; report the counts."""
    if not out.is_file():
        raise UserError(f"the GPU tests wrote no result document at {out}: see their output above")
    doc = json.loads(out.read_text())
    doc.setdefault("meta", {}).update(meta)
    out.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    say(f"{doc['passed']} passed, {doc['failed']} failed, {doc['skipped']} skipped on {doc['world']} GPU(s): {out}")
    return doc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="scripts.host.gpu_tier", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="result document (default <results>/test-gpu_<gpu>_x<N>_<date>.json)")
    ap.add_argument("--world", type=int, help="ranks per test (default: every visible GPU)")
    ap.add_argument("--timeout", type=int, default=600, help="seconds one multi-rank run may take (default 600)")
    ap.add_argument("pytest_args", nargs="*", help="after --: passed to pytest (e.g. -k faults)")
    a = ap.parse_args(argv)
    if a.world is not None and a.world < 2:
        ap.error("--world needs at least 2 ranks")
    return run_here(a)


if __name__ == "__main__":
    run(main)
