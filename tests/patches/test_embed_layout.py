"""The EAGLE-3 draft embeds with the target's table (Kimi-K2.5 replicates it under SGLANG_ENABLE_EMBED_REPLICATION=1)
in the target's layout: unpatched, its TP-sharded lookup embeds wrong rows for every token outside rank 0's shard.
Two CPU ranks, the real draft model class (tests/gpu/_ranks.py eagle3_draft_embedding)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
from _harness import run_ranks  # noqa: E402


@pytest.mark.parametrize("replicate", [True, pytest.param(False, marks=pytest.mark.unchanged)])
def test_eagle3_draft_embeds_the_targets_rows_at_tp2(replicate):
    outcome = run_ranks("eagle3_draft_embedding", world=2, device="cpu", timeout=240, params={"replicate": replicate})
    assert outcome.ok, outcome.explain()
    assert [x["table"] for x in outcome.results] == [[512 if replicate else 256, 64]] * 2
    assert [x["max_abs_err"] for x in outcome.results] == [0.0, 0.0], outcome.results
