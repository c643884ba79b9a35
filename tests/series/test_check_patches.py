"""`make check-patches` (lint + round trip), `make export` and `make refresh` on the tiny world; the lint on the real
series."""

import re
import subprocess
import sys
import tomllib

from conftest import ROOT, World, commit, message, subjects, wheel

from scripts.lib import git
from scripts.series.lint import header_problems, lint
from scripts.series.pin import load_pin, series_patches


def test_the_real_series_passes_the_lint():
    assert lint() == []


def test_round_trip_is_byte_exact_and_a_stale_hunk_fails_it(world):
    cp = world.run("check_patches", SGLANG_BASE="wheel")
    assert cp.returncode == 0 and "byte for byte" in cp.stderr, cp.stdout + cp.stderr
    p = world.patches / world.names[1]
    p.write_text(re.sub(r"^@@ -(\d+),", lambda m: f"@@ -{int(m.group(1)) + 2},", p.read_text(), count=1, flags=re.M))
    cp = world.run("check_patches", SGLANG_BASE="wheel")
    assert cp.returncode == 1 and f"patches/{p.name}" in cp.stdout and "make export" in cp.stdout, cp.stdout


def test_export_names_a_new_commit_from_its_subject(world):
    dest = world.tmp / "sglang"
    assert world.run("apply", "--dest", dest, SGLANG_BASE="wheel").returncode == 0
    commit(dest, {"srt/b.py": "B = 3\n"}, message("srt: b is three"))
    cp = world.run("export", "--tree", dest)
    assert cp.returncode == 0, cp.stderr
    names = (world.patches / "series").read_text().split()
    assert names[-3:] == [*world.names, "srt-b-is-three.patch"]
    assert (world.patches / names[-1]).read_text().split("\ndiff --git")[0].endswith(f"Patch-Filename: {names[-1]}\n")
    assert lint(world.patches) == [] and world.run("apply", "--dest", dest).returncode == 0  # in sync again


def test_the_lint_names_each_problem(world):
    first, second = world.names
    (world.patches / "stray.patch").write_text((world.patches / first).read_text())
    (world.patches / "series").write_text((world.patches / "series").read_text() + f"{first}\nmissing.patch\n")
    text = (world.patches / second).read_text()
    (world.patches / second).write_text(text[: text.index("\n@@ ") + 20])  # cut short inside the first hunk
    problems = "\n".join(lint(world.patches))
    expected = ["stray.patch: not in series", f"{first}: listed twice", "missing.patch: listed in series, but"]
    assert [e for e in [*expected, f"{second}: git apply cannot read it"] if e not in problems] == [], problems


def test_each_header_rule():
    good = message("x", "a reason.").split("\n", 2)[2] + "\nPatch-Filename: x.patch"
    assert header_problems(good, "A <a@example.org>", "x.patch") == []
    for old, new, expect in [
        ("Retire-When: never.\n", "", "no 'Retire-When:' line"),
        ("Forwarded: no", "Forwarded: maybe", "is not no, not-needed or a URL"),
        ("Origin: vendor", "Bug: #1", "Bug: #1 is not a URL"),
        ("Origin: vendor\n", "", "no Bug: <URL> and no Origin:"),
        ("2026-12-01", "2026-13-01", "is not a date YYYY-MM-DD"),
        ("Patch-Filename: x.patch", "Patch-Filename: y.patch", "does not name this file"),
        ("Why:", "Patch-Filename: x.patch\nWhy:", "appears 2 times"),
    ]:
        assert expect in "\n".join(header_problems(good.replace(old, new), "A <a@example.org>", "x.patch")), expect
    moved = good.replace("\nPatch-Filename: x.patch", "").replace("Why:", "Patch-Filename: x.patch\nWhy:")
    assert "not the message's last line" in "\n".join(header_problems(moved, "A <a@example.org>", "x.patch"))
    assert "not a real author" in header_problems(good, "eagle-fast-verify <eagle-fast-verify@localhost>", "x.patch")[0]
    sent = good.replace("Forwarded: no", "Forwarded: https://github.com/o/r/pull/3")
    assert header_problems(sent.replace("Origin: vendor", "Origin: backport, 0123abcd"), "A <a@b.org>", "x.patch") == []


def new_release(world: World, a_text: str) -> None:
    files = {**world.files, "_version.py": "__version__ = version = '0.0.2'\n", "srt/a.py": a_text}
    commit(world.upstream, files, "SGLang 0.0.2")
    git.git(world.upstream, "tag", "v0.0.2")
    wheel(world.tmp / "index", "0.0.2", files)


def test_refresh_stops_in_git_and_write_moves_only_patches(world):
    new_release(world, world.files["srt/a.py"].replace("A10 = 10", "A10 = 'X'"))  # patch 2 conflicts
    tracked = git.status_porcelain(ROOT)
    cp = world.run("refresh", "--to", "v0.0.2", "--dest", world.tmp / "r", SGLANG_REPO=f"file://{world.upstream}")
    assert cp.returncode == 1 and "am --continue" in cp.stdout and "am --skip" in cp.stdout, cp.stdout + cp.stderr
    cp = world.run("refresh", "--to", "v0.0.2", "--dest", world.tmp / "r")
    assert cp.returncode == 2 and "git am is stopped" in cp.stderr
    git.git(world.tmp / "r", "am", "--skip")  # the maintainer drops the conflicting patch
    cp = world.run("refresh", "--to", "v0.0.2", "--dest", world.tmp / "r", "--write")
    assert cp.returncode == 0 and "going on from" in cp.stderr, cp.stderr
    pin = tomllib.loads((world.patches / "pin.toml").read_text())
    assert pin["upstream"]["tag"] == "v0.0.2" and pin["image"]["tag"] == "v0.0.2-cu130"
    assert pin["wheel"]["filename"] == "sglang-0.0.2-py3-none-any.whl"
    assert [p.path.name for p in series_patches(load_pin(world.patches))] == [world.names[0]]
    assert git.status_porcelain(ROOT) == tracked  # nothing outside the patches directory
    assert world.run("check_patches", SGLANG_BASE="wheel").returncode == 0


def test_refresh_clean_then_to_the_pinned_release_and_to_a_missing_one(world):
    new_release(world, world.files["srt/a.py"].replace("A0 = 0", "A0 = 'zero'"))  # far from patch 2's hunk
    cp = world.run("refresh", "--to", "v0.0.2", "--dest", world.tmp / "r", SGLANG_BASE="wheel")
    assert cp.returncode == 0 and "WRITE=1" in cp.stderr, cp.stdout + cp.stderr
    assert subjects(world.tmp / "r") == subjects(world.dev, "v0.0.1")
    cp = world.run("refresh", "--to", "v0.0.1")
    assert cp.returncode == 0 and "already pins v0.0.1" in cp.stderr and "make check-patches" in cp.stderr
    cp = world.run("refresh", "--to", "v0.0.9", SGLANG_BASE="wheel")
    assert cp.returncode == 2 and "no sglang 0.0.9 wheel" in cp.stderr and "pip index versions sglang" in cp.stderr


def test_a_python_below_3_11_is_named_with_the_fix():
    code = "import sys; sys.version_info = (3, 10, 12, 'final', 0); import scripts.series.apply"
    cp = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert cp.returncode == 2 and "needs Python >= 3.11" in cp.stderr and "PY=python3.11" in cp.stderr, cp.stderr
    assert "Traceback" not in cp.stderr


def test_make_clean_keeps_the_venv_and_distclean_removes_it():
    clean, distclean = (
        subprocess.run(["make", "-n", t], cwd=ROOT, capture_output=True, text=True, timeout=60).stdout.split()
        for t in ("clean", "distclean")
    )
    assert ".venv" not in clean and "build/sglang.new" in clean and ".venv" in distclean


def test_the_readme_series_table_is_generated_from_the_patches(tmp_path, monkeypatch):
    """make export writes README.md's table between its markers; the lint names a stale one."""
    from scripts.series import readme

    pin, copy = load_pin(), tmp_path / "README.md"
    copy.write_text(f"intro\n{readme.START}\n| stale |\n{readme.END}\nafter\n")
    monkeypatch.setattr(readme, "README", copy)
    assert readme.readme_problems(pin) and readme.write_readme(pin)
    text = copy.read_text()
    assert readme.readme_problems(pin) == [] and text.startswith("intro\n") and text.endswith("after\n")
    rows = [ln for ln in text.splitlines() if ln.startswith("| ") and ln[2].isdigit()]
    assert len(rows) == len(pin.series()) and "`SGLANG_RECORD_SPEC_COLLECTIVES`" in text
