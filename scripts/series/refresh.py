"""`make refresh`: move the series to a new upstream version and report, per patch, what happened.

  python -m scripts.refresh --tag v0.5.24                      clone the new tag (needs the upstream repository)
  python -m scripts.refresh --wheel sglang==0.5.24 [--tag v0.5.24] [--wheel-file F]   from a PyPI wheel

Each patch is tried in order on a tree of the new base (build/sglang-refresh): `clean` (applies as is),
`3-way` (needed git am's 3-way merge; re-export to refresh its context), or `conflict` (skipped; the patches
after it are still tried, so you see the whole picture). With --write and no conflict, the pin and patches/
move to the new base (re-exported from the refreshed tree).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from .export import export
from .lib import gitutil
from .lib.applycore import _am_failure, apply_git
from .lib.base import BUILD_DIR, CACHE_DIR, clone_base, ensure_base, sha256_file
from .lib.cli import run
from .lib.errors import UserError
from .lib.pin import Pin, dump_pin, load_pin, series_patches
from .lib.progress import say


def _wheel_spec(requirement: str, wheel_file: Path | None) -> dict:
    if wheel_file:
        wheel_file = Path(wheel_file)
        if not wheel_file.is_file():
            raise UserError(f"--wheel-file {wheel_file} does not exist")
        return {"requirement": requirement, "filename": wheel_file.name, "sha256": sha256_file(wheel_file),
                "path": wheel_file}
    import subprocess

    # into the wheel cache itself, where refresh() looks first (nothing left behind in a temp dir)
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    version = requirement.split("==", 1)[-1]
    say(f"downloading {requirement} to find its file name and hash")
    cp = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d",
                         str(CACHE_DIR), requirement])
    files = sorted(CACHE_DIR.glob(f"sglang-{version}-*.whl"))
    if cp.returncode != 0 or len(files) != 1:
        raise UserError(f"could not download {requirement} (or several wheels of it are in {CACHE_DIR}); "
                        f"pass --wheel-file")
    return {"requirement": requirement, "filename": files[0].name, "sha256": sha256_file(files[0]), "path": files[0]}


def refresh(pin: Pin, tag: str, wheel: dict | None, dest: Path, cache_dir: Path = CACHE_DIR) -> list[dict]:
    if wheel and wheel.get("path"):
        cache_dir.mkdir(parents=True, exist_ok=True)
        target = cache_dir / wheel["filename"]
        if Path(wheel["path"]).resolve() != target.resolve():
            shutil.copy2(wheel["path"], target)
    bare, info = ensure_base(pin, "wheel" if wheel else "clone", cache_dir=cache_dir, tag=tag,
                             wheel={k: v for k, v in (wheel or {}).items() if k != "path"} or None)
    if dest.exists():
        shutil.rmtree(dest)
    clone_base(bare, dest, tag)
    # Every pre-image blob of the series (the old base and each patch's result), so that `git am -3` can fall
    # back on a real 3-way merge: apply the series to the old base once and fetch that history.
    old_bare, old_info = ensure_base(pin, "auto", cache_dir=cache_dir)
    with tempfile.TemporaryDirectory() as tmp:
        old_tree = Path(tmp) / "old"
        clone_base(old_bare, old_tree, pin.tag)
        apply_git(old_tree, pin, base=old_info)
        gitutil.git(dest, "fetch", "-q", "--no-tags", str(old_tree), "HEAD:refs/previous/series")
    report = []
    for p in series_patches(pin):
        check = gitutil.git(dest, "apply", "--check", str(p.path), check=False)
        cp = gitutil.git(dest, "am", "-3", "--no-gpg-sign", str(p.path), check=False)
        if cp.returncode == 0:
            status = "clean" if check.returncode == 0 else "3-way"
            report.append({"patch": p.path.name, "status": status, "files": []})
        else:
            _, files = _am_failure(dest, [p], cp.stdout + cp.stderr)
            gitutil.git(dest, "am", "--abort", check=False)
            report.append({"patch": p.path.name, "status": "conflict", "files": files})
    return report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="scripts.refresh", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tag", help="new upstream tag, e.g. v0.5.24")
    ap.add_argument("--wheel", help="new wheel requirement, e.g. sglang==0.5.24 (base from PyPI, no GitHub)")
    ap.add_argument("--wheel-file", type=Path, help="a local copy of that wheel")
    ap.add_argument("--dest", type=Path, default=BUILD_DIR / "sglang-refresh")
    ap.add_argument("--patches-dir", type=Path, default=None)
    ap.add_argument("--write", action="store_true", help="on success, move pin and patches/ to the new base")
    a = ap.parse_args(argv)
    if not a.tag and not a.wheel:
        raise UserError("say where to move: --tag vX.Y.Z (clone) or --wheel sglang==X.Y.Z (PyPI wheel)")
    pin = load_pin(a.patches_dir)
    version = a.wheel.split("==", 1)[1] if a.wheel and "==" in a.wheel else (a.tag or "").lstrip("v")
    tag = a.tag or f"v{version}"
    wheel = _wheel_spec(a.wheel, a.wheel_file) if a.wheel else None
    report = refresh(pin, tag, wheel, a.dest)
    width = max([len(r["patch"]) for r in report] + [5])
    print(f"refresh {pin.tag} -> {tag}:")
    for r in report:
        extra = f"  ({', '.join(r['files'])})" if r["files"] else ""
        print(f"  {r['patch']:<{width}}  {r['status']}{extra}")
    conflicts = [r for r in report if r["status"] == "conflict"]
    if conflicts:
        print(f"{len(conflicts)} patch(es) conflict; the tree {a.dest} holds the others. Fix by hand there, then "
              f"re-run with --write or export.")
        return 1
    if a.write:
        new = Pin(**{**pin.__dict__, "tag": tag, "version": version, "commit": ""})
        if wheel:
            new.wheel_requirement, new.wheel_filename, new.wheel_sha256 = wheel["requirement"], wheel["filename"], wheel["sha256"]
        (pin.patches_dir / "pin.toml").write_text(dump_pin(new))
        export(a.dest, load_pin(pin.patches_dir), pin.patches_dir)
        say(f"patches/ and pin.toml now target {tag}; review with git diff, then make check-patches")
    return 0


if __name__ == "__main__":
    run(main)
