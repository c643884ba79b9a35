"""`make refresh`: move the series to a new upstream version and report, per patch, what happened.

  python -m scripts.series.refresh --tag v0.5.24                      clone the new tag (needs the upstream repository)
  python -m scripts.series.refresh --wheel sglang==0.5.24 [--tag v0.5.24] [--wheel-file F]   from a PyPI wheel
  python -m scripts.series.refresh --sync                             only rewrite the pin's copies (the Dockerfile)
  python -m scripts.series.refresh --wheel ... --resume               write from the tree a conflicting refresh left
  python -m scripts.series.refresh --wheel ... --resume --drop P      ... leaving out patch P on purpose

Each patch is tried in order on a tree of the new base (build/sglang-refresh): `clean` (applies as is),
`3-way` (needed git am's 3-way merge; re-export to refresh its context), or `conflict` (skipped; the patches
after it are still tried, so you see the whole picture). With --write and no conflict, what follows from the pin
moves to the new base: patches/pin.toml (tag, version, wheel, the upstream image's tag with its digest cleared),
patches/ (re-exported from the refreshed tree) and the Dockerfile's ARG defaults; the tests and READMEs derive the
release from the pin. What only a person can move is printed as a list: the requirements, the NCCL choice, the
image digest, and every tracked file that still names the old release (claims about it, patch messages' line
references), outside the records of what ran on it (bench/results, bench/receipts, tests/fixtures). After a
conflict, port the skipped patches by hand in that tree and run the same refresh with --resume (make refresh ...
RESUME=1): it writes from the tree as it is, without building it again, once the tree holds every patch of the
series (a patch is matched by its Patch-Filename: line); a patch left out is named and refused, unless --drop
names it (make refresh ... RESUME=1 DROP="<patch> ..."): dropping a patch is an explicit act. A wheel is the
release its METADATA says. The old base honours SGLANG_BASE and SGLANG_WHEEL.
Exit status: 0 every patch applied (and, with --write or --resume, moved); 1 some patch conflicts; 2 a usage problem.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil
import tempfile
from pathlib import Path

from ..lib import git
from ..lib.cli import run
from ..lib.errors import UserError
from ..lib.progress import say
from ..lib.repo import BUILD_DIR, REPO_ROOT
from .exporting import export
from .headers import patch_filename
from .patchfile import series_patches
from .patching import am_failure, apply_git
from .pin import Pin, load_pin, write_pin
from .pin_copies import write_copies
from .upstream import CACHE_DIR, clone_base, download_wheel, ensure_base, sha256_file, wheel_release


DEFAULT_DEST = BUILD_DIR / "sglang-refresh"
# What a release move leaves to a person: facts that follow from the new release but need someone to read it.
BY_HAND = ("requirements/test.in and requirements/nodeps.txt: torch, torchvision, transformers and flashinfer as the "
           "new release requires them (its python/pyproject.toml); then requirements/test.lock from a fresh make setup",
           "patches/pin.toml [nccl]: the NCCL release, whose reasoning starts from the NCCL the new torch pins",
           "patches/pin.toml [image] digest: cleared with the tag; make image prints how to read it, then make "
           "refresh SYNC=1")
RECORDS = ("bench/results", "bench/receipts", "tests/fixtures")  # what ran on a release: history, kept as it is


def again(a: argparse.Namespace, **change) -> str:
    """This refresh's command line with `change` applied (wheel=..., resume=True): `make refresh ...` when the
    Makefile has a variable for every option it needs, else the `python -m scripts.series.refresh ...` line."""
    o = {**vars(a), **change}
    if o["dest"] == DEFAULT_DEST and o["patches_dir"] is None and not o["image_tag"]:
        words = [f"{var}={o[key]}" for var, key in (("TO", "tag"), ("WHEEL", "wheel"), ("WHEEL_FILE", "wheel_file"))
                 if o[key]]
        drop = [f'DROP="{" ".join(o["drop"])}"' if len(o["drop"]) > 1 else f"DROP={o['drop'][0]}"] if o["drop"] else []
        return " ".join(["make refresh", *words, *(["WRITE=1"] if o["write"] else []),
                         *(["RESUME=1"] if o["resume"] else []), *drop])
    words = [f"--{key.replace('_', '-')} {o[key]}" for key in ("tag", "wheel", "wheel_file", "image_tag", "dest",
                                                               "patches_dir") if o[key]]
    flags = [f"--{key}" for key in ("write", "resume") if o[key]] + [f"--drop {d}" for d in o["drop"]]
    return " ".join(["python -m scripts.series.refresh", *words, *flags])


def wheel_spec(a: argparse.Namespace) -> dict:
    """{requirement, filename, sha256, path} of the new wheel: the file given, one the wheel cache holds, or one pip
    downloads into the cache."""
    requirement, wheel_file = a.wheel, a.wheel_file
    if wheel_file is not None and not Path(wheel_file).is_file():
        raise UserError(f"the wheel file {wheel_file} (WHEEL_FILE, --wheel-file) does not exist: name the .whl of "
                        f"{requirement}: {again(a, wheel_file='<file.whl>')}")
    if wheel_file is None:
        name, _, version = requirement.partition("==")
        cached = sorted(CACHE_DIR.glob(f"{name}-{version}-*.whl")) if version else []
        if len(cached) == 1:
            wheel_file = cached[0]
        else:
            say(f"downloading {requirement} to find its file name and hash")
            wheel_file = download_wheel(requirement, CACHE_DIR)
        if wheel_file is None:
            raise UserError(f"could not download {requirement} (or several wheels of it are in {CACHE_DIR}). "
                            f"Download the wheel yourself and name it: {again(a, wheel_file='<file.whl>')}")
    wheel_file = Path(wheel_file)
    check_wheel_release(requirement, wheel_file, again(a, wheel=None, tag=None, wheel_file=wheel_file))
    return {"requirement": requirement, "filename": wheel_file.name, "sha256": sha256_file(wheel_file),
            "path": wheel_file}


def project_key(name: str) -> str:
    """A project name as PyPI compares them (PEP 503: Sglang_x == sglang-x)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_of(wheel_file: Path) -> str:
    """name==version of a wheel, from its METADATA (as make apply reads SGLANG_WHEEL)."""
    release = wheel_release(wheel_file) if Path(wheel_file).is_file() else "a file that does not exist"
    if isinstance(release, str):
        raise UserError(f"{wheel_file} (WHEEL_FILE, --wheel-file) is {release}: name an sglang wheel "
                        f"(sglang-<version>-...whl, e.g. from pip download --no-deps sglang==<version>)")
    return f"{release[0]}=={release[1]}"


def check_wheel_release(requirement: str, wheel_file: Path, again_cmd: str) -> None:
    """Refuse a wheel file whose METADATA is another project or release than the requirement names."""
    got = requirement_of(wheel_file)
    (want_name, _, want_version), (got_name, _, got_version) = requirement.partition("=="), got.partition("==")
    named = re.match(r"^([A-Za-z0-9_.]+)-([^-]+)-.+\.whl$", Path(wheel_file).name)
    if not named or project_key(named.group(1)) != project_key(got_name) or named.group(2) != got_version:
        raise UserError(f"the wheel file {wheel_file} is {got} (its METADATA), but its name does not say so; the pin "
                        f"records the file name, which pip and make apply look for: use the file as PyPI names it "
                        f"(pip download --no-deps {got})")
    if project_key(got_name) != project_key(want_name) or (want_version and got_version != want_version):
        raise UserError(f"the wheel file {wheel_file} is {got} (its METADATA), not {requirement}: name the wheel of "
                        f"{requirement}, or leave WHEEL= out to move to {got}: {again_cmd}")


def _previous_series(pin: Pin, dest: Path, cache_dir: Path, wheel_way: str) -> None:
    """Fetch the series applied to the old base into dest (refs/previous/series), so that `git am -3` finds every
    pre-image blob and can fall back on a real 3-way merge."""
    old_bare, old_info = ensure_base(pin, os.environ.get("SGLANG_BASE") or "auto", cache_dir=cache_dir,
                                     wheel_way=wheel_way)
    with tempfile.TemporaryDirectory() as tmp:
        old_tree = Path(tmp) / "old"
        clone_base(old_bare, old_tree, pin.tag)
        apply_git(old_tree, pin, base=old_info)
        git.git(dest, "fetch", "-q", "--no-tags", str(old_tree), "HEAD:refs/previous/series")


def refresh(pin: Pin, tag: str, wheel: dict | None, dest: Path, cache_dir: Path = CACHE_DIR,
            wheel_ways: tuple[str, str] = ("make refresh WHEEL=<name>==<version>", "SGLANG_BASE=wheel")) -> list[dict]:
    """Try every patch on a tree of the new base at dest; one {patch, status, files} per patch.
    wheel_ways: the commands that take the new and the old base from a wheel, printed when a clone fails."""
    if wheel and wheel.get("path"):
        cache_dir.mkdir(parents=True, exist_ok=True)
        target = cache_dir / wheel["filename"]
        if Path(wheel["path"]).resolve() != target.resolve():
            shutil.copy2(wheel["path"], target)
    bare, _ = ensure_base(pin, "wheel" if wheel else "clone", cache_dir=cache_dir, tag=tag,
                          wheel={k: v for k, v in (wheel or {}).items() if k != "path"} or None,
                          wheel_way=wheel_ways[0])
    if dest.exists():
        shutil.rmtree(dest)
    clone_base(bare, dest, tag)
    _previous_series(pin, dest, cache_dir, wheel_ways[1])
    report = []
    for p in series_patches(pin):
        check = git.git(dest, "apply", "--check", str(p.path), check=False)
        res = git.git(dest, "am", "-3", "--no-gpg-sign", str(p.path), check=False)
        if res.ok:
            report.append({"patch": p.path.name, "status": "clean" if check.ok else "3-way", "files": []})
        else:
            _, files = am_failure(dest, [p], res.output)
            git.git(dest, "am", "--abort", check=False)
            report.append({"patch": p.path.name, "status": "conflict", "files": files})
    return report


def moved_pin(pin: Pin, tag: str, version: str, wheel: dict | None, image_tag: str | None) -> Pin:
    """The pin for the new base: tag, version and wheel; the upstream image tag follows the release (its old
    version string replaced, or --image-tag) and its digest is cleared when the tag changes."""
    new_image_tag = image_tag or pin.image_tag.replace(pin.tag, tag).replace(pin.version, version)
    new = dataclasses.replace(pin, tag=tag, version=version, commit="", image_tag=new_image_tag,
                              image_digest=pin.image_digest if new_image_tag == pin.image_tag else "")
    if wheel:
        new = dataclasses.replace(new, wheel_requirement=wheel["requirement"], wheel_filename=wheel["filename"],
                                  wheel_sha256=wheel["sha256"])
    return new


def _print_report(report: list[dict], old: str, new: str) -> None:
    width = max([len(r["patch"]) for r in report] + [5])
    print(f"refresh {old} -> {new}:")
    for r in report:
        extra = f"  ({', '.join(r['files'])})" if r["files"] else ""
        print(f"  {r['patch']:<{width}}  {r['status']}{extra}")


def conflict_advice(a: argparse.Namespace, pin: Pin, conflicts: list[dict], tag: str) -> str:
    """What to do after conflicts: port each skipped patch in the refresh tree, then write from it (--resume)."""
    lines = [f"{len(conflicts)} patch(es) conflict; the tree {a.dest} holds the others. Port each skipped patch "
             f"there by hand (resolve, git -C {a.dest} add <files>, git -C {a.dest} am --continue after each):"]
    lines += [f"  git -C {a.dest} am -3 {(pin.patches_dir / r['patch']).resolve()}" for r in conflicts]  # -C: absolute
    lines += [f"If the order matters, git -C {a.dest} rebase -i {tag} restores it. Then write from that tree (the "
              f"pin, patches/ and the pin's copies move to {tag}; it refuses while a patch of the series is "
              f"missing there, and names it):", f"  {again(a, resume=True)}"]
    return "\n".join(lines)


def tree_patches(dest: Path, tag: str) -> list[str | None]:
    """The patch file name of each commit tag..HEAD of a tree, oldest first (its Patch-Filename: line; None for a
    commit without one, a new patch)."""
    log = git.out(dest, "log", "--reverse", "--format=%x00%B", f"{tag}..HEAD")
    return [patch_filename(body) for body in log.split("\0")[1:]]


def check_ported(a: argparse.Namespace, pin: Pin, tag: str) -> list[str]:
    """The series' patch names the tree at a.dest lacks, each named in --drop; a UserError naming those that are
    neither in the tree nor dropped, with the commands that port them and the one that drops them."""
    series = [p.path.name for p in series_patches(pin)]
    drop = [d if d.endswith(".patch") else f"{d}.patch" for d in a.drop]
    unknown = [d for d in drop if d not in series]
    if unknown:
        raise UserError(f"--drop (DROP=) names {', '.join(unknown)}, which is not in {pin.series_path}; the series "
                        f"is: {', '.join(series)}")
    have = tree_patches(a.dest, tag)
    kept = [d for d in drop if d in have]
    if kept:
        raise UserError(f"--drop (DROP=) names {', '.join(kept)}, but {a.dest} holds it; drop the commit there "
                        f"(git -C {a.dest} rebase -i {tag}) or leave it out of DROP, then {again(a)}")
    missing = [n for n in series if n not in have and n not in drop]
    if missing:
        lines = [f"{len(missing)} patch(es) of the series are not in {a.dest}: {', '.join(missing)}. Writing now "
                 f"would drop them from patches/. Port each there (resolve, git -C {a.dest} add <files>, "
                 f"git -C {a.dest} am --continue):"]
        lines += [f"  git -C {a.dest} am -3 {(pin.patches_dir / n).resolve()}" for n in missing]
        lines += ["then run the same command again; or, to drop them from the series on purpose:",
                  f"  {again(a, drop=[*a.drop, *missing])}"]
        raise UserError("\n".join(lines))
    return drop


def resume(a: argparse.Namespace, pin: Pin, tag: str) -> list[str]:
    """Check that the tree a conflicting refresh left at a.dest is ready to be written from: no git am in
    progress, clean, on the new tag, holding every patch of the series that --drop does not name. Returns the
    dropped patches."""
    dest, again_cmd = a.dest, again(a)
    if not git.is_repo(dest):
        raise UserError(f"there is no refresh tree at {dest} to resume from: run the refresh without RESUME=1 "
                        f"(--resume) first")
    am = Path(git.out(dest, "rev-parse", "--git-path", "rebase-apply"))
    if (am if am.is_absolute() else dest / am).exists():
        raise UserError(f"a git am is still in progress in {dest}: resolve it and run git -C {dest} am --continue "
                        f"(or git -C {dest} am --abort), then {again_cmd}")
    dirty = git.status_porcelain(dest)
    if dirty:
        raise UserError(f"{dest} has uncommitted changes; commit them (git -C {dest} commit -a) or drop them "
                        f"(git -C {dest} reset --hard), then {again_cmd}")
    if git.tag_commit(dest, tag) is None:
        raise UserError(f"{dest} has no tag {tag}: it is not the tree of this refresh; run the refresh without "
                        f"RESUME=1 (--resume) first")
    dropped = check_ported(a, pin, tag)
    new = [c for c in tree_patches(dest, tag) if c is None]
    say(f"resuming from {dest}: {len(git.out(dest, 'rev-list', f'{tag}..HEAD').split())} commits on {tag}"
        + (f", {len(new)} of them new (no Patch-Filename: line; make export names them)" if new else ""))
    for d in dropped:
        say(f"DROPPED {d} (--drop): it leaves patches/ and the series")
    return dropped


def still_naming(version: str) -> list[str]:
    """Tracked files of this repository that name `version` (not as part of a longer version), the records of what
    ran on it left out."""
    pattern = rf"(^|[^0-9.]){re.escape(version)}($|[^0-9])"
    res = git.git(REPO_ROOT, "grep", "-l", "-E", "-e", pattern, "--", ".", *(f":!{r}" for r in RECORDS),
                  check=False)
    return res.stdout.split() if res.returncode in (0, 1) else [f"(git grep failed: {res.why})"]


def by_hand(old_version: str) -> str:
    """The list of what the move left to a person."""
    files = still_naming(old_version)
    items = [*BY_HAND, f"files that still name {old_version} (a claim about that release to re-check, or a patch "
                       f"message's reference to re-read): {', '.join(files) if files else 'none'}"]
    return "not moved (read the new release for these):\n" + "\n".join(f"  - {i}" for i in items)


def write_moved(pin: Pin, a: argparse.Namespace, tag: str, version: str, wheel: dict | None) -> None:
    """Move the pin, patches/ (exported from the refresh tree) and the pin's copies to the new base; print what a
    person has to move."""
    write_pin(moved_pin(pin, tag, version, wheel, a.image_tag))
    export(a.dest, load_pin(pin.patches_dir), pin.patches_dir)
    changed = write_copies(load_pin(pin.patches_dir))
    say(f"patches/, pin.toml{''.join(', ' + str(c.name) for c in changed)} now target {tag}; review with git "
        f"diff, then make check-patches")
    print(by_hand(pin.version))


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="scripts.series.refresh", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tag", help="new upstream tag, e.g. v0.5.24")
    ap.add_argument("--wheel", help="new wheel requirement, e.g. sglang==0.5.24 (base from PyPI, no GitHub)")
    ap.add_argument("--wheel-file", type=Path, help="a local copy of that wheel (alone: the requirement from its name)")
    ap.add_argument("--image-tag", help="the upstream image's new tag (default: the old one with the release moved)")
    ap.add_argument("--dest", type=Path, default=DEFAULT_DEST)
    ap.add_argument("--patches-dir", type=Path, default=None)
    ap.add_argument("--write", action="store_true", help="on success, move the pin, patches/ and the pin's copies")
    ap.add_argument("--resume", action="store_true",
                    help="write from the tree at --dest as it is (after resolving a conflict there by hand)")
    ap.add_argument("--drop", action="append", default=[], metavar="PATCH",
                    help="with --resume: leave this patch of the series out on purpose (repeatable; make: DROP=)")
    ap.add_argument("--sync", action="store_true", help="only rewrite the pin's copies from patches/pin.toml")
    return ap


def main(argv=None) -> int:
    a = _parser().parse_args(argv)
    pin = load_pin(a.patches_dir)
    if a.sync:
        changed = write_copies(pin)
        say(f"rewrote {', '.join(map(str, changed))} from {pin.path}" if changed else "the pin's copies agree with it")
        return 0
    if a.wheel_file and not a.wheel:
        a.wheel = requirement_of(a.wheel_file)
    if not a.tag and not a.wheel:
        raise UserError("say where to move: make refresh TO=<tag> (a clone of the tag, needs GitHub) or make refresh "
                        "WHEEL=sglang==<version> (the PyPI wheel; WHEEL_FILE=<file.whl> for a copy you have)")
    version = a.wheel.split("==", 1)[1] if a.wheel and "==" in a.wheel else (a.tag or "").lstrip("v")
    tag = a.tag or f"v{version}"
    wheel = wheel_spec(a) if a.wheel else None
    if a.drop and not a.resume:
        raise UserError(f"--drop (DROP=) only applies with --resume (RESUME=1): {again(a, resume=True)}")
    if a.resume:
        resume(a, pin, tag)
        write_moved(pin, a, tag, version, wheel)
        return 0
    name = re.split(r"[=<>!~ ]", pin.wheel_requirement, 1)[0]
    report = refresh(pin, tag, wheel, a.dest, wheel_ways=(again(a, wheel=f"{name}=={version}", tag=tag),
                                                          f"SGLANG_BASE=wheel {again(a)}"))
    _print_report(report, pin.tag, tag)
    conflicts = [r for r in report if r["status"] == "conflict"]
    if conflicts:
        print(conflict_advice(a, pin, conflicts, tag))
        return 1
    if a.write:
        write_moved(pin, a, tag, version, wheel)
    return 0


if __name__ == "__main__":
    run(main)
