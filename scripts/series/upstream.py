"""The pinned, unpatched upstream tree: a clone of the tag, or the pinned PyPI wheel turned into a git tree.

Both end in a bare cache repository build/cache/sglang-<tag>.git whose tag <tag> is the pristine base; apply,
check-patches, refresh, prove-tests and the tests clone from it (a local clone takes a second). `download_wheel`
is the one way a wheel is fetched (pip download, for the platform the wheel's file name says). SGLANG_WHEEL=<file>
(a wheel you already have, for the pinned base) is checked against the pin every time, also when the cache exists;
a file that is not the pinned wheel is an error that says what the file is and what the pin wants.
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
from .record import RECORD_NAME

CACHE_DIR = Path(os.environ.get("SGLANG_PATCHES_CACHE") or BUILD_DIR / "cache")  # base + wheel cache
SOURCES = ("auto", "clone", "wheel")
# Files git must never see as changes in a base or patched tree (bytecode from imports, our record).
EXCLUDES = ("__pycache__/", "*.pyc", f"/python/sglang/{RECORD_NAME}")
NETWORK_TIMEOUT = 1800.0  # a clone of the tag or a wheel download on a slow link


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def github_reachable(url: str, tag: str, timeout: float = 20.0) -> tuple[bool, str]:
    res = proc.run(["git", "ls-remote", "--exit-code", url, f"refs/tags/{tag}"], timeout=timeout, env=git.git_env())
    if res.ok:
        return True, res.stdout.split()[0] if res.stdout.split() else ""
    return False, (res.stderr.strip().splitlines() or [res.why])[-1]


def download_wheel(requirement: str, dest: Path, filename: str | None = None, quiet: bool = False) -> Path | None:
    """pip download the wheel of `requirement` into dest (for the interpreter and platform `filename` names, when
    given); the downloaded file, or None when pip failed or left no single matching wheel."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(dest)]
    cmd += ["-q"] if quiet else []
    if filename:
        try:
            from packaging.utils import InvalidWheelFilename, parse_wheel_filename
        except ImportError as e:
            raise UserError("downloading a wheel for its platform needs the packaging library: pip install "
                            "packaging (make setup has it in .venv), or set SGLANG_WHEEL=<file>") from e
        try:
            tag = next(iter(parse_wheel_filename(filename)[3]))
        except (InvalidWheelFilename, StopIteration) as e:
            raise UserError(f"{filename} is not a wheel file name ({e}); fix [wheel] filename in patches/pin.toml") from e
        if tag.interpreter.startswith("cp"):
            cmd += ["--python-version", tag.interpreter[2:], "--implementation", "cp", "--platform", tag.platform]
    if not proc.run(cmd + [requirement], timeout=NETWORK_TIMEOUT, capture=quiet).ok:
        return None
    if filename:
        return dest / filename if (dest / filename).is_file() else None
    name = re.sub(r"[-_.]+", "_", re.split(r"[=<>!~ ]", requirement, 1)[0])  # as wheel file names spell it
    version = requirement.split("==", 1)[-1]
    found = sorted(dest.glob(f"{name}-{version}-*.whl"))
    return found[0] if len(found) == 1 else None


def wheel_metadata_text(path: Path) -> str:
    """The header of a wheel's .dist-info/METADATA ('' when it has none); OSError / BadZipFile when unreadable."""
    with zipfile.ZipFile(path) as z:
        meta = next((n for n in z.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")), None)
        return z.read(meta).decode("utf-8", "replace").split("\n\n", 1)[0] if meta else ""


def wheel_requires(path: Path) -> list[str] | None:
    """The Requires-Dist lines of a wheel (None when it is not readable)."""
    try:
        return re.findall(r"^Requires-Dist: *(.+?) *$", wheel_metadata_text(path), re.M)
    except (zipfile.BadZipFile, OSError):
        return None


def wheel_release(path: Path) -> tuple[str, str] | str:
    """(name, version) a wheel file says it is (its .dist-info/METADATA), or why it says nothing."""
    try:
        text = wheel_metadata_text(path)
    except (zipfile.BadZipFile, OSError) as e:
        return f"not a readable wheel ({e})"
    fields = dict(re.findall(r"^(Name|Version): *(.+?) *$", text, re.M))
    if not fields.get("Version"):
        return "a zip file without wheel metadata (no .dist-info/METADATA with a Version)"
    return fields.get("Name", "?"), fields["Version"]


def wheel_metadata(path: Path) -> str:
    """What a wheel file says it is ("sglang 0.5.22", from its .dist-info/METADATA), or why it says nothing."""
    release = wheel_release(path)
    return release if isinstance(release, str) else " ".join(release)


def _pinned(requirement: str, filename: str, sha256: str) -> str:
    return f"the pin (patches/pin.toml) wants {filename} ({requirement}) with sha256 {sha256}"


def check_local_wheel(local: str, requirement: str, filename: str, sha256: str) -> Path:
    """The wheel SGLANG_WHEEL names, verified against the pin; a UserError that says what the file is (name,
    version from its metadata, sha256) and what the pin wants when it is not the pinned wheel."""
    path = Path(local)
    if not path.is_file():
        raise UserError(f"SGLANG_WHEEL={local} does not exist; {_pinned(requirement, filename, sha256)}. Point "
                        f"SGLANG_WHEEL at a copy of that wheel, or unset it")
    say(f"verifying sha256 of {path.name} (SGLANG_WHEEL)")
    got = sha256_file(path)
    if sha256 and got != sha256:
        raise UserError(f"SGLANG_WHEEL={local} is not the pinned wheel: the file {path.name} is "
                        f"{wheel_metadata(path)} (its metadata), sha256 {got};\n"
                        f"{_pinned(requirement, filename, sha256)}.\nPoint SGLANG_WHEEL at that wheel, or unset "
                        f"SGLANG_WHEEL (the base then comes from the base cache or the pinned wheel from PyPI).")
    return path


def fetch_wheel(pin: Pin, cache_dir: Path = CACHE_DIR, requirement: str | None = None, filename: str | None = None,
                sha256: str | None = None, local: str | None = None) -> Path:
    """Return a verified local copy of the wheel: `local` (SGLANG_WHEEL, a file you already have) or the copy in
    the cache, downloaded first if missing."""
    requirement = requirement or pin.wheel_requirement
    filename = filename or pin.wheel_filename
    sha256 = pin.wheel_sha256 if sha256 is None else sha256
    if local:
        return check_local_wheel(local, requirement, filename, sha256)
    path = cache_dir / filename
    if not path.is_file():
        say(f"downloading {requirement} ({filename}) from PyPI into {cache_dir}")
        if download_wheel(requirement, cache_dir, filename) is None:
            raise UserError(f"could not download {requirement} ({filename}) from PyPI. "
                            f"Download it elsewhere and set SGLANG_WHEEL=/path/to/{filename}")
    if sha256:
        say(f"verifying sha256 of {path.name}")
        got = sha256_file(path)
        if got != sha256:
            raise UserError(f"{path} in the wheel cache is {wheel_metadata(path)}, sha256 {got}; "
                            f"{_pinned(requirement, filename, sha256)}. It is the cache's copy (a broken or replaced "
                            f"download): remove it (rm {path}) and retry to download it again")
    return path


def unpack_wheel(wheel: Path, target: Path, prefix: str = "", only: str | None = "sglang/") -> int:
    """Extract the wheel's files (only those under `only`, if given) to target/prefix, keeping exec bits."""
    with zipfile.ZipFile(wheel) as z:
        names = [n for n in z.namelist() if not n.endswith("/") and (only is None or n.startswith(only))]
        prog = Progress(f"unpacking {wheel.name}", len(names))
        for n in names:
            dest = target / prefix / n
            dest.parent.mkdir(parents=True, exist_ok=True)
            with z.open(n) as src, open(dest, "wb") as dst:
                shutil.copyfileobj(src, dst)
            mode = (z.getinfo(n).external_attr >> 16) & 0o777
            if mode & 0o111:
                dest.chmod(0o755)
            prog.step()
        prog.close()
    return len(names)


def read_version(pkg_dir: Path) -> str | None:
    """The release a tree's sglang package says it is (wheel trees carry _version.py)."""
    for name in ("_version.py", "version.py"):
        f = pkg_dir / name
        if f.is_file():
            m = re.search(r"__version__\s*=\s*(?:version\s*=\s*)?['\"]([^'\"]+)['\"]", f.read_text())
            if m:
                return m.group(1)
    return None


def add_excludes(repo: Path) -> None:
    exclude = Path(git.out(repo, "rev-parse", "--git-path", "info/exclude"))
    if not exclude.is_absolute():
        exclude = repo / exclude
    exclude.parent.mkdir(parents=True, exist_ok=True)
    have = exclude.read_text().splitlines() if exclude.exists() else []
    with open(exclude, "a") as f:
        for pat in EXCLUDES:
            if pat not in have:
                f.write(pat + "\n")


def git_tree_from_wheel(wheel: Path, dest: Path, tag: str, sha256: str) -> str:
    """A fresh git repository with the wheel's sglang/ under python/, one commit tagged `tag`. Returns its id."""
    dest.mkdir(parents=True)
    git.git(dest, "init", "-q", "-b", "main")
    add_excludes(dest)
    unpack_wheel(wheel, dest, prefix="python")
    say("committing the base tree")
    git.git(dest, "add", "-A")
    msg = (f"SGLang {tag} from the PyPI wheel {wheel.name}\n\nsha256 {sha256}\n"
           f"The wheel's sglang/ is the repository's python/sglang/ (upstream layout).\n")
    git.git(dest, "commit", "-q", "-m", msg, fixed_date=True)
    git.git(dest, "tag", tag)
    return git.head(dest)


def base_cache_path(tag: str, cache_dir: Path = CACHE_DIR) -> Path:
    return cache_dir / f"sglang-{tag}.git"


def base_info_path(bare: Path) -> Path:
    return bare / "eagle-base.json"


def _pick_source(source: str, repository: str, tag: str, requirement: str) -> str:
    if source != "auto":
        return source
    ok, detail = github_reachable(repository, tag)
    if ok:
        return "clone"
    say(f"{repository} is not reachable ({detail}); falling back to the pinned PyPI wheel {requirement}, verified "
        f"by sha256 (same Python sources as the tag; set SGLANG_BASE=clone to insist on GitHub)")
    return "wheel"


def _clone_tag(repository: str, tag: str, work: Path, wheel_way: str) -> dict:
    say(f"cloning {repository} at {tag}")
    res = proc.run(["git", "clone", "--progress", "--depth", "1", "--branch", tag, repository, str(work)],
                   env=git.git_env(), timeout=NETWORK_TIMEOUT, capture=False)
    if not res.ok:
        raise UserError(f"git clone of {repository} at {tag} failed ({res.why}). Without GitHub, build the base "
                        f"from the PyPI wheel instead: {wheel_way}")
    add_excludes(work)
    commit = git.head(work)
    git.git(work, "tag", "-f", tag)
    say(f"the clone of {tag} is commit {commit}")
    return {"source": "clone", "repository": repository, "tag": tag, "commit": commit}


def _cached(bare: Path, source: str, sha256: str | None) -> dict | None:
    """What the base cache holds, when it serves `source` (a wheel-made cache only for that wheel's sha256)."""
    if not (bare.is_dir() and base_info_path(bare).is_file()):
        return None
    info = json.loads(base_info_path(bare).read_text())
    stale = info["source"] == "wheel" and sha256 and info.get("sha256") != sha256
    if source in ("auto", info["source"]) and not stale:
        return info
    why = f"another wheel (sha256 {info.get('sha256')})" if stale else info["source"]
    say(f"the base cache {bare} was made from {why}; making it from the {source} beside it (the cache is replaced "
        f"only when that succeeds)")
    return None


def ensure_base(pin: Pin, source: str = "auto", cache_dir: Path = CACHE_DIR, repository: str | None = None,
                tag: str | None = None, wheel: dict | None = None,
                wheel_way: str = "run it again with SGLANG_BASE=wheel") -> tuple[Path, dict]:
    """Make (once) and return the bare base repository for `tag`, and what it came from.

    source: auto (clone if the upstream answers, else the wheel, and say so), clone, or wheel.
    wheel: optional {requirement, filename, sha256} for another release than the pin's (refresh).
    wheel_way: the caller's command that builds this base from the wheel, printed when a clone fails.
    SGLANG_WHEEL (for the pinned base) is always checked against the pin, also when the cache already exists, and
    makes `auto` build from it rather than try a clone.
    """
    if source not in SOURCES:
        raise UserError(f"unknown base source {source!r}: use one of {', '.join(SOURCES)}")
    git.require_git()
    repository = repository or os.environ.get("SGLANG_REPO") or pin.repository
    tag = tag or pin.tag
    w = wheel or {}
    local = os.environ.get("SGLANG_WHEEL") if wheel is None and tag == pin.tag else None
    if local:
        if source == "clone":
            raise UserError(f"SGLANG_WHEEL={local} asks for the base from that wheel, but SGLANG_BASE=clone asks "
                            f"for a clone of {tag}: unset one of them")
        check_local_wheel(local, pin.wheel_requirement, pin.wheel_filename, pin.wheel_sha256)
    sha256 = w.get("sha256") or (pin.wheel_sha256 if tag == pin.tag else None)
    bare = base_cache_path(tag, cache_dir)
    info = _cached(bare, source, sha256)
    if info is not None:
        return bare, info
    cache_dir.mkdir(parents=True, exist_ok=True)
    source = "wheel" if local else _pick_source(source, repository, tag, w.get("requirement", pin.wheel_requirement))
    with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:
        work = Path(tmp) / "work"
        if source == "clone":
            info = _clone_tag(repository, tag, work, wheel_way)
        else:
            path = fetch_wheel(pin, cache_dir, w.get("requirement"), w.get("filename"), w.get("sha256"), local)
            digest = w.get("sha256") or sha256_file(path)
            commit = git_tree_from_wheel(path, work, tag, digest)
            info = {"source": "wheel", "tag": tag, "wheel": path.name, "sha256": digest, "commit": commit}
        new = Path(tmp) / bare.name
        git.git(cache_dir, "clone", "-q", "--bare", str(work), str(new))
        # One pack instead of ~6000 loose objects: trees cloned from the cache then never start git's background
        # `gc --auto` (after git am), which raced the removal of temporary trees.
        git.git(new, "repack", "-a", "-d", "-q")
        base_info_path(new).write_text(json.dumps(info, indent=1) + "\n")
        replace_dir(new, bare)
    return bare, info


def replace_dir(new: Path, dest: Path) -> None:
    """Put the directory `new` where `dest` is: the old one is renamed aside (into a fresh hidden directory beside it),
    the new one renamed in, and only then is the old one removed; if the rename in fails, the old one is put back.
    dest need not exist; new must be on the same file system (beside dest)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    holder = Path(tempfile.mkdtemp(prefix=f".{dest.name}.old-", dir=dest.parent))
    aside = holder / dest.name
    try:
        if dest.exists():
            dest.rename(aside)
        new.rename(dest)
    except BaseException:
        if aside.exists() and not dest.exists():
            aside.rename(dest)
        if not aside.exists():
            holder.rmdir()
        raise
    shutil.rmtree(holder)  # the old one, now that the new one is in place


def clone_base(bare: Path, dest: Path, tag: str) -> None:
    """A working tree at the pristine base tag, cloned from the cache."""
    dest = Path(dest).resolve()
    if dest.exists() and any(dest.iterdir()):
        raise UserError(f"{dest} exists and is not empty; remove it or pick another directory")
    dest.parent.mkdir(parents=True, exist_ok=True)
    git.git(dest.parent, "clone", "-q", "--branch", tag, str(bare), str(dest))
    git.git(dest, "checkout", "-q", "-B", "patched", tag)
    add_excludes(dest)
