"""`make refresh`: move the series to a new upstream version and report, per patch, what happened.

  python -m scripts.series.refresh --tag v0.5.24                      clone the new tag (needs the upstream repository)
  python -m scripts.series.refresh --wheel sglang==0.5.24 [--tag v0.5.24] [--wheel-file F]   from a PyPI wheel
  python -m scripts.series.refresh --sync                             only rewrite the pin's copies (the Dockerfile)

Each patch is tried in order on a tree of the new base (build/sglang-refresh): `clean` (applies as is),
`3-way` (needed git am's 3-way merge; re-export to refresh its context), or `conflict` (skipped; the patches
after it are still tried, so you see the whole picture). With --write and no conflict, everything that names the
release moves to the new base: patches/pin.toml (tag, version, wheel, the upstream image's tag with its digest
cleared), patches/ (re-exported from the refreshed tree) and the Dockerfile's ARG defaults.
Exit status: 0 every patch applied (and, with --write, moved); 1 some patch conflicts; 2 a usage problem.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import tempfile
from pathlib import Path

from ..lib import git
from ..lib.cli import run
from ..lib.errors import UserError
from ..lib.progress import say
from ..lib.repo import BUILD_DIR
from .exporting import export
from .patchfile import series_patches
from .patching import am_failure, apply_git
from .pin import Pin, load_pin, write_pin
from .pin_copies import write_copies
from .upstream import CACHE_DIR, clone_base, download_wheel, ensure_base, sha256_file


def wheel_spec(requirement: str, wheel_file: Path | None) -> dict:
    """{requirement, filename, sha256, path} of the new wheel: the file given, or one pip downloads into the cache."""
    if wheel_file is None:
        say(f"downloading {requirement} to find its file name and hash")
        wheel_file = download_wheel(requirement, CACHE_DIR)
        if wheel_file is None:
            raise UserError(f"could not download {requirement} (or several wheels of it are in {CACHE_DIR}); "
                            f"download it yourself and pass --wheel-file (make refresh WHEEL_FILE=...)")
    wheel_file = Path(wheel_file)
    if not wheel_file.is_file():
        raise UserError(f"--wheel-file {wheel_file} does not exist")
    return {"requirement": requirement, "filename": wheel_file.name, "sha256": sha256_file(wheel_file),
            "path": wheel_file}


def _previous_series(pin: Pin, dest: Path, cache_dir: Path) -> None:
    """Fetch the series applied to the old base into dest (refs/previous/series), so that `git am -3` finds every
    pre-image blob and can fall back on a real 3-way merge."""
    old_bare, old_info = ensure_base(pin, "auto", cache_dir=cache_dir)
    with tempfile.TemporaryDirectory() as tmp:
        old_tree = Path(tmp) / "old"
        clone_base(old_bare, old_tree, pin.tag)
        apply_git(old_tree, pin, base=old_info)
        git.git(dest, "fetch", "-q", "--no-tags", str(old_tree), "HEAD:refs/previous/series")


def refresh(pin: Pin, tag: str, wheel: dict | None, dest: Path, cache_dir: Path = CACHE_DIR) -> list[dict]:
    if wheel and wheel.get("path"):
        cache_dir.mkdir(parents=True, exist_ok=True)
        target = cache_dir / wheel["filename"]
        if Path(wheel["path"]).resolve() != target.resolve():
            shutil.copy2(wheel["path"], target)
    bare, _ = ensure_base(pin, "wheel" if wheel else "clone", cache_dir=cache_dir, tag=tag,
                          wheel={k: v for k, v in (wheel or {}).items() if k != "path"} or None)
    if dest.exists():
        shutil.rmtree(dest)
    clone_base(bare, dest, tag)
    _previous_series(pin, dest, cache_dir)
    report = []
    for p in series_patches(pin):
        check = git.git(dest, "apply", "--check", str(p.path), check=False)
        res = git.git(dest, "am", "-3", "--no-gpg-sign", str(p.path), check=False)
        if res.ok:
            report.append({"patch": p.path.name, "status": "clean" if check.ok else "3-way", "files": []})
        else:
            _, files = am_failure(dest, [p], res.output)
            git.git(dest, "am", "--abort", check=False)
            report.append({"patch": p.path.name, "status": "conflict", "files": files})
    return report


def moved_pin(pin: Pin, tag: str, version: str, wheel: dict | None, image_tag: str | None) -> Pin:
    """The pin for the new base: tag, version and wheel; the upstream image tag follows the release (its old
    version string replaced, or --image-tag) and its digest is cleared when the tag changes."""
    new_image_tag = image_tag or pin.image_tag.replace(pin.tag, tag).replace(pin.version, version)
    new = dataclasses.replace(pin, tag=tag, version=version, commit="", image_tag=new_image_tag,
                              image_digest=pin.image_digest if new_image_tag == pin.image_tag else "")
    if wheel:
        new = dataclasses.replace(new, wheel_requirement=wheel["requirement"], wheel_filename=wheel["filename"],
                                  wheel_sha256=wheel["sha256"])
    return new


def _print_report(report: list[dict], old: str, new: str) -> None:
    width = max([len(r["patch"]) for r in report] + [5])
    print(f"refresh {old} -> {new}:")
    for r in report:
        extra = f"  ({', '.join(r['files'])})" if r["files"] else ""
        print(f"  {r['patch']:<{width}}  {r['status']}{extra}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="scripts.series.refresh", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tag", help="new upstream tag, e.g. v0.5.24")
    ap.add_argument("--wheel", help="new wheel requirement, e.g. sglang==0.5.24 (base from PyPI, no GitHub)")
    ap.add_argument("--wheel-file", type=Path, help="a local copy of that wheel")
    ap.add_argument("--image-tag", help="the upstream image's new tag (default: the old one with the release moved)")
    ap.add_argument("--dest", type=Path, default=BUILD_DIR / "sglang-refresh")
    ap.add_argument("--patches-dir", type=Path, default=None)
    ap.add_argument("--write", action="store_true", help="on success, move the pin, patches/ and the pin's copies")
    ap.add_argument("--sync", action="store_true", help="only rewrite the pin's copies from patches/pin.toml")
    a = ap.parse_args(argv)
    pin = load_pin(a.patches_dir)
    if a.sync:
        changed = write_copies(pin)
        say(f"rewrote {', '.join(map(str, changed))} from {pin.path}" if changed else "the pin's copies agree with it")
        return 0
    if not a.tag and not a.wheel:
        raise UserError("say where to move: --tag vX.Y.Z (clone) or --wheel sglang==X.Y.Z (PyPI wheel)")
    version = a.wheel.split("==", 1)[1] if a.wheel and "==" in a.wheel else (a.tag or "").lstrip("v")
    tag = a.tag or f"v{version}"
    wheel = wheel_spec(a.wheel, a.wheel_file) if a.wheel else None
    report = refresh(pin, tag, wheel, a.dest)
    _print_report(report, pin.tag, tag)
    conflicts = [r for r in report if r["status"] == "conflict"]
    if conflicts:
        print(f"{len(conflicts)} patch(es) conflict; the tree {a.dest} holds the others. Fix by hand there, then "
              f"re-run with --write or export.")
        return 1
    if a.write:
        write_pin(moved_pin(pin, tag, version, wheel, a.image_tag))
        export(a.dest, load_pin(pin.patches_dir), pin.patches_dir)
        changed = write_copies(load_pin(pin.patches_dir))
        say(f"patches/, pin.toml{''.join(', ' + str(c.name) for c in changed)} now target {tag}; review with git "
            f"diff, then make check-patches")
    return 0


if __name__ == "__main__":
    run(main)
