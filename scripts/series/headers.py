"""Patch headers a tool can check: DEP-3 provenance plus this project's own evidence lines.

Every patch message carries these lines (README "Patch headers" is the reference; `make check-patches` enforces
it through scripts/series/lint.py):

  Why: / Measured: / Retire-When:   required, free text (may continue on the following lines)
  Forwarded:         DEP-3, where the patch stands upstream: no | not-needed | <url it was sent to>
  Applied-Upstream:  DEP-3, optional: where it landed (<version>, <url> or <commit id>)
  Bug: / Origin:     at least one. Bug: <url> of a bug report (an issue, not a pull request: related pull
                     requests are named in Why:); Origin: <upstream|backport|vendor|other>[, <url or commit id>]
                     (upstream and backport need the URL or commit)
  Last-Update:       YYYY-MM-DD, the date of the last revision
  Patch-Filename:    the patch's file name, kept when the subject is reworded (Electron's trailer); the last line
and a real author in From: (not the tooling's own identity, not an address at localhost).
"""

from __future__ import annotations

import datetime as _dt
import email.utils
import re

from ..lib.git import TOOL_IDENT

FREE_TEXT = ("Why", "Measured", "Retire-When")
REQUIRED = (*FREE_TEXT, "Forwarded", "Last-Update", "Patch-Filename")
PROVENANCE = ("Bug", "Origin")
ORIGIN_KINDS = ("upstream", "backport", "vendor", "other")
URL_RE = re.compile(r"^https?://\S+$")
PULL_RE = re.compile(r"/(pull|pulls|merge_requests)/\d+")
COMMIT_RE = re.compile(r"^[0-9a-f]{7,40}$")
FILENAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*\.patch$")
_LINE_RE = re.compile(r"^([A-Z][A-Za-z-]*):[ \t]*(.*)$", re.M)


def header_lines(message: str) -> dict[str, list[str]]:
    """Every `Key: value` line of a message (first line of each value), by key, in order."""
    out: dict[str, list[str]] = {}
    for m in _LINE_RE.finditer(message):
        out.setdefault(m.group(1), []).append(m.group(2).strip())
    return out


def patch_filename(message: str) -> str | None:
    vals = header_lines(message).get("Patch-Filename")
    return vals[-1] if vals else None


def _check_forwarded(value: str) -> list[str]:
    if value in ("no", "not-needed") or URL_RE.match(value):
        return []
    return [f"Forwarded '{value}' is not no, not-needed or a URL"]


def _check_provenance(lines: dict[str, list[str]]) -> list[str]:
    problems = []
    if not any(lines.get(k) for k in PROVENANCE):
        problems.append("no provenance line: add Bug: <url> or Origin: <upstream|backport|vendor|other>[, <url>]")
    for bug in lines.get("Bug", []):
        if not URL_RE.match(bug):
            problems.append(f"Bug '{bug}' is not a URL")
        elif PULL_RE.search(bug):
            problems.append(f"Bug '{bug}' is a pull request, not a bug report: name it in Why: instead")
    for origin in lines.get("Origin", []):
        kind, _, ref = (x.strip() for x in origin.partition(","))
        if kind not in ORIGIN_KINDS:
            problems.append(f"Origin '{origin}' does not start with one of {', '.join(ORIGIN_KINDS)}")
        elif ref and not (URL_RE.match(ref) or COMMIT_RE.match(ref)):
            problems.append(f"Origin '{origin}': after the comma comes a URL or a commit id")
        elif kind in ("upstream", "backport") and not ref:
            problems.append(f"Origin '{origin}': {kind} needs the URL or commit id it came from")
    return problems


def _check_date(value: str) -> list[str]:
    try:
        _dt.date.fromisoformat(value)
    except ValueError:
        return [f"Last-Update '{value}' is not a date YYYY-MM-DD"]
    return [] if re.fullmatch(r"\d{4}-\d{2}-\d{2}", value) else [f"Last-Update '{value}' is not YYYY-MM-DD"]


def check_author(author: str) -> list[str]:
    name, addr = email.utils.parseaddr(author)
    if not name or "@" not in addr:
        return [f"From: '{author}' is not 'Name <email>'"]
    if addr == TOOL_IDENT["GIT_AUTHOR_EMAIL"] or addr.endswith("@localhost"):
        return [f"From: {author} is the tooling's placeholder, not a real author: commit with your git identity "
                f"(git commit --amend --reset-author) and make export"]
    return []


def check_message(message: str, filename: str) -> list[str]:
    """Problems with the header lines of one patch message (an empty list when it follows README 'Patch headers')."""
    lines = header_lines(message)
    problems = [f"message lacks the header line '{k}: ...'" for k in REQUIRED if not any(lines.get(k, []))]
    problems += [f"'{k}:' appears {len(v)} times" for k, v in lines.items() if k in REQUIRED and len(v) > 1]
    if lines.get("Upstream-Status"):
        problems.append("Upstream-Status: is OpenEmbedded's, not DEP-3: say it with Forwarded: (and "
                        "Applied-Upstream: once it lands), and drop the line")
    if lines.get("Forwarded"):
        problems += _check_forwarded(lines["Forwarded"][0])
    if "Applied-Upstream" in lines and not all(lines["Applied-Upstream"]):
        problems.append("Applied-Upstream: names where the patch landed (<version>, <url> or <commit id>)")
    if lines.get("Last-Update"):
        problems += _check_date(lines["Last-Update"][0])
    name = patch_filename(message)
    if name and name != filename:
        problems.append(f"Patch-Filename: {name} does not name this file ({filename})")
    elif name and not FILENAME_RE.match(name):
        problems.append(f"Patch-Filename: {name} is not a plain *.patch file name")
    if name and message.rstrip().splitlines()[-1] != f"Patch-Filename: {name}":
        problems.append("Patch-Filename: must be the message's last line")
    return problems + _check_provenance(lines)
