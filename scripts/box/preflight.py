"""What a box verb checks before anything expensive starts, each check with its fix: the docker engine and the
images (built from this checkout's series), no resident server (one a run left behind is stopped), the GPUs (the one
GPU list: enough, and idle), the weights in the HF cache (hf_cache_dir(), the cache every verb mounts), the results
directory (written to, not only measured), the port."""

import dataclasses
import json
import os
import re
import shutil
import socket
from pathlib import Path

from ..lib import proc
from .docker import OWNER, engine, hf_cache_dir, image_id

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


def gpu_checks(want: int) -> list[Check]:
    """At least `want` GPUs, and none of them busy."""
    names, why = gpus()
    if not names:
        return [Check("GPUs", False, f"no NVIDIA GPU visible ({why})", "run this on the GPU box (make doctor)")]
    fix = "run on the 8-GPU box, or a profile with a smaller tp-size"
    return [Check("GPUs", len(names) >= want, f"{len(names)} x {names[0]}, {want} needed", fix), idle_check()]


def idle_check() -> Check:
    """No process holds GPU memory (a resident server would, in another container or tmux pane)."""
    res = proc.run(
        ["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader"], timeout=30
    )
    busy = [ln.strip() for ln in res.stdout.splitlines() if ln.strip()] if res.ok else []
    fix = "stop what holds them (kill PID; a server in a container: docker stop NAME)"
    return Check("GPUs idle", not busy, "; ".join(busy) or "no process holds GPU memory", fix)


def docker_checks(images: list[str], patchset: str, stock: tuple = (), stop_left: bool = True) -> list[Check]:
    """The engine, each image (all but the stock ones built from `patchset`), no container of these images running;
    one that a run left behind (the process that started it is gone) is stopped (stop_left; a dry run says so)."""
    if not images:
        return []
    eng = engine()
    if not eng.ok:
        return [Check("docker engine", False, f"the docker engine {eng.why}", eng.fix)]
    out = [Check("docker engine", True, f"docker engine {eng.version}")]
    for image in dict.fromkeys(images):
        ident, why = image_id(image, "" if image in stock else patchset)
        detail, _, fix = why.partition(". Fix: ")
        out.append(Check(f"image {image}", bool(ident), (ident or "")[:19] or detail, fix))
    running = proc.run(["docker", "ps", "--format", "{{.Names}}\t{{.Image}}"], timeout=60).stdout.splitlines()
    ours = [ln.split("\t") for ln in running if ln.count("\t") == 1 and ln.split("\t")[1] in images]
    left = {n: m[1] for n, _ in ours if (m := OWNER.match(n)) and not Path(f"/proc/{m[1]}").exists()}
    for n in left if stop_left else ():
        proc.run(["docker", "rm", "-f", n], timeout=120)
    kept = [(n, i) for n, i in ours if n not in left]
    detail = ", ".join(f"container {n} ({i})" for n, i in kept) or "no container of these images runs"
    said = "stopped" if stop_left else "a real run stops"
    detail += "".join(f"; {said} {n}, left by process {pid}, which is gone" for n, pid in left.items())
    return out + [Check("no resident server", not kept, detail, "; ".join(f"docker stop {n}" for n, _ in kept))]


def port_check(port: int) -> Check:
    with socket.socket() as s:
        s.settimeout(1)
        taken = s.connect_ex(("127.0.0.1", port)) == 0
    fix = "stop the server on it (docker ps lists containers: docker stop NAME), or pass --port N"
    return Check(f"port {port}", not taken, "in use: something listens there" if taken else "free", fix)


def weights_problem(repo: str, hf_cache: Path) -> str:
    """'' when `repo` (an HF repo id, or a local directory) is complete on disk; else what is missing."""
    local = Path(repo).expanduser()
    if repo.startswith(("/", ".", "~")) or local.is_dir():
        return "" if (local / "config.json").is_file() else f"{local} holds no config.json"
    snaps = hf_cache / f"models--{repo.replace('/', '--')}" / "snapshots"
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
    fix = "; ".join(f"hf download {r} --cache-dir {cache}" for r in problems if not r.startswith(("/", ".", "~")))
    fix += " (or export HF_HUB_CACHE=<the cache that holds them>: every verb mounts it)"
    return Check("weights", False, "; ".join(f"{r}: {w}" for r, w in problems.items()), fix)


def writable_check(d: Path) -> Check:
    """The results directory: this user may write there (or where it would be made), and free space."""
    base = next(p for p in (d, *d.parents) if p.exists())
    if not base.is_dir() or not os.access(base, os.W_OK | os.X_OK):
        fix = "pass --results-dir DIR (make report: --dir DIR) where you may write"
        return Check("results directory", False, f"{d}: cannot write in {base}", fix)
    free, fix = shutil.disk_usage(base).free / 1e9, f"free at least {MIN_FREE_GB:g} GB there, or pass another directory"
    return Check("results directory", free >= MIN_FREE_GB, f"{d}: writable, {free:.1f} GB free", fix)
