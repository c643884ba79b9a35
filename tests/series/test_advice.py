"""Every piece of advice the series verbs print is a command that works as printed (the rules: tests/_advice.py).

Checked on every string in scripts/series (make targets and variables) and on the real output of the failure paths of apply, refresh, check-patches and export (everything). The advice a
conflicting refresh prints (RESUME=1) is then followed, as printed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _releases import OTHER, OTHER_FILENAME, OTHER_REQUIREMENT, OTHER_TAG

from scripts.lib import git
from scripts.series.lint import lint
from scripts.series.patchfile import series_patches
from scripts.series.pin import load_pin
from scripts.series.upstream import git_tree_from_wheel, sha256_file

from _advice import ROOT, advice_problems, closure, rendered_strings

PIN = load_pin()
PATCHES = series_patches(PIN)
SERIES_VERBS = ["scripts.series.apply", "scripts.series.refresh", "scripts.series.check_patches",
                "scripts.series.export", "scripts.series.prove_tests"]


def test_the_checker_catches_the_advice_the_review_found():
    assert advice_problems("Without GitHub: SGLANG_BASE=wheel for make apply", "scripts.series.check_patches") == []
    assert advice_problems("download it yourself and pass --wheel-file", "scripts.series.apply")
    assert advice_problems("make refresh WHEEL_FILE=x SGLANG_WHEEL=y", "scripts.series.refresh") == []
    assert advice_problems("make refresh NO_SUCH_VAR=1", "scripts.series.refresh")
    assert advice_problems("make no-such-target", "scripts.series.refresh")
    assert advice_problems("python -m scripts.series.refresh --no-such-flag", "scripts.series.apply")
    assert advice_problems("git -C x am --continue", "scripts.series.refresh") == []
    assert advice_problems("make lint-docker VENV=/opt/venv", "scripts.host.image") == []  # VPY := $(VENV)/...


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
    # Follow the conflict's advice as printed, porting nothing: the resume refuses, naming every patch the tree
    # lacks (issue 23 item 1: it used to delete them from patches/), and patches/ is untouched.
    resume = re.search(r"^  (python -m scripts\.series\.refresh .*--resume)$", cp.stdout, re.M)
    assert resume, cp.stdout
    before = {f.name: f.read_bytes() for f in patches_copy.iterdir()}
    env = {"SGLANG_PATCHES_CACHE": str(base_cache)}
    refused = subprocess.run([sys.executable, *resume.group(1).split()[1:]], cwd=ROOT, capture_output=True,
                             text=True, env={**os.environ, **env})
    out = failed(refused, "refresh --resume")
    skipped = [r.split()[0] for r in cp.stdout.splitlines() if r.endswith(")") and " conflict " in r]
    assert skipped and all(name in out for name in skipped), out
    assert f"{len(skipped)} patch(es) of the series are not in {dest}" in out, out
    assert {f.name: f.read_bytes() for f in patches_copy.iterdir()} == before
    assert not advice_problems(out, "scripts.series.refresh"), advice_problems(out, "scripts.series.refresh")
    # Dropping them is the explicit act the refusal prints (--drop per patch); followed as printed, it writes.
    drop = re.search(r"^  (python -m scripts\.series\.refresh .*--resume( --drop \S+)+)$", out, re.M)
    assert drop, out
    done = subprocess.run([sys.executable, *drop.group(1).split()[1:]], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **env})
    assert done.returncode == 0, done.stderr
    assert all(f"DROPPED {name}" in done.stderr for name in skipped), done.stderr
    kept = git.out(dest, "log", "--reverse", "--format=%s", f"{OTHER_TAG}..HEAD").splitlines()
    moved = load_pin(patches_copy)
    assert (moved.tag, moved.wheel_sha256) == (OTHER_TAG, sha256_file(other_wheel))
    assert [p.subject for p in series_patches(moved)] == kept and len(kept) == len(PATCHES) - len(skipped) > 0
    assert lint(patches_copy) == []


def test_refresh_takes_the_release_from_the_wheels_metadata(tmp_path, other_wheel):
    """A wheel file is the release its METADATA says, whatever it is called or WHEEL= claims (issue 23 item 7)."""
    claimed = "9.9.9"  # a release the file is not
    renamed = tmp_path / OTHER_FILENAME.replace(f"-{OTHER}-", f"-{claimed}-")
    shutil.copy2(other_wheel, renamed)
    (tmp_path / "text.whl").write_text("not a zip")
    outputs = {
        "claimed release": failed(run("refresh", "--wheel", f"sglang=={claimed}", "--wheel-file", other_wheel),
                                  "refresh"),
        "renamed file": failed(run("refresh", "--wheel", f"sglang=={claimed}", "--wheel-file", renamed), "refresh"),
        "other project": failed(run("refresh", "--wheel", f"vllm=={OTHER}", "--wheel-file", other_wheel), "refresh"),
        "not a wheel": failed(run("refresh", "--wheel-file", tmp_path / "text.whl"), "refresh"),
    }
    outputs["renamed, no WHEEL="] = failed(run("refresh", "--wheel-file", renamed), "refresh")
    assert f"is {OTHER_REQUIREMENT} (its METADATA), not sglang=={claimed}" in outputs["claimed release"]
    assert f"is {OTHER_REQUIREMENT} (its METADATA), not vllm=={OTHER}" in outputs["other project"]
    assert f"make refresh WHEEL_FILE={other_wheel}" in outputs["claimed release"]  # the fix: its real release
    # A file renamed to another release is refused by its name too (the pin records the file name pip looks for).
    for case in ("renamed file", "renamed, no WHEEL="):
        assert f"is {OTHER_REQUIREMENT} (its METADATA), but its name does not say so" in outputs[case], outputs[case]
    assert "not a readable wheel" in outputs["not a wheel"], outputs["not a wheel"]
    problems = [f"{case}: {p}" for case, out in outputs.items() for p in advice_problems(out, "scripts.series.refresh")]
    assert not problems, "\n".join(problems)


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
