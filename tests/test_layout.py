"""The shape of scripts/: the verbs' families over a shared layer, and the rules that keep it that way.

- the families stack, every import downward: lib <- series and box (docker, ranks, results, preflight) <- host
  (doctor, serve, image, the GPU tier) <- bench (make bench, bench-sweep) and comm (bench-comm) <- report;
- a verb (`python -m scripts.<family>.<verb>`) imports no other verb: what two share lives in a library module;
- no module imports another's private (_-prefixed) names, nor reaches for them through a module alias;
- no function is longer than 80 lines; only scripts/lib/proc.py imports subprocess;
- every verb's docstring says how to run it and lists its exit status;
- the hidden size is defined once; no code or doc names a path outside the repository;
- no shell script under pipefail pipes into a reader that stops early (head, grep -q);
- scripts/ holds at most 9,500 lines of Python and tests/ at most 10,500, as `ruff format` writes them.
"""

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
# the families by floor, the ground first: a family imports from its own modules and the floors below it only
FLOORS = {
    family: floor
    for floor, families in enumerate(("lib", "series box", "host", "bench comm", "report"))
    for family in families.split()
}
MAX_FUNCTION_LINES = 80
BUDGETS = {"scripts": 9500, "tests": 10500}  # formatted lines of Python: a new feature pays for itself


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(SCRIPTS.rglob("*.py"))}
TREES = {name: ast.parse(p.read_text(), filename=str(p)) for name, p in MODULES.items()}


VERBS = {
    name
    for name, tree in TREES.items()
    if any(isinstance(n, ast.If) and "__main__" in ast.unparse(n.test) for n in tree.body)  # `if __name__ ...`
}


def imports(name: str) -> list[tuple[str, list[str], int]]:
    """(module imported, names taken from it, line) for every import of a module, relative ones resolved."""
    package = name if MODULES[name].name == "__init__.py" else name.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(TREES[name]):
        if isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            out.append((base, [a.name for a in node.names], node.lineno))
    return out


def test_the_families_and_their_verbs():
    verbs = "series.apply series.export series.check_patches series.refresh series.prove_tests host.doctor host.serve "
    verbs += "host.smoke host.image host.gpu_tier host.in_image bench.bench comm.bench_comm report.cost_model "
    assert {v.split(".", 1)[1] for v in VERBS} == set((verbs + "report.receipt report.profile").split())
    assert {n.split(".")[1] for n in MODULES if n.count(".") > 1} == set(FLOORS)
    assert not [n for n in VERBS if n.startswith(("scripts.lib", "scripts.box"))]


def test_the_families_import_downward_only():
    bad = []
    for name in (n for n in MODULES if n.count(".") > 1):
        family = name.split(".")[1]
        for target, _, line in imports(name):
            other = target.split(".")[1] if target.startswith("scripts.") and target.count(".") else family
            if other != family and FLOORS[other] >= FLOORS[family]:
                bad.append(f"{name}:{line} imports {target}")
    assert not bad, "\n".join(bad)


def test_no_verb_imports_another_verb():
    bad = []
    for name in MODULES:
        for target, names, line in imports(name):
            hits = {target} | {f"{target}.{n}" for n in names}
            bad += [f"{name}:{line} imports the verb {v}" for v in hits & VERBS if v != name]
    assert not bad, "\n".join(bad)


def test_no_private_names_across_modules():
    bad = []
    for name, tree in TREES.items():
        aliases = set()
        for target, names, line in imports(name):
            for n in names:
                if n.startswith("_") and not n.startswith("__"):
                    bad.append(f"{name}:{line} imports {target}.{n}")
                if f"{target}.{n}" in MODULES:
                    aliases.add(n)
        for node in ast.walk(tree):
            if isinstance(node, ast.alias) and node.asname and node.name.split(".")[-1] in aliases:
                aliases.add(node.asname)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                bad.append(f"{name}:{node.lineno} uses {node.value.id}.{node.attr}")
    assert not bad, "\n".join(bad)


def test_no_function_over_80_lines():
    functions = [(name, n) for name, tree in TREES.items() for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
    long = [
        f"{name}.{n.name} ({n.end_lineno - n.lineno + 1} lines)"
        for name, n in functions
        if n.end_lineno - n.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, long


def test_one_subprocess_helper():
    users = {name for name in MODULES for target, _, _ in imports(name) if target == "subprocess"}
    assert users == {"scripts.lib.proc"}, users


def test_verbs_document_usage_and_exit_status():
    for name in VERBS:
        doc = ast.get_docstring(TREES[name]) or ""
        assert f"python -m {name}" in doc, name
        assert "Exit status" in doc, f"{name}: the docstring does not list the exit status"


def test_hidden_size_defined_once():
    assigns = [(name, n) for name, tree in TREES.items() for n in ast.walk(tree) if isinstance(n, ast.Assign)]
    defs = [name for name, n in assigns for t in n.targets if isinstance(t, ast.Name) and t.id == "HIDDEN"]
    assert defs == ["scripts.lib.kimi"]


# development-machine prefixes, spelled with character classes so this file does not name them itself
OUTSIDE = re.compile(r"(?<![\w.])(/[w]ork/|/[h]ome/\w|\.\./[s]hared/|/[U]sers/)")


def tracked() -> list[str]:
    return subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()


def test_nothing_names_a_path_outside_the_repository():
    kinds = re.compile(r"(\.(py|md|toml|sh|in|txt|cfg|ini|json|log)|Makefile|Dockerfile|entrypoint|\.ci/run)$")
    docs_and_code = [f for f in tracked() if kinds.search(f) and not f.startswith("tests/fixtures/")]
    bad = []
    for f in docs_and_code:
        for n, line in enumerate((ROOT / f).read_text(errors="replace").splitlines(), 1):
            if OUTSIDE.search(line):
                bad.append(f"{f}:{n}: {line.strip()[:100]}")
    assert not bad, "\n".join(bad)


def test_the_image_verbs_need_nothing_the_upstream_image_lacks():
    """serve, doctor, smoke, gpu_tier, in_image, bench_comm, image and apply run on the upstream image's python3,
    which has no tomlkit: they import (and apply --help runs) with it blocked."""
    verbs = "host.serve host.doctor host.smoke host.gpu_tier host.in_image comm.bench_comm host.image series.apply"
    code = (
        "import sys, importlib; sys.modules['tomlkit'] = None; "
        f"[importlib.import_module('scripts.' + v) for v in {verbs.split()!r}]; "
        "from scripts.series.apply import main; main(['--help'])"
    )
    cp = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, cp.stderr[-2000:]


# a reader that stops before its writer ends (head -N, grep -q/-m) kills the writer with SIGPIPE, which pipefail
# turns into the script's exit status (141): CI once failed after 1 s on `make --version | head -1`
EARLY_READER = re.compile(r"\|\s*(head\b|grep\s+(-\w*\s+)*-\w*[qm])")


def test_no_pipefail_script_pipes_into_a_reader_that_stops_early():
    bad = []
    for f in tracked():
        path = ROOT / f
        if not (f.endswith(".sh") or f in (".ci/run", "docker/entrypoint")) or not path.is_file():
            continue
        text = path.read_text(errors="replace")
        if "pipefail" not in text:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if not line.lstrip().startswith("#") and EARLY_READER.search(line):
                bad.append(f"{f}:{n}: {line.strip()[:100]}")
    assert not bad, "\n".join(bad)


def test_the_line_budgets_hold():
    """Counted as the files are: make test's `ruff format --check` keeps them as ruff format writes them."""
    counts = {d: sum(p.read_bytes().count(b"\n") for p in (ROOT / d).rglob("*.py")) for d in BUDGETS}
    shown = ", ".join(f"{d}/ {n:,} formatted lines of Python (budget {BUDGETS[d]:,})" for d, n in counts.items())
    hint = "delete machinery: what can SGLang, git or docker do instead?"
    assert all(n <= BUDGETS[d] for d, n in counts.items()), f"{shown}: {hint}"
