"""`make apply` (scripts/series/apply.py and its library): real git, real wheels, the real CLI in a subprocess.

The wheel fallback, the clone path (against a local "upstream" repository made from the wheel's files), the
idempotent re-apply, the refusals (dirty tree, wrong base from another release's wheel, wrong wheel hash), a conflicting
patch that must leave the tree exactly at the base, and the installed-package layout (all patches or none).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _releases import OTHER

from scripts.lib import git
from scripts.series.record import patchset_id, read_record
from scripts.series.upstream import git_tree_from_wheel, sha256_file, unpack_wheel
from scripts.series.patchfile import series_patches, touched_files
from scripts.series.pin import NULL_BLOB, load_pin

ROOT = Path(__file__).resolve().parents[2]
PIN = load_pin()
PATCHES = series_patches(PIN)


def apply(*args, env=None, cache=None, wheel=None):
    e = {**os.environ, **(env or {})}
    e.pop("SGLANG_BASE", None)
    if cache:
        e["SGLANG_PATCHES_CACHE"] = str(cache)
    if wheel:
        e["SGLANG_WHEEL"] = str(wheel)
    return subprocess.run([sys.executable, "-m", "scripts.series.apply", *map(str, args)], cwd=ROOT, env=e,
                          capture_output=True, text=True)


def blobs(root: Path, layout: str = "git") -> dict:
    pre = "" if layout == "git" else "python/"
    return {f: git.file_blob(root / f[len(pre):]) or NULL_BLOB for f in touched_files(PATCHES)}


def subjects(tree: Path) -> list[str]:
    return git.out(tree, "log", "--reverse", "--format=%s", f"{PIN.tag}..HEAD").splitlines()


@pytest.fixture
def base_clone(tmp_path, upstream) -> Path:
    """A clean checkout of the pinned tag from the local upstream."""
    dest = tmp_path / "checkout"
    git.git(tmp_path, "clone", "-q", "--branch", PIN.tag, str(upstream), str(dest))
    git.git(dest, "checkout", "-q", "-b", "work")
    return dest


def test_apply_from_wheel_builds_the_patched_tree(tmp_path, pinned_wheel):
    dest = tmp_path / "sglang"
    cp = apply("--dest", dest, "--source", "wheel", cache=tmp_path / "cache", wheel=pinned_wheel)
    assert cp.returncode == 0, cp.stderr
    assert subjects(dest) == [p.subject for p in PATCHES]
    base = git.out(dest, "rev-list", "--max-parents=0", "HEAD")
    assert git.out(dest, "rev-parse", f"{PIN.tag}^{{commit}}") == base  # one base commit, tagged
    assert git.status_porcelain(dest) == ""
    assert blobs(dest) == PIN.patched_blobs
    rec = read_record(dest / "python" / "sglang")
    assert rec["patchset"] == patchset_id(PATCHES) and rec["base"]["source"] == "wheel"
    assert rec["base"]["sha256"] == PIN.wheel_sha256
    assert "unpacking" in cp.stderr and f"applied {len(PATCHES)} patches" in cp.stderr  # progress shown


def test_apply_auto_falls_back_to_the_wheel_and_says_so(tmp_path, pinned_wheel):
    dest = tmp_path / "sglang"
    (tmp_path / "cache").mkdir()
    shutil.copy2(pinned_wheel, tmp_path / "cache" / pinned_wheel.name)  # in the wheel cache: no download, no SGLANG_WHEEL
    cp = apply("--dest", dest, cache=tmp_path / "cache",
               env={"SGLANG_REPO": f"file://{tmp_path}/no-such-upstream.git"})
    assert cp.returncode == 0, cp.stderr
    assert "is not reachable" in cp.stderr and "falling back to the pinned PyPI wheel" in cp.stderr
    assert read_record(dest / "python" / "sglang")["base"]["source"] == "wheel"


def test_apply_clone_path_records_the_commit_it_got(tmp_path, upstream):
    dest = tmp_path / "sglang"
    cp = apply("--dest", dest, "--source", "clone", cache=tmp_path / "cache", env={"SGLANG_REPO": f"file://{upstream}"})
    assert cp.returncode == 0, cp.stderr
    tag_commit = git.out(upstream, "rev-parse", f"{PIN.tag}^{{commit}}")
    rec = read_record(dest / "python" / "sglang")
    assert rec["base"] == {**rec["base"], "source": "clone", "commit": tag_commit, "tag": PIN.tag}
    assert tag_commit in cp.stderr
    assert subjects(dest) == [p.subject for p in PATCHES]


def test_apply_is_idempotent(base_clone):
    first = apply("--src", base_clone)
    assert first.returncode == 0, first.stderr
    head = git.out(base_clone, "rev-parse", "HEAD")
    again = apply("--src", base_clone)
    assert again.returncode == 0 and "already has the" in again.stderr
    assert git.out(base_clone, "rev-parse", "HEAD") == head


def test_make_apply_parses_the_series_once(base_clone, monkeypatch, capsys):
    """apply's main parses every patch file once and hands the parsed series down (before: up to three times)."""
    from scripts.series import apply as apply_verb, patchfile

    parsed, parse = [], patchfile.parse_patch
    monkeypatch.setattr(patchfile, "parse_patch", lambda path: parsed.append(path.name) or parse(path))
    assert apply_verb.main(["--src", str(base_clone)]) == 0
    assert sorted(parsed) == sorted(p.path.name for p in PATCHES), parsed
    assert apply_verb.main(["--src", str(base_clone)]) == 0 and "already has the" in capsys.readouterr().err


def test_apply_refuses_a_dirty_tree(base_clone):
    target = base_clone / touched_files(PATCHES)[0]
    target.write_text(target.read_text() + "\n# local edit\n")
    cp = apply("--src", base_clone)
    assert cp.returncode == 2
    assert "uncommitted changes" in cp.stderr and f"git -C {base_clone} stash -u" in cp.stderr
    assert target.read_text().endswith("# local edit\n")
    assert git.out(base_clone, "rev-parse", "HEAD") == git.out(base_clone, "rev-parse", f"{PIN.tag}^{{commit}}")


def _broken_series(tmp_path: Path, index: int) -> Path:
    """A copy of patches/ whose patch `index` no longer matches its file (one context line changed)."""
    d = tmp_path / "patches"
    shutil.copytree(PIN.patches_dir, d)
    p = d / PATCHES[index].path.name
    lines = p.read_text().splitlines(keepends=True)
    i = next(i for i, l in enumerate(lines) if l.startswith("@@"))
    j = next(k for k in range(i + 1, len(lines)) if lines[k].startswith(" ") and lines[k].strip())
    lines[j] = " " + lines[j][1:].rstrip("\n") + "  # not upstream\n"
    p.write_text("".join(lines))
    return d


def test_apply_conflict_aborts_and_names_patch_and_file(tmp_path, base_clone):
    broken = PATCHES[4]
    d = _broken_series(tmp_path, 4)
    head = git.out(base_clone, "rev-parse", "HEAD")
    cp = apply("--src", base_clone, "--patches-dir", d)
    assert cp.returncode == 3, cp.stderr
    assert broken.path.name in cp.stderr
    assert any(f in cp.stderr for f in broken.files)
    assert git.out(base_clone, "rev-parse", "HEAD") == head
    assert git.status_porcelain(base_clone) == ""
    assert not (base_clone / ".git" / "rebase-apply").exists()
    assert blobs(base_clone) == PIN.base_blobs
    for hint in ("--continue", "--skip", "--abort"):  # git am's hints: the tool already rolled back
        assert hint not in cp.stderr, cp.stderr
    assert f"git checkout -- patches/{broken.path.name}" in cp.stderr and "make refresh" not in cp.stderr


def test_apply_refuses_the_wrong_release(tmp_path, other_wheel):
    """A tree of another SGLang release (even one tagged as the pinned one) is refused before any file changes."""
    tree = tmp_path / "old"
    git_tree_from_wheel(other_wheel, tree, PIN.tag, sha256_file(other_wheel))
    before = blobs(tree)
    cp = apply("--src", tree)
    assert cp.returncode == 2
    assert "not the pinned base" in cp.stderr and f"SGLang {PIN.version}" in cp.stderr
    assert f"says it is SGLang {OTHER}" in cp.stderr
    assert any(f in cp.stderr for f in touched_files(PATCHES))
    assert blobs(tree) == before and git.status_porcelain(tree) == ""


def _says_what_the_wheel_is(stderr: str, fake: Path) -> None:
    """The refusal of an SGLANG_WHEEL names the file as found (name, version from its metadata, sha256) and what
    the pin wants; it never tells the operator to delete their own file."""
    assert f"SGLANG_WHEEL={fake}" in stderr and f"sglang {OTHER}" in stderr and sha256_file(fake) in stderr, stderr
    assert "patches/pin.toml" in stderr and PIN.wheel_filename in stderr and PIN.wheel_sha256 in stderr, stderr
    assert "delete" not in stderr.lower(), stderr


def test_apply_refuses_a_wheel_with_the_wrong_hash(tmp_path, other_wheel):
    fake = tmp_path / PIN.wheel_filename
    shutil.copy2(other_wheel, fake)  # right name, wrong contents
    cp = apply("--dest", tmp_path / "sglang", "--source", "wheel", cache=tmp_path / "cache", wheel=fake)
    assert cp.returncode == 2
    _says_what_the_wheel_is(cp.stderr, fake)
    assert not (tmp_path / "sglang").exists()


def test_a_wrong_sglang_wheel_is_refused_even_with_a_base_cache(tmp_path, pinned_wheel, other_wheel):
    """SGLANG_WHEEL is an explicit input: checked against the pin even when the base cache exists (it used to be
    ignored then), and never silently traded for a clone."""
    cache = tmp_path / "cache"
    assert apply("--dest", tmp_path / "first", "--source", "wheel", cache=cache, wheel=pinned_wheel).returncode == 0
    fake = tmp_path / "mine" / PIN.wheel_filename
    fake.parent.mkdir()
    shutil.copy2(other_wheel, fake)
    for source in (["--source", "wheel"], []):
        cp = apply("--dest", tmp_path / "second", *source, cache=cache, wheel=fake)
        assert cp.returncode == 2, cp.stderr
        _says_what_the_wheel_is(cp.stderr, fake)
        assert not (tmp_path / "second").exists() and fake.is_file()
    cp = apply("--dest", tmp_path / "second", "--source", "clone", cache=cache, wheel=pinned_wheel)
    assert cp.returncode == 2 and "SGLANG_WHEEL" in cp.stderr and "SGLANG_BASE=clone" in cp.stderr, cp.stderr
    cp = apply("--dest", tmp_path / "second", cache=cache, wheel=pinned_wheel)  # the right wheel and a cache: fine
    assert cp.returncode == 0, cp.stderr


@pytest.fixture
def site(tmp_path, pinned_wheel) -> Path:
    """The installed-package layout (what the image patches): the wheel unpacked like pip does."""
    d = tmp_path / "site-packages"
    unpack_wheel(pinned_wheel, d, only=None)
    return d


def test_apply_site_packages_layout(site):
    cp = apply("--site-packages", site)
    assert cp.returncode == 0, cp.stderr
    assert blobs(site, "site") == PIN.patched_blobs
    rec = read_record(site / "sglang")
    assert rec["layout"] == "site" and rec["patchset"] == patchset_id(PATCHES)
    assert [p["file"] for p in rec["patches"]] == [p.path.name for p in PATCHES]
    again = apply("--site-packages", site)
    assert again.returncode == 0 and "already has the" in again.stderr


def test_apply_site_packages_is_all_or_nothing(tmp_path, site):
    d = _broken_series(tmp_path, len(PATCHES) - 1)  # the last patch fails after the others staged fine
    before = blobs(site, "site")
    cp = apply("--site-packages", site, "--patches-dir", d)
    assert cp.returncode == 3 and PATCHES[-1].path.name in cp.stderr and "Nothing was changed" in cp.stderr
    assert blobs(site, "site") == before == PIN.base_blobs
    assert read_record(site / "sglang") is None
    assert not list(site.rglob("*.eagle-new"))


def test_apply_site_packages_refuses_the_wrong_release(tmp_path, other_wheel):
    d = tmp_path / "old-site"
    unpack_wheel(other_wheel, d, only=None)
    cp = apply("--site-packages", d)
    assert cp.returncode == 2 and f"SGLang {OTHER}" in cp.stderr
    assert read_record(d / "sglang") is None


def _snapshot(tree: Path) -> tuple:
    """What a failed rebuild must not change: HEAD, the record, the tracked files' blobs, a clean status."""
    return git.head(tree), read_record(tree / "python" / "sglang"), blobs(tree), git.status_porcelain(tree)


def test_a_failed_rebuild_leaves_the_old_tree_and_the_base_cache(tmp_path, pinned_wheel):
    """make apply REBUILD=1 builds beside the old tree and swaps only on success: a clone that cannot reach
    GitHub or a patch that does not apply leaves build/sglang and the base cache exactly as they were."""
    dest, cache = tmp_path / "sglang", tmp_path / "cache"
    assert apply("--dest", dest, "--source", "wheel", cache=cache, wheel=pinned_wheel).returncode == 0
    before = _snapshot(dest)
    bare = cache / f"sglang-{PIN.tag}.git"
    cached = sorted(p.name for p in bare.iterdir())
    no_github = {"SGLANG_REPO": f"file://{tmp_path}/no-such-upstream.git"}
    cp = apply("--dest", dest, "--rebuild", "--source", "clone", cache=cache, env=no_github)
    assert cp.returncode == 2, cp.stderr
    assert _snapshot(dest) == before and f"{dest} was left as it was" in cp.stderr
    assert sorted(p.name for p in bare.iterdir()) == cached  # the wheel-built base cache survives
    cp = apply("--dest", dest, "--rebuild", "--patches-dir", _broken_series(tmp_path, 4), cache=cache)
    assert cp.returncode == 3, cp.stderr
    assert _snapshot(dest) == before and f"{dest} was left as it was" in cp.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "patches", "sglang"]  # no .new / .old left
    cp = apply("--dest", dest, "--rebuild", cache=cache)
    assert cp.returncode == 0, cp.stderr
    assert subjects(dest) == [p.subject for p in PATCHES] and git.status_porcelain(dest) == ""
    assert read_record(dest / "python" / "sglang")["applied_at"] >= before[1]["applied_at"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "patches", "sglang"]


def test_a_failed_first_build_leaves_no_tree(tmp_path, pinned_wheel):
    """Without a tree yet, a patch that does not apply leaves nothing behind (not a bare base tree that the next
    make apply would take for the user's)."""
    dest = tmp_path / "sglang"
    cp = apply("--dest", dest, "--source", "wheel", "--patches-dir", _broken_series(tmp_path, 4),
               cache=tmp_path / "cache", wheel=pinned_wheel)
    assert cp.returncode == 3, cp.stderr
    assert not dest.exists() and not (tmp_path / "sglang.new").exists()


def _truncated_series(tmp_path: Path, index: int) -> Path:
    """A copy of patches/ whose patch `index` lost its last lines (as a copy cut short would)."""
    d = tmp_path / "truncated"
    shutil.copytree(PIN.patches_dir, d)
    p = d / PATCHES[index].path.name
    p.write_text("".join(p.read_text().splitlines(keepends=True)[:-3]))
    return d


def test_apply_refuses_a_corrupt_patch_before_touching_the_tree(tmp_path, base_clone):
    """A truncated patch is named as corrupt (file, line, how to restore it), before any tree is touched: not a
    conflict, no pointer to refresh."""
    name = PATCHES[3].path.name
    exclude = (base_clone / ".git" / "info" / "exclude").read_text()
    head = git.head(base_clone)
    cp = apply("--src", base_clone, "--patches-dir", _truncated_series(tmp_path, 3))
    assert cp.returncode == 2, cp.stderr
    assert f"corrupt patch {name}, line " in cp.stderr and f"git checkout -- patches/{name}" in cp.stderr
    assert "conflict" not in cp.stderr and "refresh" not in cp.stderr
    assert git.head(base_clone) == head and git.status_porcelain(base_clone) == ""
    assert (base_clone / ".git" / "info" / "exclude").read_text() == exclude


def test_apply_on_a_patched_tree_compares_the_recorded_patch_set(tmp_path, pinned_wheel):
    """make apply on build/sglang compares the tree's record with patches/: a corrupt patch is reported (not
    "nothing to do"), and a series whose patches changed (here one message) is built again."""
    dest, cache = tmp_path / "sglang", tmp_path / "cache"
    assert apply("--dest", dest, "--source", "wheel", cache=cache, wheel=pinned_wheel).returncode == 0
    head = git.head(dest)
    cp = apply("--dest", dest, "--patches-dir", _truncated_series(tmp_path, 6), cache=cache)
    assert cp.returncode == 2 and f"corrupt patch {PATCHES[6].path.name}, line " in cp.stderr, cp.stderr
    assert "nothing to do" not in cp.stderr and git.head(dest) == head
    changed = tmp_path / "reworded"
    shutil.copytree(PIN.patches_dir, changed)
    p = changed / PATCHES[2].path.name
    p.write_text(p.read_text().replace("\nWhy: ", "\nWhy: (reworded) ", 1))
    cp = apply("--dest", dest, "--patches-dir", changed, cache=cache)
    assert cp.returncode == 0, cp.stderr
    assert "nothing to do" not in cp.stderr and PATCHES[2].path.name in cp.stderr  # says what changed
    rec = read_record(dest / "python" / "sglang")
    assert rec["patchset"] == patchset_id(series_patches(load_pin(changed)))
    assert "(reworded)" in git.out(dest, "log", "--format=%B", f"{PIN.tag}..HEAD")


def test_an_interrupted_apply_says_so_and_the_next_one_cleans_up(tmp_path, pinned_wheel):
    """Ctrl-C (SIGINT to the group, as a terminal sends it) while the base is unpacked: apply's own message, not
    git's, nothing written; a build/sglang.new left by a killed apply is removed by the next one, also when that
    one has nothing to do (issue 23 item 10)."""
    import signal

    dest, cache = tmp_path / "sglang", tmp_path / "cache"
    e = {**os.environ, "SGLANG_PATCHES_CACHE": str(cache), "SGLANG_WHEEL": str(pinned_wheel)}
    e.pop("SGLANG_BASE", None)
    p = subprocess.Popen([sys.executable, "-m", "scripts.series.apply", "--dest", str(dest), "--source", "wheel"],
                         cwd=ROOT, env=e, stderr=subprocess.PIPE, text=True, start_new_session=True)
    seen = ""
    for line in p.stderr:
        seen += line
        if "unpacking" in line or "committing the base tree" in line:
            os.killpg(p.pid, signal.SIGINT)
            break
    seen += p.stderr.read()
    assert p.wait(120) == 130, seen
    assert f"interrupted; Nothing was written to {dest}. Run make apply again" in seen, seen
    assert "fatal:" not in seen and "retry with" not in seen and "Traceback" not in seen
    assert not dest.exists() and not dest.with_name("sglang.new").exists()
    assert apply("--dest", dest, cache=cache, wheel=pinned_wheel).returncode == 0
    left = dest.with_name("sglang.new")
    (left / "python").mkdir(parents=True)
    cp = apply("--dest", dest, cache=cache, wheel=pinned_wheel)
    assert cp.returncode == 0 and f"removing {left}, left by a make apply that did not finish" in cp.stderr
    assert not left.exists() and "nothing to do" in cp.stderr


def test_make_clean_removes_what_a_killed_apply_left():
    cp = subprocess.run(["make", "-n", "clean"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0 and "build/sglang.new" in cp.stdout.split(), cp.stdout
