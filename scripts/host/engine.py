"""The docker engine the serving image runs on: whether it answers (and the fix when it does not), whether an
image is here, and the cache mounts every `docker run` of the image gets.

`make image`, `make test-gpu` (its image route) and `make bench` (its docker variants) ask here before they start
anything, so a missing engine is one message naming the fix, never a failed build step or a run per variant.
The mounts: the host's HF cache (the weights) and a named volume for FlashInfer's cache (its JIT kernels and the
PCIe-IPC all-reduce autotune, otherwise redone by every new container; a new named volume starts with the image's
own content).
"""

from __future__ import annotations

import dataclasses

from ..lib import proc

HF_CACHE_IN_IMAGE = "/root/.cache/huggingface"
FLASHINFER_CACHE_IN_IMAGE = "/root/.cache/flashinfer"
FLASHINFER_VOLUME = "sglang-flashinfer"  # the named volume docker/README.md recommends
PROBE_TIMEOUT = 60.0
# What the docker client prints when it reaches no engine, by cause.
NOT_RUNNING = ("Cannot connect to the Docker daemon", "Is the docker daemon running", "error during connect",
               "docker daemon is not running", "failed to connect to the docker API")
NO_PERMISSION = ("permission denied while trying to connect to the Docker daemon",)


def cache_mounts(hf_cache: str, flashinfer_cache: str = FLASHINFER_VOLUME) -> list[str]:
    """`-v` arguments for the HF cache (a host path) and FlashInfer's cache (a named volume or a host path)."""
    return ["-v", f"{hf_cache}:{HF_CACHE_IN_IMAGE}", "-v", f"{flashinfer_cache}:{FLASHINFER_CACHE_IN_IMAGE}"]


@dataclasses.dataclass
class Engine:
    """What the docker client says about its engine: ok, or why not and the fix."""

    ok: bool
    version: str = ""
    why: str = ""
    fix: str = ""

    def message(self, needed_for: str) -> str:
        return f"{needed_for} needs the docker engine, which {self.why}. Fix: {self.fix}"


def diagnose(output: str, docker: str = "docker") -> tuple[str, str]:
    """(why, fix) for a docker command's output that reached no engine; ('', '') when it names no such cause."""
    low = output.lower()
    if any(s.lower() in low for s in NO_PERMISSION):
        return ("refuses this user (permission denied on its socket)",
                "add yourself to the docker group (sudo usermod -aG docker $USER, then log in again), or run as root")
    if any(s.lower() in low for s in NOT_RUNNING):
        return ("is not running or not reachable (`Cannot connect to the Docker daemon`)",
                f"start it (sudo systemctl start docker), or point DOCKER_HOST / `{docker} context use` at a "
                f"running engine, then retry")
    return "", ""


def engine(docker: str = "docker") -> Engine:
    """Ask the client for the engine's version: the one call that needs a running, permitted engine."""
    if proc.which(docker) is None:
        return Engine(False, why=f"is missing here ({docker} not found on PATH)",
                      fix="install Docker Engine and the NVIDIA Container Toolkit (docs.docker.com/engine/install), "
                          "or pass the path of your docker client")
    res = proc.run([docker, "version", "--format", "{{.Server.Version}}"], timeout=PROBE_TIMEOUT)
    version = res.stdout.strip()
    if res.ok and version:
        return Engine(True, version=version)
    why, fix = diagnose(res.output, docker)
    if why:
        return Engine(False, why=why, fix=fix)
    said = (res.stderr.strip() or res.why or "no server version").splitlines()[-1][-300:]
    return Engine(False, why=f"does not answer `{docker} version` ({said})",
                  fix="check that the engine runs and this user may use it (docker info), then retry")


def image_id(image: str, docker: str = "docker") -> tuple[str | None, str]:
    """(the image's id, '') when the engine has it, else (None, why)."""
    res = proc.run([docker, "image", "inspect", "--format", "{{.Id}}", image], timeout=PROBE_TIMEOUT)
    if res.ok:
        return res.stdout.strip(), ""
    why, _ = diagnose(res.output, docker)
    return None, (f"the docker engine {why}" if why else f"image {image} is not here")
