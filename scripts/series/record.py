"""The record an applied tree carries: sglang/_patchset.json (which series, on which base, which files).

`make_record` is the one place the record is built; apply writes it, export refreshes it, and serve --check,
smoke, doctor, make bench and the tests read it.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
from pathlib import Path

from ..lib.git import blob_id
from .patchfile import PatchInfo
from .pin import Pin

RECORD_NAME = "_patchset.json"  # inside the sglang package: sglang/_patchset.json


def patchset_id(patches: list[PatchInfo]) -> str:
    h = hashlib.sha256()
    for p in patches:
        h.update(p.path.name.encode() + b"\0" + p.path.read_bytes())
    return h.hexdigest()[:12]


def read_record(pkg_dir: Path) -> dict | None:
    f = Path(pkg_dir) / RECORD_NAME
    return json.loads(f.read_text()) if f.is_file() else None


def make_record(pin: Pin, patches: list[PatchInfo], layout: str, base: dict, head: str | None = None) -> dict:
    rec = {
        "tool": "eagle-fast-verify patches",
        "patchset": patchset_id(patches),
        "base": {"tag": pin.tag, "requirement": pin.wheel_requirement, **base},
        "layout": layout,
        "patches": [{"file": p.path.name, "subject": p.subject, "blob": blob_id(p.path.read_bytes())}
                    for p in patches],
        "files": dict(sorted(pin.patched_blobs.items())),
        "applied_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    if head:
        rec["head"] = head
    return rec


def write_record(pkg_dir: Path, rec: dict) -> Path:
    path = Path(pkg_dir) / RECORD_NAME
    path.write_text(json.dumps(rec, indent=1) + "\n")
    return path


def patchset_changes(rec: dict, patches: list[PatchInfo]) -> str:
    """In words, how `patches` differ from the patch set a record names (changed, added, removed files, order)."""
    old = {e.get("file"): e.get("blob") for e in rec.get("patches", [])}
    new = {p.path.name: blob_id(p.path.read_bytes()) for p in patches}
    parts = [f"{label} {', '.join(names)}" for label, names in (
        ("changed:", [n for n in new if n in old and old[n] and old[n] != new[n]]),
        ("added:", [n for n in new if n not in old]),
        ("removed:", [n for n in old if n not in new])) if names]
    if not parts and [n for n in old if n in new] != [n for n in new if n in old]:
        parts.append("the same files in another order")
    return "; ".join(parts) or "the patch files changed"
