"""scripts/host/smoke.py: the import smoke check the image build runs after applying the series.

Synthetic series (real `git format-patch` files and a pin) applied with the real apply core to a small fake sglang
package keep these fast; tests/host/test_image.py runs the same verb against the real wheel.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

from scripts.host import smoke
from scripts.lib import git
from scripts.series.patchfile import expected_blobs, parse_patch
from scripts.series.pin import load_pin, write_pin

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable

FAKE_BASE = {
    "python/sglang/__init__.py": "",
    "python/sglang/launch_server.py": "",
    "python/sglang/srt/__init__.py": "",
    "python/sglang/srt/server_args.py": "FLAGS = []\n",
    "python/sglang/srt/layers/__init__.py": "",
    "python/sglang/srt/layers/comm.py": "def all_reduce(x):\n    return x\n",
    "python/sglang/srt/kernels.cu": "// not python\n",
}


def make_series(tmp: Path, base: dict[str, str], changes: list[tuple[str, dict[str, str]]], *,
                digest: str = "") -> Path:
    """A patches directory (format-patch files, series, pin.toml) that turns `base` (repo path -> text) into the
    result of each (subject, {repo path: new text}) commit in order. Blob ids come from the patches themselves."""
    repo = tmp / "series-src"
    repo.mkdir(parents=True)
    git.git(repo, "init", "-q", "-b", "main")
    for path, text in base.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    git.git(repo, "add", "-A")
    git.git(repo, "commit", "-q", "-m", "base", fixed_date=True)
    for subject, files in changes:
        for path, text in files.items():
            (repo / path).parent.mkdir(parents=True, exist_ok=True)
            (repo / path).write_text(text)
        git.git(repo, "add", "-A")
        git.git(repo, "commit", "-q", "-m", subject, fixed_date=True)
    pdir = tmp / "patches"
    pdir.mkdir()
    git.git(repo, "format-patch", "-q", "--full-index", "--no-signature", "-o", str(pdir),
                f"HEAD~{len(changes)}")
    names = sorted(p.name for p in pdir.glob("*.patch"))
    (pdir / "series").write_text("".join(n + "\n" for n in names))
    b, f = expected_blobs([parse_patch(pdir / n) for n in names])
    pin = dataclasses.replace(load_pin(), patches_dir=pdir, base_blobs=b, patched_blobs=f, image_digest=digest)
    write_pin(pin, pdir / "pin.toml")
    return pdir


def fake_site(tmp: Path, base: dict[str, str] = FAKE_BASE) -> Path:
    site = tmp / "site"
    for path, text in base.items():
        if path.startswith("python/"):
            dest = site / path[len("python/"):]
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(text)
    return site


def run_verb(module: str, *args: str, site: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    return subprocess.run([PY, "-m", f"scripts.{module}", *args], cwd=ROOT, capture_output=True, text=True, env=env,
                          timeout=300)


def applied_fake(tmp: Path, comm_text: str) -> tuple[Path, Path]:
    pdir = make_series(tmp, FAKE_BASE, [("patch comm", {"python/sglang/srt/layers/comm.py": comm_text,
                                                         "python/sglang/srt/kernels.cu": "// changed\n"})])
    site = fake_site(tmp)
    cp = run_verb("series.apply", "--site-packages", str(site), "--patches-dir", str(pdir))
    assert cp.returncode == 0, cp.stderr
    return pdir, site


def test_module_names_from_repo_paths():
    assert smoke.module_for("python/sglang/srt/layers/comm.py") == ("sglang.srt.layers.comm", "")
    assert smoke.module_for("python/sglang/srt/layers/__init__.py") == ("sglang.srt.layers", "")
    assert smoke.module_for("python/sglang/srt/kernels.cu")[0] is None
    assert smoke.module_for("test/registered/test_x.py")[0] is None
    assert smoke.module_for("python/sglang/srt/bad-name.py")[0] is None


def test_plan_follows_the_series(tmp_path):
    pdir = make_series(tmp_path, FAKE_BASE, [
        ("one", {"python/sglang/srt/layers/comm.py": "X = 1\n"}),
        ("two", {"python/sglang/srt/server_args.py": "FLAGS = [1]\n", "python/sglang/srt/new_mod.py": "Y = 2\n"}),
    ])
    pid, rows = smoke.plan(pdir)
    mods = [m for _, m, _ in rows if m]
    assert mods == ["sglang.srt.layers.comm", "sglang.srt.new_mod", "sglang.srt.server_args"]  # series order
    assert len(pid) == 12


def test_smoke_passes_on_a_patched_package(tmp_path):
    pdir, site = applied_fake(tmp_path, "def all_reduce(x):\n    return x * 1\n")
    cp = run_verb("host.smoke", "--site-packages", str(site), "--patches-dir", str(pdir), "--json")
    rep = json.loads(cp.stdout)
    assert cp.returncode == 0 and rep["ok"], cp.stdout + cp.stderr
    mods = {r["module"]: r["status"] for r in rep["modules"]}
    assert mods == {"sglang": "ok", "sglang.srt.server_args": "ok", "sglang.launch_server": "ok",
                    "sglang.srt.layers.comm": "ok"}
    assert any("kernels.cu" in ln and ln.startswith("skip") for ln in rep["lines"])


def test_smoke_fails_on_a_module_that_does_not_import(tmp_path):
    pdir, site = applied_fake(tmp_path, "def all_reduce(x):\n    return x +\n")  # syntax error from the patch
    cp = run_verb("host.smoke", "--site-packages", str(site), "--patches-dir", str(pdir))
    assert cp.returncode == 1
    assert "FAIL  sglang.srt.layers.comm" in cp.stdout and "SyntaxError" in cp.stdout


def test_smoke_refuses_an_unpatched_or_foreign_tree(tmp_path):
    pdir = make_series(tmp_path, FAKE_BASE, [("p", {"python/sglang/srt/layers/comm.py": "X = 1\n"})])
    site = fake_site(tmp_path)
    cp = run_verb("host.smoke", "--site-packages", str(site), "--patches-dir", str(pdir))
    assert cp.returncode == 1 and "was not applied" in cp.stdout
    (site / "sglang" / "_patchset.json").write_text(json.dumps({"patchset": "0123456789ab"}))
    cp = run_verb("host.smoke", "--site-packages", str(site), "--patches-dir", str(pdir))
    assert cp.returncode == 1 and "holds patch set 0123456789ab" in cp.stdout


def test_expect_patchset_guards_stale_build_args(tmp_path):
    pdir, site = applied_fake(tmp_path, "X = 3\n")
    pid, _ = smoke.plan(pdir)
    ok = run_verb("host.smoke", "--site-packages", str(site), "--patches-dir", str(pdir), "--expect-patchset", pid)
    bad = run_verb("host.smoke", "--site-packages", str(site), "--patches-dir", str(pdir), "--expect-patchset",
                   "ffffffffffff")
    assert ok.returncode == 0, ok.stdout
    assert bad.returncode == 1 and "stale build argument" in bad.stdout


def test_no_driver_tolerance_is_narrow(tmp_path):
    no_driver = "raise OSError('libcuda.so.1: cannot open shared object file: No such file or directory')\n"
    pdir, site = applied_fake(tmp_path, no_driver)
    strict = run_verb("host.smoke", "--site-packages", str(site), "--patches-dir", str(pdir))
    lenient = run_verb("host.smoke", "--site-packages", str(site), "--patches-dir", str(pdir), "--tolerate-no-driver")
    assert strict.returncode == 1 and "FAIL  sglang.srt.layers.comm" in strict.stdout
    assert lenient.returncode == 0 and "needs the NVIDIA driver" in lenient.stdout


def test_no_driver_tolerance_does_not_hide_other_errors(tmp_path):
    pdir, site = applied_fake(tmp_path, "import a_module_that_does_not_exist_anywhere\n")
    cp = run_verb("host.smoke", "--site-packages", str(site), "--patches-dir", str(pdir), "--tolerate-no-driver")
    assert cp.returncode == 1 and "a_module_that_does_not_exist_anywhere" in cp.stdout


def test_check_reports_imports_from_elsewhere(tmp_path, monkeypatch):
    pkg = tmp_path / "p"
    (pkg / "sglang_elsewhere_probe").mkdir(parents=True)
    (pkg / "sglang_elsewhere_probe" / "__init__.py").write_text("")
    other = tmp_path / "other"
    other.mkdir()
    monkeypatch.syspath_prepend(str(pkg))
    lines: list[str] = []
    res = smoke.check(other, ["sglang_elsewhere_probe"], False, lines.append)
    assert res[0]["status"] == "fail"
