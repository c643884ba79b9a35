"""git on the command line (through lib.proc), with a fixed identity so commits the tooling makes are reproducible.

`head()` is the one way to ask a checkout for its HEAD, `rev()` for the commit of a ref; `git()` runs any
other command and raises a UserError that names the command and git's message when it fails (check=True).
"""

import hashlib
import os
from pathlib import Path

from . import proc
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
TIMEOUT = 600.0  # local operations on a tree of SGLang's size


def git_env(fixed_date: bool = False) -> dict[str, str]:
    env = dict(os.environ)
    env.update(TOOL_IDENT)
    env["GIT_TERMINAL_PROMPT"] = "0"
    env.pop("GIT_DIR", None)
    env.pop("GIT_WORK_TREE", None)
    if fixed_date:
        env["GIT_AUTHOR_DATE"] = env["GIT_COMMITTER_DATE"] = FIXED_DATE
    # No background `gc --auto` after commit/am: it kept writing into trees the tooling was removing (temporary
    # trees of ~6000 loose objects), and a tool's tree is either short-lived or packed once (the base cache).
    n = int(env.get("GIT_CONFIG_COUNT") or 0)
    for i, (key, value) in enumerate((("gc.auto", "0"), ("maintenance.auto", "false")), n):
        env[f"GIT_CONFIG_KEY_{i}"], env[f"GIT_CONFIG_VALUE_{i}"] = key, value
    env["GIT_CONFIG_COUNT"] = str(n + 2)
    return env


def git(
    repo: Path,
    *args: str,
    check: bool = True,
    fixed_date: bool = False,
    input: str | None = None,
    timeout: float | None = TIMEOUT,
    env: dict[str, str] | None = None,
) -> proc.Result:
    res = proc.run(["git", "-C", str(repo), *args], env=env or git_env(fixed_date), input=input, timeout=timeout)
    if check and not res.ok:
        said = res.stderr.strip() or res.stdout.strip() or res.why
        raise UserError(f"git {' '.join(args)} failed in {repo}:\n{said}")
    return res


def out(repo: Path, *args: str) -> str:
    return git(repo, *args).stdout.strip()


def head(repo: Path, short: bool = False) -> str | None:
    """The commit id HEAD of a checkout names (7 characters if short), or None when it is no git checkout."""
    res = git(repo, "rev-parse", *(["--short=7"] if short else []), "HEAD", check=False, timeout=30)
    return (res.stdout.strip() or None) if res.ok else None


def rev(repo: Path, ref: str) -> str | None:
    """The commit id `ref` (refs/tags/TAG, refs/patches/...) names in a checkout, or None (the one way to ask)."""
    res = git(repo, "rev-parse", "-q", "--verify", f"{ref}^{{commit}}", check=False, timeout=30)
    return (res.stdout.strip() or None) if res.ok else None


def is_repo(path: Path) -> bool:
    if not path.is_dir() or git(path, "rev-parse", "--git-dir", check=False).returncode != 0:
        return False
    return git(path, "rev-parse", "--show-toplevel", check=False).stdout.strip() == str(path.resolve())


def blob_id(data: bytes) -> str:
    """What `git hash-object` prints for a file with these bytes."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def file_blob(path: Path) -> str | None:
    return blob_id(path.read_bytes()) if path.is_file() else None


def status_porcelain(repo: Path, *paths: str, untracked: bool = True) -> str:
    """`git status --porcelain` (of `paths` only, when given), without taking the index lock."""
    untracked_files = [] if untracked else ["--untracked-files=no"]
    return git(repo, "--no-optional-locks", "status", "--porcelain", *untracked_files, "--", *paths).stdout.rstrip()
