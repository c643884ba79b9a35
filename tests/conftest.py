"""Every test that imports sglang gets the patched tree (build/sglang/python), put first on sys.path here (sglang is
not installed in .venv), and only while the tree holds patches/' series (its commits after
refs/patches/upstream-head, exported, are patches/ byte for byte). SGLANG_TREE=<dir> names another tree, unchecked
(prove_tests points it at the pristine base).
"""

import importlib.util
import os
import sys
from pathlib import Path

import pytest

pytest_plugins = ["_app"]  # the real HTTP app on CPU: fixtures server, embedding_server

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
for _var in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES"):  # under `make test`, a test's make is not nested
    os.environ.pop(_var, None)

from scripts.series.pin import applied_patchset, patchset_id  # noqa: E402

DEFAULT_TREE = ROOT / "build" / "sglang"
TREE = Path(os.environ.get("SGLANG_TREE") or DEFAULT_TREE).resolve()
PKG_PARENT = TREE / "python"


def _tree_problem() -> str | None:
    if not (PKG_PARENT / "sglang" / "__init__.py").is_file():
        return f"{TREE} holds no SGLang tree: run `make apply` first"
    if "SGLANG_TREE" in os.environ:
        return None
    have, want = applied_patchset(TREE), patchset_id()
    if have != want:
        return (
            f"{TREE} holds patch set {have or 'none'}, but patches/ is {want}: run `make apply` (or `make export`, "
            f"if you committed in {TREE})"
        )
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


@pytest.fixture(scope="session")
def nccl_wheels() -> Path:
    """A directory holding the pinned NCCL wheel (patches/pin.toml [nccl]), downloaded once from PyPI into
    build/cache/nccl (pip download --no-deps); the image's NCCL step installs from it with PIP_NO_INDEX."""
    from scripts.series.base import pip_download
    from scripts.series.pin import load_pin

    pin = load_pin()
    dest = ROOT / "build" / "cache" / "nccl"
    name = pin.nccl_package.replace("-", "_")
    if not list(dest.glob(f"{name}-{pin.nccl_version}-*.whl")):
        requirement = f"{pin.nccl_package}=={pin.nccl_version}"
        if not pip_download(requirement, dest).ok:
            pytest.skip(f"cannot download {requirement} (pip download failed)")
    return dest
