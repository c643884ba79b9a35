"""Driving SGLang's own bench_serving client (`python -m sglang.benchmark.serving`) as a subprocess.

Its JSONL record is kept unchanged; the harness only adds an "eagle" object. The client runs from an environment
that imports sglang, or from one with sglang's dependencies plus the patched tree (build/sglang/python) on
PYTHONPATH, as the tests do.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from ..lib import proc
from ..lib.errors import UserError
from ..lib.repo import REPO_ROOT

CLIENT_MODULE = "sglang.benchmark.serving"
TREE_PYTHON = REPO_ROOT / "build" / "sglang" / "python"
VENV_PYTHON = REPO_ROOT / ".venv" / "bin" / "python"
# Imported by sglang.benchmark.serving at start (datasets: for its MMMU loader, imported unconditionally).
CLIENT_DEPS = ("aiohttp", "numpy", "orjson", "msgspec", "requests", "tqdm", "transformers", "datasets")
# bench_serving prints these; the measured phase lies between them.
MARK_START = "Starting main benchmark run"
MARK_END = "Serving Benchmark Result"


def _probe(python: str, env: dict[str, str]) -> tuple[bool, list[str]] | None:
    """(sglang importable, missing client deps) for `python`, without importing anything heavy; None if it
    does not run."""
    code = ("import importlib.util as u,json,sys;"
            "print(json.dumps([u.find_spec('sglang') is not None,"
            "[m for m in sys.argv[1:] if u.find_spec(m) is None]]))")
    res = proc.run([python, "-c", code, *CLIENT_DEPS], env=env, timeout=60)
    if not res.ok:
        return None
    has, missing = json.loads(res.stdout.strip().splitlines()[-1])
    return bool(has), list(missing)


def with_tree(env: dict[str, str]) -> dict[str, str]:
    env = dict(env)
    env["PYTHONPATH"] = os.pathsep.join([str(TREE_PYTHON)] + [p for p in [env.get("PYTHONPATH", "")] if p])
    return env


def resolve_client(python: str | None) -> tuple[str, dict[str, str], str]:
    """(python, env, note) able to run bench_serving; UserError naming what is missing otherwise."""
    base_env = dict(os.environ)
    candidates = [python] if python else [sys.executable] + ([str(VENV_PYTHON)] if VENV_PYTHON.exists() else [])
    problems = []
    for py in candidates:
        probe = _probe(py, base_env)
        if probe is None:
            problems.append(f"{py}: does not run")
            continue
        env, note = base_env, f"{py} (its own sglang)"
        if not probe[0]:
            if not (TREE_PYTHON / "sglang").is_dir():
                problems.append(f"{py}: imports no sglang, and there is no tree at {TREE_PYTHON} (make apply)")
                continue
            env, note = with_tree(base_env), f"{py} with sglang from {TREE_PYTHON}"
            probe = _probe(py, env) or (False, ["(does not run)"])
        if probe[1]:
            problems.append(f"{note} lacks {', '.join(probe[1])}")
            continue
        return py, env, note
    raise UserError("no Python here can run SGLang's bench_serving:\n  " + "\n  ".join(problems) +
                    "\nFix: pip install the missing modules into that environment (sglang's client imports "
                    "`datasets` too), or pass --client-python PATH.")


def bench_serving_cmd(python: str, base_url: str, scenario_args: list[str], output_file: Path, tag: str,
                      tokenizer: str | None = None, model: str | None = None, extra: list[str] = ()) -> list[str]:
    cmd = [python, "-m", CLIENT_MODULE, "--backend", "sglang", "--base-url", base_url, *scenario_args,
           "--output-file", str(output_file), "--tag", tag, "--disable-tqdm"]
    if tokenizer:
        cmd += ["--tokenizer", tokenizer]
    if model:
        cmd += ["--model", model]
    return cmd + list(extra)


def run_bench_serving(cmd: list[str], env: dict[str, str], output_file: Path, log_path: Path,
                      on_start: Callable[[], None], on_end: Callable[[], None], timeout: float,
                      echo: bool = False) -> tuple[int, dict | None, str]:
    """Run one bench_serving; returns (exit code, its JSONL record or None, last lines of its output)."""
    output_file.unlink(missing_ok=True)
    tail: list[str] = []
    t0 = time.monotonic()
    with open(log_path, "a") as log:
        log.write(f"\n$ {' '.join(cmd)}\n")
        log.flush()
        child = proc.spawn(cmd, env={**env, "PYTHONUNBUFFERED": "1"}, stdout=proc.PIPE, stderr=proc.STDOUT,
                           text=True, errors="replace", bufsize=1)
        assert child.stdout is not None
        timer = threading.Timer(timeout, child.kill)  # the timeout of a streaming run
        timer.start()
        try:
            for line in child.stdout:
                log.write(line)
                if echo:
                    sys.stderr.write(line)
                tail = (tail + [line.rstrip()])[-40:]
                if MARK_START in line:
                    on_start()
                elif MARK_END in line:
                    on_end()
        finally:
            rc = child.wait()
            timer.cancel()
    if time.monotonic() - t0 >= timeout:
        tail.append(f"(killed after {timeout:.0f}s: raise --run-timeout)")
    on_end()
    record = None
    if output_file.is_file():
        lines = [ln for ln in output_file.read_text().splitlines() if ln.strip()]
        if lines:
            record = json.loads(lines[-1])
    return rc, record, "\n".join(tail)
