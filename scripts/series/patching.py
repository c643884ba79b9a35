"""The one apply core: used by `make apply`, the image build (site-packages layout) and the tests.

Before any file changes, every file the series touches is checked against the blob id the pin records for the
base (and for the patched result, which makes re-applying a no-op). A tree that is neither is refused with the
file, the blob ids and the release it should be.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from . import gitutil
from .base import add_excludes, read_version
from .errors import ConflictError, UserError
from .pin import NULL_BLOB, Pin, PatchInfo, series_patches, touched_files
from .progress import say

RECORD_NAME = "_patchset.json"  # inside the sglang package: sglang/_patchset.json


@dataclasses.dataclass
class Layout:
    """Where the sglang package lives: a git checkout (python/sglang) or an installed package (sglang/)."""

    root: Path
    kind: str  # "git" or "site"

    @property
    def pkg_dir(self) -> Path:
        return self.root / "python" / "sglang" if self.kind == "git" else self.root / "sglang"

    def path_of(self, repo_path: str) -> Path:
        if self.kind == "git":
            return self.root / repo_path
        if not repo_path.startswith("python/"):
            raise UserError(f"patch touches {repo_path}, outside python/: it cannot apply to an installed package")
        return self.root / repo_path[len("python/"):]


def patchset_id(patches: list[PatchInfo]) -> str:
    h = hashlib.sha256()
    for p in patches:
        h.update(p.path.name.encode() + b"\0" + p.path.read_bytes())
    return h.hexdigest()[:12]


def read_record(pkg_dir: Path) -> dict | None:
    f = Path(pkg_dir) / RECORD_NAME
    return json.loads(f.read_text()) if f.is_file() else None


def _record(pin: Pin, patches: list[PatchInfo], layout: Layout, base: dict) -> dict:
    return {
        "tool": "eagle-fast-verify patches",
        "patchset": patchset_id(patches),
        "base": {"tag": pin.tag, "requirement": pin.wheel_requirement, **base},
        "layout": layout.kind,
        "patches": [{"file": p.path.name, "subject": p.subject} for p in patches],
        "files": dict(sorted(pin.patched_blobs.items())),
        "applied_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


@dataclasses.dataclass
class State:
    kind: str  # "base", "patched", "mixed"
    mismatches: list[tuple[str, str | None]]  # (repo path, actual blob) not matching base (for mixed)


def classify(layout: Layout, pin: Pin, patches: list[PatchInfo]) -> State:
    files = touched_files(patches)
    missing = [f for f in files if f not in pin.base_blobs or f not in pin.patched_blobs]
    if missing:
        raise UserError(f"the pin lacks blob ids for {', '.join(missing)}: run `make export` to regenerate patches/pin.toml")
    actual = {f: gitutil.file_blob(layout.path_of(f)) or NULL_BLOB for f in files}
    if all(actual[f] == pin.patched_blobs[f] for f in files):
        return State("patched", [])
    if all(actual[f] == pin.base_blobs[f] for f in files):
        return State("base", [])
    return State("mixed", [(f, actual[f]) for f in files if actual[f] != pin.base_blobs[f]])


def wrong_base_message(layout: Layout, pin: Pin, state: State) -> str:
    version = read_version(layout.pkg_dir)
    lines = [f"{layout.root} is not the pinned base {pin.describe()}, so nothing was changed:"]
    for f, blob in state.mismatches[:8]:
        want = pin.base_blobs[f]
        shown = "(missing)" if blob == NULL_BLOB else blob[:12]
        lines.append(f"  {f}: blob {shown}, expected {'(absent)' if want == NULL_BLOB else want[:12]} (SGLang {pin.version})")
    if len(state.mismatches) > 8:
        lines.append(f"  ... and {len(state.mismatches) - 8} more")
    if version and version != pin.version:
        lines.append(f"The tree says it is SGLang {version}; this series is for SGLang {pin.version}.")
    lines.append(f"Fix: use a checkout of {pin.tag} (git checkout {pin.tag}) or the wheel {pin.wheel_requirement}; "
                 f"if the tree holds an older or partial patch set, reset it to {pin.tag} first.")
    return "\n".join(lines)


def _check_result(layout: Layout, pin: Pin, patches: list[PatchInfo]) -> None:
    st = classify(layout, pin, patches)
    if st.kind != "patched":
        raise UserError("the series applied but the result differs from the blob ids in patches/pin.toml "
                        "(patches and pin out of sync): run `make export` or `make check-patches`")


# ---------------------------------------------------------------------------------------------------------------
# git checkout layout: one commit per patch, `git am -3`


def _am_failure(repo: Path, patches: list[PatchInfo], output: str) -> tuple[PatchInfo | None, list[str]]:
    apply_dir = Path(gitutil.out(repo, "rev-parse", "--git-path", "rebase-apply"))
    if not apply_dir.is_absolute():
        apply_dir = repo / apply_dir
    failed = None
    nxt = apply_dir / "next"
    if nxt.is_file():
        i = int(nxt.read_text().strip()) - 1
        if 0 <= i < len(patches):
            failed = patches[i]
    files = gitutil.git(repo, "diff", "--name-only", "--diff-filter=U", check=False).stdout.split()
    if not files:
        files = sorted(set(re.findall(r"(?:Merge conflict in|patch failed:) (\S+?)(?::\d+)?$", output, re.M)))
    if not files and failed:
        files = list(failed.files)
    return failed, files


def apply_git(repo: Path, pin: Pin, base: dict | None = None) -> str:
    """Apply the series to a clean git checkout at the pinned base. Returns 'applied' or 'already'."""
    gitutil.require_git()
    repo = Path(repo).resolve()
    if not gitutil.is_repo(repo):
        raise UserError(f"{repo} is not the top of a git checkout. Clone SGLang {pin.tag} "
                        f"(git clone --branch {pin.tag} {pin.repository}) or run `make apply` without SGLANG_SRC.")
    patches = series_patches(pin)
    add_excludes(repo)
    dirty = gitutil.status_porcelain(repo)
    if dirty:
        shown = "\n  ".join(dirty.splitlines()[:10])
        raise UserError(f"{repo} has uncommitted changes, so nothing was applied:\n  {shown}\n"
                        f"Commit or stash them (git stash -u), or start from a clean checkout of {pin.tag}.")
    layout = Layout(repo, "git")
    state = classify(layout, pin, patches)
    if state.kind == "patched":
        if read_record(layout.pkg_dir) is None:
            _write_record(layout, _record(pin, patches, layout, base or {"source": "checkout"}))
        say(f"{repo} already has the {len(patches)} patches of this series; nothing to do")
        return "already"
    if state.kind == "mixed":
        raise UserError(wrong_base_message(layout, pin, state))
    orig = gitutil.out(repo, "rev-parse", "HEAD")
    say(f"applying {len(patches)} patches to {repo} with git am -3")
    for i, p in enumerate(patches, 1):
        say(f"  [{i}/{len(patches)}] {p.path.name}: {p.subject}")
    cp = gitutil.git(repo, "am", "-3", "--no-gpg-sign", *[str(p.path) for p in patches], check=False)
    if cp.returncode != 0:
        output = cp.stdout + cp.stderr
        failed, files = _am_failure(repo, patches, output)
        gitutil.git(repo, "am", "--abort", check=False)
        gitutil.git(repo, "reset", "-q", "--hard", orig, check=False)
        name = failed.path.name if failed else "(unknown patch)"
        raise ConflictError(
            f"patch {name} does not apply to {repo}: conflict in {', '.join(files) or '(see git output)'}.\n"
            f"The tree is back at {orig[:12]}, unchanged. Refresh the patch against {pin.tag} "
            f"(scripts/refresh.py) or fix it in build/sglang and `make export`.\n--- git am said:\n{output.strip()[-2000:]}")
    _check_result(layout, pin, patches)
    rec = _record(pin, patches, layout, base or {"source": "checkout", "commit": orig})
    rec["head"] = gitutil.out(repo, "rev-parse", "HEAD")
    _write_record(layout, rec)
    say(f"applied {len(patches)} patches; HEAD is {rec['head'][:12]}; record in {layout.pkg_dir / RECORD_NAME}")
    return "applied"


def _write_record(layout: Layout, rec: dict) -> None:
    (layout.pkg_dir / RECORD_NAME).write_text(json.dumps(rec, indent=1) + "\n")


# ---------------------------------------------------------------------------------------------------------------
# installed-package layout (site-packages): all patches or none


def find_site_packages(python: str = "python3") -> Path:
    """Directory holding the installed sglang package for `python`, found without importing sglang."""
    code = "import importlib.util,pathlib;s=importlib.util.find_spec('sglang');print(pathlib.Path(s.origin).parent.parent if s and s.origin else '')"
    cp = subprocess.run([python, "-c", code], capture_output=True, text=True)
    site = cp.stdout.strip()
    if cp.returncode != 0 or not site:
        raise UserError(f"{python} has no sglang installed: pip install {'sglang==...'} first, or pass --site-packages DIR")
    return Path(site)


def apply_site(site: Path, pin: Pin) -> str:
    """Apply the series to an installed package (site/sglang). Atomic: all patches or none."""
    gitutil.require_git()
    site = Path(site).resolve()
    layout = Layout(site, "site")
    if not (layout.pkg_dir / "__init__.py").is_file():
        raise UserError(f"{site} holds no sglang package (no {layout.pkg_dir / '__init__.py'}); pass the directory "
                        f"that contains sglang/, e.g. .../site-packages")
    patches = series_patches(pin)
    state = classify(layout, pin, patches)
    if state.kind == "patched":
        if read_record(layout.pkg_dir) is None:
            _write_record(layout, _record(pin, patches, layout, {"source": "site-packages"}))
        say(f"{layout.pkg_dir} already has the {len(patches)} patches of this series; nothing to do")
        return "already"
    if state.kind == "mixed":
        raise UserError(wrong_base_message(layout, pin, state))
    files = touched_files(patches)
    with tempfile.TemporaryDirectory(prefix="eagle-apply-") as tmp:
        stage = Path(tmp) / "stage"
        stage.mkdir()
        gitutil.git(stage, "init", "-q")
        for f in files:
            src = layout.path_of(f)
            if src.is_file():
                (stage / f).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, stage / f)
        for i, p in enumerate(patches, 1):
            say(f"  [{i}/{len(patches)}] {p.path.name}: {p.subject}")
            cp = gitutil.git(stage, "apply", "--whitespace=nowarn", str(p.path), check=False)
            if cp.returncode != 0:
                bad = sorted(set(re.findall(r"patch failed: (\S+?):\d+", cp.stderr))) or list(p.files)
                raise ConflictError(f"patch {p.path.name} does not apply to {site}: conflict in {', '.join(bad)}.\n"
                                    f"Nothing was changed there.\n--- git apply said:\n{cp.stderr.strip()[-2000:]}")
        staged = Layout(stage, "git")
        for f in files:
            if (gitutil.file_blob(staged.path_of(f)) or NULL_BLOB) != pin.patched_blobs[f]:
                raise UserError(f"staged result for {f} differs from patches/pin.toml; nothing was changed "
                                f"(patches and pin out of sync: run make export)")
        backup = Path(tmp) / "backup"
        done: list[tuple[Path, Path | None]] = []
        try:
            for f in files:
                dest, new = layout.path_of(f), staged.path_of(f)
                saved = None
                if dest.exists():
                    saved = backup / f
                    saved.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(dest, saved)
                if new.exists():
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    tmpdest = dest.with_name(dest.name + ".eagle-new")
                    shutil.copy2(new, tmpdest)
                    os.replace(tmpdest, dest)
                else:
                    dest.unlink()
                done.append((dest, saved))
                _drop_bytecode(dest)
            _write_record(layout, _record(pin, patches, layout, {"source": "site-packages"}))
        except BaseException:
            for dest, saved in reversed(done):
                if saved is not None:
                    shutil.copy2(saved, dest)
                elif dest.exists():
                    dest.unlink()
            raise
    say(f"applied {len(patches)} patches to {layout.pkg_dir}; record in {layout.pkg_dir / RECORD_NAME}")
    return "applied"


def _drop_bytecode(src: Path) -> None:
    cache = src.parent / "__pycache__"
    if cache.is_dir():
        for pyc in cache.glob(src.stem + ".*.pyc"):
            pyc.unlink()
