"""The series lint (ungoogled-chromium's check_patch_files shape): four checks over patches/, each a list of
"<file>: <problem>" lines.

  series     the series file and the *.patch files agree (none missing, none listed twice, none left out)
  readable   git reads each patch as `git am` would (`git apply --numstat`, `git mailinfo`), with full blob ids
  headers    the message's header lines (docs/maintaining.md "Patch headers"): Why, Measured, Retire-When;
             Forwarded (DEP-3: no, not-needed or a URL); Bug (a URL) and/or Origin; Last-Update YYYY-MM-DD;
             Patch-Filename naming the file, the last line; and a real author in From:
  readme     README.md's series table is the one make export writes from the patches
"""

import email.utils
import os
import re
from pathlib import Path

from ..lib import git
from ..lib.errors import UserError
from .pin import Pin, load_pin, parse_patch
from .readme import readme_problems

REQUIRED = ("Why", "Measured", "Retire-When", "Forwarded", "Last-Update", "Patch-Filename")
URL = re.compile(r"^https?://\S+$")


def check_series(pin: Pin) -> list[str]:
    listed = [p.name for p in pin.series()]
    problems = [f"{n}: listed twice in {pin.series_file}" for n in sorted({n for n in listed if listed.count(n) > 1})]
    problems += [
        f"{n}: listed in {pin.series_file}, but there is no such file"
        for n in listed
        if not (pin.patches_dir / n).is_file()
    ]
    return problems + [
        f"{f.name}: not in {pin.series_file} (add it there, or delete it)"
        for f in sorted(pin.patches_dir.glob("*.patch"))
        if f.name not in listed
    ]


def check_readable(path: Path) -> list[str]:
    text = path.read_text()
    res = git.git(path.parent, "apply", "--numstat", input=text, check=False)
    if not res.ok:
        return [
            f"{path.name}: git apply cannot read it ({(res.stderr.strip().splitlines() or [res.why])[0]}): "
            f"restore it (git checkout -- patches/{path.name}) or make export"
        ]
    info = git.git(path.parent, "mailinfo", os.devnull, os.devnull, input=text, check=False).stdout
    fields = dict(row.split(": ", 1) for row in info.splitlines() if ": " in row)
    problems = [
        f"{path.name}: git mailinfo finds no {k} in the mail headers"
        for k in ("Author", "Subject")
        if not fields.get(k, "").strip()
    ]
    if re.search(r"^index [0-9a-f]{1,39}\.\.", text, re.M):
        problems.append(f"{path.name}: abbreviated blob ids (not format-patch --full-index): make export")
    return problems


def header_problems(message: str, author: str, filename: str) -> list[str]:
    """What is wrong with one patch message's header lines (empty: nothing)."""
    lines: dict[str, list[str]] = {}
    for key, value in re.findall(r"^([A-Z][A-Za-z-]*):[ \t]*(.*)$", message, re.M):
        lines.setdefault(key, []).append(value.strip())
    out = [f"no '{k}:' line" for k in REQUIRED if not any(lines.get(k, []))]
    out += [f"'{k}:' appears {len(lines[k])} times" for k in REQUIRED if len(lines.get(k, [])) > 1]
    forwarded = (lines.get("Forwarded") or [""])[0]
    if forwarded and forwarded not in ("no", "not-needed") and not URL.match(forwarded):
        out.append(f"Forwarded: {forwarded} is not no, not-needed or a URL")
    if not lines.get("Bug") and not lines.get("Origin"):
        out.append("no Bug: <URL> and no Origin: <upstream|backport|vendor|other>[, <URL or commit>] (DEP-3)")
    out += [f"Bug: {bug} is not a URL" for bug in lines.get("Bug", []) if not URL.match(bug)]
    updated = (lines.get("Last-Update") or [""])[0]
    if updated and not re.fullmatch(r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])", updated):
        out.append(f"Last-Update: {updated} is not a date YYYY-MM-DD")
    if lines.get("Patch-Filename") and lines["Patch-Filename"][-1] != filename:
        out.append(f"Patch-Filename: {lines['Patch-Filename'][-1]} does not name this file")
    if lines.get("Patch-Filename") and message.rstrip().splitlines()[-1] != f"Patch-Filename: {filename}":
        out.append("Patch-Filename: is not the message's last line")
    name, addr = email.utils.parseaddr(author)
    if not name or "@" not in addr or addr == git.TOOL_IDENT["GIT_AUTHOR_EMAIL"] or addr.endswith("@localhost"):
        out.append(
            f"From: {author} is not a real author (commit with your identity: git commit --amend "
            f"--reset-author, then make export)"
        )
    return out


def lint(patches_dir: Path | None = None) -> list[str]:
    """Every problem of the series, check after check (empty: healthy)."""
    try:
        pin = load_pin(patches_dir)
        problems = check_series(pin)
    except UserError as e:
        return [str(e)]
    for path in [p for p in pin.series() if p.is_file()]:
        readable = check_readable(path)
        p = parse_patch(path)
        problems += readable + [f"{path.name}: {x}" for x in header_problems(p.message, p.author, path.name)]
    return problems + readme_problems(pin)
