"""Files outside patches/pin.toml that must repeat a pinned fact, each rewritten from the pin.

Only docker/Dockerfile does: `docker build` reads its ARG defaults before any tool runs (make image passes the same
values as build arguments). Everything else derives the release at run time: the Makefile and `make image` (the
image tag is the pinned tag), doctor (the upstream image's CUDA release), bench/variants.toml ({patched_image},
{stock_image}). `make refresh WRITE=1` rewrites the copies; check-patches' lint fails while one is stale.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..lib.repo import REPO_ROOT
from .pin import DEFAULT_PATCHES_DIR, Pin

DOCKERFILE = REPO_ROOT / "docker" / "Dockerfile"


def dockerfile_args(pin: Pin) -> dict[str, str]:
    """The Dockerfile ARG defaults that come from the pin."""
    base = pin.upstream_image + (f"@{pin.image_digest}" if pin.image_digest else "")
    return {"BASE": base, "BASE_IMAGE": pin.image_name, "BASE_TAG": pin.image_tag, "BASE_DIGEST": pin.image_digest,
            "SGLANG_VERSION": pin.version}


def rewrite_args(text: str, values: dict[str, str]) -> str:
    for name, value in values.items():
        text = re.sub(rf"^ARG {name}=.*$", f"ARG {name}={value}", text, count=1, flags=re.M)
    return text


def _applies(pin: Pin) -> bool:
    """Copies follow the repository's own pin only (not a scratch series in a test or a refresh preview)."""
    return pin.patches_dir.resolve() == DEFAULT_PATCHES_DIR.resolve()


def stale_copies(pin: Pin, dockerfile: Path = DOCKERFILE) -> list[str]:
    """A line per copy that disagrees with the pin (empty: all agree)."""
    if not _applies(pin) or not dockerfile.is_file():
        return []
    text = dockerfile.read_text()
    shown = dockerfile.relative_to(REPO_ROOT) if dockerfile.is_relative_to(REPO_ROOT) else dockerfile
    return [f"{shown}: ARG {k} is not {v!r} as in patches/pin.toml"
            for k, v in dockerfile_args(pin).items() if not re.search(rf"^ARG {k}={re.escape(v)}$", text, re.M)]


def write_copies(pin: Pin, dockerfile: Path = DOCKERFILE) -> list[Path]:
    """Rewrite every copy from the pin; the files that changed."""
    if not _applies(pin):
        return []
    text = dockerfile.read_text()
    new = rewrite_args(text, dockerfile_args(pin))
    if new == text:
        return []
    dockerfile.write_text(new)
    return [dockerfile]
