"""`make export`: regenerate patches/ (series, *.patch, pin blob ids) from the commits of build/sglang.

Each commit after the pinned tag becomes one patch, in order. The export is stable, so a round trip through
`git am` gives the same bytes: no Date header, no version signature, zero commit id, full blob ids, no stat,
and the user's git configuration is ignored.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from .lib import gitutil
from .lib.applycore import RECORD_NAME, Layout, patchset_id, read_record
from .lib.cli import run
from .lib.errors import UserError
from .lib.pin import NULL_BLOB, Pin, dump_pin, load_pin, parse_patch, series_patches
from .lib.progress import say

FORMAT_PATCH = ["format-patch", "--full-index", "--no-signature", "--zero-commit", "--no-numbered", "--no-stat",
                "--no-renames", "--encode-email-headers", "--filename-max-length=100", "--src-prefix=a/", "--dst-prefix=b/"]


def _clean_env() -> dict[str, str]:
    env = gitutil.git_env()
    env["GIT_CONFIG_NOSYSTEM"] = "1"
    env["GIT_CONFIG_GLOBAL"] = os.devnull
    return env


def stabilise(text: str) -> str:
    """Drop what changes between exports of the same change: the Date header."""
    head, sep, rest = text.partition("\n\n")
    head = "\n".join(l for l in head.split("\n") if not l.startswith("Date: "))
    return head + sep + rest


def export(tree: Path, pin: Pin, out_dir: Path) -> list[str]:
    """Write series, patches and pin.toml for the commits pin.tag..HEAD of `tree` into out_dir."""
    tree = Path(tree)
    if not gitutil.is_repo(tree):
        raise UserError(f"{tree} is not a git checkout; run make apply first")
    if gitutil.git(tree, "rev-parse", "-q", "--verify", f"refs/tags/{pin.tag}", check=False).returncode != 0:
        raise UserError(f"{tree} has no tag {pin.tag}: the export needs the pinned base as its starting point")
    commits = gitutil.out(tree, "rev-list", "--reverse", "--no-merges", f"{pin.tag}..HEAD").split()
    merges = gitutil.out(tree, "rev-list", "--merges", f"{pin.tag}..HEAD").split()
    if merges:
        raise UserError(f"{tree} has merge commits after {pin.tag}; a patch series must be linear (rebase first)")
    names: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        if commits:
            cp = subprocess.run(["git", "-C", str(tree), *FORMAT_PATCH, "-o", tmp, f"{pin.tag}..HEAD"],
                                capture_output=True, text=True, env=_clean_env())
            if cp.returncode != 0:
                raise UserError(f"git format-patch failed: {cp.stderr.strip()}")
        produced = sorted(Path(tmp).glob("*.patch"))
        out_dir.mkdir(parents=True, exist_ok=True)
        for old in out_dir.glob("*.patch"):
            old.unlink()
        for f in produced:
            name = re.sub(r"^\d{4}-", "", f.name)
            if name in names:
                raise UserError(f"two commits give the patch name {name}; reword one subject")
            names.append(name)
            (out_dir / name).write_text(stabilise(f.read_text()))
    (out_dir / pin.series_file).write_text(
        "# Patch series against SGLang " + pin.tag + ", applied in this order (scripts/apply.py).\n"
        + "".join(n + "\n" for n in names))
    base, patched = {}, {}
    for n in names:
        for path in parse_patch(out_dir / n).files:
            base[path] = _blob_at(tree, pin.tag, path)
            patched[path] = _blob_at(tree, "HEAD", path)
    new_pin = Pin(**{**pin.__dict__, "patches_dir": out_dir, "base_blobs": base, "patched_blobs": patched})
    (out_dir / "pin.toml").write_text(dump_pin(new_pin))
    _refresh_record(tree, new_pin)
    return names


def _refresh_record(tree: Path, pin: Pin) -> None:
    """The tree now holds exactly the exported series: say so in its record (sglang/_patchset.json)."""
    layout = Layout(tree, "git")
    rec = read_record(layout.pkg_dir)
    if rec is None or gitutil.status_porcelain(tree):
        return
    patches = series_patches(pin)
    rec.update(patchset=patchset_id(patches), patches=[{"file": p.path.name, "subject": p.subject} for p in patches],
               files=dict(sorted(pin.patched_blobs.items())), head=gitutil.out(tree, "rev-parse", "HEAD"))
    (layout.pkg_dir / RECORD_NAME).write_text(json.dumps(rec, indent=1) + "\n")


def _blob_at(tree: Path, rev: str, path: str) -> str:
    cp = gitutil.git(tree, "rev-parse", "-q", "--verify", f"{rev}:{path}", check=False)
    return cp.stdout.strip() if cp.returncode == 0 else NULL_BLOB


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="scripts.export", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", type=Path, default=Path("build/sglang"))
    ap.add_argument("--patches-dir", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None, help="write here instead of the patches directory")
    a = ap.parse_args(argv)
    pin = load_pin(a.patches_dir)
    out = a.out or pin.patches_dir
    names = export(a.tree, pin, out)
    if a.out is None and out.resolve() != pin.patches_dir.resolve():
        shutil.copy2(out / "pin.toml", pin.patches_dir / "pin.toml")
    say(f"exported {len(names)} patches to {out}")
    return 0


if __name__ == "__main__":
    run(main)
