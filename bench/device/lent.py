"""The lent-GPU route of make bench and the profile part (bench/device/run.sh bench-tiny, profile): the tiny Llama
pair of make test-serve served as test-serve serves it (SGLang's popen_launch_server, the route's environment and
flags: tests/gpu/serve/_servers.py LENT_*), then benched or profiled through --server-url, the product's own route
to servers that run already. make bench's client runs as on the box, the image's bench-client verb, through a
stand-in `docker` (tests/_fake_docker.py) that runs the image's entrypoint with this python: the machine has none.

  python3 bench/device/lent.py bench-tiny OUT [BENCH_ARGS...]     results, report and logs in OUT/bench-tiny/
  python3 bench/device/lent.py profile OUT [PROFILE_ARGS...]      OUT/profile.json (+ traces, logs)
"""

from __future__ import annotations

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


def server_args(profile: str, port: int, draft: Path | None) -> list[str]:
    """popen_launch_server's other_args for one tiny server on this route (one GPU)."""
    import _servers

    args = ["--config", str(PROFILES / profile), "--tp-size", "1", "--nccl-port", str(port + 5), *_servers.LENT_FLAGS]
    return args + (["--speculative-draft-model-path", str(draft)] if draft else [])


@contextlib.contextmanager
def served(models: Path, logs: Path):
    """The tiny pair without and with EAGLE-3 (the always-accepted drafter), both up at once: {name: url}."""
    import _servers
    from sglang.test.test_utils import popen_launch_server, terminate_and_kill_process_tree

    env, _ = _servers.server_env(standins=True)
    pair, urls, children, sinks = models / "llama", {}, [], []
    logs.mkdir(parents=True, exist_ok=True)
    try:
        for i, (name, profile, draft) in enumerate(
            (("tiny-nospec", "nospec.yaml", None), ("tiny-eagle3", "eagle3.yaml", pair / "draft-pi"))
        ):
            port, sink = PORT + 10 * i, open(logs / f"server-{name}.log", "w")
            sinks.append(sink)
            urls[name] = f"http://127.0.0.1:{port}"
            children.append(
                popen_launch_server(
                    str(pair / "target"),
                    urls[name],
                    READY_S,
                    device="cuda",
                    env=env,
                    other_args=server_args(profile, port, draft),
                    return_stdout_stderr=(sink, sink),
                )
            )
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
        logs = out / ("bench-tiny" if what == "bench-tiny" else "profile")
        with served(models, logs) as urls:
            if what == "bench-tiny":
                args = bench_argv(urls, logs, models / "llama" / "target", patchset_id(), f"{box_name()}-lent")
            else:
                args = profile_argv(urls, out)
            return wait(args + rest, env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
