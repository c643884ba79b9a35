"""One server lifecycle, for `make bench` and the profile part: start, wait until it answers, stop.

a container  the image's serve in a detached `docker run -d --name NAME` (scripts/box/docker.py): marked started
             before `docker run` runs, so stop() removes it by its name whatever happens after (docker stop, rm);
             lost() says when what answers is not it (the container stopped, another server holds the port)
a URL        a server someone else runs (--server-url): only checked
"""

import dataclasses
import shlex
import time
import urllib.parse
from pathlib import Path

from ..box.docker import PATCHSET_LABEL, engine, image_info
from ..lib import proc
from ..lib.errors import UserError
from ..lib.http import API_KEY, get_json, http_get
from ..lib.progress import say
from ..lib.table import duration

DOCKER_TIMEOUT = 600.0


class InfraError(UserError):
    """The box cannot go on (the docker engine went away): nothing more is started."""


def tail(path: Path, n: int = 20) -> str:
    try:
        return "\n".join("  | " + ln for ln in path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "  | (no log)"


@dataclasses.dataclass(frozen=True)
class Launch:
    """How one server is had, every value resolved: its URL, and the detached `docker run` of its image with the log
    its output goes to and how long it may take to answer (none for a server that runs already: its declared patch
    set instead)."""

    name: str
    url: str
    image: str = ""
    argv: tuple[str, ...] = ()
    container: str = ""
    patchset: str = ""
    log: Path | None = None
    timeout: float = 3600.0


class Server:
    """One launch's server for one session: a container when the launch has a `docker run`, else a URL."""

    def __init__(self, launch: Launch):
        self.name, self.url, self.log_path, self.timeout = launch.name, launch.url, launch.log, launch.timeout
        self.argv, self.container, self.image = list(launch.argv), launch.container, launch.image
        self.patchset, self.started, self.launch_s = launch.patchset, False, None
        self._logs = self._log = None
        self.model = self.argv[self.argv.index("--model") + 1] if "--model" in self.argv else None

    def start(self) -> None:
        if not self.argv:
            status = self._models(10)
            if status != 200:
                got = f"HTTP {status}" if status else "no answer"
                raise UserError(f"{self.name}: no SGLang server answers at {self.url} (GET /v1/models: {got})")
            return None
        say(f"launching {self.name}: {shlex.join(self.argv)}")
        t0 = time.monotonic()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "a")  # a results directory that cannot be written stops here, before a start
        self.started = True  # from here on stop() removes the container by its name
        res = proc.run(self.argv, timeout=DOCKER_TIMEOUT)
        if not res.ok:
            eng = engine()
            if not eng.ok:
                raise InfraError(f"docker run for {self.name} failed: the docker engine {eng.why}. Fix: {eng.fix}")
            raise UserError(f"docker run for {self.name} failed ({res.why})")
        self._logs = proc.spawn(["docker", "logs", "-f", self.container], stdout=self._log, stderr=proc.STDOUT)
        while not self._ready():
            if not self._running():
                raise UserError(f"{self.name} exited while starting; {self.log_path}:\n{tail(self.log_path)}")
            if time.monotonic() - t0 > self.timeout:
                raise UserError(
                    f"{self.name} was not ready within {duration(self.timeout)} (raise --launch-timeout); "
                    f"{self.log_path}:\n{tail(self.log_path)}"
                )
            time.sleep(2)
        if why := self.lost():
            raise UserError(f"{self.name}: {why}")
        self.launch_s = time.monotonic() - t0
        say(f"{self.name} is up on {self.url} after {duration(self.launch_s)}")

    def _models(self, timeout: float) -> int:
        """GET /v1/models: its status (0: no answer); a 401 is a UserError with the fix."""
        status = http_get(self.url + "/v1/models", timeout)[0]
        if status == 401:
            raise UserError(f"{self.name}: {unauthorized(self.url)}")
        return status

    def _ready(self) -> bool:
        return http_get(self.url + "/health", 5)[0] == 200 and self._models(5) == 200

    def _running(self) -> bool:
        res = proc.run(["docker", "inspect", "-f", "{{.State.Running}}", self.container], timeout=60)
        return res.stdout.strip() == "true"

    def lost(self) -> str:
        """'' while what answers at the URL is this launch's server: its container runs and /server_info names the
        model and port it was started with; else what is wrong (asked before every run: a number from another
        server is never recorded as this one's)."""
        if not self.argv:
            return ""
        if not self._running():
            return f"its container {self.container} is not running; {self.log_path}:\n{tail(self.log_path)}"
        info, port = get_json(self.url + "/server_info", 30) or {}, urllib.parse.urlsplit(self.url).port
        if (self.model and info.get("model_path") != self.model) or info.get("port", port) != port:
            return (
                f"the server answering at {self.url} is not the one started in {self.container}: it serves "
                f"{info.get('model_path')} on port {info.get('port', '?')}, not {self.model or 'its model'} on {port}"
            )
        return ""

    def stop(self) -> None:
        if self.started:
            say(f"stopping {self.name}")
            proc.run(["docker", "stop", "-t", "60", self.container], timeout=DOCKER_TIMEOUT)
            proc.run(["docker", "rm", "-f", self.container], timeout=DOCKER_TIMEOUT)
        if self._logs is not None:
            try:
                self._logs.wait(30)
            except proc.TimeoutExpired:
                self._logs.kill()
        if self._log is not None:
            self._log.close()
        self.started, self._logs, self._log = False, None, None

    def patch_info(self) -> dict:
        """The patch set the server runs: declared (a URL), its image's label (a container)."""
        if not self.argv:
            return {"patchset": self.patchset or "unknown"}
        info = image_info(self.image) or {"Labels": {PATCHSET_LABEL: "unknown"}}
        return {"patchset": info["Labels"].get(PATCHSET_LABEL, "none"), "image": self.image}


def unauthorized(url: str) -> str:
    """Why a server answered 401, and the fix: the key comes from where serve reads it."""
    if API_KEY.key:
        return (
            f"401 Unauthorized from {url}: the server refuses the API key from {API_KEY.source}; give the key "
            f"it was started with ($SGLANG_API_KEY, or --api-key-file FILE)"
        )
    return (
        f"401 Unauthorized from {url}: the server wants an API key; export SGLANG_API_KEY=<its key>, or pass "
        f"--api-key-file FILE (the sources serve reads; the harness and bench_serving then send it)"
    )
