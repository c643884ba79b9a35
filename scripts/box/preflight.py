"""What a box verb checks before anything expensive starts, each check with its fix: the docker engine and the
images, the GPUs (the one GPU list: enough, and idle), the weights in the HF cache (hf_cache_dir(), the cache serve
and bench mount), the results directory (written to, not only measured), the port, no resident server."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import socket
import tempfile
from pathlib import Path

from ..lib import proc
from .docker import engine, hf_cache_dir, image_id

MIN_FREE_GB = 2.0  # results, bench_serving and server logs of a whole session


@dataclasses.dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""

    def line(self) -> str:
        return f"{'ok  ' if self.ok else 'FAIL'} {self.name}: {self.detail}" + ("" if self.ok else f". Fix: {self.fix}")


def gpus() -> tuple[list[str], str]:
    """The one GPU list: (the NVIDIA GPUs this process may use, '') or ([], why not); nvidia-smi -L, narrowed by
    CUDA_VISIBLE_DEVICES; CUDA is not initialised here."""
    res = proc.run(["nvidia-smi", "-L"], timeout=30)
    if not res.ok:
        return [], res.why
    lines = [ln.strip() for ln in res.stdout.splitlines() if ln.startswith("GPU ")]
    names = [re.sub(r"^GPU \d+: (.*?)( \(UUID:.*)?$", r"\1", ln) for ln in lines]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        names = names[: len([v for v in visible.split(",") if v.strip()])]
    return names, "" if names else "nvidia-smi lists none"


def gpu_checks(want: int, idle: bool = True) -> list[Check]:
    """At least `want` GPUs, and (idle) none of them busy: a resident server holds their memory."""
    names, why = gpus()
    if not names:
        return [Check("GPUs", False, f"no NVIDIA GPU visible ({why})", "run this on the GPU box (make doctor)")]
    out = [
        Check(
            "GPUs",
            len(names) >= want,
            f"{len(names)} x {names[0]}, {want} needed",
            "run on the 8-GPU box, or a profile with a smaller tp-size",
        )
    ]
    if not idle:
        return out
    res = proc.run(
        ["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader"], timeout=30
    )
    busy = [ln.strip() for ln in res.stdout.splitlines() if ln.strip()] if res.ok else []
    return out + [
        Check(
            "GPUs idle",
            not busy,
            "; ".join(busy) or "no process holds GPU memory",
            "stop what holds them (kill PID; a server in a container: docker stop NAME)",
        )
    ]


def docker_checks(images: list[str]) -> list[Check]:
    if not images:
        return []
    eng = engine()
    if not eng.ok:
        return [Check("docker engine", False, f"the docker engine {eng.why}", eng.fix)]
    out = [Check("docker engine", True, f"docker engine {eng.version}")]
    for image in dict.fromkeys(images):
        ident, why = image_id(image)
        fix = "make image" if "eagle-fast-verify" in image else f"docker pull {image}"
        out.append(Check(f"image {image}", bool(ident), (ident or "")[:19] or why, fix))
    running = proc.run(["docker", "ps", "--format", "{{.Names}}\t{{.Image}}"], timeout=60).stdout.splitlines()
    ours = [ln.split("\t") for ln in running if ln.count("\t") == 1 and ln.split("\t")[1] in images]
    return out + [
        Check(
            "no resident server",
            not ours,
            ", ".join(f"container {n} ({i})" for n, i in ours) or "no container of these images runs",
            "; ".join(f"docker stop {n}" for n, _ in ours),
        )
    ]


def port_check(port: int) -> Check:
    with socket.socket() as s:
        s.settimeout(1)
        taken = s.connect_ex(("127.0.0.1", port)) == 0
    return Check(
        f"port {port}",
        not taken,
        "in use: something listens there" if taken else "free",
        "stop the server on it (docker ps lists containers: docker stop NAME), or pass --port N",
    )


def weights_problem(repo: str, hf_cache: Path) -> str:
    """'' when `repo` (an HF repo id, or a local directory) is complete on disk; else what is missing."""
    local = Path(repo).expanduser()
    if repo.startswith(("/", ".", "~")) or local.is_dir():
        return "" if (local / "config.json").is_file() else f"{local} holds no config.json"
    snaps = hf_cache / "hub" / f"models--{repo.replace('/', '--')}" / "snapshots"
    for snap in sorted(snaps.iterdir()) if snaps.is_dir() else []:
        index = next(iter(sorted(snap.glob("*.safetensors.index.json"))), None)
        shards = set(json.loads(index.read_text()).get("weight_map", {}).values()) if index else set()
        missing = sorted(s for s in shards if not (snap / s).exists())
        if (snap / "config.json").is_file() and not missing and (shards or any(snap.glob("*.safetensors"))):
            return ""
        if missing:
            return f"{len(missing)} of {len(shards)} weight shards missing in {snap} (e.g. {missing[0]})"
    return f"not in the HF cache ({snaps} has no complete snapshot)"


def weights_check(repos: list[str]) -> Check:
    cache = Path(hf_cache_dir())
    problems = {r: why for r in dict.fromkeys(repos) if (why := weights_problem(r, cache))}
    if not problems:
        return Check("weights", True, f"{', '.join(dict.fromkeys(repos)) or 'none needed'} in {cache}")
    return Check(
        "weights",
        False,
        "; ".join(f"{r}: {w}" for r, w in problems.items()),
        "; ".join(f"hf download {r} --cache-dir {cache / 'hub'}" for r in problems)
        + " (or set HF_HOME to the cache that holds them: serve and bench mount $HF_HOME)",
    )


def writable_check(d: Path) -> Check:
    """The results directory: a file is written and removed there (or where it would be made), and free space."""
    base = d
    while not base.exists() and base != base.parent:
        base = base.parent
    try:
        with tempfile.TemporaryDirectory(dir=base, prefix=".write-probe-"):
            pass
    except (OSError, NotADirectoryError) as e:
        return Check(
            "results directory",
            False,
            f"{d}: cannot write in {base} ({e.strerror or e})",
            "pass --results-dir DIR (make report: --dir DIR) where you may write",
        )
    free = shutil.disk_usage(base).free / 1e9
    return Check(
        "results directory",
        free >= MIN_FREE_GB,
        f"{d}: writable, {free:.1f} GB free",
        f"free at least {MIN_FREE_GB:g} GB there, or pass another directory",
    )
