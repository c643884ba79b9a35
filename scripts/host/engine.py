"""The docker engine: whether it answers (and the fix when it does not), and whether it has an image.

Asked before anything is built or started, so a missing engine is one message naming the fix, never a failed step.
"""

from __future__ import annotations

import dataclasses

from ..lib import proc

PROBE_TIMEOUT = 60.0
NOT_RUNNING = ("cannot connect to the docker daemon", "is the docker daemon running", "error during connect",
               "failed to connect to the docker api")
NO_PERMISSION = "permission denied while trying to connect to the docker"


@dataclasses.dataclass
class Engine:
    ok: bool
    version: str = ""
    why: str = ""
    fix: str = ""


def diagnose(output: str, docker: str = "docker") -> tuple[str, str]:
    """(why, fix) for a docker client's output that reached no engine; ('', '') when it names no such cause."""
    low = output.lower()
    if NO_PERMISSION in low:
        return ("refuses this user (permission denied on its socket)",
                "add yourself to the docker group (sudo usermod -aG docker $USER, then log in again), or run as root")
    if any(s in low for s in NOT_RUNNING):
        return ("is not running or not reachable",
                f"start it (sudo systemctl start docker), or point DOCKER_HOST / `{docker} context use` at a "
                f"running engine, then retry")
    return "", ""


def engine(docker: str = "docker") -> Engine:
    """Ask the client for the engine's version: the one call that needs a running, permitted engine."""
    if proc.which(docker) is None:
        return Engine(False, why=f"is missing here ({docker} not found on PATH)",
                      fix="install Docker Engine and the NVIDIA Container Toolkit (docs.docker.com/engine/install)")
    res = proc.run([docker, "version", "--format", "{{.Server.Version}}"], timeout=PROBE_TIMEOUT)
    if res.ok and res.stdout.strip():
        return Engine(True, version=res.stdout.strip())
    why, fix = diagnose(res.output, docker)
    said = (res.stderr.strip() or res.why or "no server version").splitlines()[-1][-300:]
    return Engine(False, why=why or f"does not answer `{docker} version` ({said})",
                  fix=fix or "check that the engine runs and this user may use it (docker info), then retry")


def image_id(image: str, docker: str = "docker") -> tuple[str | None, str]:
    """(the image's id, '') when the engine has it, else (None, why, with the fix)."""
    eng = engine(docker)
    if not eng.ok:
        return None, f"the docker engine {eng.why}. Fix: {eng.fix}"
    res = proc.run([docker, "image", "inspect", "--format", "{{.Id}}", image], timeout=PROBE_TIMEOUT)
    if res.ok:
        return res.stdout.strip(), ""
    return None, f"image {image} is not in this docker engine. Fix: make image (it builds {image})"
