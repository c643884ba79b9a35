"""`make apply`: a patched SGLang tree from the pin.

  python -m scripts.series.apply                        build/sglang: base from the pin, then the series (git am -3)
  python -m scripts.series.apply --src DIR              patch an existing clean checkout of the pinned tag
  python -m scripts.series.apply --site-packages DIR    patch an installed sglang (DIR holds sglang/); all or nothing
  python -m scripts.series.apply --python PY            ... the one PY imports (the image build: --python python3)

The base for build/sglang comes from `git clone --branch <tag>` when the upstream repository answers, otherwise
from the pinned PyPI wheel (verified by sha256) unpacked under python/ in a fresh git repository whose single
commit carries the tag. SGLANG_BASE=clone|wheel forces one; SGLANG_WHEEL=<file> uses a wheel you already have.
Re-running is a no-op. Exit status: 0 applied or already applied; 2 a problem you can fix (dirty tree, wrong
release, pin out of sync: the message says how); 3 a patch does not apply (the tree is left as it was).
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

from ..host.sglang_pkg import site_packages_of
from ..lib import git
from ..lib.cli import run
from ..lib.errors import UserError
from ..lib.progress import say
from ..lib.repo import BUILD_DIR
from .patchfile import series_patches
from .patching import Layout, apply_git, apply_site, classify
from .pin import load_pin
from .record import read_record
from .upstream import SOURCES, clone_base, ensure_base

DEFAULT_TREE = BUILD_DIR / "sglang"


def build_tree(pin, dest: Path, source: str, rebuild: bool = False) -> str:
    """Create or update the default patched tree (build/sglang). Returns 'applied' or 'already'."""
    dest = Path(dest).resolve()
    if dest.exists() and rebuild:
        say(f"--rebuild: removing {dest}")
        shutil.rmtree(dest)
    if not dest.exists() or not any(dest.iterdir()):
        bare, info = ensure_base(pin, source)
        say(f"base: {pin.tag} from {info['source']} (commit {info['commit'][:12]})")
        clone_base(bare, dest, pin.tag)
        return apply_git(dest, pin, base=info)
    if not git.is_repo(dest):
        raise UserError(f"{dest} exists but is not a git checkout; remove it (or make apply REBUILD=1)")
    layout = Layout(dest, "git")
    rec = read_record(layout.pkg_dir)
    if rec and classify(layout, pin, series_patches(pin)).kind != "patched" and not git.status_porcelain(dest):
        head = git.head(dest)
        if rec.get("head") != head:
            raise UserError(f"{dest} has commits that are not in patches/ (HEAD {head[:12]}, last apply "
                            f"{str(rec.get('head'))[:12]}). Export them first (make export), or discard them "
                            f"with make apply REBUILD=1.")
        say(f"{dest} holds an older patch set ({rec.get('patchset')}); resetting it to {pin.tag} and re-applying")
        git.git(dest, "reset", "-q", "--hard", pin.tag)
        return apply_git(dest, pin, base=rec.get("base"))
    return apply_git(dest, pin, base=(rec or {}).get("base"))


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
    ap.add_argument("--rebuild", action="store_true", help="remove --dest and build it again")
    a = ap.parse_args(argv)
    pin = load_pin(a.patches_dir)
    if a.src:
        apply_git(a.src, pin)
    elif a.site_packages or a.python:
        apply_site(a.site_packages or site_packages_of(a.python), pin)
    else:
        build_tree(pin, a.dest, a.source, a.rebuild)
    return 0


if __name__ == "__main__":
    run(main)
