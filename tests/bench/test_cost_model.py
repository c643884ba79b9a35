"""make docs (scripts/report/cost_model.py) and the box model (scripts/report/spec_model.py): the back-test against
the seed box, the physical floors it refuses to go below, the refit from a receipt's profile, the operator's
mistakes."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.report import cost_model as cm
from scripts.report import receipt_data as rd
from scripts.report import spec_model as sm
from scripts.lib.errors import UserError

INP, CYC = sm.load()


def test_the_document_is_current_and_its_back_test_predicts_every_seed_number_within_10_percent():
    assert cm.main(["--check"]) == 0
    table = cm.Box(INP, CYC, runs=cm.load_runs()).backtest()
    rows = [[c.strip() for c in ln.strip("|").split("|")] for ln in table.splitlines()[2:]]
    named = {"Plain decode, tok/s", "EAGLE-3 at AL 2.0, tok/s", "AQ-MedAI drafter at AL 1.5, tok/s"}
    assert {r[0] for r in rows} >= named | {"Break-even AL, verify / decode", "Break-even AL, cycle / decode"}
    for name, _, _, _, error in rows:
        assert error.startswith(("within", "0 %")) or abs(float(error.split()[0])) <= 10, (name, error)
    assert next(r for r in rows if r[0].startswith("Plain"))[3] == "82.0"  # the calibration input, reproduced


def test_the_calibrated_model_gives_the_review_s_box_numbers():
    """CAL of the perf review (appendix): 3/1/4 13.93 ms, 164 tok/s at AL 2.28 (band 121-225), plain 117 tok/s."""
    m = {c: sm.Model(INP, CYC, c) for c in sm.CORNERS}
    assert m["central"].B() == pytest.approx(7.855, abs=0.01)
    assert 1000 / m["central"].decode_ms() == pytest.approx(117, abs=1)
    assert [round(m["central"].cycle_ms(s), 2) for s in range(1, 6)] == [10.69, 12.31, 13.92, 15.51, 17.08]
    assert [round(m[c].tok_s()) for c in sm.CORNERS] == [121, 164, 225]
    assert sm.Model(INP, CYC, head_rows=32000).cycle_ms(3, "nccl", 30.0) == pytest.approx(31.8, abs=0.05)
    c = sm.Model(INP, CYC)  # its bytes and floors
    assert [round(c.gb(w), 2) for w in (1, 4, 8)] == [6.03, 10.31, 15.61]
    assert [round(c.oneshot_us(r), 1) for r in (1, 4, 8)] == [1.9, 7.6, 15.1]  # 7 x rows x 14 KiB at 53 GB/s
    assert c.floor_ms(1) == pytest.approx(6.03 / 1.792 + 123 * 1.89e-3, abs=0.01) and c.problems() == []


def test_the_dflash_arm_gives_the_review_s_numbers_and_its_break_even_with_eagle3():
    """Perf review 2026-12-02 t5, lever 1a and section 4: cycle 18.3 ms (13.1-23.9); AL 3.0 / 3.7 / 4.5 -> 164 / 202 /
    246 tok/s; level with EAGLE-3 3/1/4 (AL 2.28) at AL ~3.0; 200 tok/s needs AL 3.66."""
    m, d = {c: sm.Model(INP, CYC, c) for c in sm.CORNERS}, INP["dflash"]
    assert [m[c].dflash_ms() for c in sm.CORNERS] == pytest.approx([23.9, 18.3, 13.1], rel=0.035)
    c = m["central"]
    assert [1000 * al / c.dflash_ms() for al in (3.0, 3.7, 4.5)] == pytest.approx([164, 202, 246], abs=3)
    gb, ar = d["layers_gb"] + d["fc_gb"] + 0.294, c.lat("pcie_ipc", 8 * 14)  # 8 rows of 7168 bf16 per all-reduce
    want = gb / 1.792 / 0.85 + 4 * 0.15 + (13 * ar + c.lat("pcie_ipc", 0)) / 1000
    assert c.block_ms() == pytest.approx(want) and c.verify_ms(8) == pytest.approx(16.17, abs=0.01)
    table, drafters = cm.Box(INP, CYC).dflash(), cm.Box(INP, CYC).drafters()
    assert "| AL for 200 tok/s | 3.68 (2.60-4.93) | 2.78 (2.03-3.77) |" in table
    assert "| AL at which it matches EAGLE-3 3/1/4 at AL 2.28 | 3.01 (2.92-3.01) | - |" in table
    assert "| DFlash (+22%) |\n| code, benchmark (MBPP)" in drafters and drafters.endswith("| EAGLE-3 (+53%) |")


def test_make_docs_refuses_a_row_below_its_floor_or_a_verify_faster_than_its_decode(monkeypatch):
    fast = json.loads(json.dumps(INP))
    fast["seed"]["decode_tok_s"] = 400.0  # B = 2.5 - 124 a_seed: a decode below its bytes
    monkeypatch.setattr(sm, "load", lambda: (fast, CYC))
    with pytest.raises(UserError, match=r"impossible row: pessimistic, pcie_ipc: 1-token forward .* < its floor"):
        cm.main(["--check"])
    odd = sm.Model(INP, CYC, rho=-1.0)  # fewer experts for more tokens: the verify reads less than the decode
    assert any("4-token verify" in p and "< the 1-token decode" in p for p in odd.problems())


def _profile(**over) -> dict:
    def stage(f, c):
        return {"forward_ms": f, "comm_ms": c, "busy_ms": f - c - 1, "gap_ms": 1.0, "kernels": 1500}

    measured = dict(gpu="NVIDIA RTX PRO 6000 Blackwell Server Edition", tp=8, steps=3, accept_length=2.5, cycle_ms=17.0)
    calls = {"nccl_graph_us": {"1": 30.0, "4": 32.0}, "pcie_ipc_us": {"1": 6.0, "4": 11.0, "8": 17.0}}
    stages = dict(decode=stage(10.0, 1.0), target_verify=stage(14.0, 1.5), draft_decode=stage(0.6, 0.05))
    stages["draft_extend"] = stage(0.8, 0.08)
    return measured | calls | stages | over


def test_refit_takes_what_the_profile_measured():
    m = sm.Model(INP, CYC, **sm.refit(_profile()))
    assert m.B() == pytest.approx(9.0) and m.p["a_seed_us"] == 30.0 and m.lat("pcie_ipc", 56.0) == pytest.approx(11.0)
    assert m.verify_ms(4) - m.comm_ms("target_verify", 4, "pcie_ipc") == pytest.approx(12.5)  # non-communication
    assert m.p["glue_ms"] == pytest.approx(17.0 - 14.0 - 0.6 - 0.8) and m.al() == 2.5  # draft graph: 2 forwards
    assert m.p["draft_fwd_ms"] == pytest.approx((0.55 + 0.72) / 3) and m.tok_s() == pytest.approx(2500 / m.cycle_ms())
    with pytest.raises(UserError, match=r"profile lacks .*cycle_ms.*target_verify.comm_ms"):
        sm.refit(_profile(cycle_ms=None, target_verify={"forward_ms": 1.0}))


def profile_receipt(directory: Path, profile: dict) -> Path:
    """directory/box: a receipt with raw/profile.json and one inconclusive recommendation, as make report writes it."""
    d = directory / "box"
    (d / "raw").mkdir(parents=True)
    rec = dict(default="EAGLE-3 in the shipped profile", verdict="inconclusive", why="no bench", measured={})
    meta = dict(schema=rd.SCHEMA, parts={"profile": {"ok": True}}, thresholds=rd.THRESHOLDS, environment={"box": "box"})
    (d / "receipt.json").write_text(json.dumps({**meta, "recommendations": [{**rec, "threshold": "", "setting": ""}]}))
    (d / "raw" / "profile.json").write_text(json.dumps(profile))
    return d


def test_make_docs_refits_the_model_from_a_box_receipt_s_profile_not_a_proxy_s(tmp_path, capsys):
    doc = tmp_path / "plan.md"
    doc.write_text(cm.DOC.read_text())
    assert cm.main(["--write", "--doc", str(doc), "--receipt", str(profile_receipt(tmp_path, _profile()))]) == 0
    text = doc.read_text()
    assert cm.block(text, "backtest").startswith("Refitted from the profile of receipt `box`.")
    assert "the model above is refitted from it." in cm.block(text, "box-measured")
    assert "| plain decode, ms | 10.00 |" in cm.block(text, "box-measured")
    assert cm.block(text, "settings") != cm.block(cm.DOC.read_text(), "settings")
    assert "plot cost-model.png: drawn" in capsys.readouterr().out and (tmp_path / "cost-model.png").stat().st_size
    proxy = profile_receipt(tmp_path / "h200", _profile(gpu="NVIDIA H200", tp=1))  # the lent H200: shown, not applied
    assert cm.main(["--write", "--doc", str(doc), "--receipt", str(proxy)]) == 0
    assert "shown, not applied (a proxy)" in doc.read_text() and "Refitted" not in cm.block(doc.read_text(), "backtest")


def test_a_typo_or_a_corrupt_receipt_exits_2_with_the_fix(tmp_path):
    (tmp_path / "bad.tar.gz").write_bytes(b"not a tarball")
    for path in (tmp_path / "nope.tar.gz", tmp_path / "bad.tar.gz"):
        cmd = [sys.executable, "-m", "scripts.report.cost_model", "--check", "--receipt", str(path)]
        cp = subprocess.run(cmd, cwd=cm.REPO_ROOT, capture_output=True, text=True, timeout=120)
        assert cp.returncode == 2 and "make docs RECEIPT=<file>" in cp.stderr and "Traceback" not in cp.stderr


def test_without_matplotlib_the_plot_names_the_fix(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    got = cm.plot(cm.Box(INP, CYC), tmp_path / "p.png")
    assert "has no matplotlib; run make docs PY=.venv/bin/python" in got and not (tmp_path / "p.png").exists()


def test_the_proxy_table_follows_its_result_files():
    runs = cm.load_runs()
    before = cm.h200_table(runs, INP["proxy"])
    keys, want = ("kind", "variant", "rows", "mode"), ("allreduce", "SIMPLE", 8, "graph")
    rec = next(r for r in runs[0]["records"] if tuple(map(r.get, keys)) == want)
    rec["us_per_call"] *= 10
    assert before != cm.h200_table(runs, INP["proxy"]) and "NVLink: not the box" in before.splitlines()[0]


def test_levers_rank_the_unbuilt_ones_and_reject_with_a_reason():
    table = cm.Box(INP, CYC).levers()
    rows = {ln.split("|")[2].strip(): ln for ln in table.splitlines()[2:]}
    assert rows["Draft on one GPU (TP1)"].startswith("| x |") and "rejected" in rows["Two-batch overlap"]
    fp8 = next(v for k, v in rows.items() if k.startswith("FP8 (W8A16)"))
    assert "| -1.38 |" in fp8 and "| 140 |" in fp8  # 2.1 GB fewer bytes per forward; plain decode 117 -> 140
    assert "| 193 (+30) |" in rows["FP8 drafter + FP8 non-expert linears + sharded q_a/kv_a"]
