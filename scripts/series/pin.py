"""The pin (patches/pin.toml), the series file and what each patch touches.

The pin records what can be verified from a machine without GitHub: the upstream tag, the PyPI wheel of the same
release with its sha256, and the git blob ids of every file the series touches, before (base) and after (patched).
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path

from .errors import UserError

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_PATCHES_DIR = REPO_ROOT / "patches"
PIN_FILE = "pin.toml"
NULL_BLOB = "0" * 40

# Header lines every patch message must carry (see check_patches.py and README "Patch headers").
REQUIRED_TRAILERS = ("Why:", "Measured:", "Upstream-Status:", "Retire-When:")


@dataclasses.dataclass
class Pin:
    patches_dir: Path
    repository: str
    tag: str
    version: str
    commit: str
    wheel_requirement: str
    wheel_filename: str
    wheel_sha256: str
    image_name: str
    image_tag: str
    image_digest: str
    series_file: str
    base_blobs: dict[str, str]
    patched_blobs: dict[str, str]

    @property
    def series_path(self) -> Path:
        return self.patches_dir / self.series_file

    def series(self) -> list[Path]:
        return read_series(self.series_path)

    def describe(self) -> str:
        return f"SGLang {self.tag} (wheel {self.wheel_requirement})"


def load_pin(patches_dir: Path | None = None) -> Pin:
    patches_dir = Path(patches_dir or DEFAULT_PATCHES_DIR)
    path = patches_dir / PIN_FILE
    if not path.is_file():
        raise UserError(f"no pin file at {path}: the patches directory must hold {PIN_FILE} and a series file")
    try:
        d = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{path} is not valid TOML: {e}") from e
    try:
        up, wh, im = d["upstream"], d["wheel"], d.get("image", {})
        return Pin(
            patches_dir=patches_dir,
            repository=up["repository"],
            tag=up["tag"],
            version=up["version"],
            commit=up.get("commit", ""),
            wheel_requirement=wh["requirement"],
            wheel_filename=wh["filename"],
            wheel_sha256=wh["sha256"],
            image_name=im.get("name", ""),
            image_tag=im.get("tag", ""),
            image_digest=im.get("digest", ""),
            series_file=d["series"]["file"],
            base_blobs=dict(d.get("base_blobs", {})),
            patched_blobs=dict(d.get("patched_blobs", {})),
        )
    except KeyError as e:
        raise UserError(f"{path} lacks the key {e}; compare with the pin documented in README.md") from e


def _q(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def dump_pin(pin: Pin) -> str:
    """Serialise the pin in a fixed layout, so that export is byte-stable."""
    lines = [
        "# Pinned upstream base of the patch series. [base_blobs] and [patched_blobs] are written by",
        "# `make export` (scripts/export.py); [upstream], [wheel] and [image] change with `make refresh`",
        "# or by hand. The tag's commit id cannot be read without GitHub: `make apply` records the commit a",
        "# clone got in build/sglang/python/sglang/_patchset.json.",
        "",
        "[upstream]",
        f"repository = {_q(pin.repository)}",
        f"tag = {_q(pin.tag)}",
        f"version = {_q(pin.version)}",
        f"commit = {_q(pin.commit)}",
        "",
        "[wheel]",
        "# Same Python sources as the tag (the wheel's sglang/ is the repository's python/sglang/).",
        f"requirement = {_q(pin.wheel_requirement)}",
        f"filename = {_q(pin.wheel_filename)}",
        f"sha256 = {_q(pin.wheel_sha256)}",
        "",
        "[image]",
        "# Upstream serving image of the same release; docker/Dockerfile builds FROM name:tag@digest.",
        "# The digest cannot be read from here (no registry): `make image` fills it on the box if empty.",
        f"name = {_q(pin.image_name)}",
        f"tag = {_q(pin.image_tag)}",
        f"digest = {_q(pin.image_digest)}",
        "",
        "[series]",
        f"file = {_q(pin.series_file)}",
        "",
        "[base_blobs]",
        "# git blob id (git hash-object) of every file the series touches, at the pinned base",
    ]
    lines += [f"{_q(k)} = {_q(v)}" for k, v in sorted(pin.base_blobs.items())]
    lines += ["", "[patched_blobs]", "# ... and after the whole series"]
    lines += [f"{_q(k)} = {_q(v)}" for k, v in sorted(pin.patched_blobs.items())]
    return "\n".join(lines) + "\n"


def read_series(series_path: Path) -> list[Path]:
    if not series_path.is_file():
        raise UserError(f"series file {series_path} is missing")
    out = []
    for raw in series_path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            out.append(series_path.parent / line)
    return out


@dataclasses.dataclass
class PatchInfo:
    path: Path
    subject: str
    message: str
    # path -> (pre-image blob, post-image blob), in the order the patch lists them
    files: dict[str, tuple[str, str]]


_DIFF_RE = re.compile(r"^diff --git a/(\S+) b/(\S+)$")
_INDEX_RE = re.compile(r"^index ([0-9a-f]+)\.\.([0-9a-f]+)")


def parse_patch(path: Path) -> PatchInfo:
    """Read a `git format-patch --full-index` file: subject, message and per-file blob ids."""
    if not path.is_file():
        raise UserError(f"patch {path.name} is listed in the series but {path} does not exist")
    text = path.read_text()
    cut = text.find("\ndiff --git ")
    if not text.startswith("From ") or cut < 0:
        raise UserError(f"{path.name} is not `git format-patch` output (no 'From' header or no diff)")
    head, diff = text[:cut], text[cut + 1:]
    if "\n---\n" in head:  # exported with a diffstat
        head = head.split("\n---\n", 1)[0]
    subject_lines, msg_lines, in_subject, in_body = [], [], False, False
    for line in head.splitlines():
        if in_body:
            msg_lines.append(line)
        elif line.startswith("Subject: "):
            in_subject = True
            subject_lines.append(line[len("Subject: "):])
        elif in_subject and line.startswith(" "):
            subject_lines.append(line.strip())
        elif line == "":
            in_body = in_subject
            in_subject = False
        else:
            in_subject = False
    subject = re.sub(r"^\[PATCH[^\]]*\]\s*", "", " ".join(subject_lines)).strip()
    files: dict[str, tuple[str, str]] = {}
    current = None
    for line in diff.splitlines():
        m = _DIFF_RE.match(line)
        if m:
            current = m.group(2)
            files[current] = ("", "")
            continue
        m = _INDEX_RE.match(line)
        if m and current is not None and files[current] == ("", ""):
            pre, post = m.group(1), m.group(2)
            if len(pre) != 40 or len(post) != 40:
                raise UserError(f"{path.name} was not exported with --full-index (abbreviated blob ids): run make export")
            files[current] = (pre, post)
    return PatchInfo(path=path, subject=subject, message="\n".join(msg_lines).strip(), files=files)


def series_patches(pin: Pin) -> list[PatchInfo]:
    return [parse_patch(p) for p in pin.series()]


def touched_files(patches: list[PatchInfo]) -> list[str]:
    seen: dict[str, None] = {}
    for p in patches:
        for f in p.files:
            seen.setdefault(f, None)
    return list(seen)


def expected_blobs(patches: list[PatchInfo]) -> tuple[dict[str, str], dict[str, str]]:
    """Base blobs (first pre-image of each file) and patched blobs (last post-image), from the patches alone."""
    base: dict[str, str] = {}
    final: dict[str, str] = {}
    for p in patches:
        for f, (pre, post) in p.files.items():
            base.setdefault(f, pre)
            final[f] = post
    return base, final
