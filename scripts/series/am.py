"""The series into a git tree with `git am -3`, all patches or none: a checkout of SGLang (python/sglang), or an
installed sglang package whose parent directory is made a git repository first (its pristine files the first
commit, the patches applied with -p2). Every file the series touches must first be the pinned base's blob (the
patches' index lines), so a tree of another release is refused with its files.
"""

import re
import shutil
from pathlib import Path

from ..lib import git
from ..lib.errors import ConflictError, UserError
from ..lib.progress import say
from .pin import NULL_BLOB, UPSTREAM_HEAD, PatchInfo, Pin, applied_patchset, patchset_id

APPLIED = "refs/patches/applied"  # HEAD when the tree last matched patches/ (apply, export): newer commits are work


def check_base(root: Path, prefix: str, pin: Pin, patches: list[PatchInfo], fix: str) -> None:
    """Refuse a tree whose touched files are not the pinned base (nothing is changed); prefix: python/ when root
    holds sglang/ itself."""
    base = {f: pre for p in reversed(patches) for f, (pre, _) in p.files.items()}  # a file's first pre-image
    found = {f: git.file_blob(root / f.removeprefix(prefix)) or NULL_BLOB for f in sorted(base)}
    wrong = [
        f"  {f}: {'absent' if b == NULL_BLOB else 'blob ' + b[:12]}, the base has "
        f"{'none' if base[f] == NULL_BLOB else base[f][:12]}"
        for f, b in found.items()
        if b != base[f]
    ]
    if wrong:
        shown = "\n".join(wrong[:8] + ([f"  ... and {len(wrong) - 8} more"] if len(wrong) > 8 else []))
        raise UserError(
            f"{root} is not the pinned base SGLang {pin.version}, so nothing was changed:\n{shown}\nFix: {fix}"
        )


def dirty(repo: Path) -> None:
    changed = git.status_porcelain(repo, untracked=False)
    if changed:
        shown = "\n  ".join(changed.splitlines()[:10])
        raise UserError(
            f"{repo} has uncommitted changes, so nothing was applied:\n  {shown}\nCommit them, or stash "
            f"them (git -C {repo} stash), and apply again."
        )


def rollback(repo: Path, orig: str) -> None:
    git.git(repo, "am", "--abort", check=False)
    git.git(repo, "reset", "-q", "--hard", orig, check=False)


def am(repo: Path, patches: list[PatchInfo], strip: int = 1) -> None:
    """git am -3 the series onto HEAD, which becomes refs/patches/upstream-head; on a failure or Ctrl-C the tree goes
    back to HEAD, and a ConflictError names the patch, the files and git's words."""
    orig = git.head(repo)
    git.git(repo, "update-ref", UPSTREAM_HEAD, orig)
    say(f"git am -3 of {len(patches)} patches in {repo}")
    try:
        res = git.git(repo, "am", "-3", "--no-gpg-sign", f"-p{strip}", *[str(p.path) for p in patches], check=False)
    except BaseException:
        rollback(repo, orig)
        raise
    if not res.ok:
        at = re.findall(r"Patch failed at (\d+)", res.output)
        name = patches[int(at[0]) - 1].path.name if at and int(at[0]) <= len(patches) else "a patch"
        files = git.git(repo, "diff", "--name-only", "--diff-filter=U", check=False).stdout.split()
        files = files or sorted(set(re.findall(r"patch failed: (\S+?):\d+", res.output)))
        rollback(repo, orig)
        said = "\n".join(ln for ln in res.output.strip().splitlines() if not re.search(r"git am --|^hint: ", ln))
        raise ConflictError(
            f"{name} does not apply to {repo} (conflict in {', '.join(files) or 'see below'}), "
            f"although its files were the pinned base: the patch changed since it was exported. "
            f"{repo} is back as it was. Restore the patch (git checkout -- patches/{name}, or make "
            f"export), then make check-patches.\n--- git am said:\n{said[-2000:]}"
        )
    git.git(repo, "update-ref", APPLIED, "HEAD")
    say(f"applied {len(patches)} patches; HEAD {git.head(repo)[:12]}")


def apply_tree(top: Path, pin: Pin, patches: list[PatchInfo], installed: bool = False) -> str:
    """Apply to a clean checkout at the pinned base (top/python/sglang), or with installed=True to an installed
    package (top/sglang: top becomes a git repository of sglang/, its pristine files the first commit, then git am
    -p2; on a failure the repository goes again). 'already' when it holds this series, else 'applied'."""
    have, want = applied_patchset(top), patchset_id(patches)
    if have == want:
        say(f"{top} already holds this series ({want}); nothing to do")
        return "already"
    fix = (
        f"pip install --no-deps --force-reinstall {pin.wheel_requirement}, with the python that owns {top}"
        if installed
        else f"git -C {top} checkout {pin.tag}, or build a fresh tree: make apply"
    )
    if have is not None or installed and (top / ".git").exists():
        raise UserError(
            f"{top} holds patch set {have or 'none'}, not patches/' {want}, so nothing was applied: "
            + (f"rm -rf {top}/.git; {fix}" if installed else f"git -C {top} reset --hard {UPSTREAM_HEAD}")
        )
    if not installed:
        dirty(top)
    check_base(top, "python/" if installed else "", pin, patches, fix)
    try:
        if installed:
            say(f"making {top} a git repository of sglang/ (its pristine files, the first commit)")
            git.git(top, "init", "-q")
            (top / ".git" / "info" / "exclude").write_text("/*\n!/sglang/\n__pycache__/\n*.pyc\n")  # sglang/ only
            git.git(top, "add", "-A", "sglang")
            git.git(top, "commit", "-q", "-m", f"SGLang {pin.version} as installed", fixed_date=True)
        am(top, patches, strip=2 if installed else 1)
    except BaseException:
        if installed:
            shutil.rmtree(top / ".git", ignore_errors=True)
        raise
    return "applied"
