"""A tiny world for the series verbs: a fake upstream "sglang" git repository with tag v0.0.1, its wheel in a local
pip index (PIP_FIND_LINKS, so pip's own --require-hashes check runs), and a patches/ directory of two patches that
the real `export` made from commits. The verbs run as the real CLI in a subprocess."""

import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from scripts.lib import git

ROOT = Path(__file__).resolve().parents[2]
AUTHOR = "Test Author <test.author@example.org>"
FILES = {
    "__init__.py": "",
    "_version.py": "__version__ = version = '{v}'\n",
    "srt/a.py": "".join(f"A{i} = {i}\n" for i in range(20)),
    "srt/b.py": "B = 1\n",
}
PIN = """[upstream]
repository = "{repo}"
tag = "v{v}"
version = "{v}"

[wheel]
requirement = "sglang=={v}"
filename = "sglang-{v}-py3-none-any.whl"
sha256 = "{sha}"

[image]
name = "lmsysorg/sglang"
tag = "v{v}-cu130"
digest = ""

[series]
file = "series"
"""


def message(subject: str, why: str = "a reason.") -> str:
    return (
        f"{subject}\n\nWhy: {why}\n\nMeasured: nothing yet.\n\nForwarded: no\nOrigin: vendor\n"
        f"Last-Update: 2026-12-01\nRetire-When: never.\n"
    )


def commit(tree: Path, files: dict[str, str], msg: str) -> None:
    for name, text in files.items():
        (tree / "python" / "sglang" / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / "python" / "sglang" / name).write_text(text)
    git.git(tree, "add", "-A")
    git.git(tree, "commit", "-q", "-m", msg, "--author", AUTHOR, fixed_date=True)


def wheel(dest: Path, version: str, files: dict[str, str]) -> Path:
    path = dest / f"sglang-{version}-py3-none-any.whl"
    dest.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(f"sglang/{name}", text)
        info = f"sglang-{version}.dist-info"
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return path


class World:
    def __init__(self, tmp: Path):
        self.tmp, self.upstream, self.patches = tmp, tmp / "upstream", tmp / "patches"
        self.files = {k: v.format(v="0.0.1") for k, v in FILES.items()}
        git.git(tmp, "init", "-q", "-b", "main", str(self.upstream))
        commit(self.upstream, self.files, "SGLang 0.0.1")
        git.git(self.upstream, "tag", "v0.0.1")
        self.wheel = wheel(tmp / "index", "0.0.1", self.files)
        self.patches.mkdir()
        sha = hashlib.sha256(self.wheel.read_bytes()).hexdigest()
        (self.patches / "pin.toml").write_text(PIN.format(repo=f"file://{self.upstream}", v="0.0.1", sha=sha))
        (self.patches / "series").write_text("")
        self.dev = tmp / "dev"
        git.git(tmp, "clone", "-q", "--branch", "v0.0.1", str(self.upstream), str(self.dev))
        commit(self.dev, {"srt/b.py": "B = 2\n"}, message("srt: b is two"))
        ten = self.files["srt/a.py"].replace("A10 = 10", "A10 = 'ten'")
        commit(self.dev, {"srt/a.py": ten, "srt/c.py": "C = 3\n"}, message("srt: a ten is a word, and c"))
        assert self.run("export", "--tree", self.dev).returncode == 0
        self.names = (self.patches / "series").read_text().split()[-2:]

    def env(self, **extra) -> dict[str, str]:
        env = dict(os.environ, SGLANG_BASE="", SGLANG_WHEEL="", SGLANG_REPO="")  # empty: unset, to the verbs
        env.update(SGLANG_PATCHES_CACHE=str(self.tmp / "cache"), PIP_FIND_LINKS=str(self.tmp / "index"))
        env.update(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")  # pip's own hash check, on the local index
        return {**env, **extra}

    def run(self, verb: str, *args, **env) -> subprocess.CompletedProcess:
        args = args if "--patches-dir" in args else (*args, "--patches-dir", self.patches)
        argv = [sys.executable, "-m", f"scripts.series.{verb}", *map(str, args)]
        return subprocess.run(argv, cwd=ROOT, env=self.env(**env), capture_output=True, text=True, timeout=300)

    def checkout(self, name: str = "checkout") -> Path:
        dest = self.tmp / name
        git.git(self.tmp, "clone", "-q", "--branch", "v0.0.1", str(self.upstream), str(dest))
        return dest


def subjects(tree: Path, base: str = "refs/patches/upstream-head") -> list[str]:
    return git.out(tree, "log", "--reverse", "--format=%s", f"{base}..HEAD").splitlines()


@pytest.fixture
def world(tmp_path) -> World:
    return World(tmp_path)
