"""The checker of printed advice: is a command a verb prints one that works as printed?

A `make <target> VAR=...` names a target of the Makefile, and each VAR is one its recipe passes on (directly, or
through a Makefile variable defined from it, as VPY from VENV) or one the target's verb reads from the environment
(make exports command-line variables to its recipes). A `VAR=value` on its own is read by the verb that printed it
(or its target's recipe uses it). A `--flag` is one of the printing verb's argparse options, and
`python -m scripts.<verb> ...` names an existing verb with its own options; flags of other programs (git, pip, rm,
docker, hf) are theirs. Used by tests/series/test_advice.py and tests/test_printed_fixes.py.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MAKE_RE = re.compile(r"\bmake ([a-z][a-z-]*)((?:[ \t]+(?:[A-Z][A-Z0-9_]*=[^\s,;)]*|\{\}))*)")
VAR_RE = re.compile(r"(?<![\w./-])([A-Z][A-Z0-9_]+)=")
PY_RE = re.compile(r"\bpython3? -m (scripts\.[\w.]+)([^\n;,()]*)")
OTHER_CMD_RE = re.compile(r"\b(?:git|pip|rm|docker|hf)\b[^\n;,)]*")
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


@cache
def make_variables() -> dict[str, str]:
    """Makefile variable -> its definition (PY ?= python3, VPY := $(VENV)/bin/python)."""
    text = (ROOT / "Makefile").read_text()
    return dict(re.findall(r"^([A-Z][A-Z0-9_]*)\s*[?:]?=[ \t]*(.*)$", text, re.M))


def recipe_uses(recipe: str, var: str) -> bool:
    """The recipe expands $(var), itself or through Makefile variables defined from it."""
    used, todo = set(), [recipe]
    while todo:
        for name in re.findall(r"\$\(([A-Z][A-Z0-9_]*)\)", todo.pop()):
            if name not in used:
                used.add(name)
                todo.append(make_variables().get(name, ""))
    return var in used


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
                     for var in VAR_RE.findall(m.group(2)) if not recipe_uses(recipe, var) and var not in read]
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
                 if var not in env_read(verb) and not recipe_uses(recipe, var)]
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
