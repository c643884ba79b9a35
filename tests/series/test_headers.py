"""Patch headers a tool can check (README "Patch headers"; scripts/series/headers.py and lint.py), the mail part
read with the email parser, and file names that survive a reworded subject (Patch-Filename)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from scripts.lib import git
from scripts.series import lint
from scripts.series.exporting import write_patches
from scripts.series.headers import check_author, check_message
from scripts.series.patchfile import parse_patch
from scripts.series.pin import load_pin

GOOD = """Why: a reason.

Measured: a number.

Forwarded: no
Origin: vendor
Bug: https://github.com/sgl-project/sglang/issues/1
Last-Update: 2026-11-30
Retire-When: upstream does it
(continued on a second line).

Patch-Filename: x.patch"""


def problems(message: str, name: str = "x.patch") -> str:
    return "\n".join(check_message(message, name))


def test_a_complete_message_passes():
    assert check_message(GOOD, "x.patch") == []
    assert check_message(GOOD.replace("Bug: https://github.com/sgl-project/sglang/issues/1\n", ""), "x.patch") == []


@pytest.mark.parametrize("edit, expect", [
    (("Forwarded: no\n", ""), "lacks the header line 'Forwarded: ...'"),
    (("Last-Update: 2026-11-30\n", ""), "lacks the header line 'Last-Update: ...'"),
    (("Measured: a number.", "Measured:"), "lacks the header line 'Measured: ...'"),
    (("Forwarded: no", "Upstream-Status: Pending\nForwarded: no"), "Upstream-Status: is OpenEmbedded's"),
    (("Forwarded: no", "Forwarded: no\nApplied-Upstream:"), "Applied-Upstream: names where the patch landed"),
    (("issues/1", "pull/1"), "is a pull request, not a bug report: name it in Why: instead"),
    (("Forwarded: no", "Forwarded: maybe"), "is not no, not-needed or a URL"),
    (("Origin: vendor\nBug: https://github.com/sgl-project/sglang/issues/1\n", ""), "no provenance line"),
    (("Origin: vendor", "Origin: upstream"), "upstream needs the URL or commit id"),
    (("Origin: vendor", "Origin: mine"), "does not start with one of upstream, backport, vendor, other"),
    (("Bug: https://github.com/sgl-project/sglang/issues/1", "Bug: #1"), "Bug '#1' is not a URL"),
    (("2026-11-30", "30.11.2026"), "is not a date YYYY-MM-DD"),
    (("Patch-Filename: x.patch", "Patch-Filename: y.patch"), "does not name this file"),
    (("\n\nPatch-Filename: x.patch", ""), "lacks the header line 'Patch-Filename: ...'"),
    (("Why: a reason.", "Why: a reason.\nForwarded: no"), "'Forwarded:' appears 2 times"),
])
def test_each_rule_names_the_problem(edit, expect):
    assert edit[0] in GOOD
    assert expect in problems(GOOD.replace(edit[0], edit[1], 1))


def test_patch_filename_is_the_last_line():
    moved = GOOD.replace("\n\nPatch-Filename: x.patch", "").replace("Why:", "Patch-Filename: x.patch\nWhy:")
    assert "must be the message's last line" in problems(moved)


def test_each_dep3_status_passes():
    sent = GOOD.replace("Forwarded: no", "Forwarded: https://github.com/sgl-project/sglang/pull/3")
    landed = sent.replace("Forwarded: https://github.com/sgl-project/sglang/pull/3",
                          "Forwarded: https://github.com/sgl-project/sglang/pull/3\nApplied-Upstream: v0.5.24, "
                          "https://github.com/sgl-project/sglang/commit/0123abcd")
    backport = GOOD.replace("Forwarded: no", "Forwarded: not-needed").replace(
        "Origin: vendor", "Origin: backport, 0123abcd")
    for message in (sent, landed, backport):
        assert check_message(message, "x.patch") == [], message


def test_a_real_author():
    assert check_author("Seed maintainers <maintainers@example.org>") == []
    assert "placeholder" in check_author("eagle-fast-verify <eagle-fast-verify@localhost>")[0]
    assert "placeholder" in check_author("Someone <someone@localhost>")[0]
    assert "is not 'Name <email>'" in check_author("nobody")[0]


def test_the_lint_checks_are_registered_in_order():
    assert [name for name, _ in lint.CHECKS] == ["series-file", "format", "headers", "pin-blobs", "pin-copies"]
    for name, _ in lint.CHECKS:
        assert name in lint.__doc__


# ---------------------------------------------------------------------------------------------------------------
# the mail part and the file names, on real `git format-patch` output


@pytest.fixture
def tree(tmp_path) -> Path:
    t = tmp_path / "tree"
    t.mkdir()
    git.git(t, "init", "-q", "-b", "main")
    (t / "a.py").write_text("A = 1\n")
    git.git(t, "add", "-A")
    git.git(t, "commit", "-qm", "base", fixed_date=True)
    git.git(t, "tag", "v0")
    return t


def commit(tree: Path, text: str, message: str, author: str = "Jörg Müller <joerg@example.org>") -> None:
    (tree / "a.py").write_text(text)
    git.git(tree, "commit", "-qam", message, "--author", author, fixed_date=True)


def test_non_ascii_subject_and_author_are_decoded(tree, tmp_path):
    subject = "spec: zählt Verify-Fallbacks nach Grund – über alle Läufe"
    commit(tree, "A = 2\n", f"{subject}\n\nWhy: ü.")
    pin = dataclasses.replace(load_pin(), tag="v0")
    (name,) = write_patches(tree, pin, tmp_path / "out")
    raw = (tmp_path / "out" / name).read_text()
    assert "=?UTF-8?q?" in raw  # --encode-email-headers wrote RFC 2047 words
    info = parse_patch(tmp_path / "out" / name)
    assert info.subject == subject and info.author == "Jörg Müller <joerg@example.org>"
    assert info.message.startswith("Why: ü.") and info.message.endswith(f"Patch-Filename: {name}")


def test_a_reworded_subject_keeps_the_file_name(tree, tmp_path):
    commit(tree, "A = 2\n", "spec: count fallbacks\n\nWhy: x.")
    pin = dataclasses.replace(load_pin(), tag="v0")
    (first,) = write_patches(tree, pin, tmp_path / "one")
    assert first == "spec-count-fallbacks.patch"
    # what `make apply` then holds: the commit as `git am` makes it from the exported patch, trailer included
    git.git(tree, "reset", "-q", "--hard", "v0")
    git.git(tree, "am", "-q", str(tmp_path / "one" / first))
    body = git.out(tree, "log", "-1", "--format=%b")
    git.git(tree, "commit", "-q", "--amend", "-m", f"spec: count target-verify fallbacks by reason\n\n{body}")
    (second,) = write_patches(tree, pin, tmp_path / "two")
    assert second == first
    assert parse_patch(tmp_path / "two" / second).subject == "spec: count target-verify fallbacks by reason"
