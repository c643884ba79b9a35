"""The patched launcher's PCIe-only defaults, asked of the patched SGLang itself (never copied into this repository).

- `read_defaults(pkg_dir)`: the dict literal _PCIE_NCCL_DEFAULTS of sglang/srt/entrypoints/pcie_defaults.py, read
  with `ast` (no import, so no torch and no GPU needed); `pcie_env` prints or writes it as an env file on demand,
  and bench-comm's `pcie_defaults` variant uses it.
- `launcher_pcie_decision(cfg, environ)`: what the launcher will decide (topology, NCCL values set and kept, the
  PCIe-IPC all-reduce, ranks to GPUs and NUMA nodes, warnings) when the patched module offers
  decide_pcie_only_defaults(cfg), asked under the child's environment; otherwise a plain statement that the launcher decides at start and logs
  it. `serve --dry-run` reports it.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import importlib
import os
import re
import sys
from pathlib import Path
from types import SimpleNamespace

from ..lib.envfile import render_env
from ..lib.errors import UserError
from ..lib.repo import BUILD_DIR
from ..series.sglang_pkg import find_sglang

SOURCE = "srt/entrypoints/pcie_defaults.py"  # inside the sglang package
MODULE = "sglang.srt.entrypoints.pcie_defaults"
DICT_NAME = "_PCIE_NCCL_DEFAULTS"
DECIDE = "decide_pcie_only_defaults"
SKIP_VAR = "SGLANG_PCIE_NCCL_DEFAULTS"
NAME_RE = re.compile(r"^[A-Z_][A-Z0-9_]*$")
AT_START = (f"the patched launcher decides the PCIe-only defaults when it starts: with no NVLink between the visible "
            f"GPUs (NVML) it sets its NCCL defaults where the environment does not ({SKIP_VAR}=0 skips them) and, on "
            f"SM120, the PCIe-IPC all-reduce (SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=0 skips it); it logs what it applied")


def package_dir(tree: Path | None = None, site_packages: Path | None = None, python: str | None = None) -> Path:
    """The sglang package to read: the one named (a checkout, a site-packages directory, an interpreter's), else
    the one this interpreter imports, else build/sglang's (the patched tree `make apply` builds)."""
    if tree:
        return Path(tree) / "python" / "sglang"
    if site_packages:
        return Path(site_packages) / "sglang"
    pkg, why = find_sglang(python or sys.executable)
    if pkg is not None:
        return pkg
    if python:
        raise UserError(f"{why}: pass --tree or --site-packages instead")
    return BUILD_DIR / "sglang" / "python" / "sglang"


def _find_dict(tree: ast.Module) -> list[tuple[int, ast.expr]]:
    found = []
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        if any(isinstance(t, ast.Name) and t.id == DICT_NAME for t in targets):
            found.append((node.lineno, value))
    return found


def _validate(path: Path, lineno: int, defaults) -> dict[str, str]:
    if not isinstance(defaults, dict) or not defaults:
        raise UserError(f"{path}:{lineno}: {DICT_NAME} must be a non-empty dict")
    for k, v in defaults.items():
        if not (isinstance(k, str) and NAME_RE.match(k)):
            raise UserError(f"{path}:{lineno}: {DICT_NAME} key {k!r} is not an environment variable name")
        if not isinstance(v, str) or v != v.strip() or "\n" in v or not v:
            raise UserError(f"{path}:{lineno}: {DICT_NAME}[{k!r}] = {v!r}: values must be non-empty one-line "
                            f"strings without surrounding blanks (docker --env-file takes them verbatim)")
    return defaults


def read_defaults(pkg_dir: Path) -> dict[str, str]:
    """_PCIE_NCCL_DEFAULTS of the sglang package at pkg_dir, read without importing sglang."""
    path = Path(pkg_dir) / SOURCE
    if not path.is_file():
        raise UserError(f"{path} does not exist: {pkg_dir} lacks the PCIe NCCL defaults patch. Point --tree, "
                        f"--site-packages or --python at a patched SGLang (make apply builds build/sglang).")
    try:
        found = _find_dict(ast.parse(path.read_text(), filename=str(path)))
    except SyntaxError as e:
        raise UserError(f"{path} does not parse: {e}") from e
    if len(found) != 1:
        raise UserError(f"{path} assigns {DICT_NAME} {len(found)} times at module level; expected exactly once")
    lineno, value = found[0]
    try:
        defaults = ast.literal_eval(value)
    except ValueError as e:
        raise UserError(f"{path}:{lineno}: {DICT_NAME} is not a literal ({e}); keep it a dict of string literals so "
                        f"that tools can read it without importing SGLang") from e
    return _validate(path, lineno, defaults)


def env_text(defaults: dict[str, str]) -> str:
    """The defaults as an env file (docker run --env-file), saying where they come from and when they apply."""
    return render_env(defaults, [
        f"NCCL defaults of the patched SGLang ({DICT_NAME} in sglang/{SOURCE}), printed by",
        "`python -m scripts.host.pcie_env`. The patched launcher applies them itself (setdefault) on one node with",
        f"TP > 1 when no two visible GPUs share NVLink; {SKIP_VAR}=0 skips that. Values passed with --env-file",
        "count as set by the user and apply whatever the topology: use this file on PCIe-only hosts only.",
    ])


@dataclasses.dataclass
class LauncherDecision:
    """What serve can say about the launcher's PCIe-only defaults before starting it."""

    known: bool  # the patched module answered
    lines: list[str]  # human-readable, one statement each
    data: dict | None = None  # its answer as plain data (serve --dry-run --json)


def _plain(value):
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)


# What decide_pcie_only_defaults reads from the server arguments, with the values it has when a flag is not given
# (a parser Namespace lacks the resolution-only fields).
_DECIDE_FIELDS = {"nnodes": 1, "tp_size": 1, "pp_size": 1, "dp_size": 1, "enable_dp_attention": False,
                  "base_gpu_id": 0, "gpu_id_step": 1, "enable_deterministic_inference": False,
                  "disable_custom_all_reduce": False}


@contextlib.contextmanager
def _environment(environ: dict[str, str]):
    """os.environ replaced by `environ` for the duration (the launcher reads the process environment)."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(environ)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def launcher_pcie_decision(cfg, environ: dict[str, str]) -> LauncherDecision:
    """Ask the patched launcher (in this interpreter) what it will decide for server arguments `cfg` (an object with
    tp_size, nnodes, ... as sglang's parser makes them) under the child's environment `environ`."""
    try:
        module = importlib.import_module(MODULE)
    except Exception as e:  # noqa: BLE001 - not patched, not importable here: say so
        return LauncherDecision(False, [f"{AT_START} ({MODULE} is not importable here: {type(e).__name__})"])
    decide = getattr(module, DECIDE, None)
    if decide is None:
        return LauncherDecision(False, [f"{AT_START} ({MODULE} has no {DECIDE} to ask in advance)"])
    args = SimpleNamespace(**{k: getattr(cfg, k, v) for k, v in _DECIDE_FIELDS.items()})
    try:
        with _environment(environ):
            data = _plain(decide(args))
    except Exception as e:  # noqa: BLE001 - the launcher will log its own view at start
        return LauncherDecision(False, [f"{AT_START} ({DECIDE} failed here: {type(e).__name__}: {e})"])
    if isinstance(data, dict):
        lines = [f"launcher PCIe defaults: {k}: {v}" for k, v in data.items() if v not in ([], {}, "")]
    else:
        lines = [f"launcher PCIe defaults: {data}"]
    return LauncherDecision(True, lines, data if isinstance(data, dict) else {"decision": data})
