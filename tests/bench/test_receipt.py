"""`make report` (scripts/bench/receipt.py) and `make docs` ingesting its receipt (scripts/bench/cost_model.py):
the round trip from committed H200 results and a recorded bench_serving JSONL to the plan's box section, resuming,
a failed part, and a bad tarball."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from scripts.bench import cost_model, receipt_data
from scripts.bench.comm_report import record
from scripts.lib.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
BENCH_COMM = RESULTS / "bench-comm_H200_x2_sglang1.json"
TEST_GPU = RESULTS / "test-gpu_H200_x2_20261130-run4.json"
BENCH_JSONL = ROOT / "tests" / "fixtures" / "bench" / "results_abba.jsonl"


def _receipt(*args, cwd=ROOT, timeout=600):
    return subprocess.run([sys.executable, "-m", "scripts.bench.receipt", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def proxy_receipt(tmp_path_factory):
    d = tmp_path_factory.mktemp("r") / "h200-proxy"
    cp = _receipt("--assemble", d, "--bench-comm", BENCH_COMM, "--test-gpu", TEST_GPU, "--bench", BENCH_JSONL,
                  "--box", "h200-proxy")
    assert cp.returncode == 0, cp.stderr[-3000:]
    return d


def test_receipt_from_committed_results_recommends_from_the_measured_numbers(proxy_receipt):
    d = proxy_receipt
    meta = json.loads((d / "receipt.json").read_text())
    assert meta["schema"] == receipt_data.SCHEMA and set(meta["parts"]) == {"test-gpu", "bench-comm", "bench"}
    recs = {r["default"].split(" (")[0]: r for r in meta["recommendations"]}
    ipc = recs["PCIe IPC all-reduce for plain TP reductions"]
    raw = json.loads(BENCH_COMM.read_text())
    want = record(raw, kind="allreduce", impl="sglang_tp_default", rows=4, mode="graph")["us_per_call"]
    assert ipc["verdict"] == "keep" and ipc["measured"]["pcie_ipc_us"] == round(want, 2)
    assert "0.9" in ipc["threshold"]  # the threshold it used is in the receipt
    # the recorded bench JSONL's patched variant ran eager verifies: no verdict on speculation from it
    assert recs["EAGLE-3 in the shipped profile"]["verdict"] == "inconclusive"
    assert recs["NCCL defaults on PCIe-only boxes"]["verdict"] == "inconclusive"  # the run had one variant
    summary = (d / "summary.md").read_text()
    assert "| sglang_tp_default | 2.7 |" in summary and "world 2: 6 passed, 0 failed" in summary
    assert (d / "plots" / "per_call.png").stat().st_size > 1000 and (d / "plots" / "bench.png").is_file()
    with tarfile.open(d.with_name("h200-proxy.tar.gz")) as tar:
        assert "h200-proxy/raw/bench-comm.json" in tar.getnames()


def test_make_docs_ingests_the_receipt_tarball(proxy_receipt, tmp_path):
    tarball = proxy_receipt.with_name("h200-proxy.tar.gz")
    doc = tmp_path / "plan.md"
    shutil.copyfile(ROOT / "eagle-fast-verify.md", doc)
    assert cost_model.main(["--check", "--doc", str(doc), "--receipt", str(tarball)]) == 1  # not yet in the doc
    assert cost_model.main(["--write", "--doc", str(doc), "--receipt", str(tarball)]) == 0
    text = doc.read_text()
    box = text.split("<!-- cost-model:box-measured -->")[1].split("<!-- /cost-model:box-measured -->")[0]
    assert "Receipt `h200-proxy.tar.gz` (box h200-proxy" in box
    assert "| tp.all_reduce -> PCIe IPC (SGLang) | 3.3 |" in box  # the box's own per-call latency, refitted
    assert "| PCIe IPC all-reduce for plain TP reductions (patch distributed-*) | keep |" in box
    assert cost_model.main(["--check", "--doc", str(doc), "--receipt", str(tarball)]) == 0
    # the committed plan without receipts says how to make one
    assert "No box receipt ingested yet: run `make report`" in (ROOT / "eagle-fast-verify.md").read_text()


def test_make_docs_reads_the_stored_verdicts_not_todays_thresholds(proxy_receipt, tmp_path, monkeypatch):
    """A receipt's verdicts are computed once, when it is written: a later change of THRESHOLDS moves neither the
    plan's box section nor what the receipt stored; a receipt without stored verdicts is named with the fix."""
    meta = json.loads((proxy_receipt / "receipt.json").read_text())
    assert meta["thresholds"] == receipt_data.THRESHOLDS
    monkeypatch.setitem(receipt_data.THRESHOLDS, "pcie_ipc_max_ratio", 0.01)  # today: PCIe IPC would be "change"
    doc = tmp_path / "plan.md"
    shutil.copyfile(ROOT / "eagle-fast-verify.md", doc)
    assert cost_model.main(["--write", "--doc", str(doc), "--receipt", str(proxy_receipt)]) == 0
    assert "| PCIe IPC all-reduce for plain TP reductions (patch distributed-*) | keep |" in doc.read_text()
    bare = tmp_path / "bare"
    shutil.copytree(proxy_receipt, bare)
    (bare / "receipt.json").write_text(json.dumps({k: v for k, v in meta.items() if k != "recommendations"}))
    with pytest.raises(UserError, match=r"holds no recommendations: python -m scripts.bench.receipt --summarize"):
        cost_model.main(["--check", "--doc", str(doc), "--receipt", str(bare)])


def test_report_resumes_and_records_a_failed_part(tmp_path):
    d = tmp_path / "box"
    cp = _receipt("--dir", d, "--parts", "doctor,test-gpu", "--box", "cpu-ci")
    # doctor ran (no GPU here: error findings, recorded); test-gpu failed (no GPU, no docker) and left no file
    assert cp.returncode == 1, cp.stderr[-2000:]
    meta = json.loads((d / "receipt.json").read_text())
    doc = json.loads((d / "raw" / "doctor.json").read_text())
    assert meta["parts"]["doctor"]["ok"] and doc["findings"]
    # the doctor's NCCL probe really ran here: no GPU, so "not measured" and why, in the receipt's environment too
    transport = next(f for f in doc["findings"] if f["id"] == "nccl.transport")
    assert transport["severity"] == "info" and "not measured: here, torch" in transport["message"]
    assert "CUDA GPU(s), and the all-reduce needs 2" in transport["message"]
    assert meta["environment"]["nccl_transport"]["measured"] is False
    assert not meta["parts"]["test-gpu"]["ok"] and "failed (exit 2)" in meta["parts"]["test-gpu"]["status"]
    assert not (d / "raw" / "test-gpu.json").exists() and (d / "logs" / "test-gpu.log").stat().st_size
    assert "about" in cp.stderr and "[2/2] test-gpu" in cp.stderr  # plan with an estimate, progress
    again = _receipt("--dir", d, "--parts", "doctor,test-gpu", "--dry-run")
    assert "skip " in again.stdout and "doctor (have it, skipped)" in again.stderr
    assert "run  " in again.stdout.split("skip")[1] or "test-gpu (run)" in again.stderr


def test_the_receipt_carries_nccls_transport_from_the_doctor(tmp_path, capsys):
    """A doctor run whose NCCL probe found SHM between the cross-socket GPUs (recorded output, pcie8x-cns): the
    receipt's environment says which transport NCCL used per connection, and the summary names the pairs."""
    from scripts.host import doctor

    cap = tmp_path / "cap"
    cap.mkdir()
    for box in ("pcie8x", "pcie8x-cns"):
        for f in (ROOT / "tests" / "fixtures" / "doctor" / box).iterdir():
            shutil.copyfile(f, cap / f.name)
    assert doctor.main(["--replay", str(cap), "--json"]) == 1
    out = capsys.readouterr().out
    (tmp_path / "doctor.json").write_text(out[out.index("{"):])
    d = tmp_path / "box"
    cp = _receipt("--assemble", d, "--doctor", tmp_path / "doctor.json", "--box", "pcie8x-cns")
    assert cp.returncode == 0, cp.stderr[-2000:]
    env = json.loads((d / "receipt.json").read_text())["environment"]
    assert env["nccl_transport"] == {"measured": True, "world": 8, "allreduce_us": 118.3, "sum_ok": True,
                                     "links": {"P2P": 12, "SHM": 4}, "nccl": "2.29.7+cuda13.0"}
    summary = (d / "summary.md").read_text()
    assert "- nccl.transport: NCCL 2.29.7+cuda13.0 does not use P2P" in summary and "GPU7->GPU0 SHM" in summary


def test_report_starts_with_test_serve_and_stops_there_when_it_fails(tmp_path):
    """No GPU here: test-serve fails, so doctor (and any part that would load Kimi-K2.5) is not run, and the
    receipt says why; a failed test-serve counts as not done, so the next report runs it again."""
    d = tmp_path / "box"
    cp = _receipt("--dir", d, "--parts", ",".join(receipt_data.PARTS[:2]), "--box", "cpu-ci")
    assert receipt_data.PARTS[:2] == ("test-serve", "doctor")
    assert cp.returncode == 1 and "[1/2] test-serve" in cp.stderr and "[2/2]" not in cp.stderr, cp.stderr[-2000:]
    assert "stopping: test-serve failed (" in cp.stderr and "no NVIDIA GPU visible here" in cp.stderr
    meta = json.loads((d / "receipt.json").read_text())
    assert not meta["parts"]["test-serve"]["ok"] and meta["parts"]["doctor"] == {
        "status": "not run: test-serve failed", "ok": False}
    assert not (d / "raw" / "doctor.json").exists()
    (d / "raw" / "test-serve.json").write_text(json.dumps({"world": 8, "passed": 60, "failed": 1, "checks": []}))
    again = _receipt("--dir", d, "--parts", "test-serve", "--dry-run")
    assert "test-serve (run)" in again.stderr and again.stdout.startswith("run  ")
    assert "scripts.host.serve_tier --out " + str(d / "raw" / "test-serve.json") in again.stdout


def test_a_bad_receipt_is_named(tmp_path):
    bad = tmp_path / "r.tar.gz"
    bad.write_bytes(b"not a tarball")
    with pytest.raises(UserError, match="not a readable receipt tarball"):
        receipt_data.open_receipt(bad)
    with pytest.raises(UserError, match="has no receipt.json"):
        receipt_data.open_receipt(tmp_path)
    cp = _receipt("--parts", "doctor,nonsense", "--dir", tmp_path / "x")
    assert cp.returncode == 2 and "unknown part(s) nonsense" in cp.stderr


def test_the_nccl_release_axis_recommends_the_faster_release():
    """bench-comm from a second image (make image NCCL=<v>): a release faster at both widths is recommended with
    the command that builds it; one that is not leaves the pin as it is."""
    mine = json.loads(BENCH_COMM.read_text())
    assert receipt_data.rec_nccl_release(mine, {})["verdict"] == "inconclusive"
    faster = json.loads(BENCH_COMM.read_text())
    faster["meta"]["nccl"] = {"loaded": "2.29.7"}
    for r in faster["records"]:
        if r.get("kind") == "allreduce" and r.get("impl") == "nccl":
            r["us_per_call"] *= 0.9
    rec = receipt_data.rec_nccl_release(mine, {"sglang:nccl2.29.7": faster})
    assert rec["verdict"] == "change" and rec["setting"].startswith("make image NCCL=2.29.7")
    assert receipt_data.rec_nccl_release(faster, {"other": mine})["verdict"] == "keep"
    assert receipt_data.alt_part_file("eagle/sglang:v9.9.9-nccl2.29.7") == \
        "raw/bench-comm@eagle_sglang_v9.9.9-nccl2.29.7.json"
