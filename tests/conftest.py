"""Test setup: every test that imports sglang gets the *patched tree* (build/sglang/python), never an installed copy.

sglang is deliberately not installed in .venv (see requirements/README.md), and this file puts the tree first on
sys.path before any test module is imported. It refuses to run against a tree that does not hold the current
series (stale build/sglang: run `make apply`).

SGLANG_TREE=<dir> points the tests at another tree (a helper's work tree, or the pristine base when proving that
patch tests fail without the patches: scripts/series/prove_tests.py); the freshness check is then skipped.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts.series.patchfile import series_patches  # noqa: E402
from scripts.series.pin import load_pin  # noqa: E402
from scripts.series.record import patchset_id, read_record  # noqa: E402

DEFAULT_TREE = ROOT / "build" / "sglang"
TREE = Path(os.environ.get("SGLANG_TREE") or DEFAULT_TREE).resolve()
PKG_PARENT = TREE / "python"


def _tree_problem() -> str | None:
    if not (PKG_PARENT / "sglang" / "__init__.py").is_file():
        return f"{TREE} holds no SGLang tree: run `make apply` first"
    if "SGLANG_TREE" in os.environ:
        return None
    rec = read_record(PKG_PARENT / "sglang")
    want = patchset_id(series_patches(load_pin()))
    if rec is None or rec.get("patchset") != want:
        got = rec.get("patchset") if rec else "none"
        return f"{TREE} holds patch set {got}, but patches/ is {want}: run `make apply` to bring it up to date"
    return None


PROBLEM = _tree_problem()
if PROBLEM is None:
    sys.path.insert(0, str(PKG_PARENT))


def pytest_report_header(config):
    return [f"sglang tree: {TREE}" + (f" (unusable: {PROBLEM})" if PROBLEM else "")]


@pytest.fixture(scope="session")
def sglang_tree() -> Path:
    """The SGLang tree under test; importing sglang afterwards is guaranteed to come from it."""
    if PROBLEM:
        pytest.fail(PROBLEM, pytrace=False)
    spec = importlib.util.find_spec("sglang")
    origin = Path(spec.origin).resolve() if spec and spec.origin else None
    if origin is None or PKG_PARENT.resolve() not in origin.parents:
        pytest.fail(f"sglang would be imported from {origin}, not from {PKG_PARENT}", pytrace=False)
    return TREE


# ------------------------------------------------------------------------------ patch-tooling fixtures
# Real git, real files: the "upstream" is a git repository made from the pinned wheel's files.
CACHE = ROOT / "build" / "cache"


def _wheel(requirement: str, filename: str) -> Path:
    """A real sglang wheel from PyPI, downloaded once into build/cache (the same cache make apply uses)."""
    from scripts.series.upstream import download_wheel

    if not (CACHE / filename).is_file():
        assert download_wheel(requirement, CACHE, filename, quiet=True), f"could not download {requirement}"
    return CACHE / filename


@pytest.fixture(scope="session")
def pinned_wheel() -> Path:
    """The wheel patches/pin.toml pins."""
    pin = load_pin()
    return _wheel(pin.wheel_requirement, pin.wheel_filename)


@pytest.fixture(scope="session")
def other_wheel() -> Path:
    """The wheel of another release (tests/_releases.py), for the same interpreter and platform."""
    from _releases import OTHER_FILENAME, OTHER_REQUIREMENT

    return _wheel(OTHER_REQUIREMENT, OTHER_FILENAME)


@pytest.fixture(scope="session")
def upstream(tmp_path_factory, pinned_wheel) -> Path:
    """A local stand-in for the upstream repository: a bare repository whose pinned tag holds the wheel's files
    under python/ (built by the same code as the wheel fallback of make apply)."""
    from scripts.lib import git
    from scripts.series.upstream import git_tree_from_wheel, sha256_file

    root = tmp_path_factory.mktemp("upstream")
    git_tree_from_wheel(pinned_wheel, root / "work", load_pin().tag, sha256_file(pinned_wheel))
    git.git(root, "clone", "-q", "--bare", str(root / "work"), str(root / "sglang.git"))
    return root / "sglang.git"


@pytest.fixture(scope="session")
def base_cache(tmp_path_factory) -> Path:
    """One SGLANG_PATCHES_CACHE for the tests that do not test base creation itself (the base is built once)."""
    return tmp_path_factory.mktemp("base-cache")


@pytest.fixture(scope="session")
def nccl_wheels() -> Path:
    """A directory holding the pinned NCCL wheel (patches/pin.toml [nccl]), downloaded once from PyPI into
    build/cache/nccl (pip download --no-deps); the image's NCCL step installs from it with PIP_NO_INDEX."""
    from scripts.series.upstream import download_wheel

    pin = load_pin()
    dest = CACHE / "nccl"
    name = pin.nccl_package.replace("-", "_")
    if not list(dest.glob(f"{name}-{pin.nccl_version}-*.whl")):
        requirement = f"{pin.nccl_package}=={pin.nccl_version}"
        if download_wheel(requirement, dest, quiet=True) is None:
            pytest.skip(f"cannot download {requirement} (pip download failed)")
    return dest
