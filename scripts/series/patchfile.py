"""One patch file (`git format-patch --full-index` output): its mail headers, message and the blobs it changes.

The mail part is read with the standard library's email parser (folded and RFC 2047-encoded headers, as
`--encode-email-headers` writes them for a non-ASCII subject); the diff part for `diff --git` and `index` lines,
whose full blob ids tie the series to the pin. Before that, git checks the whole file as `git am` would read it
(`corruption`): `git apply --numstat` the diff (every file header and hunk count; no tree needed), `git mailinfo`
the mail headers (an author and a subject). A patch that fails is a "corrupt patch <file>, line N: <what>"
UserError that says how to restore it; lint reports it, and apply refuses the series before it touches any tree.
"""

from __future__ import annotations

import dataclasses
import email.parser
import email.policy
import os
import re
from pathlib import Path

from ..lib import git
from ..lib.errors import UserError
from ..lib.repo import REPO_ROOT
from .pin import Pin

_DIFF_RE = re.compile(r"^diff --git a/(\S+) b/(\S+)$")
_INDEX_RE = re.compile(r"^index ([0-9a-f]+)\.\.([0-9a-f]+)")
_PATCH_PREFIX = re.compile(r"^\[PATCH[^\]]*\]\s*")


@dataclasses.dataclass
class PatchInfo:
    path: Path
    subject: str
    message: str  # the commit message body (after the subject)
    author: str  # "Name <email>" from the From: header
    mail_headers: dict[str, str]  # every mail header, decoded
    files: dict[str, tuple[str, str]]  # path -> (pre-image blob, post-image blob), in the order of the patch


def split_patch(text: str, name: str) -> tuple[str, str]:
    """(mail part without the mbox 'From <commit>' line, diff part) of a format-patch file."""
    cut = text.find("\ndiff --git ")
    if not text.startswith("From ") or cut < 0:
        raise UserError(f"{name} is not `git format-patch` output (no 'From' header or no diff)")
    mail, diff = text[:cut + 1], text[cut + 1:]
    return mail.split("\n", 1)[1] if "\n" in mail else "", diff


def parse_mail(mail: str) -> tuple[dict[str, str], str]:
    """Decoded headers and the body (message text, a diffstat after '---' dropped) of the mail part."""
    msg = email.parser.Parser(policy=email.policy.default).parsestr(mail)
    headers = {k: str(v) for k, v in msg.items()}
    body = msg.get_payload()
    if isinstance(body, list):  # never for format-patch output; a multipart mail is not a patch
        body = ""
    body = body.split("\n---\n", 1)[0]
    return headers, body.strip()


def parse_diff_files(diff: str, name: str) -> dict[str, tuple[str, str]]:
    files: dict[str, tuple[str, str]] = {}
    current = None
    for line in diff.splitlines():
        m = _DIFF_RE.match(line)
        if m:
            current = m.group(2)
            files[current] = ("", "")
            continue
        m = _INDEX_RE.match(line)
        if m and current is not None and files[current] == ("", ""):
            pre, post = m.group(1), m.group(2)
            if len(pre) != 40 or len(post) != 40:
                raise UserError(f"{name} was not exported with --full-index (abbreviated blob ids): run make export")
            files[current] = (pre, post)
    return files


def restore_hint(path: Path) -> str:
    """How to get a damaged or hand-edited patch file back."""
    shown = path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else Path("patches") / path.name
    return (f"git checkout -- {shown} (the committed copy), or make export (writes patches/ again from the commits "
            f"of build/sglang)")


def corrupt_message(path: Path, line: int, what: str) -> str:
    """The one way a damaged patch is reported (lint and apply print the same)."""
    return f"corrupt patch {path.name}, line {line}: {what}. Restore it: {restore_hint(path)}"


def corruption(text: str) -> tuple[int, str] | None:
    """(line, what) of the first thing that makes `text` unusable for `git am`, or None: the diff as
    `git apply --numstat` reads it (it needs no tree), the mail part as `git mailinfo` does."""
    rows = text.split("\n")
    count = len(rows) - (text.endswith("\n"))
    if not text.startswith("From "):
        return 1, "the file does not start with git format-patch's 'From <commit> <date>' line"
    res = git.git(REPO_ROOT, "apply", "--numstat", input=text, check=False)
    if not res.ok:
        said = (res.stderr.strip().splitlines() or [res.why])[0].removeprefix("error: ")
        if said.startswith("No valid patches"):
            return count, "the file has no diff ('diff --git' lines): it is truncated or not a patch"
        m = re.search(r"at line (\d+)", said)
        line = int(m.group(1)) if m else count
        if line > count:
            return count, f"the file ends inside a hunk (git apply: {said}): the file is truncated"
        hunk = next((i for i in range(line - 1, 0, -1) if rows[i - 1].startswith("@@")), None)
        return line, f"git apply: {said}" + (f" (the hunk before it starts at line {hunk})" if hunk else "")
    info = git.git(REPO_ROOT, "mailinfo", os.devnull, os.devnull, input=text, check=False).stdout
    fields = dict(row.split(": ", 1) for row in info.splitlines() if ": " in row)
    missing = [k for k in ("Author", "Subject") if not fields.get(k, "").strip()]
    if missing:
        end = rows.index("") + 1 if "" in rows else count
        return end, f"git mailinfo reads no {' and no '.join(missing)} from the mail headers (lines 1-{end})"
    return None


def parse_patch(path: Path) -> PatchInfo:
    """Read a `git format-patch --full-index` file: subject, author, message and per-file blob ids; a
    UserError ("corrupt patch <file>, line N: ...") when the file is damaged."""
    if not path.is_file():
        raise UserError(f"patch {path.name} is listed in the series but {path} does not exist")
    text = path.read_text()
    problem = corruption(text)
    if problem:
        raise UserError(corrupt_message(path, *problem))
    mail, diff = split_patch(text, path.name)
    headers, body = parse_mail(mail)
    subject = _PATCH_PREFIX.sub("", " ".join(headers.get("Subject", "").split())).strip()
    return PatchInfo(path=path, subject=subject, message=body, author=headers.get("From", ""),
                     mail_headers=headers, files=parse_diff_files(diff, path.name))


def series_patches(pin: Pin) -> list[PatchInfo]:
    return [parse_patch(p) for p in pin.series()]


def touched_files(patches: list[PatchInfo]) -> list[str]:
    seen: dict[str, None] = {}
    for p in patches:
        for f in p.files:
            seen.setdefault(f, None)
    return list(seen)


def expected_blobs(patches: list[PatchInfo]) -> tuple[dict[str, str], dict[str, str]]:
    """Base blobs (first pre-image of each file) and patched blobs (last post-image), from the patches alone."""
    base: dict[str, str] = {}
    final: dict[str, str] = {}
    for p in patches:
        for f, (pre, post) in p.files.items():
            base.setdefault(f, pre)
            final[f] = post
    return base, final
