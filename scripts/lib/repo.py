"""This repository: where it is, where builds go, and which revision it is at (for labels and result files)."""

import os
from pathlib import Path

from . import git

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_DIR = REPO_ROOT / "build"
PROFILES_DIR = REPO_ROOT / "docker" / "profiles"  # the serving profiles (serve --profile NAME)
SHIPPED_PROFILE = "kimi-k25-eagle3-tp8"  # the one serve starts by default; the plan and the receipt judge it
GIT_REV_VAR = "EAGLE_GIT_REV"  # machines that get a copy of the tree without .git (the lent GPU machines)


def revision(short: bool = False, *paths: str) -> tuple[str, bool]:
    """(HEAD of this repository, whether tracked files differ from it); ("unknown", False) without git.
    With paths, only changes under those count as dirty."""
    if os.environ.get(GIT_REV_VAR):
        return os.environ[GIT_REV_VAR], False
    head = git.head(REPO_ROOT, short=short)
    if head is None:
        return "unknown", False
    try:
        dirty = bool(git.status_porcelain(REPO_ROOT, *paths, untracked=False))
    except Exception:  # noqa: BLE001 - a revision label never fails the caller
        dirty = False
    return head, dirty


def source_url() -> str:
    """Where this repository's source lives (EAGLE_SOURCE_URL, else git's origin), for image labels."""
    if os.environ.get("EAGLE_SOURCE_URL"):
        return os.environ["EAGLE_SOURCE_URL"]
    res = git.git(REPO_ROOT, "config", "--get", "remote.origin.url", check=False, timeout=20)
    return res.stdout.strip() or "unknown"
