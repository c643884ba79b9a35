"""The pristine upstream base: a clone of the tag, or the pinned PyPI wheel (pip checks its sha256) unpacked under
python/ in a fresh git repository whose one commit carries the tag. Either ends in a bare cache repository,
build/cache/sglang-<tag>.git (SGLANG_PATCHES_CACHE moves the cache), that the verbs clone from.
"""

import hashlib
import json
import os
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

from ..lib import git, proc
from ..lib.errors import UserError
from ..lib.progress import say
from ..lib.repo import BUILD_DIR
from .pin import UPSTREAM_HEAD, Pin

CACHE_DIR = Path(os.environ.get("SGLANG_PATCHES_CACHE") or BUILD_DIR / "cache")
SOURCES = ("auto", "clone", "wheel")
NETWORK_TIMEOUT = 1800.0  # a clone of the tag or a wheel download on a slow link


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def pip_download(requirement: str, dest: Path, sha256: str = "", like: str = "") -> proc.Result:
    """pip download one wheel into dest, its progress on the terminal; with sha256, pip refuses any other file
    (--require-hashes); like: a wheel file name whose interpreter and platform to download for."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(dest)]
    py, _, platforms = like.removesuffix(".whl").split("-")[-3:] if like.count("-") >= 4 else ("", "", "")
    if py.startswith("cp"):
        cmd += ["--python-version", py[2:], "--implementation", "cp"]
        cmd += [arg for platform in platforms.split(".") for arg in ("--platform", platform)]
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as req:
        req.write(f"{requirement} --hash=sha256:{sha256}\n" if sha256 else f"{requirement}\n")
        req.flush()
        hashes = ["--require-hashes"] if sha256 else []
        return proc.run([*cmd, *hashes, "-r", req.name], timeout=NETWORK_TIMEOUT, capture=False)


def pinned_wheel(pin: Pin, cache_dir: Path) -> Path:
    """The pinned wheel: SGLANG_WHEEL (checked), the cache's copy (checked), or pip's download (pip checks it)."""
    local = Path(os.environ.get("SGLANG_WHEEL") or cache_dir / pin.wheel_filename)
    if local.is_file() and sha256_file(local) == pin.wheel_sha256:
        return local
    if os.environ.get("SGLANG_WHEEL"):
        what = f"sha256 {sha256_file(local)}" if local.is_file() else "no such file"
        raise UserError(
            f"SGLANG_WHEEL={local} is not the pinned wheel ({what}); patches/pin.toml wants "
            f"{pin.wheel_filename}, sha256 {pin.wheel_sha256}. Point SGLANG_WHEEL at that wheel, or unset "
            f"it to download it"
        )
    local.unlink(missing_ok=True)  # a broken download
    say(f"downloading {pin.wheel_requirement} ({pin.wheel_filename}) from PyPI; pip checks its sha256")
    got = pip_download(pin.wheel_requirement, cache_dir, pin.wheel_sha256, pin.wheel_filename)
    if not got.ok or not local.is_file():
        raise UserError(
            f"pip could not download {pin.wheel_filename} (pip says why above). Copy it from a machine "
            f"that can, and set SGLANG_WHEEL=/path/to/{pin.wheel_filename}"
        )
    return local


def _wheel_repo(wheel: Path, work: Path, tag: str) -> dict:
    git.git(work.parent, "init", "-q", "-b", "main", str(work))
    with zipfile.ZipFile(wheel) as z:
        names = [n for n in z.namelist() if n.startswith("sglang/") and not n.endswith("/")]
        say(f"unpacking {wheel.name}: {len(names)} files (seconds)")
        for n in names:
            (work / "python" / n).parent.mkdir(parents=True, exist_ok=True)
            (work / "python" / n).write_bytes(z.read(n))
            (work / "python" / n).chmod(0o755 if (z.getinfo(n).external_attr >> 16) & 0o111 else 0o644)
    say(f"committing the base tree ({len(names)} files)")
    git.git(work, "add", "-A")
    git.git(work, "commit", "-q", "-m", f"SGLang {tag} from the PyPI wheel {wheel.name}", fixed_date=True)
    git.git(work, "tag", tag)
    return {"source": "wheel", "wheel": wheel.name, "sha256": sha256_file(wheel)}


def pick_source(source: str, repository: str, tag: str) -> str:
    """auto: clone when the repository answers, else the wheel (and say so)."""
    repository = os.environ.get("SGLANG_REPO") or repository
    if source != "auto":
        return source
    if proc.run(["git", "ls-remote", "--exit-code", repository, f"refs/tags/{tag}"], timeout=20, env=git.git_env()).ok:
        return "clone"
    say(
        f"{repository} does not answer: taking the base from the PyPI wheel (the same sources as the tag, sha256 "
        f"checked; SGLANG_BASE=clone insists on the clone)"
    )
    return "wheel"


def ensure_base(pin: Pin, source: str = "auto", tag: str | None = None, wheel: Path | None = None) -> tuple[Path, dict]:
    """(the bare cache repository of `tag`, what it was made from), made once. source: auto | clone | wheel;
    SGLANG_WHEEL (checked against the pin, also when the cache exists) makes it the wheel. tag, wheel: another
    release than the pin's, and its wheel file (refresh)."""
    tag, repository = tag or pin.tag, os.environ.get("SGLANG_REPO") or pin.repository
    if source not in SOURCES:
        raise UserError(f"SGLANG_BASE={source} is not one of {', '.join(SOURCES)}")
    if os.environ.get("SGLANG_WHEEL") and tag == pin.tag:
        if source == "clone":
            raise UserError("SGLANG_WHEEL asks for the base from a wheel, SGLANG_BASE=clone for a clone: unset one")
        wheel, source = pinned_wheel(pin, CACHE_DIR), "wheel"
    bare = CACHE_DIR / f"sglang-{tag}.git"
    if (bare / "eagle-base.json").is_file():
        info = json.loads((bare / "eagle-base.json").read_text())
        want = sha256_file(wheel) if wheel else pin.wheel_sha256 if tag == pin.tag else info.get("sha256")
        if source in ("auto", info["source"]) and (info["source"] == "clone" or info.get("sha256") == want):
            return bare, info
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    source = "wheel" if wheel else pick_source(source, repository, tag)
    with tempfile.TemporaryDirectory(dir=CACHE_DIR, prefix=".base-") as tmp:
        work = Path(tmp) / "work"
        if source == "clone":
            say(f"cloning {repository} at {tag}")
            if not proc.run(
                ["git", "clone", "--progress", "--depth", "1", "--branch", tag, repository, str(work)],
                env=git.git_env(),
                timeout=NETWORK_TIMEOUT,
                capture=False,
            ).ok:
                raise UserError(
                    f"git clone of {repository} at {tag} failed (git says why above); without GitHub, "
                    f"take the base from the PyPI wheel: SGLANG_BASE=wheel"
                )
            git.git(work, "tag", "-f", tag)
            info = {"source": "clone", "repository": repository}
        else:
            info = _wheel_repo(wheel or pinned_wheel(pin, CACHE_DIR), work, tag)
        info.update(tag=tag, commit=git.head(work))
        git.git(CACHE_DIR, "clone", "-q", "--bare", str(work), str(Path(tmp) / bare.name))
        git.git(Path(tmp) / bare.name, "repack", "-a", "-d", "-q")  # one pack: its clones start no background gc
        (Path(tmp) / bare.name / "eagle-base.json").write_text(json.dumps(info, indent=1) + "\n")
        replace_dir(Path(tmp) / bare.name, bare)
    say(f"base {tag}: {info['source']}, commit {info['commit'][:12]}")
    return bare, info


def replace_dir(new: Path, dest: Path) -> None:
    """Put directory `new` at `dest` (same file system): the old one is renamed aside first and removed last."""
    old = dest.with_name(f".{dest.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if dest.exists():
        dest.rename(old)
    new.rename(dest)
    shutil.rmtree(old, ignore_errors=True)


def clone_base(bare: Path, dest: Path, tag: str) -> None:
    """A working tree at the pristine tag, cloned from the cache, refs/patches/upstream-head set to it."""
    git.git(Path(dest).parent, "clone", "-q", "--no-checkout", str(bare), str(dest))
    git.git(dest, "checkout", "-q", "-B", "patched", f"refs/tags/{tag}")
    git.git(dest, "update-ref", UPSTREAM_HEAD, "HEAD")
