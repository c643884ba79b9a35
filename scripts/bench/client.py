"""Driving SGLang's own bench_serving client (`python -m sglang.benchmark.serving`) as a subprocess.

Its JSONL record is kept unchanged; the harness only adds an "eagle" object. Where the client runs (resolve_client,
the first that works): --client-python PY or --client-image IMAGE when given; else .venv (make setup) when it
exists, then this python, each with its own sglang or the patched tree (build/sglang/python) on PYTHONPATH, when
`import sglang.benchmark.serving` succeeds there; else the serving image (`docker run --network host IMAGE python3
-m sglang.benchmark.serving ...`: the image the server runs, with its client), when the docker engine has it.
When none works, one message names, per candidate, every package of SGLang's own requirements (its METADATA's
Requires-Dist, or the tree's pyproject.toml) that it lacks, by package name, and the fixes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
import threading
import time
import zipfile
from pathlib import Path
from typing import Callable

from ..host.engine import cache_mounts
from ..host.route import default_image, image_ready
from ..lib import proc
from ..lib.errors import UserError
from ..lib.repo import REPO_ROOT
from ..lib.tomlfile import load_toml
from ..series.pin import load_pin
from ..series.sglang_pkg import probe
from ..series.base import CACHE_DIR

CLIENT_MODULE = "sglang.benchmark.serving"
TREE_PYTHON = REPO_ROOT / "build" / "sglang" / "python"
VENV_PYTHON = REPO_ROOT / ".venv" / "bin" / "python"
# What a client container gets from the environment, by name (docker copies the values).
IMAGE_ENV = ("OPENAI_API_KEY", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "PYTHONUNBUFFERED")
# bench_serving prints these; the measured phase lies between them.
MARK_START = "Starting main benchmark run"
MARK_END = "Serving Benchmark Result"


@dataclasses.dataclass
class Client:
    """Where bench_serving runs: a python here (with its environment), or the serving image."""

    note: str
    env: dict[str, str]
    python: str = ""
    image: str = ""
    hf_cache: str = ""  # the image: the host HF cache mounted at the image's (the tokenizer)
    mounts: list[str] = dataclasses.field(default_factory=list)  # host paths the image sees at the same place

    def command(self, *args: str, stdin: bool = False) -> list[str]:
        """The argv that runs `python3 ARGS` (here, or in a container on the host's network)."""
        if not self.image:
            return [self.python, *args]
        mounts = cache_mounts(self.hf_cache)[:2] if self.hf_cache else []
        for p in dict.fromkeys(self.mounts):
            mounts += ["-v", f"{p}:{p}"]
        names = [x for k in IMAGE_ENV if k in self.env for x in ("-e", k)]
        return ["docker", "run", "--rm", *(["-i"] if stdin else []), "--network", "host", *mounts, *names,
                self.image, "python3", *args]


def with_tree(env: dict[str, str]) -> dict[str, str]:
    env = dict(env)
    env["PYTHONPATH"] = os.pathsep.join([str(TREE_PYTHON)] + [p for p in [env.get("PYTHONPATH", "")] if p])
    return env


# Runs in a candidate interpreter: does bench_serving import? If not, which of SGLang's requirements (stdin: the
# Requires-Dist strings, or null for the installed sglang's own) are not installed, markers evaluated. (Which sglang
# it imports is series/sglang_pkg's probe, the one locator.)
IMPORT_PROBE = r"""
import importlib, importlib.metadata as md, io, json, re, sys, contextlib, warnings
warnings.simplefilter("ignore")
reqs = json.load(sys.stdin)
out = {"error": "", "missing": []}
try:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        importlib.import_module(sys.argv[1])
except BaseException as e:
    out["error"] = f"{type(e).__name__}: {e}"
if out["error"]:
    try:
        from packaging.requirements import Requirement
    except ImportError:
        Requirement = None
    if reqs is None:
        try:
            reqs = md.requires("sglang") or []
        except md.PackageNotFoundError:
            reqs = []
    for r in reqs:
        if Requirement is not None:
            req = Requirement(r)
            name, wanted = req.name, req.marker is None or req.marker.evaluate({"extra": ""})
        else:
            name, wanted = re.split(r"[ ;<>=!~\[]", r, 1)[0], ";" not in r
        try:
            md.version(name)
        except md.PackageNotFoundError:
            if wanted:
                out["missing"].append(name)
print(json.dumps(out))
"""


def tree_requirements() -> list[str] | None:
    """SGLang's Requires-Dist for the patched tree: its pyproject.toml (a clone), else the pinned wheel's METADATA."""
    pyproject = TREE_PYTHON / "pyproject.toml"
    if pyproject.is_file():
        return list(load_toml(pyproject, "SGLang's pyproject").get("project", {}).get("dependencies", []))
    wheel = CACHE_DIR / load_pin().wheel_filename
    if not wheel.is_file():
        return None
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        return re.findall(r"^Requires-Dist: *(.+?) *$", z.read(meta).decode("utf-8", "replace"), re.M)


def missing_for_client(py: str, env: dict[str, str], requirements: list[str] | None) -> dict | None:
    """{error: why `import sglang.benchmark.serving` fails with `py` ('' when it works), missing: the requirements
    not installed}, None when `py` does not run."""
    res = proc.run([py, "-c", IMPORT_PROBE, CLIENT_MODULE], env=env, input=json.dumps(requirements), timeout=300)
    try:
        return json.loads(res.stdout.strip().splitlines()[-1]) if res.ok else None
    except (ValueError, IndexError):
        return None


def probe_python(py: str, env: dict[str, str]) -> tuple[Client | None, str]:
    """(a Client, '') when bench_serving imports with `py` (its own sglang, else the tree), else (None, why)."""
    info = probe(py, env=env)  # the one locator: which sglang `py` would import
    if info.get("failed"):
        return None, f"{py}: does not run ({info['failed']})"
    note, requirements = f"{py} (its own sglang)", None
    if not info["sglang"]:
        if not (TREE_PYTHON / "sglang").is_dir():
            return None, f"{py}: imports no sglang, and there is no tree at {TREE_PYTHON} (make apply)"
        env, note, requirements = with_tree(env), f"{py} with sglang from {TREE_PYTHON}", tree_requirements()
    found = missing_for_client(py, env, requirements)
    if found is None:
        return None, f"{note}: does not run"
    if not found["error"]:
        return Client(note, env, python=py), ""
    lacks = (f"lacks {len(found['missing'])} of SGLang's requirements: {' '.join(found['missing'])}"
             if found["missing"] else "has SGLang's requirements")
    return None, f"{note}: {lacks} (import {CLIENT_MODULE}: {found['error'][:200]})"


def resolve_client(python: str | None = None, image: str | None = None, hf_cache: str = "") -> Client:
    """The first place bench_serving runs (module docstring); a UserError naming what each one lacks otherwise.
    image: None (choose), '' (the serving image) or a name (--client-image)."""
    base_env = dict(os.environ)
    if image is None:
        candidates = [python] if python else list(dict.fromkeys(
            ([str(VENV_PYTHON)] if VENV_PYTHON.exists() else []) + [sys.executable]))
        problems = [] if VENV_PYTHON.exists() or python else [f"{VENV_PYTHON}: not there (make setup makes it)"]
        for py in candidates:
            client, why = probe_python(py, base_env)
            if client is not None:
                return client
            problems.append(why)
        if python:
            raise UserError(f"--client-python {python} cannot run SGLang's bench_serving: {problems[0]}. Fix: pip "
                            f"install those packages there, or leave out --client-python")
    else:
        problems = []
    name = image or default_image()
    ok, why = image_ready(name)
    if ok:
        return Client(f"the {why}", base_env, image=name, hf_cache=hf_cache)
    problems.append(f"the serving image: {why}")
    raise UserError("no Python here can run SGLang's bench_serving, nor the serving image:\n  "
                    + "\n  ".join(problems) + "\nFix: make setup (a .venv with SGLang's requirements; make bench "
                    "uses it), or on the box make image (bench_serving then runs from the image), or pip install "
                    "the packages named into one of these (--client-python PATH picks it)")


# Runs in the client's interpreter: bench_serving's own cli_main() parses each argument list with its own parser
# and its own post-parse checks (run_benchmark replaced, so nothing runs), then the dataset it names is built from
# the parsed arguments as bench_serving builds it, and its random lengths are drawn with bench_serving's own
# compute_random_lens (which refuses a range ratio that leaves no length to draw). Then the dataset is loaded with
# bench_serving's download helpers replaced by ones that only look in the local caches: a dataset that would
# download is named ({"downloads": what}); a failure for any other reason (no tokenizer here) is not its business.
# No rule is copied here.
CHECK_CODE = r"""
import contextlib, io, json, os, sys, warnings
warnings.simplefilter("ignore")
import sglang.benchmark.serving as bs

class Accepted(Exception):
    pass

class Downloads(Exception):
    pass

def capture(args):
    raise Accepted(args)

def hf_file(repo_id, filename, repo_type="dataset"):
    from huggingface_hub import hf_hub_download
    try:
        return hf_hub_download(repo_id=repo_id, filename=filename, repo_type=repo_type, local_files_only=True)
    except Exception:
        raise Downloads(f"{repo_id}/{filename} from the Hugging Face Hub")

def url_file(url, filename=None):
    path = filename or os.path.join("/tmp", url.split("/")[-1])
    if os.path.isfile(path):
        return path
    raise Downloads(url)

def hub_dataset(name, *args, **kwargs):
    raise Downloads(f"the dataset {name} from the Hugging Face Hub")

def would_download(ds):
    for mod in [m for n, m in list(sys.modules.items()) if n.startswith("sglang.benchmark") or n == "datasets"]:
        for attr, fn in (("download_and_cache_hf_file", hf_file), ("download_and_cache_file", url_file),
                         ("load_dataset", hub_dataset)):
            if hasattr(mod, attr):
                setattr(mod, attr, fn)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            ds.load(tokenizer=None, model_id=None)
    except Downloads as e:
        return str(e)
    except Exception:
        return None
    return None

def lengths(args):
    try:
        from sglang.benchmark.datasets import DATASET_MAPPING
        from sglang.benchmark.datasets.common import compute_random_lens
        cls = DATASET_MAPPING[args.dataset_name]
    except Exception:
        return None
    try:
        ds = cls.from_args(args)
    except Exception as e:
        said = str(e) or "an assertion in its from_args"
        return ("", f"its dataset {args.dataset_name} ({cls.__name__}) refuses the arguments: "
                    f"{type(e).__name__}: {said}")
    downloads = would_download(ds)
    if downloads:
        return {"downloads": downloads}
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


def check_bench_args(client: Client, commands: dict[str, list[str]]) -> dict[str, tuple[str, str]]:
    """label -> (the flag at fault or '', what bench_serving says) for every command it would refuse, and
    ("--dataset-name", "downloads WHAT") for one whose dataset is not on this machine; each command is a
    bench_serving argument list (no interpreter, no module). Nothing is sent anywhere."""
    res = proc.run(client.command("-c", CHECK_CODE, stdin=True), env=client.env, input=json.dumps(commands),
                   timeout=600)
    if not res.ok:
        raise UserError(f"could not check the scenarios with bench_serving's own parser ({client.note}): "
                        f"{res.why}; fix that environment (or pass --client-python PATH)")
    verdicts = json.loads(res.stdout.strip().splitlines()[-1])
    out = {}
    for label, v in verdicts.items():
        if isinstance(v, dict):
            out[label] = ("--dataset-name", f"downloads {v['downloads']}")
        elif v:
            flag, said = v
            named = re.search(r"--[a-z0-9][a-z0-9-]*", said)
            out[label] = (flag or (named.group(0) if named else ""), said.split(": error: ", 1)[-1])
    return out


def bench_serving_cmd(python: list[str], base_url: str, scenario_args: list[str], output_file: Path, tag: str,
                      tokenizer: str | None = None, model: str | None = None, extra: list[str] = ()) -> list[str]:
    """python: the argv that runs the client's python3 (Client.command())."""
    cmd = [*python, "-m", CLIENT_MODULE, "--backend", "sglang", "--base-url", base_url, *scenario_args,
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
