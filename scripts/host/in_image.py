"""Run one of the serving image's verbs on this machine's GPUs: make test-gpu, test-serve, bench-comm (any verb).

  python -m scripts.host.in_image [--image IMAGE] [--results DIR] VERB [ARGS...]

The docker run (scripts/box/docker.py: the GPUs, the host's IPC, bench/results mounted at /results, the HF
cache, FlashInfer's cache, the CUDA/NCCL/SGLang variables by name) is printed first, then this process becomes it;
with --dry-run among ARGS it is only printed (on stdout).
Exit status: the verb's; 0 a dry run; 2 when the docker engine or the image is missing (named with the fix).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..box.docker import docker_run, hf_cache_dir, image_id, shown
from ..lib.cli import run
from ..lib.errors import UserError
from ..lib.repo import REPO_ROOT
from ..series.pin import load_pin


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="scripts.host.in_image", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--image", help="the image (default: the one make image builds)")
    ap.add_argument(
        "--results",
        type=Path,
        default=REPO_ROOT / "bench" / "results",
        help="the host directory mounted at /results (default bench/results)",
    )
    ap.add_argument("verb", help="test-serve, test-gpu, bench-comm, doctor, ...")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="the verb's arguments")
    a = ap.parse_args(argv)
    image, dry = a.image or load_pin().serving_image, "--dry-run" in a.args
    cmd = docker_run(
        image, [a.verb, *(t for t in a.args if t != "--dry-run")], results=a.results.resolve(), hf_cache=hf_cache_dir()
    )
    print(shown(cmd), file=sys.stdout if dry else sys.stderr, flush=True)
    if dry:
        return 0
    found, why = image_id(image)
    if found is None:
        raise UserError(f"{a.verb} runs in the serving image: {why}")
    a.results.resolve().mkdir(parents=True, exist_ok=True)
    os.execvp(cmd[0], cmd)
    return 0  # not reached


if __name__ == "__main__":
    run(main)
