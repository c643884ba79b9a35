"""`make report` (scripts/bench/receipt.py) and `make docs` ingesting its receipt (scripts/bench/cost_model.py):
the round trip from committed H200 results and a recorded bench_serving JSONL to the plan's box section, resuming,
a failed part, and a bad tarball."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

import _fake_docker
from scripts.bench import cost_model, receipt_data
from scripts.bench.comm_report import record
from scripts.lib.errors import UserError
from scripts.series.pin import load_pin

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
BENCH_COMM = RESULTS / "bench-comm_H200_x2_sglang1.json"
TEST_GPU = RESULTS / "test-gpu_H200_x2_20261130-run4.json"
BENCH_JSONL = ROOT / "tests" / "fixtures" / "bench" / "results_abba.jsonl"


def _receipt(*args, cwd=ROOT, timeout=900, env=None):
    return subprocess.run([sys.executable, "-m", "scripts.bench.receipt", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout, env=env)


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
    # measured on 2 H200 with NVLink: the numbers are kept, the verdict on the PCIe-only TP8 default is not given
    assert ipc["verdict"] == "inconclusive" and ipc["measured"]["pcie_ipc_us"] == round(want, 2)
    assert ipc["why"].startswith("measured on 2x NVIDIA H200, NVLink (2 GPU(s), the profile serves TP8; its GPUs "
                                 "have NVLink"), ipc["why"]
    assert "0.9" in ipc["threshold"]  # the threshold it used is in the receipt
    # the recorded bench JSONL's patched variant ran eager verifies: no verdict on speculation from it
    assert recs["EAGLE-3 in the shipped profile"]["verdict"] == "inconclusive"
    assert recs["NCCL defaults on PCIe-only boxes"]["verdict"] == "inconclusive"  # the run had one variant
    summary = (d / "summary.md").read_text()
    assert "Measured on 2x NVIDIA H200, NVLink: a proxy, not the box (2 GPU(s), the profile serves TP8" in summary
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
    assert box.lstrip().startswith("**A proxy, not the box** (2 GPU(s), the profile serves TP8; its GPUs have NVLink")
    assert "Receipt `h200-proxy.tar.gz` (box h200-proxy: 2x NVIDIA H200, NVLink;" in box
    assert "| tp.all_reduce -> PCIe IPC (SGLang) | 3.3 |" in box  # the proxy's per-call latency, refitted
    assert "| PCIe IPC all-reduce for plain TP reductions (patch distributed-*) | inconclusive |" in box
    assert cost_model.main(["--check", "--doc", str(doc), "--receipt", str(tarball)]) == 0
    # the committed plan without receipts says how to make one
    assert "No box receipt ingested yet: run `make report`" in (ROOT / "eagle-fast-verify.md").read_text()


@pytest.fixture(scope="module")
def pcie_receipt(tmp_path_factory):
    """The committed H200 numbers as if measured on 8 GPUs without NVLink (the box class the series is for)."""
    tmp_path = tmp_path_factory.mktemp("pcie")
    bc = json.loads(BENCH_COMM.read_text())
    bc["meta"].update(world=8, gpu_name="NVIDIA RTX PRO 6000 Blackwell Server Edition",
                      topo_m=bc["meta"]["topo_m"].replace("NV18", "SYS"))
    (tmp_path / "bc.json").write_text(json.dumps(bc))
    d = tmp_path / "box"
    cp = _receipt("--assemble", d, "--bench-comm", tmp_path / "bc.json", "--box", "box")
    assert cp.returncode == 0, cp.stderr[-3000:]
    return d


def test_a_pcie_only_tp8_receipt_gets_verdicts_and_no_proxy_mark(pcie_receipt):
    """Measured on the box class the series is for, the same numbers are judged (issue 23 item 5)."""
    d = pcie_receipt
    meta = json.loads((d / "receipt.json").read_text())
    recs = {r["default"].split(" (")[0]: r for r in meta["recommendations"]}
    assert recs["PCIe IPC all-reduce for plain TP reductions"]["verdict"] == "keep"
    assert "Measured on 8x NVIDIA RTX PRO 6000 Blackwell Server Edition, PCIe only." in (d / "summary.md").read_text()
    fusion = [r for r in meta["recommendations"] if r["default"].startswith("FlashInfer")][0]
    assert fusion["default"].startswith("FlashInfer all-reduce + RMSNorm fusion at TP8")


def test_make_docs_reads_the_stored_verdicts_not_todays_thresholds(pcie_receipt, tmp_path, monkeypatch, capsys):
    """A receipt's verdicts are computed once, when it is written: a later change of THRESHOLDS moves neither the
    plan's box section nor what the receipt stored; a receipt without stored verdicts is named with the fix. (A
    PCIe-only TP8 receipt: its PCIe IPC verdict is a judgement, a proxy's is inconclusive whatever the threshold.)"""
    meta = json.loads((pcie_receipt / "receipt.json").read_text())
    assert meta["thresholds"] == receipt_data.THRESHOLDS
    monkeypatch.setitem(receipt_data.THRESHOLDS, "pcie_ipc_max_ratio", 0.01)  # today: PCIe IPC would be "change"
    doc = tmp_path / "plan.md"
    shutil.copyfile(ROOT / "eagle-fast-verify.md", doc)
    assert cost_model.main(["--write", "--doc", str(doc), "--receipt", str(pcie_receipt)]) == 0
    assert "| PCIe IPC all-reduce for plain TP reductions (patch distributed-*) | keep |" in doc.read_text()
    bare = tmp_path / "bare"
    shutil.copytree(pcie_receipt, bare)
    (bare / "receipt.json").write_text(json.dumps({k: v for k, v in meta.items() if k != "recommendations"}))
    capsys.readouterr()
    cost_model.main(["--check", "--doc", str(doc), "--receipt", str(bare)])  # skipped, named, the rest goes on
    assert "skipping receipt bare: receipt.json holds no recommendations: python -m scripts.bench.receipt " \
           "--summarize" in capsys.readouterr().err


def test_report_checks_every_part_first_and_writes_nothing_when_one_cannot_run(tmp_path):
    """No GPU and no docker here: every part's own check (test-serve's GPUs, test-gpu's and bench-comm's route,
    bench's engine)
    fails before anything runs; the report names each with its fix and writes nothing - the dry run alike
    (issue 23 item 2)."""
    d = tmp_path / "box"
    env = {**os.environ, "PATH": _fake_docker.path_with()}
    for extra in ([], ["--dry-run"]):
        cp = _receipt("--dir", d, "--box", "cpu-ci", *extra, env=env)
        assert cp.returncode == 2, cp.stderr[-3000:]
        out = cp.stdout + cp.stderr
        assert "make report cannot start: 4 part(s) cannot run here; nothing was run or written." in out
        assert "test-serve: no NVIDIA GPU visible here" in out and "test-gpu: test-gpu cannot run here (" in out and "bench-comm: bench-comm cannot run here (" in out
        assert "bench: make bench cannot start: the docker engine is missing here" in out
        assert "docker run --rm --gpus all" in out  # the image route's command, with its fix
        assert not d.exists() and not d.with_name("box.tar.gz").exists() and "Traceback" not in out


def test_report_with_nothing_measured_writes_no_tarball_and_reruns_the_doctor(tmp_path):
    """Only the doctor ran: the receipt directory says so, but there is no tarball to attach, and make docs skips
    that receipt, naming why; the doctor runs again on the next report (its findings are about the box now)."""
    d = tmp_path / "box"
    cp = _receipt("--dir", d, "--parts", "doctor", "--box", "cpu-ci")
    assert cp.returncode == 1, cp.stderr[-2000:]
    assert "no part measured anything" in cp.stderr and "attach .tar.gz" not in cp.stderr and ".tar.gz" not in cp.stderr
    assert (d / "receipt.json").is_file() and not d.with_name("box.tar.gz").exists()
    meta = json.loads((d / "receipt.json").read_text())
    doctor_doc = json.loads((d / "raw" / "doctor.json").read_text())
    # the doctor's NCCL probe really ran here: no GPU, so "not measured" and why, in the receipt's environment too
    transport = next(f for f in doctor_doc["findings"] if f["id"] == "nccl.transport")
    assert transport["severity"] == "info" and "not measured: here, torch" in transport["message"]
    assert "CUDA GPU(s), and the all-reduce needs 2" in transport["message"]
    assert meta["environment"]["nccl_transport"]["measured"] is False
    again = _receipt("--dir", d, "--parts", "doctor", "--box", "cpu-ci", "--dry-run")
    assert again.returncode == 0 and "doctor (run, every time)" in again.stderr, again.stderr
    doc = tmp_path / "plan.md"
    shutil.copyfile(ROOT / "eagle-fast-verify.md", doc)
    docs = subprocess.run([sys.executable, "-m", "scripts.bench.cost_model", "--write", "--doc", doc, "--receipt",
                           d], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert docs.returncode == 0, docs.stderr
    assert "skipping receipt box: no part measured anything (doctor: done" in docs.stderr
    assert "No box receipt ingested yet" in doc.read_text()


def test_make_docs_names_a_damaged_receipt_and_reads_the_others(proxy_receipt, tmp_path):
    """A receipt.json that is not JSON, a bench-comm.json of the wrong shape: one line each, naming the tarball and
    the file in it; the good receipt is still ingested (issue 23 item 10)."""
    def damaged(name: str, rel: str, text: str) -> Path:
        d = tmp_path / name
        shutil.copytree(proxy_receipt, d)
        (d / rel).write_text(text)
        with tarfile.open(tmp_path / f"{name}.tar.gz", "w:gz") as tar:
            tar.add(d, arcname=name)
        return tmp_path / f"{name}.tar.gz"

    bad_json = damaged("notjson", "receipt.json", "not json")
    bad_shape = damaged("shape", "raw/bench-comm.json", json.dumps({"meta": {}, "records": "x"}))
    doc = tmp_path / "plan.md"
    shutil.copyfile(ROOT / "eagle-fast-verify.md", doc)
    good = proxy_receipt.with_name("h200-proxy.tar.gz")
    cp = subprocess.run([sys.executable, "-m", "scripts.bench.cost_model", "--write", "--doc", doc,
                         *[x for r in (bad_json, good, bad_shape) for x in ("--receipt", r)]], cwd=ROOT,
                        capture_output=True, text=True, timeout=300)
    assert cp.returncode == 0, cp.stderr
    assert "skipping receipt notjson.tar.gz: receipt.json is not JSON (" in cp.stderr
    assert "skipping receipt shape.tar.gz: raw/bench-comm.json is not what its part writes (records" in cp.stderr
    assert "Traceback" not in cp.stderr and "/tmp" not in cp.stderr.split("skipping", 1)[1]
    assert "Receipt `h200-proxy.tar.gz`" in doc.read_text()


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
    """test-serve's check passes (GPUs listed, the image there: a fake nvidia-smi and a fake docker), but the run
    fails (the image sees no GPU): doctor (and any part that would load Kimi-K2.5) is not run, and the receipt says
    why; a failed test-serve counts as not done, so the next report runs it again."""
    docker = _fake_docker.install(tmp_path, images=(load_pin().serving_image,))
    smi = tmp_path / "smi"
    smi.mkdir()
    (smi / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: NVIDIA RTX PRO 6000 Blackwell Server Edition (UUID: G0)'\n")
    (smi / "nvidia-smi").chmod(0o755)
    env = {**os.environ, "PATH": _fake_docker.path_with(docker.bindir, smi)}
    d = tmp_path / "box"
    cp = _receipt("--dir", d, "--parts", ",".join(receipt_data.PARTS[:2]), "--box", "cpu-ci", env=env)
    assert receipt_data.PARTS[:2] == ("test-serve", "doctor")
    assert cp.returncode == 1 and "[1/2] test-serve" in cp.stderr and "[2/2]" not in cp.stderr, cp.stderr[-2000:]
    assert "stopping: test-serve failed (" in cp.stderr and "no NVIDIA GPU visible here" in cp.stderr
    meta = json.loads((d / "receipt.json").read_text())
    assert not meta["parts"]["test-serve"]["ok"] and meta["parts"]["doctor"] == {
        "status": "not run: test-serve failed", "ok": False}
    assert not (d / "raw" / "doctor.json").exists() and not d.with_name("box.tar.gz").exists()
    (d / "raw" / "test-serve.json").write_text(json.dumps({"world": 8, "passed": 60, "failed": 1, "checks": []}))
    again = _receipt("--dir", d, "--parts", "test-serve", "--dry-run", env=env)
    assert "test-serve (run)" in again.stderr and again.stdout.startswith("run  "), again.stderr[-2000:]
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
    cp = _receipt("--redo", "foo", "--dir", tmp_path / "x")  # was accepted silently
    assert cp.returncode == 2 and "unknown --redo part(s) foo: choose from test-serve, doctor" in cp.stderr
    assert not (tmp_path / "x").exists()


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


def test_the_tarball_to_attach_leaves_out_what_names_the_machine(tmp_path):
    """The receipt directory keeps every raw output; its tarball keeps what the recommendations and make docs read,
    without the host name, this checkout's and the home directory's paths, GPU serials, the kernel command line
    (its IOMMU parameters are in the doctor's facts) or df (issue 23 item 8)."""
    import platform

    d, capture = tmp_path / "box_1", ROOT / "tests" / "fixtures" / "doctor" / "pcie8x"  # what --record writes
    shutil.copytree(capture, d / "env" / "tools")
    doctor = tmp_path / "doctor.json"
    with open(doctor, "w") as out:
        cp = subprocess.run([sys.executable, "-m", "scripts.host.doctor", "--json", "--replay", capture], cwd=ROOT,
                            stdout=out, stderr=subprocess.PIPE, text=True, timeout=300)
    assert cp.returncode in (0, 1), cp.stderr
    bc = json.loads(BENCH_COMM.read_text())
    bc["meta"].update(host=platform.node(), command=f"{sys.executable} -m scripts.bench.bench_comm --out "
                                                   f"{ROOT}/bench/results/x.json ({Path.home()}/.cache)")
    (tmp_path / "bc.json").write_text(json.dumps(bc))
    cp = _receipt("--assemble", d, "--doctor", doctor, "--bench-comm", tmp_path / "bc.json", "--box", "box")
    assert cp.returncode == 0, cp.stderr[-3000:]
    assert (d / "env" / "tools" / "proc-cmdline").is_file() and (d / "env" / "tools" / "nvidia-smi-q.xml").is_file()
    assert "stay in" in cp.stderr
    with tarfile.open(d.with_name("box_1.tar.gz")) as tar:
        names = tar.getnames()
        texts = {n: tar.extractfile(n).read().decode("utf-8", "replace") for n in names if not n.endswith(".png")}
    tools = {Path(n).name for n in names if "/env/tools/" in n}
    assert tools and "topo-m.txt" in tools and "query-gpu.csv" in tools
    assert not tools & {"proc-cmdline", "nvidia-smi-q.xml", "df.txt", "sglang-path", "model-present"}
    for n, text in texts.items():
        for private in (str(ROOT), str(Path.home()), platform.node()):
            assert not re.search(rf"(?<![\w.-]){re.escape(private)}(?![\w-])", text), (n, private)
    shared = json.loads(texts["box_1/raw/doctor.json"])
    assert shared["facts"]["cmdline_iommu"] == ["iommu=off", "pcie_port_pm=off"]  # what the checks read
    receipt = json.loads(texts["box_1/receipt.json"])
    assert "host" not in receipt["environment"] and receipt["recommendations"]
    assert "<repo>/bench/results/x.json" in texts["box_1/raw/bench-comm.json"]
    doc = tmp_path / "plan.md"  # make docs still reads it
    shutil.copyfile(ROOT / "eagle-fast-verify.md", doc)
    assert cost_model.main(["--write", "--doc", str(doc), "--receipt", str(d.with_name("box_1.tar.gz"))]) == 0
    assert "Receipt `box_1.tar.gz` (box box" in doc.read_text()


def test_the_default_receipt_resumes_this_boxs_newest_unfinished_one(tmp_path):
    """After midnight the same box goes on with yesterday's unfinished receipt; a finished one starts a new one
    (issue 23 item 3). The default box name is its GPUs, never the host name."""
    from scripts.bench import receipt

    parts = ["doctor", "bench"]
    old = tmp_path / "RTX-x8_20261201"
    old.mkdir()
    (old / "receipt.json").write_text(json.dumps({"parts": {"doctor": {"ok": True}, "bench": {"ok": False}}}))
    (tmp_path / "other-box_20261202").mkdir()
    assert receipt.default_dir("RTX-x8", parts, tmp_path) == old
    (old / "receipt.json").write_text(json.dumps({"parts": {"doctor": {"ok": True}, "bench": {"ok": True}}}))
    new = receipt.default_dir("RTX-x8", parts, tmp_path)
    assert new != old and new.name.startswith("RTX-x8_") and not new.exists()
    import platform
    assert platform.node() not in receipt.default_box()


def test_a_receipt_without_measurements_says_so_instead_of_placeholders(tmp_path):
    """No bench-comm, no make bench: each verdict says what is missing; no "TP?", "at None", or an image tag ending
    in "@" without a digest (issue 23 item 10)."""
    doctor = tmp_path / "doctor.json"
    with open(doctor, "w") as out:
        subprocess.run([sys.executable, "-m", "scripts.host.doctor", "--json", "--replay",
                        ROOT / "tests" / "fixtures" / "doctor" / "pcie8x"], cwd=ROOT, stdout=out, timeout=300)
    d = tmp_path / "r"
    cp = _receipt("--assemble", d, "--doctor", doctor, "--box", "box")
    assert cp.returncode == 0, cp.stderr[-3000:]
    meta = json.loads((d / "receipt.json").read_text())
    text = json.dumps(meta) + (d / "summary.md").read_text()
    for placeholder in ("TP?", "at None", "@\"", "one NCCL measured"):
        assert placeholder not in text, placeholder
    whys = {r["default"].split(" (")[0]: r["why"] for r in meta["recommendations"]}
    assert whys["EAGLE-3 in the shipped profile"] == "no make bench results in the receipt"
    assert whys["NCCL release the image runs"].startswith("no NCCL measured (no bench-comm in the receipt)")
    assert any(k.startswith("FlashInfer all-reduce + RMSNorm fusion at the TP measured (TP unknown") for k in
               [r["default"] for r in meta["recommendations"]])


def test_plots_read_plainly_and_name_what_they_measured(proxy_receipt, monkeypatch):
    """Log axes with plain numbers (not 3x10^1), legends beside the data, "no data" on an empty panel, and titles
    naming the GPUs they measured (issue 23 item 10)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from scripts.bench import comm_report

    monkeypatch.setattr(plt, "close", lambda fig=None: None)  # keep the figures the real code draws
    data = receipt_data.load(proxy_receipt)
    plt.close("all")
    receipt_data.plots(data, proxy_receipt / "plots")
    per_call = next(f for f in map(plt.figure, plt.get_fignums()) if "Per-call" in f.axes[0].get_title())
    ax = per_call.axes[0]
    assert ax.get_title() == "Per-call reduction latency, 2x NVIDIA H200, NVLink"
    per_call.canvas.draw()
    labels = [t.get_text() for t in ax.yaxis.get_ticklabels() if t.get_text()]
    assert labels and not any("times" in t or "^" in t or "10^" in t for t in labels), labels
    legend = ax.get_legend().get_window_extent()
    assert legend.x0 >= ax.get_window_extent().x1  # beside the axes, over no point
    empty = plt.figure().add_subplot()
    comm_report.finish_axes(empty, False)
    assert [t.get_text() for t in empty.texts] == ["no data in this result"]
