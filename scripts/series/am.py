"""Applying the series to a git tree with `git am -3`, all patches or none: to a checkout of SGLang (python/sglang),
or to an installed sglang package whose parent directory is made a git repository first (its pristine files the
first commit; the patches then apply with -p2). Before any file changes, every file the series touches must be the
pinned base's blob (from the patches' index lines), so a tree of another release is refused with the files.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from ..lib import git
from ..lib.errors import ConflictError, UserError
from ..lib.progress import say
from .pin import NULL_BLOB, UPSTREAM_HEAD, PatchInfo, Pin, applied_patchset, patchset_id, series_blobs, touched_files

APPLIED = "refs/patches/applied"  # HEAD when the tree last matched patches/ (apply, export): newer commits are work
EXCLUDE = "/*\n!/sglang/\n__pycache__/\n*.pyc\n"  # an installed package's repository tracks sglang/ only


def tree_version(root: Path, prefix: str) -> str | None:
    f = root / ("sglang" if prefix else "python/sglang") / "_version.py"
    m = re.search(r"__version__\s*=\s*(?:version\s*=\s*)?['\"]([^'\"]+)", f.read_text()) if f.is_file() else None
    return m.group(1) if m else None


def check_base(root: Path, prefix: str, pin: Pin, patches: list[PatchInfo], fix: str) -> None:
    """Refuse a tree whose touched files are not the pinned base (nothing is changed)."""
    base, _ = series_blobs(patches)
    wrong = [(f, git.file_blob(root / f.removeprefix(prefix)) or NULL_BLOB) for f in touched_files(patches)]
    wrong = [(f, blob) for f, blob in wrong if blob != base[f]]
    if not wrong:
        return
    lines = [f"{root} is not the pinned base SGLang {pin.version}, so nothing was changed:"]
    lines += [f"  {f}: {'absent' if b == NULL_BLOB else 'blob ' + b[:12]}, the base has "
              f"{'none' if base[f] == NULL_BLOB else base[f][:12]}" for f, b in wrong[:8]]
    lines += [f"  ... and {len(wrong) - 8} more"] if len(wrong) > 8 else []
    said = tree_version(root, prefix)
    lines += [f"It says it is SGLang {said}."] if said and said != pin.version else []
    raise UserError("\n".join(lines + [f"Fix: {fix}"]))


def dirty(repo: Path) -> None:
    changed = git.status_porcelain(repo, untracked=False)
    if changed:
        shown = "\n  ".join(changed.splitlines()[:10])
        raise UserError(f"{repo} has uncommitted changes, so nothing was applied:\n  {shown}\nCommit them, or stash "
                        f"them (git -C {repo} stash), and apply again.")


def rollback(repo: Path, orig: str) -> None:
    git.git(repo, "am", "--abort", check=False)
    git.git(repo, "reset", "-q", "--hard", orig, check=False)


def am(repo: Path, pin: Pin, patches: list[PatchInfo], strip: int = 1) -> str:
    """git am -3 the series onto HEAD (refs/patches/upstream-head := HEAD); on failure roll back and raise a
    ConflictError naming the patch, the files and git's words. Returns the new HEAD."""
    orig = git.head(repo)
    git.git(repo, "update-ref", UPSTREAM_HEAD, orig)
    for i, p in enumerate(patches, 1):
        say(f"  [{i}/{len(patches)}] {p.path.name}")
    try:
        res = git.git(repo, "am", "-3", "--no-gpg-sign", f"-p{strip}", *[str(p.path) for p in patches], check=False)
    except BaseException:  # Ctrl-C: the tree goes back as it was
        rollback(repo, orig)
        raise
    if not res.ok:
        at = re.search(r"Patch failed at (\d+)", res.output)
        bad = patches[int(at.group(1)) - 1] if at and int(at.group(1)) <= len(patches) else None
        files = git.git(repo, "diff", "--name-only", "--diff-filter=U", check=False).stdout.split()
        files = files or sorted(set(re.findall(r"patch failed: (\S+?):\d+", res.output)))
        rollback(repo, orig)
        said = "\n".join(ln for ln in res.output.strip().splitlines() if not re.search(r"git am --|^hint: ", ln))
        name = bad.path.name if bad else "a patch"
        raise ConflictError(f"{name} does not apply to {repo} (conflict in {', '.join(files) or 'see below'}), "
                            f"although its files were the pinned base: the patch was changed since it was exported. "
                            f"{repo} is back as it was. Restore the patch (git checkout -- patches/{name}, or make "
                            f"export), then make check-patches.\n--- git am said:\n{said[-2000:]}")
    git.git(repo, "update-ref", APPLIED, "HEAD")
    say(f"applied {len(patches)} patches to {repo} with git am -3 (HEAD {git.head(repo)[:12]})")
    return git.head(repo)


def apply_checkout(repo: Path, pin: Pin, patches: list[PatchInfo]) -> str:
    """Apply to a clean checkout at the pinned base (python/sglang); 'already' when it holds this series."""
    git.require_git()
    have, want = applied_patchset(repo), patchset_id(patches)
    if have == want:
        say(f"{repo} already holds this series ({want}); nothing to do")
        return "already"
    if have is not None:
        raise UserError(f"{repo} holds another patch set ({have}; patches/ is {want}), so nothing was applied. "
                        f"Drop it (git -C {repo} reset --hard {UPSTREAM_HEAD}) and apply again.")
    dirty(repo)
    check_base(repo, "", pin, patches, f"check out {pin.tag} there (git -C {repo} checkout {pin.tag}), or build "
                                       f"a fresh tree: make apply")
    am(repo, pin, patches)
    return "applied"


def apply_installed(site: Path, pin: Pin, patches: list[PatchInfo]) -> str:
    """Apply to an installed package (site/sglang): site becomes a git repository of sglang/ (its pristine files
    first), then git am -p2. All or nothing: on failure the files and the repository are as before."""
    git.require_git()
    have, want = applied_patchset(site / "sglang"), patchset_id(patches)
    if have == want:
        say(f"{site / 'sglang'} already holds this series ({want}); nothing to do")
        return "already"
    if have is not None:
        raise UserError(f"{site / 'sglang'} holds another patch set ({have}; patches/ is {want}): reinstall it "
                        f"(pip install --no-deps --force-reinstall {pin.wheel_requirement}; rm -rf {site}/.git) and "
                        f"apply again")
    if (site / ".git").exists():
        raise UserError(f"{site}/.git exists, but no apply made it: move it away and apply again")
    check_base(site, "python/", pin, patches, f"install the pinned release with the python that owns {site} "
                                              f"(pip install --no-deps --force-reinstall {pin.wheel_requirement})")
    try:
        say(f"making {site} a git repository of sglang/ (its pristine files, the first commit)")
        git.git(site, "init", "-q")
        (site / ".git" / "info" / "exclude").write_text(EXCLUDE)
        git.git(site, "add", "-A", "sglang")
        git.git(site, "commit", "-q", "-m", f"SGLang {pin.version} as installed", fixed_date=True)
        am(site, pin, patches, strip=2)
    except BaseException:
        shutil.rmtree(site / ".git", ignore_errors=True)
        raise
    return "applied"
