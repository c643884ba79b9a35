"""scripts/lib: the one subprocess helper, the one TOML reader, the one git HEAD and tag helpers; and the bench
family's one number formatter."""

import pytest

from scripts.lib.table import duration, num, spread
from scripts.lib import git, proc, repo
from scripts.lib.errors import UserError


def test_run_says_why_a_program_did_not_answer():
    assert proc.run(["sh", "-c", "echo hi"]).stdout == "hi\n"
    missing = proc.run(["no-such-tool-eagle"], timeout=5)
    assert not missing.ok and "not found" in missing.why and missing.returncode is None
    hung = proc.run(["sleep", "5"], timeout=0.5)
    assert not hung.ok and "did not answer within" in hung.why
    failed = proc.run(["sh", "-c", "echo 'it broke' >&2; exit 9"])
    assert not failed.ok and failed.returncode == 9 and "exit 9: it broke" in failed.why


def test_head_and_revision(tmp_path, monkeypatch):
    assert git.head(tmp_path) is None and git.rev(tmp_path, "refs/tags/v1") is None
    git.git(tmp_path, "init", "-q")
    git.git(tmp_path, "commit", "-q", "--allow-empty", "-m", "one")
    git.git(tmp_path, "tag", "-a", "-m", "annotated", "v1")
    assert git.rev(tmp_path, "refs/tags/v1") == git.head(tmp_path) and git.rev(tmp_path, "refs/tags/v2") is None
    monkeypatch.setenv(repo.GIT_REV_VAR, "abc1234")
    assert repo.revision(short=True) == ("abc1234", False)
    monkeypatch.delenv(repo.GIT_REV_VAR)
    head, _ = repo.revision()
    assert head == git.head(repo.REPO_ROOT) and len(head) == 40
    assert git.head(repo.REPO_ROOT, short=True) == head[:7]


def test_number_formatter():
    assert num(None) == "–" and num(None, none="-") == "-"
    assert num(3.14159) == "3.1" and num(3.14159, small=True) == "3.14" and num(31.4159, small=True) == "31.4"
    assert spread([]) == "not measured" and spread([1.234]) == "1.23"
    assert spread([1.0, 2.0, 3.0], 1, "x") == "2.0x (1.0-3.0)" and spread([1.0, 1.001], 2) == "1.00"
    assert (duration(42), duration(125), duration(7260)) == ("42s", "2m05s", "2h01m")


def test_the_toml_reader_names_the_file_and_the_fix(tmp_path):
    from scripts.lib.tomlfile import load_toml

    good = tmp_path / "a.toml"
    good.write_text("x = 1\n")
    assert load_toml(good) == {"x": 1}
    bad = tmp_path / "b.toml"
    bad.write_text("x = \n")
    with pytest.raises(UserError, match=r"profile .*b\.toml is not valid TOML: "):
        load_toml(bad, "profile")
    with pytest.raises(UserError, match=r"sweep file .*c\.toml: No such file or directory; pass it to --sweep"):
        load_toml(tmp_path / "c.toml", "sweep file", "pass it to --sweep")
