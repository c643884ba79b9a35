"""The patched SGLang's collectives on real GPUs: routing, correctness, the fused op, the PDL race, timings. One
run of _ranks.battery feeds every test here, each asserting one property of what every rank reported."""

import pytest

from _harness import run_ranks

ROWS = (1, 2, 4, 8, 16, 32, 64)  # decode at batch 1 .. chain verify (bs x 4 draft tokens) at the profile's bs 16
PREFILL = (4096,)  # wider than every decode-sized workspace and the fusion cap on any GPU: NCCL's
FUSED_ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 192, 256)  # to the SM12X cap, covering FlashInfer's one-shot range
REL_TOL = 2e-2  # bf16 rounding of sums of up to 8 ranks, relative to the largest value


@pytest.fixture(scope="module")
def battery(gpu_world, gpu_timeout, record):
    sizes = dict(rows=ROWS, prefill_rows=PREFILL, fused_rows=FUSED_ROWS)
    outcome = run_ranks("battery", world=gpu_world, timeout=gpu_timeout, params=sizes)
    assert outcome.ok, outcome.explain()
    record("battery", {"world": gpu_world, "seconds": round(outcome.seconds, 1), "rank0": outcome.results[0]})
    return outcome.results


def _same_on_every_rank(results, key):
    """results[*][key] on every rank, timings left out (they differ by nature)."""
    values = [{k: v for k, v in r[key].items() if k not in ("prepare_s", "seconds")} for r in results]
    assert all(v == values[0] for v in values), f"ranks disagree on {key}: {values}"
    return values[0]


def _close(err: dict, what: str):
    assert not err["nan"] and err["max_rel_err"] < REL_TOL, f"{what}: {err}"


def test_allreduce_routes_and_results(battery):
    """PCIe IPC prepared for the profile's 64 rows; tp.all_reduce at 1-64 rows and a prefill size, eager and
    graph-replayed: the same backend on every rank, PCIe IPC up to 64 rows, never for prefill; every result right."""
    pcie = _same_on_every_rank(battery, "pcie_ipc")
    assert pcie["present"] and pcie["max_rows"] == 64 and pcie["max_numel"] in (0, 64 * 7168), pcie
    calls = [r["routing"] for r in battery]
    for i, call in enumerate(calls[0]):
        routes = [c[i]["backend"] for c in calls]
        assert all(x == routes[0] for x in routes), f"{call['rows']} rows {call['mode']}: ranks took {routes}"
        for rank, c in enumerate(calls):
            _close(c[i], f"rank {rank}, {call['rows']} rows, {call['mode']}")
        took = routes[0]
        if call["rows"] <= pcie["max_rows"] and not pcie["disabled"]:
            assert took == ["pcie_ipc"], f"{call['rows']} rows {call['mode']} went to {took}, not PCIe IPC"
        if call["rows"] in PREFILL:
            assert took and not {"pcie_ipc", "flashinfer"} & set(took), f"prefill went to {took}"


def test_fused_op_matches_reference_and_unfused_path(battery):
    """SGLang's fused all-reduce + residual + RMSNorm (trtllm) at 1-256 tokens: against the fp32 reference, eager
    and graph-replayed with fresh inputs, and the unfused path (tp.all_reduce + fused add-RMSNorm) agrees too."""
    fusion = _same_on_every_rank(battery, "fusion")
    assert fusion["initialized"] and fusion["backend"] == "trtllm", fusion
    for rank, result in enumerate(battery):
        for rec in result["fused"]:
            assert not rec["declined"], f"rank {rank}: the op declined {rec['rows']} rows"
            for path in ("fused", "fused_graph", "unfused"):
                for part in ("norm", "residual"):
                    _close(rec[path][part], f"rank {rank} {rec['rows']} rows {path} {part}")


def test_fusion_preflight_probes_what_flashinfer_allocates(battery, record):
    """Each cuMem allocation SGLang's preflight probes (before FlashInfer makes them) is at least FlashInfer's real
    one, at most a 2 MiB granule above it."""
    fusion = _same_on_every_rank(battery, "fusion")
    record("fusion_sizes", {k: fusion[k] for k in ("allocated", "preflight_sizes", "max_token_num")})
    assert fusion["preflight_sizes"], fusion
    if not fusion["allocated"]:
        pytest.skip(
            "FlashInfer built the fusion workspace without cuMem handles (its legacy IPC path): "
            "nothing to compare the preflight with"
        )
    assert len(fusion["allocated"]) == len(fusion["preflight_sizes"]), fusion
    for probe, real in zip(fusion["preflight_sizes"], fusion["allocated"]):
        assert real <= probe <= real + (2 << 20), (fusion["preflight_sizes"], fusion["allocated"])


def test_fused_op_pdl_chain_has_no_bad_trial(battery, record):
    """Graph-replayed chains of the fused op, each followed by a PDL-launched consumer, fresh inputs per trial:
    with the op's default (completion at kernel end) every trial matches. trigger_completion_at_end=False is run
    as a control and recorded; on NVLink H200s the race has not reproduced, so it is not asserted."""
    control = []
    for rank, result in enumerate(battery):
        for rec in result["pdl_race"]:
            if rec["variant"] == "default":
                assert rec["bad_trials"] == 0, f"rank {rank}: {rec}"
            else:
                control.append(rec)
    record("pdl_race_control", control)


def test_per_call_timings_recorded(battery, record):
    """Per-call time of each SGLang path in graph-replayed chains of 122, measured in one run on every rank."""
    timings = battery[0]["timings"]
    assert timings and all(t["us_per_call"] and t["us_per_call"] > 0 for t in timings), timings
    by = {(t["kind"], t["path"], t["rows"]): t["us_per_call"] for t in timings}
    ratios = {}
    for rows in sorted({t["rows"] for t in timings}):
        nccl = by.get(("allreduce", "nccl", rows))
        if nccl:
            ratios[f"allreduce default/nccl {rows} rows"] = by[("allreduce", "default", rows)] / nccl
        unfused = by.get(("fused", "unfused/nccl", rows))
        if unfused:
            ratios[f"fused/unfused-nccl {rows} rows"] = by[("fused", "fused_op", rows)] / unfused
    record("timings", timings)
    record("timing_ratios", ratios)
    record("versions", battery[0]["versions"])
