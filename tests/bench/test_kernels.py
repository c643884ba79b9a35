"""The kernel cost of a forward (scripts/report/kernels.py) on a recorded trace: tests/fixtures/bench/
kernels-h200-tiny.json.gz is cut from bench/results/profile-tiny_H200_x1_20261201's two traces (the tiny Llama pair
on the lent H200, torch-reference route): two plain decode steps, and two speculative cycles (draft, verify, draft
extend, the next draft); every span, launch and GPU event kept, names cut at 160 characters, times from the first
span."""

import gzip
import importlib.util
import json
from pathlib import Path

import pytest

from scripts.report import kernels as kn
from scripts.report import profile as pf
from scripts.report import spec_model as sm

TRACES = json.loads(
    gzip.decompress((Path(__file__).parents[1] / "fixtures/bench/kernels-h200-tiny.json.gz").read_bytes())
)
NAMES = {  # kernels SGLang v0.5.23 launches for a Kimi-K2.5 layer on the box or the lent route, by class
    "all_reduce": ["ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "pcie_ipc::flat_push_kernel", "allreduce_fusion_kernel"],
    "routing": ["_router_triton_kernel", "_topk_gate_small_m", "moe_fused_gate_kernel"],
    "moe": ["fused_moe_kernel_gptq_awq", "moe_align_block_size_kernel", "_moe_sum_reduce_kernel", "marlin_moe::Marlin"],
    "attention": ["_fwd_grouped_kernel_stage1", "_fwd_kernel_stage2", "_fwd_kernel", "get_num_kv_splits_triton"],
    "norm": ["flashinfer::norm::FusedAddRMSNormKernel", "rmsnorm_cta_double", "pow_tensor_scalar_kernel_impl"],
    "rope_kv": ["rotary_embedding_kernel<bf16>", "sglang::store_kvcache_kernel", "set_mla_kv_buffer_kernel"],
    "gemm": ["nvjet_sm120_tst_8x64_64x16_4x1_v_bz_TNN", "tiny_gemm_n_kernel", "sm90_xmma_gemm_bf16bf16_bf16f32"],
    "sampling": ["softcap_inplace_logits_kernel", "at::native::ArgMaxOps<float>", "VerifyTreeGreedy<int, long>"],
    "other": ["act_and_mul_kernel", "Memcpy DtoD (Device -> Device)", "CatArrayBatchedCopy_vectorized"],
}


def test_each_kernel_name_has_its_class():
    assert {n: kn.classify(n) for c, ns in NAMES.items() for n in ns} == {n: c for c, ns in NAMES.items() for n in ns}
    assert set(NAMES) == set(kn.NAMES)


def test_a_recorded_decode_and_verify_give_their_layers_by_class():
    plain, spec = pf.forwards(TRACES["nospec"]), pf.forwards(TRACES["spec"], draft_tokens=4)
    p = pf.profile(plain, spec, tp=1, steps=3, accept_length=4.0)
    d, v = p["decode"], p["target_verify"]
    assert (d["nodes"], d["kernels"], d["layers"], v["nodes"], v["layers"]) == (219, 219, 4, 223, 4)
    assert sum(n for n, _ in d["classes"].values()) == d["nodes"]
    assert d["classes"]["gemm"] == [17, pytest.approx(55.0, abs=0.1)] and d["classes"]["sampling"][0] == 1
    # one layer of the torch-reference route: 2 norms of 3 named kernels, 4 GEMMs, the KV store, the two decode
    # attention kernels (one extend kernel in the verify), and the reference's elementwise kernels
    assert d["per_layer"] == dict(rope_kv=1, attention=2, norm=6, gemm=4, other=39, total=52, us=95.76)  # 1.8 us each
    assert v["per_layer"]["attention"] == 1 and v["per_layer"]["total"] == 53
    assert 1.4 < d["node_us"] < 1.6  # a small kernel and the idle time after it, on the H200
    # the cycle's GPU is busy 0.92 of 7.68 ms: the tiny proxy's cycle is the host's
    assert p["cycle_busy_ms"] == pytest.approx(0.916, abs=0.001) and p["cycle_ms"] == pytest.approx(7.68, abs=0.01)
    m = sm.Model(*sm.load(), **sm.refit(p))
    assert m.node_floor_ms() == pytest.approx(219 * d["node_us"] / 1000)


def test_a_layer_is_the_span_between_its_attention_marks():
    seq = ["norm_a", "_fwd_kernel_stage1", "_fwd_kernel_stage2", "gemm", "dense_mlp"]  # the dense first layer
    seq += ["rmsnorm", "_fwd_kernel_stage1", "_fwd_kernel_stage2", "gemm", "fused_moe_kernel", "topk"] * 3
    seq += ["get_num_kv_splits_triton", "ArgMaxOps"]
    ev = [{"name": n, "ts": 10.0 * i, "dur": 2.0} for i, n in enumerate(seq)]
    s = kn.summarize(ev)
    assert s["layers"] == 4 and s["per_layer"] == dict(routing=1, moe=1, attention=2, norm=1, gemm=1, total=6, us=60.0)
    assert s["node_us"] == 10.0 and kn.summarize(ev[:5])["per_layer"] == {}


def test_busy_time_is_the_union_of_gpu_work_in_each_window():
    ev = [{"ts": 0, "dur": 10}, {"ts": 5, "dur": 10}, {"ts": 100, "dur": 50}, {"ts": 990, "dur": 20}]
    assert kn.busy_ms(ev, [0, 1000]) == 0.075 and kn.busy_ms(ev, [0, 120, 1000]) == 0.0375  # 35 and 40 us
    assert kn.busy_ms(ev, [5]) is None


def device_script():
    """bench/device/kernels.py, the device run's driver (it is no module of scripts/)."""
    path = Path(__file__).parents[2] / "bench/device/kernels.py"
    spec = importlib.util.spec_from_file_location("device_kernels", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_device_slice_reads_one_rank_s_bytes_of_the_cost_model():
    dk, mem = device_script(), sm.load()[0]["memory"]
    cfg = dk.slice_config(4)
    shape = ("num_attention_heads", "moe_intermediate_size", "vocab_size", "n_routed_experts", "num_hidden_layers")
    assert [cfg[k] for k in shape] == [8, 256, 20480, 384, 4] and "quantization_config" in cfg  # INT4 g32 experts
    got, layers = dk.layer_bytes(cfg), {"q_a_kv_a": 61, "attention": 61, "router": 60, "shared_expert": 60}
    want = {k: mem["non_routed_gb"][k] for k in layers}  # GB per forward over its 61 or 60 layers
    assert {k: got[k] / 1e9 * n for k, n in layers.items()} == pytest.approx(want, rel=0.01)
    assert got["routed_per_expert"] * 60 / 1e9 == pytest.approx(mem["routed_gb_per_expert"], rel=0.01)
    assert dk.layer_bytes(dk.slice_config(4, int4=False))["routed_per_expert"] == pytest.approx(11.01e6, rel=1e-3)


def test_the_device_tables_from_a_recorded_trace():
    dk = device_script()
    run = dk.reduce(TRACES["nospec"])
    tiny = {"measured": {"greedy_equal": True, "accept_length": None, "run": run}}
    servers = {"tiny-jit-nospec": tiny, "slice-jit": {"measured": {"bs1": run}}, "slice-gemv": {"error": "exit 1 | x"}}
    res = dict(gpu="NVIDIA H200", bw_tb_s=4.2, layers=4, servers=servers)
    md = dk.tables(res)
    assert "| tiny-jit-nospec | True | - | decode bs1 | 0.407 | 219 | 52 | 0 | 0 | 0 | 1 | 6 | 2 | 4 | 39 |" in md
    assert "| slice-gemv | exit 1 / x |" in md and "3.10 MB INT4 g32" in md
    # GEMM time scaled by 4.2 / (1.792 x 0.85) = 2.76, the rest as measured; 57 more layers of it
    sc = dk.scaled(run["stages"]["decode"], 4.2, 4)
    assert sc["ratio"] == 2.757 and 0.1 < sc["bytes_share"] < 0.3 and sc["forward_61_ms"] > 57 * 95.76 / 1000
    assert f"nodes at 61 layers {219 + 57 * 52}" in md
