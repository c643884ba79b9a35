"""The lent-GPU route of make bench and the profile part (bench/device/run.sh bench-tiny, sweep-tiny, profile): the
tiny Llama target of make test-serve with its drafters, served as test-serve serves them (SGLang's
popen_launch_server, the route's environment and flags: tests/gpu/serve/_servers.py LENT_*), then benched or profiled
through --server-url, the product's own route to servers that run already. make bench's client runs as on the box, the image's bench-client verb, through a
stand-in `docker` (tests/_fake_docker.py) that runs the image's entrypoint with this python: the machine has none.

  python3 bench/device/lent.py bench-tiny OUT [BENCH_ARGS...]     results, report and logs in OUT/bench-tiny/
  python3 bench/device/lent.py sweep-tiny OUT [BENCH_ARGS...]     the DFlash arm's proxy, in OUT/sweep-tiny/
  python3 bench/device/lent.py profile OUT [PROFILE_ARGS...]      OUT/profile.json (+ traces, logs)
"""

import concurrent.futures as cf
import contextlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVE_TESTS = ROOT / "tests" / "gpu" / "serve"
PROFILES = ROOT / "docker" / "profiles" / "tiny"
PORT = 32000
READY_S = 300
# Each verb's servers (name, tiny profile, drafter), all up at once, and its make bench arguments: bench-tiny is the
# A/B/A of the pair without and with EAGLE-3; sweep-tiny the proxy of bench/sweep-dflash.toml: no speculation, EAGLE-3
# (draft-pi, always accepted: AL 4) and DFlash (dflash-first: AL exactly 2) at C1 on the chat and code prompt sets.
EAGLE3, DFLASH = ("tiny-eagle3", "eagle3.yaml", "draft-pi"), ("tiny-dflash", "dflash.yaml", "dflash-first")
SERVERS = {"bench-tiny": (("tiny-nospec", "nospec.yaml", None), EAGLE3)}
SERVERS["sweep-tiny"] = (*SERVERS["bench-tiny"], DFLASH)
ARGS = {"bench-tiny": [], "sweep-tiny": ["--scenarios", "C1-chat,C1-code", "--repeats", "1"]}


def server_args(profile: str, port: int, draft: Path | None) -> list[str]:
    """popen_launch_server's other_args for one tiny server on this route (one GPU)."""
    import _servers

    args = ["--config", str(PROFILES / profile), "--tp-size", "1", "--nccl-port", str(port + 5), *_servers.LENT_FLAGS]
    return args + (["--speculative-draft-model-path", str(draft)] if draft else [])


@contextlib.contextmanager
def served(models: Path, logs: Path, servers: tuple):
    """The tiny Llama target with each of `servers` (SERVERS), started all at once (a start takes a minute or two;
    test-serve starts its phases so too): {name: url}. Each server is stopped on the way out, a failed start or an
    interrupt included (the starts under way finish first, and their servers are stopped with the others)."""
    import _servers
    from sglang.test.test_utils import popen_launch_server, terminate_and_kill_process_tree

    env, _ = _servers.server_env(standins=True)
    pair, children, sinks = models / "llama", [], []
    urls = {name: f"http://127.0.0.1:{PORT + 10 * i}" for i, (name, _, _) in enumerate(servers)}
    logs.mkdir(parents=True, exist_ok=True)

    def start(i: int) -> None:
        name, profile, draft = servers[i]
        sink = open(logs / f"server-{name}.log", "w")
        sinks.append(sink)
        args = server_args(profile, PORT + 10 * i, pair / draft if draft else None)
        children.append(
            popen_launch_server(
                str(pair / "target"),
                urls[name],
                READY_S,
                device="cuda",
                env=env,
                other_args=args,
                return_stdout_stderr=(sink, sink),
            )
        )

    try:
        with cf.ThreadPoolExecutor(len(servers)) as pool:
            list(pool.map(start, range(len(servers))))
        yield urls
    finally:
        for child in children:
            terminate_and_kill_process_tree(child)
        for sink in sinks:
            sink.close()


def bench_argv(urls: dict[str, str], out: Path, tokenizer: Path, patchset: str, box: str) -> list[str]:
    """make bench against the running servers (A/B/A, two repeats, bench/device/tiny-scenarios.toml)."""
    argv = [
        sys.executable,
        "-m",
        "scripts.bench.bench",
        "--scenarios-file",
        str(ROOT / "bench/device/tiny-scenarios.toml"),
        "--repeats",
        "2",
        "--results-dir",
        str(out),
        "--box",
        box,
        "--tokenizer",
        str(tokenizer),
    ]
    for name, url in urls.items():
        argv += ["--server-url", f"{name}={url}", "--patchset", f"{name}={patchset}"]
    return argv


def profile_argv(urls: dict[str, str], out: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "scripts.report.profile",
        "--server-url",
        urls["tiny-nospec"],
        "--server-url",
        urls["tiny-eagle3"],
        "--steps",
        "8",
        "--out",
        str(out / "profile.json"),
    ]


def wait(argv: list[str], env: dict) -> int:
    """Run a verb to its end; on Ctrl-C (or run.sh's budget) it got the signal too: let it stop and write."""
    child = subprocess.Popen(argv, cwd=ROOT, env=env)
    try:
        return child.wait()
    except KeyboardInterrupt:
        return child.wait()


def main(argv: list[str]) -> int:
    what, out, rest = argv[0], Path(argv[1]).resolve(), argv[2:]
    sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(SERVE_TESTS)]
    import _fake_docker
    from scripts.box.results import box_name
    from scripts.series.pin import load_pin, patchset_id
    from tiny_models import write_pair

    with tempfile.TemporaryDirectory(prefix="lent-") as tmp:
        models = Path(tmp) / "models"
        write_pair(models, "llama")
        where = [Path(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]  # the patched SGLang's
        docker = _fake_docker.install(Path(tmp), images=(load_pin().serving_image,), pythonpath=tuple(where))
        env = {**os.environ, "PATH": f"{docker.bindir}{os.pathsep}{os.environ['PATH']}", "HF_HUB_OFFLINE": "1"}
        logs = out / (what if what in SERVERS else "profile")
        with served(models, logs, SERVERS.get(what, SERVERS["bench-tiny"])) as urls:
            if what in SERVERS:
                args = bench_argv(urls, logs, models / "llama" / "target", patchset_id(), f"{box_name()}-lent")
                args += ARGS[what]
            else:
                args = profile_argv(urls, out)
            return wait(args + rest, env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
