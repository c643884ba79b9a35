"""A fake `docker` client for tests: it records every argv and runs `docker run IMAGE ...` as the image would.

`install(tmp_path, images=...)` writes it as bin/docker (first on the PATH the caller builds) and returns a
FakeDocker. It answers `docker version` (no engine when `engine_up` is false: the client's own message), `docker
image inspect` for the images it has, and runs `docker run ... IMAGE ARGS` through this repository's
docker/entrypoint with the image's environment (EAGLE_HOME = this checkout, EAGLE_IMAGE, EAGLE_RESULTS = the host
directory mounted at /results, else /results itself, which the image does not create and this machine lacks),
the `-e` variables it was given, and this interpreter as the image's python3 (host directories of -v are made when
missing, as docker makes them; an argument naming a path under a mount names the host's). So a printed `docker run`
command is tested by running it: a missing mount or an unknown image fails as it would on the box. Imported as
`_fake_docker` (tests/ is on sys.path through tests/conftest.py); bench/device/lent.py runs make bench's client
through it on a lent GPU machine, which has no docker.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NO_ENGINE = "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?"
IMAGE_ID = "sha256:0123456789abcdef0123456789abcdef"

CLIENT = r"""#!{python}
import json, os, subprocess, sys
from pathlib import Path
state = Path({state!r})
argv = sys.argv[1:]
with open(state / "argv.jsonl", "a") as f:
    f.write(json.dumps(argv) + "\n")
if (state / "down").exists():
    sys.exit(print({no_engine!r}, file=sys.stderr) or 1)
images = (state / "images").read_text().split()
if argv[:1] == ["version"]:
    sys.exit(print("27.3.1") or 0)
if argv[:2] == ["image", "inspect"]:
    if argv[-1] in images:
        sys.exit(print({image_id!r}) or 0)
    sys.exit(print(f"Error response from daemon: No such image: {{argv[-1]}}", file=sys.stderr) or 1)
if argv[:1] != ["run"]:
    sys.exit(0)
env, mounts, i = {{}}, {{}}, 1
VALUED = {{"-v", "--volume", "-e", "--env", "--gpus", "--network", "--name", "-p", "--publish", "--entrypoint",
          "--env-file", "-w", "--shm-size", "--ulimit"}}
while i < len(argv) and argv[i].startswith("-"):
    flag, eq, value = argv[i].partition("=")
    if flag in VALUED and not eq:
        value, i = argv[i + 1], i + 1
    if flag in ("-v", "--volume"):
        src, _, dst = value.partition(":")
        mounts[dst.split(":")[0]] = src
        if src.startswith("/"):
            Path(src).mkdir(parents=True, exist_ok=True)  # docker -v makes a missing host directory
    elif flag in ("-e", "--env"):
        name, eq2, v = value.partition("=")
        if eq2 or name in os.environ:
            env[name] = v if eq2 else os.environ[name]
    i += 1
image, args = argv[i], argv[i + 1:]
for dst, src in mounts.items():  # a path under a mount, as the container sees it, is the host's
    if dst.startswith("/") and src.startswith("/"):
        args = [src + a[len(dst):] if a == dst or a.startswith(dst + "/") else a for a in args]
if image not in images:
    sys.exit(print(f"Unable to find image '{{image}}' locally", file=sys.stderr) or 125)
bindir = state / "image-bin"
bindir.mkdir(exist_ok=True)
(bindir / "python3").write_text("#!/bin/sh\nexec {python} \"$@\"\n")
(bindir / "python3").chmod(0o755)
results = mounts.get("/results") or "/results"  # unmounted: the image's own path, which it does not create
image_env = {{"PYTHONPATH": {pythonpath!r}}} if {pythonpath!r} else {{}}
env = {{"PATH": f"{{bindir}}:/usr/bin:/bin", "HOME": str(state / "container-home"), "EAGLE_HOME": {root!r},
        "EAGLE_RESULTS": results, "EAGLE_IMAGE": image, **image_env, **env}}
sys.exit(subprocess.run([{entrypoint!r}, *args], env=env, cwd={root!r}).returncode)
"""


class FakeDocker:
    def __init__(self, state: Path, bindir: Path):
        self.state, self.bindir = state, bindir

    def calls(self) -> list[list[str]]:
        log = self.state / "argv.jsonl"
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    def runs(self) -> list[list[str]]:
        return [c for c in self.calls() if c[:1] == ["run"]]


def install(
    tmp_path: Path, images: tuple[str, ...] = (), engine_up: bool = True, pythonpath: tuple[Path, ...] = ()
) -> FakeDocker:
    """pythonpath: what the image's python3 imports besides this interpreter's packages (its installed sglang)."""
    state, bindir = tmp_path / "docker-state", tmp_path / "docker-bin"
    state.mkdir(parents=True)
    bindir.mkdir(parents=True)
    (state / "images").write_text("\n".join(images) + "\n")
    if not engine_up:
        (state / "down").touch()
    client = bindir / "docker"
    client.write_text(
        CLIENT.format(
            python=sys.executable,
            state=str(state),
            no_engine=NO_ENGINE,
            image_id=IMAGE_ID,
            root=str(ROOT),
            entrypoint=str(ROOT / "docker" / "entrypoint"),
            pythonpath=os.pathsep.join(map(str, pythonpath)),
        )
    )
    client.chmod(0o755)
    return FakeDocker(state, bindir)


def path_with(*dirs: Path) -> str:
    """A PATH of `dirs` first, then /usr/bin and /bin (no nvidia-smi; a machine's own docker may be there, so a test
    about "no docker" names a directory of its own, or passes a client path that does not exist)."""
    return os.pathsep.join([*map(str, dirs), "/usr/bin", "/bin"])
