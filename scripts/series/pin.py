"""The pin (patches/pin.toml): the one source of the release, the wheel and the upstream image.

It records what can be verified from a machine without GitHub: the upstream tag, the PyPI wheel of the same release
with its sha256, the upstream serving image, the NCCL the image runs, and the git blob ids of every file the series touches, before (base)
and after (patched). Everything else that names the release derives from here (scripts/series/pin_copies.py).

Reading uses the standard library (tomllib), so the image's python3 can run apply, smoke and doctor; writing edits
the file in place with tomlkit, which keeps its comments (export and refresh run on the host's .venv).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from ..lib.errors import UserError
from ..lib.repo import REPO_ROOT
from ..lib.tomlfile import load_toml

DEFAULT_PATCHES_DIR = REPO_ROOT / "patches"
PIN_FILE = "pin.toml"
NULL_BLOB = "0" * 40
SERVING_IMAGE = "eagle-fast-verify/sglang"  # the image `make image` builds; its tag is the pinned release tag


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
    nccl_package: str = ""  # [nccl]: the pip NCCL the image installs where torch loads it
    nccl_version: str = ""

    @property
    def path(self) -> Path:
        return self.patches_dir / PIN_FILE

    @property
    def series_path(self) -> Path:
        return self.patches_dir / self.series_file

    def series(self) -> list[Path]:
        return read_series(self.series_path)

    def describe(self) -> str:
        return f"SGLang {self.tag} (wheel {self.wheel_requirement})"

    @property
    def upstream_image(self) -> str:
        """name:tag of the upstream serving image (without the digest)."""
        return f"{self.image_name}:{self.image_tag}"

    @property
    def serving_image(self) -> str:
        """name:tag of the image `make image` builds from this pin."""
        return f"{SERVING_IMAGE}:{self.tag}"

    @property
    def nccl_requirement(self) -> str:
        """package==version of [nccl]; a UserError when the package does not fit the base image's CUDA major."""
        cuda = self.image_cuda
        want = f"nvidia-nccl-cu{cuda[0]}" if cuda else None
        if not self.nccl_package or not self.nccl_version:
            raise UserError(f"{self.path} has no [nccl] package and version: add them (package = \"{want}\", "
                            f"version = \"<a release from pip index versions {want}>\")")
        if want and self.nccl_package != want:
            raise UserError(f"{self.path} [nccl] package {self.nccl_package} does not fit the base image "
                            f"{self.upstream_image} (CUDA {cuda[0]}.{cuda[1]}): set package = \"{want}\"")
        return f"{self.nccl_package}=={self.nccl_version}"

    @property
    def image_cuda(self) -> tuple[int, int] | None:
        """CUDA release of the upstream image, from its tag (vX.Y.Z-cu130 -> (13, 0)); None if the tag says none."""
        m = re.search(r"cu(\d+)(\d)$", self.image_tag)
        return (int(m.group(1)), int(m.group(2))) if m else None


def read_series(series_path: Path) -> list[Path]:
    if not series_path.is_file():
        raise UserError(f"series file {series_path} is missing")
    out = []
    for raw in series_path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            out.append(series_path.parent / line)
    return out


def load_pin(patches_dir: Path | None = None) -> Pin:
    patches_dir = Path(patches_dir or DEFAULT_PATCHES_DIR)
    path = patches_dir / PIN_FILE
    if not path.is_file():
        raise UserError(f"no pin file at {path}: the patches directory must hold {PIN_FILE} and a series file")
    d = load_toml(path)
    try:
        up, wh, im, nc = d["upstream"], d["wheel"], d.get("image", {}), d.get("nccl", {})
        return Pin(patches_dir=patches_dir, repository=up["repository"], tag=up["tag"], version=up["version"],
                   commit=up.get("commit", ""), wheel_requirement=wh["requirement"], wheel_filename=wh["filename"],
                   wheel_sha256=wh["sha256"], image_name=im.get("name", ""), image_tag=im.get("tag", ""),
                   image_digest=im.get("digest", ""), series_file=d["series"]["file"],
                   base_blobs=dict(d.get("base_blobs", {})), patched_blobs=dict(d.get("patched_blobs", {})),
                   nccl_package=nc.get("package", ""), nccl_version=nc.get("version", ""))
    except KeyError as e:
        raise UserError(f"{path} lacks the key {e}; compare with the repository's patches/pin.toml (README "
                        f"'Layout' says what each table holds)") from e


def _set_table(table, values: dict[str, str]) -> None:
    """Replace a table's keys (sorted) and keep its comments."""
    for key in list(table.keys()):
        del table[key]
    for key, value in sorted(values.items()):
        table[key] = value


def write_pin(pin: Pin, dest: Path | None = None, template: Path | None = None) -> Path:
    """Write the pin to dest (default pin.path), editing the file there (or the template, or the repository's pin)
    in place: comments and layout stay, values and blob tables change. Needs tomlkit (the host's .venv)."""
    import tomlkit

    dest = Path(dest or pin.path)
    source = dest if dest.is_file() else Path(template or DEFAULT_PATCHES_DIR / PIN_FILE)
    doc = tomlkit.parse(source.read_text())
    for table, values in (("upstream", {"repository": pin.repository, "tag": pin.tag, "version": pin.version,
                                        "commit": pin.commit}),
                          ("wheel", {"requirement": pin.wheel_requirement, "filename": pin.wheel_filename,
                                     "sha256": pin.wheel_sha256}),
                          ("image", {"name": pin.image_name, "tag": pin.image_tag, "digest": pin.image_digest}),
                          ("series", {"file": pin.series_file})):
        for key, value in values.items():
            doc[table][key] = value
    if "nccl" in doc and pin.nccl_version:
        doc["nccl"]["package"], doc["nccl"]["version"] = pin.nccl_package, pin.nccl_version
    _set_table(doc["base_blobs"], pin.base_blobs)
    _set_table(doc["patched_blobs"], pin.patched_blobs)
    dest.write_text(tomlkit.dumps(doc))
    return dest
