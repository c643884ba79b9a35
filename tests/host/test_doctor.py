"""The doctor (scripts/host/doctor.py, facts.py, checks.py) fed recorded outputs of the real tools
(tests/fixtures/doctor/README.md says which are captured and which written)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.host import checks, doctor
from scripts.host import facts as F
from scripts.host.nccl import MARK
from scripts.lib.cli import run as run_cli
from scripts.series.pin import load_pin

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "doctor"


def capture(name: str) -> dict[str, str]:
    rec = {} if name in ("pcie8x", "h200x2", "h200x2-live") else F.load_capture(FIX / "pcie8x")
    return rec | F.load_capture(FIX / name)


def run(rec: dict[str, str], tp: int = 8, environ: dict | None = None, expected: str | None = None, **kw):
    probe = F.Probe(rec, python="python3", hf_cache="/models")
    findings, facts = doctor.diagnose(probe, tp=tp, environ=environ or {}, expected_patchset=expected, **kw)
    return {f.id: f for f in findings}, facts


def changed(rec: dict, key: str, **kw) -> dict:
    """The recording with the result line of probe `key` changed (its other lines kept)."""
    lines = rec[key].splitlines()
    res = json.loads(lines[-1][len(MARK) :]) | kw
    return {**rec, key: "\n".join(lines[:-1] + [MARK + json.dumps(res)]) + "\n"}


def test_parsers_on_the_real_captures():
    rec = capture("h200x2")
    driver, cuda, gpus = F.parse_smi_xml(rec["smi-xml"])
    assert (driver, cuda, [g.bus_id for g in gpus]) == ("580.159.04", "13.0", ["00000000:00:06.0", "00000000:00:07.0"])
    g = gpus[0]
    assert (g.name, g.bar1_total_mib, g.fb_total_mib, g.gen_max, g.width_max) == ("NVIDIA H200", 262144, 143771, 5, 16)
    topo = F.parse_topo_m(rec["topo-m"])
    assert topo["links"] == {(0, 1): "NV18", (1, 0): "NV18"} and topo["numa"] == {0: "0", 1: "0"}
    assert F.parse_p2p(rec["topo-p2p-r"]) == F.parse_p2p(rec["topo-p2p-n"]) == {(0, 1): "OK", (1, 0): "OK"}
    assert [r["compute_cap"] for r in F.parse_query_csv(rec["smi-query"])] == ["9.0", "9.0"]
    pcie = capture("pcie8x")
    topo = F.parse_topo_m(pcie["topo-m"])
    assert (topo["links"][(0, 1)], topo["links"][(0, 2)], topo["links"][(0, 4)]) == ("PIX", "NODE", "SYS")
    assert set(F.parse_p2p(pcie["topo-p2p-n"]).values()) == {"NS"} and F.parse_df(pcie["df"])["mount"] == "/data"
    assert F.parse_p2p(capture("pcie8x-cns")["topo-p2p-r"])[(0, 4)] == "CNS"


def test_the_pcie_only_rule():
    ok, ns = {(0, 1): "OK", (1, 0): "OK"}, {(0, 1): "NS", (1, 0): "NS"}
    assert F.pcie_only(ns, [0, 1]) == (True, "") and F.pcie_only(ok, [0, 1]) == (False, "")
    assert F.pcie_only({(0, 1): "U"}, [0, 1])[0] is None and F.pcie_only(ns, [0])[0] is None
    assert F.pcie_only({(0, 1): "U", (0, 2): "OK"}, [0, 1, 2])[0] is False  # one NVLink pair decides


def test_clean_pcie_box(capsys):
    f, facts = run(capture("pcie8x"))
    assert not [k for k, x in f.items() if x.severity in ("warn", "error")]
    ids = "gpu.model gpu.count driver.cuda topo.nvlink topo.p2p topo.numa pcie.link pcie.bar1 host.hmm host.iommu "
    for key in (ids + "nccl.version nccl.transport nccl.latency pcie_ipc.smoke pcie.peer_write disk.free").split():
        assert f[key].severity == "ok", (key, f[key])
    assert "GPUs 0-3 on NUMA node 0; GPUs 4-7 on NUMA node 1" in f["topo.numa"].message
    assert "300 each of 4 and 8 rows, every sum right (4x7168 9.8 us, 8x7168 11.2 us)" in f["pcie_ipc.smoke"].message
    assert "25.9-50.1 GB/s per flow with all 8 GPUs writing at once" in f["pcie.peer_write"].message
    assert facts["pcie_only"] is True and facts["nccl"] == "2.28.3"
    transport = dict(measured=True, world=8, allreduce_us=24.6, sum_ok=True, links={"P2P": 16}, nccl="2.29.7+cuda13.0")
    assert facts["nccl_transport"] == transport
    smoke = dict(measured=True, world=8, engaged=True, sum_ok=True, wrong={}, rows=[4, 8], iters=300)
    assert facts["pcie_ipc_smoke"] == {**smoke, "us": {"4": 9.8, "8": 11.2}}
    assert facts["peer_bandwidth"]["min_gbps"] == 25.9 and len(facts["peer_bandwidth"]["rounds"]) == 7
    assert doctor.main(["--replay", str(FIX / "pcie8x"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"findings", "facts", "errors"} and out["facts"]["pcie_ipc_smoke"]["sum_ok"] is True


def test_list_is_the_checks_docstrings_and_the_table_leads_with_errors(capsys):
    assert doctor.main(["--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split()[0] for ln in lines] == [c.__name__ for c in checks.CHECKS]
    assert any(ln.startswith("pcie_ipc") and "pcie_ipc.smoke:" in ln for ln in lines)
    text = checks.table(list(run(capture("pcie8x-hmm-iommu"))[0].values()))
    assert text.splitlines()[1].startswith("error  host.hmm") and "fix: echo 'options nvidia_uvm" in text


def test_cns_pairs_hmm_and_iommu():
    f, facts = run(capture("pcie8x-cns"))
    p = f["topo.p2p"]
    assert p.severity == "warn" and "16 of 28 GPU pairs" in p.message and "CNS: chipset not supported" in p.message
    assert "GPU0-GPU4 CNS" in p.message and "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=0" in p.fix
    f, _ = run(capture("pcie8x-hmm-iommu"))
    assert f["host.hmm"].severity == "error" and "uvm_disable_hmm=1" in f["host.hmm"].fix
    assert f["host.iommu"].severity == "warn" and "142 IOMMU groups" in f["host.iommu"].message
    rec = capture("pcie8x-hmm-iommu")
    del rec["uvm-hmm"]
    assert "Addressing Mode HMM" in run(rec)[0]["host.hmm"].message


def test_a_recording_replays_and_the_exit_status_follows_errors(capsys, tmp_path):
    rec = capture("pcie8x-hmm-iommu")
    probe = F.Probe(rec)
    doctor.diagnose(probe, environ={})
    probe.record(tmp_path)
    assert F.load_capture(tmp_path) == rec
    assert doctor.main(["--replay", str(tmp_path), "--json"]) == 1
    rep = json.loads(capsys.readouterr().out)
    assert rep["errors"] == 1 and {x["id"] for x in rep["findings"] if x["severity"] == "error"} == {"host.hmm"}
    with pytest.raises(SystemExit) as e:
        run_cli(doctor.main, ["--replay", str(tmp_path / "nowhere")])
    assert e.value.code == 2 and "doctor --record DIR" in capsys.readouterr().err


def test_h200_nvlink_box_and_its_live_recording():
    f, facts = run(capture("h200x2"), tp=2)
    assert facts["pcie_only"] is False and f["topo.nvlink"].severity == "info" and "NV18" in f["topo.nvlink"].message
    assert (
        f["gpu.model"].severity == "info"
        and f["host.hmm"].severity == "info"
        and "error" not in {x.severity for x in f.values()}
    )
    assert f["pcie_ipc.smoke"].message.startswith("PCIe-IPC smoke not run: the series turns PCIe IPC on only for SM120")
    assert run(capture("h200x2"), tp=8)[0]["gpu.count"].severity == "error"
    f, facts = run(capture("h200x2-live"), tp=2, environ={"NCCL_VERSION": "2.28.3-1", "NCCL_NVLS_ENABLE": "0"})
    assert "NCCL 2.28.9 (torch 2.11.0+cu130)" in f["nccl.version"].message
    assert f["env.nccl"].message.endswith("NCCL_NVLS_ENABLE=0") and f["disk.free"].severity == "error"


def test_known_bad_nccl_releases_and_the_loaded_library():
    rec = capture("pcie8x")
    lib = "/usr/lib/x86_64-linux-gnu/libnccl.so.2"
    rec["nccl"] = json.dumps({"torch": "2.14.1+cu130", "nccl_build": "2.30.7", "nccl": "2.30.4", "nccl_lib": lib})
    n = run(rec)[0]["nccl.version"]
    assert n.severity == "error" and n.message.startswith("NCCL 2.30.4 (loaded by torch 2.14.1+cu130 from /usr/lib")
    assert "built against 2.30.7" in n.message and "NCCL_P2P_DISABLE=1" in n.fix
    assert run(rec, environ={"NCCL_P2P_DISABLE": "1"})[0]["nccl.version"].severity == "warn"
    rec["nccl"] = json.dumps({"torch": "2.7.0+cu128", "nccl": "2.26.2"})
    n = run(rec)[0]["nccl.version"]
    assert n.severity == "error" and "NVIDIA/nccl#2418" in n.message and "make image" in n.fix
    pin = load_pin()
    rec["nccl"] = json.dumps({"torch": "2.14.1+cu130", "nccl": "2.30.7"})
    assert f"patches/pin.toml [nccl] expects {pin.nccl_version}" in run(rec)[0]["nccl.version"].message
    n = run(rec, environ={"EAGLE_NCCL_VERSION": "2.30.7"})[0]["nccl.version"]
    assert n.message.endswith("the image build (EAGLE_NCCL_VERSION) expects 2.30.7")


def test_no_driver_small_bar_narrow_link_old_driver(capsys, tmp_path):
    f, _ = run({})
    assert f["gpu.driver"].severity == "error" and "--gpus all" in f["gpu.driver"].fix
    assert doctor.main(["--replay", str(tmp_path)]) == 1 and "no NVIDIA driver/GPU found" in capsys.readouterr().out
    rec = capture("pcie8x")
    q = rec["smi-xml"].replace("<total>131072 MiB</total>", "<total>256 MiB</total>")
    q = q.replace("<current_link_width>16x</current_link_width>", "<current_link_width>8x</current_link_width>", 1)
    rec["smi-xml"] = q.replace("<cuda_version>13.0</cuda_version>", "<cuda_version>12.8</cuda_version>")
    f, _ = run(rec)
    assert f["pcie.bar1"].severity == "error" and "Resizable BAR" in f["pcie.bar1"].fix
    assert f["pcie.link"].severity == "warn" and "00000000:03:00.0 x8 (max x16)" in f["pcie.link"].message
    assert f["driver.cuda"].severity == "error"


def test_numa_layouts():
    rec = capture("pcie8x")
    rows = [ln.split("\t") for ln in rec["topo-m"].splitlines()]
    for cells in rows:
        if cells[0].startswith("GPU"):
            cells[-3] = str(int(cells[0][3:]) % 2)  # GPUs alternate between the nodes
    rec["topo-m"] = "\n".join("\t".join(c) for c in rows) + "\n"
    t = run(rec)[0]["topo.numa"]
    assert t.severity == "warn" and "interleave" in t.message and "CUDA_VISIBLE_DEVICES=0,2,4,6,1,3,5,7" in t.fix


@pytest.mark.parametrize(
    "env", [{}, {"XDG_CACHE_HOME": "/x"}, {"HF_HOME": "/h"}, {"HF_HOME": "/h", "HF_HUB_CACHE": "/f"}]
)
def test_the_hf_cache_is_where_hf_puts_models(monkeypatch, env):
    """Every verb's HF cache (what it mounts, checks and measures) is huggingface_hub's own HF_HUB_CACHE."""
    for k in ("HF_HOME", "HF_HUB_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    code = "from huggingface_hub import constants; print(constants.HF_HUB_CACHE)"
    hf = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip()
    assert F.hf_cache_dir() == hf and F.Probe({}).hf_cache == Path(hf)


def test_disk_is_judged_in_the_hf_cache_every_verb_mounts():
    rec = capture("pcie8x")
    rec["df"] = "Filesystem 1024-blocks Used Available Capacity Mounted on\n/dev/sda1 5 4 100000000 80% /\n"
    d = run(rec)[0]["disk.free"]
    assert d.severity == "error" and d.message.startswith("102 GB free at the HF cache /models (filesystem /)")
    assert "export HF_HUB_CACHE=" in d.fix and '-v "$HF_HUB_CACHE":/root/.cache/huggingface/hub' in d.fix
    d = run(rec, environ={"EAGLE_IMAGE": "eagle-fast-verify/sglang:v0.5.23"})[0]["disk.free"]  # nothing mounted
    assert d.severity == "warn" and "the container's own disk" in d.message and "--ipc=host" in d.fix
    assert '-v "${HF_HUB_CACHE:-${HF_HOME:-$HOME/.cache/huggingface}/hub}":/root/.cache/huggingface/hub' in d.fix
    rec["model-present"] = "yes\n"
    assert run(rec)[0]["disk.free"].severity == "ok"


def test_the_profiles_drafters_are_looked_for_in_the_hf_cache(tmp_path):
    rec = capture("pcie8x")
    assert run(rec)[0]["weights.drafters"].severity == "info"  # not recorded: unknown
    rec["drafters-present"] = "lightseekorg/kimi-k2.5-eagle3\n"
    d = run(rec)[0]["weights.drafters"]
    assert "lacks z-lab/Kimi-K2.5-DFlash" in d.message and d.fix == "hf download z-lab/Kimi-K2.5-DFlash"
    snap = tmp_path / "models--z-lab--Kimi-K2.5-DFlash" / "snapshots" / "r1"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    (snap / "model.safetensors").write_text("")  # complete: a config and its weights
    assert F.Probe(python="python3", hf_cache=str(tmp_path)).get("drafters-present").text == "z-lab/Kimi-K2.5-DFlash\n"
    rec["drafters-present"] += "z-lab/Kimi-K2.5-DFlash\n"
    assert run(rec)[0]["weights.drafters"].severity == "ok"


def test_patch_set_and_environment():
    rec = capture("pcie8x") | {"sglang": "/sgl-workspace/sglang/python/sglang\n", "patchset": "none\n"}
    assert run(rec, expected="abcdef012345")[0]["image.patchset"].severity == "error"
    rec["patchset"] = "abcdef012345\n"
    f, facts = run(rec, expected="abcdef012345")
    assert f["image.patchset"].severity == "ok" and facts["patchset"] == "abcdef012345"
    assert run(rec, expected="ffffffffffff")[0]["image.patchset"].severity == "warn"
    f, _ = run(rec, environ={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "NCCL_GRAPH_FILE": ""})
    assert f["env.alloc"].severity == "warn" and f["env.graph_file"].severity == "error"
    assert f["env.graph_file"].fix.startswith("unset NCCL_GRAPH_FILE")


# nccl.transport / nccl.latency: the transport NCCL picked (recorded outputs in NCCL 2.29's formats) and the fix the
# host facts point to


def test_nccl_shm_across_the_cpu_names_the_driver_override():
    f, facts = run(capture("pcie8x-cns"))
    t = f["nccl.transport"]
    assert t.severity == "error" and "GPU3->GPU4 SHM/direct/direct, GPU7->GPU0 SHM/direct/direct" in t.message
    assert "242 us instead of ~16 us at 114 KB" in t.message
    assert facts["nccl_transport"]["links"] == {"P2P": 12, "SHM": 4}
    assert "GPU0-GPU7 CNS (SYS), GPU3-GPU4 CNS (SYS), which meet at the CPU" in t.fix and "ForceP2P=0x11;" in t.fix
    assert "HMM" not in t.fix and "iommu" not in t.fix
    rec = capture("pcie8x-cns")
    rec["nvidia-params"] = rec["nvidia-params"].replace('RegistryDwords: ""', 'RegistryDwords: "ForceP2P=0x11"')
    assert "although the driver's P2P override is set" in run(rec)[0]["nccl.transport"].fix


def test_nccl_shm_inside_a_switch_names_acs_and_net_names_the_settings():
    rec = capture("pcie8x")
    rows = [ln.split("\t") for ln in rec["topo-p2p-r"].splitlines()]
    for cells in rows:
        if cells[0].strip() in ("GPU0", "GPU1"):
            cells[2 if cells[0].strip() == "GPU0" else 1] = "CNS"
    rec["topo-p2p-r"] = "\n".join("\t".join(c) for c in rows) + "\n"
    shm = "Channel 00 : 0[0] -> 1[1] via SHM/direct/direct"
    rec["nccl-transport"] = rec["nccl-transport"].replace("Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM", shm)
    t = run(rec)[0]["nccl.transport"]
    assert "GPU0-GPU1 CNS (PIX), which share a PCIe switch" in t.fix and "ECAP_ACS+6.w=0000" in t.fix
    t = run(capture("pcie8x-net"))[0]["nccl.transport"]
    unset = "the ranks ran with NCCL_P2P_DISABLE=1, NCCL_SHM_DISABLE=1: unset NCCL_P2P_DISABLE NCCL_SHM_DISABLE"
    assert "GPU3->GPU4 NET/Socket/0" in t.message and t.fix.startswith(unset)
    assert "--ipc=host" in run(changed(capture("pcie8x-net"), "nccl-transport", nccl_env={}))[0]["nccl.transport"].fix
    rec = capture("pcie8x")
    rec["nccl-transport"] = rec["nccl-transport"].replace("3[3] -> 4[4] via P2P/CUMEM", "3[3] -> 4[4] via SHM/direct")
    assert "NCCL_P2P_LEVEL=SYS" in run(rec)[0]["nccl.transport"].fix  # P2P reported OK: NCCL's own rule


def test_nccl_hang_wrong_sum_no_lines_slow_and_unmeasured():
    rec = capture("pcie8x-hmm-iommu") | {"nccl-transport": (FIX / "pcie8x-hang" / "nccl-transport.txt").read_text()}
    f, facts = run(rec)
    t = f["nccl.transport"]
    assert t.severity == "error" and "did not finish within 120 s" in t.message and "16 P2P connection(s)" in t.message
    assert "uvm_disable_hmm=1" in t.fix and "iommu=pt" in t.fix and facts["nccl_transport"]["hung"] is True
    assert "NCCL_P2P_DISABLE=1 make doctor" in run(capture("pcie8x-hang"))[0]["nccl.transport"].fix
    t = run(changed(capture("pcie8x"), "nccl-transport", sum_ok=False, sum=28.0))[0]["nccl.transport"]
    assert t.severity == "error" and "returned 28.0 instead of 36.0" in t.message
    rec = capture("pcie8x")
    rec["nccl-transport"] = "".join(ln for ln in rec["nccl-transport"].splitlines(True) if " via " not in ln)
    assert "printed no transport line" in run(rec)[0]["nccl.transport"].message
    s = run(changed(capture("pcie8x"), "nccl-transport", allreduce_us=83.0))[0]["nccl.latency"]
    assert s.severity == "warn" and "took 83.0 us" in s.message and "NCCL_P2P_LEVEL=SYS" in s.fix
    assert "NCCL_GRAPH_FILE=" in s.fix
    rec = capture("pcie8x")
    del rec["nccl-transport"]
    f, facts = run(rec)
    assert f["nccl.transport"].severity == "warn"
    assert "docker run --rm --gpus all --ipc=host -v" in f["nccl.transport"].fix
    assert facts["nccl_transport"]["measured"] is False
    t = run(rec, environ={"EAGLE_IMAGE": "eagle-fast-verify/sglang:x"})[0]["nccl.transport"]
    assert "already runs in the image eagle-fast-verify/sglang:x" in t.fix and "--gpus all" in t.fix
    assert "docker is not installed" not in t.fix
    assert run(capture("pcie8x"), tp=1)[0]["nccl.transport"].message.startswith("TP1")


# pcie_ipc.smoke and pcie.peer_write: the probes' results (scripts/host/nccl.py; tests/host/test_nccl.py runs them)


def test_the_pcie_ipc_smoke_runs_where_the_series_turns_it_on_and_a_hang_or_wrong_sum_names_its_cause():
    why = "no progress within 60 s (ranks 0,1,2,3,4,5,6,7: iterate 8x7168); the ranks were killed"
    hung = dict(measured=False, hung=True, world=8, phase="ranks 0-7: iterate 8x7168", why=why)
    rec = capture("pcie8x-hmm-iommu") | {"pcie-ipc-smoke": MARK + json.dumps(hung) + "\n"}
    f, facts = run(rec)
    s = f["pcie_ipc.smoke"]
    assert s.severity == "error" and "hung: no progress within 60 s (ranks 0,1,2,3,4,5,6,7: iterate" in s.message
    assert s.fix.startswith("serve with SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=0") and "iommu=pt" in s.fix
    assert facts["pcie_ipc_smoke"]["hung"] is True and facts["pcie_ipc_smoke"]["phase"] == hung["phase"]
    rec = changed(capture("pcie8x"), "pcie-ipc-smoke", sum_ok=False, wrong={"3": 57344})
    rec["topo-m"] = rec["topo-m"].replace("SYS", "PHB")
    s = run(rec)[0]["pcie_ipc.smoke"]
    assert s.severity == "error" and "wrong sums" in s.message and "'3': 57344" in s.message
    assert "GPU0-GPU4" in s.fix and "PCIe host bridge (PHB)" in s.fix
    s = run(changed(capture("pcie8x"), "pcie-ipc-smoke", measured=False, engaged=False, why="x"))[0]["pcie_ipc.smoke"]
    assert s.severity == "warn" and "SGLang did not take the PCIe-IPC path: x" in s.message
    f, facts = run(capture("pcie8x"), environ={"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "0"})
    assert "not run: SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=0 is set" in f["pcie_ipc.smoke"].message
    assert facts["pcie_ipc_smoke"]["measured"] is False
    assert "not run" in run(capture("pcie8x"), tp=2)[0]["pcie_ipc.smoke"].message
    forced = run(capture("pcie8x"), tp=2, environ={"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1"})[0]
    assert forced["pcie_ipc.smoke"].severity == "ok"


def test_slow_peer_writes_warn_with_the_collapse():
    rounds = [{"shift": k, "gbps": g} for k, g in enumerate((50.1, 38.2, 25.7, 12.8, 25.6, 38.0, 50.0), 1)]
    s = run(changed(capture("pcie8x"), "peer-bandwidth", rounds=rounds, min_gbps=12.8))[0]["pcie.peer_write"]
    assert s.severity == "warn" and "12.8 GB/s when every GPU i writes to GPU i+4 mod 8, below 15" in s.message
    assert "rtx6kpro#25, #32" in s.fix and "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=0" in s.fix
    rec = capture("pcie8x")
    del rec["peer-bandwidth"]
    assert run(rec)[0]["pcie.peer_write"].severity == "info"
