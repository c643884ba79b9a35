"""The pin (patches/pin.toml: the release only), the series (patches/series, *.patch) and what derives from them.

`load_pin()` is the one reader of pin.toml (standard library: the image's python3 runs it). `patchset_id()` names a
series by its files' bytes; `applied_patchset(path)` names the one a tree holds, from git alone.
"""

import dataclasses
import email.parser
import email.policy
import hashlib
import os
import re
import tempfile
from pathlib import Path

from ..lib import git
from ..lib.errors import UserError
from ..lib.repo import REPO_ROOT
from ..lib.tomlfile import load_toml

DEFAULT_PATCHES_DIR = REPO_ROOT / "patches"
NULL_BLOB = "0" * 40
SERVING_IMAGE = "eagle-fast-verify/sglang"  # the image `make image` builds; its tag is the pinned release tag
UPSTREAM_HEAD = "refs/patches/upstream-head"  # the pristine base under a patched tree's commits (Electron's name)
FORMAT_PATCH = [
    "format-patch",
    "--full-index",
    "--no-signature",
    "--zero-commit",
    "--no-numbered",
    "--no-stat",
    "--no-renames",
    "--encode-email-headers",
    "--filename-max-length=100",
]
INDEX = re.compile(r"^diff --git a/\S+ b/(\S+)\n(?:(?!diff --git).*\n)*?index ([0-9a-f]+)\.\.([0-9a-f]+)", re.M)


@dataclasses.dataclass
class Pin:
    patches_dir: Path
    repository: str
    tag: str
    version: str
    wheel_requirement: str
    wheel_filename: str
    wheel_sha256: str
    image_name: str
    image_tag: str
    image_digest: str
    series_file: str
    nccl_package: str = ""
    nccl_version: str = ""

    @property
    def path(self) -> Path:
        return self.patches_dir / "pin.toml"

    def series(self) -> list[Path]:
        """The patch files the series file lists, in order."""
        f = self.patches_dir / self.series_file
        if not f.is_file():
            raise UserError(f"the series file {f} is missing: restore it (git checkout -- patches/)")
        return [self.patches_dir / n for n in (ln.split("#", 1)[0].strip() for ln in f.read_text().splitlines()) if n]

    @property
    def upstream_image(self) -> str:
        return f"{self.image_name}:{self.image_tag}"

    @property
    def serving_image(self) -> str:
        return f"{SERVING_IMAGE}:{self.tag}"

    @property
    def image_cuda(self) -> tuple[int, int] | None:
        """CUDA release of the upstream image, from its tag (vX.Y.Z-cu130 -> (13, 0)); None if the tag says none."""
        m = re.search(r"cu(\d+)(\d)$", self.image_tag)
        return (int(m.group(1)), int(m.group(2))) if m else None


def load_pin(patches_dir: Path | None = None) -> Pin:
    patches_dir = Path(patches_dir or DEFAULT_PATCHES_DIR)
    d = load_toml(patches_dir / "pin.toml", "pin", "restore it: git checkout -- patches/pin.toml")
    try:
        up, wh, im, nc = d["upstream"], d["wheel"], d["image"], d.get("nccl", {})
        return Pin(
            patches_dir,
            up["repository"],
            up["tag"],
            up["version"],
            wh["requirement"],
            wh["filename"],
            wh["sha256"],
            im["name"],
            im["tag"],
            im.get("digest", ""),
            d["series"]["file"],
            nc.get("package", ""),
            nc.get("version", ""),
        )
    except KeyError as e:
        raise UserError(
            f"{patches_dir / 'pin.toml'} lacks the key {e}: compare with git show HEAD:patches/pin.toml"
        ) from e


def write_pin(pin: Pin) -> None:
    """Edit pin.toml in place (comments kept): release, wheel and image values. Needs tomlkit (the host's .venv)."""
    import tomlkit

    doc = tomlkit.parse(pin.path.read_text())
    doc["upstream"].update(tag=pin.tag, version=pin.version)
    doc["wheel"].update(requirement=pin.wheel_requirement, filename=pin.wheel_filename, sha256=pin.wheel_sha256)
    doc["image"].update(tag=pin.image_tag, digest=pin.image_digest)
    pin.path.write_text(tomlkit.dumps(doc))


@dataclasses.dataclass
class PatchInfo:
    path: Path
    subject: str
    author: str  # the From: header, "Name <email>"
    message: str  # the commit message after the subject
    files: dict[str, tuple[str, str]]  # repository path -> (pre-image blob, post-image blob), in patch order


def parse_patch(path: Path) -> PatchInfo:
    """Subject, author, message and per-file blob ids of a `git format-patch --full-index` file."""
    if not path.is_file():
        raise UserError(
            f"the series lists {path.name}, but there is no {path}: restore it (git checkout -- "
            f"patches/), or take it out of the series file"
        )
    mail, _, diff = path.read_text().partition("\ndiff --git ")
    msg = email.parser.HeaderParser(policy=email.policy.default).parsestr(mail.split("\n", 1)[-1] + "\n")
    subject = re.sub(r"^\[PATCH[^\]]*\]\s*", "", " ".join(str(msg.get("Subject", "")).split()))
    files = {m[0]: (m[1], m[2]) for m in INDEX.findall("diff --git " + diff)} if diff else {}
    return PatchInfo(path, subject, str(msg.get("From", "")), str(msg.get_payload()).strip(), files)


def series_patches(pin: Pin | None = None) -> list[PatchInfo]:
    return [parse_patch(p) for p in (pin or load_pin()).series()]


def _id(named: list[tuple[str, bytes]]) -> str:
    return hashlib.sha256(b"".join(name.encode() + b"\0" + data for name, data in named)).hexdigest()[:12]


def patchset_id(patches: list | None = None) -> str:
    """The id of a series (default patches/): a hash of its files' names and bytes, in order (the image label)."""
    paths = [Path(getattr(p, "path", p)) for p in patches] if patches is not None else load_pin().series()
    return _id([(p.name, p.read_bytes()) for p in paths])


def format_series(repo: Path, base: str, prefix: str = "") -> list[tuple[str, str]]:
    """(file name, text) of each commit base..HEAD as `make export` writes it: stable format-patch output (no Date,
    no signature, zero commit id, full blob ids; the user's git configuration ignored), named by its
    `Patch-Filename:` line, or from its subject with that line added. prefix: the repository path of the tree's
    root (python/ for an installed package made a repository)."""
    env = {**git.git_env(), "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}
    prefixes = [f"--src-prefix=a/{prefix}", f"--dst-prefix=b/{prefix}"]
    with tempfile.TemporaryDirectory() as tmp:
        git.git(repo, *FORMAT_PATCH, *prefixes, "-o", tmp, f"{base}..HEAD", env=env)
        out = []
        for f in sorted(Path(tmp).glob("*.patch")):
            head, _, rest = f.read_text().partition("\n\n")
            message, _, diff = rest.partition("\ndiff --git ")
            named = re.findall(r"^Patch-Filename: *(\S+)$", message, re.M)
            name = named[-1] if named else re.sub(r"^\d{4}-", "", f.name)
            message = message if named else f"{message.rstrip()}\n\nPatch-Filename: {name}\n"
            head = "\n".join(ln for ln in head.split("\n") if not ln.startswith("Date: "))
            out.append((name, f"{head}\n\n{message}\ndiff --git {diff}"))
        return out


def export_series(tree: Path, pin: Pin, out: Path) -> list[str]:
    """The commits after the tree's base as *.patch files and the series file in `out` (its old *.patch removed)."""
    if not git.is_repo(tree):
        raise UserError(f"{tree} is not a git checkout: make apply first")
    base = UPSTREAM_HEAD if git.rev(tree, UPSTREAM_HEAD) else pin.tag
    if git.out(tree, "rev-list", "--merges", f"{base}..HEAD"):
        raise UserError(f"{tree} has merge commits after {base}: a series is linear (git rebase {base} first)")
    named = format_series(tree, base)
    names = [n for n, _ in named]
    if len(set(names)) < len(names):
        raise UserError(
            f"two commits make one patch file name ({', '.join(names)}): reword a subject, or fix its "
            f"Patch-Filename: line"
        )
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.patch"):
        old.unlink()
    for name, text in named:
        (out / name).write_text(text)
    (out / pin.series_file).write_text(
        f"# Patch series against SGLang {pin.tag}, applied in this order (make "
        f"apply).\n" + "".join(n + "\n" for n in names)
    )
    return names


def applied_patchset(path: Path) -> str | None:
    """The patchset_id of the series a tree (or its sglang package directory) holds: its commits after
    refs/patches/upstream-head, formatted as make export writes them; None when it is not a patched tree."""
    path = Path(path)
    res = git.git(path if path.is_dir() else path.parent, "rev-parse", "--show-toplevel", check=False, timeout=30)
    top = Path(res.stdout.strip())
    if not res.ok or not git.rev(top, UPSTREAM_HEAD):
        return None
    named = format_series(top, UPSTREAM_HEAD, "" if (top / "python" / "sglang").is_dir() else "python/")
    return _id([(n, t.encode()) for n, t in named]) if named else None
