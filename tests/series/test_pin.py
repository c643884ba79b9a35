"""patches/pin.toml is the one source of the release: written in place (comments kept), and every copy of it (the
Dockerfile's ARG defaults) rewritten from it and checked against it; everything else derives it at run time."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import sys

from scripts.bench import config as bench_config
from scripts.lib.repo import REPO_ROOT
from scripts.series import pin_copies
from scripts.series.pin import load_pin, write_pin
from scripts.series.refresh import moved_pin

PIN = load_pin()


def test_write_pin_keeps_the_file_and_its_comments(tmp_path):
    copy = tmp_path / "pin.toml"
    shutil.copy(PIN.path, copy)
    write_pin(PIN, copy)
    assert copy.read_text() == PIN.path.read_text()  # byte-stable: export round trips depend on it
    some = next(iter(PIN.base_blobs))
    write_pin(dataclasses.replace(PIN, base_blobs={**PIN.base_blobs, some: "f" * 40}), copy)
    changed = [ln for ln in copy.read_text().splitlines() if ln not in PIN.path.read_text().splitlines()]
    assert changed == [f'"{some}" = "{"f" * 40}"']
    fresh = tmp_path / "new" / "pin.toml"
    fresh.parent.mkdir()
    write_pin(PIN, fresh)  # no file yet: the repository's pin is the template
    assert fresh.read_text() == PIN.path.read_text()


def test_facts_derived_from_the_pin():
    assert PIN.serving_image == f"eagle-fast-verify/sglang:{PIN.tag}"
    assert PIN.upstream_image == f"{PIN.image_name}:{PIN.image_tag}"
    assert dataclasses.replace(PIN, image_tag="v9.9.9-cu130").image_cuda == (13, 0)
    assert dataclasses.replace(PIN, image_tag="v9.9.9-cu128").image_cuda == (12, 8)
    assert dataclasses.replace(PIN, image_tag="latest").image_cuda is None
    vals = bench_config.placeholder_values(bench_config.load_variants().defaults, {})
    assert (vals["patched_image"], vals["stock_image"]) == (PIN.serving_image, PIN.upstream_image)


def test_the_dockerfile_copy_agrees_and_is_rewritten_from_the_pin(tmp_path):
    assert pin_copies.stale_copies(PIN) == []
    old = tmp_path / "Dockerfile"
    old.write_text(pin_copies.DOCKERFILE.read_text().replace(PIN.image_tag, "v0.5.22-cu129"))
    stale = pin_copies.stale_copies(PIN, old)
    assert stale and all("as in patches/pin.toml" in s for s in stale)
    assert pin_copies.write_copies(PIN, old) == [old]
    assert old.read_text() == pin_copies.DOCKERFILE.read_text() and pin_copies.stale_copies(PIN, old) == []
    moved = dataclasses.replace(PIN, patches_dir=tmp_path)  # a scratch series: the repository's copies stay
    assert pin_copies.stale_copies(moved) == [] and pin_copies.write_copies(moved) == []


def test_refresh_moves_every_fact():
    wheel = {"requirement": "sglang==0.5.24", "filename": "sglang-0.5.24-cp311-cp311-manylinux_2_34_x86_64.whl",
             "sha256": "ab" * 32}
    pinned = dataclasses.replace(PIN, image_digest="sha256:" + "cd" * 32)
    new = moved_pin(pinned, "v0.5.24", "0.5.24", wheel, None)
    assert (new.tag, new.version, new.wheel_requirement) == ("v0.5.24", "0.5.24", "sglang==0.5.24")
    assert new.image_tag == PIN.image_tag.replace(PIN.tag, "v0.5.24") and new.image_digest == ""
    assert moved_pin(pinned, PIN.tag, PIN.version, None, None).image_digest == pinned.image_digest
    assert moved_pin(pinned, "v0.5.24", "0.5.24", None, "v0.5.24-cu131").image_tag == "v0.5.24-cu131"
    args = pin_copies.dockerfile_args(new)
    assert args["BASE"] == f"{PIN.image_name}:{new.image_tag}" and args["SGLANG_VERSION"] == "0.5.24"


def test_the_makefile_names_no_release_and_only_existing_verbs():
    text = (REPO_ROOT / "Makefile").read_text()
    assert PIN.tag not in text and PIN.version not in text
    for module in set(re.findall(r"-m (scripts\.[\w.]+)", text)):
        assert (REPO_ROOT / (module.replace(".", "/") + ".py")).is_file(), module
    cp = subprocess.run(["make", "-s", "image", "DRY_RUN=1", f"PY={sys.executable}"], cwd=REPO_ROOT,
                        capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, cp.stderr
    cmd = cp.stdout.strip().splitlines()[-1]
    assert cmd.startswith("docker build -f ") and f"-t {PIN.serving_image} " in cmd
