"""Driving SGLang's own bench_serving client (`python -m sglang.benchmark.serving`) as a subprocess.

Its JSONL record is kept unchanged; the harness only adds an "eagle" object. The client runs from an environment
that imports sglang, or from one with sglang's dependencies plus the patched tree (build/sglang/python) on
PYTHONPATH, as the tests do.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from ..lib import proc
from ..lib.errors import UserError
from ..lib.repo import REPO_ROOT
from ..series.sglang_pkg import probe

CLIENT_MODULE = "sglang.benchmark.serving"
TREE_PYTHON = REPO_ROOT / "build" / "sglang" / "python"
VENV_PYTHON = REPO_ROOT / ".venv" / "bin" / "python"
# Imported by sglang.benchmark.serving at start (datasets: for its MMMU loader, imported unconditionally).
CLIENT_DEPS = ("aiohttp", "numpy", "orjson", "msgspec", "requests", "tqdm", "transformers", "datasets")
# bench_serving prints these; the measured phase lies between them.
MARK_START = "Starting main benchmark run"
MARK_END = "Serving Benchmark Result"


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
        info = probe(py, CLIENT_DEPS, env=base_env)
        if info.get("failed"):
            problems.append(f"{py}: does not run ({info['failed']})")
            continue
        env, note = base_env, f"{py} (its own sglang)"
        if not info["sglang"]:
            if not (TREE_PYTHON / "sglang").is_dir():
                problems.append(f"{py}: imports no sglang, and there is no tree at {TREE_PYTHON} (make apply)")
                continue
            env, note = with_tree(base_env), f"{py} with sglang from {TREE_PYTHON}"
            info = probe(py, CLIENT_DEPS, env=env)
        if info.get("failed") or info["missing"]:
            problems.append(f"{note} lacks {', '.join(info['missing'])}" if not info.get("failed") else
                            f"{note}: does not run ({info['failed']})")
            continue
        return py, env, note
    raise UserError("no Python here can run SGLang's bench_serving:\n  " + "\n  ".join(problems) +
                    "\nFix: pip install the missing modules into that environment (sglang's client imports "
                    "`datasets` too), or pass --client-python PATH.")


# Runs in the client's interpreter: bench_serving's own cli_main() parses each argument list with its own parser
# and its own post-parse checks (run_benchmark replaced, so nothing runs), then the dataset it names is built from
# the parsed arguments as bench_serving builds it, and its random lengths are drawn with bench_serving's own
# compute_random_lens (which refuses a range ratio that leaves no length to draw). No rule is copied here.
CHECK_CODE = r"""
import contextlib, io, json, sys, warnings
warnings.simplefilter("ignore")
import sglang.benchmark.serving as bs

class Accepted(Exception):
    pass

def capture(args):
    raise Accepted(args)

def lengths(args):
    try:
        from sglang.benchmark.datasets import DATASET_MAPPING
        from sglang.benchmark.datasets.common import compute_random_lens
        ds = DATASET_MAPPING[args.dataset_name].from_args(args)
    except Exception:
        return None
    for what in ("input_len", "output_len"):
        if hasattr(ds, what) and hasattr(ds, "range_ratio"):
            try:
                compute_random_lens(getattr(ds, what), ds.range_ratio, 1)
            except Exception as e:
                kind = what.replace("_len", "")
                return ("--random-range-ratio", f"{type(ds).__name__} cannot draw {kind} lengths up to "
                        f"{getattr(ds, what)} with range ratio {ds.range_ratio} (compute_random_lens: {e})")
    return None

bs.run_benchmark = capture
out = {}
for label, argv in json.load(sys.stdin).items():
    sys.argv = ["sglang.benchmark.serving", *argv]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            bs.cli_main()
        out[label] = ["", "bench_serving's cli_main returned without running the benchmark"]
    except Accepted as a:
        out[label] = lengths(a.args[0])
    except SystemExit:
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        out[label] = ["", lines[-1] if lines else "refused"]
print(json.dumps(out))
"""


def check_bench_args(client: tuple[str, dict, str], commands: dict[str, list[str]]) -> dict[str, tuple[str, str]]:
    """label -> (the flag at fault or '', what bench_serving says) for every command it would refuse; each command
    is a bench_serving argument list (no interpreter, no module). Nothing is sent anywhere."""
    py, env, note = client
    res = proc.run([py, "-c", CHECK_CODE], env=env, input=json.dumps(commands), timeout=300)
    if not res.ok:
        raise UserError(f"could not check the scenarios with bench_serving's own parser ({note}): {res.why}; "
                        f"fix that environment (or pass --client-python PATH)")
    verdicts = json.loads(res.stdout.strip().splitlines()[-1])
    out = {}
    for label, v in verdicts.items():
        if v:
            flag, said = v
            named = re.search(r"--[a-z0-9][a-z0-9-]*", said)
            out[label] = (flag or (named.group(0) if named else ""), said.split(": error: ", 1)[-1])
    return out


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
