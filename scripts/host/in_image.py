"""Run one of the serving image's verbs on this machine's GPUs: make test-gpu, test-serve, bench-comm (any verb).

  python -m scripts.host.in_image [--image IMAGE] [--results DIR] VERB [ARGS...]

The docker run (scripts/box/docker.py: the GPUs, the host's IPC, bench/results mounted at /results, the HF
cache, FlashInfer's cache, the CUDA/NCCL/SGLang variables by name) is printed first, then the box's checks
(scripts/box/preflight.py: the engine, the image and its patch set, no resident server, no process on the GPUs), then
this process becomes it; with --dry-run among ARGS it is only printed (on stdout), with the checks.
Exit status: the verb's; 0 a dry run whose checks pass; 2 a failed check (named with its fix).
"""

import argparse
import os
import sys
from pathlib import Path

from ..box import preflight
from ..box.docker import docker_run, hf_cache_dir, shown
from ..lib.cli import parser, run
from ..lib.errors import UserError
from ..lib.repo import REPO_ROOT
from ..series.pin import load_pin, patchset_id


def main(argv=None) -> int:
    ap = parser("scripts.host.in_image", __doc__)
    ap.add_argument("--image", help="the image (default: the one make image builds)")
    mounted = "the host directory mounted at /results (default bench/results)"
    ap.add_argument("--results", type=Path, default=REPO_ROOT / "bench" / "results", help=mounted)
    ap.add_argument("verb", help="test-serve, test-gpu, bench-comm, doctor, ...")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="the verb's arguments")
    a = ap.parse_args(argv)
    pin, dry = load_pin(), "--dry-run" in a.args
    image = a.image or pin.serving_image
    cmd = docker_run(
        image, [a.verb, *(t for t in a.args if t != "--dry-run")], results=a.results.resolve(), hf_cache=hf_cache_dir()
    )
    print(shown(cmd), file=sys.stdout if dry else sys.stderr, flush=True)
    checks = preflight.docker_checks([image], patchset_id(), (pin.upstream_image,), not dry) + [preflight.idle_check()]
    failed = [c.line() for c in checks if not c.ok]
    if dry:
        print("checks (a real run stops when one fails):\n" + "\n".join("  " + c.line() for c in checks))
        return 2 if failed else 0
    if failed:
        raise UserError(f"{a.verb} runs in the serving image, and cannot start:\n  " + "\n  ".join(failed))
    a.results.resolve().mkdir(parents=True, exist_ok=True)
    os.execvp(cmd[0], cmd)
    return 0  # not reached


if __name__ == "__main__":
    run(main)
