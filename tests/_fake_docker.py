"""A fake `docker` client: it records every argv and runs `docker run IMAGE ...` as the image would, so a printed
`docker run` command is tested by running it (a missing mount or an unknown image fails as on the box).

install() writes bin/docker (with gpus=N, an nvidia-smi listing N GPUs) and returns a FakeDocker. `run` goes through
docker/entrypoint with the image's environment, this interpreter as python3 and the mounts' paths as the host's;
`verbs` replaces an image verb by a shell command ("$@": its arguments). A container runs in its own session, its
client forwarding SIGINT, SIGTERM and SIGHUP (docker's sig-proxy). Also used by bench/device/lent.py on a lent GPU
machine, which has no docker.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NO_ENGINE = "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?"
IMAGE_ID = "sha256:0123456789abcdef0123456789abcdef"

CLIENT = r"""#!PYTHON
import json, os, signal, subprocess, sys
from pathlib import Path
state = Path(STATE)
cfg, argv, boxes = json.loads((state / "config.json").read_text()), sys.argv[1:], state / "containers"
with open(state / "argv.jsonl", "a") as f:
    f.write(json.dumps(argv) + "\n")
if (state / "down").exists():
    sys.exit(print(cfg["no_engine"], file=sys.stderr) or 1)


def alive(name):  # (pid, image) of a running container
    try:
        pid, image = (boxes / name).read_text().split()
        if open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
            return int(pid), image
    except (OSError, ValueError):
        pass


if argv[:1] == ["version"]:
    sys.exit(print("27.3.1") or 0)
if argv[:2] == ["image", "inspect"]:
    if argv[-1] in cfg["images"]:
        sys.exit(print(json.dumps([{"Id": cfg["image_id"], "RepoDigests": [], "Config": {"Labels": cfg["labels"]}}])))
    sys.exit(print(f"Error response from daemon: No such image: {argv[-1]}", file=sys.stderr) or 1)
if argv[:1] == ["ps"]:
    sys.exit(print("".join(f"{b.name}\t{alive(b.name)[1]}\n" for b in boxes.glob("*") if alive(b.name)), end=""))
if argv[:1] == ["inspect"]:
    sys.exit(print("true" if alive(argv[-1]) else "false"))
if argv[:1] == ["logs"]:
    log = state / f"{argv[-1]}.log"
    sys.exit(print(log.read_text() if log.exists() else "", end=""))
if argv[:1] in (["stop"], ["rm"]):
    if alive(argv[-1]):
        os.killpg(alive(argv[-1])[0], signal.SIGKILL)
    sys.exit((boxes / argv[-1]).unlink(missing_ok=True))
if argv[:1] != ["run"]:
    sys.exit(0)
env, mounts, opts, i = {}, {}, {}, 1
VALUED = {"-v", "--volume", "-e", "--env", "--gpus", "--network", "--name", "-p", "--publish", "--entrypoint",
          "--env-file", "-w", "--shm-size", "--ulimit"}
while i < len(argv) and argv[i].startswith("-"):
    flag, eq, value = argv[i].partition("=")
    if flag in VALUED and not eq:
        value, i = argv[i + 1], i + 1
    opts[flag] = value
    if flag in ("-v", "--volume"):
        src, _, dst = value.partition(":")
        mounts[dst.split(":")[0]] = src
        if src.startswith("/") and not os.path.exists(src):
            Path(src).mkdir(parents=True)  # docker -v makes a missing host directory
    elif flag in ("-e", "--env"):
        name, eq2, v = value.partition("=")
        if eq2 or name in os.environ:
            env[name] = v if eq2 else os.environ[name]
    i += 1
image, args = argv[i], argv[i + 1:]
for dst, src in mounts.items():  # a path under a mount, as the container sees it, is the host's
    if dst.startswith("/") and src.startswith("/"):
        args = [src + a[len(dst):] if a == dst or a.startswith(dst + "/") else a for a in args]
if image not in cfg["images"]:
    sys.exit(print(f"Unable to find image '{image}' locally", file=sys.stderr) or 125)
bindir = state / "image-bin"
bindir.mkdir(exist_ok=True)
(bindir / "python3").write_text(f"#!/bin/sh\nexec {cfg['python']} \"$@\"\n")
(bindir / "python3").chmod(0o755)
results = mounts.get("/results") or "/results"  # unmounted: the image's own path, which it does not create
image_env = {"PYTHONPATH": cfg["pythonpath"]} if cfg["pythonpath"] else {}
env = {"PATH": f"{bindir}:/usr/bin:/bin", "HOME": str(state / "container-home"), "EAGLE_HOME": cfg["root"],
       "EAGLE_RESULTS": results, "EAGLE_IMAGE": image, **image_env, **env}
verb = cfg["verbs"].get(args[0]) if args else None
cmd = ["sh", "-c", verb, "sh", *args[1:]] if verb else [cfg["entrypoint"], *args]
name = opts.get("--name")
out = open(state / f"{name}.log", "a") if "-d" in opts else None
p = subprocess.Popen(cmd, env=env, cwd=cfg["root"], stdout=out, stderr=out, start_new_session=True)
if name:
    boxes.mkdir(exist_ok=True)
    (boxes / name).write_text(f"{p.pid} {image}")
if "-d" in opts:
    sys.exit(print("c0ffee") or 0)
def proxy(sig, _):
    try:
        os.killpg(p.pid, sig)
    except ProcessLookupError:
        pass


for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(sig, proxy)
rc = p.wait()
if name:
    (boxes / name).unlink(missing_ok=True)
sys.exit(rc if rc >= 0 else 128 - rc)
"""
NVIDIA_SMI = """#!/bin/sh
case "$1" in
    -L) for i in $(seq 0 $(({gpus} - 1))); do
            echo "GPU $i: NVIDIA RTX PRO 6000 Blackwell Server Edition (UUID: GPU-$i)"; done;;
    --query-compute-apps*) cat "{state}/apps" 2>/dev/null;;
esac
"""


class FakeDocker:
    def __init__(self, state: Path, bindir: Path):
        self.state, self.bindir = state, bindir

    def calls(self) -> list[list[str]]:
        log = self.state / "argv.jsonl"
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    def runs(self) -> list[list[str]]:
        return [c for c in self.calls() if c[:1] == ["run"]]

    def running(self) -> list[str]:  # docker ps
        out = subprocess.run([self.bindir / "docker", "ps"], capture_output=True, text=True).stdout
        return [ln.split("\t")[0] for ln in out.splitlines()]

    def busy(self, *apps: str) -> None:
        """The fake nvidia-smi's compute processes ("pid, name, used memory"): what holds the GPUs."""
        (self.state / "apps").write_text("".join(f"{a}\n" for a in apps))


def install(
    tmp_path: Path,
    images: tuple[str, ...] = (),
    engine_up: bool = True,
    pythonpath: tuple[Path, ...] = (),
    labels: dict | None = None,
    verbs: dict[str, str] | None = None,
    gpus: int = 0,
) -> FakeDocker:
    """pythonpath: what the image's python3 imports besides this interpreter's packages (its installed sglang)."""
    from scripts.box.docker import PATCHSET_LABEL
    from scripts.series.pin import patchset_id

    state, bindir = tmp_path / "docker-state", tmp_path / "docker-bin"
    state.mkdir(parents=True)
    bindir.mkdir(parents=True)
    config = {
        "images": list(images),
        "labels": {PATCHSET_LABEL: patchset_id()} if labels is None else labels,
        "verbs": verbs or {},
        "no_engine": NO_ENGINE,
        "image_id": IMAGE_ID,
        "root": str(ROOT),
        "entrypoint": str(ROOT / "docker" / "entrypoint"),
        "python": sys.executable,
        "pythonpath": os.pathsep.join(map(str, pythonpath)),
    }
    (state / "config.json").write_text(json.dumps(config))
    if not engine_up:
        (state / "down").touch()
    (bindir / "docker").write_text(CLIENT.replace("PYTHON", sys.executable, 1).replace("STATE", repr(str(state)), 1))
    if gpus:
        (bindir / "nvidia-smi").write_text(NVIDIA_SMI.format(gpus=gpus, state=state))
    for f in bindir.iterdir():
        f.chmod(0o755)
    return FakeDocker(state, bindir)


def verb(module: str, *args, prefix: tuple = (), timeout: float = 900, **env) -> subprocess.CompletedProcess:
    """`python -m MODULE ARGS` in this checkout as make runs it, with `env` over this environment."""
    cmd = [*prefix, sys.executable, "-m", module, *map(str, args)]
    return subprocess.run(cmd, cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout)


def interrupted(module: str, *args, when, sig: int = signal.SIGTERM, **env) -> subprocess.Popen:
    """`python -m MODULE ARGS` in a session of its own, `sig` sent to its group once when() holds; ended on return."""
    cmd = [sys.executable, "-m", module, *map(str, args)]
    p = subprocess.Popen(
        cmd, cwd=ROOT, env={**os.environ, **env}, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    while not when() and p.poll() is None:
        time.sleep(0.2)
    os.killpg(p.pid, sig)
    p.wait(120)
    return p


def path_with(*dirs: Path) -> str:
    """A PATH of `dirs` first, then /usr/bin and /bin (no nvidia-smi; a machine's own docker may be there, so a test
    about "no docker" names a directory of its own, or passes a client path that does not exist)."""
    return os.pathsep.join([*map(str, dirs), "/usr/bin", "/bin"])
