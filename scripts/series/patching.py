"""Applying the series: to a git checkout (one commit per patch, `git am -3`) or to an installed package (all
patches or none). Used by `make apply`, the image build (site-packages layout), check-patches, refresh and the tests.

Before any file changes, every file the series touches is checked against the blob id the pin records for the
base (and for the patched result, which makes re-applying a no-op). A tree that is neither is refused with the
file, the blob ids and the release it should be.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import tempfile
from pathlib import Path

from ..lib import git
from ..lib.errors import ConflictError, UserError
from ..lib.progress import say
from .patchfile import PatchInfo, restore_hint, series_patches, touched_files
from .pin import NULL_BLOB, Pin
from .record import RECORD_NAME, make_record, patchset_changes, patchset_id, read_record, write_record
from .upstream import add_excludes, read_version


@dataclasses.dataclass
class Layout:
    """Where the sglang package lives: a git checkout (python/sglang) or an installed package (sglang/)."""

    root: Path
    kind: str  # "git" or "site"

    @property
    def pkg_dir(self) -> Path:
        return self.root / "python" / "sglang" if self.kind == "git" else self.root / "sglang"

    def path_of(self, repo_path: str) -> Path:
        if self.kind == "git":
            return self.root / repo_path
        if not repo_path.startswith("python/"):
            raise UserError(f"patch touches {repo_path}, outside python/: it cannot apply to an installed package")
        return self.root / repo_path[len("python/"):]


@dataclasses.dataclass
class State:
    kind: str  # "base", "patched", "mixed"
    mismatches: list[tuple[str, str | None]]  # (repo path, actual blob) not matching base (for mixed)


def classify(layout: Layout, pin: Pin, patches: list[PatchInfo]) -> State:
    files = touched_files(patches)
    missing = [f for f in files if f not in pin.base_blobs or f not in pin.patched_blobs]
    if missing:
        raise UserError(f"the pin lacks blob ids for {', '.join(missing)}: run `make export` to regenerate "
                        f"patches/pin.toml")
    actual = {f: git.file_blob(layout.path_of(f)) or NULL_BLOB for f in files}
    if all(actual[f] == pin.patched_blobs[f] for f in files):
        return State("patched", [])
    if all(actual[f] == pin.base_blobs[f] for f in files):
        return State("base", [])
    return State("mixed", [(f, actual[f]) for f in files if actual[f] != pin.base_blobs[f]])


def wrong_base_message(layout: Layout, pin: Pin, state: State) -> str:
    version = read_version(layout.pkg_dir)
    lines = [f"{layout.root} is not the pinned base {pin.describe()}, so nothing was changed:"]
    for f, blob in state.mismatches[:8]:
        want = pin.base_blobs[f]
        shown = "(missing)" if blob == NULL_BLOB else blob[:12]
        lines.append(f"  {f}: blob {shown}, expected {'(absent)' if want == NULL_BLOB else want[:12]} "
                     f"(SGLang {pin.version})")
    if len(state.mismatches) > 8:
        lines.append(f"  ... and {len(state.mismatches) - 8} more")
    if version and version != pin.version:
        lines.append(f"The tree says it is SGLang {version}; this series is for SGLang {pin.version}.")
    if layout.kind == "site":
        lines.append(f"Fix: install the pinned release there (pip install --no-deps --force-reinstall "
                     f"{pin.wheel_requirement}, with the python that owns {layout.root}) and apply again.")
    else:
        lines.append(f"Fix: check out the tag there (git -C {layout.root} checkout {pin.tag}); a tree holding an older "
                     f"or partial patch set: git -C {layout.root} reset --hard {pin.tag} (drops its commits after the "
                     f"tag); or build a fresh tree from the pinned base: make apply REBUILD=1 (build/sglang).")
    return "\n".join(lines)


def _preflight(layout: Layout, pin: Pin, patches: list[PatchInfo], base: dict) -> bool:
    """True when the tree already holds the series (its record written if missing); raise on a mixed tree."""
    state = classify(layout, pin, patches)
    if state.kind == "mixed":
        raise UserError(wrong_base_message(layout, pin, state))
    if state.kind != "patched":
        return False
    where = layout.pkg_dir if layout.kind == "site" else layout.root
    rec = read_record(layout.pkg_dir)
    if rec is not None and rec.get("patchset") != patchset_id(patches):
        what = f"patch set {rec.get('patchset')}; patches/ is {patchset_id(patches)} ({patchset_changes(rec, patches)})"
        if layout.kind == "git":
            raise UserError(f"{where} holds the files of this series, but its commits come from another {what}; "
                            f"nothing was changed. Apply the series again from the base: git -C {where} reset --hard "
                            f"{pin.tag} (drops its commits after the tag), then make apply SGLANG_SRC={where}")
        say(f"{where} holds the files of this series, applied from {what}: only its record changes")
        rec = None
    if rec is None:
        write_record(layout.pkg_dir, make_record(pin, patches, layout.kind, base))
    say(f"{where} already has the {len(patches)} patches of this series; nothing to do")
    return True


def _check_result(layout: Layout, pin: Pin, patches: list[PatchInfo]) -> None:
    if classify(layout, pin, patches).kind != "patched":
        raise UserError("the series applied but the result differs from the blob ids in patches/pin.toml "
                        "(patches and pin out of sync): run `make export` or `make check-patches`")


# ---------------------------------------------------------------------------------------------------------------
# git checkout layout: one commit per patch, `git am -3`


def am_failure(repo: Path, patches: list[PatchInfo], output: str) -> tuple[PatchInfo | None, list[str]]:
    """After a failed `git am`: the patch it stopped at and the files in conflict."""
    apply_dir = Path(git.out(repo, "rev-parse", "--git-path", "rebase-apply"))
    if not apply_dir.is_absolute():
        apply_dir = repo / apply_dir
    failed = None
    nxt = apply_dir / "next"
    if nxt.is_file():
        i = int(nxt.read_text().strip()) - 1
        if 0 <= i < len(patches):
            failed = patches[i]
    files = git.git(repo, "diff", "--name-only", "--diff-filter=U", check=False).stdout.split()
    if not files:
        files = sorted(set(re.findall(r"(?:Merge conflict in|patch failed:) (\S+?)(?::\d+)?$", output, re.M)))
    if not files and failed:
        files = list(failed.files)
    return failed, files


def without_am_advice(output: str) -> str:
    """git am's output less its advice to continue, skip, abort or show the patch: the tool has already rolled
    back, so none of those commands applies any more."""
    return "\n".join(line for line in output.strip().splitlines()
                     if not re.search(r"git am --|^hint: |^Disable this message", line))


def _misfit(failed: PatchInfo | None, tree: Path, files: list[str], pin: Pin) -> str:
    name = failed.path.name if failed else "(unknown patch)"
    return (f"patch {name} does not apply to {tree}: conflict in {', '.join(files) or '(see git output)'}. The "
            f"files it changes were checked to be the pinned base {pin.tag} before applying, so the patch no longer "
            f"fits the code it was exported from: it was edited or damaged since.")


def _fix_misfit(failed: PatchInfo | None) -> str:
    restore = restore_hint(failed.path) if failed else "git checkout -- patches/ (the committed series)"
    return f"Restore the patch: {restore}; make check-patches then checks the series."


def _require_clean_checkout(repo: Path, pin: Pin) -> None:
    if not git.is_repo(repo):
        raise UserError(f"{repo} is not the top of a git checkout. Clone SGLang {pin.tag} "
                        f"(git clone --branch {pin.tag} {pin.repository}) or run `make apply` without SGLANG_SRC.")
    add_excludes(repo)
    dirty = git.status_porcelain(repo)
    if dirty:
        shown = "\n  ".join(dirty.splitlines()[:10])
        raise UserError(f"{repo} has uncommitted changes, so nothing was applied:\n  {shown}\n"
                        f"Commit or stash them (git -C {repo} stash -u), or start from a clean checkout of {pin.tag}.")


def apply_git(repo: Path, pin: Pin, base: dict | None = None, scratch: bool = False,
              patches: list[PatchInfo] | None = None) -> str:
    """Apply the series to a clean git checkout at the pinned base. Returns 'applied' or 'already'.
    scratch: the tree is the caller's to throw away on failure (a conflict's message then says nothing about it).
    patches: the series as the caller parsed it (default: parsed here); a corrupt patch is refused before the tree
    is touched either way."""
    git.require_git()
    repo = Path(repo).resolve()
    patches = patches if patches is not None else series_patches(pin)
    _require_clean_checkout(repo, pin)
    layout = Layout(repo, "git")
    if _preflight(layout, pin, patches, base or {"source": "checkout"}):
        return "already"
    orig = git.head(repo)
    say(f"applying {len(patches)} patches to {repo} with git am -3")
    for i, p in enumerate(patches, 1):
        say(f"  [{i}/{len(patches)}] {p.path.name}: {p.subject}")
    res = git.git(repo, "am", "-3", "--no-gpg-sign", *[str(p.path) for p in patches], check=False)
    if not res.ok:
        failed, files = am_failure(repo, patches, res.output)
        git.git(repo, "am", "--abort", check=False)
        git.git(repo, "reset", "-q", "--hard", orig, check=False)
        rolled_back = "" if scratch else f"The tree is back at {orig[:12]}, unchanged. "
        raise ConflictError(
            f"{_misfit(failed, repo, files, pin)}\n{rolled_back}{_fix_misfit(failed)}\n"
            f"--- git am said (its advice on how to go on is left out: the tool has already rolled back):\n"
            f"{without_am_advice(res.output)[-2000:]}")
    _check_result(layout, pin, patches)
    rec = make_record(pin, patches, "git", base or {"source": "checkout", "commit": orig}, head=git.head(repo))
    write_record(layout.pkg_dir, rec)
    say(f"applied {len(patches)} patches; HEAD is {rec['head'][:12]}; record in {layout.pkg_dir / RECORD_NAME}")
    return "applied"


# ---------------------------------------------------------------------------------------------------------------
# installed-package layout (site-packages): all patches or none


def _stage(layout: Layout, pin: Pin, patches: list[PatchInfo], stage: Path) -> Layout:
    """The touched files copied to a scratch git tree and patched there; UserError/ConflictError if they do not fit."""
    stage.mkdir()
    git.git(stage, "init", "-q")
    files = touched_files(patches)
    for f in files:
        src = layout.path_of(f)
        if src.is_file():
            (stage / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, stage / f)
    for i, p in enumerate(patches, 1):
        say(f"  [{i}/{len(patches)}] {p.path.name}: {p.subject}")
        res = git.git(stage, "apply", "--whitespace=nowarn", str(p.path), check=False)
        if not res.ok:
            bad = sorted(set(re.findall(r"patch failed: (\S+?):\d+", res.stderr))) or list(p.files)
            raise ConflictError(f"{_misfit(p, layout.root, bad, pin)}\nNothing was changed there. {_fix_misfit(p)}\n"
                                f"--- git apply said:\n{res.stderr.strip()[-2000:]}")
    staged = Layout(stage, "git")
    for f in files:
        if (git.file_blob(staged.path_of(f)) or NULL_BLOB) != pin.patched_blobs[f]:
            raise UserError(f"staged result for {f} differs from patches/pin.toml; nothing was changed "
                            f"(patches and pin out of sync: run make export)")
    return staged


def _install(layout: Layout, staged: Layout, files: list[str], backup: Path, rec: dict) -> None:
    """Move the staged files into place and write the record; on any failure put every file back."""
    done: list[tuple[Path, Path | None]] = []
    try:
        for f in files:
            dest, new = layout.path_of(f), staged.path_of(f)
            saved = None
            if dest.exists():
                saved = backup / f
                saved.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(dest, saved)
            if new.exists():
                dest.parent.mkdir(parents=True, exist_ok=True)
                tmpdest = dest.with_name(dest.name + ".eagle-new")
                shutil.copy2(new, tmpdest)
                os.replace(tmpdest, dest)
            else:
                dest.unlink()
            done.append((dest, saved))
            _drop_bytecode(dest)
        write_record(layout.pkg_dir, rec)
    except BaseException:
        for dest, saved in reversed(done):
            if saved is not None:
                shutil.copy2(saved, dest)
            elif dest.exists():
                dest.unlink()
        raise


def apply_site(site: Path, pin: Pin, patches: list[PatchInfo] | None = None) -> str:
    """Apply the series (as the caller parsed it, by default parsed here) to an installed package (site/sglang).
    Atomic: all patches or none."""
    git.require_git()
    site = Path(site).resolve()
    layout = Layout(site, "site")
    if not (layout.pkg_dir / "__init__.py").is_file():
        raise UserError(f"{site} holds no sglang package (no {layout.pkg_dir / '__init__.py'}); pass the directory "
                        f"that contains sglang/, e.g. .../site-packages")
    patches = patches if patches is not None else series_patches(pin)
    if _preflight(layout, pin, patches, {"source": "site-packages"}):
        return "already"
    with tempfile.TemporaryDirectory(prefix="eagle-apply-") as tmp:
        staged = _stage(layout, pin, patches, Path(tmp) / "stage")
        rec = make_record(pin, patches, "site", {"source": "site-packages"})
        _install(layout, staged, touched_files(patches), Path(tmp) / "backup", rec)
    say(f"applied {len(patches)} patches to {layout.pkg_dir}; record in {layout.pkg_dir / RECORD_NAME}")
    return "applied"


def _drop_bytecode(src: Path) -> None:
    cache = src.parent / "__pycache__"
    if cache.is_dir():
        for pyc in cache.glob(src.stem + ".*.pyc"):
            pyc.unlink()
