"""eagle-fast-verify.md's tables are generated from committed files (scripts/bench/cost_model.py)."""

from scripts.bench import cost_model


def test_cost_model_doc_is_current():
    assert cost_model.main(["--check"]) == 0


def test_cost_model_tracks_its_inputs():
    """Change one measured number in a copy of a result file: the rendered proxy table changes with it."""
    runs = cost_model.load_runs()
    before = cost_model.h200_table(runs)
    rec = next(r for r in runs[0]["records"] if r.get("kind") == "allreduce" and r.get("variant") == "SIMPLE"
               and r.get("rows") == 8 and r.get("mode") == "graph")
    rec["us_per_call"] *= 10
    after = cost_model.h200_table(runs)
    assert before != after
    line = next(l for l in after.splitlines() if "Simple / default" in l)
    assert "x" in line


def test_cost_model_box_rows_follow_the_model():
    import tomllib

    inp = tomllib.loads(cost_model.INPUTS.read_text())
    table = cost_model.box_table(inp)
    seed = next(l for l in table.splitlines() if l.startswith("| Seed"))
    # 205 us x 122 = 25.0 ms -> verify 30 ms -> AL 2.0 / (30 + 3.33 ms) = 60 tok/s; break-even 33.3 / 12.2 = 2.73
    assert "| 205 | 25.01 | 30.0 | 60 | 2.73 |" in seed


def test_sglang_rows_get_their_own_table_next_to_the_direct_flashinfer_runs():
    from scripts.bench import cost_model

    runs = cost_model.load_runs()
    direct, through = cost_model.h200_table(runs), cost_model.sglang_table(runs)
    assert "sglang1" not in direct.splitlines()[0] and "run1" in direct.splitlines()[0]
    assert "bench-comm_H200_x2_sglang1.json" in through.splitlines()[0]
    # every row of the SGLang table has a measured value (no empty spread) from the committed run
    for line in through.splitlines()[2:]:
        assert line.split("|")[2].strip() not in ("", "-"), line


def test_make_docs_says_what_it_wrote(tmp_path, monkeypatch, capsys):
    """`make docs` (cost_model --write) prints, per table, whether it changed, and writes nothing when none did."""
    doc = tmp_path / "doc.md"
    doc.write_text("# t\n<!-- cost-model:box -->\n| old | row |\n<!-- /cost-model:box -->\n"
                   "<!-- cost-model:h200 -->\n| same |\n<!-- /cost-model:h200 -->\n")
    monkeypatch.setattr(cost_model, "load_runs", lambda: [])
    monkeypatch.setattr(cost_model, "render", lambda inp, runs, receipts=None: {"box": "| new | row |\n| two |", "h200": "| same |"})
    assert cost_model.main(["--write", "--doc", str(doc)]) == 0
    out = capsys.readouterr().out
    assert f"{doc}: wrote the cost-model tables" in out
    assert "table box: rewritten, 2 line(s) new, 1 line(s) gone (2 lines now)" in out
    assert "table h200: unchanged (1 lines)" in out
    assert "| two |" in doc.read_text()
    mtime = doc.stat().st_mtime_ns
    assert cost_model.main(["--write", "--doc", str(doc)]) == 0
    assert "up to date, nothing written" in capsys.readouterr().out and doc.stat().st_mtime_ns == mtime
    monkeypatch.setattr(cost_model, "render", lambda inp, runs, receipts=None: {"box": "| newer |", "h200": "| same |"})
    assert cost_model.main(["--check", "--doc", str(doc)]) == 1
    assert "out of date" in capsys.readouterr().out


def test_make_docs_draws_the_model_tables_it_wrote(tmp_path, capsys):
    """--write draws the tok/s ranges of the box and settings tables (as the document prints them) beside the
    document; the trees, which the model does not rate, are left out of the plot (issue 23 item 10)."""
    doc = tmp_path / "plan.md"
    doc.write_text(cost_model.DOC.read_text())
    assert cost_model.main(["--write", "--doc", str(doc)]) == 0
    assert "plot cost-model.png: drawn" in capsys.readouterr().out
    assert (tmp_path / "cost-model.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    settings = cost_model._ranges(cost_model.block(doc.read_text(), "settings"), "tok/s (model)")
    assert [r[0].split(" ")[0] for r in settings] == ["1/1/2", "2/1/3", "3/1/4", "4/1/5", "5/1/6"]
    assert all(0 < lo <= hi for _, lo, hi in settings)
    box = cost_model._ranges(cost_model.block(doc.read_text(), "box"), "tok/s at AL 2.0")
    assert box[0][1:] == (60.0, 60.0) and len(box) == 5
    assert "](bench/results/cost-model.png)" in cost_model.DOC.read_text()
