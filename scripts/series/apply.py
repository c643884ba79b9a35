"""`make apply`: the series applied with `git am -3`, one commit per patch, all patches or none.

  python -m scripts.series.apply [--dest build/sglang] [--rebuild]   the pinned base (a clone of the tag, else the
                                                                     pinned PyPI wheel) + the series
  python -m scripts.series.apply --src DIR                           a clean checkout of the pinned tag
  python -m scripts.series.apply --python PY                         the sglang PY imports (the image: python3): its
                                                                     git checkout, or its installed package
  options: --patches-dir DIR, --source auto|clone|wheel (env SGLANG_BASE); env SGLANG_WHEEL=FILE, SGLANG_REPO=URL

A tree that holds the series is left alone; build/sglang holding another patch set is built again beside itself
(build/sglang.new, swapped in when every patch applied), unless it has commits not in patches/ (make export first).
Exit status: 0 applied or already applied; 2 a problem you can fix (the message says how); 3 a patch does not apply
(the tree is as it was); 130 interrupted (the tree is as it was).
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

from ..lib import git
from ..lib.cli import run
from ..lib.errors import Interrupted, UserError
from ..lib.progress import say
from ..lib.repo import BUILD_DIR
from .am import APPLIED, apply_checkout, apply_installed, dirty
from .base import SOURCES, clone_base, ensure_base, replace_dir
from .pin import UPSTREAM_HEAD, applied_patchset, load_pin, patchset_id, series_patches
from .sglang_pkg import sglang_of


def rev(repo: Path, ref: str) -> str | None:
    return git.git(repo, "rev-parse", "-q", "--verify", ref, check=False).stdout.strip() or None


def build_tree(pin, patches, dest: Path, source: str, rebuild: bool) -> str:
    """build/sglang: left alone when it holds the series, else built beside itself and swapped in on success."""
    new = dest.with_name(dest.name + ".new")
    if new.exists():
        say(f"removing {new}, left by a make apply that did not finish")
        shutil.rmtree(new)
    if dest.exists() and not rebuild:
        if not git.is_repo(dest):
            raise UserError(f"{dest} is not a git checkout: move it away, or replace it: make apply REBUILD=1")
        if git.tag_commit(dest, pin.tag) and not rev(dest, UPSTREAM_HEAD):
            git.git(dest, "update-ref", UPSTREAM_HEAD, f"refs/tags/{pin.tag}")  # a tree made before the ref
        have, want = applied_patchset(dest), patchset_id(patches)
        if have == want:
            say(f"{dest} already holds this series ({want}); nothing to do")
            return "already"
        dirty(dest)
        if git.head(dest) not in (rev(dest, APPLIED), rev(dest, UPSTREAM_HEAD)):
            raise UserError(f"{dest} has commits that are not in patches/: export them (make export), or drop them "
                            f"and build the tree again (make apply REBUILD=1)")
        say(f"{dest} holds patch set {have}, patches/ is {want}: building {pin.tag} + the series beside it")
    again = "make apply REBUILD=1" if rebuild else "make apply"
    kept = f"{dest} was left as it was." if dest.exists() else f"Nothing was written to {dest}."
    try:
        bare, _ = ensure_base(pin, source)
        clone_base(bare, new, pin.tag)
        apply_checkout(new, pin, patches)
    except KeyboardInterrupt:
        shutil.rmtree(new, ignore_errors=True)
        raise Interrupted(f"interrupted; {kept} To build it, run {again} again") from None
    except UserError as e:
        shutil.rmtree(new, ignore_errors=True)
        raise type(e)(f"{e}\n{kept}") from None
    except BaseException:
        shutil.rmtree(new, ignore_errors=True)
        raise
    replace_dir(new, dest)
    say(f"{dest} holds {pin.tag} + the series")
    return "applied"


def apply_python(python: str, pin, patches) -> str:
    """The sglang `python` imports: in a checkout (python/sglang) git am there, else in its installed package."""
    pkg = sglang_of(python).resolve()
    top = git.git(pkg, "rev-parse", "--show-toplevel", check=False).stdout.strip()
    if top and pkg == Path(top).resolve() / "python" / "sglang":
        say(f"{python} imports sglang from the git checkout {top}")
        return apply_checkout(Path(top), pin, patches)
    say(f"{python} imports the installed sglang at {pkg}")
    return apply_installed(pkg.parent, pin, patches)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="scripts.series.apply", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--src", type=Path, help="a clean SGLang checkout of the pinned tag (make apply SGLANG_SRC=)")
    where.add_argument("--python", help="apply to the sglang this interpreter imports")
    ap.add_argument("--dest", type=Path, default=BUILD_DIR / "sglang")
    ap.add_argument("--source", choices=SOURCES, default=os.environ.get("SGLANG_BASE") or "auto")
    ap.add_argument("--patches-dir", type=Path)
    ap.add_argument("--rebuild", action="store_true", help="build --dest again from the base (make apply REBUILD=1)")
    a = ap.parse_args(argv)
    if a.rebuild and (a.src or a.python):
        raise UserError("REBUILD=1 (--rebuild) rebuilds build/sglang (--dest), not SGLANG_SRC or --python: drop one")
    pin = load_pin(a.patches_dir)
    patches = series_patches(pin)
    if a.src:
        if not git.is_repo(a.src.resolve()):
            raise UserError(f"{a.src} is not the top of a git checkout: clone it (git clone --branch {pin.tag} "
                            f"{pin.repository}), or leave SGLANG_SRC out to build build/sglang")
        apply_checkout(a.src.resolve(), pin, patches)
    elif a.python:
        apply_python(a.python, pin, patches)
    else:
        build_tree(pin, patches, a.dest.resolve(), a.source, a.rebuild)
    return 0


if __name__ == "__main__":
    run(main)
