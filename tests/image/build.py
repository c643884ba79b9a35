"""`make test-image`: docker/Dockerfile built for real on a local stand-in for the upstream base, then checked.

  python -m tests.image.build [--can-run]      (--can-run: whether this machine can; changes nothing)

The stand-in (no registry): Debian bookworm by mmdebstrap, this machine's CA certificates, the .venv packages the
smoke imports (hard links) and the pinned wheel, by docker import. A private dockerd (own socket and data) builds the
image with make image BASE=<stand-in>, runs the entrypoint's non-GPU verbs for their exit codes, and checks that a
wrong base and a broken patch fail the build; then containers, images, the engine (by its PID) and its network
changes go. Needs root, apt, make setup, make apply and 12 GB free.
Exit status: 0 every check passed; 1 a check failed (listed); 2 this machine cannot run it (why, and the fix).
"""

import argparse
import contextlib
import importlib.metadata as md
import os
import runpy
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

from scripts.box.docker import docker_run
from scripts.lib import proc
from scripts.lib.cli import run
from scripts.lib.errors import UserError
from scripts.lib.repo import BUILD_DIR, REPO_ROOT
from scripts.series.pin import load_pin

WORK = BUILD_DIR / "image-test"
VENV_PY, NEED_GB = REPO_ROOT / ".venv" / "bin" / "python", 12
T0, FREE = time.monotonic(), [shutil.disk_usage(BUILD_DIR.parent).free]  # the lowest free space seen


def say(msg: str) -> None:
    FREE.append(shutil.disk_usage(BUILD_DIR.parent).free)
    print(f"[test-image {time.strftime('%M:%S', time.gmtime(time.monotonic() - T0))}] {msg}", file=sys.stderr)


def sh(cmd: list[str] | str, timeout: float = 1800, **kw) -> proc.Result:
    """Run a command (a string: bash with pipefail); a UserError with its last lines unless it succeeds."""
    res = proc.run(["bash", "-o", "pipefail", "-c", cmd] if isinstance(cmd, str) else cmd, timeout=timeout, **kw)
    if not res.ok:
        raise UserError(f"{res.why}\n" + "\n".join(res.output.strip().splitlines()[-15:]))
    return res


def can_run() -> str:
    """'' when this machine can run the test, else why not."""
    free = shutil.disk_usage(BUILD_DIR.parent).free / 2**30
    missing = [t for t in ("dockerd", "mmdebstrap") if shutil.which(t) is None]
    wheel = BUILD_DIR / "cache" / load_pin().wheel_filename
    return "; ".join(
        w
        for cond, w in [
            (os.geteuid() != 0, "it needs root (dockerd, mmdebstrap, chroot)"),
            (free < NEED_GB, f"only {free:.0f} GB free under {BUILD_DIR.parent}, it needs {NEED_GB}"),
            (not VENV_PY.is_file(), ".venv is missing: make setup"),
            (not wheel.is_file(), "the pinned wheel is missing: make apply"),
            (missing and shutil.which("apt-get") is None, f"{' and '.join(missing)} missing and no apt-get to install"),
            (proc.run(["ip", "link", "show", "docker0"]).ok, "another docker engine's docker0 exists (stop it first)"),
        ]
        if cond
    )


def tools() -> None:
    missing = [p for p, t in (("docker.io", "dockerd"), ("mmdebstrap", "mmdebstrap")) if shutil.which(t) is None]
    if missing:
        say(f"apt-get install {' '.join(missing)}")
        sh(
            f"apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "
            f"{' '.join(missing)}"
        )


class Engine:
    """dockerd on a private socket, stopped by its PID; the rules, chains, links and ip_forward it adds go with it."""

    def __init__(self, work: Path):
        self.run_dir = Path(tempfile.mkdtemp(prefix="eft-docker-"))  # short: unix socket paths are limited
        self.host = f"unix://{self.run_dir}/docker.sock"
        self.data, self.before, self.dockerd = work / "data", self.network(), None
        self.etc = Path("/etc/docker").exists()  # dockerd leaves its key.json there

    @staticmethod
    def network() -> dict:
        return {
            "tables": {t: sh(["iptables", "-t", t, "-S"]).stdout.splitlines() for t in ("filter", "nat")},
            "links": [ln.split(": ")[1].split("@")[0] for ln in sh(["ip", "-o", "link"]).stdout.splitlines()],
            "forward": sh(["sysctl", "-n", "net.ipv4.ip_forward"]).stdout.strip(),
        }

    def start(self) -> None:
        log = (self.run_dir / "dockerd.log").open("w")
        cmd = ["dockerd", "-H", self.host, "--data-root", str(self.data), "--exec-root", str(self.run_dir / "exec")]
        cmd += ["--pidfile", str(self.run_dir / "pid")]
        self.dockerd = proc.spawn(cmd, stdout=log, stderr=log, start_new_session=True)
        os.environ["DOCKER_HOST"] = self.host  # this process, make image and docker run use this engine only
        for _ in range(60):
            if proc.run(["docker", "version", "--format", "{{.Server.Version}}"]).ok:
                return say(f"dockerd pid {self.dockerd.pid} on {self.host}")
            time.sleep(1)
        raise UserError(f"dockerd did not answer in 60 s: {(self.run_dir / 'dockerd.log').read_text()[-2000:]}")

    def stop(self) -> None:
        if self.dockerd:  # one SIGTERM: dockerd takes a third signal as "force shutdown", leaving its mounts
            self.dockerd.terminate()
            try:
                self.dockerd.wait(timeout=60)
            except proc.TimeoutExpired:
                self.dockerd.kill()
        now = self.network()
        for table, rules in now["tables"].items():  # its rules, then its chains, then the policies it changed
            old = self.before["tables"][table]
            undo = [["-D", *shlex.split(r)[1:]] for r in rules if r.startswith("-A ") and r not in old]
            undo += [[f, r.split()[1]] for r in rules if r.startswith("-N ") and r not in old for f in ("-F", "-X")]
            for args in undo + [shlex.split(r) for r in old if r.startswith("-P ") and r not in rules]:
                proc.run(["iptables", "-t", table, *args])
        for link in set(now["links"]) - set(self.before["links"]):
            proc.run(["ip", "link", "delete", link])
        proc.run(["sysctl", "-qw", f"net.ipv4.ip_forward={self.before['forward']}"])
        for path in [self.run_dir] + ([] if self.etc else [Path("/etc/docker")]):
            shutil.rmtree(path, ignore_errors=True)
        say("engine stopped; its network changes undone")


def link_venv(dest: Path) -> None:
    """(Runs in .venv, PYTHONPATH=build/sglang/python.) Run the image build's smoke in this process, then hard-link
    into `dest` every .venv distribution that owns a module or shared library it loaded."""
    sys.argv = ["smoke"]
    with contextlib.redirect_stdout(sys.stderr), contextlib.suppress(SystemExit):
        runpy.run_module("scripts.host.smoke", run_name="__main__")
    used = {os.path.realpath(getattr(m, "__file__", None) or "/") for m in list(sys.modules.values())}
    used |= {ln.split()[-1] for ln in open("/proc/self/maps") if ".so" in ln}
    dists = {os.path.realpath(d.locate_file(f)): d for d in md.distributions() for f in d.files or []}
    keep = {d.metadata["Name"]: d for p, d in dists.items() if p in used and d.metadata["Name"] != "sglang"}
    files = [(d.locate_file(f), dest / f) for d in keep.values() for f in d.files or [] if not str(f).startswith("..")]
    for src, to in [(src, to) for src, to in files if Path(src).is_file()]:
        to.parent.mkdir(parents=True, exist_ok=True)
        os.link(src, to)
    print(f"{len(keep)} distributions, {sum(to.stat().st_size for _, to in files if to.exists()) >> 20} MiB")


def standin(tag: str) -> str:
    """The stand-in base: bookworm + python3/pip/git + CA certificates + .venv's packages + the pinned wheel."""
    rootfs, pin = WORK / "rootfs", load_pin()
    shutil.rmtree(rootfs, ignore_errors=True)
    say("mmdebstrap bookworm minbase + python3 python3-pip git ca-certificates (30-70 s)")
    minbase = ["--quiet", "--variant=minbase", "--include=python3,python3-pip,git,ca-certificates"]
    minbase += [f"--dpkgopt=path-exclude=/usr/share/{d}/*" for d in ("man", "doc", "locale")]
    sh(["mmdebstrap", *minbase, "bookworm", str(rootfs)])
    sh(
        f"cp /usr/local/share/ca-certificates/*.crt {rootfs}/usr/local/share/ca-certificates/ 2>/dev/null; "
        f"chroot {rootfs} update-ca-certificates"
    )  # this machine's TLS egress re-signs certificates
    ver = sh(["chroot", str(rootfs), "python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"]).stdout
    site = f"usr/local/lib/python{ver.strip()}/dist-packages"
    env = {**os.environ, "PYTHONPATH": str(BUILD_DIR / "sglang" / "python")}
    res = sh([str(VENV_PY), "-m", "tests.image.build", "--link-venv", str(rootfs / site)], cwd=REPO_ROOT, env=env)
    say(f".venv packages hard-linked: {res.stdout.strip().splitlines()[-1]}")
    sh(
        f"cp {BUILD_DIR}/cache/{pin.wheel_filename} {rootfs}/tmp && chroot {rootfs} python3 -m pip install -q "
        f"--no-deps --no-index --break-system-packages --root-user-action=ignore /tmp/{pin.wheel_filename} && rm "
        f"{rootfs}/tmp/{pin.wheel_filename}"
    )
    say("docker import of the stand-in (45-135 s)")
    sh(
        f"tar --numeric-owner -C {shlex.quote(str(rootfs))} -cf - . | docker import --change 'CMD [\"python3\"]' "
        f"--change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' --change "
        f"'LABEL io.eagle-fast-verify.standin=\"Debian bookworm stand-in for {pin.upstream_image}\"' - {tag}"
    )
    shutil.rmtree(rootfs)
    return site


class Checks(list):
    def add(self, name: str, ok: bool, detail: str = "") -> None:
        self.append((name, ok))
        say(f"{'ok  ' if ok else 'FAIL'} {name}" + (f": {detail}" if detail else ""))


def make_image(checks: Checks, name: str, base: str, tag: str, ok: bool, repo: Path = REPO_ROOT) -> None:
    t = time.monotonic()
    res = proc.run(["make", "-C", str(repo), "image", f"BASE={base}", f"IMAGE={tag}"], timeout=3600, capture=not ok)
    left = sh(["docker", "ps", "-aq"]).stdout.split()  # --force-rm: a failed RUN leaves no container
    checks.add(
        f"{name} ({time.monotonic() - t:.0f} s)",
        res.ok == ok and not left,
        f"make image exit {res.returncode}" + (f", {len(left)} container(s) left" if left else ""),
    )


def failures(checks: Checks, standin_tag: str, site: str) -> None:
    """A base whose sglang is not the pinned one, and a patch that does not apply: both must fail the build."""
    wrong = standin_tag + "-wrong"
    sh(
        ["docker", "build", "-q", "--force-rm", "-t", wrong, "-"],
        input=f"FROM {standin_tag}\nRUN sed -i 1i# /{site}/sglang/srt/environ.py\n",
    )
    name = "a base whose sglang is not the pinned release fails the build"
    make_image(checks, name, wrong, "eagle-fast-verify/sglang:test-wrong-base", False)
    copy = WORK / "broken"
    sh(
        f"mkdir {copy} && cp -a scripts patches docker tests requirements pytest.ini Makefile .dockerignore {copy}",
        cwd=REPO_ROOT,
    )
    first = next(copy / "patches" / n for n in (copy / "patches" / "series").read_text().split() if n[-6:] == ".patch")
    text = first.read_text().splitlines(keepends=True)
    hunk = next(i for i, ln in enumerate(text) if ln.startswith("@@"))
    text[next(i for i in range(hunk, len(text)) if text[i].startswith(" "))] = " # a line the base does not have\n"
    first.write_text("".join(text))
    name = "a patch that does not apply fails the build"
    make_image(checks, name, standin_tag, "eagle-fast-verify/sglang:test-broken-patch", False, copy)


def verbs(checks: Checks, image: str) -> None:
    (results := WORK / "results").mkdir(exist_ok=True)
    comm = [*"--device cpu --variants default --rows 4 --layers 2 --chain 4 --reps 2".split(), "--prefill-rows", ""]
    for args, want in (
        (["serve", "--dry-run"], 0),
        (["smoke"], 0),
        (["doctor"], 1),
        (["test-serve"], 2),
        (["test-gpu"], 2),
        (["bench-comm", *comm], 0),
    ):  # no GPU: doctor errors, GPU verbs refuse
        t = time.monotonic()
        res = proc.run(docker_run(image, args, gpus=False, results=results), timeout=600)
        ok = res.returncode == want and (args[0] != "bench-comm" or any(results.glob("bench-comm_*.json")))
        checks.add(
            f"docker run {image} {args[0]} exits {want} ({time.monotonic() - t:.0f} s)",
            ok,
            f"exit {res.returncode}: {(res.output.strip().splitlines() or [''])[-1][:140]}",
        )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="tests.image.build", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--can-run", action="store_true", help="say whether this machine can run it; change nothing")
    ap.add_argument("--link-venv", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.link_venv:  # the part that runs in .venv
        return link_venv(a.link_venv) or 0
    if (why := can_run()) or a.can_run:
        print(f"make test-image {'cannot run here: ' + why if why else 'can run here'}", file=sys.stderr)
        return 2 if why else 0
    os.nice(10)  # the machine is shared: every step below yields to other work
    say("about 3-7 minutes and 8 GB of disk: tools, engine, stand-in base (2-4 min), build, verbs, failing builds")
    tools()
    WORK.mkdir(parents=True, exist_ok=True)
    engine, checks, version = Engine(WORK), Checks(), load_pin().version
    standin_tag, image = f"localhost/sglang-standin:{version}", f"eagle-fast-verify/sglang:test-standin-{version}"
    try:
        engine.start()
        site = standin(standin_tag)
        make_image(checks, f"make image BASE={standin_tag}", standin_tag, image, True)
        base = sh(["docker", "inspect", "-f", '{{index .Config.Labels "org.opencontainers.image.base.name"}}', image])
        checks.add(
            "the labels name the stand-in, and nothing is tagged as upstream",
            base.stdout.strip() == standin_tag
            and not sh(["docker", "image", "ls", "-q", load_pin().image_name]).stdout.strip(),
        )
        verbs(checks, image)
        failures(checks, standin_tag, site)
    except UserError as e:  # a step that failed on its own: a failed check, after the clean-up below
        checks.add("the steps ran", False, str(e))
    finally:
        proc.run(["bash", "-c", "docker ps -aq | xargs -r docker rm -f; docker image prune -af"], timeout=600)
        engine.stop()
        shutil.rmtree(WORK, ignore_errors=True)
    bad = [name for name, ok in checks if not ok]
    say(
        f"{len(checks) - len(bad)}/{len(checks)} checks passed; peak disk use {(FREE[0] - min(FREE)) / 2**30:.1f} GB"
        + (f"; FAILED: {'; '.join(bad)}" if bad else "")
    )
    return 1 if bad else 0


if __name__ == "__main__":
    run(main)
