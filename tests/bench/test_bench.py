"""`make bench` (scripts/bench/bench.py): configs, A/B/A plan, server observations, report, plot, baseline comparison, and
the harness end to end against local stand-in servers running SGLang's real bench_serving client.

Fixtures (tests/fixtures/bench/):
  bench_serving_{patched,stock}.jsonl  one record each, written by the real `sglang.benchmark.serving
                                       --output-file` against the stand-in servers
  server_info_*.json, metrics_*.txt    the stand-ins' /server_info and /metrics after those runs
  results_abba.jsonl                   a results file of the harness itself (2 variants x 2 repeats, A B B A)
  standin_server.py                    the stand-in server; tokenizer/ a tiny WordLevel tokenizer (make_tokenizer.py)
  record_fixtures.py                   re-records the four kinds above from the harness against the stand-ins
  client_stubs/datasets                put on the client's PYTHONPATH only when `datasets` is not installed
"""

from __future__ import annotations

import copy
import importlib.util
import json
import math
import re
import shlex
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scripts.bench import bench
from scripts.bench import client as bc
from scripts.bench import config as cfg
from scripts.bench import launch
from scripts.bench import observe as bs
from scripts.bench import report as rep
from scripts.lib.errors import UserError
from scripts.series.pin import load_pin

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures" / "bench"
TOKENIZER = FIX / "tokenizer"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
sys.path.insert(0, str(FIX))
import _fake_docker  # noqa: E402
import standin_server  # noqa: E402


def record(name: str) -> dict:
    return json.loads((FIX / f"bench_serving_{name}.jsonl").read_text().splitlines()[0])


def snap(server_info=None, metrics_text=None) -> bs.Snapshot:
    return bs.Snapshot(0.0, server_info, bs.parse_prometheus(metrics_text) if metrics_text is not None else None)


# -------------------------------------------------------------------------------------------------------------
# recorded bench_serving output and server state


def test_recorded_bench_serving_record_has_the_fields_the_harness_reads():
    rec = record("patched")
    for k in ("output_throughput", "median_ttft_ms", "median_itl_ms", "median_tpot_ms", "accept_length",
              "completed", "max_concurrency", "server_info", "tag"):
        assert k in rec, k
    assert rec["tag"] == "C2/patched/r1" and rec["completed"] == 8
    # bench_serving reads the accept length from /server_info internal_states[0] after the run
    assert rec["accept_length"] == rec["server_info"]["internal_states"][0]["avg_spec_accept_length"]
    m = rep.run_metrics({**rec, "eagle": {"decode_tok_s": 123.0}})
    assert m == {"decode_tok_s": 123.0, "output_tok_s": rec["output_throughput"], "ttft_ms": rec["median_ttft_ms"],
                 "itl_ms": rec["median_itl_ms"], "tpot_ms": rec["median_tpot_ms"],
                 "accept_length": rec["accept_length"]}
    stock = record("stock")
    assert stock["accept_length"] is None
    assert rep.run_metrics({**stock, "eagle": {"accept_length_metrics": None}})["accept_length"] is None


def test_verify_counts_from_recorded_server_info_and_metrics():
    """The patched server's names: /server_info spec_cuda_graph {stage: {graph, piecewise, eager,
    fallback_reasons}} and sglang:spec_cuda_graph_forwards_total{stage,outcome,reason}; the run's verify numbers are
    the target_verify stage's, every stage is kept."""
    info = json.loads((FIX / "server_info_patched.json").read_text())
    assert set(info["internal_states"][0]["spec_cuda_graph"]) == {"target_verify", "draft_decode", "draft_extend"}
    from_info = bs.verify_counts(snap(info))
    assert {k: from_info[k] for k in ("graph", "piecewise", "eager", "fallback_reasons", "source")} == {
        "graph": 12, "piecewise": 0, "eager": 214, "fallback_reasons": {"batch_above_max_bs": 214},
        "source": "server_info"}
    assert from_info["hit_rate"] == pytest.approx(12 / 226)
    assert from_info["stages"]["draft_decode"]["eager"] == 428
    from_metrics = bs.verify_counts(snap(info, (FIX / "metrics_patched.txt").read_text()))
    assert from_metrics["source"] == "metrics"
    assert from_metrics["stages"] == from_info["stages"]
    stock = json.loads((FIX / "server_info_stock.json").read_text())
    assert bs.verify_counts(snap(stock, (FIX / "metrics_stock.txt").read_text())) is None


def test_prometheus_parsing_sums_rank0_series_and_unescapes_labels():
    text = "\n".join([
        "# HELP sglang:gen_throughput x",
        'sglang:gen_throughput{tp_rank="0",dp_rank="0"} 40.5',
        'sglang:gen_throughput{tp_rank="0",dp_rank="1"} 9.5',
        'sglang:gen_throughput{tp_rank="1",dp_rank="0"} 1000',  # other TP ranks repeat rank 0's numbers
        'sglang:spec_cuda_graph_forwards_total{tp_rank="0",stage="target_verify",outcome="eager",'
        'reason="has \\"quotes\\""} 3',
        'sglang:spec_cuda_graph_forwards_total{tp_rank="0",stage="target_verify",outcome="graph",reason=""} 5 '
        '1700000000000',
        'sglang:spec_cuda_graph_forwards_total{tp_rank="0",stage="target_verify",outcome="piecewise",'
        'reason="ragged_verify"} 2',
        "garbage line",
    ])
    samples = bs.parse_prometheus(text)
    assert bs.metric_sum(samples, "sglang:gen_throughput") == 50.0
    assert bs.metric_sum(samples, "sglang:gen_throughput", dp_rank="1") == 9.5
    assert bs.metric_sum(samples, "sglang:nothing") is None
    c = bs.verify_counts(snap(None, text))
    assert (c["graph"], c["piecewise"], c["eager"]) == (5, 2, 3)
    assert c["fallback_reasons"] == {'has "quotes"': 3, "ragged_verify": 2} and c["hit_rate"] == 0.5


def _metrics(graph: int, eager: dict[str, int], gen: float = 0, calls: float = 0) -> str:
    m = 'sglang:spec_cuda_graph_forwards_total{tp_rank="0",stage='
    lines = [f'{m}"target_verify",outcome="graph",reason=""}} {graph}',
             f'{m}"draft_extend",outcome="graph",reason=""}} 9']
    lines += [f'{m}"target_verify",outcome="eager",reason="{r}"}} {n}' for r, n in eager.items()]
    lines += [f'sglang:generation_tokens_total{{tp_rank="0",is_streaming="true"}} {gen}',
              f'sglang:spec_verify_calls_total{{tp_rank="0"}} {calls}']
    return "\n".join(lines)


def test_verify_delta_is_per_run_and_survives_counter_resets():
    before = snap(None, _metrics(100, {"bs>max": 4}))
    after = snap(None, _metrics(160, {"bs>max": 4, "mixed": 2}))
    d = bs.verify_delta(before, after)
    assert {k: d[k] for k in ("graph", "piecewise", "eager", "fallback_reasons", "source")} == {
        "graph": 60, "piecewise": 0, "eager": 2, "fallback_reasons": {"mixed": 2}, "source": "metrics"}
    assert d["hit_rate"] == pytest.approx(60 / 62) and d["stages"]["draft_extend"]["graph"] == 0
    # a counter that went down was reset (e.g. by /flush_cache): the value after counts from zero
    def info(graph, eager):
        return {"internal_states": [{"spec_cuda_graph": {"target_verify": {
            "graph": graph, "piecewise": 0, "eager": eager, "fallback_reasons": {"x": eager}}}}]}
    info_b, info_a = info(50, 9), info(12, 1)
    d = bs.verify_delta(snap(info_b), snap(info_a))
    assert (d["graph"], d["eager"], d["fallback_reasons"], d["source"]) == (12, 1, {"x": 1}, "server_info")
    # /metrics missing after the run: both snapshots' /server_info are used, not a mix of sources
    both_b = snap(info_b, _metrics(100, {}))
    assert bs.verify_delta(both_b, snap(info_a))["source"] == "server_info"
    assert bs.verify_delta(snap({}), snap({"internal_states": [{}]})) is None


def test_accept_length_from_metric_deltas():
    b = snap(None, _metrics(0, {}, gen=1000, calls=500))
    a = snap(None, _metrics(0, {}, gen=1300, calls=620))
    assert bs.accept_length_from_metrics(b, a) == pytest.approx(300 / 120)
    assert bs.accept_length_from_metrics(snap(None, ""), a) is None


def test_decode_rate_counts_each_window_once_and_skips_the_stale_value():
    samples = [(0.0, 70.0, 0), (1.0, 70.0, 0),  # before the measured phase: 70 is the last run's window
               (2.0, 70.0, 1), (2.5, 70.0, 1),  # stale: skipped until the server posts a new window
               (3.0, 10.0, 1), (3.5, 60.0, 1), (4.0, 60.0, 1), (4.5, 62.0, 1), (5.0, None, None),
               (5.5, 0.0, 0), (6.0, 64.0, 1),
               (9.0, 500.0, 0)]  # after the phase
    d = bs.decode_rate(samples, 2.0, 8.0, "metrics")
    assert d["decode_tok_s_samples"] == [10.0, 60.0, 62.0, 64.0]
    assert d["decode_tok_s"] == 61.0 and d["decode_windows"] == 4
    assert d["decode_tok_s_source"] == "metrics"
    assert bs.decode_rate([(0.0, 5.0, None)], 1.0, 2.0, None)["decode_tok_s"] is None


# -------------------------------------------------------------------------------------------------------------
# scenarios, variants, plan


def test_committed_scenarios_are_c1_c4_c16_on_the_offline_random_dataset():
    sc = cfg.load_scenarios()
    assert [(s.name, s.max_concurrency) for s in sc] == [("C1", 1), ("C4", 4), ("C16", 16)]
    for s in sc:
        assert s.dataset_name == "random-ids" and s.tokenize_prompt and s.range_ratio == 1.0 and s.flush_cache
        args = s.bench_args()
        assert args[args.index("--seed") + 1] == "1"
        assert args[args.index("--warmup-requests") + 1] == str(s.max_concurrency)
    assert "C1-long" in [s.name for s in cfg.load_scenarios(everything=True)]
    assert [s.name for s in cfg.load_scenarios(names="C16,C1")] == ["C16", "C1"]
    with pytest.raises(UserError, match="unknown scenario 'C8'"):
        cfg.load_scenarios(names="C8")


def test_every_flag_passed_to_bench_serving_exists_in_its_cli():
    src = (bc.TREE_PYTHON / "sglang" / "benchmark" / "serving.py").read_text()
    cmd = bc.bench_serving_cmd(["py"], "http://h:1", cfg.load_scenarios(everything=True)[0].bench_args(),
                               Path("o.jsonl"), "t", tokenizer="tok", model="m")
    flags = [t for t in cmd if t.startswith("--")]
    assert len(flags) > 10
    for f in flags:
        assert f'"{f}"' in src, f"bench_serving has no {f}"


def test_committed_variants_cover_stock_patched_spec_off_on_and_switches():
    vs = cfg.load_variants()
    default = cfg.pick_variants(vs, None)
    assert [v.name for v in default] == ["stock-nospec", "stock-eagle3", "patched-nospec", "patched-eagle3"]
    assert [v.speculative for v in default] == [False, True, False, True]
    sw = next(v for v in vs.variants if v.name == "patched-eagle3-switches-off")
    assert dict(sw.env) == {"SGLANG_PCIE_NCCL_DEFAULTS": "0", "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "0"}
    assert "--enforce-disable-flashinfer-allreduce-fusion" in sw.extra_args and not sw.default
    vals = cfg.placeholder_values(vs.defaults, {"draft_model": "/models/draft", "port": 31000})
    t = launch.Server(sw, vals, ["--log-level", "info"], Path("/tmp/x.log"))
    argv = t.argv
    assert argv[:4] == ["docker", "run", "-d", "--rm"] and "--gpus" in argv and "--network" in argv
    img = argv.index(vals["patched_image"])
    assert argv[img + 1] == "serve" and "/models/draft" in argv and "31000" in argv
    assert argv[-3:] == ["--enforce-disable-flashinfer-allreduce-fusion", "--log-level", "info"]
    assert "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=0" in argv[:img]
    stock = launch.Server(next(v for v in vs.variants if v.name == "stock-eagle3"), vals, [], Path("/tmp/y.log"))
    assert stock.argv[stock.argv.index("--entrypoint") + 1] == "python3"
    assert "SGLANG_PCIE_NCCL_DEFAULTS=0" in stock.argv
    # a placeholder left empty is a clear error, not an empty argument
    with pytest.raises(UserError, match="draft_model"):
        launch.Server(sw, cfg.placeholder_values({**vs.defaults, "draft_model": ""}, {}), [], Path("/tmp/z"))


def test_variant_file_errors_are_user_errors(tmp_path):
    f = tmp_path / "v.toml"
    f.write_text('[[variant]]\nname = "a"\nlauncher = "docker"\ncommand = ["x"]\n')
    with pytest.raises(UserError, match="needs image"):
        cfg.load_variants(f)
    f.write_text('[[variant]]\nname = "a"\nlauncher = "server"\nurl = "http://h:1"\ncolour = 1\n')
    with pytest.raises(UserError, match="unknown key.*colour"):
        cfg.load_variants(f)
    f.write_text('[[variant]]\nname = "a"\nlauncher = "local"\nargs = ["nope"]\n')
    with pytest.raises(UserError, match="argset 'nope'"):
        cfg.load_variants(f)


def test_server_urls_and_patchsets():
    vs = cfg.server_variants(["http://127.0.0.1:30000/"], ["abcdef012345"], None)
    assert [(v.name, v.url, v.patchset) for v in vs] == [("server", "http://127.0.0.1:30000", "abcdef012345")]
    vs = cfg.server_variants(["a=http://h:1", "b=http://h:2"], ["b=0123456789ab"], None)
    assert [(v.name, v.patchset) for v in vs] == [("a", "unknown"), ("b", "0123456789ab")]
    with pytest.raises(UserError, match="NAME=ID"):
        cfg.server_variants(["a=http://h:1", "b=http://h:2"], ["0123456789ab"], None)
    with pytest.raises(UserError, match="no --server-url is named c"):
        cfg.server_variants(["a=http://h:1"], ["c=1"], None)


def _v(name: str) -> cfg.Variant:
    return cfg.Variant(name=name, launcher="server", url="http://h:1")


def _s(name: str, c: int = 1) -> cfg.Scenario:
    return cfg.Scenario(name=name, max_concurrency=c, num_prompts=4, input_len=8, output_len=8)


def test_aba_plan_alternates_direction_and_shares_servers():
    plan = cfg.make_plan([_s("C1"), _s("C4", 4)], [_v("stock"), _v("patched")], repeats=3)
    assert len(plan) == 12 and [r.index for r in plan] == list(range(1, 13))
    assert "".join(r.letter for r in plan[::2]) == "ABBAAB"
    assert [(r.scenario.name, r.variant.name, r.repeat) for r in plan[:4]] == [
        ("C1", "stock", 1), ("C4", "stock", 1), ("C1", "patched", 1), ("C4", "patched", 1)]
    assert plan[2].label(12) == "[3/12] C1 patched repeat 1 (B)"
    for v in ("stock", "patched"):
        assert sorted(r.repeat for r in plan if r.variant.name == v and r.scenario.name == "C4") == [1, 2, 3]
    assert [[r.variant.name for r in s][0] for s in cfg.sessions(plan)] == ["stock", "patched", "stock", "patched"]
    three = cfg.make_plan([_s("C1")], [_v("a"), _v("b"), _v("c")], repeats=2)
    assert "".join(r.letter for r in three) == "ABCCBA"
    # past Z the letters go on as columns do (AA, AB, ...): (V27) used to follow (Z), though (V) was taken
    letters = [cfg.letter(i) for i in range(60)]
    assert letters[25:28] == ["Z", "AA", "AB"] and len(set(letters)) == 60
    blocked = cfg.make_plan([_s("C1")], [_v("a"), _v("b")], repeats=2, order="blocked")
    assert [(r.letter, r.repeat) for r in blocked] == [("A", 1), ("A", 2), ("B", 1), ("B", 2)]
    assert len(cfg.sessions(blocked)) == 2
    with pytest.raises(UserError):
        cfg.make_plan([_s("C1")], [_v("a")], repeats=0)


# -------------------------------------------------------------------------------------------------------------
# summary, report, plot, baseline


def synthetic(values: dict[tuple[str, str], list[tuple[float, float, float | None, int | None]]]) -> list[dict]:
    """Results records made from the recorded bench_serving output: (decode, output tok/s, accept length, eager)."""
    out, pos = [], 0
    letters = {}
    for (sc, var), runs in values.items():
        letters.setdefault(var, cfg.letter(len(letters)))
        for i, (dec, outp, al, eager) in enumerate(runs, 1):
            pos += 1
            r = copy.deepcopy(record("patched" if al is not None else "stock"))
            r["output_throughput"], r["accept_length"] = outp, al
            r["eagle"] = {"scenario": sc, "variant": var, "letter": letters[var], "repeat": i, "position": pos,
                          "patchset": "0123456789ab" if var.startswith("patched") else "none", "decode_tok_s": dec,
                          "verify": None if eager is None else {"graph": 10, "piecewise": 0, "eager": eager,
                                                                "fallback_reasons": {"bs>16": eager} if eager else {}},
                          "scenario_spec": {"max_concurrency": 1, "num_prompts": 8, "input_len": 1024,
                                            "output_len": 512}}
            out.append(r)
    return out


RECS = {("C1", "stock-nospec"): [(82.0, 80.0, None, None), (80.0, 78.0, None, None), (84.0, 81.0, None, None)],
        ("C1", "patched-eagle3"): [(110.0, 100.0, 2.0, 0), (100.0, 95.0, 2.1, 0), (120.0, 110.0, 1.9, 0)],
        ("C4", "stock-nospec"): [(200.0, 190.0, None, None)],
        ("C4", "patched-eagle3"): [(220.0, 210.0, 1.8, 3)]}


def test_summary_medians_spread_and_eager_flags():
    rows = rep.summarize(synthetic(RECS))
    assert [(r.scenario, r.variant, r.letter, r.n) for r in rows] == [
        ("C1", "stock-nospec", "A", 3), ("C1", "patched-eagle3", "B", 3),
        ("C4", "stock-nospec", "A", 1), ("C4", "patched-eagle3", "B", 1)]
    p = rows[1]
    d = p.stats["decode_tok_s"]
    assert (d.median, d.min, d.max) == (110.0, 100.0, 120.0)
    assert p.stats["accept_length"].median == 2.0 and p.stats["output_tok_s"].median == 100.0
    assert p.spread_pct == pytest.approx(100 * 20 / 110)
    assert rows[0].eager is None and p.eager == 0 and rows[3].eager == 3
    assert rows[3].eager_reasons == {"bs>16": 3} and rows[0].patchsets == ["none"]


def test_markdown_table_flags_eager_and_noisy_rows():
    rows = rep.summarize(synthetic(RECS))
    md = rep.markdown(rows, {"stem": "S", "box": "box1", "git_rev": "abc1234", "runs": 8})
    assert "# Bench results S" in md and "`box1`" in md and "`abc1234`" in md
    assert "## C1 (concurrency 1, 8 prompts, in 1024 / out 512 tokens)" in md
    line = next(ln for ln in md.splitlines() if "| patched-eagle3 |" in ln and "C1" not in ln)
    assert "110.0 (100.0–120.0)" in line  # decode tok/s
    assert "1.34×" in line  # vs A: 110 / 82
    assert "2.000 (1.900–2.100)" in line  # accept length
    assert "18.2% ⚠" in line  # spread above 7 %
    assert "- C4 / patched-eagle3: 3 verify forwards ran off their CUDA graph (3 eager; bs>16: 3)" in md
    assert "| 76.9% | **3** ⚠ |" in md and "| 100.0% | 0 |" in md  # verify graph hit rate, off-graph verify
    # result files of earlier harness versions (eager / eager_reasons only) still read
    old = synthetic(RECS)
    for r in old:
        if r["eagle"]["verify"]:
            r["eagle"]["verify"] = {"graph": 10, "eager": 3, "eager_reasons": {"bs>16": 3}}
    assert [(r.eager, r.eager_reasons, r.hit_rate) for r in rep.summarize(old)][3] == (3, {"bs>16": 3}, 10 / 13)
    assert "Baseline comparison" not in md


def test_plot_writes_a_png(tmp_path):
    out = tmp_path / "p.png"
    assert rep.plot(rep.summarize(synthetic(RECS)), out, title="t")
    data = out.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 5000


def test_baseline_comparison_passes_and_regresses():
    rows = rep.summarize(synthetic(RECS))
    base = rep.make_baseline(rows, {"box": "b"}, rep.thresholds(None, None, None))
    assert base["thresholds"] == {"tok_s_drop_pct": 5.0, "accept_length_drop": 0.05}
    entry = next(e for e in base["entries"] if e["scenario"] == "C1" and e["variant"] == "patched-eagle3")
    assert entry["decode_tok_s"] == 110.0 and entry["accept_length"] == 2.0
    th = rep.thresholds(base, None, None)
    assert all(c.status == "ok" for c in rep.compare(rows, base, th))

    slower = copy.deepcopy(RECS)
    slower[("C1", "patched-eagle3")] = [(103.0, 96.0, 1.96, 0)] * 3  # decode -6.4 %, output -4 %, AL -0.04
    checks = rep.compare(rep.summarize(synthetic(slower)), base, th)
    bad = [(c.scenario, c.variant, c.metric) for c in checks if c.status == "REGRESSION"]
    assert bad == [("C1", "patched-eagle3", "decode_tok_s")]
    assert "decode tok/s 103.0 vs baseline 110.0 (-6.4%, limit -5%)" in next(
        c for c in checks if c.status == "REGRESSION").line()
    # looser limits from the command line win over the baseline's
    assert not [c for c in rep.compare(rep.summarize(synthetic(slower)), base, rep.thresholds(base, 7, None))
                if c.status == "REGRESSION"]

    worse_al = copy.deepcopy(RECS)
    worse_al[("C1", "patched-eagle3")] = [(110.0, 100.0, 1.94, 0)] * 3
    bad = [c.metric for c in rep.compare(rep.summarize(synthetic(worse_al)), base, th) if c.status == "REGRESSION"]
    assert bad == ["accept_length"]

    partial = {k: v for k, v in RECS.items() if k[0] == "C1"}
    checks = rep.compare(rep.summarize(synthetic(partial)), base, th)
    assert {c.status for c in checks if c.scenario == "C4"} == {"not run"}
    assert not [c for c in checks if c.status == "REGRESSION"]
    md = rep.markdown(rep.summarize(synthetic(slower)), {}, rep.compare(rep.summarize(synthetic(slower)), base, th),
                      "b.json")
    assert "**1 regression(s)**" in md and "| **REGRESSION** |" in md


def test_report_cli_exit_codes_on_recorded_harness_results(tmp_path, capsys):
    results = tmp_path / "r.jsonl"
    results.write_text((FIX / "results_abba.jsonl").read_text())
    recs = rep.load_results(results)
    # the harness's own recorded output: bench_serving keys untouched, "eagle" added, A B B A order
    assert [(r["eagle"]["letter"], r["eagle"]["repeat"], r["eagle"]["position"]) for r in recs] == [
        ("A", 1, 1), ("B", 1, 2), ("B", 2, 3), ("A", 2, 4)]
    assert set(record("patched")) <= set(recs[1])
    base = tmp_path / "base.json"
    assert bench.main(["--report", str(results), "--write-baseline", str(base)]) == 0
    assert results.with_suffix(".md").is_file() and results.with_suffix(".png").read_bytes()[:8] == PNG_MAGIC
    assert bench.main(["--report", str(results), "--baseline", str(base)]) == 0
    b = json.loads(base.read_text())
    for e in b["entries"]:
        if e["variant"] == "patched":
            e["output_tok_s"] *= 1.10
    base.write_text(json.dumps(b))
    capsys.readouterr()
    assert bench.main(["--report", str(results), "--baseline", str(base)]) == 1
    err = capsys.readouterr().err
    assert "REGRESSION against" in err and "C2 / patched: output tok/s" in err
    assert "REGRESSION" in results.with_suffix(".md").read_text()
    assert bench.main(["--report", str(results), "--fail-on-eager"]) == 1  # the patched stand-in runs eagerly
    with pytest.raises(UserError, match="schema|not a"):
        base.write_text("{}")
        bench.main(["--report", str(results), "--baseline", str(base)])


def test_client_resolution_names_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.setattr(bc, "TREE_PYTHON", tmp_path / "no-tree")
    monkeypatch.delenv("PYTHONPATH", raising=False)
    with pytest.raises(UserError, match="no sglang|imports no sglang"):
        bc.resolve_client(sys.executable)


def test_a_python_without_sglangs_requirements_gets_every_one_named_at_once(tmp_path, monkeypatch, capsys):
    """The dry run asks the client python to import bench_serving and, where it cannot, names every package of
    SGLang's own requirements (the pinned wheel's Requires-Dist) that it lacks, by package name, in one message;
    with no .venv and no image, each way out is named (issue 23 item 4)."""
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    for k, v in client_env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(bc, "VENV_PYTHON", tmp_path / "no-venv" / "bin" / "python")
    monkeypatch.setenv("PATH", _fake_docker.path_with())  # no docker client
    args = ["--server-url", "http://127.0.0.1:9", "--tokenizer", str(TOKENIZER), "--dry-run", "--results-dir",
            str(tmp_path / "r")]
    with pytest.raises(UserError) as e:
        bench.main(args + ["--client-python", str(bare / "bin" / "python")])
    msg = str(e.value)
    assert f"--client-python {bare / 'bin' / 'python'} cannot run SGLang's bench_serving" in msg
    lacks = re.search(r"lacks (\d+) of SGLang's requirements: ([^(]+)", msg)
    assert lacks and int(lacks.group(1)) > 30, msg
    named = lacks.group(2).split()
    for package in ("torch", "apache-tvm-ffi", "pyzmq", "pillow", "psutil", "prometheus-client", "transformers"):
        assert package in named, (package, named)  # pip's names, not module names (zmq, PIL, tvm_ffi)
    monkeypatch.setattr(sys, "executable", str(bare / "bin" / "python"))
    with pytest.raises(UserError) as e:
        bench.main(args)
    msg = str(e.value)
    assert "no-venv/bin/python: not there (make setup makes it)" in msg
    assert "the serving image: docker is not installed" in msg and "Fix: make setup" in msg
    assert "make image" in msg and msg.count("lacks ") == 1


def test_bench_serving_runs_from_the_serving_image(tmp_path):
    """--client-image: the scenario check and every run go through `docker run --network host IMAGE python3 -m
    sglang.benchmark.serving` (a fake docker that runs the image's entrypoint here), its output file and the
    tokenizer mounted at their own paths, the API key passed by name (issue 23 item 4)."""
    image = load_pin().serving_image
    docker = _fake_docker.install(tmp_path, images=(image,), pythonpath=(bc.TREE_PYTHON, FIX / "client_stubs"))
    server = standin_server.ServerThread("patched", api_key="k").start()
    scen = tmp_path / "scenarios.toml"
    scen.write_text('[defaults]\ninput_len = 16\noutput_len = 8\n'
                    '[[scenario]]\nname = "C1"\nmax_concurrency = 1\nnum_prompts = 2\n')
    try:
        cp = subprocess.run([sys.executable, "-m", "scripts.bench.bench", "--server-url", f"img={server.url}",
                             "--scenarios-file", str(scen), "--repeats", "1", "--results-dir", str(tmp_path / "r"),
                             "--tokenizer", str(TOKENIZER), "--sample-interval", "0.05", "--client-image"], cwd=ROOT,
                            env={**client_env(), "PATH": _fake_docker.path_with(docker.bindir), "SGLANG_API_KEY": "k"},
                            capture_output=True, text=True, timeout=600)
    finally:
        server.stop()
    assert cp.returncode == 0, cp.stderr[-3000:]
    assert f"bench_serving runs from the image {image} (" in cp.stderr
    runs = docker.runs()
    assert len(runs) == 2  # the scenario check, then the one run
    for argv in runs:
        assert argv[:2] == ["run", "--rm"] and ["--network", "host"] == argv[argv.index("--network"):][:2]
        assert f"{TOKENIZER.resolve()}:{TOKENIZER.resolve()}" in argv and ["-e", "OPENAI_API_KEY"] in [
            argv[i:i + 2] for i in range(len(argv))]
        assert argv[argv.index(image) + 1] == "python3" and "k" not in argv
    assert "-i" in runs[0] and runs[1][runs[1].index(image) + 1:][1:3] == ["-m", "sglang.benchmark.serving"]
    recs = [json.loads(ln) for f in (tmp_path / "r").glob("*.jsonl") for ln in f.read_text().splitlines()]
    assert len(recs) == 1 and recs[0]["completed"] == 2


# -------------------------------------------------------------------------------------------------------------
# launcher and end to end


def client_env() -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    if importlib.util.find_spec("datasets") is None:
        env["PYTHONPATH"] = os.pathsep.join([str(FIX / "client_stubs")] + [p for p in [env.get("PYTHONPATH")] if p])
    return env


def test_local_launcher_starts_waits_and_stops_its_server(tmp_path):
    port = standin_server.free_port()
    v = cfg.Variant(name="standin", launcher="local", speculative=False, python=sys.executable,
                    command=("{python}", str(FIX / "standin_server.py"), "--profile", "stock", "--port", "{port}"))
    t = launch.Server(v, cfg.placeholder_values({}, {"port": port}), [], tmp_path / "server.log")
    try:
        t.start(timeout=60)
        assert bs.http_get(t.url + "/v1/models")[0] == 200
        assert t.patch_info()["patchset"] in ("unknown", "none")  # this python has no sglang with a record
        proc = t.proc
        with pytest.raises(UserError, match="already in use"):
            launch.Server(v, cfg.placeholder_values({}, {"port": port}), [], tmp_path / "b.log").start(5)
    finally:
        t.stop()
    assert proc.poll() is not None and not launch.port_open("127.0.0.1", port)


@pytest.fixture
def standins():
    servers = [standin_server.ServerThread("stock").start(), standin_server.ServerThread("patched").start()]
    yield servers
    for s in servers:
        s.stop()


def test_harness_end_to_end_against_standin_servers(standins, tmp_path):
    assert (bc.TREE_PYTHON / "sglang" / "benchmark" / "serving.py").is_file(), "no SGLang tree: run make apply"
    stock, patched = standins
    scen = tmp_path / "scenarios.toml"
    scen.write_text('[defaults]\ninput_len = 32\noutput_len = 48\n'
                    '[[scenario]]\nname = "C2"\nmax_concurrency = 2\nnum_prompts = 8\n')
    res = tmp_path / "results"
    t0 = time.monotonic()
    cp = subprocess.run([sys.executable, "-m", "scripts.bench.bench", "--server-url", f"stock={stock.url}",
                         "--server-url", f"patched={patched.url}", "--patchset", "patched=0123456789ab",
                         "--scenarios-file", str(scen), "--repeats", "1", "--results-dir", str(res),
                         "--box", "test-box", "--tokenizer", str(TOKENIZER), "--sample-interval", "0.05",
                         "--write-baseline", str(tmp_path / "base.json")],
                        cwd=ROOT, env=client_env(), capture_output=True, text=True, timeout=300)
    assert cp.returncode == 0, cp.stderr[-3000:]
    assert time.monotonic() - t0 < 120
    err = cp.stderr
    assert "[1/2] C2 stock repeat 1 (A)... ETA " in err and "[2/2] C2 patched repeat 1 (B)... ETA " in err
    assert "plan: 2 run(s) (1 scenario(s) x 2 variant(s) x 1 repeat(s)) in 2 server session(s)" in err
    assert "C2 stock repeat 1 (A)... ETA 10s (estimated)" in err  # 2 runs x (8/2 + 1 waves) x 48 tokens / 50 tok/s
    assert "verify forward(s) off their CUDA graph" in err
    files = sorted(p.name for p in res.iterdir())
    stem = files[0].split(".")[0]
    assert stem.endswith("_test-box") and "_" in stem[:-len("_test-box")]
    for ext in (".jsonl", ".md", ".png", ".bench_serving.log"):
        assert stem + ext in files, files
    recs = [json.loads(ln) for ln in (res / f"{stem}.jsonl").read_text().splitlines()]
    assert len(recs) == 2
    raw_keys = set(record("patched"))
    for r in recs:
        assert raw_keys <= set(r), raw_keys - set(r)  # bench_serving's own record, keys unchanged
        assert r["completed"] == 8 and r["max_concurrency"] == 2
    s, p = (r["eagle"] for r in recs)
    assert (s["variant"], s["letter"], s["position"], p["variant"], p["letter"], p["position"]) == (
        "stock", "A", 1, "patched", "B", 2)
    assert s["box"] == p["box"] == "test-box" and s["scenario"] == "C2" and s["git_rev"]
    assert s["patchset"] == "unknown" and p["patchset"] == "0123456789ab"
    assert s["speculative_algorithm"] is None and p["speculative_algorithm"] == "EAGLE3"
    for e in (s, p):
        assert e["decode_tok_s_source"] == "metrics" and e["decode_windows"] >= 2 and e["decode_tok_s"] > 0
        assert e["started_at"] <= e["finished_at"]
    assert s["verify"] is None and recs[0]["accept_length"] is None
    assert p["verify"]["source"] in ("metrics", "server_info") and p["verify"]["eager"] > 0
    assert sum(p["verify"]["fallback_reasons"].values()) == p["verify"]["eager"]
    assert set(p["verify"]["stages"]) == {"target_verify", "draft_decode", "draft_extend"}
    assert 0 <= p["verify"]["hit_rate"] < 1
    assert recs[1]["accept_length"] == pytest.approx(2.0, abs=0.1)  # accept pattern 2,3,1,2
    assert p["accept_length_metrics"] == pytest.approx(2.0, abs=0.15)
    md = (res / f"{stem}.md").read_text()
    assert "| A | stock |" in md and "| B | patched | `0123456789ab` |" in md
    assert "Verify forwards off their CUDA graph" in md
    assert (res / f"{stem}.png").read_bytes()[:8] == PNG_MAGIC
    base = json.loads((tmp_path / "base.json").read_text())
    assert {(e["scenario"], e["variant"]) for e in base["entries"]} == {("C2", "stock"), ("C2", "patched")}
    assert all(math.isfinite(e["output_tok_s"]) for e in base["entries"])


def test_a_keyed_server_is_benchmarked_with_the_key_serve_reads(tmp_path):
    """A server started with an API key (SGLang's own auth rule in the stand-in): without the key the harness says
    401 and how to give it; with $SGLANG_API_KEY or --api-key-file (serve's sources) it and bench_serving send it,
    and the key is in no printed line, log or result (issue 23 item 8)."""
    key = "k3y-" + "5ecret" * 4
    server = standin_server.ServerThread("patched", api_key=key).start()
    scen = tmp_path / "scenarios.toml"
    scen.write_text('[defaults]\ninput_len = 16\noutput_len = 8\n'
                    '[[scenario]]\nname = "C1"\nmax_concurrency = 1\nnum_prompts = 2\n')

    def bench_it(res: Path, *extra, **env) -> subprocess.CompletedProcess:
        e = {k: v for k, v in client_env().items() if k not in ("SGLANG_API_KEY", "OPENAI_API_KEY")}
        return subprocess.run([sys.executable, "-m", "scripts.bench.bench", "--server-url", f"keyed={server.url}",
                               "--scenarios-file", str(scen), "--repeats", "1", "--results-dir", str(res),
                               "--box", "test-box", "--tokenizer", str(TOKENIZER), "--sample-interval", "0.05",
                               *extra], cwd=ROOT, env={**e, **env}, capture_output=True, text=True, timeout=300)
    try:
        no_key = bench_it(tmp_path / "none")
        assert no_key.returncode == 4, no_key.stderr[-3000:]
        assert "401 Unauthorized from " in no_key.stderr and "the server wants an API key" in no_key.stderr
        assert "export SGLANG_API_KEY=<its key>, or pass --api-key-file FILE" in no_key.stderr
        assert "no SGLang server answers" not in no_key.stderr
        by_env = bench_it(tmp_path / "env", SGLANG_API_KEY=key, OPENAI_API_KEY="someone-elses")
        assert by_env.returncode == 0, by_env.stderr[-3000:]
        assert "API key: from $SGLANG_API_KEY" in by_env.stderr and "OPENAI_API_KEY is set here" in by_env.stderr
        key_file = tmp_path / "key"
        key_file.write_text(key + "\n")
        by_file = bench_it(tmp_path / "file", "--api-key-file", str(key_file))
        assert by_file.returncode == 0, by_file.stderr[-3000:]
        assert f"API key: from the file {key_file}" in by_file.stderr
    finally:
        server.stop()
    recs = [json.loads(ln) for f in (tmp_path / "env").glob("*.jsonl") for ln in f.read_text().splitlines()]
    assert len(recs) == 1 and recs[0]["completed"] == 2 and recs[0]["eagle"]["decode_tok_s"] > 0
    for cp in (no_key, by_env, by_file):
        assert key not in cp.stdout + cp.stderr
    for f in tmp_path.rglob("*"):
        assert not f.is_file() or f == key_file or key not in f.read_text(errors="replace"), f


# -------------------------------------------------------------------------------------------------------------
# inputs judged by bench_serving itself before any server starts

BAD_SCENARIOS = """[defaults]
input_len = 32
output_len = 48
[[scenario]]
name = "ok"
max_concurrency = 2
num_prompts = 8
[[scenario]]
name = "fast"
max_concurrency = 2
num_prompts = 8
request_rate = "fast"
[[scenario]]
name = "seed"
max_concurrency = 2
num_prompts = 8
seed = 1.5
[[scenario]]
name = "ratio"
max_concurrency = 2
num_prompts = 8
range_ratio = 1.5
[[scenario]]
name = "dataset"
max_concurrency = 2
num_prompts = 8
dataset_name = "randm"
[[scenario]]
name = "flag"
max_concurrency = 2
num_prompts = 8
extra_args = ["--no-such-flag"]
[[scenario]]
name = "download"
max_concurrency = 2
num_prompts = 8
dataset_name = "sharegpt"
tokenize_prompt = false
[[scenario]]
name = "tokenized"
max_concurrency = 2
num_prompts = 8
dataset_name = "sharegpt"
"""


def test_scenario_values_are_judged_by_bench_serving_before_any_server(tmp_path, monkeypatch):
    """request_rate "fast", seed 1.5, range_ratio 1.5, an unknown dataset and an unknown flag fail --dry-run, each
    named with the key to fix, in bench_serving's own words (its parser, its dataset code); no server is touched
    (the --server-url answers nothing) and nothing is written."""
    for k, v in client_env().items():
        monkeypatch.setenv(k, v)
    scen = tmp_path / "scenarios.toml"
    scen.write_text(BAD_SCENARIOS)
    res = tmp_path / "results"
    base = ["--server-url", "http://127.0.0.1:9", "--scenarios-file", str(scen), "--tokenizer", str(TOKENIZER),
            "--results-dir", str(res), "--dry-run"]
    with pytest.raises(UserError) as e:
        bench.main(base + ["--scenarios", "ok,fast,seed,ratio,dataset,flag,download,tokenized"])
    msg = str(e.value)
    assert "7 scenario(s) would fail only after the servers loaded" in msg
    assert "scenario fast: bench_serving refuses it: argument --request-rate: invalid float value: 'fast'" in msg
    assert "set request_rate in [[scenario]] fast (or [defaults])" in msg
    assert "argument --seed: invalid int value: '1.5'" in msg and "set seed in [[scenario]] seed" in msg
    assert "compute_random_lens" in msg and "set range_ratio in [[scenario]] ratio" in msg
    assert "argument --dataset-name: invalid choice: 'randm'" in msg and "'random-ids'" in msg
    assert "unrecognized arguments: --no-such-flag" in msg and "extra_args of [[scenario]] flag" in msg
    # sharegpt is fetched from the Hub when the run starts (bench_serving's own loader, asked here with its
    # download helpers limited to the local caches), and this box is offline (issue 23 item 9)
    assert ("scenario download: its dataset downloads anon8231489123/ShareGPT_Vicuna_unfiltered/"
            "ShareGPT_V3_unfiltered_cleaned_split.json from the Hugging Face Hub when it runs, and this box cannot "
            "(HF_HUB_OFFLINE=1 is set)") in msg
    assert 'extra_args = ["--dataset-path", "FILE"] in [[scenario]] download' in msg
    assert "scenario tokenized: bench_serving refuses it: its dataset sharegpt (ShareGPTDataset) refuses" in msg
    assert "scenario ok:" not in msg and not res.exists()
    with pytest.raises(UserError, match="fix or remove --nope in --bench-args"):
        bench.main(base + ["--scenarios", "ok", "--bench-args", "--nope 1"])
    assert bench.main(base + ["--scenarios", "ok"]) == 0


def test_scenario_keys_of_the_harness_are_typed(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text('[[scenario]]\nname = "a"\nmax_concurrency = 1\nnum_prompts = 1\ninput_len = 1\noutput_len = 1\n'
                 'flush_cache = "yes"\n')
    with pytest.raises(UserError, match="flush_cache must be true or false"):
        cfg.load_scenarios(f)


# -------------------------------------------------------------------------------------------------------------
# preflight: the box is checked and the plan priced before the first server starts (fake docker / nvidia-smi)

DOCKER = """#!/bin/sh
echo "$*" >> "{log}"
down() {{
  echo "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?" >&2
  exit 1
}}
[ -e "{state}/down" ] && down
case "$1" in
  version) echo 27.3.1 ;;
  image) echo sha256:0123456789abcdef0123 ;;
  run) case "$*" in
         *scripts.host.nccl*) cat "{transport}" ;;  # the preflight's NCCL probe: a recorded output
         *) {on_run} ;;
       esac ;;
esac
exit 0
"""
NVIDIA_SMI = """#!/bin/sh
i=0
while [ $i -lt {n} ]; do echo "GPU $i: NVIDIA RTX PRO 6000 Blackwell Server Edition (UUID: GPU-$i)"; i=$((i+1)); done
"""


def fake_box(tmp_path, monkeypatch, engine_up=True, gpus=8, on_run='touch "{state}/down"; down',
             transport="pcie8x") -> dict:
    """A PATH with a fake docker (argv recorded; no engine when engine_up is false, and the engine going away at
    the first `docker run` of a server by default; the preflight's NCCL transport probe answered with the recorded
    output of tests/fixtures/doctor/<transport>/) and a fake nvidia-smi, an HF cache holding the default model and
    drafter."""
    bin_, state = tmp_path / "bin", tmp_path / "state"
    bin_.mkdir()
    state.mkdir()
    if not engine_up:
        (state / "down").touch()
    log = tmp_path / "docker.log"
    (bin_ / "docker").write_text(DOCKER.format(log=log, state=state, on_run=on_run.format(state=state),
                                               transport=ROOT / "tests" / "fixtures" / "doctor" / transport /
                                               "nccl-transport.txt"))
    (bin_ / "nvidia-smi").write_text(NVIDIA_SMI.format(n=gpus))
    for f in bin_.iterdir():
        f.chmod(0o755)
    hf = tmp_path / "hf"
    for repo in ("moonshotai/Kimi-K2.5", "lightseekorg/kimi-k2.5-eagle3"):
        snap = hf / "hub" / f"models--{repo.replace('/', '--')}" / "snapshots" / "abc"
        snap.mkdir(parents=True)
        (snap / "config.json").write_text("{}")
        (snap / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "m-1.safetensors"}}))
        (snap / "m-1.safetensors").write_text("")
    for k, v in client_env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("PATH", f"{bin_}{os.pathsep}{os.environ['PATH']}")
    return {"log": log, "hf": hf, "res": tmp_path / "results"}


def docker_calls(box: dict, probes: bool = False) -> list[str]:
    """The docker commands run (the preflight's NCCL transport probe only with probes)."""
    lines = box["log"].read_text().splitlines() if box["log"].exists() else []
    return [ln.split()[0] for ln in lines if probes or "scripts.host.nccl" not in ln]


def test_bench_without_a_docker_engine_stops_with_one_message_and_writes_nothing(tmp_path, monkeypatch):
    box = fake_box(tmp_path, monkeypatch, engine_up=False)
    with pytest.raises(UserError) as e:
        bench.main(["--results-dir", str(box["res"]), "--hf-cache", str(box["hf"])])
    msg = str(e.value)
    assert msg.startswith("make bench cannot start: the docker engine is not running")
    assert "systemctl start docker" in msg and msg.count("Cannot connect") == 1
    assert docker_calls(box) == ["version"]  # no docker run, no image inspect per variant
    assert not box["res"].exists()  # no log or results file for runs that did not happen


def test_dry_run_prints_the_plan_its_cost_and_every_check(tmp_path, monkeypatch, capsys):
    box = fake_box(tmp_path, monkeypatch, gpus=2)
    assert bench.main(["--results-dir", str(box["res"]), "--hf-cache", str(box["hf"]), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "plan: 36 run(s) (3 scenario(s) x 4 variant(s) x 3 repeat(s)) in 10 server session(s)" in out
    assert "model loads: 10 load(s) of moonshotai/Kimi-K2.5, ~10m00s each (assumed)" in out
    assert "per run: C1 ~1m32s, C4 ~51s, C16 ~51s (assumed 50 tok/s per stream)" in out
    assert "estimated total: ~2h18m" in out
    assert "ok  docker engine: docker engine 27.3.1" in out and "ok  image eagle-fast-verify/sglang:" in out
    assert "FAIL GPUs: 2 GPU(s) here" in out and "need 8 (tp-size)" in out
    assert "ok  weights: lightseekorg/kimi-k2.5-eagle3, moonshotai/Kimi-K2.5 in" in out
    assert "run" not in docker_calls(box) and not box["res"].exists()
    with pytest.raises(UserError, match="make bench cannot start: 2 GPU"):  # a real run stops there
        bench.main(["--results-dir", str(box["res"]), "--hf-cache", str(box["hf"])])
    assert "run" not in docker_calls(box) and not box["res"].exists()


def test_concurrency_above_the_servers_limit_stops_the_dry_run(tmp_path, monkeypatch):
    """max_concurrency 1000 against the profile's max-running-requests 16: refused before any load, in the dry run
    too, naming both ways out; a limit raised after -- is the one that counts (issue 23 item 9)."""
    box = fake_box(tmp_path, monkeypatch)
    scen = tmp_path / "scenarios.toml"
    scen.write_text('[defaults]\ninput_len = 32\noutput_len = 48\n'
                    '[[scenario]]\nname = "C1000"\nmax_concurrency = 1000\nnum_prompts = 1000\n')
    args = ["--results-dir", str(box["res"]), "--hf-cache", str(box["hf"]), "--scenarios-file", str(scen),
            "--tokenizer", str(TOKENIZER), "--dry-run"]
    with pytest.raises(UserError) as e:
        bench.main(args)
    msg = str(e.value)
    assert "scenario C1000: max_concurrency 1000 is above max-running-requests 16 of " in msg
    assert "(profile kimi-k25-eagle3-tp8)" in msg and "max_concurrency <= 16 in [[scenario]] C1000" in msg
    assert docker_calls(box) == [] and not box["res"].exists()
    assert bench.main(args + ["--", "--max-running-requests", "1000"]) == 0


def test_missing_weights_stop_the_run_naming_the_download(tmp_path, monkeypatch):
    box = fake_box(tmp_path, monkeypatch)
    (next((box["hf"] / "hub").glob("models--moonshotai--*/snapshots/abc")) / "m-1.safetensors").unlink()
    with pytest.raises(UserError) as e:
        bench.main(["--results-dir", str(box["res"]), "--hf-cache", str(box["hf"]), "--variants", "patched-eagle3"])
    assert "1 of 1 weight shards missing" in str(e.value)
    assert f"hf download moonshotai/Kimi-K2.5 --cache-dir {box['hf'] / 'hub'}" in str(e.value)
    assert not box["res"].exists()
    # The printed download runs as printed with the pinned huggingface_hub (offline here: it gets as far as asking
    # the hub); `huggingface-cli download`, the fix printed before, exits 1 saying it no longer works.
    for cmd in re.findall(r"hf download [^;(]+", str(e.value)):
        argv = [str(Path(sys.executable).parent / "hf"), *shlex.split(cmd)[1:]]
        cp = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
        assert "offline mode is enabled" in cp.stdout + cp.stderr, cp.stdout + cp.stderr


def test_engine_lost_mid_plan_stops_the_plan_without_empty_logs(tmp_path, monkeypatch):
    box = fake_box(tmp_path, monkeypatch)  # the engine answers the preflight, then dies at the first docker run
    with pytest.raises(UserError) as e:
        bench.main(["--results-dir", str(box["res"]), "--hf-cache", str(box["hf"]), "--scenarios", "C1",
                    "--repeats", "1"])
    assert "the plan stopped after 0 run(s)" in str(e.value) and "engine is not running" in str(e.value)
    assert docker_calls(box).count("run") == 1  # not one failed docker run per variant
    assert docker_calls(box, probes=True).count("run") == 2  # and one NCCL transport probe before it
    assert not list(box["res"].glob("*.server-*.log"))  # no empty server log for a server that never ran


def test_nccl_on_shm_between_the_gpus_stops_the_run_before_any_server(tmp_path, monkeypatch, capsys):
    """The preflight runs the doctor's NCCL transport probe in the series' image (this python's torch sees no GPU)
    and stops on SHM with the pairs and the fix, before any server starts; a dry run lists it as a failed check."""
    box = fake_box(tmp_path, monkeypatch, transport="pcie8x-cns")
    with pytest.raises(UserError) as e:
        bench.main(["--results-dir", str(box["res"]), "--hf-cache", str(box["hf"]), "--scenarios", "C1"])
    msg = str(e.value)
    assert msg.startswith("make bench cannot start: NCCL 2.29.7+cuda13.0 does not use P2P between every GPU pair")
    assert "GPU3->GPU4 SHM/direct/direct" in msg and "242 us instead of ~16 us at 114 KB" in msg and "Fix: " in msg
    probe = [ln for ln in box["log"].read_text().splitlines() if "scripts.host.nccl" in ln]
    assert len(probe) == 1 and "--gpus all --ipc=host" in probe[0] and " eagle-fast-verify/sglang:" in probe[0]
    assert docker_calls(box).count("run") == 0 and not box["res"].exists()
    assert bench.main(["--results-dir", str(box["res"]), "--hf-cache", str(box["hf"]), "--dry-run"]) == 0
    assert "FAIL NCCL transport: NCCL 2.29.7+cuda13.0 does not use P2P" in capsys.readouterr().out


def test_estimates_come_from_earlier_results(tmp_path):
    res = tmp_path / "results"
    res.mkdir()
    (res / "old.jsonl").write_text("\n".join(json.dumps({"eagle": {"scenario": "C1", "wall_s": w, "launch_s": l}})
                                             for w, l in ((100, 300), (120, 500), (110, None))) + "\n")
    plan = cfg.make_plan([_s("C1"), _s("C9", 4)], [cfg.Variant(name="a", launcher="docker", image="i",
                                                             command=("x",))], repeats=2)
    lines = "\n".join(bench.preflight.plan_lines(plan, cfg.sessions(plan), {}, res))
    assert "1 load(s) of the a server, ~6m40s each (median of 2 earlier load(s))" in lines
    assert "C1 ~1m50s (median of 3 earlier run(s))" in lines and "C9 ~0s (assumed 50 tok/s per stream)" in lines


def test_resume_runs_only_what_the_results_lack(tmp_path):
    """A plan that died after one of its two runs: --check --resume says one is left, --resume runs only that one,
    and then none is left (make report's bench part is done only then; issue 23 item 3)."""
    server = standin_server.ServerThread("stock").start()
    scen = tmp_path / "scenarios.toml"
    scen.write_text('[defaults]\ninput_len = 16\noutput_len = 8\n'
                    '[[scenario]]\nname = "C1"\nmax_concurrency = 1\nnum_prompts = 2\n')
    res = tmp_path / "r"

    def bench_it(*extra) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "scripts.bench.bench", "--server-url", f"s={server.url}",
                               "--scenarios-file", str(scen), "--repeats", "2", "--results-dir", str(res), "--box",
                               "b", "--tokenizer", str(TOKENIZER), "--sample-interval", "0.05", *extra], cwd=ROOT,
                              env=client_env(), capture_output=True, text=True, timeout=600)
    try:
        assert bench_it().returncode == 0
        (first,) = res.glob("*.jsonl")
        lines = first.read_text().splitlines()
        first.write_text(lines[0] + "\n")  # the run that "died" wrote one of its two records
        check = bench_it("--check", "--resume")
        assert check.returncode == 0, check.stderr[-3000:]
        assert json.loads(check.stdout.strip().splitlines()[-1])["runs_left"] == 1
        again = bench_it("--resume")
        assert again.returncode == 0, again.stderr[-3000:]
        assert "resuming: 1 of 2 run(s) already in" in again.stderr, again.stderr
        assert "[1/1] C1 s repeat 2 (A)..." in again.stderr and "repeat 1 (A)..." not in again.stderr
        done = bench_it("--check", "--resume")
        assert json.loads(done.stdout.strip().splitlines()[-1]) == {"estimate_s": 0, "runs": 2, "runs_left": 0}
    finally:
        server.stop()
    recs = [json.loads(ln) for f in res.glob("*.jsonl") for ln in f.read_text().splitlines()]
    assert sorted(r["eagle"]["repeat"] for r in recs) == [1, 2]
