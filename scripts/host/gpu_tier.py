"""`make test-gpu` (the image's test-gpu verb): the patched SGLang's collectives, fused op and decisions on this
machine's GPUs (pytest tests/gpu with this python).

  python -m scripts.host.gpu_tier [--out FILE] [--world N] [--timeout S] [-- PYTEST_ARGS...]

make test-gpu runs it in the serving image (scripts/host/in_image.py); a machine with the patched SGLang runs it
directly. The result is pytest's own junitxml (--out, by default test-gpu_<box>_<UTC stamp>.xml under /results in
the image, else bench/results): every test with what it recorded (record_property), and the run's GPUs, command and
revision as the suite's properties, with no path of this machine; make report keeps it.
Exit status: 0 every test passed; 1 a test failed; 2 fewer than 2 GPUs, or a bad option.
"""

import os
import sys
from pathlib import Path

from ..box.preflight import gpus
from ..box.results import box_name, finish_junit, read_junit, result_file, results_dir
from ..lib import proc
from ..lib.cli import parser, run
from ..lib.errors import UserError
from ..lib.progress import say
from ..lib.repo import REPO_ROOT, revision


def main(argv=None) -> int:
    ap = parser("scripts.host.gpu_tier", __doc__)
    ap.add_argument("--out", type=Path, help="the junitxml result (default <results>/test-gpu_<box>_<stamp>.xml)")
    ap.add_argument("--world", type=int, help="ranks per test (default: every visible GPU)")
    ap.add_argument("--timeout", type=int, default=600, help="seconds one multi-rank run may take (default 600)")
    ap.add_argument("pytest_args", nargs="*", help="after --: passed to pytest (e.g. -k faults)")
    a = ap.parse_args(argv)
    if a.world is not None and a.world < 2:
        ap.error("--world needs at least 2 ranks")
    results = a.out.parent if a.out else results_dir()  # first: a missing mount fails now
    names, why = gpus()
    if len(names) < 2:
        fix = "start the container with the GPUs: docker run --gpus all --ipc=host ..."
        if not os.environ.get("EAGLE_IMAGE"):
            fix = "run it on the GPU box: make test-gpu (in the image)"
        raise UserError(
            f"test-gpu needs at least 2 GPUs; {len(names)} visible here ({why or 'nvidia-smi -L'}). Fix: {fix}"
        )
    out = (a.out or result_file("test-gpu", ".xml", box_name(names), results)).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "EAGLE_GPU_TIMEOUT": str(a.timeout), **({"EAGLE_GPU_WORLD": str(a.world)} if a.world else {})}
    tier = REPO_ROOT / "tests" / "gpu"
    pytest = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-o", "addopts=", f"--junitxml={out}"]
    cmd = [*pytest, str(tier), "--ignore", str(tier / "serve"), *a.pytest_args]
    say(f"running: {' '.join(cmd)}")
    rc = proc.run(cmd, timeout=None, cwd=REPO_ROOT, env=env, capture=False).returncode
    if not out.is_file():
        raise UserError(f"pytest wrote no result at {out}: see its output above")
    world = a.world or len(names)
    command = " ".join(["python3", "-m", "scripts.host.gpu_tier", *sys.argv[1:]])
    masks = {str(REPO_ROOT): "<repo>", sys.prefix: "<python>", str(Path.home()): "~", str(out.parent): "<results>"}
    finish_junit(out, {"world": world, "gpus": names, "revision": revision(short=True)[0], "command": command}, masks)
    doc = read_junit(out)
    say(f"{doc['passed']} passed, {doc['failed']} failed, {doc['skipped']} skipped on {world} GPU(s): {out}")
    return 0 if rc == 0 and doc["failed"] == 0 else 1


if __name__ == "__main__":
    run(main)
