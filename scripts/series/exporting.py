"""The export core: the commits after the pinned tag of a tree become patches/ (series, *.patch, the pin's blobs).

The export is stable, so a round trip through `git am` gives the same bytes: no Date header, no version signature,
zero commit id, full blob ids, no stat, and the user's git configuration is ignored. A patch keeps its file name
when its subject is reworded: the name comes from the commit's `Patch-Filename:` line, and a commit without one is
named from its subject and gets the line in its patch (so the next apply carries it), as Electron's trailer does.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tempfile
from pathlib import Path

from ..lib import git, proc
from ..lib.errors import UserError
from .headers import patch_filename
from .patchfile import parse_mail, parse_patch, series_patches, split_patch
from .pin import NULL_BLOB, Pin, write_pin
from .record import make_record, read_record, write_record

FORMAT_PATCH = ["format-patch", "--full-index", "--no-signature", "--zero-commit", "--no-numbered", "--no-stat",
                "--no-renames", "--encode-email-headers", "--filename-max-length=100", "--src-prefix=a/", "--dst-prefix=b/"]


def _clean_env() -> dict[str, str]:
    env = git.git_env()
    env["GIT_CONFIG_NOSYSTEM"] = "1"
    env["GIT_CONFIG_GLOBAL"] = os.devnull
    return env


def stabilise(text: str) -> str:
    """Drop what changes between exports of the same change: the Date header."""
    head, sep, rest = text.partition("\n\n")
    head = "\n".join(line for line in head.split("\n") if not line.startswith("Date: "))
    return head + sep + rest


def with_patch_filename(text: str, name: str) -> tuple[str, str]:
    """(file name, patch text) for one exported patch: the name its message gives, or `name` (from the subject)
    with a `Patch-Filename: name` line added as the message's last line."""
    mail, diff = split_patch(text, name)
    _, body = parse_mail(mail)
    given = patch_filename(body)
    if given:
        return given, text
    cut = text.index("\ndiff --git ")
    message = text[:cut].rstrip("\n")
    return name, f"{message}\n\nPatch-Filename: {name}\n{text[cut:]}"


def _format_patches(tree: Path, tag: str, out: Path) -> list[Path]:
    res = proc.run(["git", "-C", str(tree), *FORMAT_PATCH, "-o", str(out), f"{tag}..HEAD"], env=_clean_env(),
                   timeout=git.TIMEOUT)
    if not res.ok:
        raise UserError(f"git format-patch failed: {res.stderr.strip() or res.why}")
    return sorted(out.glob("*.patch"))


def _linear_commits(tree: Path, pin: Pin) -> list[str]:
    if not git.is_repo(tree):
        raise UserError(f"{tree} is not a git checkout; run make apply first")
    if git.tag_commit(tree, pin.tag) is None:
        raise UserError(f"{tree} has no tag {pin.tag}: the export needs the pinned base as its starting point")
    if git.out(tree, "rev-list", "--merges", f"{pin.tag}..HEAD").split():
        raise UserError(f"{tree} has merge commits after {pin.tag}; a patch series must be linear (rebase first)")
    return git.out(tree, "rev-list", "--reverse", "--no-merges", f"{pin.tag}..HEAD").split()


def write_patches(tree: Path, pin: Pin, out_dir: Path) -> list[str]:
    """The *.patch files and the series file for pin.tag..HEAD of `tree`, in out_dir; returns the file names."""
    commits = _linear_commits(tree, pin)
    names: list[str] = []
    texts: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for f in _format_patches(tree, pin.tag, Path(tmp)) if commits else []:
            name, text = with_patch_filename(stabilise(f.read_text()), re.sub(r"^\d{4}-", "", f.name))
            if name in names:
                raise UserError(f"two commits give the patch name {name}; reword one subject or fix its "
                                f"Patch-Filename: line")
            names.append(name)
            texts.append(text)
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("*.patch"):
        old.unlink()
    for name, text in zip(names, texts):
        (out_dir / name).write_text(text)
    (out_dir / pin.series_file).write_text(
        "# Patch series against SGLang " + pin.tag + ", applied in this order (make apply).\n"
        + "".join(n + "\n" for n in names))
    return names


def _blob_at(tree: Path, rev: str, path: str) -> str:
    res = git.git(tree, "rev-parse", "-q", "--verify", f"{rev}:{path}", check=False)
    return res.stdout.strip() if res.ok else NULL_BLOB


def export(tree: Path, pin: Pin, out_dir: Path) -> list[str]:
    """Write series, patches and pin.toml for the commits pin.tag..HEAD of `tree` into out_dir."""
    tree = Path(tree)
    names = write_patches(tree, pin, out_dir)
    base, patched = {}, {}
    for n in names:
        for path in parse_patch(out_dir / n).files:
            base[path] = _blob_at(tree, pin.tag, path)
            patched[path] = _blob_at(tree, "HEAD", path)
    new_pin = dataclasses.replace(pin, patches_dir=out_dir, base_blobs=base, patched_blobs=patched)
    write_pin(new_pin, out_dir / "pin.toml", template=pin.path)
    refresh_record(tree, new_pin)
    return names


def refresh_record(tree: Path, pin: Pin) -> None:
    """The tree now holds exactly the exported series: say so in its record (sglang/_patchset.json)."""
    pkg = Path(tree) / "python" / "sglang"
    old = read_record(pkg)
    if old is None or git.status_porcelain(tree):
        return
    base = {k: v for k, v in old.get("base", {}).items() if k not in ("tag", "requirement")}
    rec = make_record(pin, series_patches(pin), old.get("layout", "git"), base, head=git.head(tree))
    rec["applied_at"] = old.get("applied_at", rec["applied_at"])
    write_record(pkg, rec)
