"""`make apply`: a patched SGLang tree from the pin.

  python -m scripts.series.apply                        build/sglang: base from the pin, then the series (git am -3)
  python -m scripts.series.apply --src DIR              patch an existing clean checkout of the pinned tag
  python -m scripts.series.apply --site-packages DIR    patch an installed sglang (DIR holds sglang/); all or nothing
  python -m scripts.series.apply --python PY            ... the one PY imports (the image build: --python python3)

The base for build/sglang comes from `git clone --branch <tag>` when the upstream repository answers, otherwise
from the pinned PyPI wheel (verified by sha256) unpacked under python/ in a fresh git repository whose single
commit carries the tag. SGLANG_BASE=clone|wheel forces one; SGLANG_WHEEL=<file> uses a wheel you already have
(checked against the pin every time, also when the base cache exists).
Every patch is parsed first: a corrupt one is named (file, line, how to restore it) before any tree is touched.
Re-running is a no-op when the tree's record (sglang/_patchset.json) names the patch set of patches/; otherwise
the tree is built again. A new build/sglang (the first, --rebuild, or one that holds an older patch set) is built
beside the old one (build/sglang.new) and swapped in only when every patch applied: a failure leaves the old tree
(or none) as it was, and never removes the base cache.
Exit status: 0 applied or already applied; 2 a problem you can fix (dirty tree, wrong release, corrupt patch, pin
out of sync: the message says how); 3 a patch does not apply (the tree is left as it was); 130 interrupted (Ctrl-C:
the tree is left as it was; a build/sglang.new left by a killed run is removed by the next one).
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
from .patchfile import PatchInfo, series_patches
from .patching import Layout, apply_git, apply_site, classify
from .pin import load_pin
from .record import patchset_changes, patchset_id, read_record
from .sglang_pkg import site_packages_of
from .upstream import SOURCES, clone_base, ensure_base, replace_dir

DEFAULT_TREE = BUILD_DIR / "sglang"


def build_tree(pin, patches: list[PatchInfo], dest: Path, source: str, rebuild: bool = False) -> str:
    """Create or update the default patched tree (build/sglang). Returns 'applied' or 'already'.

    A new tree is always built beside the old one (<dest>.new) and swapped in only when every patch applied, so a
    failure (no base, a patch that does not apply) leaves the old tree, or no tree, exactly as it was."""
    dest = Path(dest).resolve()
    remove_leftover(dest)
    if dest.exists() and any(dest.iterdir()) and not rebuild:
        if not git.is_repo(dest):
            raise UserError(f"{dest} exists but is not a git checkout; move it away, or replace it with a fresh tree: "
                            f"make apply REBUILD=1")
        why = _why_rebuild(dest, pin, patches)
        if why is None:
            return apply_git(dest, pin, base=(read_record(Layout(dest, "git").pkg_dir) or {}).get("base"),
                             patches=patches)
        say(why)
    elif rebuild and dest.exists():
        say(f"--rebuild: building a new tree beside {dest}; it replaces {dest} only when every patch applied")
    return _build_beside(pin, patches, dest, source)


def _why_rebuild(dest: Path, pin, patches: list[PatchInfo]) -> str | None:
    """Why the existing tree must be built again (its record names another patch set than patches/), or None:
    apply_git handles it (applies to a tree at the base, says a tree holding the series has nothing to do, refuses
    a dirty tree). A tree with commits after the last apply or export is refused: they are not in patches/."""
    layout = Layout(dest, "git")
    rec = read_record(layout.pkg_dir)
    if not rec or git.status_porcelain(dest):
        return None
    head = git.head(dest)
    if head == git.tag_commit(dest, pin.tag):
        return None
    if rec.get("head") != head:
        raise UserError(f"{dest} has commits that are not in patches/ (HEAD {str(head)[:12]}, last apply or export "
                        f"{str(rec.get('head'))[:12]}). Export them first (make export), or discard them "
                        f"with make apply REBUILD=1.")
    if rec.get("patchset") == patchset_id(patches) and classify(layout, pin, patches).kind == "patched":
        return None
    return (f"{dest} was built from patch set {rec.get('patchset')}, but patches/ is {patchset_id(patches)} "
            f"({patchset_changes(rec, patches)}): building {pin.tag} + the series beside it")


def remove_leftover(dest: Path) -> None:
    """<dest>.new, left by a make apply that was killed (kill -9, a power cut) while building beside the tree."""
    new = dest.with_name(dest.name + ".new")
    if new.exists():
        say(f"removing {new}, left by a make apply that did not finish")
        shutil.rmtree(new)


def _build_beside(pin, patches: list[PatchInfo], dest: Path, source: str) -> str:
    """Build the tree in <dest>.new and swap it in on success; on any failure, Ctrl-C included, remove it and
    leave dest alone, and say so (not the message of the program the interrupt stopped)."""
    new = dest.with_name(dest.name + ".new")
    kept = f"{dest} was left as it was." if dest.exists() else f"Nothing was written to {dest}."
    try:
        bare, info = ensure_base(pin, source, wheel_way="make apply SGLANG_BASE=wheel")
        say(f"base: {pin.tag} from {info['source']} (commit {info['commit'][:12]})")
        clone_base(bare, new, pin.tag)
        apply_git(new, pin, base=info, scratch=True, patches=patches)
    except UserError as e:
        shutil.rmtree(new, ignore_errors=True)
        raise type(e)(f"{e}\n{kept}") from None
    except KeyboardInterrupt:
        shutil.rmtree(new, ignore_errors=True)
        raise Interrupted(f"interrupted; {kept} Run make apply again to build it") from None
    except BaseException:
        shutil.rmtree(new, ignore_errors=True)
        raise
    replace_dir(new, dest)
    say(f"{dest} now holds {pin.tag} + the series")
    return "applied"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="scripts.series.apply", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--src", type=Path, help="existing SGLang git checkout to patch (make apply SGLANG_SRC=DIR)")
    where.add_argument("--site-packages", type=Path, metavar="DIR", help="directory holding an installed sglang/")
    where.add_argument("--python", help="patch the sglang installed for this interpreter")
    ap.add_argument("--dest", type=Path, default=DEFAULT_TREE, help="tree to build (default build/sglang)")
    ap.add_argument("--source", choices=SOURCES, default=os.environ.get("SGLANG_BASE") or "auto",
                    help="where the base comes from (default: auto; env SGLANG_BASE)")
    ap.add_argument("--patches-dir", type=Path, default=None, help="patch series directory (default patches/)")
    ap.add_argument("--rebuild", action="store_true",
                    help="build --dest again from the base (beside it; swapped in only when every patch applied)")
    a = ap.parse_args(argv)
    if a.rebuild and (a.src or a.site_packages or a.python):
        raise UserError("--rebuild (make apply REBUILD=1) rebuilds the default tree (--dest), not a tree you named "
                        "with --src, --site-packages or --python: drop one of them")
    pin = load_pin(a.patches_dir)
    patches = series_patches(pin)  # parsed once: a corrupt patch is named before any tree is touched
    if a.src:
        apply_git(a.src, pin, patches=patches)
    elif a.site_packages or a.python:
        apply_site(a.site_packages or site_packages_of(a.python), pin, patches)
    else:
        build_tree(pin, patches, a.dest, a.source, a.rebuild)
    return 0


if __name__ == "__main__":
    run(main)
