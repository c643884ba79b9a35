"""One patch file (`git format-patch --full-index` output): its mail headers, message and the blobs it changes.

The mail part is read with the standard library's email parser (folded and RFC 2047-encoded headers, as
`--encode-email-headers` writes them for a non-ASCII subject); the diff part for `diff --git` and `index` lines,
whose full blob ids tie the series to the pin. Before that, the whole file is checked (`corruption`): the mail
headers, every file's header lines, each hunk's line counts against its @@ header, and a proper end of the file. A
patch that fails is a "corrupt patch <file>, line N: <what>" UserError that says how to restore it; lint reports
it, and apply refuses the series before it touches any tree.
"""

from __future__ import annotations

import dataclasses
import email.parser
import email.policy
import re
from pathlib import Path

from ..lib.errors import UserError
from ..lib.repo import REPO_ROOT
from .pin import Pin

_DIFF_RE = re.compile(r"^diff --git a/(\S+) b/(\S+)$")
_INDEX_RE = re.compile(r"^index ([0-9a-f]+)\.\.([0-9a-f]+)")
_PATCH_PREFIX = re.compile(r"^\[PATCH[^\]]*\]\s*")
_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_FILE_HEADERS = ("old mode ", "new mode ", "deleted file mode ", "new file mode ", "similarity index ",
                 "dissimilarity index ", "rename from ", "rename to ", "copy from ", "copy to ", "index ")
_NO_HUNKS = ("old mode ", "new mode ", "deleted file mode ", "new file mode ", "rename from ", "copy from ")
SIGNATURE = "-- "  # git's version signature (lint's format check refuses it); the file ends there


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


def _mail_problem(lines: list[str]) -> tuple[int, str] | None:
    """(line, what) of the first problem in the mail part (lines without their newlines), or None."""
    if not lines or not lines[0].startswith("From "):
        return 1, "the file does not start with git format-patch's 'From <commit> <date>' line"
    seen = set()
    for i, line in enumerate(lines[1:], 2):
        if not line:
            missing = [h for h in ("From", "Subject") if h not in seen]
            return (i, f"the mail headers (ending here) lack {' and '.join(missing)}") if missing else None
        if line[:1] in " \t" and seen:
            continue
        key, sep, _ = line.partition(":")
        if not sep or not key or " " in key:
            return i, f"{line[:60]!r} is not a mail header line (the headers end at the first empty line)"
        seen.add(key)
    return len(lines), "the file ends in the mail headers, before any diff: the file is truncated"


def _hunk_problem(lines: list[str], i: int, first: int) -> tuple[tuple[int, str] | None, int]:
    """Check the hunk whose @@ header is lines[i]: ((line, what) or None, index of the line after it)."""
    m = _HUNK_RE.match(lines[i])
    if not m:
        return (first + i, f"{lines[i][:60]!r} is not a hunk header '@@ -a,b +c,d @@'"), i
    header = m.group(0)
    old = int(m.group(2)) if m.group(2) is not None else 1
    new = int(m.group(4)) if m.group(4) is not None else 1
    want, start = (old, new), i
    i += 1
    while old > 0 or new > 0:
        if i >= len(lines):
            return (first + len(lines) - 1, f"the file ends inside the hunk {header} of line {first + start} "
                                             f"({old} old and {new} new lines missing): the file is truncated"), i
        kind = lines[i][:1]
        if kind not in (" ", "", "-", "+", "\\"):
            return (first + start, f"the hunk {header} has {want[0] - old} old and {want[1] - new} new lines, not "
                                   f"the {want[0]} and {want[1]} its header says (it ends at line {first + i})"), i
        old -= kind in (" ", "", "-")
        new -= kind in (" ", "", "+")
        if old < 0 or new < 0:
            return (first + start, f"the hunk {header} has more lines than its header says (line {first + i})"), i
        i += 1
    if i < len(lines) and lines[i].startswith("\\"):
        i += 1
    return None, i


def _file_problem(lines: list[str], i: int, first: int) -> tuple[tuple[int, str] | None, int]:
    """Check one file of the diff, from its `diff --git` line: ((line, what) or None, index of the next file)."""
    m = _DIFF_RE.match(lines[i])
    if not m:
        return (first + i, f"expected 'diff --git a/<path> b/<path>', found {lines[i][:60]!r}"), i
    i += 1
    headers = []
    while i < len(lines) and lines[i].startswith(_FILE_HEADERS):
        headers.append(lines[i])
        i += 1
    if i < len(lines) and (lines[i].startswith("Binary files ") or lines[i] == "GIT binary patch"):
        while i + 1 < len(lines) and not _DIFF_RE.match(lines[i + 1]) and lines[i + 1] != SIGNATURE:
            i += 1
        return None, i + 1
    if i >= len(lines) or _DIFF_RE.match(lines[i]) or lines[i] == SIGNATURE:
        if any(h.startswith(_NO_HUNKS) for h in headers):
            return None, i  # a mode change, an empty new file, a rename: no hunks
        return (first + min(i, len(lines) - 1), f"the diff of {m.group(2)} ends before its ---/+++ lines and "
                                                f"hunks: the file is truncated"), i
    if not lines[i].startswith("--- ") or i + 1 >= len(lines) or not lines[i + 1].startswith("+++ "):
        return (first + i, f"expected the '--- a/<path>' and '+++ b/<path>' lines, found {lines[i][:60]!r}"), i
    i += 2
    if i >= len(lines) or not lines[i].startswith("@@"):
        return (first + min(i, len(lines) - 1), "no hunk (@@ ... @@) after the +++ line"), i
    while i < len(lines) and lines[i].startswith("@@"):
        hunk = i
        problem, i = _hunk_problem(lines, i, first)
        if problem:
            return problem, i
    if i < len(lines) and not _DIFF_RE.match(lines[i]) and lines[i] != SIGNATURE:
        return (first + i, f"{lines[i][:60]!r} follows the hunk of line {first + hunk}, whose @@ header does not "
                           f"count it (the hunk has more lines than its header says)"), i
    return None, i


def corruption(text: str) -> tuple[int, str] | None:
    """(line, what) of the first thing that makes `text` an unusable `git format-patch` file, or None."""
    if not text.endswith("\n"):
        return text.count("\n") + 1, "the last line is cut off (no newline at the end): the file is truncated"
    lines = text.split("\n")[:-1]
    cut = next((i for i, line in enumerate(lines) if line.startswith("diff --git ")), len(lines))
    problem = _mail_problem(lines[:cut])
    if problem or cut == len(lines):
        return problem or (len(lines), "the file has no diff ('diff --git' lines): it is truncated or not a patch")
    diff, i = lines[cut:], 0
    while i < len(diff) and diff[i] != SIGNATURE:
        problem, i = _file_problem(diff, i, cut + 1)
        if problem:
            return problem
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
