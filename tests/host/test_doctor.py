"""scripts/host/doctor.py (facts, registered checks, table) fed recorded outputs of the real tools.

tests/fixtures/doctor/h200x2/: verbatim captures from a lent 2x H200 NVLink machine (nvidia-smi -q, topo -m,
topo -p2p r|w|n|a|p, nvlink -s; host.txt bundles uvm_disable_hmm, lscpu, numactl -H and the --query-gpu CSV).
tests/fixtures/doctor/h200x2-live/: what `doctor --record` wrote on that machine kind (2026-11-29; serials and UUIDs
blanked, the VM's kernel command line left out).
tests/fixtures/doctor/pcie8x/: 8x RTX PRO 6000 Blackwell Server Edition on two NUMA nodes (pairs behind PCIe
switches), written in the exact layout of those captures. pcie8x-cns/ and pcie8x-hmm-iommu/ hold only the files
that differ from pcie8x/ (cross-socket P2P "CNS"; HMM on and the IOMMU on).
nvidia-smi-q.xml in each is synthesized by make_pcie8x.py (the H200 ones from the real text captures).
"""

from __future__ import annotations

import ast
import inspect
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from scripts.host import checks, doctor
from scripts.host import parsers as P
from scripts.host.tools import CAPTURE_FILES, Probe, load_capture
from scripts.series.pin import load_pin

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "doctor"


def capture(name: str) -> dict[str, str]:
    rec = {} if name in ("pcie8x", "h200x2", "h200x2-live") else load_capture(FIX / "pcie8x")
    rec.update(load_capture(FIX / name))
    return rec


def run(rec: dict[str, str], tp: int = 8, environ: dict | None = None, expected: str | None = None, **kw):
    probe = Probe(rec, python="python3", model_dir=Path("/models"))
    findings, facts = doctor.diagnose(probe, tp=tp, environ=environ or {}, expected_patchset=expected, **kw)
    return {f.id: f for f in findings}, facts


def sev(findings) -> dict[str, str]:
    return {k: f.severity for k, f in findings.items()}


# ---------------------------------------------------------------------------------------------------------------
# parsers on the real formats


def test_parsers_on_the_real_h200_captures():
    rec = capture("h200x2")
    smi = P.parse_smi_xml(rec["smi-xml"])
    assert (smi.driver, smi.cuda, len(smi.gpus)) == ("580.159.04", "13.0", 2)
    assert [g.bus_id for g in smi.gpus] == ["00000000:00:06.0", "00000000:00:07.0"]
    g = smi.gpus[0]
    assert (g.name, g.bar1_total_mib, g.fb_total_mib, g.gen_max, g.width_max) == ("NVIDIA H200", 262144, 143771, 5, 16)
    topo = P.parse_topo_m(rec["topo-m"])
    assert topo["links"] == {(0, 1): "NV18", (1, 0): "NV18"}
    assert topo["cpu"] == {0: "0-31", 1: "0-31"} and topo["numa"] == {0: "0", 1: "0"}
    assert P.parse_p2p(rec["topo-p2p-r"]) == {(0, 1): "OK", (1, 0): "OK"}
    assert P.parse_p2p(rec["topo-p2p-n"]) == {(0, 1): "OK", (1, 0): "OK"}  # NVLink between the pair
    assert [r["compute_cap"] for r in P.parse_query_csv(rec["smi-query"])] == ["9.0", "9.0"]
    assert P.parse_numactl(rec["numactl"])["nodes"] == 1
    assert rec["uvm-hmm"].strip() == "N"
    assert P.parse_nvlink(rec["nvlink-s"]) == 36


def test_parsers_on_the_pcie_box():
    rec = capture("pcie8x")
    smi = P.parse_smi_xml(rec["smi-xml"])
    assert len(smi.gpus) == 8 and smi.driver.startswith("580.")
    assert {g.name for g in smi.gpus} == {"NVIDIA RTX PRO 6000 Blackwell Server Edition"}
    assert {(g.gen_max, g.gen_current, g.width_current, g.bar1_total_mib) for g in smi.gpus} == {(5, 1, 16, 131072)}
    topo = P.parse_topo_m(rec["topo-m"])
    assert topo["devices"][-1] == "NIC0"
    assert (topo["links"][(0, 1)], topo["links"][(0, 2)], topo["links"][(0, 4)]) == ("PIX", "NODE", "SYS")
    assert topo["numa"] == {i: str(i // 4) for i in range(8)}
    p2p = P.parse_p2p(rec["topo-p2p-r"])
    assert len(p2p) == 56 and set(p2p.values()) == {"OK"}
    assert set(P.parse_p2p(rec["topo-p2p-n"]).values()) == {"NS"}  # no NVLink anywhere
    cns = P.parse_p2p(capture("pcie8x-cns")["topo-p2p-r"])
    assert cns[(0, 4)] == "CNS" and cns[(0, 1)] == "OK"
    assert P.parse_nvcc(rec["nvcc"]) == (13, 0)
    assert P.parse_df(rec["df"])["mount"] == "/data"


# ---------------------------------------------------------------------------------------------------------------
# diagnosis


def test_clean_pcie_box_has_no_warnings():
    f, facts = run(capture("pcie8x"))
    bad = {k: v for k, v in sev(f).items() if v in ("warn", "error")}
    assert not bad, bad
    for key in ("gpu.model", "gpu.count", "driver.cuda", "topo.nvlink", "topo.p2p", "topo.numa", "pcie.link",
                "pcie.bar1", "host.hmm", "host.iommu", "cuda.nvcc", "nccl.version", "disk.free"):
        assert f[key].severity == "ok", (key, f[key])
    assert "SM120" in f["gpu.model"].message and "compute capability 12.0" in f["gpu.model"].message
    assert "GPUs 0-3 on NUMA node 0; GPUs 4-7 on NUMA node 1" in f["topo.numa"].message
    assert "no NVLink" in f["topo.nvlink"].message and facts["pcie_only"] is True
    assert "28 GPU pairs" in f["topo.p2p"].message
    assert facts["nccl"] == "2.28.3"


def test_cns_pairs_are_a_warning_with_the_pairs_named():
    f, facts = run(capture("pcie8x-cns"))
    p = f["topo.p2p"]
    assert p.severity == "warn" and "16 of 28 GPU pairs" in p.message and "CNS: chipset not supported" in p.message
    assert "GPU0-GPU4 CNS" in p.message and "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=0" in p.fix
    assert len(facts["p2p_bad_pairs"]) == 16


def test_hmm_and_iommu_on_a_pcie_box():
    f, _ = run(capture("pcie8x-hmm-iommu"))
    assert f["host.hmm"].severity == "error" and "uvm_disable_hmm=N" in f["host.hmm"].message
    assert "uvm_disable_hmm=1" in f["host.hmm"].fix
    assert f["host.iommu"].severity == "warn" and "142 IOMMU groups" in f["host.iommu"].message
    assert "iommu=pt" in f["host.iommu"].fix
    assert f["host.pcie_pm"].severity == "info"


def test_exit_status_follows_errors(capsys, tmp_path):
    full = tmp_path / "hmm"
    full.mkdir()
    for k, text in capture("pcie8x-hmm-iommu").items():
        (full / CAPTURE_FILES[k]).write_text(text)
    assert doctor.main(["--replay", str(FIX / "pcie8x")]) == 0
    assert doctor.main(["--replay", str(full), "--json"]) == 1
    out = capsys.readouterr().out
    rep = json.loads(out[out.index("{"):])
    assert rep["errors"] == 1 and {x["id"] for x in rep["findings"] if x["severity"] == "error"} == {"host.hmm"}


def test_hmm_seen_through_addressing_mode_when_sysfs_is_hidden():
    rec = capture("pcie8x-hmm-iommu")
    del rec["uvm-hmm"]
    f, _ = run(rec)
    assert f["host.hmm"].severity == "error" and "Addressing Mode HMM" in f["host.hmm"].message


def test_h200_nvlink_box():
    f, facts = run(capture("h200x2"), tp=2)
    s = sev(f)
    assert facts["nvlink"] is True and facts["pcie_only"] is False
    assert s["topo.nvlink"] == "info" and "NV18" in f["topo.nvlink"].message
    assert s["gpu.model"] == "info" and "compute capability 9.0" in f["gpu.model"].message
    assert s["host.hmm"] == "info"  # HMM on matters on PCIe-only boxes, not here
    assert s["topo.p2p"] == "ok" and s["pcie.bar1"] == "ok" and s["gpu.count"] == "ok"
    assert "error" not in s.values()
    f8, _ = run(capture("h200x2"), tp=8)
    assert f8["gpu.count"].severity == "error" and "TP8 needs 8 GPUs" in f8["gpu.count"].message


def test_live_recording_from_the_h200_machine():
    """Recorded by the live probe (`doctor --record`) on a real GPU machine: every tool answered, same facts as the
    separately captured outputs."""
    live, shared = capture("h200x2-live"), capture("h200x2")
    assert P.parse_topo_m(live["topo-m"])["links"] == P.parse_topo_m(shared["topo-m"])["links"]
    assert P.parse_p2p(live["topo-p2p-r"]) == P.parse_p2p(shared["topo-p2p-r"])
    f, facts = run(live, tp=2, environ={"NCCL_VERSION": "2.28.3-1", "NCCL_NVLS_ENABLE": "0"})
    s = sev(f)
    assert s["cuda.nvcc"] == "ok" and "nvcc 13.0" in f["cuda.nvcc"].message
    assert s["nccl.version"] == "ok" and "NCCL 2.28.9 (torch 2.11.0+cu130)" in f["nccl.version"].message
    assert s["host.iommu"] == "info"  # no command line recorded, and nothing claims the IOMMU is on
    assert f["env.nccl"].message.endswith("NCCL_NVLS_ENABLE=0")  # NCCL_VERSION is image metadata, not a setting
    assert [g["compute_cap"] for g in facts["gpus"]] == ["9.0", "9.0"]
    assert facts["disk_free_gb"] > 100 and s["disk.free"] == "error"  # 137 GB < what Kimi-K2.5 needs


def test_nccl_2_30_4_is_an_error_with_the_fix():
    rec = capture("pcie8x")
    rec["nccl"] = '{"torch": "2.10.0+cu130", "nccl": "2.30.4"}\n'
    f, _ = run(rec)
    n = f["nccl.version"]
    assert n.severity == "error" and "2.30.4" in n.message and "NCCL_P2P_DISABLE=1" in n.fix
    f, _ = run(rec, environ={"NCCL_P2P_DISABLE": "1"})
    assert f["nccl.version"].severity == "warn" and f["env.nccl"].severity == "info"


def test_nccl_version_from_package_metadata_or_unknown():
    rec = capture("pcie8x")
    rec["nccl"] = '{"error": "ModuleNotFoundError: No module named \'torch\'", "dist": "nvidia-nccl-cu13", ' \
                  '"dist_version": "2.28.3"}\n'
    f, _ = run(rec)
    assert f["nccl.version"].severity == "ok" and "package metadata" in f["nccl.version"].message
    del rec["nccl"]
    f, facts = run(rec)
    assert f["nccl.version"].severity == "info" and "unknown" in f["nccl.version"].message
    assert facts["nccl"] == "unknown"


def test_no_driver_is_a_finding_not_a_traceback(capsys, tmp_path):
    f, _ = run({})
    assert f["gpu.driver"].severity == "error"
    assert f["gpu.driver"].message.startswith("no NVIDIA driver/GPU found")
    assert "--gpus all" in f["gpu.driver"].fix
    assert doctor.main(["--replay", str(tmp_path)]) == 1
    assert "no NVIDIA driver/GPU found" in capsys.readouterr().out


def test_live_tools_missing_or_hanging_are_findings_material():
    p = Probe(timeout=0.5)
    missing = p.command(["no-such-tool-eagle-doctor"])
    assert not missing.ok and "not found" in missing.why
    hung = p.command(["sleep", "5"])
    assert not hung.ok and "did not answer within" in hung.why
    failed = p.command(["sh", "-c", "echo 'NVIDIA-SMI has failed because it could not communicate' >&2; exit 9"])
    assert not failed.ok and "exit 9" in failed.why and "NVIDIA-SMI has failed" in failed.why


def test_small_bar_narrow_link_and_old_toolchain():
    rec = capture("pcie8x")
    q = rec["smi-xml"].replace("<total>131072 MiB</total>", "<total>256 MiB</total>")  # BAR1 (memory is 97887)
    q = q.replace("<current_link_width>16x</current_link_width>", "<current_link_width>8x</current_link_width>", 1)
    rec["smi-xml"] = q.replace("<cuda_version>13.0</cuda_version>", "<cuda_version>12.8</cuda_version>")
    rec["nvcc"] = rec["nvcc"].replace("release 13.0, V13.0.88", "release 12.4, V12.4.131")
    f, _ = run(rec)
    assert f["pcie.bar1"].severity == "error" and "256 MiB" in f["pcie.bar1"].message
    assert "Resizable BAR" in f["pcie.bar1"].fix
    assert f["pcie.link"].severity == "warn" and "00000000:03:00.0 x8 (max x16)" in f["pcie.link"].message
    assert f["driver.cuda"].severity == "error" and f["cuda.nvcc"].severity == "error"


def test_numa_layouts():
    rec = capture("pcie8x")
    lines = rec["topo-m"].splitlines()
    swapped = []
    for ln in lines:  # GPUs alternate between nodes: 0,2,4,6 on node 0
        if ln.startswith("GPU"):
            i = int(ln.split("\t")[0][3:])
            cells = ln.split("\t")
            cells[-3] = str(i % 2)
            ln = "\t".join(cells)
        swapped.append(ln)
    rec["topo-m"] = "\n".join(swapped) + "\n"
    f, _ = run(rec)
    assert f["topo.numa"].severity == "warn" and "interleave" in f["topo.numa"].message
    assert "CUDA_VISIBLE_DEVICES=0,2,4,6,1,3,5,7" in f["topo.numa"].fix


def test_disk_and_model_cache():
    rec = capture("pcie8x")
    rec["df"] = "Filesystem 1024-blocks Used Available Capacity Mounted on\n/dev/sda1 500000000 400000000 " \
                "100000000 80% /\n"
    f, _ = run(rec)
    assert f["disk.free"].severity == "error" and "102 GB free" in f["disk.free"].message
    rec["model-present"] = "yes\n"
    f, _ = run(rec)
    assert f["disk.free"].severity == "ok" and "in the cache" in f["disk.free"].message


def test_patch_set_of_the_image():
    rec = capture("pcie8x")
    rec["sglang"] = "/sgl-workspace/sglang/python/sglang\n"
    f, _ = run(rec, expected="abcdef012345")
    assert f["image.patchset"].severity == "error" and "not patched" in f["image.patchset"].message
    rec["patchset"] = json.dumps({"patchset": "abcdef012345", "base": {"tag": "v9.9.9"},
                                  "patches": [{"file": "0001-x.patch"}]})
    f, facts = run(rec, expected="abcdef012345")
    assert f["image.patchset"].severity == "ok" and "0001-x.patch" in f["image.patchset"].message
    assert facts["patchset"] == "abcdef012345"
    f, _ = run(rec, expected="ffffffffffff")
    assert f["image.patchset"].severity == "warn"


def test_alloc_conf_warning():
    f, _ = run(capture("pcie8x"), environ={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    assert f["env.alloc"].severity == "warn"


def test_record_and_replay_round_trip(tmp_path):
    rec = capture("pcie8x")
    probe = Probe(rec)
    written = probe.record(tmp_path / "rec")
    assert len(written) == len(rec)
    assert load_capture(tmp_path / "rec") == rec


def test_table_lists_every_finding_with_fixes():
    f, _ = run(capture("pcie8x-hmm-iommu"))
    text = checks.table(list(f.values()))
    assert text.splitlines()[2].startswith("error  host.hmm")
    assert "fix: echo 'options nvidia_uvm uvm_disable_hmm=1'" in text
    assert text.splitlines()[-1].startswith("1 error, 1 warn")


def _shape(el: ET.Element) -> list:
    return [(c.tag, _shape(c)) for c in el]


@pytest.mark.parametrize("name", ["pcie8x", "pcie8x-cns", "pcie8x-hmm-iommu", "h200x2", "h200x2-live"])
def test_fixture_layout_matches_the_real_captures(name):
    """The written fixtures use the real tools' layout: every <gpu> of `nvidia-smi -q -x` has the same elements in
    the same order (the v12 schema), its values are the text capture's, and topo -m / -p2p keep nvidia-smi's
    underline escapes."""
    rec = capture(name)
    root = ET.fromstring(rec["smi-xml"])
    assert root.tag == "nvidia_smi_log" and rec["smi-xml"].startswith('<?xml version="1.0" ?>\n<!DOCTYPE nvidia_smi_log')
    reference = ET.fromstring(capture("h200x2")["smi-xml"]).find("gpu")
    assert all(_shape(g) == _shape(reference) for g in root.findall("gpu"))
    assert int(root.findtext("attached_gpus")) == len(root.findall("gpu"))
    assert "\x1b[4m" in rec["topo-m"] and "\x1b[4m" in rec["topo-p2p-r"]


def test_h200_xml_carries_the_text_capture():
    text = (FIX / "h200x2" / "nvidia-smi-q.txt").read_text()
    xml = P.parse_smi_xml(capture("h200x2")["smi-xml"])
    for g in xml.gpus:
        assert f"GPU {g.bus_id}\n" in text and f": {g.fb_total_mib} MiB" in text and f": {g.bar1_total_mib} MiB" in text
    assert f"Driver Version                                         : {xml.driver}" in text


def test_doctor_says_who_can_reach_the_server(capsys, tmp_path):
    rec = capture("pcie8x")
    f, _ = run(rec)  # serve's default: loopback
    assert f["serve.listen"].severity == "ok" and f["serve.listen"].message.startswith("listening on 127.0.0.1 only")
    f, _ = run(rec, listen_host="0.0.0.0")
    n = f["serve.listen"]
    assert n.severity == "error" and "refusing to listen on 0.0.0.0 without an API key" in n.message
    assert "export SGLANG_API_KEY=" in n.fix
    f, _ = run(rec, listen_host="0.0.0.0", environ={"SGLANG_API_KEY": "s3cret"})
    assert f["serve.listen"].severity == "ok" and "s3cret" not in f["serve.listen"].message
    assert f["serve.listen"].message.startswith("listening on 0.0.0.0 with an API key from $SGLANG_API_KEY")
    key = tmp_path / "key"
    key.write_text("s3cret\n")
    f, _ = run(rec, listen_host="::", api_key_file=str(key))
    assert f["serve.listen"].severity == "ok" and f"from the file {key}" in f["serve.listen"].message
    assert doctor.main(["--replay", str(FIX / "pcie8x"), "--listen-host", "0.0.0.0"]) == 1
    assert "refusing to listen on 0.0.0.0" in capsys.readouterr().out


def test_the_nccl_torch_loaded_is_what_counts():
    """torch.cuda.nccl.version() is torch's build-time NCCL; the probe also reads the library torch loaded, and the
    doctor judges that one (a 2.30.4 library under a torch built against 2.30.7 is the known hang)."""
    rec = capture("pcie8x")
    rec["nccl"] = json.dumps({"torch": "2.14.1+cu130", "nccl_build": "2.30.7", "nccl": "2.30.4",
                              "nccl_lib": "/usr/lib/x86_64-linux-gnu/libnccl.so.2"}) + "\n"
    f, facts = run(rec)
    n = f["nccl.version"]
    assert n.severity == "error" and n.message.startswith("NCCL 2.30.4 (loaded by torch 2.14.1+cu130 from /usr/lib")
    assert "built against 2.30.7" in n.message and facts["nccl"] == "2.30.4"
    pin = load_pin()
    rec["nccl"] = json.dumps({"torch": "2.14.1+cu130", "nccl_build": "2.30.7", "nccl": "2.30.7",
                              "nccl_lib": "/x/nvidia/nccl/lib/libnccl.so.2"})
    f, _ = run(rec)  # on a host: the image's pin is information
    assert f["nccl.version"].severity == "ok" and f"the image pins {pin.nccl_version}" in f["nccl.version"].message
    f, _ = run(rec, environ={"EAGLE_NCCL_VERSION": pin.nccl_version})  # in the image built for the pin
    assert f["nccl.version"].severity == "warn" and f"built to run NCCL {pin.nccl_version}" in f["nccl.version"].message


def test_the_doctor_docstring_lists_every_check_and_its_finding_ids():
    """The table in scripts/host/doctor.py's docstring is the registry (checks.CHECKS) in order, each check with the
    finding ids it can report (read from checks.py: the Finding ids of the check and of the helpers it calls)."""
    tree = ast.parse(inspect.getsource(checks))
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    consts = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
              for t in n.targets if isinstance(t, ast.Name)}

    def ids(name: str, seen: set[str]) -> set[str]:
        seen.add(name)
        out = set()
        for n in ast.walk(funcs[name]):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name):
                if n.func.id == "Finding" and n.args and isinstance(n.args[0], ast.Constant):
                    out.add(n.args[0].value)
                elif n.func.id == "Finding" and n.args and isinstance(n.args[0], ast.Name):
                    out.add(consts[n.args[0].id])
                elif n.func.id in funcs and n.func.id not in seen:
                    out |= ids(n.func.id, seen)
        return out

    rows = re.findall(r"^  (\w+) +([a-z0-9_]+\.[a-z0-9_.]+(?:, [a-z0-9_]+\.[a-z0-9_.]+)*) ", doctor.__doc__, re.M)
    assert [name for name, _ in rows] == [c.__name__ for c in checks.CHECKS]
    for name, listed in rows:
        assert set(listed.split(", ")) == ids(name, set()), name


# ---------------------------------------------------------------------------------------------------------------
# nccl.transport: which transport NCCL picked between the TP group's GPUs (recorded probe outputs, NCCL's formats:
# tests/fixtures/doctor/make_nccl_transport.py) and the fix the host facts point to


def _result(rec: dict, **kw) -> dict:
    """The recording with its probe result line changed (the NCCL lines kept)."""
    lines = rec["nccl-transport"].splitlines()
    res = json.loads(lines[-1][len("EAGLE_NCCL_TRANSPORT "):]) | kw
    return {**rec, "nccl-transport": "\n".join(lines[:-1] + ["EAGLE_NCCL_TRANSPORT " + json.dumps(res)]) + "\n"}


def test_nccl_on_p2p_between_every_pair_is_ok():
    f, facts = run(capture("pcie8x"))
    t = f["nccl.transport"]
    assert t.severity == "ok" and "NCCL 2.29.7+cuda13.0 uses P2P between the TP group's 8 GPUs" in t.message
    assert "16 P2P connection(s): P2P/CUMEM" in t.message and "112 KiB took 24.6 us" in t.message
    assert facts["nccl_transport"] == {"measured": True, "world": 8, "allreduce_us": 24.6, "sum_ok": True,
                                       "links": {"P2P": 16}, "nccl": "2.29.7+cuda13.0"}


def test_shm_across_the_cpu_without_the_driver_override_names_the_override():
    """pcie8x-cns: the driver reports CNS for the cross-socket pairs, NCCL puts those hops on SHM; the pairs meet
    at the CPU (SYS) and /proc/driver/nvidia/params has no RegistryDwords: the fix is the driver's P2P override."""
    f, facts = run(capture("pcie8x-cns"))
    t = f["nccl.transport"]
    assert t.severity == "error" and "does not use P2P between every GPU pair of the TP group" in t.message
    assert "GPU3->GPU4 SHM/direct/direct, GPU7->GPU0 SHM/direct/direct" in t.message
    assert "242 us instead of ~16 us at 114 KB" in t.message and "pcie-oneshot-allreduce.md" in t.message
    assert "GPU0-GPU7 CNS (SYS), GPU3-GPU4 CNS (SYS), which meet at the CPU without a PCIe switch" in t.fix
    assert "RegistryDwords in /proc/driver/nvidia/params: ''" in t.fix
    assert "NVreg_RegistryDwords=\"ForceP2P=0x11;" in t.fix and "update-initramfs -u and reboot" in t.fix
    assert "HMM" not in t.fix and "iommu" not in t.fix  # HMM off, iommu=off on this box
    assert facts["nccl_transport"]["links"] == {"P2P": 12, "SHM": 4}
    rec = capture("pcie8x-cns")
    rec["nvidia-params"] = rec["nvidia-params"].replace('RegistryDwords: ""', 'RegistryDwords: "ForceP2P=0x11"')
    f, _ = run(rec)
    assert "although its P2P override is set" in f["nccl.transport"].fix
    assert "ForceP2P=0x11;RMForceP2PType" not in f["nccl.transport"].fix


def test_shm_inside_a_pcie_switch_names_acs():
    rec = capture("pcie8x")
    rows = rec["topo-p2p-r"].splitlines()
    for i, ln in enumerate(rows):  # GPU0-GPU1 (PIX: one switch) without P2P
        cells = ln.split("\t")
        if cells[0].strip() in ("GPU0", "GPU1"):
            cells[2 if cells[0].strip() == "GPU0" else 1] = "CNS"
            rows[i] = "\t".join(cells)
    rec["topo-p2p-r"] = "\n".join(rows) + "\n"
    rec["nccl-transport"] = rec["nccl-transport"].replace("Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM",
                                                          "Channel 00 : 0[0] -> 1[1] via SHM/direct/direct")
    f, _ = run(rec)
    t = f["nccl.transport"]
    assert t.severity == "error" and "GPU0->GPU1 SHM/direct/direct" in t.message
    assert "GPU0-GPU1 CNS (PIX), which share a PCIe switch" in t.fix and "ECAP_ACS+6.w=0000" in t.fix
    assert "ForceP2P" not in t.fix


def test_net_between_the_gpus_names_the_settings_the_ranks_ran_with():
    f, facts = run(capture("pcie8x-net"))
    t = f["nccl.transport"]
    assert t.severity == "error" and "GPU3->GPU4 NET/Socket/0" in t.message and "1452.0 us" in t.message
    assert t.fix.startswith("the ranks ran with NCCL_P2P_DISABLE=1, NCCL_SHM_DISABLE=1: unset NCCL_P2P_DISABLE "
                            "NCCL_SHM_DISABLE")
    assert "--ipc=host" not in t.fix
    assert facts["nccl_transport"]["links"] == {"NET": 32}
    # NET without those settings: the ranks do not share /dev/shm
    f, _ = run(_result(capture("pcie8x-net"), nccl_env={}))
    assert "do not share /dev/shm" in f["nccl.transport"].fix and "--ipc=host" in f["nccl.transport"].fix


def test_shm_from_a_setting_or_from_ncclls_own_topology_rule():
    rec = capture("pcie8x")
    rec["nccl-transport"] = rec["nccl-transport"].replace("3[3] -> 4[4] via P2P/CUMEM",
                                                          "3[3] -> 4[4] via SHM/direct/direct")
    f, _ = run(_result(rec, nccl_env={"NCCL_P2P_DISABLE": "1"}))
    assert f["nccl.transport"].fix.startswith("the ranks ran with NCCL_P2P_DISABLE=1: unset NCCL_P2P_DISABLE")
    f, _ = run(rec)  # P2P reported OK for every pair, nothing set: NCCL's own rule, and the setting that lifts it
    assert "NCCL's own topology rule declined it" in f["nccl.transport"].fix
    assert "NCCL_P2P_LEVEL=SYS" in f["nccl.transport"].fix and "make bench-comm" in f["nccl.transport"].fix


def test_a_hung_all_reduce_is_an_error_with_the_host_causes():
    rec = capture("pcie8x-hmm-iommu")
    rec["nccl-transport"] = (FIX / "pcie8x-hang" / "nccl-transport.txt").read_text()
    f, facts = run(rec)
    t = f["nccl.transport"]
    assert t.severity == "error" and "did not finish within 120 s (the ranks were killed)" in t.message
    assert "it had set up 16 P2P connection(s)" in t.message
    assert "HMM is on (nvidia_uvm uvm_disable_hmm=N)" in t.fix and "uvm_disable_hmm=1" in t.fix
    assert "iommu=pt" in t.fix and facts["nccl_transport"]["hung"] is True
    rec = capture("pcie8x-hang")  # a healthy host: no cause in the facts, the next step to find it
    f, _ = run(rec)
    assert "NCCL_P2P_DISABLE=1 make doctor" in f["nccl.transport"].fix
    rec["nccl-transport"] = rec["nccl-transport"].replace("NCCL version 2.29.7+cuda13.0",
                                                          "NCCL version 2.30.4+cuda13.0")
    f, _ = run(rec)
    assert "NCCL 2.30.4+cuda13.0 hangs on the first all-reduce between RTX PRO 6000 pairs" in f["nccl.transport"].fix


def test_a_measured_all_reduce_without_transport_lines_is_a_warning():
    rec = capture("pcie8x")
    rec["nccl-transport"] = "\n".join(ln for ln in rec["nccl-transport"].splitlines() if " via " not in ln) + "\n"
    f, _ = run(rec)
    t = f["nccl.transport"]
    assert t.severity == "warn" and "printed no transport line for the all-reduce over 8 GPUs" in t.message
    assert "DIR/nccl-transport.txt" in t.fix


def test_a_wrong_sum_is_an_error():
    f, _ = run(_result(capture("pcie8x"), sum_ok=False, sum=28.0))
    t = f["nccl.transport"]
    assert t.severity == "error" and "returned 28.0 instead of 36.0" in t.message and "make test-gpu" in t.fix


def test_an_unmeasured_transport_says_why_and_never_passes():
    rec = capture("pcie8x")
    del rec["nccl-transport"]
    f, facts = run(rec)
    t = f["nccl.transport"]
    assert t.severity == "warn" and t.message == "NCCL transport not measured: not recorded"
    assert "docker run --rm --gpus all --ipc=host" in t.fix and facts["nccl_transport"]["measured"] is False
    f, _ = run({"nccl-transport": "EAGLE_NCCL_TRANSPORT " + json.dumps(
        {"measured": False, "too_few_gpus": True, "why": "torch 2.14.1+cu130 sees 0 CUDA GPU(s), and the all-reduce "
                                                         "needs 2"}) + "\n"})
    t = f["nccl.transport"]
    assert t.severity == "info" and "not measured: torch 2.14.1+cu130 sees 0 CUDA GPU(s)" in t.message
    f, _ = run(capture("pcie8x"), tp=1)
    assert f["nccl.transport"].severity == "info" and "TP1" in f["nccl.transport"].message
