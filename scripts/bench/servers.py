"""One server lifecycle, for `make bench` (and whoever needs a served variant): start, wait until it answers, stop.

  docker  the image's serve in a detached `docker run -d --name NAME` (scripts/host/docker_run.py): marked started
          before `docker run` runs, so stop() removes it by its name whatever happens after (docker stop, docker rm)
  here    serve's plan (`python -m scripts.host.serve ... --dry-run --json`) launched with SGLang's own
          sglang.test.test_utils.popen_launch_server and stopped with its terminate_and_kill_process_tree
  url     a server someone else runs (--server-url): only checked
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

from ..host.engine import engine
from ..lib import proc
from ..lib.errors import UserError
from ..lib.http import API_KEY, http_get
from ..lib.progress import say
from ..series.pin import applied_patchset
from .numbers import duration

DOCKER_TIMEOUT = 600.0
PATCHSET_LABEL = "io.eagle-fast-verify.patchset"


class InfraError(UserError):
    """The box cannot go on (the docker engine went away): nothing more is started."""


def tail(path: Path, n: int = 20) -> str:
    try:
        return "\n".join("  | " + ln for ln in path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "  | (no log)"


def dry_run_args(serve_args: list[str]) -> list[str]:
    """serve's arguments with --dry-run --json, before the SGLang arguments after --."""
    i = serve_args.index("--") if "--" in serve_args else len(serve_args)
    return [*serve_args[:i], "--dry-run", "--json", *serve_args[i:]]


def serve_plan(serve_args: list[str]) -> dict:
    """serve's own plan of a launch (contract 1: argv, env, ...), its values checked where SGLang is importable."""
    res = proc.run([sys.executable, "-m", "scripts.host.serve", *dry_run_args(serve_args)], timeout=600)
    if not res.ok:
        said = res.stderr.strip().removeprefix("error: ") or res.why
        raise UserError(f"serve refuses {' '.join(serve_args)}: {said}")
    return json.loads(res.stdout)


class Server:
    """One variant's server for one session."""

    def __init__(self, name: str, kind: str, url: str, log_path: Path, *, argv: list[str] = (), container: str = "",
                 image: str = "", serve_args: list[str] = (), env: dict | None = None, patchset: str = ""):
        self.name, self.kind, self.url, self.log_path = name, kind, url, log_path
        self.argv, self.container, self.image = list(argv), container, image
        self.serve_args, self.env, self.patchset = list(serve_args), dict(env or {}), patchset
        self.started, self.launch_s = False, None
        self.proc = self._logs = self._log = None

    def describe(self) -> str:
        return {"docker": " ".join(self.argv), "url": f"running server {self.url}"}.get(
            self.kind, "python -m scripts.host.serve " + " ".join(self.serve_args) + " (popen_launch_server)")

    def start(self, timeout: float) -> None:
        if self.kind == "url":
            return self._answers()
        say(f"launching {self.name}: {self.describe()}")
        t0 = time.monotonic()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "a")  # a results directory that cannot be written stops here, before a start
        if self.kind == "docker":
            self._start_docker(timeout)
        else:
            self._start_here(timeout)
        self.launch_s = time.monotonic() - t0
        say(f"{self.name} is up on {self.url} after {duration(self.launch_s)}")

    def _answers(self) -> None:
        status = http_get(self.url + "/v1/models", 10)[0]
        if status == 401:
            raise UserError(f"{self.name}: {unauthorized(self.url)}")
        if status != 200:
            raise UserError(f"{self.name}: no SGLang server answers at {self.url} (GET /v1/models: "
                            + (f"HTTP {status})" if status else "no answer)"))

    def _start_docker(self, timeout: float) -> None:
        self.started = True  # from here on stop() removes the container by its name
        res = proc.run(self.argv, timeout=DOCKER_TIMEOUT)
        if not res.ok:
            eng = engine()
            if not eng.ok:
                raise InfraError(f"docker run for {self.name} failed: the docker engine {eng.why}. Fix: {eng.fix}")
            raise UserError(f"docker run for {self.name} failed ({res.why})")
        self._logs = proc.spawn(["docker", "logs", "-f", self.container], stdout=self._log, stderr=proc.STDOUT)
        t0 = time.monotonic()
        while not self._ready():
            running = proc.run(["docker", "inspect", "-f", "{{.State.Running}}", self.container], timeout=60)
            if running.stdout.strip() != "true":
                raise UserError(f"{self.name} exited while starting; {self.log_path}:\n{tail(self.log_path)}")
            if time.monotonic() - t0 > timeout:
                raise UserError(f"{self.name} was not ready within {duration(timeout)} (raise --launch-timeout); "
                                f"{self.log_path}:\n{tail(self.log_path)}")
            time.sleep(2)

    def _ready(self) -> bool:
        if http_get(self.url + "/health", 5)[0] != 200:
            return False
        status = http_get(self.url + "/v1/models", 5)[0]
        if status == 401:
            raise UserError(f"{self.name}: {unauthorized(self.url)}")
        return status == 200

    def _start_here(self, timeout: float) -> None:
        plan = serve_plan(self.serve_args)
        argv = plan["argv"][plan["argv"].index("sglang.launch_server") + 1:]
        i = argv.index("--model-path")
        model, args = argv[i + 1], argv[:i] + argv[i + 2:]
        from sglang.test.test_utils import popen_launch_server

        self.started = True
        try:
            self.proc = popen_launch_server(model, self.url, timeout, other_args=args, device="cuda",
                                            env={**plan.get("env", {}), **self.env},
                                            return_stdout_stderr=(self._log, self._log))
        except Exception as e:  # noqa: BLE001 - popen_launch_server stopped it; say why, with its log
            self._log.flush()
            raise UserError(f"{self.name} did not start ({e}); {self.log_path}:\n{tail(self.log_path)}") from e

    def stop(self) -> None:
        if self.started:
            say(f"stopping {self.name}")
        if self.started and self.kind == "docker":
            proc.run(["docker", "stop", "-t", "60", self.container], timeout=DOCKER_TIMEOUT)
            proc.run(["docker", "rm", "-f", self.container], timeout=DOCKER_TIMEOUT)
            if self._logs is not None:
                try:
                    self._logs.wait(30)
                except proc.TimeoutExpired:
                    self._logs.kill()
        elif self.proc is not None:
            from sglang.test.test_utils import terminate_and_kill_process_tree

            terminate_and_kill_process_tree(self.proc)
        if self._log is not None and self.kind == "docker":  # here: SGLang's threads may still write to it
            self._log.close()
        self.started, self.proc, self._logs, self._log = False, None, None, None

    def patch_info(self) -> dict:
        """The patch set the server runs: declared (url), its image's label (docker), this python's sglang (here)."""
        if self.kind == "url":
            return {"patchset": self.patchset or "unknown"}
        if self.kind == "here":
            return {"patchset": here_patchset()}
        res = proc.run(["docker", "image", "inspect", "--format", "{{json .Config.Labels}}", self.image], timeout=60)
        labels = (json.loads(res.stdout or "null") or {}) if res.ok else {}
        return {"patchset": labels.get(PATCHSET_LABEL, "none" if res.ok else "unknown"), "image": self.image}


def here_patchset() -> str:
    """The patch set of the sglang this python imports; "unknown" without one."""
    spec = importlib.util.find_spec("sglang")
    return (applied_patchset(Path(spec.origin).parent) or "none") if spec and spec.origin else "unknown"


def unauthorized(url: str) -> str:
    """Why a server answered 401, and the fix: the key comes from where serve reads it."""
    if API_KEY.key:
        return (f"401 Unauthorized from {url}: the server refuses the API key from {API_KEY.source}; give the key "
                f"it was started with ($SGLANG_API_KEY, or --api-key-file FILE)")
    return (f"401 Unauthorized from {url}: the server wants an API key; export SGLANG_API_KEY=<its key>, or pass "
            f"--api-key-file FILE (the sources serve reads; the harness and bench_serving then send it)")
