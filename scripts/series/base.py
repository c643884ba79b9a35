"""The pristine upstream base: a clone of the tag, or the pinned PyPI wheel (pip checks its sha256) unpacked under
python/ in a fresh git repository whose one commit carries the tag. Either ends in a bare cache repository,
build/cache/sglang-<tag>.git (SGLANG_PATCHES_CACHE moves it), that apply, check-patches, refresh and prove-tests
clone from. SGLANG_WHEEL=<file> (a copy of the pinned wheel you have) is checked against the pin every time.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

from ..lib import git, proc
from ..lib.errors import UserError
from ..lib.progress import Progress, say
from ..lib.repo import BUILD_DIR
from .pin import Pin

CACHE_DIR = Path(os.environ.get("SGLANG_PATCHES_CACHE") or BUILD_DIR / "cache")
SOURCES = ("auto", "clone", "wheel")
NETWORK_TIMEOUT = 1800.0  # a clone of the tag or a wheel download on a slow link


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def wheel_metadata(path: Path) -> str:
    """The header of a wheel's .dist-info/METADATA ('' when it has none or is no readable wheel)."""
    try:
        with zipfile.ZipFile(path) as z:
            meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
            return z.read(meta).decode("utf-8", "replace").split("\n\n", 1)[0]
    except (OSError, zipfile.BadZipFile, StopIteration):
        return ""


def wheel_version(path: Path) -> str:
    found = re.findall(r"^Version: *(\S+)", wheel_metadata(path), re.M)
    return found[0] if found else "not a wheel"


def pip_download(requirement: str, dest: Path, sha256: str = "", like: str = "") -> proc.Result:
    """pip download one wheel into dest; with sha256, pip refuses any other file (--require-hashes); like: a wheel
    file name whose interpreter and platform to download for. pip's progress goes to the terminal."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(dest)]
    py, _, plat = like.removesuffix(".whl").split("-")[-3:] if like.count("-") >= 4 else ("", "", "")
    if py.startswith("cp"):
        cmd += ["--python-version", py[2:], "--implementation", "cp", *[a for p in plat.split(".")
                                                                        for a in ("--platform", p)]]
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as req:
        req.write(f"{requirement} --hash=sha256:{sha256}\n" if sha256 else f"{requirement}\n")
        req.flush()
        return proc.run(cmd + (["--require-hashes"] if sha256 else []) + ["-r", req.name],
                        timeout=NETWORK_TIMEOUT, capture=False)


def pinned_wheel(pin: Pin, cache_dir: Path) -> Path:
    """The pinned wheel: SGLANG_WHEEL (checked), the cache's copy (checked), or a fresh download (pip checks it)."""
    local = os.environ.get("SGLANG_WHEEL")
    if local:
        if not Path(local).is_file() or sha256_file(Path(local)) != pin.wheel_sha256:
            what = (f"sglang {wheel_version(Path(local))}, sha256 {sha256_file(Path(local))}" if Path(local).is_file()
                    else "no such file")
            raise UserError(f"SGLANG_WHEEL={local} is not the pinned wheel ({what}); patches/pin.toml wants "
                            f"{pin.wheel_filename} with sha256 {pin.wheel_sha256}. Point SGLANG_WHEEL at that wheel, "
                            f"or unset it to download it")
        return Path(local)
    path = cache_dir / pin.wheel_filename
    if path.is_file() and sha256_file(path) != pin.wheel_sha256:
        say(f"{path} has another sha256 than the pin (a broken download): downloading it again")
        path.unlink()
    if not path.is_file():
        say(f"downloading {pin.wheel_requirement} ({pin.wheel_filename}) from PyPI, sha256 checked by pip")
        res = pip_download(pin.wheel_requirement, cache_dir, pin.wheel_sha256, pin.wheel_filename)
        if not res.ok or not path.is_file():
            raise UserError(f"pip could not download {pin.wheel_filename} (pip says why above). "
                            f"Copy it here from a machine that can and set SGLANG_WHEEL=/path/to/{pin.wheel_filename}")
    return path


def _wheel_repo(wheel: Path, work: Path, tag: str) -> dict:
    git.git(work.parent, "init", "-q", "-b", "main", str(work))
    with zipfile.ZipFile(wheel) as z:
        names = [n for n in z.namelist() if n.startswith("sglang/") and not n.endswith("/")]
        prog = Progress(f"unpacking {wheel.name}", len(names))
        for n in names:
            (work / "python" / n).parent.mkdir(parents=True, exist_ok=True)
            (work / "python" / n).write_bytes(z.read(n))
            if (z.getinfo(n).external_attr >> 16) & 0o111:
                (work / "python" / n).chmod(0o755)
            prog.step()
        prog.close()
    say(f"committing the base tree ({len(names)} files)")
    git.git(work, "add", "-A")
    git.git(work, "commit", "-q", "-m", f"SGLang {tag} from the PyPI wheel {wheel.name}", fixed_date=True)
    git.git(work, "tag", tag)
    return {"source": "wheel", "tag": tag, "wheel": wheel.name, "sha256": sha256_file(wheel)}


def _clone_repo(repository: str, work: Path, tag: str) -> dict:
    say(f"cloning {repository} at {tag}")
    res = proc.run(["git", "clone", "--progress", "--depth", "1", "--branch", tag, repository, str(work)],
                   env=git.git_env(), timeout=NETWORK_TIMEOUT, capture=False)
    if not res.ok:
        raise UserError(f"git clone of {repository} at {tag} failed (git says why above); without GitHub, take "
                        f"the base from the PyPI wheel: SGLANG_BASE=wheel")
    git.git(work, "tag", "-f", tag)
    return {"source": "clone", "tag": tag, "repository": repository}


def pick_source(source: str, repository: str, tag: str) -> str:
    if source != "auto":
        return source
    repository = os.environ.get("SGLANG_REPO") or repository
    if proc.run(["git", "ls-remote", "--exit-code", repository, f"refs/tags/{tag}"], timeout=20,
                env=git.git_env()).ok:
        return "clone"
    say(f"{repository} does not answer: taking the base from the PyPI wheel (same sources as the tag, sha256 "
        f"checked; SGLANG_BASE=clone insists on the clone)")
    return "wheel"


def ensure_base(pin: Pin, source: str = "auto", tag: str | None = None, wheel: Path | None = None,
                cache_dir: Path | None = None) -> tuple[Path, dict]:
    """(the bare cache repository of `tag`, what it was made from), made once. source: auto | clone | wheel.
    tag, wheel: another release than the pin's and its wheel file (refresh)."""
    cache_dir, tag = Path(cache_dir or CACHE_DIR), tag or pin.tag
    if source not in SOURCES:
        raise UserError(f"SGLANG_BASE={source} is not one of {', '.join(SOURCES)}")
    if os.environ.get("SGLANG_WHEEL") and tag == pin.tag:
        if source == "clone":
            raise UserError("SGLANG_WHEEL asks for the base from a wheel, SGLANG_BASE=clone for a clone: unset one")
        wheel, source = pinned_wheel(pin, cache_dir), "wheel"
    bare = cache_dir / f"sglang-{tag}.git"
    info_file = bare / "eagle-base.json"
    if info_file.is_file():
        info = json.loads(info_file.read_text())
        sha = sha256_file(wheel) if wheel else pin.wheel_sha256 if tag == pin.tag else info.get("sha256")
        if source in ("auto", info["source"]) and (info["source"] == "clone" or info.get("sha256") == sha):
            return bare, info
    cache_dir.mkdir(parents=True, exist_ok=True)
    source = "wheel" if wheel else pick_source(source, os.environ.get("SGLANG_REPO") or pin.repository, tag)
    with tempfile.TemporaryDirectory(dir=cache_dir, prefix=".base-") as tmp:
        work = Path(tmp) / "work"
        if source == "clone":
            info = _clone_repo(os.environ.get("SGLANG_REPO") or pin.repository, work, tag)
        else:
            info = _wheel_repo(wheel or pinned_wheel(pin, cache_dir), work, tag)
        info["commit"] = git.head(work)
        new = Path(tmp) / bare.name
        git.git(cache_dir, "clone", "-q", "--bare", str(work), str(new))
        git.git(new, "repack", "-a", "-d", "-q")  # one pack: clones of it never start a background gc
        (new / "eagle-base.json").write_text(json.dumps(info, indent=1) + "\n")
        replace_dir(new, bare)
    say(f"base {tag}: {info['source']}, commit {info['commit'][:12]}")
    return bare, info


def replace_dir(new: Path, dest: Path) -> None:
    """Put directory `new` at `dest` (same file system): the old one is moved aside first and removed last."""
    aside = Path(tempfile.mkdtemp(prefix=f".{dest.name}.old-", dir=dest.parent))
    if dest.exists():
        dest.rename(aside / dest.name)
    try:
        new.rename(dest)
    except BaseException:
        if (aside / dest.name).exists():
            (aside / dest.name).rename(dest)
        raise
    finally:
        shutil.rmtree(aside)


def clone_base(bare: Path, dest: Path, tag: str) -> None:
    """A working tree at the pristine tag, cloned from the cache, with refs/patches/upstream-head set."""
    git.git(Path(dest).parent, "clone", "-q", "--no-checkout", str(bare), str(dest))
    git.git(dest, "checkout", "-q", "-B", "patched", f"refs/tags/{tag}")
    git.git(dest, "update-ref", "refs/patches/upstream-head", "HEAD")
