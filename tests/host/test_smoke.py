"""scripts/host/smoke.py, the image build's import smoke: on the patched tree under test, and on generated packages
that fail the ways the image build can (the package itself, a driver-only import, a missing dependency)."""

import re
import subprocess
from pathlib import Path

import _fake_docker
from scripts.host import smoke

ROOT = Path(__file__).resolve().parents[2]


def run_smoke(pythonpath: Path, *args: str) -> subprocess.CompletedProcess:
    return _fake_docker.verb("scripts.host.smoke", *args, PYTHONPATH=str(pythonpath))


def counts(out: str) -> tuple[int, int, int]:
    return tuple(map(int, re.search(r"(\d+) import, (\d+) compiled only .*?, (\d+) failed", out).groups()))


def fake_sglang(tmp: Path, bodies: dict[str, str]) -> Path:
    """A package tree with every module the smoke imports; `bodies` replaces some modules' source."""
    mods = ["sglang", *smoke.ENTRY, *smoke.series_modules()]
    for mod in mods:
        parts = mod.split(".")
        for i in range(1, len(parts)):
            tmp.joinpath(*parts[:i]).mkdir(exist_ok=True)
            tmp.joinpath(*parts[:i], "__init__.py").touch()
        path = tmp.joinpath(*parts)
        target = path / "__init__.py" if any(m.startswith(mod + ".") for m in mods) else path.with_suffix(".py")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(bodies.get(mod, ""))
    return tmp


def test_the_patched_tree_imports_its_series_modules_and_loads_the_nccl_torch_runs(sglang_tree):
    from scripts.host.nccl import nccl_report

    mods = smoke.series_modules()
    assert "sglang.srt.speculative.eagle_worker_v2" in mods and len(mods) == len(set(mods))
    for mod in mods:
        path = sglang_tree / "python" / Path(*mod.split("."))
        assert path.with_suffix(".py").is_file() or (path / "__init__.py").is_file(), mod
    cp = run_smoke(sglang_tree / "python", "--expect-nccl", nccl_report()["nccl"])
    assert cp.returncode == 0, cp.stdout[-3000:]
    assert counts(cp.stdout) == (len(set([*smoke.ENTRY, *mods])), 0, 0)


def test_a_failing_package_is_named_once(tmp_path):
    site = fake_sglang(tmp_path, {"sglang": "import a_dependency_that_is_not_installed\n"})
    cp = run_smoke(site)
    assert cp.returncode == 1 and cp.stdout.count("FAIL") == 1 and "a_dependency_that_is_not_installed" in cp.stdout
    assert "KeyError" not in cp.stdout


def test_driver_only_failures_are_counted_apart_and_tolerated_alone(tmp_path):
    no_driver = "raise OSError('libcuda.so.1: cannot open shared object file: No such file or directory')\n"
    site = fake_sglang(tmp_path, {"sglang.launch_server": no_driver})
    strict, lenient = run_smoke(site), run_smoke(site, "--tolerate-no-driver")
    total = len(set([*smoke.ENTRY, *smoke.series_modules()]))
    assert strict.returncode == 1 and counts(strict.stdout) == (total - 1, 0, 1)
    assert lenient.returncode == 0 and counts(lenient.stdout) == (total - 1, 1, 0)
    other = run_smoke(site, "--tolerate-no-driver", "--expect-nccl", "2.0.0")  # not what torch loads
    assert other.returncode == 1 and re.search(r"^FAIL\s+NCCL", other.stdout, re.M)
    bodies = {"sglang.launch_server": "raise ValueError('libcuda.so.1: cannot open')\n"}  # not the driver's OSError
    site = fake_sglang(tmp_path / "b", {**bodies, "sglang.srt.server_args": "import a_module_that_does_not_exist\n"})
    cp = run_smoke(site, "--tolerate-no-driver")  # the tolerance hides no other failure
    assert cp.returncode == 1 and counts(cp.stdout)[2] == 2


def test_modules_come_from_the_patches(tmp_path):
    (tmp_path / "series").write_text("# a comment\n0001-a.patch\n")
    touched = "python/sglang/srt/x.py python/sglang/srt/pkg/__init__.py python/sglang/srt/k.cu test/t.py"
    touched += " python/sglang/srt/x.py"  # the first one twice
    (tmp_path / "0001-a.patch").write_text("".join(f"diff --git a/{f} b/{f}\n" for f in touched.split()))
    assert smoke.series_modules(tmp_path) == ["sglang.srt.x", "sglang.srt.pkg"]
