"""Thin wrappers over the git command line, with a fixed identity so base commits are reproducible."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from .errors import UserError

# Identity and date for commits the tooling makes itself (wheel base, tests). Fixed so the same input
# gives the same commit ids; `git am` keeps each patch's own author.
TOOL_IDENT = {
    "GIT_AUTHOR_NAME": "eagle-fast-verify",
    "GIT_AUTHOR_EMAIL": "eagle-fast-verify@localhost",
    "GIT_COMMITTER_NAME": "eagle-fast-verify",
    "GIT_COMMITTER_EMAIL": "eagle-fast-verify@localhost",
}
FIXED_DATE = "2000-01-01T00:00:00+0000"


def git_env(fixed_date: bool = False) -> dict[str, str]:
    env = dict(os.environ)
    env.update(TOOL_IDENT)
    env["GIT_TERMINAL_PROMPT"] = "0"
    env.pop("GIT_DIR", None)
    env.pop("GIT_WORK_TREE", None)
    if fixed_date:
        env["GIT_AUTHOR_DATE"] = env["GIT_COMMITTER_DATE"] = FIXED_DATE
    return env


def require_git() -> None:
    if shutil.which("git") is None:
        raise UserError("git is not installed; install it (apt-get install git) and retry")


def git(repo: Path, *args: str, check: bool = True, fixed_date: bool = False, input: str | None = None,
        timeout: float | None = None) -> subprocess.CompletedProcess:
    cp = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, env=git_env(fixed_date),
                        input=input, timeout=timeout)
    if check and cp.returncode != 0:
        raise UserError(f"git {' '.join(args)} failed in {repo}:\n{cp.stderr.strip() or cp.stdout.strip()}")
    return cp


def out(repo: Path, *args: str) -> str:
    return git(repo, *args).stdout.strip()


def is_repo(path: Path) -> bool:
    return path.is_dir() and git(path, "rev-parse", "--git-dir", check=False).returncode == 0 and \
        git(path, "rev-parse", "--show-toplevel", check=False).stdout.strip() == str(path.resolve())


def blob_id(data: bytes) -> str:
    """What `git hash-object` prints for a file with these bytes."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def file_blob(path: Path) -> str | None:
    return blob_id(path.read_bytes()) if path.is_file() else None


def status_porcelain(repo: Path) -> str:
    return git(repo, "status", "--porcelain").stdout.rstrip()
