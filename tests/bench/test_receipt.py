"""`make report` (scripts/report/receipt.py) and `make docs` ingesting its receipt (scripts/report/cost_model.py): the
round trip from committed H200 results to the plan's box section, the plan and checks before anything runs,
resuming, a failed part, the tarball that leaves the box, and a bad receipt."""

import json
import platform
import re
import shutil
import signal
import sys
import tarfile
from pathlib import Path

import pytest

import _fake_docker
from scripts.report import cost_model, receipt, receipt_data
from scripts.lib.errors import UserError
from scripts.series.pin import load_pin

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
BENCH_COMM = RESULTS / "bench-comm_H200_x2_sglang1.json"
BENCH_JSONL = ROOT / "tests" / "fixtures" / "bench" / "results_abba.jsonl"
DOCTOR_CAPTURE = ROOT / "tests" / "fixtures" / "doctor" / "pcie8x"


def _receipt(*args, env=None):
    return _fake_docker.verb("scripts.report.receipt", *args, **(env or {}))


def junit(path: Path, passed: int, failed: int = 0, **properties) -> Path:
    """A test tier's result as pytest writes it (its junitxml), with the suite properties the tier adds."""
    cases = [f'<testcase classname="t" name="ok{i}"/>' for i in range(passed)]
    cases += [f'<testcase classname="t" name="bad{i}"><failure message="boom {i}"/></testcase>' for i in range(failed)]
    props = "".join(f"<property name={json.dumps(k)} value='{json.dumps(v)}'/>" for k, v in properties.items())
    path.write_text(f"<testsuites><testsuite><properties>{props}</properties>{''.join(cases)}</testsuite></testsuites>")
    return path


def made_receipt(d: Path, box: str, **raw: Path) -> Path:
    """A receipt of results made separately: raw/ by hand, then --summarize derives the rest."""
    (d / "raw" / "bench").mkdir(parents=True)
    for part, src in raw.items():
        dest = {"bench": f"raw/bench/{src.name}"}.get(part, f"raw/{part.replace('_', '-')}{src.suffix}")
        shutil.copyfile(src, d / dest)
    (d / "receipt.json").write_text(
        json.dumps({"parts": {p.replace("_", "-"): {"ok": True} for p in raw}, "environment": {"box": box}})
    )
    cp = _receipt("--summarize", d)
    assert cp.returncode == 0, cp.stderr[-3000:]
    return d


def ipc_verdict(d: Path) -> dict:
    recs = json.loads((d / "receipt.json").read_text())["recommendations"]
    return next(r for r in recs if r["default"].startswith("PCIe IPC all-reduce for plain TP reductions"))


def pcie_bench_comm(tmp: Path) -> Path:
    """The committed H200 bench-comm as if measured on 8 GPUs without NVLink (the box class the series is for)."""
    bc = json.loads(BENCH_COMM.read_text())
    topo = bc["meta"]["topo_m"].replace("NV18", "SYS")
    bc["meta"].update(world=8, gpu_name="NVIDIA RTX PRO 6000 Blackwell Server Edition", topo_m=topo)
    (tmp / "bench_comm.json").write_text(json.dumps(bc))
    return tmp / "bench_comm.json"


def _plan_md(tmp_path: Path) -> Path:
    doc = tmp_path / "plan.md"
    shutil.copyfile(ROOT / "eagle-fast-verify.md", doc)
    return doc


@pytest.fixture(scope="module")
def proxy_receipt(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("r")
    test_gpu = junit(tmp / "test-gpu.xml", 6, world=2, gpus=["NVIDIA H200"] * 2)
    return made_receipt(tmp / "h200-proxy", "h200-proxy", bench_comm=BENCH_COMM, test_gpu=test_gpu, bench=BENCH_JSONL)


def test_a_receipt_of_committed_results_recommends_from_the_measured_numbers(proxy_receipt, tmp_path):
    d = proxy_receipt
    meta = json.loads((d / "receipt.json").read_text())
    assert meta["schema"] == receipt_data.SCHEMA and set(meta["parts"]) == {"test-gpu", "bench-comm", "bench"}
    recs, ipc = {r["default"].split(" (")[0]: r for r in meta["recommendations"]}, ipc_verdict(d)
    # measured per size and backend on 2 H200 with NVLink: the numbers are kept, no verdict on the PCIe-only default
    assert ipc["measured"]["ratio_by_rows"]["4"][1] == "flashinfer" and "0.9" in ipc["threshold"]
    assert ipc["verdict"] == "inconclusive" and ipc["why"].startswith(
        "measured on 2x NVIDIA H200, NVLink (2 GPU(s), the profile serves TP8; its GPUs have NVLink"
    )
    assert recs["EAGLE-3 in the shipped profile"]["verdict"] == "inconclusive"  # the patched run verified eagerly
    summary = (d / "summary.md").read_text()
    assert "Measured on 2x NVIDIA H200, NVLink: a proxy, not the box" in summary
    assert "| default | sglang_tp_default | 1 | 2.7 |" in summary and "world 2: 6 passed, 0 failed" in summary
    assert (d / "plots" / "bench-comm.png").stat().st_size > 1000 and (d / "plots" / "bench.png").is_file()
    tarball = d.with_name("h200-proxy.tar.gz")
    doc = _plan_md(tmp_path)
    assert cost_model.main(["--write", "--doc", str(doc), "--receipt", str(tarball)]) == 0  # make docs reads it
    box = doc.read_text().split("<!-- cost-model:box-measured -->")[1]
    assert box.lstrip().startswith("**A proxy, not the box** (2 GPU(s), the profile serves TP8")
    assert "| tp.all_reduce -> PCIe IPC (SGLang) | 3.3 |" in box
    assert cost_model.main(["--check", "--doc", str(doc), "--receipt", str(tarball)]) == 0


@pytest.fixture(scope="module")
def pcie_receipt(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pcie")
    return made_receipt(tmp / "box", "box", bench_comm=pcie_bench_comm(tmp))


def test_on_the_box_class_the_verdicts_are_judged_and_stored(pcie_receipt, tmp_path, monkeypatch, capsys):
    """PCIe-only TP8: the per-size numbers give a verdict (FlashInfer's route is faster at 4 rows here); make docs
    reads the verdict stored that day, not today's thresholds; a receipt without stored verdicts is named."""
    meta, ipc = json.loads((pcie_receipt / "receipt.json").read_text()), ipc_verdict(pcie_receipt)
    assert ipc["verdict"] == "change" and ipc["setting"] == "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=0"
    assert "PCIe IPC / flashinfer = 1.25 at 4 rows" in ipc["why"] and meta["thresholds"] == receipt_data.THRESHOLDS
    summary = (pcie_receipt / "summary.md").read_text()
    assert "Measured on 8x NVIDIA RTX PRO 6000 Blackwell Server Edition, PCIe only." in summary
    monkeypatch.setitem(receipt_data.THRESHOLDS, "pcie_ipc_max_ratio", 9.0)  # today it would be "keep"
    doc = _plan_md(tmp_path)
    assert cost_model.main(["--write", "--doc", str(doc), "--receipt", str(pcie_receipt)]) == 0
    assert "| PCIe IPC all-reduce for plain TP reductions (patch distributed-*) | change |" in doc.read_text()
    bare = tmp_path / "bare"
    shutil.copytree(pcie_receipt, bare)
    (bare / "receipt.json").write_text(json.dumps({k: v for k, v in meta.items() if k != "recommendations"}))
    capsys.readouterr()
    cost_model.main(["--check", "--doc", str(doc), "--receipt", str(bare)])
    said = "skipping receipt bare: receipt.json holds no recommendations: python -m scripts.report.receipt --summarize"
    assert said in capsys.readouterr().err


def test_the_dry_run_shows_the_plan_and_total_when_the_box_cannot_run_it(tmp_path):
    """No GPU and no docker engine: the plan of every part with its command and time, the total, and each failed
    check with its fix; exit 2 and nothing written, as a real run stops there; --port moves every part that serves."""
    docker = _fake_docker.install(tmp_path, engine_up=False)
    d, env = tmp_path / "box", {"PATH": _fake_docker.path_with(docker.bindir)}
    for extra in (["--dry-run"], []):
        cp = _receipt("--dir", d, "--box", "cpu-ci", "--port", "30777", *extra, env=env)
        assert cp.returncode == 2 and "Traceback" not in cp.stderr, cp.stderr[-3000:]
        out = cp.stdout + cp.stderr
        for part in ("test-serve", "doctor", "test-gpu", "bench-comm", "bench", "profile"):
            assert re.search(rf"\| {part} \| run \| ~\S+ \| `", out), part
        assert "bench: 36 run(s) in 10 server session(s) to go" in out and "total: ~" in out
        assert "FAIL docker engine: the docker engine is not running or not reachable" in out
        assert "FAIL GPUs: no NVIDIA GPU" in out and "port 30777: free" in out and "port 30000" not in out
        assert re.search(r"\| bench \|.*--port 30777", out) and re.search(r"\| profile \|.*--port 30777", out)
        assert "make report cannot start: " in out and not d.exists()


def test_only_the_doctor_writes_no_tarball_and_runs_again(tmp_path):
    d = tmp_path / "box"
    cp = _receipt("--dir", d, "--parts", "doctor", "--box", "cpu-ci")
    assert cp.returncode == 1, cp.stderr[-2000:]
    assert "no part measured anything" in cp.stderr and not d.with_name("box.tar.gz").exists()
    doctor = json.loads((d / "raw" / "doctor.json").read_text())
    assert doctor["findings"] and json.loads((d / "receipt.json").read_text())["environment"]["doctor"]
    again = _receipt("--dir", d, "--parts", "doctor", "--box", "cpu-ci", "--dry-run")
    assert again.returncode == 0 and "| doctor | run |" in again.stdout, again.stderr
    docs = _fake_docker.verb("scripts.report.cost_model", "--write", "--doc", _plan_md(tmp_path), "--receipt", d)
    assert docs.returncode == 0 and "skipping receipt box: no part measured anything (doctor: done" in docs.stderr


def test_a_failed_test_serve_stops_the_report_and_runs_again_next_time(tmp_path):
    """The checks pass (2 idle GPUs, the image, a free port), test-serve fails (the image sees no GPU): nothing after
    it runs, the receipt says why, and the next report runs test-serve again."""
    docker = _fake_docker.install(tmp_path, images=(load_pin().serving_image,), gpus=2)
    env, d = {"PATH": _fake_docker.path_with(docker.bindir)}, tmp_path / "box"
    cp = _receipt("--dir", d, "--parts", "test-serve,doctor", "--box", "cpu-ci", env=env)
    assert cp.returncode == 1 and "[1/2] test-serve" in cp.stderr and "[2/2]" not in cp.stderr, cp.stderr[-2000:]
    assert "stopping: test-serve failed" in cp.stderr
    meta = json.loads((d / "receipt.json").read_text())
    assert meta["parts"]["doctor"] == {"status": "not run: test-serve failed", "ok": False}
    assert meta["environment"]["image"]["id"] == _fake_docker.IMAGE_ID  # what ran, always
    junit(d / "raw" / "test-serve.xml", 60, 1, world=8)
    again = _receipt("--dir", d, "--parts", "test-serve", "--dry-run", env=env)
    assert "| test-serve | run |" in again.stdout
    assert f"--results {d / 'raw'} test-serve --serve-out /results/test-serve.xml" in again.stdout


def test_an_interrupted_report_keeps_its_parts_and_redoes_a_cut_result_alone(tmp_path):
    """test-gpu passes, then SIGTERM in bench-comm: the next plan runs bench-comm alone (and checks no port: neither
    part serves). A bench-comm killed mid-write is that part's failure, its result moved aside, redone next time."""
    passed = junit(tmp_path / "passed.xml", 1)
    cut = f'[ -e {tmp_path}/cut ] && printf \'{{"records": [\' > "$2" && exit 137; touch {tmp_path}/in; exec sleep 600'
    verbs = {"test-gpu": f'cp {passed} "$2"', "bench-comm": cut}
    docker = _fake_docker.install(tmp_path, images=(load_pin().serving_image,), verbs=verbs, gpus=2)
    env, d = {"PATH": _fake_docker.path_with(docker.bindir)}, tmp_path / "box"
    args = ["--dir", d, "--parts", "test-gpu,bench-comm", "--box", "cpu-ci"]
    p = _fake_docker.interrupted("scripts.report.receipt", *args, when=(tmp_path / "in").exists, **env)
    assert p.returncode == 128 + signal.SIGTERM and not docker.running(), p.stderr.read()[-2000:]
    plan = _receipt(*args, "--dry-run", env=env).stdout
    assert "| test-gpu | have it, skipped |" in plan and "| bench-comm | run |" in plan and "ok   port" not in plan
    (tmp_path / "cut").touch()
    cp = _receipt(*args, env=env)
    assert cp.returncode == 1 and "Traceback" not in cp.stderr, cp.stderr[-2000:]
    parts = json.loads((d / "receipt.json").read_text())["parts"]
    assert parts["test-gpu"]["status"] == "done (earlier run)" and parts["bench-comm"]["ok"] is False
    assert parts["bench-comm"]["status"].startswith("failed: raw/bench-comm.json is not JSON")
    assert (d / "raw" / "bench-comm.json.bad").is_file() and (d / "summary.md").is_file()
    assert "| bench-comm | run |" in _receipt(*args, "--dry-run", env=env).stdout


def test_unknown_parts_and_bad_receipts_are_named(tmp_path):
    bad = tmp_path / "r.tar.gz"
    bad.write_bytes(b"not a tarball")
    with pytest.raises(UserError, match="not a readable receipt tarball"):
        receipt_data.open_receipt(bad)
    with pytest.raises(UserError, match="has no receipt.json"):
        receipt_data.open_receipt(tmp_path)
    for args, said in (
        (["--parts", "doctor,nonsense"], "unknown part(s) nonsense"),
        (["--redo", "foo"], "unknown --redo part(s) foo: choose from test-serve, doctor"),
    ):
        cp = _receipt(*args, "--dir", tmp_path / "x")
        assert cp.returncode == 2 and said in cp.stderr
    assert not (tmp_path / "x").exists()


def test_the_tarball_leaves_out_what_names_the_machine(tmp_path):
    """The receipt directory keeps every raw output; its tarball has no host name, checkout or home path, GPU
    serials, kernel command line or df."""
    d = tmp_path / "box_1"
    shutil.copytree(DOCTOR_CAPTURE, d / "env" / "tools")
    doctor = tmp_path / "doctor.json"
    doctor.write_text(_fake_docker.verb("scripts.host.doctor", "--json", "--replay", DOCTOR_CAPTURE).stdout)
    bc = json.loads(BENCH_COMM.read_text())
    home, host = Path.home(), platform.node()
    bc["meta"]["command"] = f"{sys.executable} -m scripts.comm.bench_comm --out {ROOT}/x.json ({home}) on {host}"
    (tmp_path / "bc.json").write_text(json.dumps(bc))
    made_receipt(d, "box", doctor=doctor, bench_comm=tmp_path / "bc.json")
    with tarfile.open(d.with_name("box_1.tar.gz")) as tar:
        files = [m for m in tar.getmembers() if m.isfile() and not m.name.endswith(".png")]
        texts = {m.name: tar.extractfile(m).read().decode("utf-8", "replace") for m in files}
    tools = {Path(n).name for n in texts if "/env/tools/" in n}
    assert "topo-m.txt" in tools and not tools & {"proc-cmdline", "nvidia-smi-q.xml", "df.txt"}
    for n, text in texts.items():
        for private in (str(ROOT), str(Path.home()), platform.node()):
            assert not re.search(rf"(?<![\w.-]){re.escape(private)}(?![\w-])", text), (n, private)
    assert "<repo>/x.json" in texts["box_1/raw/bench-comm.json"]  # make docs reads a tarball: the proxy's test


def test_the_default_receipt_resumes_this_boxs_newest_unfinished_one(tmp_path):
    old = tmp_path / "RTX-x8_20261201"
    old.mkdir()
    (old / "receipt.json").write_text(json.dumps({"parts": {"doctor": {"ok": True}, "bench": {"ok": False}}}))
    (tmp_path / "other-box_20261202").mkdir()
    assert receipt.default_dir("RTX-x8", ["doctor", "bench"], tmp_path) == old
    (old / "receipt.json").write_text(json.dumps({"parts": {"doctor": {"ok": True}, "bench": {"ok": True}}}))
    new = receipt.default_dir("RTX-x8", ["doctor", "bench"], tmp_path)
    assert new != old and new.name.startswith("RTX-x8_") and not new.exists()


def test_the_startup_table_and_the_doctors_smoke_decide_the_pcie_ipc_verdict(tmp_path):
    """The served model's own startup timing (kept by the profile part) overrides bench-comm's row for the sizes it
    measured, and shows in summary.md; a PCIe-IPC smoke that hung in the doctor is a "change" whatever the timing."""
    size = dict(rows=4, bytes=57344, us={"pcie_ipc": 6.0, "nccl": 30.0}, backend="pcie_ipc", why="wins 5.0x")
    table = {"source": "measured", "margin": 1.2, "why": "", "sizes": [size]}
    files = {
        "profile": {"allreduce_backends": {"spec": table, "nospec": table}},
        "doctor": {"findings": [], "facts": {"pcie_ipc_smoke": {"measured": True, "hung": False, "sum_ok": True}}},
    }
    for name, doc in files.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(doc))
    raw = {"bench_comm": pcie_bench_comm(tmp_path), **{n: tmp_path / f"{n}.json" for n in files}}
    d = made_receipt(tmp_path / "box", "box", **raw)
    assert ipc_verdict(d)["verdict"] == "keep" and "PCIe IPC / flashinfer" not in ipc_verdict(d)["why"]
    assert "All-reduce backend per decode size, chosen at start (measured" in (d / "summary.md").read_text()
    files["doctor"]["facts"]["pcie_ipc_smoke"] = {"measured": False, "hung": True, "phase": "rank 3: iterate"}
    (tmp_path / "doctor.json").write_text(json.dumps(files["doctor"]))
    ipc = ipc_verdict(made_receipt(tmp_path / "hung", "box", **raw))
    assert ipc["verdict"] == "change" and "smoke hung" in ipc["why"] and ipc["setting"].endswith("=0")
