"""`make check-patches` (lint + round trip), `make export` and `make refresh`, on copies of the real series."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _releases import OTHER_REQUIREMENT, OTHER_TAG

from scripts.series.lint import lint
from scripts.lib import git
from scripts.series.patchfile import series_patches
from scripts.series.pin import load_pin

ROOT = Path(__file__).resolve().parents[2]
AUTHOR = "Test Author <test.author@example.org>"
HEADERS = ("Forwarded: not-needed\nOrigin: vendor\n"
           "Last-Update: 2026-01-01\nRetire-When: never")
PIN = load_pin()
PATCHES = series_patches(PIN)


def run(verb, *args, cache, wheel=None):  # cache: base_cache unless a test needs its own
    env = {**os.environ, "SGLANG_PATCHES_CACHE": str(cache), "SGLANG_BASE": "wheel"}
    if wheel:
        env["SGLANG_WHEEL"] = str(wheel)
    return subprocess.run([sys.executable, "-m", f"scripts.series.{verb}", *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True)


@pytest.fixture
def patches(tmp_path) -> Path:
    d = tmp_path / "patches"
    shutil.copytree(PIN.patches_dir, d)
    return d


def test_lint_accepts_the_series():
    assert lint() == []


def test_lint_finds_every_kind_of_problem(patches):
    first, second = PATCHES[0].path.name, PATCHES[1].path.name
    (patches / "stray.patch").write_text((patches / first).read_text())          # not in the series
    series = patches / PIN.series_file
    series.write_text(series.read_text() + f"{first}\nmissing.patch\n")          # listed twice; missing file
    p = patches / second
    p.write_text(re.sub(r"^Retire-When:.*\n", "", p.read_text(), flags=re.M)     # header line removed
                 .replace("From: ", "Date: Mon, 1 Jan 2026 00:00:00 +0000\nFrom: ", 1))  # unstable export
    problems = "\n".join(lint(patches))
    assert "stray.patch is not in the series" in problems
    assert f"series lists {first} more than once" in problems
    assert "series lists missing.patch, which does not exist" in problems
    assert f"{second}: message lacks the header line 'Retire-When:" in problems
    assert f"{second}: has a Date header" in problems


def test_lint_finds_pin_blobs_out_of_sync(patches):
    pin = patches / "pin.toml"
    some = next(iter(PIN.base_blobs.values()))
    pin.write_text(pin.read_text().replace(some, "f" * 40, 1))
    assert any("[base_blobs] disagrees" in p for p in lint(patches))


def test_check_patches_round_trip_is_byte_exact(tmp_path, base_cache, pinned_wheel):
    cp = run("check_patches", cache=base_cache, wheel=pinned_wheel)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "byte for byte" in cp.stderr


def test_check_patches_fails_on_a_stale_patch(tmp_path, base_cache, patches, pinned_wheel):
    """A hunk header that is off by a few lines still applies, but the re-export differs: check-patches fails."""
    p = patches / PATCHES[0].path.name
    text = p.read_text()
    m = re.search(r"^@@ -(\d+),", text, re.M)
    p.write_text(text[:m.start(1)] + str(int(m.group(1)) + 3) + text[m.end(1):])
    assert lint(patches) == []
    cp = run("check_patches", "--patches-dir", patches, cache=base_cache, wheel=pinned_wheel)
    assert cp.returncode == 1
    assert f"patches/{p.name}" in cp.stdout and "run make export" in cp.stdout


def test_export_regenerates_the_series_from_commits(tmp_path, base_cache, patches, pinned_wheel):
    """Apply, add a commit, export: one more patch, at the end of the series, blobs in the pin updated."""
    tree = tmp_path / "sglang"
    assert run("apply", "--dest", tree, "--patches-dir", patches, cache=base_cache,
               wheel=pinned_wheel).returncode == 0
    f = tree / "python/sglang/srt/environ.py"
    f.write_text(f.read_text() + "\n")
    git.git(tree, "commit", "-qam", "environ: trailing newline\n\nWhy: test\n\nMeasured: -\n\n" + HEADERS,
            "--author", AUTHOR)
    cp = run("export", "--tree", tree, "--patches-dir", patches, cache=base_cache)
    assert cp.returncode == 0, cp.stderr
    names = [p.name for p in load_pin(patches).series()]
    assert names[:-1] == [p.path.name for p in PATCHES]
    assert names[-1] == "environ-trailing-newline.patch"
    new_pin = load_pin(patches)
    assert new_pin.patched_blobs["python/sglang/srt/environ.py"] == git.file_blob(f)
    assert lint(patches) == []


def test_refresh_reports_each_patch(tmp_path, base_cache, other_wheel):
    """Moving the series to another release reports clean / 3-way / conflict per patch (tests/_releases.py's other
    release as the target: the only way to another base here)."""
    dest = tmp_path / "refresh"
    cp = run("refresh", "--wheel", OTHER_REQUIREMENT, "--wheel-file", other_wheel, "--dest", dest,
             cache=base_cache)
    rows = re.findall(r"^  (\S+\.patch)\s+(clean|3-way|conflict)", cp.stdout, re.M)
    assert [r[0] for r in rows] == [p.path.name for p in PATCHES]
    statuses = {s for _, s in rows}
    assert statuses <= {"clean", "3-way", "conflict"}
    assert cp.returncode == (1 if "conflict" in statuses else 0)
    applied = git.out(dest, "log", "--format=%s", f"{OTHER_TAG}..HEAD").splitlines()
    assert len(applied) == sum(s != "conflict" for _, s in rows)
    assert git.status_porcelain(dest) == ""


def test_refresh_to_the_same_release_is_clean(tmp_path, base_cache, pinned_wheel, patches):
    cp = run("refresh", "--wheel", PIN.wheel_requirement, "--wheel-file", pinned_wheel, "--dest", tmp_path / "r",
             "--patches-dir", patches, "--write", cache=base_cache)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert all(s == "clean" for s in re.findall(r"\.patch\s+(\S+)", cp.stdout))
    # what a person must move is listed: the requirements, and the files that still name the release (found, not
    # kept by hand): a claim about what the release requires, never a record of what ran on it
    left = cp.stdout.split("not moved (read the new release for these):\n", 1)[1]
    assert "requirements/test.in" in left and "[nccl]" in left and "[image] digest" in left, left
    named = left.split(f"files that still name {PIN.version} ", 1)[1]
    assert "requirements/README.md" in named and "bench/results" not in named and "tests/fixtures" not in named
    for f in PIN.patches_dir.iterdir():  # --write re-exports the identical series
        assert (patches / f.name).read_bytes() == f.read_bytes(), f.name


def _cut(path: Path, keep: int, partial: str = "") -> int:
    """Truncate a patch file to its first `keep` lines (plus `partial`, a line cut off mid-way); its line count."""
    lines = path.read_text().splitlines(keepends=True)[:keep]
    path.write_text("".join(lines) + partial)
    return keep + (1 if partial else 0)


def test_lint_reports_a_corrupt_patch_with_its_line(patches):
    """A truncated patch, a hunk that lost a line, a file cut mid-line (git apply's reading) and mail headers
    without a subject (git mailinfo's) are each "corrupt patch <file>, line N" with the way to restore it; the
    other patches are not blamed."""
    names = [p.path.name for p in PATCHES]
    end = _cut(patches / names[0], len((patches / names[0]).read_text().splitlines()) - 3)
    lines = (patches / names[1]).read_text().splitlines(keepends=True)
    hunk = next(i for i, line in enumerate(lines) if line.startswith("@@"))
    gone = next(i for i in range(hunk + 1, len(lines)) if lines[i].startswith("+"))
    (patches / names[1]).write_text("".join(lines[:gone] + lines[gone + 1:]))
    diff = next(i for i, line in enumerate((patches / names[2]).read_text().splitlines())
                if line.startswith("diff --git "))
    partial = _cut(patches / names[2], diff + 10, partial="    half a li")  # cut mid-line inside the first hunk
    mail = (patches / names[3]).read_text()
    (patches / names[3]).write_text(re.sub(r"^Subject: .*\n", "", mail, count=1, flags=re.M))
    blank = (patches / names[3]).read_text().splitlines().index("") + 1
    problems = lint(patches)
    for name, line, what in ((names[0], end, "the file is truncated"), (names[1], r"\d+", f"the hunk before it starts "
                             f"at line {hunk + 1}"), (names[2], partial, "git apply: corrupt patch"),
                             (names[3], blank, "git mailinfo reads no Subject")):
        found = [p for p in problems if re.match(rf"corrupt patch {re.escape(name)}, line {line}: .*{what}", p)]
        assert len(found) == 1, (name, line, problems)
        assert f"git checkout -- patches/{name}" in found[0] and "make export" in found[0], found[0]
    assert not [p for p in problems if any(n in p for n in names[4:])], problems


def test_the_readme_series_table_is_the_series():
    """README.md "The series" lists every patch of patches/series, in its order, and nothing else."""
    section = (ROOT / "README.md").read_text().split("\n## The series\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([^`]+)` \|", section, re.M)
    assert rows == [p.path.stem for p in PATCHES]
