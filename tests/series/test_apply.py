"""`make apply` and `apply --python` on the tiny world (tests/series/conftest.py), and once on the real pinned wheel;
the one sglang locator (another interpreter's sglang, found without importing it)."""

import os
import shutil
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import ROOT, commit, message, subjects, wheel

import _fake_docker
from scripts.lib import git
from scripts.series import sglang_pkg
from scripts.series.base import pip_download, sha256_file
from scripts.series.pin import applied_patchset, load_pin, patchset_id


def snapshot(tree: Path) -> tuple:
    return git.head(tree), git.status_porcelain(tree), sorted(p.name for p in tree.parent.iterdir())


def test_apply_clones_the_tag_and_applies_with_git_am(world):
    dest = world.tmp / "sglang"
    cp = world.run("apply", "--dest", dest, SGLANG_BASE="clone", SGLANG_REPO=f"file://{world.upstream}")
    assert cp.returncode == 0, cp.stderr
    assert subjects(dest) == ["srt: b is two", "srt: a ten is a word, and c"]
    assert git.out(dest, "rev-parse", "refs/patches/upstream-head") == git.out(world.upstream, "rev-parse", "v0.0.1")
    assert applied_patchset(dest) == patchset_id(load_pin(world.patches).series())
    again = world.run("apply", "--dest", dest)
    assert again.returncode == 0 and "nothing to do" in again.stderr and git.head(dest) == snapshot(dest)[0]


def test_without_github_the_base_is_the_wheel_pip_checks(world):
    """auto falls back to the pinned wheel, which pip downloads with --require-hashes; a wheel of other bytes is
    refused, by pip when it downloads it, by apply when SGLANG_WHEEL names it."""
    dest, nowhere = world.tmp / "sglang", f"file://{world.tmp}/nowhere.git"
    cp = world.run("apply", "--dest", dest, SGLANG_REPO=nowhere)
    assert cp.returncode == 0 and "taking the base from the PyPI wheel" in cp.stderr, cp.stderr
    assert (world.tmp / "cache" / world.wheel.name).is_file() and subjects(dest)[-1] == "srt: a ten is a word, and c"
    other = wheel(world.tmp / "other", "0.0.1", {**world.files, "srt/b.py": "B = 'other'\n"})
    shutil.copy2(other, world.wheel)  # the index now serves other bytes under the pinned name
    shutil.rmtree(world.tmp / "cache")
    cp = world.run("apply", "--dest", world.tmp / "second", SGLANG_REPO=nowhere)
    assert cp.returncode == 2 and "SGLANG_WHEEL=" in cp.stderr and not (world.tmp / "second").exists(), cp.stderr
    cp = world.run("apply", "--dest", world.tmp / "second", SGLANG_WHEEL=str(other))
    assert cp.returncode == 2 and f"sha256 {sha256_file(other)}" in cp.stderr


def test_refusals_leave_the_tree_as_it_was(world):
    """A dirty checkout, another release, a patch that no longer fits: each named with the file, nothing changed."""
    tree = world.checkout()
    (tree / "python/sglang/srt/b.py").write_text("B = 'mine'\n")
    cp = world.run("apply", "--src", tree)
    assert cp.returncode == 2 and "python/sglang/srt/b.py" in cp.stderr and "stash" in cp.stderr
    git.git(tree, "checkout", "-q", "--", ".")
    commit(tree, {"srt/a.py": "A = 'changed'\n", "_version.py": "__version__ = version = '0.0.2'\n"}, "0.0.2")
    before = snapshot(tree)
    cp = world.run("apply", "--src", tree)
    assert cp.returncode == 2 and "python/sglang/srt/a.py" in cp.stderr and "not the pinned base" in cp.stderr
    assert snapshot(tree) == before
    git.git(tree, "reset", "-q", "--hard", "v0.0.1")
    p = world.patches / world.names[1]
    p.write_text(p.read_text().replace(" A9 = 9", " A9 = 'nine'"))  # context the base does not have
    before = snapshot(tree)
    cp = world.run("apply", "--src", tree)
    assert cp.returncode == 3 and world.names[1] in cp.stderr and "python/sglang/srt/a.py" in cp.stderr, cp.stderr
    assert "--continue" not in cp.stderr and f"git checkout -- patches/{world.names[1]}" in cp.stderr
    assert snapshot(tree) == before and not (tree / ".git" / "rebase-apply").exists()


def test_a_changed_series_is_built_again_beside_the_tree(world):
    dest = world.tmp / "sglang"
    assert world.run("apply", "--dest", dest, SGLANG_BASE="wheel").returncode == 0
    commit(dest, {"srt/b.py": "B = 3\n"}, message("srt: b is three"))  # work not exported yet
    cp = world.run("apply", "--dest", dest)
    assert cp.returncode == 2 and "make export" in cp.stderr and subjects(dest)[-1] == "srt: b is three"
    git.git(dest, "reset", "-q", "--hard", "HEAD~1")
    p = world.patches / world.names[0]
    p.write_text(p.read_text().replace("Why: a reason.", "Why: a better reason."))
    bad = world.tmp / "bad"
    shutil.copytree(world.patches, bad)
    (bad / world.names[1]).write_text((bad / world.names[1]).read_text().replace(" A9 = 9", " A9 = 'nine'"))
    before = snapshot(dest)
    cp = world.run("apply", "--dest", dest, "--rebuild", "--patches-dir", bad)
    assert cp.returncode == 3 and f"{dest} was left as it was" in cp.stderr and snapshot(dest) == before
    cp = world.run("apply", "--dest", dest)
    assert cp.returncode == 0 and "building v0.0.1 + the series beside it" in cp.stderr, cp.stderr
    assert "a better reason" in git.out(dest, "log", "--format=%B") and snapshot(dest)[2] == before[2]


def test_ctrl_c_leaves_the_tree_and_names_the_command_that_rebuilds(world, tmp_path):
    dest = world.tmp / "sglang"
    assert world.run("apply", "--dest", dest, SGLANG_BASE="wheel").returncode == 0
    shim = tmp_path / "shim"
    shim.mkdir()
    before = snapshot(dest)
    (shim / "git").write_text(
        f'#!/bin/sh\n[ "$3 $4" = "am -3" ] && touch {shim}/in-am && sleep 60\nexec {shutil.which("git")} "$@"\n'
    )
    (shim / "git").chmod(0o755)
    args = ["--dest", dest, "--rebuild", "--patches-dir", world.patches]
    env = world.env(PATH=f"{shim}:{os.environ['PATH']}")
    p = _fake_docker.interrupted("scripts.series.apply", *args, when=(shim / "in-am").exists, sig=signal.SIGINT, **env)
    seen = p.stderr.read()
    assert p.returncode == 130, seen
    assert f"{dest} was left as it was. To build it, run make apply REBUILD=1 again" in seen, seen
    assert snapshot(dest) == before and "Traceback" not in seen


def test_an_installed_package_becomes_a_git_repository_all_or_nothing(world):
    site = world.tmp / "site"
    with zipfile.ZipFile(world.wheel) as z:
        z.extractall(site)
    env = {"PYTHONPATH": str(site)}
    bad = world.tmp / "bad"
    shutil.copytree(world.patches, bad)
    (bad / world.names[1]).write_text((bad / world.names[1]).read_text().replace(" A9 = 9", " A9 = 'nine'"))
    cp = world.run("apply", "--python", sys.executable, "--patches-dir", bad, **env)
    assert cp.returncode == 3 and not (site / ".git").exists() and not (site / "sglang/srt/c.py").exists()
    assert (site / "sglang/srt/b.py").read_text() == "B = 1\n"
    cp = world.run("apply", "--python", sys.executable, **env)
    assert cp.returncode == 0 and "installed sglang" in cp.stderr, cp.stderr
    assert (site / "sglang/srt/c.py").is_file() and git.status_porcelain(site) == ""
    assert applied_patchset(site / "sglang") == patchset_id(load_pin(world.patches).series())
    again = world.run("apply", "--python", sys.executable, **env)
    assert again.returncode == 0 and "nothing to do" in again.stderr


def test_the_real_series_on_the_real_pinned_wheel_installed(tmp_path):
    """The image's route on the pinned release: the wheel unpacked as pip installs it, apply --python, and the
    patch set read back from git equals patches/."""
    pin = load_pin()
    cached = ROOT / "build" / "cache" / pin.wheel_filename
    if (
        not cached.is_file()
        and not pip_download(pin.wheel_requirement, cached.parent, pin.wheel_sha256, pin.wheel_filename).ok
    ):
        pytest.skip(f"{pin.wheel_filename} is not in build/cache and pip cannot download it")
    site = tmp_path / "site"
    with zipfile.ZipFile(cached) as z:
        z.extractall(site, [n for n in z.namelist() if n.startswith("sglang/")])
    argv = [sys.executable, "-m", "scripts.series.apply", "--python", sys.executable]
    env = {**os.environ, "PYTHONPATH": str(site)}
    cp = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert cp.returncode == 0, cp.stderr
    assert applied_patchset(site / "sglang") == patchset_id() and git.status_porcelain(site) == ""


def test_another_interpreter_is_asked_for_its_sglang_without_importing_it(tmp_path):
    site = tmp_path / "site"
    (site / "sglang").mkdir(parents=True)
    (site / "sglang" / "__init__.py").write_text("raise SystemExit('the locator must not import sglang')\n")
    assert sglang_pkg.find_sglang(sys.executable, env=dict(os.environ, PYTHONPATH=str(site))) == (site / "sglang", "")
    pkg, why = sglang_pkg.find_sglang(str(tmp_path / "no-python"))
    assert pkg is None and "no-python" in why
    pkg, why = sglang_pkg.find_sglang(sys.executable, env=dict(os.environ, PYTHONPATH=str(tmp_path / "none")))
    assert pkg is None and "has no sglang installed" in why
