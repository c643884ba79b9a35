"""The drafter and speculative-settings sweep (scripts/bench/sweep.py, bench/sweep.toml) and the fit of its cycles
(scripts/bench/report.py): the settings SGLang would change or fail on, the variants the points become, and the
predicted optimum against the measured one on synthetic results."""

import copy
import json
import re
from pathlib import Path

import pytest

import _fake_docker
from scripts.bench import bench, report, sweep
from scripts.bench import plan as pl
from scripts.report import receipt_data as rd
from scripts.lib.errors import UserError

ROOT = Path(__file__).resolve().parents[2]


def point(label: str, drafter: str = "lightseekorg/kimi-k2.5-eagle3", quant: str = "") -> sweep.Point:
    return sweep.Point(drafter, sweep.parse_setting(label, "test"), quant)


# -------------------------------------------------------------------------------------------------------------
# the settings SGLang would change or fail on mid-run


@pytest.mark.parametrize(
    "label, match",
    [
        ("3/1/5", "with topk 1 SGLang replaces 5 draft tokens by steps \\+ 1 = 4"),
        ("2/2/8", "the draft tree offers 6 candidates, fewer than draft tokens - 1 = 7"),
        ("0/1/1", "at least 1"),
    ],
)
def test_settings_sglang_would_change_or_fail_on(label, match):
    found = sweep.problems(sweep.parse_setting(label, "test"))
    assert found and re.search(match, found[0]), found


# -------------------------------------------------------------------------------------------------------------
# the sweep file and its variants


def test_committed_sweep_becomes_checked_variants():
    """Every requested setting passes problems() (variants() raises otherwise)."""
    sw = sweep.load()
    settings = [s.label for s in dict.fromkeys(p.setting for p in sw.points)]
    assert settings == "1/1/2 2/1/3 3/1/4 4/1/5 5/1/6 3/4/8 4/4/8".split() and len(sw.points) == 42
    drafters = ["AQ-MedAI/Kimi-K25-eagle3", "lightseekorg/kimi-k2.5-eagle3", "lightseekorg/kimi-k2.5-eagle3-mla"]
    assert sorted({p.drafter for p in sw.points}) == drafters and {p.quant for p in sw.points} == {"", "fp8"}
    plan = pl.build(*pl.parse(["--sweep", "--", "--log-level", "info"]))
    vs = plan.variants
    # the names keep the drafter's org (two orgs' drafters of one name stay apart; issue 23 item 10)
    assert [v.name for v in vs][:2] == ["patched-nospec", "sweep-AQ-MedAI-Kimi-K25-eagle3-1-1-2"]
    mla = next(v for v in vs if v.name == "sweep-lightseekorg-kimi-k2.5-eagle3-mla-4-4-8-fp8")
    said = dict(drafter="lightseekorg/kimi-k2.5-eagle3-mla", steps=4, topk=4, draft_tokens=8, draft_quantization="fp8")
    assert mla.to_dict()["setting"] == said
    argv = plan.launches[mla.name].argv
    after = list(argv[argv.index("--") + 1 :])  # after serve's --: sglang flags that replace the profile's
    setting = "--speculative-num-steps 4 --speculative-eagle-topk 4 --speculative-num-draft-tokens 8"
    assert after == [*setting.split(), "--speculative-draft-model-quantization", "fp8", "--log-level", "info"]
    assert argv[argv.index("--draft-model") + 1] == "lightseekorg/kimi-k2.5-eagle3-mla"


def test_the_dflash_arm_fills_each_drafter_into_its_own_profile_over_the_prompt_sets():
    plan = pl.build(*pl.parse(["--sweep", str(ROOT / "bench" / "sweep-dflash.toml")]))
    dflash = "sweep-z-lab-Kimi-K2.5-DFlash-1-1-8"
    eagle = [f"sweep-lightseekorg-kimi-k2.5-eagle3{m}-3-1-4" for m in ("", "-mla")]
    assert [v.name for v in plan.variants] == ["patched-nospec", *eagle, dflash]
    argv = " ".join(plan.launches[dflash].argv)  # DFLASH: SGLang's steps and topk 1, the block as draft tokens
    assert "--profile kimi-k25-dflash-tp8 " in argv and "--draft-model z-lab/Kimi-K2.5-DFlash -- " in argv
    assert argv.endswith(" -- --speculative-num-steps 1 --speculative-eagle-topk 1 --speculative-num-draft-tokens 8")
    assert [s.name for s in plan.scenarios] == ["C1-chat", "C1-code"]
    for s in plan.scenarios:  # prompt files, read from the client's working directory (the image's copy of docker/)
        assert s.dataset_name == "custom" and (ROOT / s.extra_args[1]).is_file(), s.name


def test_sweep_file_mistakes_are_named_before_anything_runs(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text('base = "patched-eagle3"\ndrafters = ["a/b"]\nsettings = ["3/1/5", "4/4/8"]\n')
    variants = pl.load_variants(pl.BENCH_DIR / "variants.toml")
    with pytest.raises(UserError) as e:
        sweep.variants(sweep.load(f), variants)
    msg = str(e.value)
    assert "point(s) SGLang would change" in msg and "sweep-a-b-3-1-5: 3/1/5: with topk 1" in msg
    assert "sweep-a-b-4-4-8:" not in msg  # the valid points are not listed
    f.write_text('base = "patched-nospec"\ndrafters = ["a/b"]\nsettings = ["3/1/4"]\n')
    with pytest.raises(UserError, match="does not speculate"):
        sweep.variants(sweep.load(f), variants)
    f.write_text('base = "patched-eagle3"\ndrafters = ["a/b"]\nsettings = ["3/1/4"]\nblock_drafters = ["c/d"]\n')
    with pytest.raises(UserError, match="block_drafters need block_base"):
        sweep.load(f)
    f.write_text('base = "x"\ndrafters = ["a/b"]\nsettings = ["3-1-4"]\n')
    with pytest.raises(UserError, match="not steps/topk/draft_tokens"):
        sweep.load(f)


def test_bench_sweep_dry_run_and_what_it_refuses(tmp_path, monkeypatch, capsys):
    docker = _fake_docker.install(tmp_path, engine_up=False)  # no engine and no GPU, whatever this machine has
    monkeypatch.setenv("PATH", _fake_docker.path_with(docker.bindir))
    res = tmp_path / "res"
    base = ["--sweep", "--results-dir", str(res), "--dry-run"]
    assert bench.main(base) == 2  # a dry run whose checks fail (no engine here)
    out = capsys.readouterr()
    assert "plan: 86 run(s) (1 scenario(s) x 43 variant(s) x 2 repeat(s)) in 43 server session(s)" in out.out
    assert "43 load(s) of moonshotai/Kimi-K2.5" in out.out and "FAIL docker engine" in out.out
    picked = "patched-nospec,sweep-lightseekorg-kimi-k2.5-eagle3-mla-3-4-8"
    assert bench.main(base + ["--variants", picked, "--repeats", "1"]) == 2
    assert "plan: 2 run(s) (1 scenario(s) x 2 variant(s) x 1 repeat(s))" in capsys.readouterr().out
    with pytest.raises(UserError, match="a sweep's drafters are its own"):
        bench.main(base + ["--draft-model", "x/y"])
    with pytest.raises(UserError, match="unknown variant 'patched-eagle3'"):
        bench.main(base + ["--variants", "patched-eagle3"])
    assert not res.exists()


# -------------------------------------------------------------------------------------------------------------
# the cost model's optimum against the measured one

T1, V, DRAFT = 12.0, 0.9, {"A/one": 0.8, "B/two": 1.4}  # ms: one-token forward, per verified token, per draft step
SETTINGS = ("3/1/4", "4/1/5", "5/1/6", "3/4/8", "4/4/8")
AL = {("A/one", s): al for s, al in zip(SETTINGS, (2.2, 2.35, 2.42, 2.65, 2.9))}
AL |= {("B/two", s): al for s, al in zip(SETTINGS, (2.0, 2.1, 2.15, 2.3, 2.35))}


def sweep_records(slow: dict[str, float] | None = None, hit: dict[str, float] | None = None) -> list[dict]:
    """A sweep's results at C1 made from a known cost model; `slow` divides a point's tok/s (a verify off its
    graph), `hit` sets its verify graph hit rate."""
    base = json.loads((ROOT / "tests" / "fixtures" / "bench" / "bench_serving_patched.jsonl").read_text())
    out = []
    for (drafter, label), al in AL.items():
        p = point(label, drafter)
        s = p.setting
        tok_s = 1000 * al / (T1 + V * (s.draft_tokens - 1) + DRAFT[drafter] * s.steps) / (slow or {}).get(p.name, 1)
        g = round(100 * (hit or {}).get(p.name, 1.0))
        r = copy.deepcopy(base)
        r["accept_length"] = al
        r["eagle"] = dict(scenario="C1", variant=p.name, letter="A", position=len(out) + 1, decode_tok_s=tok_s)
        r["eagle"]["variant_spec"] = {"speculative": True, "setting": p.describe()}
        r["eagle"]["verify"] = {"graph": g, "piecewise": 0, "eager": 100 - g, "fallback_reasons": {}}
        out.append(r)
    ref = copy.deepcopy(base)
    ref["accept_length"] = None
    ref["eagle"] = dict(scenario="C1", variant="patched-nospec", letter="B", position=99, decode_tok_s=1000 / T1)
    ref["eagle"]["variant_spec"] = {"speculative": False}
    return out + [ref]


def test_cost_model_recovers_the_costs_and_agrees_with_a_consistent_sweep():
    rows = report.summarize(sweep_records())
    points, t1 = report.sweep_points(rows, "C1")
    assert t1 == pytest.approx(T1) and len(points) == 10
    f, why = report.fit(points, t1)
    assert f is not None, why
    per_step = {"A/one (checkpoint)": 0.8, "B/two (checkpoint)": 1.4}
    assert f["per_token"] == pytest.approx(V) and f["per_step"] == pytest.approx(per_step)
    assert "Predicted optimum: sweep-A-one-4-4-8 " in report.verdict(points, f)[1]
    md = report.markdown(rows, {"stem": "S"})
    assert "## Sweep: drafters and speculative settings (C1)" in md
    assert "| A/one | checkpoint | 4/4/8 | 2.900 | 134.9 | 100.0% | " in md and "The sweep agrees with the model." in md
    assert "0.900 ms per verified token beyond the first" in md and "t1, measured by the reference run" in md
    chain = [r for r in sweep_records() if r["eagle"].get("variant_spec", {}).get("setting", {}).get("topk", 1) == 1]
    f, why = report.fit(*report.sweep_points(report.summarize(chain), "C1"))  # chain points alone cannot separate
    assert f is None and "add tree points (topk > 1)" in why
    assert "No cost-model verdict: the points cannot separate" in report.markdown(report.summarize(chain), {})


def test_a_point_off_its_verify_graph_makes_the_sweep_disagree():
    recs = sweep_records(slow={"sweep-A-one-4-4-8": 1.3}, hit={"sweep-A-one-4-4-8": 0.35})
    rows = report.summarize(recs)
    out = "\n".join(report.sweep_markdown(rows))  # what make bench's report prints
    assert "Predicted optimum: sweep-A-one-4-4-8 " in out and "Measured optimum: sweep-A-one-4-4-8 " not in out
    assert "does NOT agree with the model" in out and "(verify graph 35%)" in out
    assert "misses (measured vs predicted tok/s): sweep-A-one-4-4-8 -" in out


def test_accept_length_per_prompt_set_in_the_report_and_the_receipt():
    recs = []
    for sc, scale in (("C1-chat", 1.0), ("C1-code", 1.25)):
        for r in sweep_records():
            algorithm = "EAGLE3" * r["eagle"]["variant_spec"]["speculative"]
            r["eagle"] |= {"scenario": sc, "patchset": "p", "speculative_algorithm": algorithm}
            r["eagle"]["scenario_spec"] = {"dataset_name": "custom", "max_concurrency": 1}
            r["accept_length"] = r["accept_length"] and r["accept_length"] * scale
            recs.append(r)
    assert "| sweep-A-one-3-1-4 | 2.200 | 2.750 |" in report.markdown(report.summarize(recs), {})
    got = rd.rec_speculation(recs)[1]
    assert got["measured"]["accept_length_by_set"]["sweep-A-one-3-1-4"] == {"C1-chat": 2.2, "C1-code": 2.75}
    assert 'sweep-A-one-3-1-4 {"C1-chat": 2.2, "C1-code": 2.75}' in got["why"]
