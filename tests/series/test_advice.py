"""Every piece of advice the series verbs print is a command that works as printed.

A `make <target> VAR=...` names a target of the Makefile, and each VAR is one its recipe passes on or one the
target's verb reads from the environment (make exports command-line variables to its recipes). A `VAR=value` on
its own is read by the verb that printed it (or its target's recipe uses it). A `--flag` is one of the printing
verb's argparse options, and `python -m scripts.<verb> ...` names an existing verb with its own options; flags of
other programs (git, pip, rm) are theirs. Checked on every string in scripts/series (make targets and variables)
and on the real output of the failure paths of apply, refresh, check-patches and export (everything). The advice a
conflicting refresh prints (RESUME=1) is then followed, as printed.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
from _releases import OTHER_REQUIREMENT, OTHER_TAG

from scripts.lib import git
from scripts.series.lint import lint
from scripts.series.patchfile import series_patches
from scripts.series.pin import load_pin
from scripts.series.upstream import git_tree_from_wheel, sha256_file

ROOT = Path(__file__).resolve().parents[2]
PIN = load_pin()
PATCHES = series_patches(PIN)
SERIES_VERBS = ["scripts.series.apply", "scripts.series.refresh", "scripts.series.check_patches",
                "scripts.series.export", "scripts.series.prove_tests"]

MAKE_RE = re.compile(r"\bmake ([a-z][a-z-]*)((?:[ \t]+(?:[A-Z][A-Z0-9_]*=[^\s,;)]*|\{\}))*)")
VAR_RE = re.compile(r"(?<![\w./-])([A-Z][A-Z0-9_]+)=")
PY_RE = re.compile(r"\bpython3? -m (scripts\.[\w.]+)([^\n;,)]*)")
OTHER_CMD_RE = re.compile(r"\b(?:git|pip|rm)\b[^\n;,)]*")
FLAG_RE = re.compile(r"(?<![\w-])--([a-z][a-z-]*)")
QUOTED_TOOL_OUTPUT = re.compile(r"^--- git (?:am|apply) said.*", re.M | re.S)


# ------------------------------------------------------------------------------------- what exists


@cache
def make_recipes() -> dict[str, str]:
    """target -> its recipe lines, from the Makefile."""
    recipes: dict[str, str] = {}
    current = None
    for line in (ROOT / "Makefile").read_text().splitlines():
        m = re.match(r"^([a-z][a-z-]*):", line)
        if m:
            current = m.group(1)
            recipes[current] = ""
        elif line.startswith("\t") and current:
            recipes[current] += line + "\n"
        elif line.strip():
            current = None
    return recipes


def module_path(name: str) -> Path | None:
    base = ROOT / name.replace(".", "/")
    return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)


@cache
def tree_of(name: str) -> ast.Module:
    return ast.parse(module_path(name).read_text())


@cache
def imported(name: str) -> frozenset[str]:
    """The scripts.* modules a module imports (relative imports resolved)."""
    package = name if module_path(name).name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(tree_of(name)):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            out |= {m for m in [base, *(f"{base}.{a.name}" for a in node.names)] if m.startswith("scripts")}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("scripts")}
    return frozenset(m for m in out if module_path(m))


@cache
def closure(name: str) -> frozenset[str]:
    seen, todo = set(), [name]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo += imported(m)
    return frozenset(seen)


@cache
def env_read(verb: str) -> frozenset[str]:
    """Environment variables the verb (or a module it imports) reads: os.environ.get("X") or os.environ["X"]."""
    names = set()
    for m in closure(verb):
        for node in ast.walk(tree_of(m)):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                    and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "environ"
                    and node.args and isinstance(node.args[0], ast.Constant)):
                names.add(node.args[0].value)
            if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute)
                    and node.value.attr == "environ" and isinstance(node.slice, ast.Constant)):
                names.add(node.slice.value)
    return frozenset(names)


@cache
def flags(verb: str) -> frozenset[str]:
    """The --options the verb's argparse parser defines."""
    return frozenset(a.value[2:] for node in ast.walk(tree_of(verb)) if isinstance(node, ast.Call)
                     and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"
                     for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("--"))


def target_verbs(target: str) -> list[str]:
    return re.findall(r"-m (scripts\.[\w.]+)", make_recipes().get(target, ""))


def verb_target(verb: str) -> str | None:
    return next((t for t in make_recipes() if verb in target_verbs(t)), None)


# ------------------------------------------------------------------------------------- the check


def _make_problems(text: str) -> list[str]:
    problems = []
    for m in MAKE_RE.finditer(text):
        target, recipe = m.group(1), make_recipes().get(m.group(1))
        if recipe is None:
            problems.append(f"`{m.group(0).strip()}`: the Makefile has no target {target}")
            continue
        read = set().union(*(env_read(v) for v in target_verbs(target)))
        problems += [f"`{m.group(0).strip()}`: make {target} neither passes {var} on nor reads it"
                     for var in VAR_RE.findall(m.group(2)) if f"$({var})" not in recipe and var not in read]
    return problems


def advice_problems(text: str, verb: str, check_flags: bool = True) -> list[str]:
    """What in `text` (printed by `verb`) is not a command that works as printed."""
    text = QUOTED_TOOL_OUTPUT.sub("", text)
    problems = []
    for m in PY_RE.finditer(text):
        if module_path(m.group(1)) is None:
            problems.append(f"`{m.group(0).strip()}`: no module {m.group(1)}")
        else:
            problems += [f"`{m.group(0).strip()}`: {m.group(1)} has no --{f}" for f in FLAG_RE.findall(m.group(2))
                         if f not in flags(m.group(1))]
    text = PY_RE.sub(" ", text)
    problems += _make_problems(text)
    text = MAKE_RE.sub(" ", text)
    recipe = make_recipes().get(verb_target(verb) or "", "")
    problems += [f"{var}= is neither read by {verb} nor passed by its make target" for var in VAR_RE.findall(text)
                 if var not in env_read(verb) and f"$({var})" not in recipe]
    if check_flags:
        text = OTHER_CMD_RE.sub(" ", text)
        problems += [f"--{f} is no option of {verb}" for f in FLAG_RE.findall(text) if f not in flags(verb)]
    return problems


def rendered_strings(name: str) -> list[tuple[int, str]]:
    """Every string literal of a module, f-strings with {} for their fields."""
    out = []
    for node in ast.walk(tree_of(name)):
        if isinstance(node, ast.JoinedStr):
            out.append((node.lineno, "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.append((node.lineno, node.value))
    return out


def test_the_checker_catches_the_advice_the_review_found():
    assert advice_problems("Without GitHub: SGLANG_BASE=wheel for make apply", "scripts.series.check_patches") == []
    assert advice_problems("download it yourself and pass --wheel-file", "scripts.series.apply")
    assert advice_problems("make refresh WHEEL_FILE=x SGLANG_WHEEL=y", "scripts.series.refresh") == []
    assert advice_problems("make refresh NO_SUCH_VAR=1", "scripts.series.refresh")
    assert advice_problems("make no-such-target", "scripts.series.refresh")
    assert advice_problems("python -m scripts.series.refresh --no-such-flag", "scripts.series.apply")
    assert advice_problems("git -C x am --continue", "scripts.series.refresh") == []


def test_every_make_command_and_variable_in_the_series_code_exists():
    """Static: every string in scripts/series that names `make <target> VAR=...` or `VAR=...` (make targets and
    variables, environment variables), attributed to every series verb that imports the module."""
    problems = []
    for path in sorted((ROOT / "scripts" / "series").glob("*.py")):
        name = f"scripts.series.{path.stem}"
        verbs = [v for v in SERIES_VERBS if name in closure(v)]
        for line, text in rendered_strings(name):
            for verb in verbs:
                problems += [f"{path.name}:{line} (printed by {verb}): {p}"
                             for p in advice_problems(text, verb, check_flags=False)]
    assert not problems, "\n".join(sorted(set(problems)))


# ------------------------------------------------------------------------------------- the failure paths


def run(verb: str, *args, env: dict | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if k not in ("SGLANG_BASE", "SGLANG_WHEEL")}
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", f"scripts.series.{verb}", *map(str, args)], cwd=cwd, env=e,
                          capture_output=True, text=True)


def failed(cp: subprocess.CompletedProcess, verb: str) -> str:
    """What the tool itself said (stdout, its progress lines, its error message), not the programs it ran."""
    assert cp.returncode != 0, f"{verb} did not fail:\n{cp.stdout}{cp.stderr}"
    own = [line for line in cp.stderr.splitlines() if line.startswith("[eagle-patches] ")]
    error = cp.stderr[cp.stderr.find("\nerror: ") + 1:] if "\nerror: " in cp.stderr else ""
    if cp.stderr.startswith("error: "):
        error = cp.stderr
    return "\n".join([cp.stdout, *own, error])


@pytest.fixture
def patches_copy(tmp_path) -> Path:
    d = tmp_path / "patches"
    shutil.copytree(PIN.patches_dir, d)
    return d


def test_refresh_advice_works_as_printed(tmp_path, base_cache, pinned_wheel, other_wheel, patches_copy):
    no_github = {"SGLANG_REPO": f"file://{tmp_path}/no-such-upstream.git", "SGLANG_PATCHES_CACHE": str(base_cache)}
    offline = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "", "SGLANG_PATCHES_CACHE": str(tmp_path / "empty-cache")}
    outputs = {
        "no target": failed(run("refresh"), "refresh"),
        "clone fails": failed(run("refresh", "--tag", "v9.9.9", env=no_github), "refresh"),
        "download fails": failed(run("refresh", "--wheel", "sglang==9.9.9", env=offline), "refresh"),
        "no wheel file": failed(run("refresh", "--wheel", "sglang==9.9.9", "--wheel-file", tmp_path / "x.whl"),
                                "refresh"),
        "nothing to resume": failed(run("refresh", "--wheel-file", other_wheel, "--dest", tmp_path / "none",
                                        "--resume"), "refresh"),
    }
    assert "make refresh TO=v9.9.9 WHEEL=sglang==9.9.9" in outputs["clone fails"]
    assert "make refresh WHEEL=sglang==9.9.9 WHEEL_FILE=" in outputs["download fails"]
    dest = tmp_path / "refresh"
    cp = run("refresh", "--wheel", OTHER_REQUIREMENT, "--wheel-file", other_wheel, "--dest", dest, "--patches-dir",
             patches_copy, env={"SGLANG_PATCHES_CACHE": str(base_cache), "SGLANG_WHEEL": str(pinned_wheel)})
    outputs["conflict"] = failed(cp, "refresh")
    for case, out in outputs.items():
        assert "error: " in out or case == "conflict", (case, out)
        if os.environ.get("SHOW_ADVICE"):
            print(f"=== {case}\n{out.strip()}")
    problems = [f"{case}: {p}" for case, out in outputs.items() for p in advice_problems(out, "scripts.series.refresh")]
    assert not problems, "\n".join(problems)
    # Follow the conflict's advice as printed: here the operator drops the conflicting patches instead of porting
    # them, and writes from the tree.
    resume = re.search(r"^  (python -m scripts\.series\.refresh .*--resume)$", cp.stdout, re.M)
    assert resume, cp.stdout
    argv = resume.group(1).split()
    done = subprocess.run([sys.executable, *argv[1:]], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "SGLANG_PATCHES_CACHE": str(base_cache)})
    assert done.returncode == 0, done.stderr
    kept = git.out(dest, "log", "--reverse", "--format=%s", f"{OTHER_TAG}..HEAD").splitlines()
    moved = load_pin(patches_copy)
    assert (moved.tag, moved.wheel_sha256) == (OTHER_TAG, sha256_file(other_wheel))
    assert [p.subject for p in series_patches(moved)] == kept and 0 < len(kept) < len(PATCHES)
    assert lint(patches_copy) == []


def _truncated(d: Path, index: int) -> Path:
    p = d / PATCHES[index].path.name
    p.write_text("".join(p.read_text().splitlines(keepends=True)[:-3]))
    return d


def _misfit(d: Path, index: int) -> Path:
    """A copy of patches/ whose patch `index` no longer fits its file (one context line changed)."""
    shutil.copytree(PIN.patches_dir, d)
    p = d / PATCHES[index].path.name
    lines = p.read_text().splitlines(keepends=True)
    i = next(i for i, line in enumerate(lines) if line.startswith("@@"))
    j = next(k for k in range(i + 1, len(lines)) if lines[k].startswith(" ") and lines[k].strip())
    lines[j] = lines[j].rstrip("\n") + "  # not upstream\n"
    p.write_text("".join(lines))
    return d


def test_apply_check_patches_and_export_advice_works_as_printed(tmp_path, upstream, other_wheel, base_cache,
                                                                patches_copy):
    no_github = {"SGLANG_REPO": f"file://{tmp_path}/no-such-upstream.git",
                 "SGLANG_PATCHES_CACHE": str(tmp_path / "cache")}
    fake = tmp_path / "mine" / PIN.wheel_filename
    fake.parent.mkdir()
    shutil.copy2(other_wheel, fake)
    (tmp_path / "not-git").mkdir()
    (tmp_path / "not-git" / "file").write_text("x")
    old = tmp_path / "old"
    git_tree_from_wheel(other_wheel, old, PIN.tag, sha256_file(other_wheel))
    dirty = tmp_path / "dirty"
    git.git(tmp_path, "clone", "-q", "--branch", PIN.tag, str(upstream), str(dirty))
    (dirty / "python" / "sglang" / "srt" / "environ.py").write_text("# edited\n")
    clean = tmp_path / "clean"
    git.git(tmp_path, "clone", "-q", "--branch", PIN.tag, str(upstream), str(clean))
    cases = {
        "clone fails": ("apply", ["--dest", tmp_path / "a", "--source", "clone"], no_github),
        "wrong wheel": ("apply", ["--dest", tmp_path / "a"], {"SGLANG_WHEEL": str(fake)}),
        "missing wheel": ("apply", ["--dest", tmp_path / "a"], {"SGLANG_WHEEL": str(tmp_path / "no.whl")}),
        "wheel and clone": ("apply", ["--dest", tmp_path / "a", "--source", "clone"], {"SGLANG_WHEEL": str(fake)}),
        "download fails": ("apply", ["--dest", tmp_path / "a", "--source", "wheel"],
                           {"PIP_NO_INDEX": "1", "SGLANG_PATCHES_CACHE": str(tmp_path / "empty")}),
        "not a checkout": ("apply", ["--dest", tmp_path / "not-git"], {}),
        "src not a checkout": ("apply", ["--src", tmp_path / "not-git"], {}),
        "rebuild and src": ("apply", ["--src", dirty, "--rebuild"], {}),
        "wrong release": ("apply", ["--src", old], {}),
        "dirty": ("apply", ["--src", dirty], {}),
        "corrupt": ("apply", ["--src", old, "--patches-dir", _truncated(patches_copy, 2)], {}),
        "misfit": ("apply", ["--src", clean, "--patches-dir", _misfit(tmp_path / "misfit", 4)], {}),
        "check-patches clone fails": ("check_patches", ["--source", "clone"], no_github),
        "check-patches lint": ("check_patches", ["--patches-dir", patches_copy], {}),
        "export not a checkout": ("export", ["--tree", tmp_path / "not-git", "--out", tmp_path / "out"], {}),
    }
    problems = []
    for case, (verb, args, env) in cases.items():
        out = failed(run(verb, *args, env=env), f"{case}: {verb}")
        assert "error: " in out or "lint: " in out, (case, out)
        if os.environ.get("SHOW_ADVICE"):
            print(f"=== {case}\n{out.strip()}")
        problems += [f"{case}: {p}" for p in advice_problems(out, f"scripts.series.{verb}")]
    assert not problems, "\n".join(problems)
