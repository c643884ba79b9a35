"""`make refresh TO=v0.5.24 [WHEEL=FILE] [WRITE=1]`: the series onto a new upstream release with `git am -3`.

  python -m scripts.series.refresh --to TAG [--wheel FILE] [--write] [--dest build/sglang-refresh]

The new base is a clone of TAG, or (SGLANG_BASE=wheel, WHEEL=FILE, or GitHub not answering) its PyPI wheel. In
build/sglang-refresh git am stops at a conflict: resolve it there, `git add` the files, `git am --continue` (or
`--skip` to drop that patch), then run the refresh again: it goes on from that tree. --write moves
patches/pin.toml (tag, version, wheel, the image tag; the digest is cleared) and re-exports patches/ from the tree;
it writes nothing else. Exit status: 0 every patch applied (and moved, with --write); 1 git am stopped at a
conflict; 2 a problem you can fix (the message says how).
"""

import dataclasses
import os
import shutil
import tempfile
from pathlib import Path

from ..lib import git, proc
from ..lib.cli import parser, run
from ..lib.errors import UserError
from ..lib.progress import say
from ..lib.repo import BUILD_DIR
from .am import apply_tree
from .base import CACHE_DIR, clone_base, ensure_base, pick_source, pip_download, sha256_file
from .pin import UPSTREAM_HEAD, export_series, load_pin, series_patches, write_pin

BY_HAND = (
    "requirements/ (what the new release requires, then make setup); pin.toml [nccl] (from the NCCL the new "
    "torch pins); pin.toml [image] digest (make image says how to read it on the box)"
)


def new_wheel(pin, version: str, given: Path | None) -> Path:
    """The new release's wheel: the file given (named as PyPI names it), the cache's, or pip's download."""
    name = pin.wheel_requirement.split("==")[0]
    if given is not None:
        if not given.is_file() or not given.name.startswith(f"{name}-{version}-"):
            raise UserError(
                f"WHEEL={given} is not a {name}-{version}-*.whl file: name the {version} wheel as PyPI "
                f"names it, or leave WHEEL out"
            )
        return given
    found = sorted(CACHE_DIR.glob(f"{name}-{version}-*.whl"))
    if not found:
        say(f"downloading {name}=={version} from PyPI")
        pip_download(f"{name}=={version}", CACHE_DIR, like=pin.wheel_filename.replace(pin.version, version))
        found = sorted(CACHE_DIR.glob(f"{name}-{version}-*.whl"))
    if len(found) != 1:
        raise UserError(
            f"no {name} {version} wheel (pip says why above): refresh to a release PyPI has (pip index "
            f"versions {name}), or name a wheel you have (WHEEL=FILE)"
        )
    return found[0]


def stopped(dest: Path) -> bool:
    am_dir = Path(git.out(dest, "rev-parse", "--git-path", "rebase-apply"))
    return (am_dir if am_dir.is_absolute() else dest / am_dir).exists()


def start(pin, a, version: str) -> int:
    """A new refresh tree at a.dest: the new base, then git am -3 of the series (git speaks for itself)."""
    source = "wheel" if a.wheel else pick_source(os.environ.get("SGLANG_BASE") or "auto", pin.repository, a.to)
    bare, _ = ensure_base(pin, source, tag=a.to, wheel=new_wheel(pin, version, a.wheel) if source == "wheel" else None)
    shutil.rmtree(a.dest, ignore_errors=True)
    clone_base(bare, a.dest, a.to)
    with tempfile.TemporaryDirectory() as tmp:  # the old series' blobs, for git am's 3-way merges
        clone_base(ensure_base(pin, os.environ.get("SGLANG_BASE") or "auto")[0], Path(tmp) / "old", pin.tag)
        apply_tree(Path(tmp) / "old", pin, series_patches(pin))
        git.git(a.dest, "fetch", "-q", "--no-tags", str(Path(tmp) / "old"), "HEAD:refs/patches/previous")
    say(f"git am -3 of {len(pin.series())} patches onto {a.to} in {a.dest}")
    am = ["git", "-C", str(a.dest), "am", "-3", "--no-gpg-sign", *[str(p.resolve()) for p in pin.series()]]
    return proc.run(am, env=git.git_env(), timeout=git.TIMEOUT, capture=False).returncode or 0


def write(pin, a, version: str) -> None:
    """Move the pin to the new release and export patches/ from the refresh tree."""
    wheel, image_tag = new_wheel(pin, version, a.wheel), pin.image_tag.replace(pin.version, version)
    write_pin(
        new := dataclasses.replace(
            pin,
            tag=a.to,
            version=version,
            wheel_requirement=f"{pin.wheel_requirement.split('==')[0]}=={version}",
            wheel_filename=wheel.name,
            wheel_sha256=sha256_file(wheel),
            image_tag=image_tag,
            image_digest="",
        )
    )
    names = export_series(a.dest, new, pin.patches_dir)
    say(
        f"patches/ ({len(names)} patches) and pin.toml now target {a.to}: review them (git diff), then make apply "
        f"REBUILD=1 and make test"
    )
    print(f"left to you: {BY_HAND}; what else names {pin.version}: git grep -n '{pin.version}' -- ':!bench/results'")


def main(argv=None) -> int:
    ap = parser("scripts.series.refresh", __doc__)
    ap.add_argument("--to", help="the new upstream tag, e.g. v0.5.24")
    ap.add_argument("--wheel", type=Path, help="its PyPI wheel, a file you have (default: pip downloads it)")
    ap.add_argument("--write", action="store_true", help="move patches/pin.toml and re-export patches/")
    ap.add_argument("--dest", type=Path, default=BUILD_DIR / "sglang-refresh")
    ap.add_argument("--patches-dir", type=Path)
    a = ap.parse_args(argv)
    pin = load_pin(a.patches_dir)
    if not a.to:
        raise UserError("name the release: make refresh TO=v<version> (PyPI's: pip index versions sglang)")
    if a.to == pin.tag:
        say(f"patches/pin.toml already pins {a.to}: nothing to move. To check the series on it: make check-patches")
        return 0
    version, a.dest = a.to.removeprefix("v"), a.dest.resolve()
    again = f"make refresh TO={a.to}" + (f" WHEEL={a.wheel}" if a.wheel else "")
    ours = git.is_repo(a.dest) and git.rev(a.dest, f"refs/tags/{a.to}") is not None
    if ours and stopped(a.dest):
        raise UserError(
            f"git am is stopped in {a.dest}: resolve, git -C {a.dest} add <files>, git -C {a.dest} am "
            f"--continue (or --skip to drop that patch; --abort to give up), then {again} again"
        )
    if ours and git.rev(a.dest, f"refs/tags/{a.to}") == git.rev(a.dest, UPSTREAM_HEAD):
        say(f"going on from {a.dest} as you left it (rm -rf {a.dest} to start again)")
    elif start(pin, a, version):
        print(
            f"git am stopped at a conflict in {a.dest} (git's words above). Resolve the files it names, then\n"
            f"  git -C {a.dest} add <files> && git -C {a.dest} am --continue\n"
            f"or drop that patch from the series: git -C {a.dest} am --skip\nThen: {again} WRITE=1"
        )
        return 1
    if a.write:
        write(pin, a, version)
    else:
        say(f"every patch applies on {a.to} ({a.dest}). To move the pin and patches/: {again} WRITE=1")
    return 0


if __name__ == "__main__":
    run(main)
