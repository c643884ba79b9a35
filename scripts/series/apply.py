"""`make apply`: the series applied with `git am -3`, one commit per patch, all patches or none.

  python -m scripts.series.apply [--dest build/sglang] [--rebuild]   the pinned base (clone, else wheel) + series
  python -m scripts.series.apply --src DIR                           a clean checkout of the pinned tag
  python -m scripts.series.apply --python PY                         the sglang PY imports (the image: python3)
Also --patches-dir DIR; the base: SGLANG_BASE=auto|clone|wheel, SGLANG_WHEEL=FILE, SGLANG_REPO=URL. build/sglang
holding another patch set is built again beside itself, unless it has commits not in patches/. Exit status: 0 applied
or already applied; 2 a problem you can fix (the message says how); 3 a patch does not apply; 130 interrupted (3 and
130: the tree is as it was).
"""

import os
import shutil
from pathlib import Path

from ..lib import git
from ..lib.cli import parser, run
from ..lib.errors import Interrupted, UserError
from ..lib.progress import say
from ..lib.repo import BUILD_DIR
from .am import APPLIED, apply_tree, dirty
from .base import clone_base, ensure_base, replace_dir
from .pin import UPSTREAM_HEAD, applied_patchset, load_pin, patchset_id, series_patches
from .sglang_pkg import find_sglang


def build_tree(pin, patches, dest: Path, source: str, rebuild: bool) -> str:
    """build/sglang: left alone when it holds the series, else built beside itself and swapped in on success."""
    new = dest.with_name(dest.name + ".new")
    if new.exists():
        say(f"removing {new}, left by a make apply that did not finish")
        shutil.rmtree(new)
    if dest.exists() and not rebuild:
        if not git.is_repo(dest):
            raise UserError(f"{dest} is not a git checkout: move it away, or replace it: make apply REBUILD=1")
        have, want = applied_patchset(dest), patchset_id(patches)
        if have == want:
            git.git(dest, "update-ref", APPLIED, "HEAD")  # in step with patches/
            say(f"{dest} already holds this series ({want}); nothing to do")
            return "already"
        dirty(dest)
        if git.head(dest) not in (git.rev(dest, APPLIED), git.rev(dest, UPSTREAM_HEAD)):
            raise UserError(
                f"{dest} has commits that are not in patches/: export them (make export), or drop them "
                f"and build the tree again (make apply REBUILD=1)"
            )
        say(f"{dest} holds patch set {have}, patches/ is {want}: building {pin.tag} + the series beside it")
    again = "make apply REBUILD=1" if rebuild else "make apply"
    kept = f"{dest} was left as it was." if dest.exists() else f"Nothing was written to {dest}."
    try:
        bare, _ = ensure_base(pin, source)
        clone_base(bare, new, pin.tag)
        apply_tree(new, pin, patches)
    except BaseException as e:
        shutil.rmtree(new, ignore_errors=True)
        if isinstance(e, KeyboardInterrupt):
            raise Interrupted(f"interrupted; {kept} To build it, run {again} again") from None
        if isinstance(e, UserError):
            raise type(e)(f"{e}\n{kept}") from None
        raise
    replace_dir(new, dest)
    say(f"{dest} holds {pin.tag} + the series")
    return "applied"


def apply_python(python: str, pin, patches) -> str:
    """The sglang `python` imports: in a checkout (python/sglang) git am there, else in its installed package."""
    pkg, why = find_sglang(python)
    if pkg is None:
        raise UserError(f"{why}: install sglang for {python} first")
    top = git.git(pkg, "rev-parse", "--show-toplevel", check=False).stdout.strip()
    if top and pkg.resolve() == Path(top).resolve() / "python" / "sglang":
        say(f"{python} imports sglang from the git checkout {top}")
        return apply_tree(Path(top), pin, patches)
    say(f"{python} imports the installed sglang at {pkg}")
    return apply_tree(pkg.resolve().parent, pin, patches, installed=True)


def main(argv=None) -> int:
    ap = parser("scripts.series.apply", __doc__)
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--src", type=Path, help="a clean SGLang checkout of the pinned tag (make apply SGLANG_SRC=)")
    where.add_argument("--python", help="apply to the sglang this interpreter imports")
    ap.add_argument("--dest", type=Path, default=BUILD_DIR / "sglang")
    ap.add_argument("--patches-dir", type=Path)
    ap.add_argument("--rebuild", action="store_true", help="build --dest again from the base (make apply REBUILD=1)")
    a = ap.parse_args(argv)
    if a.rebuild and (a.src or a.python):
        raise UserError("REBUILD=1 (--rebuild) rebuilds build/sglang (--dest), not SGLANG_SRC or --python: drop one")
    pin = load_pin(a.patches_dir)
    patches = series_patches(pin)
    if a.src and not git.is_repo(a.src.resolve()):
        raise UserError(f"{a.src} is not the top of a git checkout: git clone --branch {pin.tag} {pin.repository}")
    if a.src:
        apply_tree(a.src.resolve(), pin, patches)
    elif a.python:
        apply_python(a.python, pin, patches)
    else:
        build_tree(pin, patches, a.dest.resolve(), os.environ.get("SGLANG_BASE") or "auto", a.rebuild)
    return 0


if __name__ == "__main__":
    run(main)
