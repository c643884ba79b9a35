"""Where a GPU verb runs (make test-gpu, make bench-comm): here, or inside the serving image, and why.

Here: an interpreter whose torch sees at least 2 CUDA GPUs and that has what the verb needs from the patched SGLang
(probe_python asks it in a subprocess, through the locator scripts/series/sglang_pkg.py). The image: `docker run
--rm --gpus all --ipc=host -v DIR:/results IMAGE <verb> --here ...` when the docker engine answers and the image
is present (image_ready). `choose()` is the one rule both verbs follow; its messages name the route taken and why,
and when neither works, what is missing on each side and the fix.

Results: a verb writes under results_dir(): $EAGLE_RESULTS (the image sets /results, the directory the host
mounts; it must exist, so a forgotten -v fails loudly instead of losing the results in the container), else
bench/results of this repository.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
from pathlib import Path

from ..lib import proc
from ..lib.errors import UserError
from ..lib.repo import REPO_ROOT
from ..series.pin import load_pin
from ..series.sglang_pkg import probe
from .engine import FLASHINFER_CACHE_IN_IMAGE, FLASHINFER_VOLUME, diagnose
from .exposure import KEY_VAR

RESULTS_VAR = "EAGLE_RESULTS"
IN_IMAGE_RESULTS = "/results"
# FlashInfer's JIT and autotune cache, shared with `serve` (docker/README.md): kernels compile once per host.
JIT_VOLUME = f"{FLASHINFER_VOLUME}:{FLASHINFER_CACHE_IN_IMAGE}"
# Variables of the caller's environment that reach the container (by name: docker copies the values).
PASS_ENV = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")
PASS_PREFIXES = ("NCCL_", "SGLANG_", "FLASHINFER_")


@dataclasses.dataclass
class Route:
    where: str  # "here" or "image"
    message: str  # which route and why, for the user
    image: str = ""  # the image, when where == "image"
    partial: str = ""  # here, but without what `partial` names (e.g. the SGLang rows), and why


def results_dir() -> Path:
    """Where results go: $EAGLE_RESULTS (must exist: in the image it is the mounted directory), else bench/results."""
    named = os.environ.get(RESULTS_VAR)
    if not named:
        return REPO_ROOT / "bench" / "results"
    path = Path(named)
    if not path.is_dir():
        image = os.environ.get("EAGLE_IMAGE") or default_image()
        raise UserError(f"{RESULTS_VAR}={named} does not exist, so the results would stay inside the container: "
                        f"mount a host directory there, e.g. docker run --gpus all --ipc=host -v "
                        f"\"$PWD/bench/results:{named}\" -v sglang-flashinfer:/root/.cache/flashinfer {image} ... "
                        f"(or set {RESULTS_VAR} to an existing directory)")
    return path


def gpu_names() -> list[str]:
    """Names of the NVIDIA GPUs this process may use (nvidia-smi -L, narrowed by CUDA_VISIBLE_DEVICES)."""
    res = proc.run(["nvidia-smi", "-L"], timeout=30)
    if not res.ok:
        return []
    names = [re.sub(r"^GPU \d+: (.*?)( \(UUID:.*)?$", r"\1", ln.strip()) for ln in res.stdout.splitlines()
             if ln.startswith("GPU ")]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return names if visible is None else names[:len([v for v in visible.split(",") if v.strip()])]


def gpu_slug(names: list[str]) -> str:
    """H200 from 'NVIDIA H200', RTX-PRO-6000-Blackwell-Server-Edition from the box's cards (for file names)."""
    name = re.sub(r"^NVIDIA\s+", "", names[0]) if names else "nogpu"
    return re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-")


def probe_python(python: str) -> dict:
    """What `python` has for the GPU verbs (scripts/series/sglang_pkg.py): torch (version, CUDA GPUs), sglang
    (directory, patched), flashinfer."""
    return probe(python, ("flashinfer",), torch=True)


def gpus_why(python: str, info: dict) -> str:
    """'' when `python`'s torch sees >= 2 CUDA GPUs, else why not."""
    if info.get("failed") or info.get("torch_error"):
        return f"{python} cannot import torch ({info.get('failed') or info['torch_error']})"
    if info.get("gpus", 0) < 2:
        return f"{python}'s torch {info.get('torch')} sees {info.get('gpus', 0)} CUDA GPU(s), and 2 are needed"
    return ""


def sglang_why(python: str, info: dict, flashinfer: bool = True) -> str:
    """'' when `python` imports a patched sglang (and FlashInfer, if asked), else why not."""
    if not info.get("sglang"):
        return f"{python} cannot import sglang (make apply, then PYTHONPATH=build/sglang/python)"
    if not info.get("patched"):
        return f"the sglang {python} imports ({info['sglang']}) is not patched (its git history holds no patch set)"
    if flashinfer and "flashinfer" in info.get("missing", ["flashinfer"]):
        return f"{python} cannot import flashinfer"
    return ""


def image_ready(image: str, docker: str = "docker") -> tuple[bool, str]:
    """(True, 'image NAME (id)') when the docker engine answers and has the image, else (False, what is missing)."""
    if proc.which(docker) is None:
        return False, f"{docker} is not installed (no docker client on PATH)"
    res = proc.run([docker, "image", "inspect", "--format", "{{.Id}}", image], timeout=60)
    if res.ok:
        return True, f"image {image} ({res.stdout.strip()[:19]})"
    if "No such image" in res.output or "No such object" in res.output:
        return False, f"image {image} is not here (build it: make image)"
    why, fix = diagnose(res.output, docker)  # scripts/host/engine.py: the one reading of "no engine"
    if why:
        return False, f"the docker engine does not answer: it {why}; {fix}"
    return False, f"docker cannot tell whether image {image} is here ({res.why})"


def default_image() -> str:
    """The image `make image` builds from the pin (eagle-fast-verify/sglang:<pinned tag>)."""
    return load_pin().serving_image


def describe(python: str, info: dict) -> str:
    """One line on what `python` has, e.g. 'python3 (torch 2.14.1, 8 CUDA GPUs, patched sglang at ...)'."""
    parts = [f"torch {info['torch']}, {info.get('gpus', 0)} CUDA GPU(s)" if info.get("torch") else "no torch"]
    if info.get("sglang"):
        parts.append(f"{'patched' if info.get('patched') else 'stock'} sglang at {info['sglang']}")
    return f"{python} ({', '.join(parts)})"


def choose(verb: str, here: str, why_not_here: str, image: str | None, here_only: bool = False, *,
           partial: str = "", partial_ok: bool = False) -> Route:
    """The route for `verb`. here: what this python has (describe()); why_not_here: '' when it can run all of the
    verb, else why not. image: None (choose), '' (the default image) or a name (--image). partial_ok: this python
    can still run the verb without `partial` (e.g. 'the SGLang rows'), used when the image cannot be."""
    if image is None and not why_not_here:
        return Route("here", f"{verb}: running here with {here}")
    if here_only:
        if partial_ok:
            return Route("here", f"{verb}: running here without {partial} (--here given; {why_not_here})",
                         partial=why_not_here)
        raise UserError(f"{verb} cannot run here: {why_not_here}. Fix: run it where that is not so, or leave out "
                        f"--here to use the image")
    name = image or default_image()
    ok, img_why = image_ready(name)
    because = "--image given" if image is not None else why_not_here
    if ok:
        return Route("image", f"{verb}: running in the {img_why}, because {because}", image=name)
    if image is None and partial_ok:
        return Route("here", f"{verb}: running here without {partial} ({why_not_here}; the image would run them, "
                             f"but {img_why})", partial=why_not_here)
    cmd = shlex.join(docker_run(name, verb, [], REPO_ROOT / "bench" / "results"))
    raise UserError(f"{verb} cannot run here ({because}) nor in the image ({img_why}). Fix: on the GPU box, either "
                    f"a python with CUDA torch and the patched SGLang (make apply), or docker with the image "
                    f"(make image), which runs it as: {cmd}")


def passed_env(environ: dict[str, str] | None = None) -> list[str]:
    """Names of the caller's variables the container gets (CUDA device selection, NCCL_*, SGLANG_*, FLASHINFER_*;
    not the server's API key)."""
    env = os.environ if environ is None else environ
    return sorted(k for k in env if (k in PASS_ENV or k.startswith(PASS_PREFIXES)) and k != KEY_VAR)


def docker_run(image: str, verb: str, args: list[str], results: Path, environ: dict[str, str] | None = None,
               docker: str = "docker") -> list[str]:
    """`docker run` of an image verb with the GPUs, the host's IPC namespace (CUDA IPC between ranks), `results`
    mounted at /results, FlashInfer's JIT cache volume and the caller's CUDA/NCCL/SGLang variables (by name)."""
    env = [x for k in passed_env(environ) for x in ("-e", k)]
    return [docker, "run", "--rm", "--gpus", "all", "--ipc=host", "-v", f"{Path(results).resolve()}:{IN_IMAGE_RESULTS}",
            "-v", JIT_VOLUME, *env, image, verb, "--here", *args]
