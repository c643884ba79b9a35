"""The servers `make bench` benchmarks: one it launches (a docker container or a local process group, started,
waited for and stopped here) or one already running (only checked). One `Server` per variant of a session."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import time
from pathlib import Path

from ..host.engine import cache_mounts, engine
from ..host.exposure import KEY_VAR
from ..lib import proc
from ..lib.errors import UserError
from ..lib.http import API_KEY, http_get
from ..lib.progress import say
from ..lib.repo import REPO_ROOT
from . import config as cfg
from .numbers import duration
from .observe import patchset_of_image, patchset_of_python
from .preflight import InfraError

DOCKER_TIMEOUT = 600.0  # docker run -d / docker stop


def port_open(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((host, port)) == 0


def tail(path: Path, n: int = 20) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join("  | " + line for line in lines[-n:])


def unauthorized(url: str) -> str:
    """Why a server answered 401, and the fix: the key the harness sends comes from where serve reads it."""
    if API_KEY.key:
        return (f"401 Unauthorized from {url}: the server refuses the API key from {API_KEY.source}; give "
                f"the key it was started with ({KEY_VAR}, or --api-key-file FILE)")
    return (f"401 Unauthorized from {url}: the server wants an API key; export {KEY_VAR}=<its key>, or pass "
            f"--api-key-file FILE (the sources serve reads; the harness and bench_serving then send it)")


class Server:
    """Where one session's runs go: a server this harness launches (and stops), or one already running."""

    def __init__(self, variant: cfg.Variant, vals: dict[str, str], server_args: list[str], log_path: Path):
        self.variant, self.vals, self.server_args, self.log_path = variant, vals, server_args, log_path
        self.kind = variant.launcher
        self.launches = 0
        self.launched = False
        self.launch_s: float | None = None  # seconds the last start took (None: not launched here)
        self.url = variant.url if self.kind == "server" else f"http://127.0.0.1:{vals['port']}"
        self.container = ""
        self.proc = self.logs = self._log = None
        self.argv, self.env = self._argv()

    def _argv(self) -> tuple[list[str], dict[str, str]]:
        v, vals, where = self.variant, self.vals, f"variant {self.variant.name}"
        if self.kind == "server":
            return [], {}
        env = {k: cfg.expand(x, vals, where) for k, x in v.env}
        command = [cfg.expand(x, vals, where) for x in v.command + v.extra_args] + self.server_args
        if self.kind == "local":
            return command, env
        self.container = f"eagle-bench-{v.name}-{os.getpid()}-{self.launches + 1}"
        argv = ["docker", "run", "-d", "--rm", "--name", self.container, "--gpus", "all", "--ipc=host",
                "--network", "host", *cache_mounts(vals["hf_cache"], vals["flashinfer_cache"])]
        for k, x in env.items():
            argv += ["-e", f"{k}={x}"]
        argv += [cfg.expand(x, vals, where) for x in v.docker_args]
        return argv + [cfg.expand(v.image, vals, where)] + command, {}

    def describe(self) -> str:
        if self.kind == "server":
            return f"{self.variant.name}: running server {self.url}"
        env = " ".join(f"{k}={shlex.quote(x)}" for k, x in self.env.items())
        return f"{self.variant.name}: {env + ' ' if env else ''}{shlex.join(self.argv)}"

    def start(self, timeout: float) -> None:
        if self.kind == "server":
            status = http_get(self.url + "/v1/models", 10)[0]
            if status == 401:
                raise UserError(f"{self.variant.name}: {unauthorized(self.url)}")
            if status != 200:
                raise UserError(f"{self.variant.name}: no SGLang server answers at {self.url} (GET /v1/models"
                                + (f": HTTP {status})" if status else ")"))
            return
        port = self.url.rsplit(":", 1)[1]
        if port_open("127.0.0.1", int(port)):
            raise UserError(f"port {port} is already in use: a server runs there. Stop it, pass --port N, "
                            f"or benchmark it as it is with --server-url {self.url}")
        self.argv, self.env = self._argv()
        self.launches += 1
        say(f"launching {self.describe()}")
        t0 = time.monotonic()
        self._spawn()
        self.launched = True
        self.wait_ready(timeout)
        self.launch_s = time.monotonic() - t0

    def _spawn(self) -> None:
        """Start the server; its log file is created only once something runs that writes to it."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self.kind == "docker":
            res = proc.run(self.argv, timeout=DOCKER_TIMEOUT)
            if not res.ok:
                eng = engine()
                if not eng.ok:  # the box, not this variant: nothing after it can start either
                    raise InfraError(f"docker run for {self.variant.name} failed because the docker engine "
                                     f"{eng.why}. Fix: {eng.fix}")
                raise UserError(f"docker run for {self.variant.name} failed ({res.why}): {res.stderr.strip()[-1000:]}")
            self._log = open(self.log_path, "ab")
            self.logs = proc.spawn(["docker", "logs", "-f", self.container], stdout=self._log, stderr=proc.STDOUT)
        else:
            self._log = open(self.log_path, "ab")
            self.proc = proc.spawn(self.argv, env={**os.environ, **self.env}, stdout=self._log, stderr=proc.STDOUT,
                                   start_new_session=True, cwd=REPO_ROOT)

    def alive(self) -> bool:
        if self.kind == "docker":
            res = proc.run(["docker", "inspect", "-f", "{{.State.Running}}", self.container], timeout=60)
            return res.stdout.strip() == "true"
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, timeout: float, every: float = 60.0) -> None:
        t0 = time.monotonic()
        next_note = t0 + every
        name = self.variant.name
        while True:
            if http_get(self.url + "/health", 5)[0] == 200:
                status = http_get(self.url + "/v1/models", 5)[0]
                if status == 200:
                    say(f"{name} is up on {self.url} after {duration(time.monotonic() - t0)}")
                    return
                if status == 401:
                    raise UserError(f"{name}: {unauthorized(self.url)}")
            if not self.alive():
                raise UserError(f"{name} exited while starting; see {self.log_path}:\n{tail(self.log_path)}")
            now = time.monotonic()
            if now - t0 > timeout:
                raise UserError(f"{name} was not ready within {duration(timeout)} (raise --launch-timeout); "
                                f"see {self.log_path}:\n{tail(self.log_path)}")
            if now >= next_note:
                say(f"waiting for {name} on {self.url} ({duration(now - t0)}; log {self.log_path})")
                next_note = now + every
            time.sleep(2)

    def _stop_process_group(self) -> None:
        for sig, wait in ((signal.SIGINT, 60), (signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.proc.pid, sig)  # the group of the process this harness started
            except ProcessLookupError:
                return
            try:
                self.proc.wait(wait)
                return
            except proc.TimeoutExpired:
                continue

    def stop(self) -> None:
        if not self.launched:
            return
        say(f"stopping {self.variant.name}")
        if self.kind == "docker":
            proc.run(["docker", "stop", "-t", "60", self.container], timeout=DOCKER_TIMEOUT)
            if self.logs is not None:
                try:
                    self.logs.wait(30)
                except proc.TimeoutExpired:
                    self.logs.terminate()
        elif self.proc is not None and self.proc.poll() is None:
            self._stop_process_group()
        if self._log is not None:
            self._log.close()
        self.launched = False

    def patch_info(self) -> dict:
        v = self.variant
        if self.kind == "server":
            return {"patchset": v.patchset or "unknown", "detail": "declared with --patchset" if
                    v.patchset not in ("", "unknown") else "a running server: pass --patchset NAME=ID to record it"}
        if self.kind == "docker":
            return patchset_of_image(cfg.expand(v.image, self.vals, v.name))
        return patchset_of_python(cfg.expand(v.python or "{python}", self.vals, v.name))
